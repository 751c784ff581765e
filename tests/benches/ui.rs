//! `cargo xtask bench ui`: the launcher's web page with 20 sandboxes and a connection log of
//! 100,000 lines, in headless Chromium, each figure beside a baseline measured in the same run:
//!
//! - page load (the URL opened to all 20 rows drawn) vs. `agent-sandbox ls` printing the same;
//! - live update: a sandbox started (or stopped) from the CLI, from the command's return to its
//!   row drawn (or gone), and a name refused to an agent (on a test network, with the firewall:
//!   NET_ADMIN) from the refusal to its line under pending, vs. the page's poll period (1 s);
//! - the connections view: opened on 100,000 lines to the count drawn, and the API's answer
//!   for those lines (all, and a search), vs. the same on a sandbox of a handful of lines;
//! - responsiveness: the longest task on the page's main thread over 5 s of live updates of the
//!   100,000-line view (Chromium's Long Tasks API: 50 ms or more), vs. the handful-line view.
//!
//! Sandboxes are the shell image, `--offline` (the page needs no network of theirs). Figures
//! are medians and p95; the machine is shared and noisy, so ratios travel, times do not.

use std::time::{Duration, Instant};

use fantoccini::Locator;
use futures_util::StreamExt as _;
use sandbox_tests::browser::Browser;
use sandbox_tests::docker::{TestNet, exec};
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::sandbox::Sandbox;

const SANDBOXES: usize = 20;
const LINES: usize = 100_000;
const POLL: Duration = Duration::from_millis(1000);

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn stats(samples: &[Duration]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| ms(sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]);
    format!("median {:>8.1} ms  p95 {:>8.1} ms  (n = {})", at(0.5), at(0.95), sorted.len())
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn line(what: &str, samples: &[Duration], baseline: &str, base: &[Duration]) {
    let ratio = median(samples).as_secs_f64() / median(base).as_secs_f64().max(1e-9);
    println!("{what:<44} {}", stats(samples));
    println!("{:<44} {}   ratio {ratio:.2}", format!("  baseline: {baseline}"), stats(base));
}

/// Polls the page until `css` matches `count` elements (or, with `count` 0, none).
async fn until_count(browser: &Browser, css: &str, want: impl Fn(usize) -> bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let n = browser.find_all(Locator::Css(css)).await?.len();
        if want(n) {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "{css}: {n} after 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn row(name: &str) -> String {
    format!("tr.sandbox[data-name=\"{name}\"]")
}

/// The longest main-thread task (ms) over `over`, as Chromium's Long Tasks API reports them.
async fn longest_task(browser: &Browser, over: Duration) -> anyhow::Result<f64> {
    browser
        .execute(
            "window.__longest = 0; new PerformanceObserver(l => { for (const e of l.getEntries()) \
             window.__longest = Math.max(window.__longest, e.duration); }).observe({entryTypes: ['longtask']});",
            vec![],
        )
        .await?;
    tokio::time::sleep(over).await;
    let longest = browser.execute("return window.__longest;", vec![]).await?;
    Ok(longest.as_f64().unwrap_or(0.0))
}

/// Appends `lines` connection lines to the sandbox's log, as root, in one shell loop.
async fn feed(id: &str, lines: usize) -> anyhow::Result<()> {
    let script = format!(
        "i=0; v=refused; while [ $i -lt {lines} ]; do printf '{{\"address\":\"10.0.%d.%d\",\"port\":443,\"protocol\":\"tcp\",\
         \"name\":\"host%d.bench.test\",\"reason\":\"host%d.bench.test is allowed on port 443\",\
         \"time\":\"2026-01-01T00:00:00.000Z\",\"verdict\":\"%s\",\"via\":\"tls\",\"bytes_up\":%d,\"bytes_down\":%d,\"ms\":3}}\\n' \
         $((i/256%256)) $((i%256)) $((i%500)) $((i%500)) $v $i $((i*2)); \
         i=$((i+1)); v=allowed; if [ $((i%7)) -eq 0 ]; then v=refused; fi; done >> /run/agent-sandbox/connections.jsonl"
    );
    let out = exec(id, &["sh", "-c", &script], None).await?;
    anyhow::ensure!(out.code == 0, "feeding the log: {out:?}");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    // A bench has no test's place: it asks for each shape it measures.
    sandbox_tests::place::bench();
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(7);
    let launcher = Launcher::new()?;
    eprintln!("starting {SANDBOXES} sandboxes (shell, --offline), four at a time");
    let projects: Vec<Project> = (0..SANDBOXES).map(|_| Project::new()).collect::<Result<_, _>>()?;
    let started: Vec<anyhow::Result<String>> = futures_util::stream::iter(&projects)
        .map(|p| launcher.offline_shell(p, &[]))
        .buffer_unordered(4)
        .collect()
        .await;
    started.into_iter().collect::<Result<Vec<_>, _>>()?;
    let (mut ids, mut names) = (Vec::new(), Vec::new());
    for p in &projects {
        let (id, name) = p.sandbox().await?;
        ids.push(id);
        names.push(name);
    }
    let ui = launcher.ui().await?;
    let browser = Browser::start().await?;

    eprintln!("page load vs. `agent-sandbox ls`, {runs} each");
    let (mut load, mut ls) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        browser.goto("about:blank").await?;
        browser.goto(&ui.url).await?;
        until_count(&browser, "tr.sandbox", |n| n >= SANDBOXES).await?;
        load.push(t.elapsed());
        let t = Instant::now();
        let out = launcher.ok(&["ls"]).await?;
        ls.push(t.elapsed());
        anyhow::ensure!(names.iter().all(|n| out.stdout.contains(n.as_str())), "ls lists them all");
    }

    eprintln!("live update: started and stopped from the CLI, {runs} each");
    let (mut appear, mut vanish) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let project = Project::new()?;
        launcher.offline_shell(&project, &[]).await?;
        let (_, name) = project.sandbox().await?;
        appear.push(until_count(&browser, &row(&name), |n| n == 1).await?);
        launcher.ok(&["stop", &name]).await?;
        vanish.push(until_count(&browser, &row(&name), |n| n == 0).await?);
    }

    eprintln!("a refused name to the page's pending list, {runs} names");
    let net = TestNet::create("bench-ui").await?;
    let asking = Project::new()?;
    let (asking_id, asking_name) = launcher.shell_on(&asking, &net).await?;
    let agent = Sandbox::adopt(&asking_id).await?;
    browser.goto(&format!("{}#/s/{asking_name}", ui.url)).await?;
    until_count(&browser, "#pending li", |n| n > 0).await?;
    let mut pending = Vec::new();
    for i in 0..runs {
        let name = format!("asked{i}.bench.test");
        agent.probe(&["dns", &name]).await?;
        // From the refusal's answer to the agent: the gate logs it before it answers.
        pending.push(until_count(&browser, &format!("li.pending[data-name=\"{name}\"]"), |n| n == 1).await?);
    }

    eprintln!("feeding {LINES} connection lines to one sandbox");
    let (big, small) = (&names[0], &names[1]);
    feed(&ids[0], LINES).await?;
    feed(&ids[1], 5).await?;
    let count_of = |name: &str| format!("{}#/s/{name}", ui.url);
    let (mut open_big, mut open_small) = (Vec::new(), Vec::new());
    for (target, samples) in [(big, &mut open_big), (small, &mut open_small)] {
        for _ in 0..runs.min(3) {
            let t = Instant::now();
            browser.goto("about:blank").await?;
            browser.goto(&count_of(target)).await?;
            until_count(&browser, "tr.connection", |n| n > 0).await?;
            samples.push(t.elapsed());
        }
    }
    let (mut api_big, mut api_small, mut search_big, mut search_small) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        for (target, all, search) in
            [(big, &mut api_big, &mut search_big), (small, &mut api_small, &mut search_small)]
        {
            let t = Instant::now();
            let (status, _) = ui.api("GET", &format!("/api/sandboxes/{target}/connections"), None).await?;
            all.push(t.elapsed());
            anyhow::ensure!(status == 200);
            let t = Instant::now();
            ui.api(
                "GET",
                &format!("/api/sandboxes/{target}/connections?q=host42.bench&verdict=refused"),
                None,
            )
            .await?;
            search.push(t.elapsed());
        }
    }
    browser.goto(&count_of(big)).await?;
    until_count(&browser, "tr.connection", |n| n > 0).await?;
    let count = browser.find(Locator::Css("#conn-count")).await?.text().await?;
    anyhow::ensure!(count.contains(&LINES.to_string()), "the view counts every line: {count}");
    let long_big = longest_task(&browser, Duration::from_secs(5)).await?;
    browser.goto(&count_of(small)).await?;
    until_count(&browser, "tr.connection", |n| n > 0).await?;
    let long_small = longest_task(&browser, Duration::from_secs(5)).await?;
    browser.close().await?;

    println!();
    println!("agent-sandbox ui, {SANDBOXES} sandboxes (shell, offline), headless Chromium");
    line("page load to 20 rows", &load, "agent-sandbox ls", &ls);
    line("a sandbox started: CLI return to its row", &appear, "the poll period", &[POLL]);
    line("a sandbox stopped: CLI return to row gone", &vanish, "the poll period", &[POLL]);
    line("a refused name: the agent's answer to pending", &pending, "the poll period", &[POLL]);
    line(&format!("view opened on {LINES} lines"), &open_big, "5 lines", &open_small);
    line(&format!("connections API, {LINES} lines"), &api_big, "5 lines", &api_small);
    line(&format!("a search in {LINES} lines"), &search_big, "5 lines", &search_small);
    println!(
        "{:<44} {long_big:.0} ms (5 lines: {long_small:.0} ms; 0 = none of 50 ms or more)",
        "longest main-thread task, live view"
    );
    Ok(())
}
