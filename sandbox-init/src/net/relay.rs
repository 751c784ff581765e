//! One request on one connection: the forwarder sends the agent's body upstream exactly as its
//! head frames it (a length, or chunks read strictly), and nothing after it. A second request
//! pipelined behind the first never reaches the server, whatever the server would do with it,
//! so every request the server sees is one the rules judged.

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::net::inspect::{BodyLength, Refused};

/// The longest chunk-size or trailer line read.
const MAX_LINE: usize = 4096;

enum State {
    SizeLine,
    Data(usize),
    DataEnd,
    Trailers,
}

/// Copies the body `length` frames from `client` (starting with `first`, the bytes that came
/// with the head) to `upstream`, chunks as they come; returns once the body is whole. Bytes
/// after it are never sent (some may have been read, and are dropped).
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
    let io = |e: std::io::Error| Refused::new(502, e.to_string());
    let mut buf = first;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut more = async |buf: &mut Vec<u8>, client: &mut R| -> Result<(), Refused> {
        let n = client.read(&mut chunk).await.map_err(|e| Refused::new(400, e.to_string()))?;
        if n == 0 {
            return Err(Refused::new(400, "the connection ended inside the request body"));
        }
        buf.extend_from_slice(&chunk[..n]);
        Ok(())
    };
    if let BodyLength::Length(mut left) = length {
        loop {
            let take = left.min(buf.len());
            upstream.write_all(&buf[..take]).await.map_err(io)?;
            left -= take;
            buf.drain(..take);
            if left == 0 {
                return Ok(());
            }
            more(&mut buf, client).await?;
        }
    }
    let bad = |why: &str| Refused::new(400, format!("a malformed chunked body: {why}"));
    let mut state = State::SizeLine;
    loop {
        let progress = match state {
            State::SizeLine | State::Trailers => match buf.windows(2).position(|w| w == b"\r\n") {
                Some(end) => {
                    let line = &buf[..end];
                    if line.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                        return Err(bad("a control character in a size or trailer line"));
                    }
                    let next = if let State::SizeLine = state {
                        let text = std::str::from_utf8(line).map_err(|_| bad("a size that is not text"))?;
                        let digits = text.split(';').next().unwrap_or_default();
                        if digits.is_empty()
                            || digits.len() > 8
                            || !digits.bytes().all(|b| b.is_ascii_hexdigit())
                        {
                            return Err(bad("a size that is not hexadecimal"));
                        }
                        match usize::from_str_radix(digits, 16).map_err(|_| bad("a size too large"))? {
                            0 => State::Trailers,
                            size => State::Data(size),
                        }
                    } else if end == 0 {
                        upstream.write_all(b"\r\n").await.map_err(io)?;
                        return Ok(());
                    } else if !line.contains(&b':') {
                        return Err(bad("a malformed trailer"));
                    } else {
                        State::Trailers
                    };
                    // Trailers stay behind: the last chunk goes on bare.
                    if let State::SizeLine = state {
                        upstream.write_all(&buf[..end + 2]).await.map_err(io)?;
                    }
                    buf.drain(..end + 2);
                    state = next;
                    true
                }
                None if buf.len() > MAX_LINE => return Err(bad("a size or trailer line too long")),
                None => false,
            },
            State::Data(left) => {
                let take = left.min(buf.len());
                upstream.write_all(&buf[..take]).await.map_err(io)?;
                buf.drain(..take);
                state = if take == left { State::DataEnd } else { State::Data(left - take) };
                take > 0
            }
            State::DataEnd => match buf.get(..2) {
                Some(b"\r\n") => {
                    upstream.write_all(b"\r\n").await.map_err(io)?;
                    buf.drain(..2);
                    state = State::SizeLine;
                    true
                }
                Some(_) => return Err(bad("a chunk longer than its size")),
                None => false,
            },
        };
        if !progress {
            more(&mut buf, client).await?;
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
        for bad in [
            &b"5\r\nhello!\r\n0\r\n\r\n"[..],
            b"zz\r\nhello\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhel",
            b"0\r\nno colon\r\n\r\n",
            b"123456789\r\n",
        ] {
            let (result, _, _) = copied(bad, 0, BodyLength::Chunked).await;
            assert_eq!(result.map_err(|r| r.status()), Err(400), "{bad:?}");
        }
    }
}
