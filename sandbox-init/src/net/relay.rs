//! One request on one connection: the forwarder sends the agent's body upstream exactly as its
//! head frames it (a length, or chunks read strictly), and nothing after it. A second request
//! pipelined behind the first never reaches the server, whatever the server would do with it,
//! so every request the server sees is one the rules judged.

use sandbox_wire::http1::{Body, BodyLength, Piece};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::net::inspect::Refused;

/// Copies the body `length` frames from `client` (starting with `first`, the bytes that came
/// with the head) to `upstream` as `http1::Body` finds its pieces: data and the chunks' framing
/// as they come, trailers left behind (the last chunk goes on bare); returns once the body is
/// whole. Bytes after it are never sent (some may have been read, and are dropped).
pub async fn copy_body<R, W>(
    client: &mut R,
    upstream: &mut W,
    first: Vec<u8>,
    length: BodyLength,
) -> Result<(), Refused>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (mut buf, mut at) = (first, 0);
    let mut body = Body::new(length);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let next =
            body.next(&buf[at..]).map_err(|why| Refused::new(400, format!("a malformed body: {why}")))?;
        let Some((piece, n)) = next else {
            buf.drain(..at);
            at = 0;
            let read = client.read(&mut chunk).await.map_err(|e| Refused::new(400, e.to_string()))?;
            if read == 0 {
                return Err(Refused::new(400, "the connection ended inside the request body"));
            }
            buf.extend_from_slice(&chunk[..read]);
            continue;
        };
        if piece != Piece::Trailer {
            upstream.write_all(&buf[at..at + n]).await.map_err(|e| Refused::new(502, e.to_string()))?;
        }
        at += n;
        if piece == Piece::End {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn copied(
        input: &[u8],
        first: usize,
        length: BodyLength,
    ) -> (Result<(), Refused>, Vec<u8>, Vec<u8>) {
        let (mut tx, mut client) = tokio::io::duplex(1 << 20);
        tx.write_all(&input[first..]).await.unwrap();
        drop(tx);
        let mut out = Vec::new();
        let result = copy_body(&mut client, &mut out, input[..first].to_vec(), length).await;
        let mut rest = Vec::new();
        let _ = client.read_to_end(&mut rest).await;
        (result, out, rest)
    }

    #[tokio::test]
    async fn exactly_the_framed_body_goes_and_a_pipelined_request_stays_behind() {
        let chunked = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\nPOST /octo/secret/git-receive-pack HTTP/1.1\r\n\r\n";
        let body_end = chunked.len() - b"POST /octo/secret/git-receive-pack HTTP/1.1\r\n\r\n".len();
        // What goes upstream: the chunks, the last one bare (its trailer left behind).
        let sent = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n";
        // Whatever the split between the head's read and the rest.
        for first in [0, 1, 4, 9, 20, body_end] {
            let (result, out, rest) = copied(chunked, first, BodyLength::Chunked).await;
            assert_eq!(result, Ok(()), "first {first}");
            assert_eq!(out, sent, "first {first}");
            let left = [&chunked[first.max(body_end)..]].concat();
            assert!(rest.len() <= left.len() && left.ends_with(&rest), "first {first}: {rest:?}");
        }
        let (result, out, rest) = copied(b"hello, and more", 3, BodyLength::Length(5)).await;
        assert_eq!((result, out.as_slice()), (Ok(()), &b"hello"[..]));
        assert!(b", and more".ends_with(&rest), "{rest:?}");
    }

    #[tokio::test]
    async fn malformed_or_unfinished_chunks_are_refused() {
        // `http1::Body`'s own tests try every malformed chunk: here, that a refusal ends the copy.
        for bad in [&b"5\r\nhello!\r\n0\r\n\r\n"[..], b"5\r\nhel", b"0\r\nno colon\r\n\r\n"] {
            let (result, _, _) = copied(bad, 0, BodyLength::Chunked).await;
            assert_eq!(result.map_err(|r| r.status()), Err(400), "{bad:?}");
        }
    }
}
