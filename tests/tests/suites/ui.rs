//! The launcher's web page, `agent-sandbox ui`, driven in headless Chromium (Debian's, through
//! chromedriver) against real sandboxes started by the launcher: what the page lists, shows and
//! changes is checked where it lands (the engine's containers, the agent's own connections).
//! The page's screenshots go to target/ui-screenshots (docs/images has the README's copies).
//!
//! `net_admin_` tests need the firewall (the agent's refused names) and are left out of `--ci`;
//! the rest need no capability.

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::Locator;
use sandbox_tests::assert::{assert_blocked, assert_reaches};
use sandbox_tests::browser::Browser;
use sandbox_tests::docker::{TestNet, exec};
use sandbox_tests::launcher::{Launcher, Project, UiServer};
use sandbox_tests::peers::Peer;
use sandbox_tests::sandbox::Sandbox;

/// How long the page may take to show a change: its poll (1 s) and the engine's answers on a
/// busy machine (the whole suite on 2 cores once took more than 6 s to show an approval). The
/// live-update latency itself is `cargo xtask bench ui`'s figure.
const SHOWN: Duration = Duration::from_secs(20);

/// A name that would run script if the page inserted it as HTML.
const MARKUP: &str = "<img src=1 onerror=document.title=1>.ui.test";

fn screenshots() -> anyhow::Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| sandbox_tests::root().join("target"), PathBuf::from);
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A CSS selector matching `data-name` exactly (names are quoted, so a hostile one stays a string).
fn named(css: &str, name: &str) -> String {
    format!("{css}[data-name=\"{}\"]", name.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Whether any element matches `css` now.
async fn present(browser: &Browser, css: &str) -> anyhow::Result<bool> {
    Ok(!browser.find_all(Locator::Css(css)).await?.is_empty())
}

/// Waits until nothing matches `css`.
async fn gone(browser: &Browser, css: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + within;
    while present(browser, css).await? {
        anyhow::ensure!(std::time::Instant::now() < deadline, "{css} still shown after {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Clicks `css` once it is enabled.
async fn click_when_enabled(browser: &Browser, css: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + SHOWN;
    let element = browser.wait_for(css, SHOWN).await?;
    while !element.is_enabled().await? {
        anyhow::ensure!(std::time::Instant::now() < deadline, "{css} still disabled after {SHOWN:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    element.click().await?;
    Ok(())
}

/// Types into the agent's session, as the agent would.
async fn type_in_session(id: &str, keys: &str) -> anyhow::Result<()> {
    let out =
        exec(id, &["sandbox-exec", "--", "tmux", "send-keys", "-t", "agent", keys, "Enter"], None).await?;
    anyhow::ensure!(out.code == 0, "send-keys: {out:?}");
    Ok(())
}

/// Without its token the server refuses everything, the page included; a rebound Host is
/// refused; a change from another Origin, or with the token only in a cookie, changes nothing.
/// Each with its control: the same request done right gets through.
#[tokio::test]
async fn the_server_refuses_requests_without_token_host_or_origin() -> anyhow::Result<()> {
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let id = launcher.offline_shell(&project, &[]).await?;
    let (_, name) = project.sandbox().await?;
    let ui = launcher.ui().await?;
    let (port, token) = (ui.port, ui.token.clone());
    let get = |path: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Connection: close\r\n\r\n")
    };

    let (status, page) = ui.raw(&get(&format!("/?token={token}"), "")).await?;
    assert_eq!(status, 200, "the control: the page with its token");
    assert!(
        page.to_ascii_lowercase().contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{page}"
    );
    assert!(!page.contains("<script>") && page.contains("/assets/app.js"), "no inline script");
    for (what, request) in [
        ("the page without a token", get("/", "")),
        ("the page with a wrong token", get(&format!("/?token={}", "0".repeat(64)), "")),
        ("the script without a token", get("/assets/app.js", "")),
        ("the API without a token", get("/api/sandboxes", "")),
        (
            "the API with the token in a cookie alone",
            get("/api/sandboxes", &format!("Cookie: agent_sandbox_token_{port}={token}\r\n")),
        ),
    ] {
        let (status, answer) = ui.raw(&request).await?;
        assert_eq!(status, 401, "{what}: {answer}");
        assert!(!answer.contains(&name), "{what} leaked the sandbox: {answer}");
    }
    // DNS rebinding: a name of the attacker's resolving to 127.0.0.1 sends its own Host.
    let rebound = format!(
        "GET /?token={token} HTTP/1.1\r\nHost: rebind.attacker.test:{port}\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(ui.raw(&rebound).await?.0, 403);

    // A cross-origin POST: another page's script, with the token even, and the browser's Origin.
    let stop = format!("/api/sandboxes/{name}/stop");
    let cross = format!(
        "POST {stop} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://evil.test\r\nX-Agent-Sandbox-Token: {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    assert_eq!(ui.raw(&cross).await?.0, 403);
    let cookie_only = format!(
        "POST {stop} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nCookie: agent_sandbox_token_{port}={token}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    assert_eq!(ui.raw(&cookie_only).await?.0, 401);
    assert_eq!(project.containers().await?.len(), 1, "a refused stop stopped it");
    // The control: the page's own request stops it.
    let (status, answer) = ui.api("POST", &stop, Some("{}")).await?;
    assert_eq!(status, 200, "{answer}");
    assert!(project.containers().await?.is_empty(), "the page's stop left {id}");
    Ok(())
}

/// The page lists sandboxes live: one started from the CLI appears, one stopped from the CLI
/// goes. The agent's screen is shown as text: what it printed is there, markup it printed is
/// text and not elements, and an OSC 52 clipboard write it printed never reaches the DOM.
#[tokio::test]
async fn the_page_lists_sandboxes_live_and_shows_the_agents_screen_as_text() -> anyhow::Result<()> {
    let (launcher, project, other) = (Launcher::new()?, Project::new()?, Project::new()?);
    let id = launcher.offline_shell(&project, &[]).await?;
    let (_, name) = project.sandbox().await?;
    let ui = launcher.ui().await?;
    let browser = Browser::start().await?;
    browser.goto(&ui.url).await?;
    browser.wait_for(&named("tr.sandbox", &name), SHOWN).await?;

    launcher.offline_shell(&other, &[]).await?;
    let (_, second) = other.sandbox().await?;
    browser.wait_for(&named("tr.sandbox", &second), SHOWN).await?;
    let row = browser.text_of(&named("tr.sandbox", &second)).await?;
    assert!(row.contains("shell") && row.contains(&other.path), "{row}");
    browser.screenshot(screenshots()?.join("list.png")).await?;
    launcher.ok(&["stop", &second]).await?;
    gone(&browser, &named("tr.sandbox", &second), SHOWN).await?;
    assert!(present(&browser, &named("tr.sandbox", &name)).await?, "the control: the first is still listed");

    // The agent prints markup, and a clipboard write whose payload is assembled by the shell
    // (so the typed command line does not show it).
    type_in_session(&id, "printf '<b id=hostile>bold</b> %s\\n' \"visible-$((6*7))\"").await?;
    type_in_session(
        &id,
        "e=$(printf '\\033'); printf '%s]5%s;c;%s\\007' \"$e\" 2 \"$(printf %s c2Vj cmV0)\"; echo after-osc",
    )
    .await?;
    browser.click(&format!("{} a.open", named("tr.sandbox", &name)), SHOWN).await?;
    let screen = browser
        .eventually_text("#screen", |t| t.contains("visible-42") && t.contains("after-osc"), SHOWN)
        .await?;
    assert!(screen.contains("<b id=hostile>bold</b> visible-42"), "the markup is text: {screen}");
    assert!(
        !present(&browser, "#hostile").await? && !present(&browser, "#screen b").await?,
        "markup became elements"
    );
    let source = browser.source().await?;
    assert!(!source.contains("c2VjcmV0") && !source.contains("]52;"), "the clipboard write reached the DOM");
    browser.screenshot(screenshots()?.join("screen.png")).await?;
    browser.close().await?;
    Ok(())
}

net_admin! {
    [single] {
        /// The page's approvals are `allow --pending`'s: a name refused to the agent appears under
        /// pending, approving lets the agent connect (checked from inside), the approval of a list the
        /// queue no longer matches changes nothing, deny cuts it, and stop removes the sandbox. Names
        /// the agent chose that hold markup are shown as text.
        #[tokio::test]
        async fn the_page_approves_denies_and_stops_as_the_cli_does() -> anyhow::Result<()> {
            let net = TestNet::create("ui").await?;
            let peer = Peer::start(&net, &["docs.ui.test", "late.ui.test", "later.ui.test"]).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let (id, name) = launcher.shell_on(&project, &net).await?;
            let sb = Sandbox::adopt(&id).await?;
            let ui = launcher.ui().await?;
            let browser = Browser::start().await?;
            browser.goto(&format!("{}#/s/{name}", ui.url)).await?;
            browser.wait_for(&format!("section#sandbox[data-name=\"{name}\"]"), SHOWN).await?;

            assert_blocked(&sb, "docs.ui.test:443").await?;
            browser.wait_for(&named("li.pending", "docs.ui.test"), SHOWN).await?;
            let approve = browser.find(Locator::Css("#approve")).await?;
            assert!(approve.text().await?.contains('1'), "{}", approve.text().await?);
            browser.screenshot(screenshots()?.join("pending.png")).await?;

            // The queue changed after the page showed it: an approval of what it showed is refused,
            // nothing is allowed, and the page looks again.
            let shown = r#"{"names":["docs.ui.test"]}"#;
            sb.probe(&["dns", "late.ui.test"]).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (status, answer) = ui.api("POST", &format!("/api/sandboxes/{name}/approve"), Some(shown)).await?;
            assert_eq!(status, 409, "{answer}");
            assert_blocked(&sb, "docs.ui.test:443").await?;

            // Names under a site the policy never allowed are listed in a dialog first, and the button
            // waits until the list has held still (the agent sees when the page looks).
            browser.wait_for(&named("li.pending", "late.ui.test"), SHOWN).await?;
            click_when_enabled(&browser, "#approve").await?;
            let listed =
                browser.eventually_text("#confirm-approve-list", |t| t.contains("late.ui.test"), SHOWN).await?;
            assert!(listed.contains("docs.ui.test") && listed.contains("new site"), "{listed}");
            browser.click("#confirm-approve-yes", SHOWN).await?;
            browser
                .eventually_text("#runtime", |t| t.contains("docs.ui.test") && t.contains("late.ui.test"), SHOWN)
                .await?;
            assert_reaches(&sb, "docs.ui.test:443").await?;
            assert_reaches(&sb, "late.ui.test:443").await?;
            assert_blocked(&sb, "later.ui.test:443").await?;
            // The connection shows, with its verdict.
            browser.wait_for(&named("tr.total", "docs.ui.test"), SHOWN).await?;
            // Markup as a name: the agent's own Host header of markup is refused and logged without it
            // (sandbox-init logs host names alone), so lines of markup are fed to both logs as root, as
            // an image of another make could write them: the page shows them as text.
            let refused = sb.probe(&["tcp", &peer.ipv4.to_string(), "80", "--http", "--host", MARKUP]).await?;
            assert_ne!(refused.outcome(), "http:200", "{:?}", refused.fields);
            let time = "2099-01-01T00:00:00.000Z";
            let connection = format!(
                r#"{{"address":"10.9.9.9","port":443,"protocol":"tcp","name":"{MARKUP}","reason":"{MARKUP}","time":"{time}","verdict":"refused","via":"tls"}}"#
            );
            let denial = format!(
                r#"{{"time":"{time}","denied":"dns","reason":"not allowlisted","name":"{MARKUP}","kind":"A"}}"#
            );
            for (line, log) in
                [(connection, "/run/agent-sandbox/connections.jsonl"), (denial, "/run/agent-sandbox/denials.jsonl")]
            {
                let fed = exec(&id, &["sh", "-c", &format!("printf '%s\\n' \"$0\" >> {log}"), &line], None).await?;
                anyhow::ensure!(fed.code == 0, "{fed:?}");
            }
            browser.eventually_text("#connections", |t| t.contains(MARKUP), SHOWN).await?;
            browser.eventually_text("#unallowable", |t| t.contains(MARKUP), SHOWN).await?;
            let title = browser.title().await?;
            assert_ne!(title, "1", "a name's markup ran");
            assert!(!present(&browser, "img").await?, "a name's markup became an element");
            browser.screenshot(screenshots()?.join("sandbox.png")).await?;

            // Deny cuts it; a bad name gets the CLI's message.
            let deny = format!("{} button.deny", named("li.runtime", "docs.ui.test"));
            browser.click(&deny, SHOWN).await?;
            gone(&browser, &named("li.runtime", "docs.ui.test"), SHOWN).await?;
            assert_blocked(&sb, "docs.ui.test:443").await?;
            assert_reaches(&sb, "late.ui.test:443").await?;
            browser.find(Locator::Css("#allow-input")).await?.send_keys("https://docs.rs").await?;
            browser.click("#allow-button", SHOWN).await?;
            browser.eventually_text("#message", |t| t.contains("`https://docs.rs`, character 7"), SHOWN).await?;

            // Stop, confirmed.
            browser.click("#stop", SHOWN).await?;
            browser.wait_for("#confirm-stop-yes", SHOWN).await?.click().await?;
            browser.eventually_text("#message", |t| t.contains("stopped"), Duration::from_secs(30)).await?;
            assert!(project.containers().await?.is_empty(), "the page's stop left the sandbox");
            browser.close().await?;
            drop::<UiServer>(ui);
            Ok(())
        }
    }
}
