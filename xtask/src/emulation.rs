//! Running another platform's programs on this machine: Debian's qemu-user-static, registered
//! with the kernel's binfmt_misc, so that mmdebstrap can bootstrap that platform's Debian and the
//! engine can run its images' build steps and containers (every process under qemu-user).
//!
//! The registration is the kernel's, not a container's: it holds for every container until the
//! machine restarts. `cargo xtask setup --tests` makes it ([`register`]); a build for another
//! platform checks it first ([`ensure`]) and says how to make it.

use std::path::Path;

use anyhow::Context as _;

use crate::platform::Platform;

/// Where the kernel keeps its binfmt_misc entries.
const BINFMT_DIR: &str = "/proc/sys/fs/binfmt_misc";
/// Where Debian's qemu-user-static (and binfmt-support) put each interpreter's registration line.
const BINFMT_CONFS: &str = "/usr/lib/binfmt.d";

/// The binfmt_misc entry name of `platform`'s interpreter: `qemu-aarch64`, `qemu-x86_64`.
pub fn entry(platform: Platform) -> &'static str {
    match platform {
        Platform::Amd64 => "qemu-x86_64",
        Platform::Arm64 => "qemu-aarch64",
    }
}

/// Whether the kernel runs `platform`'s programs: the host's always; another's when its
/// interpreter is registered and enabled.
pub fn runs(platform: Platform) -> bool {
    platform == Platform::host()
        || std::fs::read_to_string(Path::new(BINFMT_DIR).join(entry(platform)))
            .is_ok_and(|text| text.lines().next() == Some("enabled"))
}

/// Fails, saying how to fix it, unless the kernel runs `platform`'s programs.
pub fn ensure(platform: Platform) -> anyhow::Result<()> {
    anyhow::ensure!(
        runs(platform),
        "this machine cannot run {platform} programs: its interpreter ({}) is not registered with \
         binfmt_misc. Run `cargo xtask setup --tests` as root, or install qemu-user-static, mount \
         binfmt_misc (`mount -t binfmt_misc binfmt_misc {BINFMT_DIR}`) and write the line of \
         {BINFMT_CONFS}/{}.conf to {BINFMT_DIR}/register",
        entry(platform),
        entry(platform)
    );
    Ok(())
}

/// Registers `platform`'s interpreter from Debian's qemu-user-static (as root), mounting
/// binfmt_misc first if it is not. Nothing to do where it runs already.
pub fn register(platform: Platform) -> anyhow::Result<()> {
    if runs(platform) {
        return Ok(());
    }
    let register = Path::new(BINFMT_DIR).join("register");
    if !register.exists() {
        let status = std::process::Command::new("mount")
            .args(["-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR])
            .status()
            .context("cannot run mount")?;
        anyhow::ensure!(status.success(), "cannot mount binfmt_misc on {BINFMT_DIR} (not root?)");
    }
    let conf = Path::new(BINFMT_CONFS).join(format!("{}.conf", entry(platform)));
    let text = std::fs::read_to_string(&conf)
        .with_context(|| format!("cannot read {} (is qemu-user-static installed?)", conf.display()))?;
    let line = registration(&text).with_context(|| format!("{}: no registration line", conf.display()))?;
    std::fs::write(&register, line)
        .with_context(|| format!("cannot register {} with {}", entry(platform), register.display()))?;
    ensure(platform)
}

/// The registration line of a binfmt.d file: its first line that is not a comment.
fn registration(conf: &str) -> Option<&str> {
    conf.lines().map(str::trim).find(|line| line.starts_with(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registration_is_the_first_line_not_a_comment() {
        let conf =
            "# comment\n\n:qemu-aarch64:M::\\x7fELF:\\xff:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:POCF\n";
        assert_eq!(
            registration(conf),
            Some(":qemu-aarch64:M::\\x7fELF:\\xff:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:POCF")
        );
        assert_eq!(registration("# nothing\n"), None);
    }

    #[test]
    fn the_host_platform_always_runs() {
        assert!(runs(Platform::host()));
        assert!(ensure(Platform::host()).is_ok());
    }
}
