//! `cargo xtask build` on a real engine: tags, labels, the lock, skipping, partial rebuilds and
//! failure reports.

use std::collections::HashMap;

use sandbox_tests::images::{RemoveTagOnDrop, ScratchImages};
use xtask::build::{Outcome, build};
use xtask::engine::Engine;
use xtask::labels;
use xtask::lock::{ImagesLock, LocalImages};
use xtask::platform::Platform;
use xtask::project::{VERSION, repository};

#[tokio::test]
async fn builds_the_graph_tags_labels_locks_and_then_skips() -> anyhow::Result<()> {
    let scratch = ScratchImages::copy("graph", &[])?;
    let mut opts = scratch.options()?;
    // The checkout's commit names the images, as in a build of the repository's images.
    opts.revision = None;
    let engine = Engine::connect().await?;

    let first = build(&opts).await?;
    first.ensure_success()?;
    let names: Vec<&str> = first.results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(&names[..2], ["os", "base"], "parents first: {names:?}");
    assert!(names.contains(&"shell"), "{names:?}");

    let revision = xtask::project::git_revision(&xshell::Shell::new()?, &sandbox_tests::root());
    let lock = ImagesLock::read(&scratch.lock_path())?;
    let local = LocalImages::read(&scratch.lock_path())?;
    assert_eq!(lock, first.lock, "the lock on disk is the one reported");
    assert_eq!(local, first.local, "the local record on disk is the one reported");
    assert_eq!(lock.images.keys().collect::<Vec<_>>().len(), names.len(), "every image is locked");
    for name in &names {
        let (entry, here) = (&lock.images[*name], &local.images[*name]);
        let id = first.id(name).expect("built or up to date");
        assert_eq!(here.id, id);
        let tag = format!("{}:{VERSION}", repository(&scratch.prefix, name));
        assert_eq!(here.tags, std::slice::from_ref(&tag));
        assert_eq!(engine.image_id(&tag).await?.as_deref(), Some(id), "{tag} points at the recorded id");
        if let Some(rev) = &revision {
            let sha_tag = format!("{}:sha-{rev}", repository(&scratch.prefix, name));
            assert_eq!(engine.image_id(&sha_tag).await?.as_deref(), Some(id), "{sha_tag}");
        }

        let labels: HashMap<String, String> = engine.image_labels(id).await?;
        assert_eq!(labels.get(labels::IMAGE), Some(&name.to_string()), "{name}: {labels:?}");
        let inputs = entry.inputs_for(Platform::host());
        assert_eq!(labels.get(labels::INPUTS).map(String::as_str), inputs, "{name}");
        assert_eq!(entry.inputs.len(), Platform::ALL.len(), "{name}: every platform's input hash");
        assert_eq!(labels.get(labels::BUILD), Some(&here.build), "{name}");
        assert_ne!(inputs, Some(here.build.as_str()), "{name}: the lock's input hash names no engine id");
        assert_eq!(labels.get(labels::OCI_TITLE), Some(&format!("agent-{name}")), "{name}");
        assert_eq!(labels.get(labels::OCI_VERSION).map(String::as_str), Some(VERSION), "{name}");
        assert!(labels.contains_key(labels::OCI_SOURCE) && labels.contains_key(labels::OCI_REVISION));
        match &entry.parent {
            Some(parent) => {
                assert_eq!(here.from, local.images[parent].id, "{name} is built on its parent's id");
                assert_eq!(labels.get(labels::PARENT), Some(parent), "{name}");
            }
            None => assert!(!labels.contains_key(labels::PARENT), "{name} is a root: {labels:?}"),
        }
    }
    let text = std::fs::read_to_string(scratch.lock_path())?;
    for local_fact in ["\"id\"", "\"from\"", "\"tags\"", "\"build\""] {
        assert!(!text.contains(local_fact), "images.lock holds a machine-local fact ({local_fact}):\n{text}");
    }
    assert_eq!(lock.images["base"].parent.as_deref(), Some("os"));
    assert_eq!(lock.images["shell"].parent.as_deref(), Some("base"));

    let second = build(&opts).await?;
    second.ensure_success()?;
    assert!(second.built().is_empty(), "a second build rebuilt {:?}", second.built());
    assert_eq!(second.up_to_date(), names);
    assert_eq!(ImagesLock::read(&scratch.lock_path())?, lock, "a no-op build leaves the lock as it was");
    assert_eq!(LocalImages::read(&scratch.lock_path())?, local, "and the local record");

    // One changed file in shell's folder rebuilds shell and nothing else. The content is new to
    // this run: an image built from the same inputs by an earlier run would be reused.
    let unique =
        format!("changed by test run {} at {:?}\n", std::process::id(), std::time::SystemTime::now());
    std::fs::write(scratch.images_dir().join("shell/NOTES.txt"), unique)?;
    let third = build(&opts).await?;
    third.ensure_success()?;
    assert_eq!(third.built(), ["shell"]);
    let rebuilt = ImagesLock::read(&scratch.lock_path())?;
    let rebuilt_here = LocalImages::read(&scratch.lock_path())?;
    assert_ne!(rebuilt_here.images["shell"].id, local.images["shell"].id);
    assert_ne!(rebuilt.images["shell"].inputs, lock.images["shell"].inputs);
    assert_eq!(rebuilt.images["base"], lock.images["base"]);
    let _remove_rebuilt =
        RemoveTagOnDrop(xtask::project::inputs_tag("shell", &rebuilt_here.images["shell"].build));

    // --locked passes now, and fails (naming the image, building nothing) after another change.
    let mut locked = opts.clone();
    locked.locked = true;
    build(&locked).await?.ensure_success()?;
    std::fs::write(scratch.images_dir().join("shell/NOTES.txt"), "changed again\n")?;
    let err = build(&locked).await.expect_err("--locked must fail when inputs changed").to_string();
    assert!(
        err.contains("--locked: the checkout's inputs differ from")
            && err.contains("shell: inputs for linux/amd64 changed"),
        "{err}"
    );
    assert_eq!(ImagesLock::read(&scratch.lock_path())?, rebuilt, "--locked never writes the lock");
    Ok(())
}

/// images.lock holds what the checkout determines: a build with an extra CA and one without give
/// the same lock, while the local record (and the engine) keep the two images apart.
#[tokio::test]
async fn an_extra_ca_changes_the_images_but_not_the_lock() -> anyhow::Result<()> {
    let scratch = ScratchImages::copy("ca-lock", &["os", "base", "shell"])?;
    let mut plain = scratch.options()?;
    plain.images = vec!["shell".into()];
    plain.ca_bundle = None;
    let mut with_ca = plain.clone();
    // The same CA on every run here, so that a second run finds its images in the engine's cache.
    with_ca.ca_bundle = Some(sandbox_tests::tls::lasting_ca_file()?);

    build(&plain).await?.ensure_success()?;
    let (lock, local) = (ImagesLock::read(&scratch.lock_path())?, LocalImages::read(&scratch.lock_path())?);
    build(&with_ca).await?.ensure_success()?;
    let (ca_lock, ca_local) =
        (ImagesLock::read(&scratch.lock_path())?, LocalImages::read(&scratch.lock_path())?);
    let _indexes: Vec<RemoveTagOnDrop> = ["os", "base", "shell"]
        .iter()
        .flat_map(|n| {
            [&local, &ca_local].map(|l| RemoveTagOnDrop(xtask::project::inputs_tag(n, &l.images[*n].build)))
        })
        .collect();
    assert_eq!(ca_lock, lock, "the extra CA changed images.lock");
    for name in ["os", "base", "shell"] {
        let (without, with) = (&local.images[name], &ca_local.images[name]);
        assert!(!without.extra_ca && with.extra_ca, "{name}: {without:?} {with:?}");
        assert_ne!(without.id, with.id, "{name}: one image for both");
        assert_ne!(without.build, with.build, "{name}");
    }
    // Back without the CA: the first images are found again, not the CA's.
    let again = build(&plain).await?;
    again.ensure_success()?;
    assert!(again.built().is_empty(), "rebuilt {:?}", again.built());
    assert_eq!(LocalImages::read(&scratch.lock_path())?, local);
    assert_eq!(ImagesLock::read(&scratch.lock_path())?, lock);
    // The CA's images stay for the next run under a tag of the suites' own, which `cargo xtask
    // prune` (run by .ci/run before the tests) leaves, so that a warm engine builds them from its
    // cache; each run moves the tags to its own, and prune takes the ones left without.
    for name in ["os", "base", "shell"] {
        sandbox_tests::images::keep(&ca_local.images[name].id, &format!("extra-ca-{name}"))?;
    }
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
    use sandbox_tests::contract;
    use xtask::new_agent::{NewAgent, Source};
    let scratch = ScratchImages::copy("new-agent", &["os", "base", "shell"])?;
    let root = scratch.images_dir().parent().expect("the scratch root").to_path_buf();
    let agent = NewAgent {
        name: "scaffolded".into(),
        source: Source::From("shell".into()),
        cmd: "bash".into(),
        domains: vec!["api.acme.test".into()],
    };
    let written = xtask::new_agent::write(&root, &agent)?;
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
        platform: Platform::host(),
    };
    contract::labels_and_lock_entry(&subject).await?;
    contract::starts_ready_with_an_unprivileged_agent(&subject).await?;
    contract::agent_command_answers_version_offline(&subject).await?;
    contract::state_dirs_are_the_agents_and_outlive_the_container(&subject).await?;
    contract::its_sign_in_hosts_are_in_its_policy(&subject).await?;
    // Its policy's reach (NET_ADMIN) is what contract::<image>::net_admin:: proves of every
    // image the graph holds; this test's place asks for no capability.
    Ok(())
}

/// The variables the agents read their keys from (docs/agents.md).
const KEY_VARIABLES: [&str; 8] = [
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "MISTRAL_API_KEY",
    "GOOGLE_API_KEY",
    "DASHSCOPE_API_KEY",
    "GH_TOKEN",
    "GITHUB_TOKEN",
];

/// Whether the image's config (environment, labels, command) or history (which keeps every
/// build arg a RUN step consumed) mentions `needle`.
async fn mentions(engine: &Engine, id: &str, needle: &str) -> anyhow::Result<bool> {
    let inspect = engine.docker().inspect_image(id).await?;
    let config = serde_json::to_string(&inspect)?;
    let history = engine.docker().image_history(id).await?;
    Ok(config.contains(needle) || history.iter().any(|h| h.created_by.contains(needle)))
}

/// Builds `plan` as the xtask does, with `extra` build args on top of its own.
async fn build_plan(
    engine: &Engine,
    plan: &xtask::build::BuildPlan,
    extra: &HashMap<String, String>,
) -> anyhow::Result<String> {
    let mut args: HashMap<String, String> = plan.build_args.clone().into_iter().collect();
    args.extend(extra.clone());
    engine
        .build(plan.context.to_tar(), &args, &plan.labels, |_| {})
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", plan.name))
}

/// API keys given to a build (as build args: the environment of `cargo xtask build` never
/// reaches the engine) stay out of every image. Each image of the graph, built again with a key
/// in every variable the agents read, is the very image built without them, layer for layer
/// (same id), and its config and history do not mention the key. A control image that declares
/// the variable as an ARG shows the check catches a key that is kept.
#[tokio::test]
async fn no_image_keeps_a_key_passed_at_build() -> anyhow::Result<()> {
    let report = sandbox_tests::images::built(&[]).await?;
    let engine = Engine::connect().await?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    let key = format!("sk-ant-api03-buildsentinel{}x{nanos}", std::process::id());
    let keys: HashMap<String, String> = KEY_VARIABLES.iter().map(|v| (v.to_string(), key.clone())).collect();

    let mut checked = Vec::new();
    let mut leftovers = Vec::new();
    for plan in &report.plans {
        let without = build_plan(&engine, plan, &HashMap::new()).await?;
        let with_keys = build_plan(&engine, plan, &keys).await?;
        assert_eq!(with_keys, without, "{}: built with keys, the image differs", plan.name);
        assert!(!mentions(&engine, &with_keys, &key).await?, "{} mentions the key", plan.name);
        if report.id(&plan.name) != Some(without.as_str()) {
            leftovers.push(without);
        }
        checked.push(plan.name.clone());
    }
    assert!(checked.len() >= 12 && checked.contains(&"claude".to_string()), "{checked:?}");

    // The control: a Dockerfile that takes the key as an ARG and uses it keeps it.
    let os = report.id("os").expect("the OS layer is in the graph").to_string();
    let mut context = xtask::context::BuildContext::default();
    let dockerfile =
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nARG ANTHROPIC_API_KEY\nRUN test -n \"$ANTHROPIC_API_KEY\"\n";
    context.insert("Dockerfile", 0o644, dockerfile.as_bytes().to_vec());
    let base = HashMap::from([("BASE_IMAGE".to_string(), os)]);
    let mut with_key = base.clone();
    with_key.insert("ANTHROPIC_API_KEY".into(), key.clone());
    let careless = engine.build(context.to_tar(), &with_key, &HashMap::new(), |_| {}).await?;
    assert!(mentions(&engine, &careless, &key).await?, "the check must see a key an image keeps");
    leftovers.push(careless);

    for id in leftovers.iter().rev() {
        let _ = engine
            .docker()
            .remove_image(id, None::<bollard::query_parameters::RemoveImageOptions>, None)
            .await;
    }
    Ok(())
}

/// `bench build` tags a `docker build` copy of every image it measures: it leaves none behind.
#[tokio::test]
async fn the_build_benchmark_leaves_no_tag_behind() -> anyhow::Result<()> {
    let scratch = ScratchImages::copy("bench", &["os", "base", "shell"])?;
    let opts = scratch.options()?;
    let bench_tags = || async {
        let images = Engine::connect().await?.images_with_label(labels::IMAGE).await?;
        let repo = format!("{}/", xtask::project::BENCH_REPOSITORY);
        Ok::<_, anyhow::Error>(
            images.into_iter().flat_map(|i| i.tags).filter(|t| t.starts_with(&repo)).collect::<Vec<_>>(),
        )
    };
    let measured = xtask::bench::bench_build(opts, 1).await?;
    assert_eq!(measured, 3, "os, base and shell were built with docker build");
    assert_eq!(bench_tags().await?, Vec::<String>::new(), "the benchmark's copies stayed");
    Ok(())
}

/// The ELF header's machine and whether a program header asks for an interpreter (a dynamic
/// binary's loader).
fn elf_machine_and_interpreter(binary: &[u8]) -> anyhow::Result<(u16, bool)> {
    anyhow::ensure!(
        binary.len() > 64 && binary.starts_with(b"\x7fELF\x02\x01"),
        "not a 64-bit little-endian ELF"
    );
    let u16_at = |at: usize| u16::from_le_bytes([binary[at], binary[at + 1]]);
    let machine = u16_at(18);
    let phoff = u64::from_le_bytes(binary[32..40].try_into()?) as usize;
    let (size, count) = (u16_at(54) as usize, u16_at(56) as usize);
    const PT_INTERP: u32 = 3;
    let interpreter = (0..count).any(|i| {
        let at = phoff + i * size;
        binary
            .get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")) == PT_INTERP)
    });
    Ok((machine, interpreter))
}

/// The arm64 chain's first piece: sandbox-init built static for arm64 through Debian's cross
/// linker, an AArch64 ELF with no interpreter, which runs under qemu-user and checks a policy
/// (a bad one refused with 65, as on amd64). The control: the host's build is x86-64, static too.
#[tokio::test]
async fn sandbox_init_builds_static_for_arm64_and_runs_under_emulation() -> anyhow::Result<()> {
    const EM_X86_64: u16 = 62;
    const EM_AARCH64: u16 = 183;
    let sh = xshell::Shell::new()?;
    let root = sandbox_tests::root();
    let arm64 = xtask::project::sandbox_init_binary_for(&sh, &root, Platform::Arm64)?;
    assert_eq!(elf_machine_and_interpreter(&arm64)?, (EM_AARCH64, false), "an AArch64 static binary");
    let host = xtask::project::sandbox_init_binary(&sh, &root)?;
    assert_eq!(elf_machine_and_interpreter(&host)?, (EM_X86_64, false), "the control: the host's");
    // And the reading's own control: this test binary is dynamic, so it names its loader.
    let this = std::fs::read(std::env::current_exe()?)?;
    assert_eq!(elf_machine_and_interpreter(&this)?, (EM_X86_64, true), "a dynamic binary's interpreter");

    let qemu = "qemu-aarch64-static";
    anyhow::ensure!(
        xtask::project::on_path(qemu),
        "{qemu} is missing: `cargo xtask setup --tests` installs it"
    );
    let binary = xtask::project::static_binary_path_for(&root, "sandbox-init", Platform::Arm64);
    let good = root.join("policies/claude.yaml");
    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: 1\ndomains: [\"exa mple.com\"]\n")?;
    let run = |policy: &std::path::Path| {
        std::process::Command::new(qemu).arg(&binary).arg("check").arg(policy).output()
    };
    let ok = run(&good)?;
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success() && text.contains(": ok ("), "{ok:?}");
    let refused = run(&bad)?;
    assert_eq!(refused.status.code(), Some(65), "{refused:?}");
    Ok(())
}
