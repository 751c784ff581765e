//! `cargo xtask bench card`: the performance card, docs/performance.md. Every image is built
//! (for their sizes), the sandbox bench runs with `BENCH_CARD` set (which adds the time to a
//! first command and writes every figure as JSON), and the figures are rendered beside the
//! machine that measured them and, in a table of their own, the peers' published figures.

use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};

/// Where the card is written, from the repository's root.
pub const CARD: &str = "docs/performance.md";
/// The machine-readable figures at the end of the card, in an HTML comment.
const FIGURES_START: &str = "<!-- figures\n";
const FIGURES_END: &str = "\n-->";

/// The machine the figures were measured on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub engine: String,
    pub date: String,
}

impl Machine {
    async fn here(docker: &bollard::Docker) -> anyhow::Result<Machine> {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:")?.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        let version = docker.version().await.context("asking the engine its version")?;
        Ok(Machine {
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            cpu,
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            engine: format!(
                "{} {}",
                version
                    .platform
                    .map(|p| p.name)
                    .filter(|n| !n.trim().is_empty())
                    .unwrap_or_else(|| "Docker Engine".into()),
                version.version.unwrap_or_default()
            ),
            date: time_now(),
        })
    }
}

/// Today's date, UTC (`time` is already built for the OS image's creation time).
fn time_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!("{:04}-{:02}-{:02}", now.year(), u8::from(now.month()), now.day())
}

/// Builds every image, runs the bench for the card and writes docs/performance.md.
pub async fn bench_card(
    root: &Path,
    mut opts: BuildOptions,
    runs: usize,
    first_runs: usize,
) -> anyhow::Result<()> {
    opts.images = Vec::new();
    let report = build::build(&opts).await?;
    report.ensure_success()?;
    let engine = crate::engine::Engine::connect().await?;
    let docker = engine.docker();
    let mut sizes = Vec::new();
    for result in &report.results {
        if let Some(id) = report.id(&result.name) {
            let image =
                docker.inspect_image(id).await.with_context(|| format!("inspecting {}", result.name))?;
            sizes.push((result.name.clone(), image.size.unwrap_or(0).max(0) as u64));
        }
    }
    let node = report.id("node").context("the node image was not built")?.to_string();
    let figures_file = tempfile::NamedTempFile::new()?;
    let sh = Shell::new()?;
    let _dir = sh.push_dir(root);
    let _env: Vec<_> = opts.export_env().into_iter().map(|(k, v)| sh.push_env(k, v)).collect();
    let _runs = sh.push_env("BENCH_RUNS", runs.to_string());
    let _card = sh.push_env("BENCH_CARD", figures_file.path());
    let _card_runs = sh.push_env("BENCH_CARD_RUNS", first_runs.to_string());
    let _node = sh.push_env("BENCH_NODE_IMAGE", &node);
    cmd!(sh, "cargo bench --quiet --package sandbox-tests --bench sandbox")
        .run()
        .context("the sandbox bench failed")?;
    let figures: Value = serde_json::from_str(&std::fs::read_to_string(figures_file.path())?)
        .context("the bench's figures are not JSON")?;
    let machine = Machine::here(docker).await?;
    let text = render(&figures, &machine, &sizes);
    std::fs::write(root.join(CARD), text).with_context(|| format!("writing {CARD}"))?;
    eprintln!("wrote {CARD}");
    Ok(())
}

/// The card: the figures of one run, with the machine and the image sizes.
pub fn render(figures: &Value, machine: &Machine, sizes: &[(String, u64)]) -> String {
    let f = |path: &str| -> f64 { figures.pointer(path).and_then(Value::as_f64).unwrap_or(f64::NAN) };
    let ms = |path: &str| format!("{:.0} ms", f(path));
    let us = |path: &str| format!("{:.0} µs", f(path));
    // `| what | median | p95 |` of the times at `at` (`at/median`, `at/p95`).
    let median_row = |what: &str, at: &str| {
        format!("| {what} | {} | {} |", ms(&format!("{at}/median")), ms(&format!("{at}/p95")))
    };
    let rate = |path: &str| format!("{:.0} MB/s", f(path));
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line("# Performance".into());
    line(String::new());
    line(format!(
        "Written by `cargo xtask bench card` on {}. Every figure below was measured on this machine in one \
         run, beside its baseline measured in the same run: medians, and p95 where a figure has samples. \
         Machines are shared and noisy: the differences and ratios travel, absolute times less so. The \
         peers' figures at the end were not measured here.",
        machine.date
    ));
    line(String::new());
    line("## The machine".into());
    line(String::new());
    line(format!("- cores: {} ({})", machine.cores, machine.cpu));
    line(format!("- memory: {} GiB", machine.memory_gib));
    line(format!("- kernel: {}", machine.kernel));
    line(format!("- engine: {}", machine.engine));
    line(String::new());
    line(format!(
        "## Time to a first command ({} runs each, one after another)",
        figures.pointer("/first_command/sandbox_ms/n").and_then(Value::as_u64).unwrap_or(0)
    ));
    line(String::new());
    line(
        "From asking for a sandbox to the end of `node -v` in it, as the public ComputeSDK sandbox \
          benchmark measures cloud sandboxes."
            .into(),
    );
    line(String::new());
    line("| | median | p95 |".into());
    line("| --- | ---: | ---: |".into());
    line(median_row("a bare container of the node image, then `node -v`", "/first_command/bare_ms"));
    line(median_row(
        "`agent-sandbox run node --detach` (to `sandbox ready`), then `node -v`",
        "/first_command/sandbox_ms",
    ));
    line(String::new());
    line(format!("## Start to `sandbox ready` ({} runs each, interleaved)", f("/runs")));
    line(String::new());
    line("| | median | p95 |".into());
    line("| --- | ---: | ---: |".into());
    for (what, key) in [
        ("an entrypoint that only prints the line (baseline)", "baseline_ms"),
        ("sandbox-init, a 1-domain policy", "one_domain_ms"),
        ("sandbox-init, a 10,000-domain policy", "ten_thousand_ms"),
    ] {
        line(median_row(what, &format!("/start_to_ready/{key}")));
    }
    line(String::new());
    line(
        "sandbox-init's start, phase by phase, by its own clock (`SANDBOX_START_TIMELINE=1`, medians): \
         where time added to the start goes."
            .into(),
    );
    line(String::new());
    line("| phase | 1 domain | 10,000 domains |".into());
    line("| --- | ---: | ---: |".into());
    let timeline = |key: &str| -> Vec<(String, f64)> {
        let phases = figures.pointer(key).and_then(Value::as_array);
        phases
            .into_iter()
            .flatten()
            .map(|p| {
                let phase = p["phase"].as_str().unwrap_or_default().to_string();
                (phase, p["median_ms"].as_f64().unwrap_or(f64::NAN))
            })
            .collect()
    };
    let big = timeline("/start_to_ready/timeline/ten_thousand");
    for (phase, small) in timeline("/start_to_ready/timeline/one_domain") {
        let large = big.iter().find(|(p, _)| *p == phase).map_or(f64::NAN, |(_, t)| *t);
        line(format!("| {phase} | {small:.1} ms | {large:.1} ms |"));
    }
    line(String::new());
    line(format!(
        "## Sidecar mode's start ({} runs each, interleaved)",
        figures.pointer("/shapes/sidecar_ms/n").and_then(Value::as_u64).unwrap_or(0)
    ));
    line(String::new());
    line(
        "From creating the containers to the agent's container's `sandbox ready`, through the suites' \
         harness: one container, against the pair (the namespace's holder, the gateway and the agent's \
         container)."
            .into(),
    );
    line(String::new());
    line("| | median | p95 |".into());
    line("| --- | ---: | ---: |".into());
    for (what, key) in [
        ("one container", "single_ms"),
        ("sidecar mode's pair", "sidecar_ms"),
        ("the pair, the agent's container under gVisor", "sidecar_runsc_ms"),
    ] {
        line(median_row(what, &format!("/shapes/{key}")));
    }
    line(String::new());
    line("## DNS".into());
    line(String::new());
    line(
        "| an A query for an allowed name | upstream, median | p95 | through the gate, median | p95 |".into(),
    );
    line("| --- | ---: | ---: | ---: | ---: |".into());
    for (what, key) in [("cached", "cached_us"), ("new (its addresses written to the sets)", "new_us")] {
        line(format!(
            "| {what} | {} | {} | {} | {} |",
            us(&format!("/dns/{key}/upstream/median")),
            us(&format!("/dns/{key}/upstream/p95")),
            us(&format!("/dns/{key}/gate/median")),
            us(&format!("/dns/{key}/gate/p95"))
        ));
    }
    line(format!(
        "| throughput, 8 clients, cached | {:.0} queries/s | | {:.0} queries/s | |",
        f("/dns/qps/upstream"),
        f("/dns/qps/gate")
    ));
    line(String::new());
    line("## The name check".into());
    line(String::new());
    line("| | check off | check on |".into());
    line("| --- | ---: | ---: |".into());
    for (what, key) in [("HTTP, connect to first byte", "http_us"), ("TLS, connect to first byte", "tls_us")]
    {
        line(format!(
            "| {what}, median (p95) | {} ({}) | {} ({}) |",
            us(&format!("/name_check/{key}/off/median")),
            us(&format!("/name_check/{key}/off/p95")),
            us(&format!("/name_check/{key}/on/median")),
            us(&format!("/name_check/{key}/on/p95"))
        ));
    }
    line(format!(
        "| 1 GB download over HTTP | {} | {} |",
        rate("/name_check/gigabyte_mb_s/off"),
        rate("/name_check/gigabyte_mb_s/on")
    ));
    line(format!(
        "| 500 MB upload over HTTP, within its budget | {} | {} |",
        rate("/name_check/upload_mb_s/off"),
        rate("/name_check/upload_mb_s/on")
    ));
    line(format!(
        "| 100 MB upload of source-like text, read for requests hidden in it | {} | {} |",
        rate("/name_check/text_upload_mb_s/off"),
        rate("/name_check/text_upload_mb_s/on")
    ));
    line(format!(
        "| 1,000 concurrent connections: completed, p99 to first byte | {:.0}, {:.0} ms | {:.0}, {:.0} ms |",
        f("/name_check/concurrent/completed_off"),
        f("/name_check/concurrent/p99_ms_off"),
        f("/name_check/concurrent/completed_on"),
        f("/name_check/concurrent/p99_ms_on")
    ));
    line(format!(
        "| resident memory with 1,000 open: PID 1, the checker | {:.1} MB, none | {:.1} MB, {:.1} MB |",
        f("/name_check/rss_kb/pid1_off") / 1024.0,
        f("/name_check/rss_kb/pid1_on") / 1024.0,
        f("/name_check/rss_kb/checker") / 1024.0
    ));
    line(String::new());
    let (http, tls) = (timeline("/name_check/timeline/http"), timeline("/name_check/timeline/tls"));
    if !http.is_empty() {
        line(
            "A connection through the checker, phase by phase, by its own clock (`SANDBOX_START_TIMELINE=1`, \
             medians of the first-byte runs): from its accept to its first reply relayed. The connection on \
             is made once PID 1 has allowed it: a refused one never reaches the server."
                .into(),
        );
        line(String::new());
        line("| phase | HTTP | TLS |".into());
        line("| --- | ---: | ---: |".into());
        for (phase, ms) in http {
            let other = tls.iter().find(|(p, _)| *p == phase).map_or(f64::NAN, |(_, t)| *t);
            line(format!("| {phase} | {:.0} µs | {:.0} µs |", ms * 1e3, other * 1e3));
        }
        line(String::new());
    }
    if figures.pointer("/gvisor").is_some_and(|g| !g.is_null()) {
        line("## The agent under gVisor".into());
        line(String::new());
        line(
            "Sidecar mode's pair, the agent's container under runc against runsc; the name check on. The first bytes: the median of six rounds' medians (and p95s), the two pairs measured in turn.".into(),
        );
        line(String::new());
        line("| | runc | runsc |".into());
        line("| --- | ---: | ---: |".into());
        for (what, key) in
            [("HTTP, connect to first byte", "http_us"), ("TLS, connect to first byte", "tls_us")]
        {
            line(format!(
                "| {what}, median (p95) | {} ({}) | {} ({}) |",
                us(&format!("/gvisor/{key}/runc/median")),
                us(&format!("/gvisor/{key}/runc/p95")),
                us(&format!("/gvisor/{key}/runsc/median")),
                us(&format!("/gvisor/{key}/runsc/p95"))
            ));
        }
        line(format!(
            "| 1 GB download over HTTP | {} | {} |",
            rate("/gvisor/gigabyte_mb_s/runc"),
            rate("/gvisor/gigabyte_mb_s/runsc")
        ));
        line(String::new());
    }
    line("## The forwarders".into());
    line(String::new());
    line("| | direct | through the forwarder |".into());
    line("| --- | ---: | ---: |".into());
    line(format!(
        "| a streamed model API answer, connect to first byte, median (p95) | {} ({}) | {} ({}) |",
        us("/forwarder/first_byte_us/direct/median"),
        us("/forwarder/first_byte_us/direct/p95"),
        us("/forwarder/first_byte_us/forwarded/median"),
        us("/forwarder/first_byte_us/forwarded/p95")
    ));
    line(format!(
        "| `git clone` of a 48 MB repository (GitHub's forwarder) | {} | {} |",
        rate("/forwarder/clone_mb_s/direct"),
        rate("/forwarder/clone_mb_s/forwarded")
    ));
    line(format!(
        "| the forwarder's peak resident memory | | {:.1} MB |",
        f("/forwarder/peak_rss_kb") / 1024.0
    ));
    line(String::new());
    line("## Image sizes".into());
    line(String::new());
    line("| image | size |".into());
    line("| --- | ---: |".into());
    for (name, size) in sizes {
        line(format!("| {name} | {:.0} MB |", *size as f64 / 1e6));
    }
    line(String::new());
    line("## The peers' published figures (not measured here)".into());
    line(String::new());
    line("| what | figure | source |".into());
    line("| --- | --- | --- |".into());
    for (what, figure, source) in PEERS {
        line(format!("| {what} | {figure} | {source} |"));
    }
    line(String::new());
    let data = serde_json::json!({ "machine": machine, "figures": figures, "sizes": sizes });
    line(format!("{FIGURES_START}{}{FIGURES_END}", serde_json::to_string_pretty(&data).unwrap_or_default()));
    out
}

/// Figures other projects published, with where: never measured here.
const PEERS: &[(&str, &str, &str)] = &[
    ("Daytona, time to a first command", "195 ms", "ComputeSDK sandbox benchmark, 2026-05-04"),
    ("E2B, time to a first command", "490 ms", "ComputeSDK sandbox benchmark, 2026-05-04"),
    ("Modal, time to a first command", "2,192 ms", "ComputeSDK sandbox benchmark, 2026-05-04"),
    (
        "egress filtering by transparent TLS interception",
        "+290 ms a request, resident memory ×5",
        "OpenSandbox's egress benchmark",
    ),
];

/// The machine and figures a card carries, read back from its text.
pub fn parse(card: &str) -> anyhow::Result<(Machine, Value)> {
    let start = card.find(FIGURES_START).context("the card carries no figures")? + FIGURES_START.len();
    let end = start + card[start..].find(FIGURES_END).context("the card's figures do not end")?;
    let data: Value = serde_json::from_str(&card[start..end]).context("the card's figures are not JSON")?;
    let machine: Machine = serde_json::from_value(data["machine"].clone()).context("the card's machine")?;
    Ok((machine, data["figures"].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            cores: 2,
            cpu: "Test CPU".into(),
            memory_gib: 24.0,
            kernel: "6.1.0-test".into(),
            engine: "Docker Engine 20.10.24".into(),
            date: "2026-11-27".into(),
        }
    }

    #[test]
    fn a_card_renders_and_parses_back() {
        let figures = serde_json::json!({
            "runs": 3,
            "first_command": { "sandbox_ms": { "median": 610.0, "p95": 700.0, "n": 20 },
                               "bare_ms": { "median": 420.0, "p95": 480.0, "n": 20 } },
            "start_to_ready": {
                "baseline_ms": { "median": 400.0, "p95": 410.0 },
                "timeline": {
                    "one_domain": [{ "phase": "nft table loaded", "median_ms": 5.14 }],
                    "ten_thousand": [{ "phase": "nft table loaded", "median_ms": 9.0 }]
                }
            },
        });
        let card = render(&figures, &machine(), &[("os".into(), 120_000_000)]);
        assert!(
            card.contains(
                "| `agent-sandbox run node --detach` (to `sandbox ready`), then `node -v` | 610 ms | 700 ms |"
            ),
            "{card}"
        );
        assert!(card.contains("| os | 120 MB |") && card.contains("Daytona"), "{card}");
        assert!(card.contains("| nft table loaded | 5.1 ms | 9.0 ms |"), "{card}");
        let (read, back) = parse(&card).unwrap();
        assert_eq!((read, back), (machine(), figures));
        assert!(time_now().starts_with("20"), "{}", time_now());
    }

    /// The committed card was written by the command: it parses, and names its machine.
    #[test]
    fn the_committed_card_parses_and_names_its_machine() {
        let path = crate::project::root().join(CARD);
        let card = std::fs::read_to_string(&path).unwrap();
        let (machine, figures) = parse(&card).unwrap();
        assert!(machine.cores > 0 && !machine.kernel.is_empty() && !machine.engine.is_empty(), "{machine:?}");
        for needed in [
            "/first_command/sandbox_ms/median",
            "/start_to_ready/one_domain_ms/median",
            "/dns/new_us/gate/median",
        ] {
            assert!(figures.pointer(needed).and_then(Value::as_f64).is_some(), "{needed} is missing");
        }
        assert!(card.contains(&format!("- kernel: {}", machine.kernel)));
    }
}
