//! The forge peer (`serve --forge DIR`): GitHub and the npm registry on the test network, chosen
//! by the Host a request names. `api.github.com` and `uploads.github.com` answer anything with
//! 200 and JSON; `registry.npmjs.org` serves the packuments and tarballs under DIR/npm and
//! answers 201 to any PUT; GitHub's download hosts (codeload, raw, objects) answer 200 to
//! anything with what was asked, and github.com's release downloads redirect there, as GitHub's
//! do; every other host is github.com: git's smart HTTP through Debian's
//! `git http-backend` (a CGI) on the bare repositories under DIR/git, which accepts pushes, and
//! an LFS batch endpoint with nothing in it. Every request is logged on one line:
//! `forge host=H method=M path=P auth=A status=N bytes=B port=P`, where A is the Authorization
//! header as sent (it may hold a blank) or `-`, and B the request body's size.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::oauth::percent_decode;

/// Debian's git smart HTTP server, a CGI program.
const HTTP_BACKEND: &str = "/usr/lib/git-core/git-http-backend";
/// The repositories the forge starts with (DIR/git/NAME.git), one commit on `main` each.
const REPOSITORIES: &[&str] = &["octo/hello", "octo/secret"];
/// The package the registry starts with: DIR/npm/NAME/packument.json and its tarball at
/// DIR/npm/NAME/-/NAME-VERSION.tgz, the path of its URL.
const PACKAGE: &str = "left-pad-sandbox";
const VERSION: &str = "1.0.0";
const REGISTRY: &str = "https://registry.npmjs.org";

/// Creates the repositories and the package under `dir`; panics if git or tar fails.
pub fn prepare(dir: &str) {
    for name in REPOSITORIES {
        bare_repository(&format!("{dir}/git/{name}.git"), name);
    }
    package(&format!("{dir}/npm"));
}

/// Runs git with `stdin`, and returns what it printed, trimmed.
fn git(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("git")
        .args(args)
        // Fixed dates: the same commit in every peer.
        .env("GIT_AUTHOR_DATE", "2024-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2024-01-01T00:00:00Z")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git (the forge peer runs on the base image)");
    child.stdin.take().expect("piped").write_all(stdin.as_bytes()).expect("git's input");
    let out = child.wait_with_output().expect("git");
    assert!(out.status.success(), "git {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare repository at `path` whose `main` has one commit with a README.md.
fn bare_repository(path: &str, name: &str) {
    git(&["init", "--quiet", "--bare", "--initial-branch=main", path], "");
    let dir = format!("--git-dir={path}");
    let readme = format!("# {name}\n\nA repository of the test forge.\n");
    let blob = git(&[&dir, "hash-object", "-w", "--stdin"], &readme);
    let tree = git(&[&dir, "mktree"], &format!("100644 blob {blob}\tREADME.md\n"));
    let user = ["-c", "user.name=t", "-c", "user.email=t@t"];
    let commit = git(&[&dir, user[0], user[1], user[2], user[3], "commit-tree", &tree, "-m", "init"], "");
    git(&[&dir, "update-ref", "refs/heads/main", &commit], "");
}

/// The package: a tarball made by tar (`package/package.json`, `package/index.js`) and the
/// packument that names it, with the digests npm checks.
fn package(npm: &str) {
    use sha2::Digest as _;
    let build = format!("{npm}/.build");
    let root = format!("{npm}/{PACKAGE}");
    std::fs::create_dir_all(format!("{build}/package")).expect("the forge's folder");
    std::fs::create_dir_all(format!("{root}/-")).expect("the forge's folder");
    let manifest = serde_json::json!({
        "name": PACKAGE, "version": VERSION, "main": "index.js", "license": "MIT",
        "description": "left-pad, from the test forge",
    });
    std::fs::write(format!("{build}/package/package.json"), manifest.to_string()).expect("package.json");
    let index = "module.exports = (s, n, c = ' ') => String(s).padStart(n, c);\n";
    std::fs::write(format!("{build}/package/index.js"), index).expect("index.js");
    let tarball = format!("{root}/-/{PACKAGE}-{VERSION}.tgz");
    let status = Command::new("tar").args(["-czf", &tarball, "-C", &build, "package"]).status();
    assert!(status.is_ok_and(|s| s.success()), "tar failed");
    let _ = std::fs::remove_dir_all(&build);
    let bytes = std::fs::read(&tarball).expect("the tarball");
    let sha1 = Command::new("sha1sum").arg(&tarball).output().expect("sha1sum");
    let shasum = String::from_utf8_lossy(&sha1.stdout).split_whitespace().next().unwrap_or("").to_string();
    let integrity = format!("sha512-{}", base64(&sha2::Sha512::digest(&bytes)));
    let mut version = manifest;
    version["_id"] = format!("{PACKAGE}@{VERSION}").into();
    version["dist"] = serde_json::json!({
        "tarball": format!("{REGISTRY}/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"),
        "shasum": shasum,
        "integrity": integrity,
    });
    let packument = serde_json::json!({
        "_id": PACKAGE, "name": PACKAGE,
        "dist-tags": { "latest": VERSION },
        "versions": { VERSION: version },
        "time": { "created": "2024-01-01T00:00:00.000Z", "modified": "2024-01-01T00:00:00.000Z",
                  VERSION: "2024-01-01T00:00:00.000Z" },
    });
    std::fs::write(format!("{root}/packument.json"), packument.to_string()).expect("the packument");
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            let sextet = (n >> (18 - 6 * i)) & 63;
            out.push(if i <= chunk.len() { ALPHABET[sextet as usize] as char } else { '=' });
        }
    }
    out
}

/// A whole answer: status, content type and body.
struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Reply {
    fn json(status: u16, value: serde_json::Value) -> Reply {
        Reply { status, content_type: "application/json", body: value.to_string().into_bytes() }
    }
}

/// One request, as web.rs read it: the body whole (chunked decoded).
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub host: &'a str,
    /// The body came chunked.
    pub chunked: bool,
    /// Every header: (lower-cased name, value).
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
    /// The client's address and port.
    pub from: &'a str,
    /// The port it came to.
    pub port: u16,
}

impl Request<'_> {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Answers one request with `Connection: close`, handing `log` its line before the answer
/// is sent.
pub fn respond(dir: &str, request: &Request, out: &mut impl Write, log: impl Fn(&str)) {
    let logged = |status: u16| {
        let auth = request.header("authorization").unwrap_or("-");
        log(&format!(
            "forge host={} method={} path={} auth={auth} status={status} bytes={} port={}",
            request.host,
            request.method,
            request.path,
            request.body.len(),
            request.port
        ));
    };
    let reply = match bare_host(request.host).as_str() {
        "api.github.com" | "uploads.github.com" => api(request),
        "codeload.github.com" | "raw.githubusercontent.com" | "objects.githubusercontent.com" => Reply {
            status: 200,
            content_type: "text/plain",
            body: format!("download {}", request.path).into_bytes(),
        },
        _ if request.method == "GET" && request.path.contains("/releases/download/") => {
            let asset = request.path.rsplit('/').next().unwrap_or_default();
            let to = format!("https://objects.githubusercontent.com/release-asset/{asset}?sig=forge");
            logged(302);
            let _ = write!(
                out,
                "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = out.flush();
            return;
        }
        "registry.npmjs.org" => registry(dir, request),
        _ if request.method == "POST" && git_path(request.path).ends_with("/info/lfs/objects/batch") => {
            Reply {
                status: 200,
                content_type: "application/vnd.git-lfs+json",
                body: br#"{"transfer":"basic","objects":[]}"#.to_vec(),
            }
        }
        _ => return git_backend(dir, request, out, logged),
    };
    logged(reply.status);
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status,
        reason(reply.status),
        reply.content_type,
        reply.body.len()
    );
    if request.method != "HEAD" {
        let _ = out.write_all(&reply.body);
    }
    let _ = out.flush();
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        404 => "Not Found",
        _ => "Forge",
    }
}

/// The Host header without its port, lower case.
fn bare_host(host: &str) -> String {
    let host = match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    host.to_ascii_lowercase()
}

/// api.github.com and uploads.github.com: 200 to anything, saying what was asked.
fn api(request: &Request) -> Reply {
    if request.method == "POST" && request.path.split('?').next() == Some("/graphql") {
        return Reply::json(200, serde_json::json!({ "data": { "ok": true } }));
    }
    Reply::json(200, serde_json::json!({ "ok": true, "method": request.method, "path": request.path }))
}

/// registry.npmjs.org: `GET /NAME` (`/@scope%2fname` too) is DIR/npm/NAME/packument.json,
/// `GET /NAME/-/FILE` is DIR/npm/NAME/-/FILE, a PUT is taken (201), the rest is not found.
fn registry(dir: &str, request: &Request) -> Reply {
    let not_found = || Reply::json(404, serde_json::json!({ "error": "not found" }));
    if request.method == "PUT" {
        return Reply::json(201, serde_json::json!({ "ok": true }));
    }
    if request.method != "GET" && request.method != "HEAD" {
        return not_found();
    }
    let path = percent_decode(request.path.split('?').next().unwrap_or(""));
    let path = path.trim_start_matches('/');
    if path.is_empty() || path.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return not_found();
    }
    let (file, content_type) = match path.split_once("/-/") {
        Some(_) => (format!("{dir}/npm/{path}"), "application/octet-stream"),
        None => (format!("{dir}/npm/{path}/packument.json"), "application/json"),
    };
    match std::fs::read(file) {
        Ok(body) => Reply { status: 200, content_type, body },
        Err(_) => not_found(),
    }
}

/// The path without its query, the repository named `NAME.git` as on disk: git asks GitHub for
/// `/octo/hello/info/refs` as well as `/octo/hello.git/info/refs`.
fn git_path(path: &str) -> String {
    let path = path.split('?').next().unwrap_or("");
    let mut parts: Vec<String> = path.trim_start_matches('/').splitn(3, '/').map(str::to_string).collect();
    if parts.len() >= 2 && !parts[1].ends_with(".git") {
        parts[1].push_str(".git");
    }
    format!("/{}", parts.join("/"))
}

/// github.com: `git http-backend` run as a CGI with the request's body on its standard input,
/// its output (a `Status:` header, other headers, a blank line, the body) streamed back.
fn git_backend(dir: &str, request: &Request, out: &mut impl Write, logged: impl Fn(u16)) {
    let remote = request.from.rsplit_once(':').map_or(request.from, |(addr, _)| addr);
    let remote = remote.trim_start_matches('[').trim_end_matches(']');
    let mut cgi = Command::new(HTTP_BACKEND);
    cgi.env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("GIT_PROJECT_ROOT", format!("{dir}/git"))
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", request.method)
        .env("PATH_INFO", git_path(request.path))
        .env("QUERY_STRING", request.path.split_once('?').map_or("", |(_, q)| q))
        .env("REMOTE_USER", "agent")
        .env("REMOTE_ADDR", remote)
        // Pushes are taken; root serves repositories whoever owns them.
        .env("GIT_CONFIG_COUNT", "2")
        .env("GIT_CONFIG_KEY_0", "http.receivepack")
        .env("GIT_CONFIG_VALUE_0", "true")
        .env("GIT_CONFIG_KEY_1", "safe.directory")
        .env("GIT_CONFIG_VALUE_1", "*")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(kind) = request.header("content-type") {
        cgi.env("CONTENT_TYPE", kind);
    }
    // A chunked body has no length: the CGI reads its input to the end.
    if !request.chunked && request.header("content-length").is_some() {
        cgi.env("CONTENT_LENGTH", request.body.len().to_string());
    }
    for (header, variable) in
        [("content-encoding", "HTTP_CONTENT_ENCODING"), ("git-protocol", "HTTP_GIT_PROTOCOL")]
    {
        if let Some(value) = request.header(header) {
            cgi.env(variable, value);
        }
    }
    let Ok(mut child) = cgi.spawn() else {
        logged(500);
        let _ = write!(out, "HTTP/1.1 500 Forge\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let mut stdin = child.stdin.take().expect("piped");
    let input = request.body.to_vec();
    // Fed from a thread: the CGI may answer before it has read everything.
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut output = BufReader::new(child.stdout.take().expect("piped"));
    let (mut status, mut headers) = ("200 OK".to_string(), String::new());
    loop {
        let mut line = String::new();
        if output.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        match line.split_once(':') {
            Some((name, value)) if name.eq_ignore_ascii_case("status") => status = value.trim().to_string(),
            _ => headers.push_str(&format!("{line}\r\n")),
        }
    }
    logged(status.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(500));
    let _ = write!(out, "HTTP/1.1 {status}\r\n{headers}Connection: close\r\n\r\n");
    let _ = std::io::copy(&mut output, out);
    let _ = out.flush();
    let _ = feeder.join();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_as_the_standard_does() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn a_repository_is_found_with_or_without_dot_git() {
        assert_eq!(git_path("/octo/hello/info/refs?service=git-upload-pack"), "/octo/hello.git/info/refs");
        assert_eq!(git_path("/octo/hello.git/git-receive-pack"), "/octo/hello.git/git-receive-pack");
    }

    #[test]
    fn scoped_names_and_ports_are_read() {
        assert_eq!(percent_decode("/@scope%2fname"), "/@scope/name");
        assert_eq!(bare_host("GitHub.com:443"), "github.com");
        assert_eq!(bare_host("registry.npmjs.org"), "registry.npmjs.org");
    }
}
