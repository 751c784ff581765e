//! The OS layer's mirror source: two bootstraps give the same image id.

use xshell::Shell;
use xtask::engine::Engine;
use xtask::os::Bootstrap;

#[tokio::test]
async fn two_bootstraps_give_the_same_digest() -> anyhow::Result<()> {
    let sh = Shell::new()?;
    let dir = tempfile::tempdir()?;
    let bootstrap = Bootstrap::default();
    let (first, second) = (dir.path().join("first.tar"), dir.path().join("second.tar"));
    bootstrap.run_mmdebstrap(&sh, &first)?;
    bootstrap.run_mmdebstrap(&sh, &second)?;
    let (first, second) = (std::fs::read(first)?, std::fs::read(second)?);
    assert!(first == second, "mmdebstrap gave different tars with SOURCE_DATE_EPOCH fixed");

    let tag = format!("localhost/agent-sandbox-test-os-{}:bootstrap", std::process::id());
    let (archive, id) = bootstrap.image_archive(first, &tag)?;
    let (_, id_again) = bootstrap.image_archive(second, &tag)?;
    assert_eq!(id, id_again);
    let engine = Engine::connect().await?;
    engine.load(archive).await?;
    let loaded = engine.image_id(&tag).await?;
    engine.remove_tag(&tag).await?;
    assert_eq!(loaded.as_deref(), Some(id.as_str()), "the engine's id is the config digest computed here");
    Ok(())
}
