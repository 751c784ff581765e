//! The contract every image keeps, generated from images/ (tests/build.rs): add an image folder
//! and `contract::<image>::…` appear. Each image: its labels and lock entry are right; it starts
//! and reaches `sandbox ready` with the agent unprivileged; its agent command answers
//! `--version` offline; and (NET_ADMIN, left out of `--ci`) its own policy's domains are
//! reachable while example.com is not.

use sandbox_init::policy::{DomainPattern, Policy};
use sandbox_tests::sandbox::{Peer, SandboxSpec, TestNet, assert_blocked, assert_reaches, image};
use xtask::engine::Engine;

macro_rules! contract_tests {
    ($name:literal) => {
        #[tokio::test]
        async fn labels_and_lock_entry() -> anyhow::Result<()> {
            super::labels_and_lock_entry($name).await
        }

        #[tokio::test]
        async fn starts_ready_with_an_unprivileged_agent() -> anyhow::Result<()> {
            super::starts_ready_with_an_unprivileged_agent($name).await
        }

        #[tokio::test]
        async fn agent_command_answers_version_offline() -> anyhow::Result<()> {
            super::agent_command_answers_version_offline($name).await
        }

        #[tokio::test]
        async fn net_admin_reaches_its_policy_and_not_example_com() -> anyhow::Result<()> {
            super::reaches_its_policy_and_not_example_com($name).await
        }
    };
}

include!(concat!(env!("OUT_DIR"), "/contract_images.rs"));

struct Facts {
    tag: String,
    entrypoint: Vec<String>,
    env: Vec<String>,
}

async fn facts(name: &str) -> anyhow::Result<Facts> {
    let tag = image(name).await?;
    let inspect = Engine::connect().await?.docker().inspect_image(&tag).await?;
    let config = inspect.config.unwrap_or_default();
    Ok(Facts { tag, entrypoint: config.entrypoint.unwrap_or_default(), env: config.env.unwrap_or_default() })
}

/// Whether the image runs sandbox-init. Only the OS layer, which has no parent, may not: every
/// image built on base inherits the entrypoint.
async fn is_sandbox(name: &str, facts: &Facts) -> anyhow::Result<bool> {
    if facts.entrypoint == ["/usr/local/bin/sandbox-init"] {
        return Ok(true);
    }
    let lock = xtask::lock::ImagesLock::read(&sandbox_tests::root().join("images.lock"))?;
    let parent = lock.images.get(name).and_then(|e| e.parent.clone());
    anyhow::ensure!(
        parent.is_none(),
        "{name} is built on {parent:?} but its entrypoint is {:?}",
        facts.entrypoint
    );
    eprintln!("{name} is the OS layer, not a sandbox: only its labels and lock entry apply");
    Ok(false)
}

async fn labels_and_lock_entry(name: &str) -> anyhow::Result<()> {
    let facts = facts(name).await?;
    let engine = Engine::connect().await?;
    let local = engine.find(&facts.tag).await?.expect("just built");
    let lock = xtask::lock::ImagesLock::read(&sandbox_tests::root().join("images.lock"))?;
    let entry = lock.images.get(name).unwrap_or_else(|| panic!("{name} is not in images.lock"));
    assert_eq!(entry.id, local.id, "the lock's id for {name}");
    assert!(entry.tags.contains(&facts.tag), "{:?} lacks {}", entry.tags, facts.tag);
    assert_eq!(local.labels.get(xtask::labels::IMAGE), Some(&name.to_string()));
    assert_eq!(local.labels.get(xtask::labels::INPUTS), Some(&entry.inputs));
    assert_eq!(local.labels.get(xtask::labels::PARENT), entry.parent.as_ref(), "{name}'s parent label");
    // An agent image's pinned CLI version is a build arg the lock records.
    if let Some(version) = local.labels.get(xtask::labels::AGENT_VERSION) {
        assert!(
            entry.args.values().any(|v| v == version),
            "{name}: version {version} not in the lock's {:?}",
            entry.args
        );
        assert_eq!(local.labels.get(xtask::labels::AGENT_NAME).map(String::as_str), Some(name));
        // `cargo xtask list` finds it by its label.
        let listed = xtask::list::render(&engine.images_with_label(xtask::labels::IMAGE).await?, false);
        let row = listed.lines().find(|l| l.starts_with(&format!("{name} ")) && l.contains(&facts.tag));
        assert!(row.is_some_and(|r| r.ends_with(version.as_str())), "{name} is not listed:\n{listed}");
    }
    Ok(())
}

async fn starts_ready_with_an_unprivileged_agent(name: &str) -> anyhow::Result<()> {
    let facts = facts(name).await?;
    if !is_sandbox(name, &facts).await? {
        return Ok(());
    }
    let mut spec = SandboxSpec::of(facts.tag);
    spec.network = Some("none".into());
    let sb = spec.start().await?;
    crate::privileges::assert_agent_processes_unprivileged(&sb).await
}

async fn agent_command_answers_version_offline(name: &str) -> anyhow::Result<()> {
    let facts = facts(name).await?;
    if !is_sandbox(name, &facts).await? {
        return Ok(());
    }
    let command = facts
        .env
        .iter()
        .find_map(|e| e.strip_prefix("ASSISTANT_CMD="))
        .unwrap_or_else(|| panic!("{name} sets no ASSISTANT_CMD"))
        .to_string();
    let program = command.split_whitespace().next().expect("a command").to_string();
    let mut spec = SandboxSpec::of(facts.tag);
    spec.network = Some("none".into());
    let sb = spec.start().await?;
    let out = sb.as_agent(&[&program, "--version"]).await?;
    assert_eq!(out.code, 0, "`{program} --version` as the agent, offline: {out:?}");
    assert!(!out.stdout.trim().is_empty(), "`{program} --version` printed nothing");
    Ok(())
}

/// The policy an image bakes: its own policies/<image>.yaml, or its nearest ancestor's.
fn baked_policy(name: &str) -> anyhow::Result<Policy> {
    let root = sandbox_tests::root();
    let lock = xtask::lock::ImagesLock::read(&root.join("images.lock"))?;
    let mut current = Some(name.to_string());
    while let Some(image) = current {
        let file = root.join("policies").join(format!("{image}.yaml"));
        if file.exists() {
            return Ok(Policy::read(&file)?);
        }
        current = lock.images.get(&image).and_then(|e| e.parent.clone());
    }
    anyhow::bail!("neither {name} nor an ancestor has a policy in policies/")
}

async fn reaches_its_policy_and_not_example_com(name: &str) -> anyhow::Result<()> {
    let facts = facts(name).await?;
    if !is_sandbox(name, &facts).await? {
        return Ok(());
    }
    let policy = baked_policy(name)?;
    // Every domain of the policy becomes an alias of one peer on the private network.
    let targets: Vec<(String, u16)> = policy
        .domains
        .iter()
        .filter_map(|(pattern, ports)| {
            let host = match pattern {
                DomainPattern::Exact(host) => host.clone(),
                DomainPattern::Subdomains(parent) => format!("contract.{parent}"),
            };
            // A port the peer serves.
            ports.iter().find(|p| [80, 443, 8443].contains(*p)).map(|p| (host, *p))
        })
        .collect();
    let net = TestNet::create(&format!("contract-{name}")).await?;
    let mut aliases: Vec<&str> = targets.iter().map(|(h, _)| h.as_str()).collect();
    aliases.push("example.com");
    let peer = Peer::start(&net, &aliases).await?;
    // Unknown names go to the peer, not to the host's resolvers: nothing leaves the network.
    let mut spec = SandboxSpec::of(facts.tag).net_admin().on(&net);
    spec.dns = Some(peer.ipv4);
    let sb = spec.start().await?;
    for (host, port) in &targets {
        assert_reaches(&sb, &format!("{host}:{port}")).await?;
    }
    let example = assert_blocked(&sb, "example.com:443").await?;
    assert_eq!(
        example.outcome(),
        "dns:refused",
        "example.com is an alias of the peer, but not in {name}'s policy"
    );
    Ok(())
}
