//! The wire suite's servers that are not scripts (its Node.js and Python servers are, in
//! tests/tests/fixtures/wire/). Each listens on port 80 and logs as JSON lines every connection
//! as it comes, every request it parsed whole (the client's port, method, target, Host, and how
//! many bytes of body it read), and every connection it refused:
//! - `wire-hyper`: hyper's own HTTP/1 server with its defaults;
//! - `wire-nginx COMMAND…`: nginx, started by `COMMAND…` with the fixtures' nginx.conf, which
//!   logs its requests itself; in front of it a relay that logs the connections, which nginx
//!   cannot (it copies bytes both ways, unchanged, half-closes included), each under the port
//!   nginx sees it from.
//!
//! And the agent's side of it: `send-each`, which sends the samples through the name check.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::Args;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

fn log(value: serde_json::Value) {
    println!("{value}");
}

/// Reads the request's body to its end and logs the request, or the body's error.
async fn serve(request: Request<Incoming>, port: u16) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    // The target as the request line had it: hyper keeps absolute-form whole, origin-form as
    // path and query.
    let target = request.uri().to_string();
    let host = request.headers().get("host").map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    let mut body = request.into_body();
    let mut length = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => length += frame.data_ref().map_or(0, |d| d.len() as u64),
            Err(e) => {
                log(serde_json::json!({ "port": port, "error": e.to_string() }));
                return Ok(Response::new(Full::new(Bytes::from_static(b"error"))));
            }
        }
    }
    log(
        serde_json::json!({ "port": port, "method": method, "target": target, "host": host, "body": length }),
    );
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

pub fn hyper() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("a runtime");
    runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([0u16; 8], 80))).await.expect("bind :80");
        println!("peer ready");
        loop {
            let Ok((stream, from)) = listener.accept().await else { continue };
            let port = from.port();
            log(serde_json::json!({ "conn": port }));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| serve(request, port));
                // Half-closed connections are served: the sender shuts its side once a sample
                // is sent, and a request read whole before that is still answered.
                let served = hyper::server::conn::http1::Builder::new()
                    .half_close(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    log(serde_json::json!({ "port": port, "error": e.to_string() }));
                }
            });
        }
    });
}

/// Where nginx listens, behind the relay (tests/tests/fixtures/wire/nginx.conf).
const NGINX: &str = "127.0.0.1:8080";

pub fn nginx(command: &[String]) {
    let Some((program, args)) = command.split_first() else {
        eprintln!("wire-nginx: no command to start nginx with");
        std::process::exit(2);
    };
    let mut nginx = std::process::Command::new(program).args(args).spawn().expect("nginx starts");
    // The peer is nginx: it ends with it.
    std::thread::spawn(move || {
        let status = nginx.wait();
        eprintln!("wire-nginx: nginx ended: {status:?}");
        std::process::exit(1);
    });
    // Ready once nginx answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(NGINX).is_err() {
        assert!(std::time::Instant::now() < deadline, "nginx did not listen on {NGINX}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let listener = std::net::TcpListener::bind(SocketAddr::from(([0u16; 8], 80))).expect("bind :80");
    println!("peer ready");
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(server) = std::net::TcpStream::connect(NGINX) else { continue };
        // The port nginx logs as the client's.
        let port = server.local_addr().map(|a| a.port()).unwrap_or(0);
        log(serde_json::json!({ "conn": port }));
        let (Ok(client_read), Ok(server_read)) = (client.try_clone(), server.try_clone()) else { continue };
        std::thread::spawn(move || copy(client_read, server));
        std::thread::spawn(move || copy(server_read, client));
    }
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing side.
fn copy(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    std::io::copy(&mut from, &mut to).ok();
    to.shutdown(std::net::Shutdown::Write).ok();
}

/// `send-each DIR HOST PORT [--timeout-ms N]`: every file of DIR (in name order) sent as it is
/// on a connection of its own to HOST:PORT, the write side then closed; reports
/// `NAME=OUTCOME BYTES`: how the connection ended (`closed` by the server after its answers,
/// `denied` by the sandbox's answer, `reset`, `timeout`, or a connect outcome) and how many bytes came back. One at a time, so the
/// servers see the connections in the files' order. The wire suite's differential samples.
pub fn send_each(args: &Args) {
    let (dir, host, port) = (args.arg(1), args.arg(2), args.arg(3));
    let timeout = Duration::from_millis(args.number("--timeout-ms", 3000));
    let addr = match crate::probes::resolve(&host, timeout) {
        Ok(addr) => SocketAddr::new(addr, port.parse().unwrap_or(0)),
        Err(outcome) => return crate::report(&[("outcome", outcome)]),
    };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let name = file.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let bytes = std::fs::read(&file).unwrap_or_default();
        let (outcome, answered) = match TcpStream::connect_timeout(&addr, timeout) {
            Err(e) => (crate::probes::outcome_of(&e), 0),
            Ok(mut stream) => {
                stream.set_read_timeout(Some(timeout)).ok();
                let mut answer = Vec::new();
                let sent = stream.write_all(&bytes).and_then(|_| stream.shutdown(std::net::Shutdown::Write));
                let read = sent.and_then(|_| std::io::Read::read_to_end(&mut stream, &mut answer));
                let outcome = match read {
                    // The sandbox's refusal, in the sample's protocol.
                    Ok(_)
                        if crate::web::refused_by_sandbox(&answer).is_some()
                            || answer == crate::hello::ACCESS_DENIED =>
                    {
                        "denied".to_string()
                    }
                    Ok(_) => "closed".to_string(),
                    // The sandbox cut the connection while the sample was still being sent.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::EPIPE)) => {
                        "reset".to_string()
                    }
                    Err(e) => crate::probes::outcome_of(&e),
                };
                (outcome, answer.len())
            }
        };
        println!("{name}={outcome} {answered}");
    }
}
