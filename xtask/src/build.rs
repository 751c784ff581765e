//! `cargo xtask build`: the command. What a build is asked is options.rs, what it did
//! report.rs, the walk that builds walk.rs, and what each image's build is plan.rs.

use std::path::Path;

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

impl crate::flags::BuildFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let mut opts = BuildOptions::new(root);
        self.common.apply(&mut opts);
        opts.images = self.images;
        opts.locked = self.locked;
        let report = build(&opts).await?;
        report.ensure_success()?;
        eprintln!(
            "{} images: {} built, {} up to date (OS layer: {}); {} {}",
            report.results.len(),
            report.built().len(),
            report.up_to_date().len(),
            report.os_source,
            if opts.locked { "verified against" } else { "recorded in" },
            opts.lock_path.display()
        );
        Ok(())
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
