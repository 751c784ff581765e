//! The images the suites run: the repository's, built or found up to date through the xtask
//! library with the settings `cargo xtask test` exported; the peer images; the static probe; and
//! scratch copies of images/ for the build suites.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use xtask::build::BuildOptions;
use xtask::engine::Engine;
use xtask::platform::Platform;
use xtask::progress::ProgressMode;

use crate::docker::{TEST_LABEL, drop_async};
use crate::probe::probe_binary;
use crate::root;

/// The image `name`, built or found up to date through the xtask library with the settings
/// `cargo xtask test` exported.
pub async fn image(name: &str) -> anyhow::Result<String> {
    image_for(name, Platform::host()).await
}

/// The image `name` for `platform` (another than the host's runs under emulation), built or
/// found up to date: its tag.
pub async fn image_for(name: &str, platform: Platform) -> anyhow::Result<String> {
    if platform == Platform::host()
        && let Some(tag) = built_before_the_run(name).await
    {
        return Ok(tag);
    }
    let report = built_for(&[name], platform).await?;
    report.id(name).context("the build reported no id")?;
    Ok(tag_of(&report.prefix, name, platform))
}

fn tag_of(prefix: &str, name: &str, platform: Platform) -> String {
    format!("{}:{}", xtask::project::repository(prefix, name), platform.tag(xtask::project::VERSION))
}

/// The host's image `name` as `cargo xtask test` built it before the suites started
/// ([`xtask::project::SUITE_IMAGES_ENV`]), if its tag still names that image: a build walk in
/// each test process (hashing every context, a lock shared by them all) costs a fifth of a
/// CPU-second, an inspection a hundredth. Else (a test started outside the xtask, or a tag
/// moved since) `None`, and the caller walks.
async fn built_before_the_run(name: &str) -> Option<String> {
    let words = std::env::var(xtask::project::SUITE_IMAGES_ENV).ok()?;
    let id = xtask::report::BuildReport::suite_image(&words, name)?;
    let tag = tag_of(&BuildOptions::from_env(&root()).ok()?.prefix, name, Platform::host());
    let found = crate::docker::docker().await.ok()?.inspect_image(&tag).await.ok()?.id?;
    (found == id).then_some(tag)
}

/// The repository's images `names` (all when empty), built or found up to date. Builds are
/// serialised across test processes by a file lock.
pub async fn built(names: &[&str]) -> anyhow::Result<BuiltImages> {
    built_for(names, Platform::host()).await
}

/// [`built`] for `platform`.
pub async fn built_for(names: &[&str], platform: Platform) -> anyhow::Result<BuiltImages> {
    let root = root();
    let lock_dir = root.join("target/agent-sandbox");
    std::fs::create_dir_all(&lock_dir)?;
    let lock = std::fs::File::create(lock_dir.join("suite-build.lock"))?;
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        lock.lock()?;
        let mut opts = xtask::build::BuildOptions::from_env(&root)?;
        opts.images = names;
        opts.platform = platform;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let report = rt.block_on(xtask::build::build(&opts))?;
        report.ensure_success()?;
        Ok(BuiltImages { report, prefix: opts.prefix })
    })
    .await?
}

/// A build report and the tag prefix it was built under.
pub struct BuiltImages {
    pub report: xtask::build::BuildReport,
    pub prefix: String,
}

impl std::ops::Deref for BuiltImages {
    type Target = xtask::build::BuildReport;
    fn deref(&self) -> &Self::Target {
        &self.report
    }
}

/// The peer image: the OS image and the probe binary, tagged by their hash.
pub async fn peer_image() -> anyhow::Result<String> {
    // A test starts several peers: find or build the image once per test process.
    static PEER: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    PEER.get_or_try_init(|| build_probe_image("os", "test-peer", "", Vec::new())).await.cloned()
}

/// The forge peer's image: the base image (git, tar, gzip) and the probe binary, run as root
/// with the probe as its entrypoint in place of sandbox-init; tagged by their hash.
pub async fn forge_peer_image() -> anyhow::Result<String> {
    static FORGE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    FORGE
        .get_or_try_init(|| build_probe_image("base", "test-forge-peer", "USER root\n", Vec::new()))
        .await
        .cloned()
}

/// Where the wire suite's nginx peer has nginx, its loader and the libraries it links.
pub const NGINX_PREFIX: &str = "/opt/nginx";

/// The wire suite's nginx peer: the peer image with Debian's nginx (which `cargo xtask setup
/// --tests` unpacks in the ci-tools folder, `xtask::setup::ci_tools`) and the libraries it links on this machine,
/// copied under [`NGINX_PREFIX`] and run by their own loader
/// (`/opt/nginx/ld.so --library-path /opt/nginx/lib /opt/nginx/nginx`), so that nothing of the OS
/// image's libraries is mixed in. Nothing is fetched: without setup's copy it says so.
pub async fn nginx_peer_image() -> anyhow::Result<String> {
    static NGINX: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    NGINX
        .get_or_try_init(|| async {
            let nginx = xtask::setup::ci_tools(&root()).join(xtask::setup::NGINX_DIR).join("usr/sbin/nginx");
            anyhow::ensure!(
                nginx.is_file(),
                "{} is missing: `cargo xtask setup --tests` unpacks Debian's nginx there",
                nginx.display()
            );
            let ldd = std::process::Command::new("ldd").arg(&nginx).output()?;
            anyhow::ensure!(
                ldd.status.success(),
                "ldd {}: {}",
                nginx.display(),
                String::from_utf8_lossy(&ldd.stderr)
            );
            let mut files = vec![("nginx/nginx".to_string(), 0o755, std::fs::read(&nginx)?)];
            for line in String::from_utf8_lossy(&ldd.stdout).lines() {
                // `libz.so.1 => /lib/…/libz.so.1 (0x…)`, and the loader as `/lib64/ld-linux….so.2 (0x…)`.
                let path = match line.split_once("=>") {
                    Some((_, right)) => right.split_whitespace().next(),
                    None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
                };
                let Some(path) = path else { continue };
                let name =
                    std::path::Path::new(path).file_name().context("a library's name")?.to_string_lossy();
                let into = if name.starts_with("ld-linux") {
                    "nginx/ld.so".to_string()
                } else {
                    format!("nginx/lib/{name}")
                };
                files.push((into, 0o755, std::fs::read(path)?));
            }
            build_probe_image("os", "test-nginx-peer", &format!("COPY nginx {NGINX_PREFIX}\n"), files).await
        })
        .await
        .cloned()
}

/// The repository's image `from` with the probe, `files` (in the build context, by path) and
/// `extra` Dockerfile lines, the probe its entrypoint, tagged `localhost/agent-sandbox/NAME:HASH`:
/// found if built before, else built.
async fn build_probe_image(
    from: &str,
    name: &str,
    extra: &str,
    files: Vec<(String, u32, Vec<u8>)>,
) -> anyhow::Result<String> {
    let from_image = image(from).await?;
    let probe = std::fs::read(probe_binary()?)?;
    let engine = Engine::connect().await?;
    let from_id =
        engine.image_id(&from_image).await?.with_context(|| format!("the {from} image is missing"))?;
    let mut context = xtask::context::BuildContext::default();
    let dockerfile = format!(
        "ARG OS\nFROM ${{OS}}\nCOPY sandbox-probe /usr/local/bin/sandbox-probe\n{extra}ENTRYPOINT [\"/usr/local/bin/sandbox-probe\"]\n"
    );
    context.insert("Dockerfile", 0o644, dockerfile.into_bytes());
    context.insert("sandbox-probe", 0o755, probe);
    for (path, mode, data) in files {
        context.insert(&path, mode, data);
    }
    let args: std::collections::BTreeMap<String, String> = [("OS".to_string(), from_id.clone())].into();
    let hash = context.input_hash(&args, &from_id);
    let tag = format!("localhost/agent-sandbox/{name}:{}", &hash["sha256:".len()..][..16]);
    if engine.image_id(&tag).await?.is_none() {
        let labels = HashMap::from([(TEST_LABEL.to_string(), "peer".to_string())]);
        let id = engine
            .build(context.to_tar(), &args.into_iter().collect(), &labels, |_| {})
            .await
            .map_err(|e| anyhow::anyhow!("cannot build the {name} image: {e}"))?;
        let (repo, tag_name) = tag.split_once(':').expect("tagged");
        engine.tag(&id, repo, tag_name).await?;
    }
    Ok(tag)
}

/// A scratch copy of images/ with its own lock file and tag prefix, so a test can change files
/// and build without touching the repository or the images users see. Tags under the prefix are
/// removed when it is dropped.
pub struct ScratchImages {
    dir: tempfile::TempDir,
    pub prefix: String,
}

impl ScratchImages {
    /// Copies the named images (all when empty) of the repository.
    pub fn copy(test: &str, only: &[&str]) -> anyhow::Result<ScratchImages> {
        let dir = tempfile::tempdir()?;
        copy_dir(&root().join("images"), &dir.path().join("images"), only)?;
        // Images bake policies/<image>.yaml and policies/services.yaml is compiled in.
        copy_dir(&root().join("policies"), &dir.path().join("policies"), &[])?;
        let prefix = format!("localhost/agent-sandbox-test-{test}-{}", std::process::id());
        Ok(ScratchImages { dir, prefix })
    }

    pub fn images_dir(&self) -> PathBuf {
        self.dir.path().join("images")
    }

    pub fn lock_path(&self) -> PathBuf {
        self.dir.path().join("images.lock")
    }

    /// Build options resolved like `cargo xtask test` does, pointed at this copy.
    pub fn options(&self) -> anyhow::Result<BuildOptions> {
        let mut opts = BuildOptions::from_env(&root())?;
        opts.images_dir = self.images_dir();
        opts.lock_path = self.lock_path();
        opts.prefix = self.prefix.clone();
        opts.progress = ProgressMode::Plain;
        // Not the commit's: each commit would give the scratch OS image new labels, a new id,
        // and every layer above it (base's take half a minute) would be built again.
        opts.revision = Some(SCRATCH_REVISION.to_string());
        Ok(opts)
    }
}

/// The revision scratch builds' labels and `sha-` tags name.
pub const SCRATCH_REVISION: &str = "scratch";

impl Drop for ScratchImages {
    fn drop(&mut self) {
        let prefix = format!("{}/", self.prefix);
        drop_async(move || remove_tags_with_prefix(prefix));
    }
}

/// Removes every tag that starts with `prefix` (the images stay while another tag names them).
pub async fn remove_tags_with_prefix(prefix: String) {
    if let Ok(engine) = Engine::connect().await {
        for tag in engine.tags_with_prefix(&prefix).await.unwrap_or_default() {
            let _ = engine.remove_tag(&tag).await;
        }
    }
}

/// Where the suites keep images for their next run: a repository of their own, whose tags
/// `cargo xtask prune` leaves (it removes only the build's own tags).
pub const KEPT_REPOSITORY: &str = "localhost/agent-sandbox-test-kept";

/// Tags the image `id` as `KEPT_REPOSITORY:tag`, moving the tag from the image it named before.
pub fn keep(id: &str, tag: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new("docker")
        .args(["tag", id, &format!("{KEPT_REPOSITORY}:{tag}")])
        .output()?;
    anyhow::ensure!(out.status.success(), "docker tag {id}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Removes a tag when dropped, whatever the test's outcome.
pub struct RemoveTagOnDrop(pub String);

impl Drop for RemoveTagOnDrop {
    fn drop(&mut self) {
        let tag = self.0.clone();
        drop_async(move || async move {
            if let Ok(engine) = Engine::connect().await {
                let _ = engine.remove_tag(&tag).await;
            }
        });
    }
}

fn copy_dir(from: &Path, to: &Path, only: &[&str]) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if !only.is_empty() && !only.iter().any(|o| name == *o) {
            continue;
        }
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &to.join(&name), &[])?;
        } else {
            std::fs::copy(entry.path(), to.join(&name))?;
        }
    }
    Ok(())
}

/// `image` with one change to its config (a Dockerfile instruction: `ENV`, `ENTRYPOINT`), tagged
/// `tag` (removed when dropped).
pub fn with_change(image: &str, tag: &str, change: &str) -> anyhow::Result<RemoveTagOnDrop> {
    let docker = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new("docker").args(args).output()?;
        anyhow::ensure!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let id = docker(&["create", image])?;
    let committed = docker(&["commit", "--change", change, &id, tag]);
    docker(&["rm", &id])?;
    committed?;
    Ok(RemoveTagOnDrop(tag.to_string()))
}
