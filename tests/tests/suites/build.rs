//! `cargo xtask build` on a real engine: tags, labels, the lock, skipping, partial rebuilds and
//! failure reports.

use std::collections::HashMap;

use sandbox_tests::ScratchImages;
use xtask::build::{Outcome, build};
use xtask::engine::Engine;
use xtask::labels;
use xtask::lock::ImagesLock;
use xtask::project::{VERSION, repository};

/// Removes a tag when the test ends, passed or not.
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let tag = self.0.clone();
        sandbox_tests::remove_tags_blocking(move |_| async move { Some(vec![tag]) });
    }
}

#[tokio::test]
async fn builds_the_graph_tags_labels_locks_and_then_skips() -> anyhow::Result<()> {
    let scratch = ScratchImages::copy("graph", &[])?;
    let opts = scratch.options()?;
    let engine = Engine::connect().await?;

    let first = build(&opts).await?;
    first.ensure_success()?;
    let names: Vec<&str> = first.results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(&names[..2], ["os", "base"], "parents first: {names:?}");
    assert!(names.contains(&"shell"), "{names:?}");

    let revision = xtask::project::git_revision(&xshell::Shell::new()?, &sandbox_tests::root());
    let lock = ImagesLock::read(&scratch.lock_path())?;
    assert_eq!(lock, first.lock, "the lock on disk is the one reported");
    assert_eq!(lock.images.keys().collect::<Vec<_>>().len(), names.len(), "every image is locked");
    for name in &names {
        let entry = &lock.images[*name];
        let id = first.id(name).expect("built or up to date");
        assert_eq!(entry.id, id);
        let tag = format!("{}:{VERSION}", repository(&scratch.prefix, name));
        assert_eq!(entry.tags, std::slice::from_ref(&tag));
        assert_eq!(engine.image_id(&tag).await?.as_deref(), Some(id), "{tag} points at the locked id");
        if let Some(rev) = &revision {
            let sha_tag = format!("{}:sha-{rev}", repository(&scratch.prefix, name));
            assert_eq!(engine.image_id(&sha_tag).await?.as_deref(), Some(id), "{sha_tag}");
        }

        let labels: HashMap<String, String> = engine.image_labels(id).await?;
        assert_eq!(labels.get(labels::IMAGE), Some(&name.to_string()), "{name}: {labels:?}");
        assert_eq!(labels.get(labels::INPUTS), Some(&entry.inputs), "{name}");
        assert_eq!(labels.get(labels::OCI_TITLE), Some(&format!("agent-{name}")), "{name}");
        assert_eq!(labels.get(labels::OCI_VERSION).map(String::as_str), Some(VERSION), "{name}");
        assert!(labels.contains_key(labels::OCI_SOURCE) && labels.contains_key(labels::OCI_REVISION));
        match &entry.parent {
            Some(parent) => {
                assert_eq!(entry.from, lock.images[parent].id, "{name} is built on its parent's id");
                assert_eq!(labels.get(labels::PARENT), Some(parent), "{name}");
            }
            None => assert!(!labels.contains_key(labels::PARENT), "{name} is a root: {labels:?}"),
        }
    }
    assert_eq!(lock.images["base"].parent.as_deref(), Some("os"));
    assert_eq!(lock.images["shell"].parent.as_deref(), Some("base"));

    let second = build(&opts).await?;
    second.ensure_success()?;
    assert!(second.built().is_empty(), "a second build rebuilt {:?}", second.built());
    assert_eq!(second.up_to_date(), names);
    assert_eq!(ImagesLock::read(&scratch.lock_path())?, lock, "a no-op build leaves the lock as it was");

    // One changed file in shell's folder rebuilds shell and nothing else. The content is new to
    // this run: an image built from the same inputs by an earlier run would be reused.
    let unique =
        format!("changed by test run {} at {:?}\n", std::process::id(), std::time::SystemTime::now());
    std::fs::write(scratch.images_dir().join("shell/NOTES.txt"), unique)?;
    let third = build(&opts).await?;
    third.ensure_success()?;
    assert_eq!(third.built(), ["shell"]);
    let rebuilt = ImagesLock::read(&scratch.lock_path())?;
    assert_ne!(rebuilt.images["shell"].id, lock.images["shell"].id);
    assert_ne!(rebuilt.images["shell"].inputs, lock.images["shell"].inputs);
    assert_eq!(rebuilt.images["base"], lock.images["base"]);
    let _remove_rebuilt = RemoveOnDrop(xtask::project::inputs_tag("shell", &rebuilt.images["shell"].inputs));

    // --locked passes now, and fails (naming the image, building nothing) after another change.
    let mut locked = opts.clone();
    locked.locked = true;
    build(&locked).await?.ensure_success()?;
    std::fs::write(scratch.images_dir().join("shell/NOTES.txt"), "changed again\n")?;
    let err = build(&locked).await.expect_err("--locked must fail when inputs changed").to_string();
    assert!(
        err.contains("--locked: the build would change") && err.contains("shell: inputs changed"),
        "{err}"
    );
    assert_eq!(ImagesLock::read(&scratch.lock_path())?, rebuilt, "--locked never writes the lock");
    Ok(())
}

#[tokio::test]
async fn a_failing_build_names_the_image_the_step_and_what_was_not_built() -> anyhow::Result<()> {
    let scratch = ScratchImages::copy("failure", &["os"])?;
    let images = scratch.images_dir();
    std::fs::create_dir_all(images.join("broken"))?;
    std::fs::write(
        images.join("broken/Dockerfile"),
        "ARG BASE_IMAGE=agent-os\nFROM ${BASE_IMAGE}\nRUN echo about to fail && exit 3\n",
    )?;
    std::fs::create_dir_all(images.join("child"))?;
    std::fs::write(images.join("child/Dockerfile"), "ARG BASE_IMAGE=agent-broken\nFROM ${BASE_IMAGE}\n")?;
    std::fs::create_dir_all(images.join("fine"))?;
    std::fs::write(
        images.join("fine/Dockerfile"),
        "ARG BASE_IMAGE=agent-os\nFROM ${BASE_IMAGE}\nRUN true\n",
    )?;

    let report = build(&scratch.options()?).await?;
    let outcome = |name: &str| report.results.iter().find(|r| r.name == name).map(|r| r.outcome.clone());
    match outcome("broken") {
        Some(Outcome::Failed { message }) => {
            assert!(message.contains("returned a non-zero code: 3"), "{message}")
        }
        other => panic!("broken: {other:?}"),
    }
    assert_eq!(outcome("child"), Some(Outcome::NotBuilt { because: "broken".into() }));
    assert!(
        matches!(outcome("fine"), Some(Outcome::Built { .. } | Outcome::UpToDate { .. })),
        "siblings still build"
    );
    let err = report.ensure_success().unwrap_err().to_string();
    assert_eq!(err, "cannot build 'broken'; not built because of it: child (needs broken)");
    let lock = ImagesLock::read(&scratch.lock_path())?;
    assert!(lock.images.contains_key("fine") && !lock.images.contains_key("broken"), "successes are kept");
    Ok(())
}

/// `cargo xtask new-agent` in a scratch copy: the scaffolded image joins the graph, builds, and
/// passes the contract every image of the repository passes (the NET_ADMIN part outside `--ci`).
#[tokio::test]
async fn a_scaffolded_agent_builds_and_passes_the_contract() -> anyhow::Result<()> {
    use crate::contract;
    use xtask::scaffold::{NewAgent, Source};
    let scratch = ScratchImages::copy("new-agent", &["os", "base", "shell"])?;
    let root = scratch.images_dir().parent().expect("the scratch root").to_path_buf();
    let agent = NewAgent {
        name: "scaffolded".into(),
        source: Source::From("shell".into()),
        cmd: "bash".into(),
        domains: vec!["api.acme.test".into()],
    };
    let written = xtask::scaffold::write(&root, &agent)?;
    assert_eq!(written.len(), 2);
    let graph = xtask::graph::ImageGraph::discover(&scratch.images_dir())?;
    assert_eq!(graph.get("scaffolded").and_then(|n| n.parent()), Some("shell"));

    let mut opts = scratch.options()?;
    opts.images = vec!["scaffolded".into()];
    build(&opts).await?.ensure_success()?;
    let subject = contract::Subject {
        name: "scaffolded".into(),
        tag: format!("{}:{VERSION}", repository(&scratch.prefix, "scaffolded")),
        root,
    };
    contract::labels_and_lock_entry(&subject).await?;
    contract::starts_ready_with_an_unprivileged_agent(&subject).await?;
    contract::agent_command_answers_version_offline(&subject).await?;
    contract::state_dirs_are_the_agents_and_outlive_the_container(&subject).await?;
    if sandbox_tests::sandbox::full_mode() {
        // api.acme.test, the --domain given, is reached; example.com is refused.
        contract::reaches_its_policy_and_not_example_com(&subject).await?;
    }
    Ok(())
}
