//! A headless browser for the suites that drive a web page (ui::): Debian's Chromium through a
//! chromedriver of the test's own on a free loopback port, a profile in a temporary directory,
//! and helpers that wait for what the page shows. Everything it started is gone when it is
//! dropped, passed or panicked. Stands apart: it uses nothing else of the harness.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Debian's Chromium (`apt-get install chromium`); without it chromedriver looks for Chrome on
/// its own.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Debian's chromedriver (`apt-get install chromium-driver`), found on PATH.
pub const CHROMEDRIVER: &str = "chromedriver";
const INSTALL: &str = "apt-get install chromium chromium-driver";
/// How long chromedriver may take to answer its /status.
const DRIVER_START: Duration = Duration::from_secs(10);
/// How often the helpers look at the page again.
const POLL: Duration = Duration::from_millis(50);

/// Headless Chromium in a 1400x900 window, driven through a chromedriver the test owns. Derefs
/// to the [`fantoccini::Client`] for everything the helpers do not cover (`goto`, `find`,
/// `execute`, ...). [`Browser::close`] ends the session cleanly; dropping kills chromedriver and
/// the browser either way.
pub struct Browser {
    /// `None` once closed.
    client: Option<Client>,
    /// The browser's main process (`goog:processID`), which outlives chromedriver when that is
    /// killed.
    chromium: Option<libc::pid_t>,
    driver: Child,
    /// The browser's profile and chromedriver's log.
    dir: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port, waits until it is ready and opens a session of
    /// headless Chromium.
    pub async fn start() -> anyhow::Result<Browser> {
        let dir = tempfile::Builder::new().prefix("agent-sandbox-browser-").tempdir()?;
        let log = std::fs::File::create(dir.path().join("chromedriver.log"))?;
        // A free port: bind, read it, release it for chromedriver.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new(CHROMEDRIVER);
        command.arg(format!("--port={port}")).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        let driver = command.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow::anyhow!("{CHROMEDRIVER} is not on PATH: {INSTALL}")
            } else {
                anyhow::Error::new(e).context(format!("cannot start {CHROMEDRIVER}"))
            }
        })?;
        let mut browser = Browser { client: None, chromium: None, driver, dir };

        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + DRIVER_START;
        loop {
            if let Some(status) = browser.driver.try_wait()? {
                anyhow::bail!("{CHROMEDRIVER} exited ({status}) before it was ready{}", browser.driver_log());
            }
            if driver_ready(port).await {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{CHROMEDRIVER} did not answer on {url} within {DRIVER_START:?}{}",
                    browser.driver_log()
                );
            }
            tokio::time::sleep(POLL).await;
        }

        let capabilities = browser.capabilities();
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&url)
            .await
            .with_context(|| {
                format!("{CHROMEDRIVER} could not start Chromium ({INSTALL}){}", browser.driver_log())
            })?;
        browser.chromium = client
            .capabilities()
            .and_then(|c| c.get("goog:processID"))
            .and_then(|pid| pid.as_i64())
            .and_then(|pid| libc::pid_t::try_from(pid).ok());
        browser.client = Some(client);
        Ok(browser)
    }

    /// `goog:chromeOptions` for headless Chromium as root, with its profile in our directory.
    fn capabilities(&self) -> fantoccini::wd::Capabilities {
        let mut options = serde_json::json!({
            "args": [
                "--headless=new",
                // Chromium's sandbox refuses to run as root.
                "--no-sandbox",
                "--disable-gpu",
                // /dev/shm is small in containers.
                "--disable-dev-shm-usage",
                "--window-size=1400,900",
                format!("--user-data-dir={}", self.dir.path().join("profile").display()),
            ],
        });
        if Path::new(CHROMIUM).exists() {
            options["binary"] = CHROMIUM.into();
        }
        let mut capabilities = fantoccini::wd::Capabilities::new();
        capabilities.insert("browserName".into(), "chrome".into());
        capabilities.insert("goog:chromeOptions".into(), options);
        capabilities
    }

    /// The WebDriver client.
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the browser is open until close() consumes it")
    }

    /// Saves a PNG of the viewport at `path`.
    pub async fn screenshot(&self, path: impl AsRef<Path>) -> anyhow::Result<PathBuf> {
        let path = path.as_ref();
        let png = self.client().screenshot().await.context("taking a screenshot")?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))?;
        Ok(path.to_owned())
    }

    /// The first element `css` matches, once there is one.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> anyhow::Result<Element> {
        self.client()
            .wait()
            .at_most(timeout)
            .every(POLL)
            .for_element(Locator::Css(css))
            .await
            .with_context(|| format!("no element matched {css:?} within {timeout:?}"))
    }

    /// Clicks the first element `css` matches, found again where the page replaced it between
    /// the finding and the click (a live list re-renders its rows).
    pub async fn click(&self, css: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let clicked = match self.client().find(Locator::Css(css)).await {
                Ok(element) => element.click().await.map_err(anyhow::Error::from),
                Err(e) => Err(e.into()),
            };
            match clicked {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e.context(format!("clicking {css:?}"))),
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// The rendered text of the first element `css` matches, now.
    pub async fn text_of(&self, css: &str) -> anyhow::Result<String> {
        let element = self
            .client()
            .find(Locator::Css(css))
            .await
            .with_context(|| format!("no element matches {css:?}"))?;
        element.text().await.with_context(|| format!("the text of {css:?}"))
    }

    /// The rendered text of the first element `css` matches, once it satisfies `predicate`
    /// (the element may appear, or be replaced, meanwhile). On timeout the error shows the last
    /// text seen.
    pub async fn eventually_text(
        &self,
        css: &str,
        predicate: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.text_of(css).await {
                Ok(text) if predicate(&text) => return Ok(text),
                Ok(text) if Instant::now() > deadline => {
                    anyhow::bail!("{css:?} still reads {text:?} after {timeout:?}")
                }
                Err(e) if Instant::now() > deadline => return Err(e.context(format!("waited {timeout:?}"))),
                _ => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Ends the session (Chromium quits) and stops chromedriver.
    pub async fn close(mut self) -> anyhow::Result<()> {
        if let Some(client) = self.client.take() {
            client.close().await.context("closing the WebDriver session")?;
            // chromedriver has quit it.
            self.chromium = None;
        }
        Ok(())
    }

    /// chromedriver's output so far, for an error.
    fn driver_log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("chromedriver.log")).unwrap_or_default();
        let log = log.trim();
        if log.is_empty() { String::new() } else { format!("; its log:\n{log}") }
    }
}

impl Deref for Browser {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client()
    }
}

impl Drop for Browser {
    /// Without close(), the session cannot be ended here (that awaits), and Chromium outlives a
    /// killed chromedriver: both are killed (Chromium's helpers follow its main process). If the
    /// test process itself is killed (nextest's timeout), nextest kills its process group, which
    /// both are in.
    fn drop(&mut self) {
        if let Some(pid) = self.chromium.take() {
            // Only while the pid is still our Chromium's (its command line names our profile).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let profile = self.dir.path().as_os_str().as_encoded_bytes();
            if cmdline.windows(profile.len()).any(|w| w == profile) {
                // SAFETY: kill takes no pointers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Whether chromedriver at `port` answers its /status with `"ready": true`. It keeps the
/// connection open whatever the request says: read until the answer is in.
async fn driver_ready(port: u16) -> bool {
    let ready = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await?;
        let mut response = Vec::new();
        let mut chunk = [0; 4096];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return std::io::Result::Ok(false);
            }
            response.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&response).replace(' ', "");
            if text.len() >= "HTTP/1.1200".len() && !text.starts_with("HTTP/1.1200") {
                return Ok(false);
            }
            if text.contains("\"ready\":true") {
                return Ok(true);
            }
            if text.contains("\"ready\":false") {
                return Ok(false);
            }
        }
    };
    matches!(tokio::time::timeout(Duration::from_secs(1), ready).await, Ok(Ok(true)))
}
