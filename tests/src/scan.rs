//! The scanners users run on images and pods (hadolint, trivy, Cepheus), as `cargo xtask setup
//! --tests` installs them: the scanners:: suite runs them on the repository, the pod and a
//! sandbox of each shape, and trivy on every image (docs/scanners.md).

use anyhow::Context as _;
use std::path::PathBuf;
use std::process::Command;

/// A scanner's program, as setup installs it.
pub fn scanner(program: &str) -> anyhow::Result<PathBuf> {
    let path =
        xtask::setup::ci_tools(&crate::root()).join(xtask::setup::SCANNERS_DIR).join("bin").join(program);
    anyhow::ensure!(
        path.is_file(),
        "{program} is not installed: `cargo xtask setup --tests` installs the scanners, {} is missing",
        path.display()
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

/// The images `tags` as trivy reads them fastest: saved by the engine in one archive (the layers
/// they share once; `--image-src docker` had the engine export each image whole, base and all,
/// again for every image), unpacked under `dir`, and laid out per image, in the order of `tags`,
/// as an OCI image layout whose layer blobs are hard links to the unpacked layers (uncompressed,
/// so each one's digest is its diff id from the image's config).
pub fn oci_layouts(tags: &[String], dir: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    use sha2::Digest as _;
    // Unpacked as it streams, by tar (the archive is gigabytes: no copy of it is kept).
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked)?;
    let mut save =
        Command::new("docker").arg("save").args(tags).stdout(std::process::Stdio::piped()).spawn()?;
    let stream = save.stdout.take().expect("piped");
    let untar = Command::new("tar").arg("-x").arg("-C").arg(&unpacked).stdin(stream).status()?;
    let saved = save.wait()?;
    anyhow::ensure!(saved.success() && untar.success(), "docker save | tar -x: {saved}, {untar}");
    #[derive(serde::Deserialize)]
    struct Saved {
        #[serde(rename = "Config")]
        config: String,
        #[serde(rename = "RepoTags", default)]
        tags: Vec<String>,
        #[serde(rename = "Layers")]
        layers: Vec<String>,
    }
    let saved: Vec<Saved> = serde_json::from_slice(&std::fs::read(unpacked.join("manifest.json"))?)?;
    let mut layouts = Vec::new();
    for (n, tag) in tags.iter().enumerate() {
        let image = saved
            .iter()
            .find(|s| s.tags.contains(tag))
            .ok_or_else(|| anyhow::anyhow!("docker save left out {tag}"))?;
        let layout = dir.join(format!("oci-{n}"));
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&blobs)?;
        let blob = |bytes: &[u8]| -> anyhow::Result<serde_json::Value> {
            let digest = format!("{:x}", sha2::Sha256::digest(bytes));
            std::fs::write(blobs.join(&digest), bytes)?;
            Ok(serde_json::json!({ "digest": format!("sha256:{digest}"), "size": bytes.len() }))
        };
        let config_bytes = std::fs::read(unpacked.join(&image.config))?;
        let config: serde_json::Value = serde_json::from_slice(&config_bytes)?;
        let diff_ids = config["rootfs"]["diff_ids"].as_array().cloned().unwrap_or_default();
        anyhow::ensure!(
            diff_ids.len() == image.layers.len(),
            "{tag}: its layers and its config's diff ids differ"
        );
        let mut layers = Vec::new();
        for (path, diff_id) in image.layers.iter().zip(&diff_ids) {
            let diff_id = diff_id.as_str().unwrap_or_default();
            let target = blobs.join(diff_id.trim_start_matches("sha256:"));
            if !target.exists() {
                // A layer saved for an earlier image is a relative symbolic link to it: the link
                // is to the file itself.
                let layer = std::fs::canonicalize(unpacked.join(path))
                    .with_context(|| format!("{tag}: no layer {path} in what docker save wrote"))?;
                std::fs::hard_link(&layer, &target)?;
            }
            let size = std::fs::metadata(&target)?.len();
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": diff_id, "size": size,
            }));
        }
        let mut config_ref = blob(&config_bytes)?;
        config_ref["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_ref,
            "layers": layers,
        });
        let mut manifest_ref = blob(&serde_json::to_vec(&manifest)?)?;
        manifest_ref["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
        let index = serde_json::json!({ "schemaVersion": 2, "manifests": [manifest_ref] });
        std::fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
        std::fs::write(layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        layouts.push(layout);
    }
    Ok(layouts)
}

/// `trivy image`'s options, but for where it reads the image and its cache.
const IMAGE_SCAN: [&str; 8] = [
    "image",
    "--scanners",
    "secret,misconfig",
    "--skip-check-update",
    "--skip-version-check",
    "--quiet",
    "--format",
    "json",
];

/// An image's ID as the engine has it (`sha256:…`, the digest of its configuration, which names
/// every layer by its digest).
pub fn image_id(tag: &str) -> anyhow::Result<String> {
    let out = Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", tag]).output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker image inspect {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout)?.trim().to_string();
    anyhow::ensure!(
        id.strip_prefix("sha256:")
            .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
        "{tag}: the engine gave no image ID: {id:?}"
    );
    Ok(id)
}

/// The images trivy found clean, kept beside its cache (`clean/<key>`), each by a key that
/// hashes what decides the verdict: trivy's version (its built-in checks and secret rules are
/// in its binary), the ignore file's bytes, the scan's options and the image's ID. A key
/// recorded means that scan, of those bytes, found nothing: a changed image, trivy, ignore file
/// or option is a new key, and scanned.
pub struct CleanScans {
    dir: PathBuf,
    salt: Vec<u8>,
}

impl CleanScans {
    pub fn new(cache: &std::path::Path, ignore: &std::path::Path) -> anyhow::Result<CleanScans> {
        let version = Command::new(scanner("trivy")?).arg("--version").output()?;
        anyhow::ensure!(version.status.success(), "trivy --version failed");
        let mut salt = version.stdout;
        salt.extend_from_slice(IMAGE_SCAN.join("\0").as_bytes());
        salt.extend_from_slice(&std::fs::read(ignore).with_context(|| ignore.display().to_string())?);
        let dir = cache.join("clean");
        std::fs::create_dir_all(&dir)?;
        Ok(CleanScans { dir, salt })
    }

    fn file(&self, id: &str) -> PathBuf {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update(&self.salt);
        hash.update(b"\0");
        hash.update(id.as_bytes());
        self.dir.join(format!("{:x}", hash.finalize()))
    }

    /// Whether this image was found clean by this trivy and ignore file.
    pub fn holds(&self, id: &str) -> bool {
        self.file(id).is_file()
    }

    /// Keeps that this image was found clean (its tag, for whoever reads the folder).
    pub fn record(&self, id: &str, tag: &str) -> anyhow::Result<()> {
        Ok(std::fs::write(self.file(id), format!("{tag} {id}\n"))?)
    }
}

/// What trivy reported of an image: its findings, as `ID: title (where)`, and what it read, as
/// `class type target` for each result (the image's own name left out of the target), by which
/// two ways of reading the same image are compared.
pub struct Scanned {
    pub found: Vec<String>,
    pub read: Vec<String>,
}

/// trivy's secret and misconfiguration scans of an image (no vulnerability database: nothing is
/// downloaded), with the root's .trivyignore. `image`: an image of the local engine
/// (`--image-src docker`, the engine exporting it), or `--input` and an OCI layout
/// ([`oci_layouts`]). `cache`: trivy's, where the layers it read are kept, so that the layers
/// images share are read once.
pub fn trivy_image(image: &[&std::ffi::OsStr], cache: &std::path::Path) -> anyhow::Result<Scanned> {
    let (ok, said) =
        run(Command::new(scanner("trivy")?).args(IMAGE_SCAN).arg("--cache-dir").arg(cache).args(image))?;
    anyhow::ensure!(ok, "trivy image {image:?} failed: {said}");
    let report: serde_json::Value = serde_json::from_str(&said)?;
    let artifact = report["ArtifactName"].as_str().unwrap_or_default();
    let mut found = Vec::new();
    let mut read = Vec::new();
    for result in report["Results"].as_array().into_iter().flatten() {
        let target = result["Target"].as_str().unwrap_or_default();
        read.push(format!(
            "{} {} {}",
            result["Class"].as_str().unwrap_or_default(),
            result["Type"].as_str().unwrap_or_default(),
            target.strip_prefix(artifact).unwrap_or(target).trim()
        ));
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
    Ok(Scanned { found, read })
}
