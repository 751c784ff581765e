//! One request on one connection: the forwarder sends the agent's body upstream exactly as its
//! head frames it (a length, or chunks read strictly), and nothing after it, or reads it whole
//! for inspection. A second request pipelined behind the first never reaches the server,
//! whatever the server would do with it, so every request the server sees is one the rules
//! judged.

use sandbox_wire::forwarder::Refused;
use sandbox_wire::forwarder::inspect::MAX_INSPECTED_BODY;
use sandbox_wire::http1::{Body, BodyLength, Piece};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

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
            refill(client, &mut buf, &mut at, &mut chunk).await?;
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

/// The whole body, from `first` (what came with the head) and the client, as `http1::Body`
/// finds it: its data, the chunks' framing and trailers left out.
pub async fn read_body<R: AsyncRead + Unpin>(
    client: &mut R,
    first: Vec<u8>,
    length: BodyLength,
) -> Result<Vec<u8>, Refused> {
    let (mut buf, mut at) = (first, 0);
    let mut body = Body::new(length);
    let mut data = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        while let Some((piece, n)) = body.next(&buf[at..]).map_err(|why| Refused::new(400, why))? {
            if piece == Piece::Data {
                data.extend_from_slice(&buf[at..at + n]);
            }
            at += n;
            if piece == Piece::End {
                return Ok(data);
            }
            if data.len() > MAX_INSPECTED_BODY {
                return Err(Refused::new(413, format!("a request body over {MAX_INSPECTED_BODY} bytes")));
            }
        }
        refill(client, &mut buf, &mut at, &mut chunk).await?;
    }
}

/// Drops the `at` bytes of `buf` the body already took and appends the client's next read into
/// `chunk`; refused when the client ends inside the body.
async fn refill<R: AsyncRead + Unpin>(
    client: &mut R,
    buf: &mut Vec<u8>,
    at: &mut usize,
    chunk: &mut [u8],
) -> Result<(), Refused> {
    buf.drain(..*at);
    *at = 0;
    let read = client.read(chunk).await.map_err(|e| Refused::new(400, e.to_string()))?;
    if read == 0 {
        return Err(Refused::new(400, "the connection ended inside the request body"));
    }
    buf.extend_from_slice(&chunk[..read]);
    Ok(())
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

    /// The body read whole, from what came with the head and what the client sends after, as
    /// `http1::Body` decodes it (its own tests try the malformed chunks).
    #[tokio::test]
    async fn a_body_is_read_whole_and_decoded() {
        async fn read(first: &[u8], then: &[u8], length: BodyLength) -> Result<Vec<u8>, Refused> {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (mut server, _) = listener.accept().await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut client, then).await.unwrap();
            drop(client);
            read_body(&mut server, first.to_vec(), length).await
        }
        let chunked = b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nGET /next";
        for split in [0, 1, 4, 12, chunked.len()] {
            let (first, then) = chunked.split_at(split);
            assert_eq!(read(first, then, BodyLength::Chunked).await, Ok(b"hello world".to_vec()), "{split}");
        }
        assert_eq!(read(b"hel", b"lo, and more", BodyLength::Length(5)).await, Ok(b"hello".to_vec()));
        assert_eq!(read(b"", b"", BodyLength::Length(0)).await, Ok(Vec::new()));
        assert_eq!(read(b"5\r\nhel", b"", BodyLength::Chunked).await.unwrap_err().status(), 400, "cut short");
        assert_eq!(read(b"5\r\nhello!\r\n", b"", BodyLength::Chunked).await.unwrap_err().status(), 400);
    }
}
