//! The harness's headless browser on a page of its own (a data: URL): no server, no engine. Needs
//! Debian's chromium and chromium-driver.

use std::time::Duration;

use sandbox_tests::browser::Browser;

/// A heading, a text, and a button whose click changes the text a moment later, as a page that
/// waits on a server would.
const PAGE: &str = r#"<!doctype html>
<html>
<head><title>harness</title></head>
<body>
  <h1>Browser harness</h1>
  <p id="status">waiting</p>
  <button id="go" onclick="setTimeout(() => { document.getElementById('status').textContent = 'clicked'; }, 200)">Go</button>
</body>
</html>"#;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// `html` as a data: URL, every byte but letters and digits percent-encoded.
fn data_url(html: &str) -> String {
    let mut url = String::from("data:text/html;charset=utf-8,");
    for byte in html.bytes() {
        if byte.is_ascii_alphanumeric() {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url
}

#[tokio::test]
async fn a_click_changes_the_text_and_the_screenshot_is_a_png() -> anyhow::Result<()> {
    let browser = Browser::start().await?;
    browser.goto(&data_url(PAGE)).await?;
    assert_eq!(browser.title().await?, "harness");
    assert_eq!(browser.text_of("h1").await?, "Browser harness");
    assert_eq!(browser.text_of("#status").await?, "waiting");

    browser.wait_for("button#go", Duration::from_secs(5)).await?.click().await?;
    let text = browser.eventually_text("#status", |t| t == "clicked", Duration::from_secs(5)).await?;
    assert_eq!(text, "clicked");

    // A predicate never met: the error shows the last text seen.
    let error = browser.eventually_text("#status", |t| t == "never", Duration::from_millis(300)).await;
    let error = format!("{:#}", error.expect_err("the text never reads \"never\""));
    assert!(error.contains("\"clicked\""), "{error}");

    let dir = tempfile::tempdir()?;
    let png = browser.screenshot(dir.path().join("page.png")).await?;
    let bytes = std::fs::read(&png)?;
    assert!(
        bytes.starts_with(PNG_SIGNATURE),
        "{} is not a PNG: {:02x?}",
        png.display(),
        &bytes[..8.min(bytes.len())]
    );

    browser.close().await
}
