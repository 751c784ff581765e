//! `cargo xtask bench sandbox`: what sandbox-init costs, each figure against a baseline measured
//! in the same run on the same engine (the machines are shared and noisy; ratios and differences
//! of medians travel, absolute times do not).
//!
//! - start to `sandbox ready` vs. the same image whose entrypoint only prints the line;
//! - sidecar mode's pair, created to its session running, vs. one container the same way;
//! - the same with a 10,000-entry policy;
//! - DNS latency through the gate (cached and uncached allowed names) vs. asking the upstream
//!   directly, and throughput of both;
//! - the name check: connect to first byte, bulk throughput, 1,000 concurrent connections and
//!   the memory of PID 1 and the checker with them open, vs. the same sandbox with
//!   `SANDBOX_NAME_CHECK=off`;
//! - GitHub's forwarder: `git clone` of a 50 MB repository through it (plain HTTP on loopback,
//!   its own TLS to the forge peer) vs. git's own TLS to the same peer under a direct name, and
//!   the forwarder's peak resident memory after it;
//! - the session's output to an attached user (16 MB, `cat` in the pane) through sandbox-attach,
//!   whose root relay filters it, vs. the agent's own tmux client on the user's terminal (what
//!   sandbox-attach ran before the filter), and the relay's CPU time for it.
//!
//! With `BENCH_ONLY=name-check`, only the name check's figures are measured and printed; with
//! `BENCH_ONLY=gvisor`, only the pair's under gVisor against runc. `BENCH_IMAGE=REF` measures
//! REF in place of the shell image: another build of it, for a before and after on one machine.
//!
//! With `BENCH_CARD=FILE` (`cargo xtask bench card`), it also measures the time to a first
//! command (`agent-sandbox run --detach` of the node image, then `node -v` in it, vs. a bare
//! container of the same image; `BENCH_CARD_RUNS` each, sequential) and writes every figure,
//! medians and p95, to FILE as JSON, which xtask renders as docs/performance.md.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{LogsOptionsBuilder, RemoveContainerOptionsBuilder};
use futures_util::StreamExt as _;
use sandbox_init::net::uids::{CHECKER_UID, FORWARDER_UID};
use sandbox_tests::docker::{TEST_LABEL, TestNet};
use sandbox_tests::images::image;
use sandbox_tests::peers::Peer;
use sandbox_tests::probe::PROBE;
use sandbox_tests::probe::probe_binary;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// `{median, p95}` of `samples`, in milliseconds.
fn stats_ms(samples: &[Duration]) -> serde_json::Value {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| ms(sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]);
    serde_json::json!({ "median": at(0.5), "p95": at(0.95), "n": sorted.len() })
}

/// `{median, p95}` of a probe's latency report, in microseconds.
fn stats_us(out: &str) -> serde_json::Value {
    serde_json::json!({ "median": field(out, "median_us"), "p95": field(out, "p95_us") })
}

/// Time to a first command, the public ComputeSDK benchmark's way: from asking for a sandbox
/// to the end of `node -v` in it. `agent-sandbox run node --detach` (its return waits for
/// `sandbox ready`) then an exec, against a bare container of the same image started and
/// exec'd the same way; `runs` each, one after another.
async fn first_command(
    docker: &bollard::Docker,
    node: &str,
    runs: usize,
) -> anyhow::Result<serde_json::Value> {
    use sandbox_tests::launcher::{Launcher, Project};
    let launcher = Launcher::new()?;
    let node_v = |id: String| async move {
        let out = sandbox_tests::docker::exec(&id, &["node", "-v"], None).await?;
        anyhow::ensure!(out.code == 0 && out.stdout.starts_with('v'), "node -v: {out:?}");
        Ok::<_, anyhow::Error>(())
    };
    let (mut sandboxed, mut bare) = (Vec::new(), Vec::new());
    for run in 0..=runs {
        let project = Project::new()?;
        let started = Instant::now();
        launcher.ok(&["run", "node", &project.path, "--detach", "--image", node]).await?;
        let (id, name) = project.sandbox().await?;
        node_v(id).await?;
        let took = started.elapsed();
        launcher.ok(&["stop", &name]).await?;

        let body = ContainerCreateBody {
            image: Some(node.to_string()),
            entrypoint: Some(vec!["sleep".into(), "infinity".into()]),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "bench".to_string())])),
            ..Default::default()
        };
        let started_bare = Instant::now();
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        node_v(created.id.clone()).await?;
        let took_bare = started_bare.elapsed();
        let force = RemoveContainerOptionsBuilder::default().force(true).build();
        docker.remove_container(&created.id, Some(force)).await?;
        if run > 0 {
            // The first of each is a warm-up.
            sandboxed.push(took);
            bare.push(took_bare);
        }
    }
    Ok(serde_json::json!({ "sandbox_ms": stats_ms(&sandboxed), "bare_ms": stats_ms(&bare) }))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// From the start request to `sandbox ready` on the container's stdout; and sandbox-init's own
/// start timeline (`SANDBOX_START_TIMELINE=1`, sandbox-init's timeline.rs), printed after the
/// ready line, where the container runs sandbox-init.
async fn start_to_ready(
    docker: &bollard::Docker,
    body: ContainerCreateBody,
) -> anyhow::Result<(Duration, Option<String>)> {
    // The trivial entrypoint prints no timeline.
    let traced =
        body.entrypoint.is_none() && body.env.iter().flatten().any(|e| e == "SANDBOX_START_TIMELINE=1");
    let created =
        docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
    let started = Instant::now();
    docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
    let options = LogsOptionsBuilder::default().stdout(true).stderr(true).follow(true).build();
    let mut logs = docker.logs(&created.id, Some(options));
    let mut seen = String::new();
    let mut elapsed = None;
    let measured = loop {
        let timeline =
            seen.lines().find_map(|l| l.split_once("start timeline: ")).map(|(_, t)| t.to_string());
        if let Some(elapsed) = elapsed
            && (!traced || timeline.is_some())
        {
            break (elapsed, timeline);
        }
        match tokio::time::timeout(Duration::from_secs(30), logs.next()).await {
            Ok(Some(Ok(chunk))) => {
                seen.push_str(&chunk.to_string());
                if elapsed.is_none() && seen.contains("sandbox ready") {
                    elapsed = Some(started.elapsed());
                }
            }
            other => anyhow::bail!("no `sandbox ready` and timeline ({other:?}); output: {seen}"),
        }
    };
    let force = RemoveContainerOptionsBuilder::default().force(true).build();
    docker.remove_container(&created.id, Some(force)).await?;
    Ok(measured)
}

/// Each phase, in order, with its time in milliseconds.
type Timeline = Vec<(String, f64)>;

/// The median of each phase over `timelines` (`phase N ms, …; in all N ms`), in the phases'
/// order: where sandbox-init's start time goes.
fn median_timeline(timelines: &[String]) -> Timeline {
    let mut phases: Vec<(String, Vec<Duration>)> = Vec::new();
    for timeline in timelines {
        let (list, total) = timeline.split_once("; in all ").unwrap_or((timeline, ""));
        let entries =
            list.split(", ").map(|e| e.to_string()).chain(std::iter::once(format!("in all {total}")));
        for entry in entries {
            let Some((phase, ms)) = entry.trim_end_matches(" ms").rsplit_once(' ') else { continue };
            let Ok(ms) = ms.parse::<f64>() else { continue };
            let time = Duration::from_secs_f64(ms / 1e3);
            match phases.iter_mut().find(|(p, _)| p == phase) {
                Some((_, times)) => times.push(time),
                None => phases.push((phase.to_string(), vec![time])),
            }
        }
    }
    phases.into_iter().map(|(phase, times)| (phase, ms(median(times)))).collect()
}

fn body(
    image: &str,
    net: &TestNet,
    drop_ins: &std::path::Path,
    entrypoint: Option<Vec<String>>,
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint,
        labels: Some(HashMap::from([(TEST_LABEL.to_string(), "bench".to_string())])),
        host_config: Some(HostConfig {
            cap_add: Some(vec!["NET_ADMIN".into()]),
            network_mode: Some(net.name.clone()),
            binds: Some(vec![format!("{}:/etc/agent-sandbox/policy.d:ro", drop_ins.display())]),
            ..Default::default()
        }),
        // sandbox-init prints its start timeline; the trivial entrypoint ignores it.
        env: Some(vec!["SANDBOX_START_TIMELINE=1".into()]),
        ..Default::default()
    }
}

fn field(out: &str, key: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A bench has no test's place: it asks for each shape it measures.
    sandbox_tests::place::bench();
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(7);
    let image = match std::env::var("BENCH_IMAGE") {
        Ok(other) => other,
        Err(_) => image(sandbox_tests::spec::SMALLEST).await?,
    };
    let docker = xtask::engine::Engine::connect().await?.docker().clone();
    let net = TestNet::create("bench").await?;
    let _peer = Peer::start(&net, &["api.allowed.test"]).await?;
    // `BENCH_ONLY=name-check`: the name check's figures alone, printed, no card (a change to the
    // checker measured in a minute, not the whole bench's ten).
    if std::env::var("BENCH_ONLY").is_ok_and(|only| only == "name-check") {
        NameCheckFigures::measure(&image, &net).await?.print();
        return Ok(());
    }
    if std::env::var("BENCH_ONLY").is_ok_and(|only| only == "gvisor") {
        GvisorFigures::measure(&image, &net).await?.print();
        return Ok(());
    }

    let small = tempfile::tempdir()?;
    std::fs::write(small.path().join("bench.txt"), "api.allowed.test\n")?;
    let large = tempfile::tempdir()?;
    let names: String = (0..10_000).map(|i| format!("host{i}.bulk{}.test\n", i % 97)).collect();
    std::fs::write(large.path().join("bulk.txt"), names)?;
    let trivial = Some(vec!["/bin/sh".into(), "-c".into(), "echo sandbox ready; exec sleep 600".into()]);

    eprintln!("measuring start to `sandbox ready`, {runs} runs each, interleaved");
    let (mut base, mut init, mut big) = (Vec::new(), Vec::new(), Vec::new());
    let (mut init_timelines, mut big_timelines) = (Vec::new(), Vec::new());
    start_to_ready(&docker, body(&image, &net, small.path(), None)).await?; // warm-up
    for _ in 0..runs {
        base.push(start_to_ready(&docker, body(&image, &net, small.path(), trivial.clone())).await?.0);
        let (time, timeline) = start_to_ready(&docker, body(&image, &net, small.path(), None)).await?;
        init.push(time);
        init_timelines.extend(timeline);
        let (time, timeline) = start_to_ready(&docker, body(&image, &net, large.path(), None)).await?;
        big.push(time);
        big_timelines.extend(timeline);
    }
    let (init_timeline, big_timeline) = (median_timeline(&init_timelines), median_timeline(&big_timelines));
    let phases = |timeline: &[(String, f64)]| {
        timeline
            .iter()
            .map(|(phase, ms)| serde_json::json!({"phase": phase, "median_ms": ms}))
            .collect::<Vec<_>>()
    };
    let starts = serde_json::json!({
        "baseline_ms": stats_ms(&base), "one_domain_ms": stats_ms(&init), "ten_thousand_ms": stats_ms(&big),
        "timeline": { "one_domain": phases(&init_timeline), "ten_thousand": phases(&big_timeline) },
    });
    let (base, init, big) = (median(base), median(init), median(big));

    let gvisor = docker.info().await?.runtimes.is_some_and(|r| r.contains_key("runsc"));
    eprintln!(
        "measuring sidecar mode's start against one container's{}, {runs} runs each, interleaved",
        if gvisor { " and the pair's with the agent under gVisor" } else { "" }
    );
    let (mut single, mut pair, mut under) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let shapes: [(&str, &mut Vec<Duration>); 3] =
            [("single", &mut single), ("pair", &mut pair), ("runsc", &mut under)];
        for (shape, samples) in shapes {
            let mut spec = SandboxSpec::of(image.clone())
                .net_admin()
                .on(&net)
                .drop_in("bench.txt", "api.allowed.test\n");
            spec = match shape {
                "pair" => spec.sidecar(),
                "runsc" if gvisor => spec.under("runsc"),
                "runsc" => continue,
                _ => spec,
            };
            let started = Instant::now();
            let sb = spec.start().await?;
            samples.push(started.elapsed());
            drop(sb);
        }
    }
    let shapes = serde_json::json!({
        "single_ms": stats_ms(&single), "sidecar_ms": stats_ms(&pair),
        "sidecar_runsc_ms": if under.is_empty() { serde_json::Value::Null } else { stats_ms(&under) },
    });
    let under = (!under.is_empty()).then(|| median(under));
    let (single, pair) = (median(single), median(pair));

    eprintln!("measuring the DNS gate");
    let dns = Peer::start_dns(&net).await?;
    dns.set_dns("cached.bench.test", "10.98.0.1".parse()?, 300).await?;
    sandbox_tests::docker::exec(
        &dns.id,
        &["sh", "-c", "echo '*.bench.test A 10.99.0.0/16 300' >> /tmp/zone"],
        None,
    )
    .await?;
    let sb = SandboxSpec::of(image.clone())
        .net_admin()
        .on(&net)
        .dns(&dns)
        // Its answers are addresses of a private range: the user's network, which only
        // `private` lets an answer open.
        .drop_in("b.txt", "*.bench.test private\n")
        .start()
        .await?;
    let bench = |args: Vec<&'static str>, root: bool| {
        let sb = &sb;
        async move {
            let mut cmd = vec![PROBE, "dns-bench"];
            cmd.extend(args);
            let out = if root { sb.exec(&cmd).await? } else { sb.as_agent(&cmd).await? };
            anyhow::ensure!(field(&out.stdout, "failed") == 0.0, "dns-bench failed: {out:?}");
            Ok::<_, anyhow::Error>(out.stdout)
        }
    };
    let _ = probe_binary()?;
    bench(vec!["cached.bench.test", "20"], false).await?; // warm: the address is in the set
    let direct_cached = bench(vec!["cached.bench.test", "1000", "--server", "127.0.0.11"], true).await?;
    let gate_cached = bench(vec!["cached.bench.test", "1000"], false).await?;
    let direct_new =
        bench(vec!["direct.bench.test", "300", "--distinct", "--server", "127.0.0.11"], true).await?;
    let gate_new = bench(vec!["gate.bench.test", "300", "--distinct"], false).await?;
    let direct_rate =
        bench(vec!["cached.bench.test", "20000", "--concurrency", "8", "--server", "127.0.0.11"], true)
            .await?;
    let gate_rate = bench(vec!["cached.bench.test", "20000", "--concurrency", "8"], false).await?;

    eprintln!("measuring the name check");
    let names = NameCheckFigures::measure(&image, &net).await?;

    let runsc = if gvisor {
        eprintln!("measuring the name check with the agent under gVisor against runc, both sidecar pairs");
        Some(GvisorFigures::measure(&image, &net).await?)
    } else {
        None
    };

    eprintln!("measuring the key forwarder");
    let (direct_api, forwarded_api) = forwarder_first_byte(&image, &net).await?;

    eprintln!("measuring git clone through GitHub's forwarder, {runs} runs each, interleaved");
    let clone = CloneFigures::measure(&image, &net, runs).await?;

    eprintln!("measuring attached output, {runs} runs each, interleaved");
    let attach = AttachFigures::measure(&image, runs).await?;

    let us = |out: &str| field(out, "median_us");
    println!("sandbox-init benchmark ({runs} runs each for start times; medians)");
    println!();
    println!("start to `sandbox ready`            median     added   target");
    println!("  trivial entrypoint (baseline)  {:>8.1} ms", ms(base));
    println!(
        "  sandbox-init, 1 domain         {:>8.1} ms {:>7.1} ms   < 50 ms",
        ms(init),
        ms(init) - ms(base)
    );
    println!(
        "  sandbox-init, 10,000 domains   {:>8.1} ms {:>7.1} ms   < 100 ms",
        ms(big),
        ms(big) - ms(base)
    );
    println!();
    println!("sandbox-init's start, phase by phase (its own clock, medians)   1 domain   10,000 domains");
    for (phase, time) in &init_timeline {
        let other = big_timeline.iter().find(|(p, _)| p == phase).map_or(f64::NAN, |(_, t)| *t);
        println!("  {phase:<40} {time:>8.1} ms {other:>10.1} ms");
    }
    println!();
    println!("created to the session running        one container   sidecar pair     added");
    println!(
        "  through the suites' harness     {:>12.1} ms {:>11.1} ms {:>7.1} ms",
        ms(single),
        ms(pair),
        ms(pair) - ms(single)
    );
    match under {
        Some(under) => println!(
            "  the pair, the agent under gVisor {:>11.1} ms {:>11.1} ms {:>7.1} ms",
            ms(single),
            ms(under),
            ms(under) - ms(single)
        ),
        None => println!("  the pair under gVisor: not measured, the engine has no runsc runtime"),
    }
    println!();
    println!("DNS, A query, median latency     upstream      gate     added   target");
    let row = |what: &str, direct: &str, gate: &str, target: &str| {
        println!(
            "  {what:<28} {:>7.0} µs {:>7.0} µs {:>7.0} µs   {target}",
            us(direct),
            us(gate),
            us(gate) - us(direct)
        );
    };
    row("allowed name, cached", &direct_cached, &gate_cached, "< 1000 µs");
    row("allowed name, new (netlink)", &direct_new, &gate_new, "< 5000 µs");
    println!();
    println!(
        "DNS throughput, 8 clients         upstream {:>6.0} q/s   gate {:>6.0} q/s   ratio {:.2}   target > 5000 q/s",
        field(&direct_rate, "qps"),
        field(&gate_rate, "qps"),
        field(&gate_rate, "qps") / field(&direct_rate, "qps")
    );
    println!();
    names.print();
    println!();
    match &runsc {
        Some(figures) => figures.print(),
        None => println!("the name check under gVisor: not measured, the engine has no runsc runtime"),
    }
    println!();
    println!("key forwarder, streamed answer, connect to first byte   direct  forwarded     added   target");
    for (what, key) in [("median", "median_us"), ("p99", "p99_us")] {
        println!(
            "  {what:<51} {:>7.0} µs {:>7.0} µs {:>7.0} µs   {}",
            field(&direct_api, key),
            field(&forwarded_api, key),
            field(&forwarded_api, key) - field(&direct_api, key),
            if key == "median_us" { "< 2000 µs" } else { "" }
        );
    }
    println!();
    clone.print();
    println!();
    attach.print();

    if let Ok(card) = std::env::var("BENCH_CARD") {
        let node = std::env::var("BENCH_NODE_IMAGE").unwrap_or_else(|_| "agent-sandbox/agent-node".into());
        let card_runs = std::env::var("BENCH_CARD_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(20);
        eprintln!("measuring the time to a first command, {card_runs} runs each, one after another");
        let first = first_command(&docker, &node, card_runs).await?;
        let rate = |out: &str| field(out, "sent") / 1000.0 / field(out, "ms");
        let figures = serde_json::json!({
            "runs": runs,
            "first_command": first,
            "start_to_ready": starts,
            "shapes": shapes,
            "dns": {
                "cached_us": { "upstream": stats_us(&direct_cached), "gate": stats_us(&gate_cached) },
                "new_us": { "upstream": stats_us(&direct_new), "gate": stats_us(&gate_new) },
                "qps": { "upstream": field(&direct_rate, "qps"), "gate": field(&gate_rate, "qps") },
            },
            "name_check": {
                "http_us": { "off": stats_us(&names.http.1), "on": stats_us(&names.http.0) },
                "tls_us": { "off": stats_us(&names.tls.1), "on": stats_us(&names.tls.0) },
                "gigabyte_mb_s": {
                    "off": field(&names.bulk.1, "mbytes_per_s"), "on": field(&names.bulk.0, "mbytes_per_s"),
                },
                "upload_mb_s": { "off": rate(&names.up.1), "on": rate(&names.up.0) },
                "text_upload_mb_s": { "off": rate(&names.text.1), "on": rate(&names.text.0) },
                "concurrent": {
                    "completed_off": field(&names.many.1, "completed"),
                    "completed_on": field(&names.many.0, "completed"),
                    "p99_ms_off": field(&names.many.1, "p99_ms"),
                    "p99_ms_on": field(&names.many.0, "p99_ms"),
                },
                "rss_kb": { "pid1_on": names.rss.0, "checker": names.rss.1, "pid1_off": names.rss.2 },
                "timeline": { "http": phases(&names.timelines.0), "tls": phases(&names.timelines.1) },
            },
            "gvisor": runsc.as_ref().map(|g| serde_json::json!({
                "http_us": { "runc": stats_us(&g.http.0), "runsc": stats_us(&g.http.1) },
                "tls_us": { "runc": stats_us(&g.tls.0), "runsc": stats_us(&g.tls.1) },
                "gigabyte_mb_s": {
                    "runc": field(&g.bulk.0, "mbytes_per_s"), "runsc": field(&g.bulk.1, "mbytes_per_s"),
                },
            })),
            "forwarder": {
                "first_byte_us": { "direct": stats_us(&direct_api), "forwarded": stats_us(&forwarded_api) },
                "clone_mb_s": {
                    "direct": clone.megabytes / clone.direct.as_secs_f64(),
                    "forwarded": clone.megabytes / clone.forwarded.as_secs_f64(),
                },
                "peak_rss_kb": clone.forwarder_peak_kb,
            },
        });
        std::fs::write(&card, serde_json::to_string_pretty(&figures)? + "\n")?;
        eprintln!("wrote the card's figures to {card}");
    }
    Ok(())
}

/// `git clone` of one 50 MB repository (incompressible) from the forge peer: through GitHub's
/// forwarder, as the agent's git reaches github.com, and straight over git's own TLS to the same
/// peer under a name the policy allows directly; medians, and the forwarder's peak RSS.
struct CloneFigures {
    direct: Duration,
    forwarded: Duration,
    megabytes: f64,
    forwarder_peak_kb: f64,
}

impl CloneFigures {
    const DIRECT: &str = "direct.forge.test";

    async fn measure(image: &str, net: &TestNet, runs: usize) -> anyhow::Result<CloneFigures> {
        let forge =
            Peer::start_forge(net, &["github.com", "api.github.com", "uploads.github.com", Self::DIRECT])
                .await?;
        let made = sandbox_tests::docker::exec(
            &forge.id,
            &["sh", "-c", "set -e; d=$(mktemp -d); cd $d; git init -q -b main; head -c 50000000 /dev/urandom > big.bin; \
               git add big.bin; git -c user.name=b -c user.email=b@b commit -q -m big; \
               git init -q --bare /tmp/forge/git/octo/big.git; git push -q /tmp/forge/git/octo/big.git main; \
               du -sk /tmp/forge/git/octo/big.git | cut -f1"],
            None,
        )
        .await?;
        let megabytes = made.stdout.trim().parse::<f64>().unwrap_or(0.0) / 1024.0;
        let dir = tempfile::tempdir()?;
        let ca = sandbox_tests::spec::ca_secret_file(dir.path())?;
        let sb = SandboxSpec::of(image.to_string())
            .net_admin()
            .on(net)
            .drop_in("clone.txt", &format!("{}\n", Self::DIRECT))
            .mount(&ca, "/run/secrets/sandbox_api_ca.pem")
            .mount(&sandbox_tests::tls::ca_file()?.display().to_string(), "/certs/ca.pem")
            .start()
            .await?;
        let clone = |url: String| {
            let sb = &sb;
            async move {
                let script =
                    format!("rm -rf /tmp/c && GIT_SSL_CAINFO=/certs/ca.pem git clone -q {url} /tmp/c");
                let started = Instant::now();
                let out = sb.as_agent(&["sh", "-c", &script]).await?;
                anyhow::ensure!(out.code == 0, "{url}: {out:?}");
                Ok::<_, anyhow::Error>(started.elapsed())
            }
        };
        let (direct_url, forwarded_url) =
            (format!("https://{}/octo/big", Self::DIRECT), "https://github.com/octo/big".to_string());
        clone(direct_url.clone()).await?; // warm-up: DNS, the sets, the page cache
        clone(forwarded_url.clone()).await?;
        let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            direct.push(clone(direct_url.clone()).await?);
            forwarded.push(clone(forwarded_url.clone()).await?);
        }
        let forwarders = format!(
            "for s in /proc/[0-9]*/status; do grep -q '^Uid:.{FORWARDER_UID}' $s && grep VmHWM $s; done"
        );
        let peak = sb.exec(&["sh", "-c", &forwarders]).await?;
        let forwarder_peak_kb =
            peak.stdout.split_whitespace().nth(1).and_then(|k| k.parse().ok()).unwrap_or(f64::NAN);
        Ok(CloneFigures {
            direct: median(direct),
            forwarded: median(forwarded),
            megabytes,
            forwarder_peak_kb,
        })
    }

    fn print(&self) {
        let rate = |d: Duration| self.megabytes / d.as_secs_f64();
        println!(
            "GitHub's forwarder, git clone of {:.0} MB      direct  forwarded   ratio   target",
            self.megabytes
        );
        println!(
            "  time (median)                              {:>7.0} ms {:>7.0} ms",
            ms(self.direct),
            ms(self.forwarded)
        );
        println!(
            "  throughput                                 {:>7.1} MB/s {:>5.1} MB/s {:>6.2}   >= 0.90",
            rate(self.direct),
            rate(self.forwarded),
            rate(self.forwarded) / rate(self.direct)
        );
        println!(
            "  the forwarder's peak resident memory        {:>7.1} MB                     < 32 MB",
            self.forwarder_peak_kb / 1024.0
        );
    }
}

/// The session's output, 16 MB of `seq` printed by `cat` in the pane, timed from the keys that
/// start it to its end (`tmux wait-for`), with the user attached on a pty (script(1)) by each
/// way; and the relay's CPU time over it, from /proc.
struct AttachFigures {
    direct: Duration,
    relayed: Duration,
    relay_cpu: Duration,
    megabytes: f64,
}

impl AttachFigures {
    const DIRECT: &str = "sandbox-exec tmux attach-session -t agent";
    const RELAYED: &str = "sandbox-attach";

    async fn measure(image: &str, runs: usize) -> anyhow::Result<AttachFigures> {
        let sb = SandboxSpec::of(image.to_string()).offline().start().await?;
        let made = sb.as_agent(&["sh", "-c", "seq 1 2250000 > /tmp/big && stat -c %s /tmp/big"]).await?;
        let megabytes = made.stdout.trim().parse::<f64>()? / 1e6;
        let (mut direct, mut relayed, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        Self::once(&sb, Self::RELAYED).await?; // warm-up
        for _ in 0..runs {
            direct.push(Self::once(&sb, Self::DIRECT).await?.0);
            let (elapsed, ticks) = Self::once(&sb, Self::RELAYED).await?;
            relayed.push(elapsed);
            cpu.push(ticks);
        }
        Ok(AttachFigures {
            direct: median(direct),
            relayed: median(relayed),
            relay_cpu: median(cpu),
            megabytes,
        })
    }

    /// One run: attach by `how`, print the file in the pane, detach; the time, and the CPU time
    /// of the sandbox-attach relay (none when attached directly).
    async fn once(sb: &Sandbox, how: &str) -> anyhow::Result<(Duration, Duration)> {
        let script = format!(
            r#"(sleep 300 | script -qfec '{how}' /dev/null > /dev/null 2>&1 &)
            i=0; until [ -n "$(sandbox-exec tmux list-clients)" ]; do i=$((i+1)); [ $i -lt 400 ] || exit 3; sleep 0.05; done
            relay=$(for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sandbox-attach ] && echo ${{p#/proc/}}; done | head -n1)
            start=$(date +%s%N)
            sandbox-exec tmux send-keys -t agent 'clear; cat /tmp/big; tmux wait-for -S bench-done' Enter
            sandbox-exec tmux wait-for bench-done
            end=$(date +%s%N)
            ticks=0; [ -z "$relay" ] || ticks=$(awk '{{print $14 + $15}}' /proc/$relay/stat)
            sandbox-exec tmux detach-client -s agent
            i=0; while pgrep -x script > /dev/null; do i=$((i+1)); [ $i -lt 400 ] || exit 4; sleep 0.05; done
            printf 'ns=%s\nticks=%s\nhz=%s\n' $((end - start)) $ticks $(getconf CLK_TCK)"#
        );
        let out = sb.exec(&["sh", "-c", &script]).await?;
        anyhow::ensure!(out.code == 0, "attaching by `{how}`: {out:?}");
        let cpu = field(&out.stdout, "ticks") / field(&out.stdout, "hz");
        Ok((Duration::from_nanos(field(&out.stdout, "ns") as u64), Duration::from_secs_f64(cpu)))
    }

    fn print(&self) {
        let rate = |d: Duration| self.megabytes / d.as_secs_f64();
        println!(
            "attached output, {:.0} MB in the pane      agent's client   sandbox-attach   ratio",
            self.megabytes
        );
        println!(
            "  time to the end (median)             {:>9.2} s    {:>9.2} s     {:.2}",
            self.direct.as_secs_f64(),
            self.relayed.as_secs_f64(),
            self.relayed.as_secs_f64() / self.direct.as_secs_f64()
        );
        println!(
            "  throughput                           {:>7.1} MB/s  {:>7.1} MB/s",
            rate(self.direct),
            rate(self.relayed)
        );
        println!(
            "  relay CPU time (median)                               {:>6.0} ms",
            self.relay_cpu.as_secs_f64() * 1000.0
        );
    }
}

/// The mock Messages API answering a streamed request, as the agent calls it: straight over TLS
/// (with the name check, as any connection; under a name of its own, since only the forwarder
/// may reach a host whose key it holds), and through the forwarder that holds the key (plain
/// HTTP on loopback, then its own TLS to the same mock). `api-first-byte` reports of each.
async fn forwarder_first_byte(image: &str, net: &TestNet) -> anyhow::Result<(String, String)> {
    const DIRECT: &str = "direct.mock.test";
    let _mock = Peer::start_mock_api(net, &["api.anthropic.com", DIRECT]).await?;
    let dir = tempfile::tempdir()?;
    let key = sandbox_tests::spec::secret_file(dir.path(), "key", "sk-ant-api03-bench-key")?;
    let ca = sandbox_tests::spec::ca_secret_file(dir.path())?;
    let sb = SandboxSpec::of(image.to_string())
        .net_admin()
        .on(net)
        .drop_in("api.txt", &format!("api.anthropic.com\n{DIRECT}\n"))
        .mount(&key, "/run/secrets/anthropic_api_key")
        .mount(&ca, "/run/secrets/sandbox_api_ca.pem")
        .start()
        .await?;
    let run = |args: &[&str]| {
        let mut cmd = vec![PROBE, "api-first-byte"];
        cmd.extend_from_slice(args);
        let cmd: Vec<String> = cmd.iter().map(|a| a.to_string()).collect();
        let sb = &sb;
        async move {
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let out = sb.as_agent(&cmd).await?;
            anyhow::ensure!(out.code == 0 && field(&out.stdout, "failed") == 0.0, "{cmd:?}: {out:?}");
            Ok::<_, anyhow::Error>(out.stdout)
        }
    };
    run(&[DIRECT, "443", "20", "--tls"]).await?; // warm-up: DNS, the sets
    run(&["127.0.0.1", "15101", "20"]).await?;
    let direct = run(&[DIRECT, "443", "300", "--tls"]).await?;
    let forwarded = run(&["127.0.0.1", "15101", "300"]).await?;
    Ok((direct, forwarded))
}

/// The name check's figures: each measured with the check on and, in the same run, off.
struct NameCheckFigures {
    /// `first-byte` reports over HTTP and TLS: (on, off).
    http: (String, String),
    tls: (String, String),
    /// `fetch` of a gigabyte over HTTP: (on, off).
    bulk: (String, String),
    /// `upload` of 500 MB of binary over HTTP, within the name's budget: (on, off).
    up: (String, String),
    /// `upload` of 100 MB of source-like text over HTTP, which the name check reads line by
    /// line for requests hidden in a body: (on, off).
    text: (String, String),
    /// `concurrent` 1,000 over HTTP: (on, off).
    many: (String, String),
    /// KiB resident with 1,000 connections open: PID 1 on, the checker, PID 1 off.
    rss: (f64, f64, f64),
    /// The checker's connection timeline (`SANDBOX_START_TIMELINE=1`), each phase's median over
    /// the HTTP and the TLS first-byte runs: where the time the check adds goes.
    timelines: (Timeline, Timeline),
}

const BULK: &str = "/bytes/1000000000";

/// Sidecar mode's pair with the agent under gVisor against the same pair on runc: the name
/// check's first byte over HTTP and TLS (the median of [`ROUNDS`] rounds' medians, the pairs in
/// turn), and a gigabyte over HTTP. (runc, runsc) each.
struct GvisorFigures {
    http: (String, String),
    tls: (String, String),
    bulk: (String, String),
}

/// How many rounds the gVisor figures' first bytes take, each runc's then runsc's.
const ROUNDS: usize = 6;

/// The rounds' (runc, runsc) reports as one each: the median of their medians and of their p95s.
fn of_rounds(rounds: &[(String, String)]) -> (String, String) {
    let combine = |reports: Vec<&String>| {
        let of = |key: &str| {
            let mut values: Vec<f64> = reports.iter().map(|r| field(r, key)).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        format!("median_us={}\np95_us={}\n", of("median_us"), of("p95_us"))
    };
    (combine(rounds.iter().map(|r| &r.0).collect()), combine(rounds.iter().map(|r| &r.1).collect()))
}

impl GvisorFigures {
    async fn measure(image: &str, net: &TestNet) -> anyhow::Result<GvisorFigures> {
        let spec = SandboxSpec::of(image.to_string()).on(net).drop_in("n.txt", "api.allowed.test\n");
        let runc = spec.clone().sidecar().start().await?;
        let runsc = spec.under("runsc").start().await?;
        let both = |args: Vec<&'static str>| {
            let (runc, runsc) = (&runc, &runsc);
            async move {
                let mut out = Vec::new();
                for sb in [runc, runsc] {
                    let report = sb.probe(&args).await?;
                    anyhow::ensure!(
                        report.fields.get("failed").is_none_or(|f| f == "0")
                            && report.fields.get("outcome").is_none_or(|o| o == "fetched"),
                        "{args:?}: {:?}",
                        report.fields
                    );
                    out.push(report.fields.iter().map(|(k, v)| format!("{k}={v}\n")).collect::<String>());
                }
                Ok::<_, anyhow::Error>((out[0].clone(), out[1].clone()))
            }
        };
        both(vec!["first-byte", "api.allowed.test", "80", "20"]).await?; // warm-up
        // In rounds, runc's and runsc's in turn: what else the machine does (a removal of the
        // last figures' sandboxes, another tenant) falls on both, not on the one measured first.
        let (mut http, mut tls) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            http.push(both(vec!["first-byte", "api.allowed.test", "80", "50"]).await?);
            tls.push(both(vec!["first-byte", "api.allowed.test", "443", "35", "--tls"]).await?);
        }
        let bulk = both(vec!["fetch", "api.allowed.test", "80", BULK]).await?;
        Ok(GvisorFigures { http: of_rounds(&http), tls: of_rounds(&tls), bulk })
    }

    fn print(&self) {
        println!("sidecar mode, the agent under gVisor        runc     runsc     ratio");
        for (what, (runc, runsc)) in
            [("HTTP first byte, median", &self.http), ("TLS first byte, median", &self.tls)]
        {
            let (a, b) = (field(runc, "median_us"), field(runsc, "median_us"));
            println!("  {what:<38} {a:>7.0} µs {b:>7.0} µs   {:.2}", b / a);
        }
        let (a, b) = (field(&self.bulk.0, "mbytes_per_s"), field(&self.bulk.1, "mbytes_per_s"));
        println!("  1 GB over HTTP                         {a:>6.0} MB/s {b:>5.0} MB/s   {:.2}", b / a);
    }
}

impl NameCheckFigures {
    async fn measure(image: &str, net: &TestNet) -> anyhow::Result<NameCheckFigures> {
        let spec = SandboxSpec::of(image.to_string())
            .net_admin()
            .on(net)
            .drop_in("n.txt", "api.allowed.test upload=2GiB\n");
        let on = spec.clone().env("SANDBOX_START_TIMELINE", "1").start().await?;
        let off = spec.env("SANDBOX_NAME_CHECK", "off").start().await?;
        // Each connection's timeline the checker printed since the last look.
        let mut seen = 0;
        let mut timelines = async || {
            let (_, err) = on.logs().await?;
            let lines: Vec<String> = err
                .lines()
                .filter_map(|l| l.split_once("connection timeline: ").map(|(_, t)| t.to_string()))
                .collect();
            let new = lines[seen.min(lines.len())..].to_vec();
            seen = lines.len();
            Ok::<_, anyhow::Error>(median_timeline(&new))
        };
        let probe = |sb: &Sandbox, args: Vec<&str>| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let sb = sb.id().to_string();
            async move {
                let mut cmd = vec!["sandbox-exec", "--", PROBE];
                cmd.extend(args.iter().map(String::as_str));
                let out = sandbox_tests::docker::exec(&sb, &cmd, None).await?;
                let failed = field(&out.stdout, "failed");
                let outcome_ok = !out.stdout.contains("outcome=")
                    || out.stdout.contains("outcome=fetched")
                    || out.stdout.contains("outcome=sent");
                anyhow::ensure!(
                    out.code == 0 && (failed.is_nan() || failed == 0.0) && outcome_ok,
                    "{cmd:?}: {out:?}"
                );
                Ok::<_, anyhow::Error>(out.stdout)
            }
        };
        let both = |args: Vec<&'static str>| {
            let (on, off) = (&on, &off);
            async move { Ok::<_, anyhow::Error>((probe(on, args.clone()).await?, probe(off, args).await?)) }
        };
        both(vec!["first-byte", "api.allowed.test", "80", "20"]).await?; // warm-up: DNS, the sets
        timelines().await?;
        let http = both(vec!["first-byte", "api.allowed.test", "80", "500"]).await?;
        let http_timeline = timelines().await?;
        let tls = both(vec!["first-byte", "api.allowed.test", "443", "300", "--tls"]).await?;
        let tls_timeline = timelines().await?;
        let bulk = both(vec!["fetch", "api.allowed.test", "80", BULK]).await?;
        let up =
            both(vec!["upload", "api.allowed.test", "80", "500000000", "--binary", "--timeout-ms", "60000"])
                .await?;
        let text =
            both(vec!["upload", "api.allowed.test", "80", "100000000", "--timeout-ms", "60000"]).await?;
        let many = both(vec!["concurrent", "api.allowed.test", "80", "1000", "--hold-ms", "500"]).await?;
        let rss_on = Self::rss_with_1000_open(&on).await?;
        let rss_off = Self::rss_with_1000_open(&off).await?;
        let rss = (rss_on.0, rss_on.1, rss_off.0);
        Ok(NameCheckFigures {
            http,
            tls,
            bulk,
            up,
            text,
            many,
            rss,
            timelines: (http_timeline, tls_timeline),
        })
    }

    /// VmRSS of PID 1 and of the checker (0 without one), in KiB, while 1,000 connections are open.
    async fn rss_with_1000_open(sb: &Sandbox) -> anyhow::Result<(f64, f64)> {
        let held =
            sb.probe_in_background(&["concurrent", "api.allowed.test", "80", "1000", "--hold-ms", "8000"]);
        tokio::time::sleep(Duration::from_secs(6)).await;
        let script = "for p in /proc/[0-9]*; do u=$(stat -c %u $p); r=$(awk '/^VmRSS/ {print $2}' $p/status); echo \"${p#/proc/} $u $r\"; done";
        let out = sb.exec(&["sh", "-c", script]).await?;
        let rss = |wanted: &dyn Fn(&str, &str) -> bool| {
            out.stdout
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() == 3 && wanted(f[0], f[1])).then(|| f[2].parse::<f64>().unwrap_or(0.0))
                })
                .sum::<f64>()
        };
        let pid1 = rss(&|pid, _| pid == "1");
        let checker = rss(&|_, uid| uid == CHECKER_UID.to_string());
        let held = held.await??;
        anyhow::ensure!(held.fields["completed"] == "1000", "{:?}", held.fields);
        Ok((pid1, checker))
    }

    fn print(&self) {
        let us = |out: &str, key: &str| field(out, key);
        println!("name check, connect to first byte     off        on     added   target");
        for (what, (on, off)) in [("HTTP, median", &self.http), ("TLS, median", &self.tls)] {
            println!(
                "  {what:<32} {:>7.0} µs {:>7.0} µs {:>7.0} µs   < 1000 µs",
                us(off, "median_us"),
                us(on, "median_us"),
                us(on, "median_us") - us(off, "median_us")
            );
        }
        for (what, (on, off)) in [("HTTP, p99", &self.http), ("TLS, p99", &self.tls)] {
            println!(
                "  {what:<32} {:>7.0} µs {:>7.0} µs {:>7.0} µs",
                us(off, "p99_us"),
                us(on, "p99_us"),
                us(on, "p99_us") - us(off, "p99_us")
            );
        }
        println!("  a connection in the checker, phase by phase (medians)    HTTP       TLS");
        let (http, tls) = &self.timelines;
        for (phase, ms) in http {
            let other = tls.iter().find(|(p, _)| p == phase).map_or(f64::NAN, |(_, t)| *t);
            println!("    {phase:<52} {:>6.0} µs {:>6.0} µs", ms * 1e3, other * 1e3);
        }
        let (on, off) = (&self.bulk.0, &self.bulk.1);
        println!(
            "name check, 1 GB over HTTP          {:>6.0} MB/s {:>6.0} MB/s   ratio {:.2}   target >= 0.90",
            field(off, "mbytes_per_s"),
            field(on, "mbytes_per_s"),
            field(on, "mbytes_per_s") / field(off, "mbytes_per_s")
        );
        let rate = |out: &str| field(out, "sent") / 1000.0 / field(out, "ms");
        for (what, (on, off)) in
            [("500 MB up, binary, budgeted", &self.up), ("100 MB up, source text", &self.text)]
        {
            println!(
                "name check, {what:<27}{:>6.0} MB/s {:>6.0} MB/s   ratio {:.2}",
                rate(off),
                rate(on),
                rate(on) / rate(off)
            );
        }
        let (on, off) = (&self.many.0, &self.many.1);
        println!(
            "name check, 1,000 concurrent        completed {}/{} off, {}/{} on; p99 to first byte {:.0} ms off, {:.0} ms on",
            field(off, "completed"),
            1000,
            field(on, "completed"),
            1000,
            field(off, "p99_ms"),
            field(on, "p99_ms")
        );
        let (pid1_on, checker, pid1_off) = self.rss;
        println!(
            "name check, RSS with 1,000 open     PID 1 {:.1} MB on ({:.1} MB off), checker {:.1} MB   target PID 1 < 64 MB",
            pid1_on / 1024.0,
            pid1_off / 1024.0,
            checker / 1024.0
        );
    }
}
