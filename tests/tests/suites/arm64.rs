//! The arm64 chain under emulation: the shell image (every CI run builds its chain:
//! `xtask::ci::EMULATED_IMAGES`) and, in `release::`, claude, an npm agent (`cargo xtask test
//! --arm64` only, for the time its chain takes under emulation), built for linux/arm64 by the xtask (cross-built sandbox-init, an
//! arm64 OS layer from mmdebstrap, every build step under qemu-user through binfmt_misc), keep
//! the contract's checks that need no network: their labels, lock entry and the engine's record
//! of their platform; `sandbox ready` with every agent process non-root, holding no capability,
//! with NoNewPrivs, and no setuid, setgid or file-capability program; the CLI answering
//! `--version`; no large file stored twice. Each runs the arm64 image itself, every process an
//! AArch64 one under qemu-user (checked: `uname -m` in the container).
//!
//! The firewall is not among them: qemu-user does not translate netfilter's netlink, so `nft`
//! cannot run in an emulated container (README: Platforms).

use sandbox_tests::contract::{self, Subject};
use xtask::platform::Platform;

async fn subject(name: &str) -> anyhow::Result<Subject> {
    xtask::emulation::ensure(Platform::Arm64)?;
    Subject::of_repository_for(name, Platform::Arm64).await
}

macro_rules! arm64_contract_tests {
    ($module:ident, $name:literal) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn labels_lock_entry_and_platform() -> anyhow::Result<()> {
                contract::labels_and_lock_entry(&subject($name).await?).await
            }

            #[tokio::test]
            async fn runs_as_aarch64_and_starts_ready_with_an_unprivileged_agent() -> anyhow::Result<()> {
                let subject = subject($name).await?;
                contract::runs_as(&subject, "aarch64").await?;
                contract::starts_ready_with_an_unprivileged_agent(&subject).await
            }

            #[tokio::test]
            async fn agent_command_answers_version_offline() -> anyhow::Result<()> {
                contract::agent_command_answers_version_offline(&subject($name).await?).await
            }

            #[tokio::test]
            async fn no_large_file_is_stored_twice() -> anyhow::Result<()> {
                contract::no_large_file_is_stored_twice(&subject($name).await?).await
            }
        }
    };
}

arm64_contract_tests!(shell, "shell");

/// Left out of `cargo xtask ci` and the NET_ADMIN pass; `cargo xtask test --arm64` runs it.
mod release {
    use super::*;

    arm64_contract_tests!(claude, "claude");
}
