//! The sandbox's one reader of HTTP/1 against real servers: every sample of the corpus
//! (sandbox-wire/corpus/http1/), alone and with a plain request pipelined after it, is sent by the
//! agent through the name check to Node.js's `http` (llhttp), Python's `http.server`, hyper's
//! HTTP/1 server (the probe's `wire-hyper`) and Debian's nginx (fixtures/wire/nginx.conf), each logging every connection as it comes and every
//! request it parsed whole (method, target, Host, body length); one sample at a time, so the
//! connections are the samples', in order.
//! For every sample and server, the requests the server parsed are the first of those the
//! sandbox's reader passed (sandbox-wire's `corpus::name_check`, the library the name check runs),
//! in order and alike: a server that parsed a request the sandbox did not see is a failure naming
//! the sample and the server. Where the library refuses a sample, the real sandbox resets the
//! connection. NET_ADMIN, a private network; one container and sidecar mode.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use sandbox_tests::docker::{TestNet, container_logs};
use sandbox_tests::images::{NGINX_PREFIX, image, nginx_peer_image};
use sandbox_tests::peers::{Peer, PeerSpec};
use sandbox_tests::probe::PROBE;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;
use sandbox_wire::corpus::{self, Parsed, Sample};
use sandbox_wire::namecheck::answer::refusal_answer;
use sandbox_wire::namecheck::{Sniffed, sniff};

/// A plain request sent after every sample, in its pipelined copy: where a server's reading of
/// the sample ends decides what it makes of the bytes after it.
const AFTER: &str = "GET /after HTTP/1.1\r\nHost: {host}\r\n\r\n";

/// A real server: the name it answers to, the folder its samples are written to, how it starts,
/// and how it reports the target it parsed.
struct Server {
    name: &'static str,
    dir: &'static str,
    start: Start,
    targets: Targets,
}

/// How a server reports a request's target: what the sandbox passed is compared in that form.
#[derive(Clone, Copy)]
enum Targets {
    /// As the request line had it.
    AsSent,
    /// As hyper's `Uri` writes it: the scheme in lower case, no fragment.
    Uri,
    /// An absolute-form target as its path and query alone (nginx's `$request_uri`).
    OriginForm,
}

impl Targets {
    /// `target`, as the request line had it, in this form.
    fn of(self, target: &str) -> String {
        match (self, target.split_once("://")) {
            (Targets::AsSent, _) => target.to_string(),
            (Targets::OriginForm, Some((_, rest))) => {
                rest.find('/').map_or("/", |at| &rest[at..]).to_string()
            }
            (Targets::OriginForm, None) => target.to_string(),
            (Targets::Uri, scheme) => {
                let target = target.split('#').next().unwrap_or_default();
                match scheme {
                    Some((scheme, _)) => {
                        format!("{}{}", scheme.to_ascii_lowercase(), &target[scheme.len()..])
                    }
                    None => target.to_string(),
                }
            }
        }
    }
}

enum Start {
    /// `command` run in one of our images (the fixtures mounted at /srv).
    Program { image: &'static str, command: &'static [&'static str] },
    /// A command of the probe's, in the peer image.
    Probe(&'static [&'static str]),
    /// Debian's nginx with the fixtures' nginx.conf, behind the probe's relay (`wire-nginx`).
    Nginx,
}

const SERVERS: [Server; 4] = [
    Server {
        name: "node.wire.test",
        dir: "node",
        start: Start::Program { image: "node", command: &["node", "/srv/node.js"] },
        targets: Targets::AsSent,
    },
    Server {
        name: "python.wire.test",
        dir: "python",
        start: Start::Program { image: "python", command: &["python3", "/srv/python.py"] },
        targets: Targets::AsSent,
    },
    Server {
        name: "hyper.wire.test",
        dir: "hyper",
        start: Start::Probe(&["wire-hyper"]),
        targets: Targets::Uri,
    },
    Server { name: "nginx.wire.test", dir: "nginx", start: Start::Nginx, targets: Targets::OriginForm },
];

impl Server {
    async fn start(&self, net: &TestNet, fixtures: &Path) -> anyhow::Result<Peer> {
        let spec = PeerSpec::named(&[self.name]);
        let spec = match self.start {
            Start::Program { image: name, command } => spec.program(&image(name).await?, command, fixtures),
            Start::Probe(command) => spec.serving(command),
            Start::Nginx => {
                let nginx = format!("{NGINX_PREFIX}/nginx");
                let (loader, libraries) = (format!("{NGINX_PREFIX}/ld.so"), format!("{NGINX_PREFIX}/lib"));
                let command = [
                    PROBE,
                    "wire-nginx",
                    &loader,
                    "--library-path",
                    &libraries,
                    &nginx,
                    "-e",
                    "stderr",
                    "-c",
                    "/srv/nginx.conf",
                ];
                spec.program(&nginx_peer_image().await?, &command, fixtures)
            }
        };
        spec.start(net).await
    }
}

/// A line of a server's log: a connection coming in, a request it parsed whole, or the
/// connection it refused; each with the client's port, which ties a request to its connection
/// (nginx logs a request after it has proxied it, which may be after the next connection came).
enum Logged {
    Connection(u16),
    Request(u16, Parsed),
    Refused(u16, String),
}

fn logged(line: &str) -> Option<Logged> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    // A number, or a string of one (nginx's lines, nginx.conf, are all strings).
    let number = |key: &str| match value.get(key)? {
        serde_json::Value::String(s) if s.is_empty() => Some(0),
        serde_json::Value::String(s) => s.parse::<u64>().ok(),
        number => number.as_u64(),
    };
    if let Some(port) = number("conn") {
        return Some(Logged::Connection(port as u16));
    }
    let port = number("port")? as u16;
    if let Some(error) = value.get("error") {
        return Some(Logged::Refused(port, error.to_string()));
    }
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_string);
    // nginx's status says whether it refused the request, and an absent Host is empty.
    let nginx = value.get("status").is_some();
    if let Some(status) = number("status").filter(|s| *s >= 400) {
        return Some(Logged::Refused(port, format!("status {status}")));
    }
    Some(Logged::Request(
        port,
        Parsed {
            method: text("method")?,
            target: text("target")?,
            host: text("host").filter(|h| !(nginx && h.is_empty())),
            body: number("body")?,
            // The servers log a request once its body ended.
            whole: true,
        },
    ))
}

/// The server's log as connections, in the order they came: what it parsed on each (by the
/// client's port: the latest connection from it), and how it refused it if it did.
fn connections(log: &str) -> Vec<(Vec<Parsed>, Option<String>)> {
    let mut found: Vec<(u16, Vec<Parsed>, Option<String>)> = Vec::new();
    for entry in log.lines().filter_map(logged) {
        let port = match &entry {
            Logged::Connection(port) => {
                found.push((*port, Vec::new(), None));
                continue;
            }
            Logged::Request(port, _) | Logged::Refused(port, _) => *port,
        };
        let Some(connection) = found.iter_mut().rev().find(|c| c.0 == port) else { continue };
        match entry {
            Logged::Request(_, parsed) => connection.1.push(parsed),
            Logged::Refused(_, why) => connection.2 = Some(why),
            Logged::Connection(_) => {}
        }
    }
    found.into_iter().map(|(_, parsed, refused)| (parsed, refused)).collect()
}

/// Whether the server's reading of a request is the sandbox's: Host compared as a name is. A
/// request the sandbox cut short (its refusal, or the sample's end) may have been acted on with
/// what of its body came, and no more.
fn alike(server: &Parsed, sandbox: &Parsed, targets: Targets) -> bool {
    let body = if sandbox.whole { server.body == sandbox.body } else { server.body <= sandbox.body };
    server.method == sandbox.method
        && server.target == targets.of(&sandbox.target)
        && body
        && server.host.as_deref().map(str::to_ascii_lowercase)
            == sandbox.host.as_deref().map(str::to_ascii_lowercase)
}

/// Writes every sample for `host`, alone and pipelined, into `dir` (readable by the agent).
fn write_samples(dir: &Path, samples: &[Sample], host: &str) -> anyhow::Result<HashMap<String, Vec<u8>>> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let mut sent = HashMap::new();
    for sample in samples {
        let bytes = sample.bytes(host).map_err(anyhow::Error::msg)?;
        let after = [bytes.clone(), AFTER.replace("{host}", host).into_bytes()].concat();
        for (name, bytes) in [(sample.name.clone(), bytes), (format!("{}+after", sample.name), after)] {
            std::fs::write(dir.join(&name), &bytes)?;
            std::fs::set_permissions(dir.join(&name), std::fs::Permissions::from_mode(0o644))?;
            sent.insert(name, bytes);
        }
    }
    Ok(sent)
}

/// What went wrong for one server, sample by sample, and how many samples it parsed exactly as
/// the sandbox passed them; and the samples it read fewer of (a stricter server: no failure).
struct Verdict {
    failures: Vec<String>,
    agreed: Vec<String>,
    stricter: Vec<String>,
}

/// The server's log once it has a connection for each of the `expected` samples and has stopped
/// growing: the engine hands a container's output on after the server wrote it, and the last
/// sample's lines came after the probe had ended (seen in sidecar mode). 10 s at most.
async fn settled_log(peer: &Peer, expected: usize) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = String::new();
    loop {
        let log = container_logs(&peer.id).await?.0;
        if (connections(&log).len() >= expected && log == last) || std::time::Instant::now() > deadline {
            return Ok(log);
        }
        last = log;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Sends every sample to `server` as the agent and compares the server's log with the library.
/// The probe sends one sample at a time, and the name check connects to the server only for a
/// sample whose first request it allowed: the server's connections are those samples', in order.
async fn judge(
    sb: &Sandbox,
    peer: &Peer,
    server: &Server,
    sent: &HashMap<String, Vec<u8>>,
) -> anyhow::Result<Verdict> {
    let dir = format!("/samples/{}", server.dir);
    let out = sb.as_agent(&[PROBE, "send-each", &dir, server.name, "80", "--timeout-ms", "2000"]).await?;
    let expected = out
        .stdout
        .lines()
        .filter_map(|line| sent.get(line.split_once('=')?.0))
        .filter(|bytes| !matches!(sniff(bytes), Sniffed::Refused(_) | Sniffed::NeedMore))
        .count();
    let log = settled_log(peer, expected).await?;
    let mut connections = connections(&log).into_iter();
    let mut verdict = Verdict { failures: Vec::new(), agreed: Vec::new(), stricter: Vec::new() };
    let mut reported = 0;
    for line in out.stdout.lines() {
        let Some((name, rest)) = line.split_once('=') else { continue };
        let Some(bytes) = sent.get(name) else { continue };
        reported += 1;
        let outcome = rest.split(' ').next().unwrap_or_default();
        let (passed, refused) = corpus::name_check(bytes);
        if let Sniffed::Refused(why) = sniff(bytes) {
            // Answered in its protocol where the checker knows it (a 403 to a request), else reset.
            let expected = if refusal_answer(bytes, why).is_some() { "denied" } else { "reset" };
            if outcome != expected {
                verdict.failures.push(format!(
                    "{name} at {}: the name check's library refuses its first request ({why}), but the connection ended {outcome}",
                    server.name
                ));
            }
            continue;
        }
        if matches!(sniff(bytes), Sniffed::NeedMore) {
            continue;
        }
        let Some((seen, server_refused)) = connections.next() else {
            anyhow::bail!("{name}: the server logged fewer connections than the samples it was sent:\n{log}");
        };
        let prefix =
            seen.len() <= passed.len() && seen.iter().zip(&passed).all(|(s, p)| alike(s, p, server.targets));
        if !prefix {
            verdict.failures.push(format!(
                "{name} at {}: the server parsed {seen:?}, the sandbox passed {passed:?} (then refused: {refused:?})",
                server.name
            ));
        } else if seen.len() < passed.iter().filter(|p| p.whole).count() {
            verdict.stricter.push(format!("{name}: {} of {} ({server_refused:?})", seen.len(), passed.len()));
        } else if !passed.is_empty() && passed.iter().all(|p| p.whole) {
            verdict.agreed.push(name.to_string());
        }
    }
    anyhow::ensure!(
        reported == sent.len(),
        "the probe reported {reported} of {} samples: {}",
        sent.len(),
        out.stdout
    );
    let left: Vec<_> = connections.collect();
    anyhow::ensure!(left.is_empty(), "the server logged connections no sample accounts for: {left:?}\n{log}");
    if !verdict.failures.is_empty() {
        // What the server logged, sample by sample in the probe's order, to read the failures by.
        eprintln!("{}'s log:\n{log}\nthe probe's:\n{}", server.name, out.stdout);
    }
    Ok(verdict)
}

net_admin! {
    [single, sidecar] {
        #[tokio::test]
        async fn every_sample_reaches_each_server_as_the_sandbox_read_it() -> anyhow::Result<()> {
            let samples = corpus::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../sandbox-wire/corpus/http1"))
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(samples.len() >= 200, "{} samples", samples.len());
            let net = TestNet::create("wire").await?;
            let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
            let mut peers = Vec::new();
            for server in &SERVERS {
                peers.push(server.start(&net, &fixtures).await?);
            }
            let root = tempfile::tempdir()?;
            std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))?;
            let mut sent = Vec::new();
            for server in &SERVERS {
                sent.push(write_samples(&root.path().join(server.dir), &samples, server.name)?);
            }
            let names: Vec<String> = SERVERS.iter().map(|s| format!("  - {}\n", s.name)).collect();
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("wire.yaml", &format!("version: 1\ndomains:\n{}", names.concat()))
                .mount(&root.path().display().to_string(), "/samples")
                .start()
                .await?;
            let judged = SERVERS.iter().zip(&peers).zip(&sent).map(|((server, peer), sent)| judge(&sb, peer, server, sent));
            let verdicts = futures_util::future::join_all(judged).await;
            let mut failures = Vec::new();
            for (server, verdict) in SERVERS.iter().zip(verdicts) {
                let verdict = verdict?;
                eprintln!(
                    "{}: {} samples parsed as the sandbox passed them; read fewer than the sandbox passed: {:#?}",
                    server.name,
                    verdict.agreed.len(),
                    verdict.stricter
                );
                // The control: the plain requests reach every server exactly as they left, and the
                // request after them too where the connection is kept alive (HTTP/1.0 closes it).
                for sample in samples.iter().filter(|s| s.name.starts_with("plain-")) {
                    let http10 = sample.name.starts_with("plain-http10");
                    let names = [Some(sample.name.clone()), (!http10).then(|| format!("{}+after", sample.name))];
                    for name in names.into_iter().flatten() {
                        if !verdict.agreed.contains(&name) {
                            failures.push(format!("{name} at {}: the control was not parsed as sent", server.name));
                        }
                    }
                }
                failures.extend(verdict.failures);
            }
            assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
            Ok(())
        }
    }
}
