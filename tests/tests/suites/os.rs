//! The OS layer's mirror source: two bootstraps give the same image id, and the layer is slim
//! (as Debian's slim images: no manuals, documentation or translations), also for the packages
//! later images install on it.

use xshell::Shell;
use xtask::engine::Engine;
use xtask::os::Bootstrap;
use xtask::platform::Platform;

#[tokio::test]
async fn two_bootstraps_give_the_same_digest() -> anyhow::Result<()> {
    let sh = Shell::new()?;
    let dir = tempfile::tempdir()?;
    let bootstrap = Bootstrap::default();
    let (first, second) = (dir.path().join("first.tar"), dir.path().join("second.tar"));
    bootstrap.run_mmdebstrap(&sh, &first, Platform::host())?;
    bootstrap.run_mmdebstrap(&sh, &second, Platform::host())?;
    let (first, second) = (std::fs::read(first)?, std::fs::read(second)?);
    assert!(first == second, "mmdebstrap gave different tars with SOURCE_DATE_EPOCH fixed");
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

    let tag = format!("localhost/agent-sandbox-test-os-{}:bootstrap", std::process::id());
    let (archive, id) = bootstrap.image_archive(first, &tag, Platform::host())?;
    let (_, id_again) = bootstrap.image_archive(second, &tag, Platform::host())?;
    assert_eq!(id, id_again);
    let engine = Engine::connect().await?;
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
