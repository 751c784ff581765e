//! `cargo xtask build`: the command. What a build is asked is options.rs, what it did
//! report.rs, the walk that builds walk.rs, and what each image's build is plan.rs.

use std::path::Path;

use crate::platform::Platform;
use crate::progress::ProgressMode;

pub use crate::options::BuildOptions;
pub use crate::plan::{BuildPlan, short};
pub use crate::report::{BuildReport, ImageResult, Outcome};

/// Builds (or, with `locked`, verifies) the selected images. Failures of single images are in
/// the report (see [`BuildReport::ensure_success`]); errors are for what stops the whole walk.
pub async fn build(opts: &BuildOptions) -> anyhow::Result<BuildReport> {
    crate::walk::run(opts).await
}

impl crate::flags::CommonBuildFlags {
    /// The build options these flags set.
    pub fn apply(&self, opts: &mut BuildOptions) {
        opts.jobs = self.jobs;
        opts.os_source = self.os_source;
        opts.bootstrap.mirror = self.debian_mirror.clone();
        opts.bootstrap.security_mirror =
            (self.debian_security_mirror != "none").then(|| self.debian_security_mirror.clone());
        opts.refresh_os = self.refresh_os;
        opts.prefix = self.prefix.clone();
        opts.ca_bundle = self.ca_bundle.clone();
        opts.progress = self.progress;
    }
}

/// Builds `opts` for each of `platforms` at once, `opts.jobs` shared between them; one report
/// each, in the order given. Every walk computes every platform's input hashes, so the lock
/// each writes is the same.
pub async fn build_platforms(
    opts: &BuildOptions,
    platforms: &[Platform],
) -> Vec<anyhow::Result<BuildReport>> {
    let per_platform: Vec<BuildOptions> = platforms
        .iter()
        .map(|&platform| {
            let mut opts = opts.clone();
            opts.platform = platform;
            opts.jobs = (opts.jobs / platforms.len().max(1)).max(1);
            if platforms.len() > 1 && opts.progress == ProgressMode::Auto {
                // Two sets of bars cannot share a terminal.
                opts.progress = ProgressMode::Plain;
            }
            opts
        })
        .collect();
    let walks: Vec<_> = per_platform.into_iter().map(spawn_build).collect();
    let mut reports = Vec::new();
    for walk in walks {
        reports.push(walk.await);
    }
    reports
}

/// [`build`] on a thread and runtime of its own, so that its blocking steps (cargo, mmdebstrap
/// under emulation) hold that thread alone, not another walk's.
pub fn spawn_build(opts: BuildOptions) -> impl std::future::Future<Output = anyhow::Result<BuildReport>> {
    let walk = tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(build(&opts))
    });
    async move { walk.await.map_err(|e| anyhow::anyhow!("a build walk panicked: {e}"))? }
}

impl crate::flags::BuildFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let mut opts = BuildOptions::new(root);
        self.common.apply(&mut opts);
        opts.images = self.images;
        opts.locked = self.locked;
        let mut platforms = self.platform;
        platforms.dedup();
        if platforms.is_empty() {
            platforms.push(Platform::host());
        }
        let mut failed = Vec::new();
        for (platform, report) in platforms.iter().zip(build_platforms(&opts, &platforms).await) {
            let report = match report.and_then(|report| report.ensure_success().map(|()| report)) {
                Ok(report) => report,
                Err(e) if platforms.len() > 1 => {
                    failed.push(e.context(format!("the build for {platform} failed")));
                    continue;
                }
                Err(e) => return Err(e),
            };
            eprintln!(
                "{platform}: {} images: {} built, {} up to date (OS layer: {}); {} {}",
                report.results.len(),
                report.built().len(),
                report.up_to_date().len(),
                report.os_source,
                if opts.locked { "verified against" } else { "recorded in" },
                opts.lock_path.display()
            );
        }
        // One platform's failure is the error; of several, each is printed and the first returned.
        let first = failed.pop();
        for e in failed {
            eprintln!("error: {e:#}");
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keeps_twelve_hex_digits() {
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
    }
}
