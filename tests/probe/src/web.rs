//! HTTP/1.1 and TLS for the name check's tests: a small server (the peers' ports 80, 443 and
//! 8443) that logs the name every request and handshake carried and how many bytes each
//! connection brought, and the clients the probe runs as the agent. rustls with ring, already in
//! the workspace's tree.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A deterministic byte stream: what `/bytes/N` serves, so a client can check what arrived.
pub fn pattern(offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let n = offset + i as u64;
        *b = (n.wrapping_mul(2654435761) >> 13) as u8;
    }
}

/// `pattern-sha N`: the sha256 of the first N bytes of [`pattern`], computed here, without the
/// network, for the test to compare a download with.
pub fn pattern_sha(size: u64) -> String {
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut done = 0u64;
    while done < size {
        let n = buf.len().min((size - done) as usize);
        pattern(done, &mut buf[..n]);
        digest.update(&buf[..n]);
        done += n as u64;
    }
    format!("{:x}", digest.finalize())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Appends one line to the peer's log.
pub fn log(path: &str, line: &str) {
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        // One write: lines of connections logging at once never interleave.
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// Counts what a connection brings, for the log line written when it ends.
struct Counted<S> {
    inner: S,
    read: u64,
}

impl<S: Read> Read for Counted<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

impl<S: Write> Write for Counted<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What a server port is.
#[derive(Clone)]
pub struct Site {
    pub host: String,
    pub port: u16,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub files: Option<String>,
    pub log: String,
    /// Answer as the mock model API (mock.rs) instead of with a greeting.
    pub mock: bool,
    /// Plain HTTP ignores the body of a GET or HEAD, reading it as the next request, as servers
    /// open to a CL.0 desync do.
    pub ignores_bodies: bool,
    /// Answer as GitHub and the npm registry (forge.rs), from the repositories and packages
    /// under this folder.
    pub forge: Option<String>,
    /// Log `open PORT from=ADDR` as each connection is accepted (`--log-accepts`), before
    /// anything is read: a connection held open and never closed still leaves a line.
    pub log_accepts: bool,
}

pub fn tls_server_config(cert: &str, key: &str) -> Arc<rustls::ServerConfig> {
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(cert)
        .expect("the certificate file")
        .map(|c| c.expect("a certificate"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).expect("the key file");
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("a usable certificate");
    Arc::new(config)
}

/// Serves `site` until the process ends, a thread per connection.
pub fn serve(listener: TcpListener, site: Site) {
    for stream in listener.incoming().flatten() {
        let site = site.clone();
        std::thread::spawn(move || {
            let from = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            if site.log_accepts {
                log(&site.log, &format!("open {} from={from}", site.port));
            }
            let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
            let mut counted = Counted { inner: stream, read: 0 };
            match &site.tls {
                Some(config) => {
                    let Ok(conn) = rustls::ServerConnection::new(config.clone()) else { return };
                    let mut tls = rustls::StreamOwned::new(conn, &mut counted);
                    // The handshake happens on the first read; the name is known after it.
                    let mut request = BufReader::new(&mut tls);
                    let head = read_head(&mut request);
                    let sni = request.get_ref().conn.server_name().unwrap_or("-").to_string();
                    log(&site.log, &format!("tls {} sni={sni}", site.port));
                    if let Some(head) = head.as_ref()
                        && let Some(dir) = &site.forge
                    {
                        forge_respond(&site, dir, head, &from, &mut request);
                        request.get_mut().conn.send_close_notify();
                        let _ = request.get_mut().flush();
                    } else if let Some(head) = head.as_ref()
                        && site.mock
                    {
                        mock_respond(&site, head, &mut request);
                        request.get_mut().conn.send_close_notify();
                        let _ = request.get_mut().flush();
                    } else if let Some(head) = head {
                        // The body read first: closed with it unread, the socket would reset
                        // and could destroy the answer before the client read it.
                        let _ = read_body(&mut request, &head);
                        respond(&site, &head, request.get_mut());
                        request.get_mut().conn.send_close_notify();
                        let _ = request.get_mut().flush();
                    }
                }
                None => {
                    // Keep-alive: every request of the connection is served, and logged.
                    let mut request = BufReader::new(&mut counted);
                    while let Some(head) = read_head(&mut request) {
                        // The forge answers with `Connection: close`: one request a connection.
                        if let Some(dir) = &site.forge {
                            forge_respond(&site, dir, &head, &from, &mut request);
                            break;
                        }
                        // The mock as a model server of the user's (Ollama's plain HTTP), which
                        // also answers with `Connection: close`.
                        if site.mock {
                            mock_respond(&site, &head, &mut request);
                            break;
                        }
                        let ignored = site.ignores_bodies && matches!(head.method.as_str(), "GET" | "HEAD");
                        let length = if ignored { 0 } else { head.length };
                        if std::io::copy(&mut (&mut request).take(length), &mut std::io::sink()).is_err() {
                            break;
                        }
                        respond(&site, &head, request.get_mut());
                    }
                }
            }
            log(&site.log, &format!("conn {} from={from} bytes={}", site.port, counted.read));
        });
    }
}

/// The request line and headers, lower-cased names.
struct Head {
    path: String,
    host: String,
    /// The body's Content-Length.
    length: u64,
    method: String,
    chunked: bool,
    /// The credentials the request carried (`x-api-key: …`, `authorization: …`), as sent.
    auth: Vec<String>,
    /// The headers that ask a server to act as if the method were another, as sent.
    overrides: Vec<String>,
    /// The body is compressed with zstd (`Content-Encoding: zstd`).
    zstd: bool,
    /// Every header: (lower-cased name, value without the surrounding blanks).
    headers: Vec<(String, String)>,
}

/// The headers API keys travel in.
const CREDENTIALS: &[&str] = &["x-api-key", "authorization", "x-goog-api-key", "cookie"];
/// The headers that override a request's method at servers that honour them.
const METHOD_OVERRIDES: &[&str] = &["x-http-method-override", "x-http-method", "x-method-override"];

impl Head {
    /// The value of the header `name` (lower case), if the request had it.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// `http PORT host=NAME path=P [auth=HEADER:VALUE…] [override=HEADER:VALUE…]`, as the peer
    /// logs a request.
    fn log_line(&self, port: u16) -> String {
        let auth: String = self.auth.iter().map(|a| format!(" auth={a}")).collect();
        let overrides: String = self.overrides.iter().map(|o| format!(" override={o}")).collect();
        format!("http {port} host={} path={}{auth}{overrides}", self.host, self.path)
    }
}

fn read_head(reader: &mut impl BufRead) -> Option<Head> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let method = line.split_whitespace().next()?.to_string();
    let path = line.split_whitespace().nth(1)?.to_string();
    let (mut host, mut length, mut auth, mut chunked) = (String::new(), 0, Vec::new(), false);
    let (mut overrides, mut zstd, mut headers) = (Vec::new(), false, Vec::new());
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        match header.split_once(':') {
            Some((name, value)) if name.eq_ignore_ascii_case("host") => host = value.trim().to_string(),
            Some((name, value)) if name.eq_ignore_ascii_case("content-length") => {
                length = value.trim().parse().unwrap_or(0);
            }
            Some((name, value)) if name.eq_ignore_ascii_case("transfer-encoding") => {
                chunked = value.to_ascii_lowercase().contains("chunked");
            }
            Some((name, value)) if CREDENTIALS.iter().any(|c| name.eq_ignore_ascii_case(c)) => {
                auth.push(format!("{}:{}", name.to_ascii_lowercase(), value.trim()));
            }
            Some((name, value)) if name.eq_ignore_ascii_case("content-encoding") => {
                zstd = value.trim().eq_ignore_ascii_case("zstd");
            }
            Some((name, value)) if METHOD_OVERRIDES.iter().any(|o| name.eq_ignore_ascii_case(o)) => {
                overrides.push(format!("{}:{}", name.to_ascii_lowercase(), value.trim()));
            }
            _ => {}
        }
    }
    Some(Head { path, host, length, method, chunked, auth, overrides, zstd, headers })
}

/// The request's body, by Content-Length or chunked.
fn read_body(reader: &mut impl BufRead, head: &Head) -> Vec<u8> {
    let mut body = Vec::new();
    if !head.chunked {
        let _ = reader.take(head.length.min(64 << 20)).read_to_end(&mut body);
        return body;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return body;
        }
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16).unwrap_or(0);
        if size == 0 {
            // The trailers, to the blank line.
            while reader.read_line(&mut line).unwrap_or(0) > 0 && !line.trim().is_empty() {
                line.clear();
            }
            return body;
        }
        let mut chunk = vec![0u8; size + 2];
        if reader.read_exact(&mut chunk).is_err() {
            return body;
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

fn decompress_zstd(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let Ok(mut decoder) = ruzstd::decoding::StreamingDecoder::new(body) else { return body.to_vec() };
    if decoder.read_to_end(&mut out).is_ok() { out } else { body.to_vec() }
}

/// One request to the mock model API: answered, and logged with its credentials and turn.
fn mock_respond<W: Read + Write>(site: &Site, head: &Head, reader: &mut BufReader<W>) {
    let body = read_body(reader, head);
    let stream = reader.get_mut();
    // Codex compresses what it sends ChatGPT's backend.
    let body = if head.zstd { decompress_zstd(&body) } else { body };
    let answer = crate::oauth::answer(&head.method, &head.path, &body)
        .unwrap_or_else(|| crate::mock::answer(&head.method, &head.path, &body));
    let note = if answer.note.is_empty() { String::new() } else { format!(" {}", answer.note) };
    // Whether the CLI told the model about the sandbox: base's instructions.md names refused.txt.
    let told = if contains(&body, b"refused.txt") { " told=refused.txt" } else { "" };
    // The model the request asked for (a local model server's turn asserts it).
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("model")?.as_str().map(str::to_string))
        .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_graphic()))
        .map(|m| format!(" model={m}"))
        .unwrap_or_default();
    log(
        &site.log,
        &format!("{} mock={} bytes={}{model}{note}{told}", head.log_line(site.port), answer.turn, body.len()),
    );
    let _ = write!(
        stream,
        "HTTP/1.1 {} Mock\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        answer.status,
        answer.content_type,
        answer.body.len(),
        answer.body
    );
}

/// One request to the forge (forge.rs): its body read, by Content-Length or chunked, then
/// answered and logged there.
fn forge_respond<W: Read + Write>(
    site: &Site,
    dir: &str,
    head: &Head,
    from: &str,
    reader: &mut BufReader<W>,
) {
    if head.header("expect").is_some_and(|e| e.eq_ignore_ascii_case("100-continue")) {
        let _ = reader.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let body = read_body(reader, head);
    let request = crate::forge::Request {
        method: &head.method,
        path: &head.path,
        host: &head.host,
        chunked: head.chunked,
        headers: &head.headers,
        body: &body,
        from,
        port: site.port,
    };
    crate::forge::respond(dir, &request, reader.get_mut(), |line| log(&site.log, line));
}

fn respond(site: &Site, head: &Head, out: &mut impl Write) {
    log(&site.log, &head.log_line(site.port));
    // `/redirect?to=URL`: a redirect, for the forwarder that must not follow it.
    if let Some(to) = head.path.strip_prefix("/redirect?to=") {
        let _ = write!(out, "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n");
        return;
    }
    if let Some(size) = head.path.strip_prefix("/bytes/").and_then(|n| n.parse::<u64>().ok()) {
        let _ = write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
        let mut buf = vec![0u8; 256 * 1024];
        let mut sent = 0u64;
        while sent < size {
            let n = buf.len().min((size - sent) as usize);
            pattern(sent, &mut buf[..n]);
            if out.write_all(&buf[..n]).is_err() {
                return;
            }
            sent += n as u64;
        }
        return;
    }
    let body = match &site.files {
        Some(dir) => match std::fs::read(format!("{dir}{}", head.path.split('?').next().unwrap_or("/"))) {
            Ok(bytes) => bytes,
            Err(_) => {
                let _ = write!(out, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                return;
            }
        },
        None => format!("hello from {}:{} for {}\n", site.host, site.port, head.host).into_bytes(),
    };
    let _ = write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
    let _ = out.write_all(&body);
}

/// Accepts any certificate: the reachability probes ask whether a connection gets through, not
/// whom it reaches; the tests of real verification use curl, Node and git with the test CA.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config() -> Arc<rustls::ClientConfig> {
    let provider = provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Arc::new(config)
}

/// A stream the client speaks HTTP over: plain, or TLS with `sni`.
pub enum Client {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Client {
    pub fn new(stream: TcpStream, sni: Option<&str>) -> std::io::Result<Client> {
        // As curl, Node and Go do: without it a request waits for the delayed ACK of the
        // handshake's last segment (40 ms), which would hide anything the sandbox adds.
        stream.set_nodelay(true)?;
        match sni {
            None => Ok(Client::Plain(stream)),
            Some(name) => {
                let name = ServerName::try_from(name.to_string()).map_err(std::io::Error::other)?;
                let conn =
                    rustls::ClientConnection::new(client_config(), name).map_err(std::io::Error::other)?;
                Ok(Client::Tls(Box::new(rustls::StreamOwned::new(conn, stream))))
            }
        }
    }
}

impl Read for Client {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Client::Plain(s) => s.read(buf),
            Client::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Client {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Client::Plain(s) => s.write(buf),
            Client::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Client::Plain(s) => s.flush(),
            Client::Tls(s) => s.flush(),
        }
    }
}

/// The header of the sandbox's own 403 (sandbox-wire's `namecheck::answer::REFUSED_HEADER`), by
/// which a probe tells the name check's refusal from a server's answer. A hint, not proof: any
/// server could send it, so a test that needs proof reads its peer's log as well.
pub const REFUSED_HEADER: &str = "X-Agent-Sandbox-Refused";

/// The reason, if `answer` (a whole plain HTTP answer) is the sandbox's 403.
pub fn refused_by_sandbox(answer: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(answer);
    let (head, _) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    if !lines.next()?.starts_with("HTTP/1.1 403 ") {
        return None;
    }
    lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case(REFUSED_HEADER).then(|| value.trim().to_string())
    })
}

/// One GET over `client`: the body's first line, or with `sha256`, the size, digest and time of
/// the whole body (a download, checked against [`pattern`] by the test). The sandbox's own 403 is
/// an error of kind PermissionDenied whose text is the reason.
pub fn get(client: &mut Client, host: &str, path: &str) -> std::io::Result<(String, u64, String, f64)> {
    use sha2::Digest as _;
    write!(client, "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: sandbox-probe\r\n\r\n")?;
    client.flush()?;
    let started = Instant::now();
    let mut reader = BufReader::with_capacity(256 * 1024, client);
    let mut status = String::new();
    reader.read_line(&mut status)?;
    if !status.starts_with("HTTP/1.") {
        return Err(std::io::Error::other(format!("not an HTTP response: {status:?}")));
    }
    let mut length: Option<u64> = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            break;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok();
            }
            if status.starts_with("HTTP/1.1 403 ") && name.eq_ignore_ascii_case(REFUSED_HEADER) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    value.trim().to_string(),
                ));
            }
        }
    }
    let mut digest = sha2::Sha256::new();
    let mut first_line = String::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let want = length.map_or(buf.len(), |l| buf.len().min((l - total) as usize));
        if want == 0 {
            break;
        }
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            // A server that ends TLS without close_notify after the whole body: what arrived counts.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && length.is_some_and(|l| total == l) => {
                break;
            }
            Err(e) => return Err(e),
        };
        if total == 0 {
            first_line = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string();
        }
        digest.update(&buf[..n]);
        total += n as u64;
    }
    Ok((first_line, total, format!("{:x}", digest.finalize()), started.elapsed().as_secs_f64()))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}
