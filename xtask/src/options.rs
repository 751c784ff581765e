//! What a build is asked to do (`BuildOptions`): the checkout, the images, the OS layer's
//! source, the tag prefix, the extra CA, `--locked`; from the command line or, in the suites,
//! from the variables `cargo xtask test` exports.

use std::path::{Path, PathBuf};

use crate::os::{Bootstrap, OsSource};
use crate::progress::ProgressMode;
use crate::project;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The workspace: sandbox-init's sources and the git checkout.
    pub root: PathBuf,
    pub images_dir: PathBuf,
    pub lock_path: PathBuf,
    /// The images to build (with their ancestors); empty means all.
    pub images: Vec<String>,
    pub jobs: usize,
    /// The platform this build's chain is for (the host's unless `--platform` says otherwise).
    pub platform: crate::platform::Platform,
    /// `None`: mirror where mmdebstrap is installed, else registry.
    pub os_source: Option<OsSource>,
    pub bootstrap: Bootstrap,
    pub refresh_os: bool,
    pub prefix: String,
    pub ca_bundle: Option<PathBuf>,
    /// Verify only: fail if anything would differ from the lock.
    pub locked: bool,
    /// The commit the images' labels and `sha-` tags name; `None`: the checkout's, from git. The
    /// build suites' scratch copies fix it, so that their OS image (whose labels are all that a
    /// rebuild changes) keeps its id from one commit to the next and the engine's cache keeps
    /// every layer built on it.
    pub revision: Option<String>,
    pub progress: ProgressMode,
}

impl BuildOptions {
    /// Defaults, overridden by the variables `cargo xtask test` sets (see [`Self::export_env`]).
    pub fn from_env(root: &Path) -> anyhow::Result<BuildOptions> {
        let mut opts = BuildOptions::new(root);
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(source) = var(project::OS_SOURCE_ENV) {
            opts.os_source = Some(<OsSource as clap::ValueEnum>::from_str(&source, true).map_err(|_| {
                anyhow::anyhow!("{}={source}: expected mirror or registry", project::OS_SOURCE_ENV)
            })?);
        }
        if let Some(mirror) = var(crate::os::MIRROR_ENV) {
            opts.bootstrap.mirror = mirror;
        }
        if let Some(security) = var(crate::os::SECURITY_MIRROR_ENV) {
            opts.bootstrap.security_mirror = (security != "none").then_some(security);
        }
        if let Some(prefix) = var(project::PREFIX_ENV) {
            opts.prefix = prefix;
        }
        opts.ca_bundle = var(project::CA_BUNDLE_ENV).map(PathBuf::from);
        opts.progress = ProgressMode::Plain;
        Ok(opts)
    }

    /// The commit the images name: [`Self::revision`], else the checkout's (git; `None` outside
    /// a checkout).
    pub fn revision_or_git(&self) -> Option<String> {
        self.revision.clone().or_else(|| project::git_revision(&xshell::Shell::new().ok()?, &self.root))
    }

    /// The variables [`Self::from_env`] reads, for a child process.
    pub fn export_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            (crate::os::MIRROR_ENV, self.bootstrap.mirror.clone()),
            (
                crate::os::SECURITY_MIRROR_ENV,
                self.bootstrap.security_mirror.clone().unwrap_or_else(|| "none".into()),
            ),
            (project::PREFIX_ENV, self.prefix.clone()),
        ];
        if let Some(source) = self.os_source {
            vars.push((project::OS_SOURCE_ENV, source.to_string()));
        }
        if let Some(ca) = &self.ca_bundle {
            vars.push((project::CA_BUNDLE_ENV, ca.display().to_string()));
        }
        vars
    }

    pub fn new(root: &Path) -> BuildOptions {
        BuildOptions {
            root: root.to_path_buf(),
            images_dir: root.join("images"),
            lock_path: root.join(crate::lock::FILE_NAME),
            images: Vec::new(),
            jobs: 2,
            platform: crate::platform::Platform::host(),
            os_source: None,
            bootstrap: Bootstrap::default(),
            refresh_os: false,
            prefix: project::DEFAULT_PREFIX.to_string(),
            ca_bundle: None,
            locked: false,
            revision: None,
            progress: ProgressMode::Auto,
        }
    }
}
