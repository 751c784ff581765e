//! The OS layer: Debian 13 (trixie) bootstrapped with mmdebstrap (`mirror`), or the pinned
//! `debian:trixie-slim` from a registry (`registry`).
//!
//! The bootstrap is loaded as an image whose configuration is written here (with oci-spec's
//! types) rather than imported: with SOURCE_DATE_EPOCH fixed, mmdebstrap's tar is the same bytes
//! every time, and so is the configuration, so the image id (the configuration's digest) is too.

use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use oci_spec::image::{Arch, ConfigBuilder, HistoryBuilder, ImageConfigurationBuilder, Os, RootFsBuilder};
use sha2::{Digest, Sha256};
use xshell::{Shell, cmd};

use crate::engine::Engine;
use crate::platform::Platform;

pub use crate::graph::OS_ARG;
pub const SUITE: &str = "trixie";
pub const MIRROR_ENV: &str = "AGENT_SANDBOX_DEBIAN_MIRROR";
pub const SECURITY_MIRROR_ENV: &str = "AGENT_SANDBOX_DEBIAN_SECURITY_MIRROR";
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
pub const DEFAULT_SECURITY_MIRROR: &str = "http://deb.debian.org/debian-security";
/// 2025-08-09, the day Debian 13 was released. Any fixed value gives reproducible output; this
/// one keeps file dates plausible.
pub const DEFAULT_SOURCE_DATE_EPOCH: i64 = 1_754_697_600;
/// Where bootstraps are kept, whatever prefix the graph is tagged with.
const BOOTSTRAP_REPOSITORY: &str = "localhost/agent-sandbox/bootstrap";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OsSource {
    /// Bootstrap Debian with mmdebstrap from a Debian archive (reproducible)
    Mirror,
    /// Use the Dockerfile's `debian:trixie-slim@sha256:…`, pulled from its registry
    Registry,
}

impl OsSource {
    /// Mirror where mmdebstrap is installed, else registry.
    pub fn detect() -> OsSource {
        if crate::project::on_path("mmdebstrap") { OsSource::Mirror } else { OsSource::Registry }
    }
}

/// Where the OS layer comes from for one build.
pub struct OsLayer<'a> {
    pub source: OsSource,
    pub bootstrap: &'a Bootstrap,
    /// Bootstrap again even if an earlier bootstrap with the same settings exists.
    pub refresh: bool,
    /// The platform the layer is for: mmdebstrap bootstraps its Debian architecture.
    pub platform: Platform,
}

impl OsLayer<'_> {
    /// The image root images are built on instead of `reference` (their Dockerfile's pinned
    /// default): the mirror bootstrap's id, or None for the registry source, which builds on
    /// `reference` itself once it is pulled (with a clear error when no registry is reachable).
    pub async fn image(
        &self,
        reference: &str,
        engine: &Engine,
        sh: &Shell,
        progress: &crate::progress::Progress,
    ) -> anyhow::Result<Option<String>> {
        match self.source {
            OsSource::Mirror => {
                progress.note(&format!(
                    "OS layer: mmdebstrap bootstrap of {} from {}",
                    self.platform.debian_arch(),
                    self.bootstrap.mirror
                ));
                Ok(Some(self.bootstrap.ensure(engine, sh, self.refresh, self.platform).await?))
            }
            OsSource::Registry if self.platform != Platform::host() => anyhow::bail!(
                "--platform {}: the OS layer of another platform than the host's comes from \
                 mmdebstrap only; use `--os-source mirror`",
                self.platform
            ),
            OsSource::Registry => {
                progress.note(&format!("OS layer: {reference} from its registry"));
                engine.ensure_pulled(reference).await.map_err(|e| {
                    anyhow::anyhow!(
                        "{e}\nno registry is reachable? use `--os-source mirror` (needs mmdebstrap)"
                    )
                })?;
                Ok(None)
            }
        }
    }
}

impl fmt::Display for OsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OsSource::Mirror => "mirror",
            OsSource::Registry => "registry",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub mirror: String,
    pub security_mirror: Option<String>,
    pub source_date_epoch: i64,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            mirror: DEFAULT_MIRROR.into(),
            security_mirror: Some(DEFAULT_SECURITY_MIRROR.into()),
            source_date_epoch: DEFAULT_SOURCE_DATE_EPOCH,
        }
    }
}

/// What dpkg leaves out of the OS layer and of every package installed on it later (mmdebstrap
/// keeps the options in /etc/dpkg/dpkg.cfg.d/99mmdebstrap): documentation but the copyright
/// files, manuals, info pages and translations, as Debian's own slim images do.
pub const SLIM_PATHS: &[&str] = &[
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/locale/*",
];

/// What the options above cannot leave out (files of the packages unpacked before dpkg reads
/// them: base-files' FAQ, the info index), removed from the bootstrap's tree, as Debian's
/// slimming does.
const SLIM_HOOK: &str = "cd \"$1\" && find usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete \
    && find usr/share/man usr/share/info usr/share/locale usr/share/groff usr/share/lintian usr/share/linda \
       -mindepth 1 ! -type d -delete 2>/dev/null; true";

impl Bootstrap {
    fn sources(&self) -> Vec<String> {
        let mut sources = vec![format!("deb {} {SUITE} main", self.mirror)];
        if let Some(security) = &self.security_mirror {
            sources.push(format!("deb {security} {SUITE}-security main"));
        }
        sources
    }

    /// The tag a bootstrap with these settings for `platform` is kept under.
    pub fn reference(&self, platform: Platform) -> String {
        let mut h = Sha256::new();
        h.update(format!(
            "v3\n{SUITE}\nminbase\n{}\n{}\n{:?}\n{SLIM_PATHS:?}\n{SLIM_HOOK}\n",
            platform.debian_arch(),
            self.source_date_epoch,
            self.sources()
        ));
        format!("{BOOTSTRAP_REPOSITORY}:{SUITE}-{}", &format!("{:x}", h.finalize())[..12])
    }

    /// Runs mmdebstrap into `out` (a tar) for `platform`'s architecture.
    pub fn run_mmdebstrap(&self, sh: &Shell, out: &Path, platform: Platform) -> anyhow::Result<()> {
        if !crate::project::on_path("mmdebstrap") {
            anyhow::bail!(
                "mmdebstrap is not installed: install it (Debian: `sudo apt-get install mmdebstrap`) \
                 or use `--os-source registry`"
            );
        }
        if platform != Platform::host() {
            crate::emulation::ensure(platform)?;
        }
        let arch = format!("--architectures={}", platform.debian_arch());
        let epoch = self.source_date_epoch.to_string();
        let _epoch = sh.push_env("SOURCE_DATE_EPOCH", &epoch);
        let sources = self.sources();
        let mut slim: Vec<String> = SLIM_PATHS.iter().map(|p| format!("--dpkgopt={p}")).collect();
        slim.push(format!("--customize-hook={SLIM_HOOK}"));
        cmd!(
            sh,
            "mmdebstrap --variant=minbase {arch} --format=tar --quiet {slim...} {SUITE} {out} {sources...}"
        )
        .run()
        .with_context(|| {
            format!(
                "mmdebstrap could not bootstrap Debian {SUITE} from {} (is the archive reachable? \
                     choose another with --debian-mirror, or use --os-source registry)",
                self.mirror
            )
        })
    }

    /// Returns the bootstrap image's id, bootstrapping and loading it unless it already exists
    /// (or `refresh` asks for a new one, to pick up archive updates).
    pub async fn ensure(
        &self,
        engine: &Engine,
        sh: &Shell,
        refresh: bool,
        platform: Platform,
    ) -> anyhow::Result<String> {
        let reference = self.reference(platform);
        if !refresh && let Some(id) = engine.image_id(&reference).await? {
            return Ok(id);
        }
        let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
        let tar = dir.path().join("rootfs.tar");
        eprintln!(
            "bootstrapping Debian {SUITE} ({}) from {} with mmdebstrap",
            platform.debian_arch(),
            self.mirror
        );
        self.run_mmdebstrap(sh, &tar, platform)?;
        let rootfs = std::fs::read(&tar).with_context(|| format!("cannot read {}", tar.display()))?;
        let (archive, id) = self.image_archive(rootfs, &reference, platform)?;
        engine.load(archive).await.context("cannot load the bootstrapped OS image")?;
        Ok(id)
    }

    /// A `docker save`-format archive holding one image for `platform`: `rootfs` as its single
    /// layer. Returns the archive and the image id the engine will give it. The configuration
    /// names the platform itself (`docker import --platform` would record the host's), and every
    /// image built on it inherits it.
    pub fn image_archive(
        &self,
        rootfs: Vec<u8>,
        tag: &str,
        platform: Platform,
    ) -> anyhow::Result<(Vec<u8>, String)> {
        let layer_digest = format!("{:x}", Sha256::digest(&rootfs));
        let created = rfc3339(self.source_date_epoch);
        let architecture = match platform {
            Platform::Amd64 => Arch::Amd64,
            Platform::Arm64 => Arch::ARM64,
        };
        let mut config = ImageConfigurationBuilder::default()
            .created(created.clone())
            .architecture(architecture)
            .os(Os::Linux)
            .config(
                ConfigBuilder::default()
                    .env(vec![
                        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
                    ])
                    .cmd(vec!["bash".to_string()])
                    .build()?,
            )
            .rootfs(RootFsBuilder::default().diff_ids(vec![format!("sha256:{layer_digest}")]).build()?)
            .history(vec![
                HistoryBuilder::default()
                    .created(created)
                    .created_by(format!(
                        "mmdebstrap --variant=minbase {SLIM_PATHS:?} {SUITE} {:?}",
                        self.sources()
                    ))
                    .build()?,
            ])
            .build()?;
        config.set_variant(platform.variant().map(str::to_string));
        let config = serde_json::to_vec(&config)?;
        let config_digest = format!("{:x}", Sha256::digest(&config));
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": format!("{config_digest}.json"),
            "RepoTags": [tag],
            "Layers": [format!("{layer_digest}/layer.tar")],
        }]))?;

        let mut builder = tar::Builder::new(Vec::with_capacity(rootfs.len() + 4096));
        let mut append = |path: &str, data: &[u8]| -> std::io::Result<()> {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(self.source_date_epoch.max(0) as u64);
            builder.append_data(&mut header, path, data)
        };
        append(&format!("{layer_digest}/layer.tar"), &rootfs)?;
        append(&format!("{config_digest}.json"), &config)?;
        append("manifest.json", &manifest)?;
        Ok((builder.into_inner()?, format!("sha256:{config_digest}")))
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time.
fn rfc3339(epoch: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(epoch)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(DEFAULT_SOURCE_DATE_EPOCH), "2025-08-09T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3661), "2000-02-29T01:01:01Z");
    }

    #[test]
    fn the_archive_is_deterministic_and_names_its_config_digest() {
        let b = Bootstrap::default();
        let (a1, id1) = b.image_archive(b"layer bytes".to_vec(), "x:y", Platform::Amd64).unwrap();
        let (a2, id2) = b.image_archive(b"layer bytes".to_vec(), "x:y", Platform::Amd64).unwrap();
        assert_eq!((a1.clone(), &id1), (a2, &id2));
        let (_, other) = b.image_archive(b"other bytes".to_vec(), "x:y", Platform::Amd64).unwrap();
        assert_ne!(id1, other, "the layer is part of the identity");
        let (arm64, arm64_id) = b.image_archive(b"layer bytes".to_vec(), "x:y", Platform::Arm64).unwrap();
        assert_ne!(id1, arm64_id, "the platform is part of the identity");
        let config = |archive: Vec<u8>| -> serde_json::Value {
            let mut archive = tar::Archive::new(std::io::Cursor::new(archive));
            let mut entry = archive
                .entries()
                .unwrap()
                .map(Result::unwrap)
                .find(|e| {
                    e.path().unwrap().to_string_lossy().ends_with(".json")
                        && e.path().unwrap().to_string_lossy() != "manifest.json"
                })
                .unwrap();
            serde_json::from_reader(&mut entry).unwrap()
        };
        let (amd64, arm64) = (config(a1.clone()), config(arm64));
        assert_eq!((amd64["architecture"].as_str(), amd64.get("variant")), (Some("amd64"), None));
        assert_eq!((arm64["architecture"].as_str(), arm64["variant"].as_str()), (Some("arm64"), Some("v8")));

        let mut archive = tar::Archive::new(std::io::Cursor::new(a1));
        let mut config = None;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            if path.ends_with(".json") && path != "manifest.json" {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
                config = Some((path, bytes));
            }
        }
        let (path, bytes) = config.expect("a config in the archive");
        assert_eq!(format!("sha256:{:x}", Sha256::digest(&bytes)), id1);
        assert_eq!(path, format!("{}.json", id1.trim_start_matches("sha256:")));
    }

    #[test]
    fn the_reference_changes_with_every_setting() {
        let b = Bootstrap::default();
        let mut other_epoch = b.clone();
        other_epoch.source_date_epoch += 1;
        let mut other_mirror = b.clone();
        other_mirror.mirror = "http://mirror.example/debian".into();
        let mut no_security = b.clone();
        no_security.security_mirror = None;
        let refs = [
            b.reference(Platform::Amd64),
            b.reference(Platform::Arm64),
            other_epoch.reference(Platform::Amd64),
            other_mirror.reference(Platform::Amd64),
            no_security.reference(Platform::Amd64),
        ];
        for (i, r) in refs.iter().enumerate() {
            assert!(r.starts_with("localhost/agent-sandbox/bootstrap:trixie-"), "{r}");
            assert!(refs.iter().skip(i + 1).all(|o| o != r), "{refs:?}");
        }
    }
}
