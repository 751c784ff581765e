//! sandbox-probe: one static binary for both sides of the container suites.
//!
//! As a peer (`serve`) it answers on the private test network: TCP ports that greet or echo, UDP
//! ports that echo, and a DNS server that answers from a zone file it re-reads on every query (so
//! a test can move a name mid-test) and appends every query it receives to a log.
//!
//! As a probe, run inside the sandbox as the agent, it tries one thing and prints what happened
//! as `key=value` lines, exiting 0 whatever the outcome: the test decides what is right. The
//! attacks a hostile agent would try are probes too (attacks.rs): they are never in an image.

mod answer;
mod attacks;
mod mock;
mod oauth;
mod peer;
mod probes;
mod web;

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

const USAGE: &str = "\
usage: sandbox-probe serve [--tcp P,P] [--echo P,P] [--udp P,P] [--dns ZONE LOG]
                           [--http P,P] [--tls P,P --cert F --key F] [--files DIR] [--log FILE]
                           [--mock-api] [--ignore-bodies]
       sandbox-probe tcp HOST PORT [--raw|--http|--tls] [--sni NAME] [--host NAME]
       sandbox-probe fetch HOST PORT PATH [--tls] | concurrent HOST PORT N [--tls]
       sandbox-probe tls-hello HOST PORT [--sni NAME] [--ech] [--pad N] [--split N]
                           [--retry NAME [--alert first|after-ccs] [--alert-apart]]
       sandbox-probe udp HOST PORT | icmp ADDR | hold HOST PORT --ms N
       sandbox-probe dns NAME [--type T] [--id N] [--server IP] [--timeout-ms MS]
       sandbox-probe dns-bench NAME COUNT [--server IP] [--distinct] [--concurrency K]
       sandbox-probe openai-jwt EXP SIGNATURE   (a token as the mock's sign-in hands out)
attacks (attacks.rs): forge-dns, dns-flood, tcp-flood, fake-tmux, race-state, sentinel,
       set-file-cap, privileged-files, caps";

fn main() {
    let args = Args { all: std::env::args().skip(1).collect() };
    match args.arg(0).as_str() {
        "serve" => peer::serve(args.rest()),
        "tcp" => probes::tcp(&args),
        "http-pipeline" => probes::http_pipeline(&args),
        "first-byte" => probes::first_byte(&args),
        "api-first-byte" => probes::api_first_byte(&args),
        "pattern-sha" => report(&[("sha256", web::pattern_sha(args.arg(1).parse().unwrap_or(0)))]),
        "fetch" => probes::fetch(&args),
        "concurrent" => probes::concurrent(&args),
        "tls-hello" => attacks::tls_hello(&args),
        "udp" => probes::udp(&args),
        "icmp" => probes::icmp(&args),
        "hold" => probes::hold(&args),
        "dns" => probes::dns(&args),
        "dns-bench" => probes::dns_bench(&args),
        "forge-dns" => attacks::forge_dns(&args),
        "dns-flood" => attacks::dns_flood(&args),
        "tcp-flood" => attacks::tcp_flood(&args),
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
        "openai-jwt" => report(&[("jwt", oauth::openai_jwt(args.arg(1).parse().unwrap_or(0), &args.arg(2)))]),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(64);
        }
    }
}
