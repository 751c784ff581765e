//! `cargo xtask publish` and `cargo xtask digests`: push the images (parents first), read each
//! manifest back from the registry, check it is the image pushed, and pin `repository@digest`
//! in images.lock.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::build::{self, BuildOptions};
use crate::engine::{Engine, EngineError, PushFailure};
use crate::lock::ImagesLock;
use crate::registry::{self, Registry};

/// What `publish` does, resolved from flags or set by tests.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub build: BuildOptions,
    pub registry: Registry,
    pub dry_run: bool,
    /// The first retry waits this long; each next one twice as long.
    pub backoff: Duration,
    pub attempts: u32,
}

/// One image published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub name: String,
    pub pinned: String,
}

pub async fn publish(opts: &PublishOptions) -> anyhow::Result<Vec<Published>> {
    let report = build::build(&opts.build).await?;
    report.ensure_success()?;
    let revision = crate::project::git_revision(&xshell::Shell::new()?, &opts.build.root);
    let names: Vec<String> = report.results.iter().map(|r| r.name.clone()).collect();
    let credentials = registry::credentials(&opts.registry.host);
    if opts.dry_run {
        for name in &names {
            let id = report.id(name).context("built")?;
            println!(
                "would push {}:{} ({}) as {}",
                opts.registry.repository(name),
                crate::project::VERSION,
                &id[..19.min(id.len())],
                credentials.as_ref().map_or("anonymous".to_string(), |c| c.username.clone())
            );
        }
        return Ok(Vec::new());
    }
    let engine = Engine::connect().await?;
    let mut lock = ImagesLock::read(&opts.build.lock_path)?;
    let mut published = Vec::new();
    for name in &names {
        let started = Instant::now();
        let id = report.id(name).context("built")?.to_string();
        let repository = opts.registry.repository(name);
        let mut tags = vec![crate::project::VERSION.to_string()];
        tags.extend(revision.as_ref().map(|r| format!("sha-{r}")));
        for tag in &tags {
            engine.tag(&id, &repository, tag).await?;
            push_with_retries(&engine, &repository, tag, credentials.as_ref(), opts).await?;
        }
        let (registry, name_owned, version, creds) =
            (opts.registry.clone(), name.clone(), crate::project::VERSION, credentials.clone());
        let (digest, bytes) = tokio::task::spawn_blocking(move || {
            registry::manifest(&registry, &name_owned, version, creds.as_ref())
        })
        .await??;
        registry::check_manifest(&opts.registry, &bytes, &id)?;
        let pinned = format!("{repository}@{digest}");
        eprintln!("{name}: pushed {} tag(s), {pinned} ({:.1}s)", tags.len(), started.elapsed().as_secs_f64());
        if let Some(entry) = lock.images.get_mut(name) {
            entry.pinned = Some(pinned.clone());
        }
        published.push(Published { name: name.clone(), pinned });
    }
    // Only once every image is published and read back: a failure leaves the lock as it was.
    lock.write(&opts.build.lock_path)?;
    Ok(published)
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
