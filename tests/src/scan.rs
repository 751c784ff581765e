//! The scanners users run on images and pods (hadolint, trivy, Cepheus), as `cargo xtask setup
//! --tests` installs them: the scanners:: suite runs them on the repository, the pod and a
//! sandbox of each shape, and trivy on every image (docs/scanners.md).

use std::path::PathBuf;
use std::process::Command;

/// A scanner's program, as setup installs it.
pub fn scanner(program: &str) -> anyhow::Result<PathBuf> {
    let path = crate::root().join(xtask::setup::SCANNERS_DIR).join("bin").join(program);
    anyhow::ensure!(
        path.is_file(),
        "{program} is not installed: `cargo xtask setup --tests` installs the scanners under {}",
        xtask::setup::SCANNERS_DIR
    );
    Ok(path)
}

/// What a program run from the repository's root printed on both streams, and whether it
/// succeeded.
pub fn run(command: &mut Command) -> anyhow::Result<(bool, String)> {
    let out = command.current_dir(crate::root()).output()?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), said))
}

/// trivy's cache for image scans, kept between runs and checkouts in the user's cache
/// (`$XDG_CACHE_HOME/agent-sandbox/trivy`): trivy keys what it found in a layer by the layer's
/// digest and its analysers' versions, so only what changed is read again. A temporary folder
/// where the user has no cache folder.
pub fn trivy_cache() -> anyhow::Result<std::path::PathBuf> {
    match sandbox_images::cache_home() {
        Some(home) => {
            let dir = home.join("agent-sandbox/trivy");
            std::fs::create_dir_all(&dir)?;
            Ok(dir)
        }
        None => Ok(tempfile::tempdir()?.keep()),
    }
}

/// trivy's secret and misconfiguration scans of an image in the local engine (no vulnerability
/// database: nothing is downloaded), with the root's .trivyignore: what it finds, as
/// `ID: title (where)`. `cache`: trivy's, where the layers it read are kept, so that the layers
/// images share are read once.
pub fn trivy_image(tag: &str, cache: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let (ok, said) = run(Command::new(scanner("trivy")?)
        .args(["image", "--scanners", "secret,misconfig", "--image-src", "docker"])
        .args(["--skip-check-update", "--skip-version-check", "--quiet", "--format", "json"])
        .arg("--cache-dir")
        .arg(cache)
        .arg(tag))?;
    anyhow::ensure!(ok, "trivy image {tag} failed: {said}");
    let report: serde_json::Value = serde_json::from_str(&said)?;
    let mut found = Vec::new();
    for result in report["Results"].as_array().into_iter().flatten() {
        let target = result["Target"].as_str().unwrap_or_default();
        for m in
            result["Misconfigurations"].as_array().into_iter().flatten().filter(|m| m["Status"] == "FAIL")
        {
            found.push(format!("{}: {} ({target})", m["ID"], m["Title"]));
        }
        for secret in result["Secrets"].as_array().into_iter().flatten() {
            found.push(format!(
                "{}: {} ({target}:{})",
                secret["RuleID"], secret["Title"], secret["StartLine"]
            ));
        }
    }
    Ok(found)
}
