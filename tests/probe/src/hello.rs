//! `tls-hello`: ClientHellos as a client writes them, and as a hostile agent bends them (split
//! across segments or records, padded, without SNI, with ECH, a second hello after the server's
//! retry request, behind an alert, or announced early), to test the name check.

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::probes::outcome_of;
use crate::{Args, report};

/// The random of a ServerHello that asks for another ClientHello (RFC 8446 §4.1.3).
const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2,
    0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// A TLS 1.3 ClientHello as a client would send it (x25519 key share, the usual extensions),
/// naming `sni` (none: no server_name), with an encrypted_client_hello extension if `ech`, and
/// `pad` bytes of padding (the padding extension, as post-quantum key shares make hellos grow).
fn client_hello(sni: Option<&str>, ech: bool, pad: usize, share: bool) -> Vec<u8> {
    let mut extensions = Vec::new();
    let mut extension = |kind: u16, data: &[u8]| {
        extensions.extend(kind.to_be_bytes());
        extensions.extend((data.len() as u16).to_be_bytes());
        extensions.extend(data);
    };
    if let Some(name) = sni {
        let mut entry = vec![0u8];
        entry.extend((name.len() as u16).to_be_bytes());
        entry.extend(name.as_bytes());
        let mut list = (entry.len() as u16).to_be_bytes().to_vec();
        list.extend(entry);
        extension(0, &list);
    }
    extension(10, &[0, 2, 0, 29]); // supported_groups: x25519
    extension(13, &[0, 4, 4, 3, 8, 4]); // signature_algorithms
    extension(43, &[2, 3, 4]); // supported_versions: TLS 1.3
    // key_share: one for x25519, or none (the server must ask again: a HelloRetryRequest).
    let mut key_share = vec![0, 36, 0, 29, 0, 32];
    key_share.extend((0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(9)));
    extension(51, if share { &key_share } else { &[0, 0] });
    if ech {
        extension(0xfe0d, &[0; 64]);
    }
    if pad > 0 {
        extension(21, &vec![0; pad]);
    }
    let mut body = vec![3, 3];
    body.extend((0..32u8).map(|i| i.wrapping_mul(7)));
    body.push(0);
    body.extend([0, 2, 0x13, 0x01]);
    body.extend([1, 0]);
    body.extend((extensions.len() as u16).to_be_bytes());
    body.extend(extensions);
    let mut message = vec![1];
    message.extend(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend(body);
    message
}

/// `tls-hello HOST PORT [--sni NAME] [--no-sni] [--ech] [--pad N] [--split N] [--records]
/// [--retry NAME [--alert first|after-ccs] [--alert-apart] [--announce]]`: a ClientHello written in two
/// segments (the first N bytes, a pause, the rest) or, with `--records`, in two TLS records;
/// `outcome=answered` if the server answered anything, `denied` if the sandbox answered with its
/// refusal (an access_denied alert), `reset` if the connection was reset after it was taken.
/// With `--retry`, the hello offers no key share, so that the server asks for another
/// (`retry=yes`), and the second hello names NAME, after a change_cipher_spec and, with
/// `--alert`, an alert (in a segment of its own with `--alert-apart`); the outcome is the answer
/// to that hello. With `--announce`, the first flight ends with the header of the record the
/// second hello will be (no payload yet), and after the request only that payload follows: a
/// record the check saw announced, but never read.
pub fn tls_hello(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let addr = match crate::probes::resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let sni =
        if args.has("--no-sni") { None } else { Some(args.flag("--sni").unwrap_or_else(|| host.clone())) };
    let retry = args.flag("--retry");
    let hello = client_hello(sni.as_deref(), args.has("--ech"), args.number("--pad", 0), retry.is_none());
    let split: usize = args.number("--split", 0).min(hello.len());
    let record = |part: &[u8]| {
        let mut r = vec![22, 3, 1];
        r.extend((part.len() as u16).to_be_bytes());
        r.extend(part);
        r
    };
    let (mut first, second) = if args.has("--records") && split > 0 {
        (record(&hello[..split]), record(&hello[split..]))
    } else {
        let whole = record(&hello);
        let cut = if split > 0 { split.min(whole.len()) } else { whole.len() };
        (whole[..cut].to_vec(), whole[cut..].to_vec())
    };
    let announced = match (&retry, args.has("--announce")) {
        (Some(name), true) => {
            let payload = client_hello(Some(name), false, 0, true);
            first.extend(&record(&payload)[..5]);
            Some(payload)
        }
        _ => None,
    };
    let asked_again = std::cell::Cell::new(false);
    let result = (|| {
        let mut stream =
            TcpStream::connect_timeout(&SocketAddr::new(addr, port.parse().unwrap_or(0)), timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(&first)?;
        if !second.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
            stream.write_all(&second)?;
        }
        let mut answer = read_record(&mut stream)?;
        if let Some(name) = &retry
            && answer != ACCESS_DENIED
        {
            let body = &answer[5..];
            asked_again.set(
                answer[0] == 22 && body.len() >= 38 && body[0] == 2 && body[6..38] == HELLO_RETRY_RANDOM,
            );
            // A `user_canceled` alert, which OpenSSL's TLS 1.3 server reads past: before the
            // change_cipher_spec (`--alert first`) or after it (`--alert after-ccs`).
            let (ccs, alert) = ([20u8, 3, 3, 0, 1, 1], [21u8, 3, 3, 0, 2, 1, 90]);
            let mut again = match args.flag("--alert").as_deref() {
                Some("first") => [&alert[..], &ccs].concat(),
                Some(_) => [&ccs[..], &alert].concat(),
                None => ccs.to_vec(),
            };
            if let Some(payload) = &announced {
                // The record the first flight announced: its payload, the second hello.
                again = payload.clone();
            }
            let hello = if announced.is_some() {
                Vec::new()
            } else {
                record(&client_hello(Some(name), false, 0, true))
            };
            if args.has("--alert-apart") {
                // The hello in a segment of its own, after the alert has gone.
                stream.write_all(&again)?;
                std::thread::sleep(Duration::from_millis(200));
                again.clear();
            }
            again.extend(hello);
            stream.write_all(&again)?;
            // The answer to the second hello, past the change_cipher_spec a server may send
            // after its request (middlebox compatibility).
            loop {
                answer = read_record(&mut stream)?;
                if answer[0] != 20 {
                    break;
                }
            }
        }
        Ok::<_, std::io::Error>(answer)
    })();
    let outcome = match result {
        // The sandbox's refusal of a hello (sandbox-wire's `namecheck::answer`).
        Ok(answer) if answer == ACCESS_DENIED => "denied".to_string(),
        Ok(answer) => format!("answered:{}", if answer[0] == 22 { "handshake" } else { "alert" }),
        Err(e) => outcome_of(&e),
    };
    let retried = if asked_again.get() { "yes" } else { "no" }.to_string();
    report(&[
        ("outcome", outcome),
        ("hello_bytes", (first.len() + second.len()).to_string()),
        ("retry", retried),
    ]);
}

/// A fatal access_denied alert: what the sandbox's name check answers a hello it refuses.
pub const ACCESS_DENIED: [u8; 7] = [21, 3, 3, 0, 2, 2, 49];

/// One TLS record, its header and its payload.
fn read_record(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut record = vec![0u8; 5];
    stream.read_exact(&mut record)?;
    let mut payload = vec![0u8; usize::from(u16::from_be_bytes([record[3], record[4]]))];
    stream.read_exact(&mut payload)?;
    record.extend(payload);
    Ok(record)
}
