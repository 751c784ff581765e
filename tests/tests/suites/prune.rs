//! `cargo xtask prune` on a real engine: older generations go, the latest, the locked and the
//! used stay, and nothing outside the prefix is touched.

use std::collections::BTreeMap;

use bollard::query_parameters::CreateContainerOptionsBuilder;
use sandbox_tests::docker::RemoveOnDrop;
use sandbox_tests::images::{RemoveTagOnDrop, ScratchImages};
use xtask::build::build;
use xtask::engine::Engine;
use xtask::lock::LocalImages;
use xtask::project::{VERSION, inputs_tag, repository};
use xtask::prune::{GRACE, Outcome, PruneOptions, prune};

/// Every tag of the engine under the default prefix but the shared inputs index, with its
/// image id.
async fn default_prefix_tags(engine: &Engine) -> anyhow::Result<BTreeMap<String, String>> {
    let index = format!("{}:", xtask::project::INPUTS_REPOSITORY);
    let tagged = engine.tagged_with_prefix(&format!("{}/", xtask::project::DEFAULT_PREFIX)).await?;
    Ok(tagged.into_iter().filter(|(tag, _)| !tag.starts_with(&index)).collect())
}

#[tokio::test]
async fn older_generations_go_and_the_latest_the_locked_and_the_used_stay() -> anyhow::Result<()> {
    let scratch = ScratchImages::copy("prune", &["os", "base", "shell"])?;
    let opts = scratch.options()?;
    let engine = Engine::connect().await?;
    let shell_repo = repository(&scratch.prefix, "shell");

    // Three generations of shell, each tagged as a build at another commit leaves it. The
    // content is new to this run, so every generation is a new image.
    let mut generations = Vec::new();
    for generation in 0..3 {
        let notes =
            format!("prune test {} {:?} {generation}\n", std::process::id(), std::time::SystemTime::now());
        std::fs::write(scratch.images_dir().join("shell/NOTES.txt"), notes)?;
        build(&opts).await?.ensure_success()?;
        let entry = LocalImages::read(&scratch.lock_path())?.images["shell"].clone();
        engine.tag(&entry.id, &shell_repo, &format!("sha-{generation:012}")).await?;
        generations.push(entry);
    }
    let _indexes: Vec<RemoveTagOnDrop> =
        generations.iter().map(|g| RemoveTagOnDrop(inputs_tag("shell", &g.build))).collect();
    let [oldest, used, latest] = [&generations[0], &generations[1], &generations[2]];
    let lock = LocalImages::read(&scratch.lock_path())?;
    assert_eq!(lock.images["shell"].id, latest.id);

    // A container made from the middle generation, never started: the engine must keep it.
    let docker = engine.docker();
    let name = format!("agent-sandbox-test-prune-{}", std::process::id());
    let config = bollard::models::ContainerCreateBody { image: Some(used.id.clone()), ..Default::default() };
    let container = docker
        .create_container(Some(CreateContainerOptionsBuilder::default().name(&name).build()), config)
        .await?;
    let _container = RemoveOnDrop(container.id.clone());

    let before = default_prefix_tags(&engine).await?;
    let options = |dry_run| PruneOptions {
        lock_path: scratch.lock_path(),
        prefix: scratch.prefix.clone(),
        dry_run,
        grace: GRACE,
    };

    let dry = prune(&options(true), |_, _| {}).await?;
    assert_eq!(dry.outcome(&oldest.id).cloned(), Some(Outcome::WouldRemove), "{:?}", dry.images);
    let kept_for_the_container = Some(Outcome::Kept(format!("container {name} uses it")));
    assert_eq!(dry.outcome(&used.id).cloned(), kept_for_the_container, "{:?}", dry.images);
    for entry in generations.iter() {
        assert!(engine.find(&entry.id).await?.is_some(), "--dry-run removed {}", entry.id);
    }

    let report = prune(&options(false), |_, _| {}).await?;
    assert_eq!(report.outcome(&oldest.id).cloned(), Some(Outcome::Removed), "{:?}", report.images);
    assert_eq!(engine.find(&oldest.id).await?, None, "the oldest generation is gone");
    assert_eq!(engine.find(&inputs_tag("shell", &oldest.build)).await?, None, "with its inputs tag");

    assert_eq!(report.outcome(&used.id).cloned(), kept_for_the_container, "{:?}", report.images);
    let kept = engine.find(&used.id).await?.expect("a container's image is never forced out");
    assert!(kept.tags.contains(&format!("{shell_repo}:sha-000000000001")), "untagged: {:?}", kept.tags);

    assert_eq!(report.outcome(&latest.id).cloned(), None, "the latest is not even a candidate");
    assert_eq!(
        engine.image_id(&format!("{shell_repo}:{VERSION}")).await?.as_deref(),
        Some(latest.id.as_str())
    );
    for (name, entry) in &lock.images {
        assert!(engine.find(&entry.id).await?.is_some(), "{name}, in the lock, was removed");
    }
    for (image, _) in &report.images {
        for tag in &image.ours {
            assert!(
                tag.starts_with(&format!("{}/", scratch.prefix))
                    || tag.starts_with(xtask::project::INPUTS_REPOSITORY),
                "{tag} is not the scratch prefix's"
            );
        }
    }
    let after = default_prefix_tags(&engine).await?;
    let changed: Vec<_> = before.iter().filter(|(tag, id)| after.get(*tag) != Some(id)).collect();
    assert!(changed.is_empty(), "the repository's images were touched: {changed:?}");

    // Once the container is gone, the next prune takes that generation too; the one after
    // finds nothing to do.
    docker.remove_container(&container.id, None::<bollard::query_parameters::RemoveContainerOptions>).await?;
    let again = prune(&options(false), |_, _| {}).await?;
    assert_eq!(again.outcome(&used.id).cloned(), Some(Outcome::Removed), "{:?}", again.images);
    assert_eq!(engine.find(&used.id).await?, None);
    let idle = prune(&options(false), |_, _| {}).await?;
    let ours = |image: &xtask::prune::Superseded| image.ours.iter().any(|t| t.starts_with(&scratch.prefix));
    assert!(!idle.images.iter().any(|(image, _)| ours(image)), "{:?}", idle.images);

    Ok(())
}

#[tokio::test]
async fn an_older_parent_that_the_latest_child_is_built_on_loses_its_tags_not_its_layers()
-> anyhow::Result<()> {
    let scratch = ScratchImages::copy("prune-parent", &["os", "base", "shell"])?;
    let mut opts = scratch.options()?;
    let engine = Engine::connect().await?;
    let base_repo = repository(&scratch.prefix, "base");
    let notes =
        |what: &str| format!("prune test {} {:?} {what}\n", std::process::id(), std::time::SystemTime::now());

    // base and shell on it; then base alone again, changed: shell, still the latest shell, is
    // built on the older base.
    std::fs::write(scratch.images_dir().join("base/NOTES.txt"), notes("first"))?;
    build(&opts).await?.ensure_success()?;
    let first = LocalImages::read(&scratch.lock_path())?;
    let (older_base, shell) = (&first.images["base"], &first.images["shell"]);
    engine.tag(&older_base.id, &base_repo, "sha-000000000009").await?;
    std::fs::write(scratch.images_dir().join("base/NOTES.txt"), notes("second"))?;
    opts.images = vec!["base".into()];
    build(&opts).await?.ensure_success()?;
    let newer_base = LocalImages::read(&scratch.lock_path())?.images["base"].clone();
    let _indexes = [
        RemoveTagOnDrop(inputs_tag("base", &older_base.build)),
        RemoveTagOnDrop(inputs_tag("base", &newer_base.build)),
        RemoveTagOnDrop(inputs_tag("shell", &shell.build)),
    ];
    assert_ne!(newer_base.id, older_base.id);

    let options = PruneOptions {
        lock_path: scratch.lock_path(),
        prefix: scratch.prefix.clone(),
        dry_run: false,
        grace: GRACE,
    };
    let report = prune(&options, |_, _| {}).await?;
    let outcome = report.outcome(&older_base.id).cloned();
    assert_eq!(
        outcome,
        Some(Outcome::Kept("untagged; images built on it keep it".into())),
        "{:?}",
        report.images
    );
    let kept = engine.find(&older_base.id).await?.expect("the latest shell's parent must stay");
    assert!(kept.tags.is_empty(), "the project's tags go: {:?}", kept.tags);
    let shell_tag = format!("{}:{VERSION}", repository(&scratch.prefix, "shell"));
    assert_eq!(
        engine.image_id(&shell_tag).await?.as_deref(),
        Some(shell.id.as_str()),
        "the latest shell stays"
    );
    let removed_here = report.images.iter().filter(|(image, outcome)| {
        *outcome == Outcome::Removed && image.ours.iter().any(|t| t.starts_with(&scratch.prefix))
    });
    assert_eq!(removed_here.count(), 0, "nothing of this prefix was deleted: {:?}", report.images);
    Ok(())
}
