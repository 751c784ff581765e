//! `cargo xtask publish` and `cargo xtask digests`: push the images (parents first), read each
//! manifest back from the registry, check it is the image pushed, and pin `repository@digest`
//! in images.lock.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::build::{self, BuildOptions};
use crate::engine::{Engine, EngineError, PushFailure};
use crate::lock::ImagesLock;
use crate::platform::Platform;
use crate::registry::{self, PlatformManifest, Registry};

/// What `publish` does, resolved from flags or set by tests.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub build: BuildOptions,
    pub registry: Registry,
    pub dry_run: bool,
    /// The first retry waits this long; each next one twice as long.
    pub backoff: Duration,
    pub attempts: u32,
    /// The platforms whose images go into each image's index (the host's when empty).
    pub platforms: Vec<Platform>,
}

/// One image published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub name: String,
    pub pinned: String,
}

pub async fn publish(opts: &PublishOptions) -> anyhow::Result<Vec<Published>> {
    let platforms = if opts.platforms.is_empty() { vec![Platform::host()] } else { opts.platforms.clone() };
    let mut reports = Vec::new();
    for (platform, report) in platforms.iter().zip(build::build_platforms(&opts.build, &platforms).await) {
        let report = report.with_context(|| format!("cannot build for {platform}"))?;
        report.ensure_success()?;
        reports.push((*platform, report));
    }
    let revision = opts.build.revision_or_git();
    let names: Vec<String> = reports[0].1.results.iter().map(|r| r.name.clone()).collect();
    let credentials = registry::credentials(&opts.registry.host);
    if opts.dry_run {
        for name in &names {
            for (platform, report) in &reports {
                let id = report.id(name).context("built")?;
                println!(
                    "would push {}:{} ({}) as {}",
                    opts.registry.repository(name),
                    platform_tag(crate::project::VERSION, *platform),
                    &id[..19.min(id.len())],
                    credentials.as_ref().map_or("anonymous".to_string(), |c| c.username.clone())
                );
            }
        }
        return Ok(Vec::new());
    }
    let engine = Engine::connect().await?;
    let mut lock = ImagesLock::read(&opts.build.lock_path)?;
    let mut published = Vec::new();
    for name in &names {
        let started = Instant::now();
        let repository = opts.registry.repository(name);
        let mut tags = vec![crate::project::VERSION.to_string()];
        tags.extend(revision.as_ref().map(|r| format!("sha-{r}")));
        // Each platform's image under its own tags (`<tag>-amd64`), read back and checked.
        let mut manifests = Vec::new();
        for (platform, report) in &reports {
            let id = report.id(name).context("built")?.to_string();
            for tag in &tags {
                let tag = platform_tag(tag, *platform);
                engine.tag(&id, &repository, &tag).await?;
                push_with_retries(&engine, &repository, &tag, credentials.as_ref(), opts).await?;
            }
            let (tag, image) = (platform_tag(crate::project::VERSION, *platform), name.clone());
            let (digest, bytes) =
                blocking(opts, move |registry, creds| registry::manifest(registry, &image, &tag, creds))
                    .await?;
            registry::check_manifest(&opts.registry, &bytes, &id)?;
            manifests.push(PlatformManifest::of(*platform, &digest, &bytes));
        }
        // One index of them under the plain tags, read back: what `docker pull` resolves by
        // platform, and what the lock pins.
        let index = registry::image_index(&manifests)?;
        for tag in &tags {
            let (tag, index, image) = (tag.clone(), index.clone(), name.clone());
            blocking(opts, move |registry, creds| {
                registry::put_manifest(registry, &image, &tag, MEDIA_TYPE_INDEX, &index, creds)
            })
            .await?;
        }
        let image = name.clone();
        let (digest, bytes) = blocking(opts, move |registry, creds| {
            registry::index(registry, &image, crate::project::VERSION, creds)
        })
        .await?;
        registry::check_index(&opts.registry, &bytes, &manifests)?;
        anyhow::ensure!(
            bytes == index,
            "the registry {} serves {repository}:{} as other bytes than the index put",
            opts.registry.host,
            crate::project::VERSION
        );
        let pinned = format!("{repository}@{digest}");
        eprintln!(
            "{name}: pushed {} platform(s) and their index, {pinned} ({:.1}s)",
            manifests.len(),
            started.elapsed().as_secs_f64()
        );
        if let Some(entry) = lock.images.get_mut(name) {
            entry.pinned = Some(pinned.clone());
        }
        published.push(Published { name: name.clone(), pinned });
    }
    // Only once every image is published and read back: a failure leaves the lock as it was.
    lock.write(&opts.build.lock_path)?;
    Ok(published)
}

const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// A platform's own tag in the registry: `<tag>-amd64`, `<tag>-arm64` (the plain tag is the
/// index's).
pub fn platform_tag(tag: &str, platform: Platform) -> String {
    format!("{tag}-{}", platform.debian_arch())
}

/// Runs a blocking registry call with the options' registry and credentials.
async fn blocking<T: Send + 'static>(
    opts: &PublishOptions,
    call: impl FnOnce(&Registry, Option<&registry::Credentials>) -> Result<T, registry::RegistryError>
    + Send
    + 'static,
) -> anyhow::Result<T> {
    let (registry, credentials) = (opts.registry.clone(), registry::credentials(&opts.registry.host));
    Ok(tokio::task::spawn_blocking(move || call(&registry, credentials.as_ref())).await??)
}

async fn push_with_retries(
    engine: &Engine,
    repository: &str,
    tag: &str,
    credentials: Option<&registry::Credentials>,
    opts: &PublishOptions,
) -> anyhow::Result<()> {
    let mut wait = opts.backoff;
    for attempt in 1..=opts.attempts.max(1) {
        let result = engine
            .push(repository, tag, credentials, |status| {
                if status.starts_with("Pushed") || status.starts_with("Layer already exists") {
                    eprint!(".");
                }
            })
            .await;
        match result {
            Ok(()) => return Ok(()),
            Err(EngineError::Push { kind: PushFailure::Unauthorized, message, .. }) => {
                let host = repository.split('/').next().unwrap_or(repository);
                anyhow::bail!(
                    "the registry {host} refused the credentials for {repository}:{tag}: {message}\n\
                     Set {} and {}, GITHUB_TOKEN for ghcr.io, or `docker login {host}`.",
                    registry::USER_ENV,
                    registry::PASSWORD_ENV
                );
            }
            Err(EngineError::Push { kind: PushFailure::Transient, message, .. })
                if attempt < opts.attempts =>
            {
                eprintln!("{repository}:{tag}: attempt {attempt} failed ({message}); retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot publish {repository}:{tag}")),
        }
    }
    unreachable!("the last attempt returns")
}

impl crate::flags::PublishFlags {
    pub async fn run(self, root: &std::path::Path) -> anyhow::Result<()> {
        let mut build = crate::build::BuildOptions::new(root);
        self.common.apply(&mut build);
        build.images = self.images;
        let opts = PublishOptions {
            build,
            registry: crate::registry::Registry::parse(&self.registry)?,
            dry_run: self.dry_run,
            backoff: std::time::Duration::from_secs(2),
            attempts: 4,
            platforms: self.platform,
        };
        let published = publish(&opts).await?;
        if !opts.dry_run {
            eprintln!("{} images published; pinned in {}", published.len(), opts.build.lock_path.display());
            print!("{}", digests(&ImagesLock::read(&opts.build.lock_path)?, DigestFormat::Text));
        }
        Ok(())
    }
}

impl crate::flags::DigestsFlags {
    pub fn run(self, root: &std::path::Path) -> anyhow::Result<()> {
        let lock = ImagesLock::read(&root.join(crate::lock::FILE_NAME))?;
        let format = if self.json {
            DigestFormat::Json
        } else if self.markdown {
            DigestFormat::Markdown
        } else {
            DigestFormat::Text
        };
        if lock.images.values().all(|e| e.pinned.is_none()) {
            eprintln!(
                "no image in images.lock is published yet (cargo xtask publish --registry HOST/NAMESPACE)"
            );
        }
        print!("{}", digests(&lock, format));
        Ok(())
    }
}

/// How `digests` prints the pinned references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DigestFormat {
    Text,
    Json,
    Markdown,
}

pub fn digests(lock: &ImagesLock, format: DigestFormat) -> String {
    let pinned: Vec<(&String, &String)> =
        lock.images.iter().filter_map(|(name, entry)| entry.pinned.as_ref().map(|p| (name, p))).collect();
    match format {
        DigestFormat::Text => pinned.iter().map(|(name, p)| format!("{name}\t{p}\n")).collect(),
        DigestFormat::Json => {
            let map: serde_json::Map<String, serde_json::Value> =
                pinned.iter().map(|(n, p)| (n.to_string(), serde_json::Value::from(p.as_str()))).collect();
            format!("{}\n", serde_json::to_string_pretty(&map).unwrap_or_default())
        }
        DigestFormat::Markdown => {
            let mut out = String::from("| image | pinned reference |\n| --- | --- |\n");
            for (name, p) in pinned {
                out.push_str(&format!("| {name} | `{p}` |\n"));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_in_three_formats() {
        let mut lock = ImagesLock::default();
        for (name, pinned) in [
            ("base", Some("r/agent-base@sha256:aa")),
            ("os", None),
            ("shell", Some("r/agent-shell@sha256:bb")),
        ] {
            lock.images.insert(
                name.into(),
                crate::lock::LockedImage {
                    parent: None,
                    inputs: [("linux/amd64".to_string(), "sha256:1".to_string())].into(),
                    args: Default::default(),
                    pinned: pinned.map(str::to_string),
                },
            );
        }
        insta::assert_snapshot!("digests_text", digests(&lock, DigestFormat::Text));
        insta::assert_snapshot!("digests_json", digests(&lock, DigestFormat::Json));
        insta::assert_snapshot!("digests_markdown", digests(&lock, DigestFormat::Markdown));
    }

    #[test]
    fn push_failures_are_classified() {
        assert_eq!(PushFailure::classify("unauthorized: authentication required"), PushFailure::Unauthorized);
        assert_eq!(
            PushFailure::classify(
                "Get \"http://127.0.0.1:5999/v2/\": dial tcp 127.0.0.1:5999: connect: connection refused"
            ),
            PushFailure::Transient
        );
        assert_eq!(
            PushFailure::classify("received unexpected HTTP status: 503 Service Unavailable"),
            PushFailure::Transient
        );
        assert_eq!(PushFailure::classify("manifest invalid"), PushFailure::Other);
    }
}
