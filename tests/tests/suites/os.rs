//! The OS layer's mirror source: a bootstrap gives the same image id as the one the build made
//! from the same archive state, and the layer is slim (as Debian's slim images: no manuals,
//! documentation or translations), also for the packages later images install on it.

use xshell::Shell;
use xtask::engine::Engine;
use xtask::os::Bootstrap;
use xtask::platform::Platform;

/// The package list of a rootfs tar (`var/lib/dpkg/status`): the archive state it was made
/// from, as far as its bytes depend on it.
fn dpkg_status(rootfs: &[u8]) -> anyhow::Result<String> {
    for entry in tar::Archive::new(rootfs).entries()? {
        let mut entry = entry?;
        if entry.path()?.to_string_lossy().trim_start_matches("./") == "var/lib/dpkg/status" {
            let mut status = String::new();
            std::io::Read::read_to_string(&mut entry, &mut status)?;
            return Ok(status);
        }
    }
    anyhow::bail!("no var/lib/dpkg/status in the bootstrap")
}

/// One bootstrap, compared with the one the build made (the suites run after `cargo xtask
/// build`, which keeps it under its settings' tag): where both hold the same packages (the
/// archive did not move between them), they are the same image, to the id. Two bootstraps
/// made at different times, in different processes and, on a fresh machine, minutes apart,
/// prove more than two made back to back; and the build's is not made twice. Where the archive
/// moved since (a warm machine's bootstrap from days ago), a second bootstrap now is the
/// comparison instead.
#[tokio::test]
async fn a_bootstrap_gives_the_digest_of_the_builds_from_the_same_archive() -> anyhow::Result<()> {
    let sh = Shell::new()?;
    let dir = tempfile::tempdir()?;
    let bootstrap = Bootstrap::default();
    let engine = Engine::connect().await?;
    let first = dir.path().join("first.tar");
    bootstrap.run_mmdebstrap(&sh, &first, Platform::host())?;
    let first = std::fs::read(first)?;
    let builds = engine.image_id(&bootstrap.reference(Platform::host())).await?;
    let builds_status = match &builds {
        Some(id) => {
            let out = std::process::Command::new("docker")
                .args(["run", "--rm", "--network", "none", "--entrypoint", "cat", id, "/var/lib/dpkg/status"])
                .output()?;
            anyhow::ensure!(out.status.success(), "reading the build's bootstrap: {out:?}");
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        None => None,
    };
    let tag = format!("localhost/agent-sandbox-test-os-{}:bootstrap", std::process::id());
    let (archive, id) = bootstrap.image_archive(first.clone(), &tag, Platform::host())?;
    if builds_status.as_deref() == Some(dpkg_status(&first)?.as_str()) {
        eprintln!("the build's bootstrap holds the same packages: compared with it");
        assert_eq!(
            builds.as_deref(),
            Some(id.as_str()),
            "a bootstrap of the same archive gave another image"
        );
    } else {
        eprintln!("the archive moved since the build's bootstrap (or there is none): bootstrapping again");
        let second = dir.path().join("second.tar");
        bootstrap.run_mmdebstrap(&sh, &second, Platform::host())?;
        let second = std::fs::read(second)?;
        assert!(first == second, "mmdebstrap gave different tars with SOURCE_DATE_EPOCH fixed");
        assert_eq!(bootstrap.image_archive(second, &tag, Platform::host())?.1, id);
    }
    assert!(first.len() <= 85_000_000, "the OS layer is {} MB, more than 85", first.len() / 1_000_000);
    let mut paths = Vec::new();
    let mut dpkg_config = String::new();
    for entry in tar::Archive::new(first.as_slice()).entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        if path.ends_with("dpkg.cfg.d/99mmdebstrap") {
            std::io::Read::read_to_string(&mut entry, &mut dpkg_config)?;
        }
        if entry.header().entry_type() != tar::EntryType::Directory {
            paths.push(path);
        }
    }
    let left: Vec<&String> = paths
        .iter()
        .filter(|p| {
            ["usr/share/man/", "usr/share/info/", "usr/share/locale/"].iter().any(|d| p.contains(d))
                || (p.contains("usr/share/doc/") && !p.ends_with("/copyright"))
        })
        .collect();
    assert!(left.is_empty(), "documentation left in the OS layer: {:?}", &left[..left.len().min(10)]);
    assert!(paths.iter().any(|p| p.ends_with("doc/bash/copyright")), "the copyright files went too");
    for option in xtask::os::SLIM_PATHS {
        assert!(
            dpkg_config.contains(option),
            "dpkg is not told `{option}` for later packages: {dpkg_config}"
        );
    }

    engine.load(archive).await?;
    let loaded = engine.image_id(&tag).await?;
    engine.remove_tag(&tag).await?;
    assert_eq!(loaded.as_deref(), Some(id.as_str()), "the engine's id is the config digest computed here");
    Ok(())
}

/// dpkg keeps leaving documentation out in the images built on the OS layer: base installs git,
/// tmux and nftables, whose manuals would otherwise come along.
#[tokio::test]
async fn packages_installed_later_leave_their_documentation_out() -> anyhow::Result<()> {
    let sb = sandbox_tests::spec::SandboxSpec::smallest().await?.offline().start().await?;
    let manuals = sb
        .exec(&["sh", "-c", "find /usr/share/man /usr/share/info /usr/share/doc -type f ! -name copyright ! -path /usr/share/info/dir | wc -l"])
        .await?;
    assert_eq!(manuals.stdout.trim(), "0", "{manuals:?}");
    // Positive control: the packages are there, with their copyright files.
    let git = sb
        .exec(&["sh", "-c", "test -x /usr/bin/git && test -f /usr/share/doc/git/copyright && echo yes"])
        .await?;
    assert_eq!(git.stdout.trim(), "yes", "{git:?}");
    Ok(())
}
