//! sandbox-probe: one static binary for both sides of the container suites.
//!
//! As a peer (`serve`) it answers on the private test network: TCP ports that greet or echo, UDP
//! ports that echo, and a DNS server that answers from a zone file it re-reads on every query (so
//! a test can move a name mid-test) and appends every query it receives to a log; with
//! `--forge` its web ports play GitHub and the npm registry (forge.rs).
//!
//! As a probe, run inside the sandbox as the agent, it tries one thing and prints what happened
//! as `key=value` lines, exiting 0 whatever the outcome: the test decides what is right. The
//! attacks a hostile agent would try are probes too (attacks.rs): they are never in an image.

mod answer;
mod attacks;
mod forge;
mod hello;
mod mock;
mod oauth;
mod peer;
mod probes;
mod web;
mod wire;

use std::time::Duration;

/// The command line of one run: positional arguments and `--flag value` options.
pub struct Args {
    all: Vec<String>,
}

impl Args {
    /// The n-th argument after the command's name, or "".
    pub fn arg(&self, n: usize) -> String {
        self.all.get(n).cloned().unwrap_or_default()
    }

    /// The value after `--name`.
    pub fn flag(&self, name: &str) -> Option<String> {
        self.all.iter().position(|a| a == name).and_then(|i| self.all.get(i + 1)).cloned()
    }

    pub fn has(&self, name: &str) -> bool {
        self.all.iter().any(|a| a == name)
    }

    pub fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        self.flag(name).and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.number("--timeout-ms", 3000))
    }

    pub fn rest(&self) -> &[String] {
        &self.all[1..]
    }
}

/// What the probe reports.
pub fn report(pairs: &[(&str, String)]) {
    for (key, value) in pairs {
        println!("{key}={value}");
    }
}

/// Every command the dispatcher below takes, one per line (`xtask/tests/tidy.rs` keeps the two
/// the same).
const USAGE: &str = "\
usage: sandbox-probe COMMAND [ARGS]: prints key=value lines and exits 0 whatever happened.
as a peer (peer.rs, web.rs, mock.rs, oauth.rs, forge.rs, wire.rs):
  serve [--tcp P,P] [--echo P,P] [--udp P,P] [--dns ZONE LOG] [--http P,P]
        [--tls P,P --cert F --key F] [--files DIR] [--log FILE] [--mock-api] [--ignore-bodies]
        [--forge DIR] [--log-accepts] [--icmp] [--icmp6 FILE]
  wire-hyper                  hyper's HTTP/1 server on port 80, logging what it parsed
  wire-nginx COMMAND...       nginx started by COMMAND, behind a relay logging connections
  default-route GATEWAY       a default route via GATEWAY in this network namespace (root, NET_ADMIN)
probes, as a well-behaved agent (probes.rs):
  tcp HOST PORT [--raw|--http|--tls] [--sni NAME] [--host NAME] [--send TEXT: \\r \\n \\t \\\\ \\xHH escapes]
  http-pipeline HOST PORT NAME...
  first-byte HOST PORT COUNT [--tls]
  api-first-byte HOST PORT COUNT [--tls]
  fetch HOST PORT PATH [--tls]
  concurrent HOST PORT N [--tls] [--hold-ms M]
  udp HOST PORT
  icmp ADDR
  hold HOST PORT --ms N [--http]
  dns NAME [--type T] [--id N] [--server IP] [--edns] [--timeout-ms MS]
  dns-bench NAME COUNT [--server IP] [--distinct] [--concurrency K] [--for-ms N] [--pace-us P]
  pattern-sha N
  openai-jwt EXP SIGNATURE
attacks, as a hostile agent (attacks.rs, hello.rs):
  tls-hello HOST PORT [--sni NAME] [--no-sni] [--ech] [--pad N] [--split N] [--records]
            [--retry NAME [--alert first|after-ccs] [--alert-apart] [--announce]]
  forge-dns --bind IP:PORT [--freebind] --name NAME --answer IPV4 [--ttl S] [--spray IP]
            [--blind IP] [--id N] [--asks N] [--ms N]
  dns-flood NAME COUNT [--distinct] [--server IP]
  dns-crafted LABELS [--smuggle TEXT]
  tcp-flood ADDR PORT COUNT --ms N
  upload HOST PORT BYTES
  fake-tmux SOCKET PAYLOAD --ms N
  race-state DIR FILE TARGET --dirs N --ms M
  sentinel FILE
  set-file-cap FILE
  privileged-files ROOT
  caps
  plant-udp REMOTE:PORT LOCAL:PORT MESSAGE
  lo-hole LOCAL:PORT REMOTE:PORT --ms N
  forged-ping REMOTE LOCAL PAYLOAD
  forged-source FORGED:PORT TARGET:PORT PAYLOAD
  tty-stop MARKER
  deep DIR DEPTH
  find-string HEX ROOT...
  send-each DIR HOST PORT [--timeout-ms N]";

fn main() {
    let args = Args { all: std::env::args().skip(1).collect() };
    match args.arg(0).as_str() {
        "serve" => peer::serve(args.rest()),
        "wire-hyper" => wire::hyper(),
        "wire-nginx" => wire::nginx(&args.all[1..]),
        "default-route" => peer::default_route(&args),
        "tcp" => probes::tcp(&args),
        "http-pipeline" => probes::http_pipeline(&args),
        "first-byte" => probes::first_byte(&args),
        "api-first-byte" => probes::api_first_byte(&args),
        "pattern-sha" => report(&[("sha256", web::pattern_sha(args.arg(1).parse().unwrap_or(0)))]),
        "fetch" => probes::fetch(&args),
        "concurrent" => probes::concurrent(&args),
        "tls-hello" => hello::tls_hello(&args),
        "udp" => probes::udp(&args),
        "icmp" => probes::icmp(&args),
        "hold" => probes::hold(&args),
        "dns" => probes::dns(&args),
        "dns-bench" => probes::dns_bench(&args),
        "forge-dns" => attacks::forge_dns(&args),
        "dns-flood" => attacks::dns_flood(&args),
        "tcp-flood" => attacks::tcp_flood(&args),
        "upload" => attacks::upload(&args),
        "fake-tmux" => attacks::fake_tmux(&args),
        "race-state" => attacks::race_state(&args),
        "sentinel" => attacks::sentinel(&args),
        "set-file-cap" => attacks::set_file_cap(&args),
        "privileged-files" => attacks::privileged_files(&args),
        "caps" => attacks::caps(),
        "plant-udp" => attacks::plant_udp(&args),
        "lo-hole" => attacks::lo_hole(&args),
        "forged-ping" => attacks::forged_ping(&args),
        "forged-source" => attacks::forged_source(&args),
        "tty-stop" => attacks::tty_stop(&args),
        "dns-crafted" => attacks::dns_crafted(&args),
        "deep" => attacks::deep(&args),
        "find-string" => attacks::find_string(&args),
        "send-each" => wire::send_each(&args),
        "openai-jwt" => report(&[("jwt", oauth::openai_jwt(args.arg(1).parse().unwrap_or(0), &args.arg(2)))]),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(64);
        }
    }
}
