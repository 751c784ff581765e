//! The contract every image keeps, checked against one image (a `Subject`): its labels and lock
//! entry are right; it starts and reaches `sandbox ready` with the agent unprivileged and no
//! setuid, setgid or file-capability program; its agent command answers `--version` offline; its
//! state directories are the agent's and outlive the container; and (NET_ADMIN) its own policy's
//! domains are reachable while example.com is not. The contract suite runs it for every folder
//! of images/, the build suite for a scaffolded image.

use sandbox_init::policy::{DomainPattern, Policy};
use xtask::engine::Engine;

use crate::assert::{assert_blocked, assert_reaches};
use crate::docker::{TestNet, TestVolume};
use crate::images::image_for;
use crate::peers::Peer;
use crate::spec::SandboxSpec;
use xtask::platform::Platform;

/// An image under contract: its name, the tag to run, and the checkout it was built from (whose
/// images.lock and policies/ it must agree with): the repository, or a scratch copy.
pub struct Subject {
    pub name: String,
    pub tag: String,
    pub root: std::path::PathBuf,
    /// The platform it was built for: another than the host's runs under emulation.
    pub platform: Platform,
}

impl Subject {
    pub async fn of_repository(name: &str) -> anyhow::Result<Subject> {
        Subject::of_repository_for(name, Platform::host()).await
    }

    /// The repository's image `name` for `platform`.
    pub async fn of_repository_for(name: &str, platform: Platform) -> anyhow::Result<Subject> {
        Ok(Subject {
            name: name.to_string(),
            tag: image_for(name, platform).await?,
            root: crate::root(),
            platform,
        })
    }

    fn lock(&self) -> anyhow::Result<xtask::lock::ImagesLock> {
        xtask::lock::ImagesLock::read(&self.root.join("images.lock"))
    }
}

struct Facts {
    tag: String,
    entrypoint: Vec<String>,
    env: Vec<String>,
    labels: std::collections::HashMap<String, String>,
}

impl Facts {
    fn env(&self, key: &str) -> Option<&str> {
        self.env.iter().find_map(|e| e.strip_prefix(key)?.strip_prefix('='))
    }
}

async fn facts(subject: &Subject) -> anyhow::Result<Facts> {
    let tag = subject.tag.clone();
    let inspect = Engine::connect().await?.docker().inspect_image(&tag).await?;
    let config = inspect.config.unwrap_or_default();
    Ok(Facts {
        tag,
        entrypoint: config.entrypoint.unwrap_or_default(),
        env: config.env.unwrap_or_default(),
        labels: config.labels.unwrap_or_default(),
    })
}

/// Whether the image runs sandbox-init. Only the OS layer, which has no parent, may not: every
/// image built on base inherits the entrypoint.
async fn is_sandbox(subject: &Subject, facts: &Facts) -> anyhow::Result<bool> {
    let name = &subject.name;
    if facts.entrypoint == ["/usr/local/bin/sandbox-init"] {
        return Ok(true);
    }
    let lock = subject.lock()?;
    let parent = lock.images.get(name).and_then(|e| e.parent.clone());
    anyhow::ensure!(
        parent.is_none(),
        "{name} is built on {parent:?} but its entrypoint is {:?}",
        facts.entrypoint
    );
    eprintln!("{name} is the OS layer, not a sandbox: only its labels and lock entry apply");
    Ok(false)
}

/// The image's facts if it is a sandbox; None for the OS layer, which has only labels to check.
async fn sandbox_facts(subject: &Subject) -> anyhow::Result<Option<Facts>> {
    let facts = facts(subject).await?;
    Ok(is_sandbox(subject, &facts).await?.then_some(facts))
}

impl Facts {
    /// The image with no network: what the offline checks start.
    fn offline(&self) -> SandboxSpec {
        SandboxSpec::of(self.tag.clone()).offline()
    }

    /// The image started offline, as the checks that only read it see it: one per image and run,
    /// shared by those checks, each still reported by its own name
    /// (`SandboxSpec::start_shared`). It lives as long as the run, so its session idles
    /// (`SandboxSpec::idle_session`); the check of the agent's processes starts the image's own
    /// command ([`starts_ready_with_an_unprivileged_agent`]).
    async fn offline_subject(&self) -> anyhow::Result<crate::sandbox::Sandbox> {
        self.offline().idle_session().start_shared(&format!("subject-{}", self.tag)).await
    }
}

pub async fn labels_and_lock_entry(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let facts = facts(subject).await?;
    let engine = Engine::connect().await?;
    let local = engine.find(&facts.tag).await?.expect("just built");
    let lock = subject.lock()?;
    let entry = lock.images.get(name).unwrap_or_else(|| panic!("{name} is not in images.lock"));
    let here = xtask::lock::LocalImages::read_for(&subject.root.join("images.lock"), subject.platform)?;
    let record = here.images.get(name).unwrap_or_else(|| panic!("{name} is not in images.local.json"));
    assert_eq!(record.id, local.id, "the local record's id for {name}");
    assert!(record.tags.contains(&facts.tag), "{:?} lacks {}", record.tags, facts.tag);
    assert_eq!(local.labels.get(xtask::labels::IMAGE), Some(&name.to_string()));
    assert_eq!(
        local.labels.get(xtask::labels::INPUTS).map(String::as_str),
        entry.inputs_for(subject.platform),
        "{name}'s input hash for {}",
        subject.platform
    );
    assert_eq!(local.labels.get(xtask::labels::PLATFORM).map(String::as_str), Some(subject.platform.name()));
    let inspect = engine.docker().inspect_image(&facts.tag).await?;
    assert_eq!(
        (inspect.architecture.as_deref(), inspect.variant.as_deref()),
        (Some(subject.platform.debian_arch()), subject.platform.variant()),
        "{name}: the engine's record of its platform"
    );
    // Every image with sandbox-init (all but the OS layer under base) inherits base's health
    // check, which `docker ps` shows: healthy only while the firewall holds.
    let health = inspect.config.as_ref().and_then(|c| c.healthcheck.as_ref()).and_then(|h| h.test.clone());
    let expected = (name != "os")
        .then(|| ["CMD", "/usr/local/bin/sandbox-status", "--health"].map(String::from).to_vec());
    assert_eq!(health, expected, "{name}'s HEALTHCHECK");
    assert_eq!(local.labels.get(xtask::labels::BUILD), Some(&record.build));
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
        let built_on = xtask::list::built_on(&subject.root.join("images.lock"));
        let listed =
            xtask::list::render(&engine.images_with_label(xtask::labels::IMAGE).await?, false, &built_on);
        let row = listed.lines().find(|l| l.starts_with(&format!("{name} ")) && l.contains(&facts.tag));
        assert!(
            row.is_some_and(|r| r.split_whitespace().any(|cell| cell == version)),
            "{name} is not listed with its tag and version {version}:\n{listed}"
        );
    }
    Ok(())
}

pub async fn starts_ready_with_an_unprivileged_agent(subject: &Subject) -> anyhow::Result<()> {
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    // Its own sandbox, running the image's own agent command (the shared subject idles).
    let sb = facts.offline().start().await?;
    crate::assert::assert_agent_processes_unprivileged(&sb).await?;
    // The agent's processes started outside sandbox-exec (`docker exec -u agent`) have no
    // no_new_privs: no setuid or setgid program, and no file capability, may lead them back to
    // the container's capabilities.
    let found = crate::assert::privileged_files(&sb).await?;
    assert!(found.is_empty(), "{} has privileged files: {found:?}", subject.name);
    Ok(())
}

/// The image's processes are `machine`'s (`uname -m`: `aarch64` under emulation), as the agent
/// sees them; the control is the host's own, which must differ where the image is emulated.
pub async fn runs_as(subject: &Subject, machine: &str) -> anyhow::Result<()> {
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let sb = facts.offline_subject().await?;
    let seen = sb.as_agent(&["uname", "-m"]).await?;
    assert_eq!(seen.stdout.trim(), machine, "{}: {seen:?}", subject.name);
    let host = std::process::Command::new("uname").arg("-m").output()?;
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    assert_eq!(
        host != machine,
        subject.platform != Platform::host(),
        "the host is {host}: the image is emulated exactly when its platform is not the host's"
    );
    Ok(())
}

pub async fn agent_command_answers_version_offline(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let command =
        facts.env("ASSISTANT_CMD").unwrap_or_else(|| panic!("{name} sets no ASSISTANT_CMD")).to_string();
    let program = command.split_whitespace().next().expect("a command").to_string();
    let sb = facts.offline_subject().await?;
    let out = sb.as_agent(&[&program, "--version"]).await?;
    assert_eq!(out.code, 0, "`{program} --version` as the agent, offline: {out:?}");
    assert!(!out.stdout.trim().is_empty(), "`{program} --version` printed nothing");
    Ok(())
}

/// An agent image names its CLI's state directories; mounted as fresh volumes (root's) they are
/// the agent's to write, and what it wrote is there in the next container.
pub async fn state_dirs_are_the_agents_and_outlive_the_container(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let is_agent = facts.labels.contains_key(xtask::labels::AGENT_NAME);
    let Some(value) = facts.env(sandbox_init::state::ENV) else {
        assert!(!is_agent, "{name} is an agent image but sets no {}", sandbox_init::state::ENV);
        eprintln!("{name} is not an agent image and keeps no state");
        return Ok(());
    };
    let (dirs, warnings) = sandbox_init::state::dirs_from(value, std::path::Path::new("/home/agent"));
    assert!(warnings.is_empty() && !dirs.is_empty(), "{name}: {value:?}: {warnings:?}");
    let mut volumes = Vec::new();
    for _ in &dirs {
        volumes.push(TestVolume::create(&format!("state-{name}")).await?);
    }
    let spec = || {
        let mut spec = facts.offline();
        for (volume, dir) in volumes.iter().zip(&dirs) {
            spec = spec.mount(&volume.name, &dir.display().to_string());
        }
        spec
    };
    let first = spec().start().await?;
    for dir in &dirs {
        let script = format!("test -O {0} && echo kept by {name} > {0}/contract-state", dir.display());
        let out = first.as_agent(&["sh", "-c", &script]).await?;
        assert_eq!(out.code, 0, "{} is not the agent's to write: {out:?}", dir.display());
    }
    drop(first);
    let second = spec().start().await?;
    for dir in &dirs {
        let out = second.as_agent(&["cat", &format!("{}/contract-state", dir.display())]).await?;
        assert_eq!(out.stdout.trim(), format!("kept by {name}"), "{}: {out:?}", dir.display());
    }
    Ok(())
}

/// The policy an image bakes: its own policies/<image>.yaml, or its nearest ancestor's.
fn baked_policy(subject: &Subject) -> anyhow::Result<Policy> {
    let name = &subject.name;
    let lock = subject.lock()?;
    let mut current = Some(name.to_string());
    while let Some(image) = current {
        let file = subject.root.join("policies").join(format!("{image}.yaml"));
        if file.exists() {
            return Ok(Policy::read(&file)?);
        }
        current = lock.images.get(&image).and_then(|e| e.parent.clone());
    }
    anyhow::bail!("neither {name} nor an ancestor has a policy in policies/")
}

pub async fn reaches_its_policy_and_not_example_com(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let policy = baked_policy(subject)?;
    let allowlist = sandbox_init::policy::Allowlist::new(&policy);
    // Every domain of the policy becomes an alias of one peer on the private network.
    let targets: Vec<(String, u16)> = policy
        .domains
        .iter()
        .filter_map(|(pattern, access)| {
            let host = match pattern {
                DomainPattern::Exact(host) => host.clone(),
                DomainPattern::Subdomains(parent) => format!("contract.{parent}"),
            };
            // A port the peer serves.
            access.tcp.iter().find(|p| [80, 443, 8443].contains(*p)).map(|p| (host, *p))
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
        if allowlist.is_forwarded(host) {
            // The forwarder's alone (forward::): the agent's own connection is refused (the alert).
            let own = sb.probe(&["tcp", host, &port.to_string(), "--tls"]).await?;
            assert_eq!(
                own.outcome(),
                "denied",
                "{name} reached forwarded {host}:{port} itself: {:?}",
                own.fields
            );
        } else {
            assert_reaches(&sb, &format!("{host}:{port}")).await?;
        }
    }
    let example = assert_blocked(&sb, "example.com:443").await?;
    assert_eq!(
        example.outcome(),
        "dns:refused",
        "example.com is an alias of the peer, but not in {name}'s policy"
    );
    Ok(())
}

/// An agent image declares how its CLI runs unattended (`SANDBOX_UNATTENDED_ARGS` and `_ENV`),
/// or why there is nothing to turn off (`SANDBOX_UNATTENDED_NONE`); an image that is no agent
/// declares nothing. With `SANDBOX_UNATTENDED=1`, sandbox-init starts the session's command
/// with those arguments and variables (seen by a recorder put in place of the CLI); without
/// it, with neither, and it says at start that the agent will wait at its prompt.
pub async fn unattended_mode_is_declared_and_applied(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let (args, env, none) = (
        facts.env("SANDBOX_UNATTENDED_ARGS").unwrap_or_default().to_string(),
        facts.env("SANDBOX_UNATTENDED_ENV").unwrap_or_default().to_string(),
        facts.env("SANDBOX_UNATTENDED_NONE").unwrap_or_default().to_string(),
    );
    if !facts.labels.contains_key(xtask::labels::AGENT_NAME) {
        assert!(
            args.is_empty() && env.is_empty() && none.is_empty(),
            "{name} is no agent image: {args:?} {env:?} {none:?}"
        );
        return Ok(());
    }
    assert!(
        !args.trim().is_empty() || !env.trim().is_empty() || !none.trim().is_empty(),
        "{name} declares no unattended mode, and not why there is none (SANDBOX_UNATTENDED_NONE)"
    );
    // The recorder: the words after its command line are the arguments it was given.
    let recorder = r#"sh -c 'printf "arg:%s\n" "$@" > /tmp/args; env > /tmp/env; exec sleep 600' recorder"#;
    for unattended in [true, false] {
        let mut spec = facts.offline().env("ASSISTANT_CMD", recorder);
        if unattended {
            spec = spec.env("SANDBOX_UNATTENDED", "1");
        }
        let sb = spec.start().await?;
        let mut recorded = String::new();
        for _ in 0..150 {
            recorded = sb.exec(&["sh", "-c", "cat /tmp/args /tmp/env 2>/dev/null || true"]).await?.stdout;
            if recorded.contains("HOME=") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let given: Vec<&str> =
            recorded.lines().filter_map(|l| l.strip_prefix("arg:")).filter(|a| !a.is_empty()).collect();
        let expected: Vec<&str> = if unattended { args.split_whitespace().collect() } else { Vec::new() };
        assert_eq!(given, expected, "{name}, unattended {unattended}: {recorded}");
        for pair in env.split(';').filter(|p| p.contains('=')) {
            assert_eq!(
                recorded.lines().any(|l| l == pair),
                unattended,
                "{name}, unattended {unattended}: {pair}"
            );
        }
        let (_, stderr) = sb.logs().await?;
        let noted = stderr.contains("will wait at its first permission prompt");
        let declared = !args.trim().is_empty() || !env.trim().is_empty();
        assert_eq!(noted, !unattended && declared, "{name}, unattended {unattended}: {stderr}");
    }
    Ok(())
}

/// No file over 10 MB is stored twice in the image (a copy where a link would do: Claude
/// Code's native binary once was, 400 MB). Files of one size on different inodes are compared
/// by their sha256.
pub async fn no_large_file_is_stored_twice(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let sb = facts.offline_subject().await?;
    // The checks sharing the subject run its CLI meanwhile: a file one removes between find's
    // reading of a directory and its stat (Claude Code's lock files) is no error. What they
    // write is the agent's, not the image's: the trees the agent may write are left out (Codex
    // stages a copy of its daemon in ~/.codex at its first start; no image puts a file over
    // 10 MB there at build).
    let listing = sb
        .exec(&[
            "find",
            "/",
            "-xdev",
            "-ignore_readdir_race",
            "(",
            "-path",
            "/home",
            "-o",
            "-path",
            "/tmp",
            "-o",
            "-path",
            "/var/tmp",
            "-o",
            "-path",
            "/workspace",
            "-o",
            "-path",
            "/run",
            "-o",
            "-path",
            "/dev/shm",
            ")",
            "-prune",
            "-o",
            "-type",
            "f",
            "-size",
            "+10M",
            "-printf",
            "%s %i %p\\n",
        ])
        .await?;
    assert_eq!(listing.code, 0, "{listing:?}");
    let mut by_size: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, String>> =
        Default::default();
    for line in listing.stdout.lines() {
        let mut fields = line.splitn(3, ' ');
        let (Some(size), Some(inode), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        by_size.entry(size.parse()?).or_default().entry(inode.parse()?).or_insert_with(|| path.to_string());
    }
    let mut copies = Vec::new();
    for files in by_size.values().filter(|inodes| inodes.len() > 1) {
        let mut cmd = vec!["sha256sum"];
        cmd.extend(files.values().map(String::as_str));
        let sums = sb.exec(&cmd).await?;
        let mut seen: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for line in sums.stdout.lines() {
            let Some((sum, path)) = line.split_once("  ") else { continue };
            if let Some(first) = seen.insert(sum, path) {
                copies.push(format!("{first} = {path}"));
            }
        }
    }
    assert!(copies.is_empty(), "{name} stores files over 10 MB twice: {copies:?}");
    assert!(
        !listing.stdout.is_empty() || name == "shell" || name == "base",
        "{name}: no file over 10 MB at all?"
    );
    Ok(())
}

/// images/<agent>/signin.yaml: where the pinned CLI's sign-in, refresh and API hosts are read
/// out of the installed CLI.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    /// Files of the image the patterns are read in (globs, as sh expands them, after `prepare`).
    files: Vec<String>,
    /// A shell command run first (as root, in the image), e.g. to unpack the CLI.
    #[serde(default)]
    prepare: Option<String>,
    /// Patterns (grep -E) of the URLs the CLI itself contacts.
    cli: Vec<String>,
    /// Patterns of the pages only the user's browser opens.
    #[serde(default)]
    browser: Vec<String>,
    /// Hosts the CLI contacts that the image's policy leaves out on purpose.
    #[serde(default)]
    elsewhere: std::collections::BTreeMap<String, Elsewhere>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Elsewhere {
    reason: String,
    /// A pattern that must still be found for the reason to hold.
    #[serde(default, rename = "while")]
    holds_while: Option<String>,
}

/// The host of the first `https://` URL in `text`.
fn https_host(text: &str) -> Option<String> {
    let rest = &text[text.find("https://")? + "https://".len()..];
    let host: String =
        rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-').collect();
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// An agent image's CLI contacts, for its sign-in, its token refresh and its API, only hosts its
/// policy allows (or that images/<agent>/signin.yaml leaves out, saying why): read out of the
/// installed CLI itself, so that a version that moves its sign-in fails here, naming the host
/// and the version, and not at the user's sign-in. The hosts only the browser opens are listed.
pub async fn its_sign_in_hosts_are_in_its_policy(subject: &Subject) -> anyhow::Result<()> {
    let name = subject.name.as_str();
    let Some(facts) = sandbox_facts(subject).await? else { return Ok(()) };
    let Some(version) = facts.labels.get(xtask::labels::AGENT_VERSION).cloned() else {
        eprintln!("{name} is not an agent image: no CLI signs in");
        return Ok(());
    };
    let path = subject.root.join("images").join(name).join("signin.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        anyhow::anyhow!("{name} is an agent image: {} says where its CLI signs in ({e})", path.display())
    })?;
    let signin: SignIn =
        yaml_serde::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(!signin.cli.is_empty(), "{}: no `cli` patterns", path.display());
    let script = r#"eval "$PREPARE" || exit 3; files=$(eval echo $FILES)
        while [ $# -gt 0 ]; do grep -ahoE -- "$2" $files | sort -u | sed "s|^|$1 |"; shift 2; done"#;
    let mut args: Vec<String> = ["env", &format!("PREPARE={}", signin.prepare.clone().unwrap_or_default())]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!("FILES={}", signin.files.join(" ")));
    args.extend(["sh", "-c", script, "sh"].map(String::from));
    for (kind, patterns) in [("cli", &signin.cli), ("browser", &signin.browser)] {
        for pattern in patterns {
            args.extend([kind.to_string(), pattern.clone()]);
        }
    }
    for (host, elsewhere) in &signin.elsewhere {
        if let Some(pattern) = &elsewhere.holds_while {
            args.extend([format!("while:{host}"), pattern.clone()]);
        }
    }
    let sb = facts.offline_subject().await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = sb.exec(&args).await?;
    anyhow::ensure!(out.code == 0, "reading {name}'s CLI: {out:?}");
    let policy = Policy::read(&subject.root.join("policies").join(format!("{name}.yaml")))?;
    let allowlist = sandbox_init::policy::Allowlist::new(&policy);
    let (mut cli, mut browser, mut holding) = (
        std::collections::BTreeMap::new(),
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    for line in out.stdout.lines() {
        let (kind, found) = line.split_once(' ').unwrap_or((line, ""));
        match (kind, https_host(found)) {
            ("cli", Some(host)) => {
                cli.entry(host).or_insert_with(|| found.to_string());
            }
            ("browser", Some(host)) => {
                browser.insert(host);
            }
            (kind, _) if kind.starts_with("while:") => {
                holding.insert(kind.trim_start_matches("while:").to_string());
            }
            _ => {}
        }
    }
    anyhow::ensure!(
        !cli.is_empty(),
        "{name} {version}: the patterns of {} found no host in {:?}: the CLI moved its constants",
        path.display(),
        signin.files
    );
    let mut missing = Vec::new();
    for (host, found) in &cli {
        let allowed = allowlist.matches(host).is_some_and(|m| m.access.tcp.contains(&443));
        match signin.elsewhere.get(host) {
            _ if allowed => {}
            Some(e) if e.holds_while.is_none() || holding.contains(host) => {
                eprintln!("{name} {version}: {host} left out of its policy: {}", e.reason);
            }
            Some(e) => missing.push(format!(
                "{host} ({found}): left out because {}, but `{}` is no longer found",
                e.reason,
                e.holds_while.as_deref().unwrap_or_default()
            )),
            None => missing.push(format!("{host} ({found})")),
        }
    }
    eprintln!("{name} {version}: its CLI contacts {:?}; the browser alone opens {browser:?}", cli.keys());
    anyhow::ensure!(
        missing.is_empty(),
        "{name} {version}: its CLI contacts hosts for its sign-in or its API that policies/{name}.yaml \
         does not allow: {}. Add them to its bundle in policies/services.yaml, or under `elsewhere` in {} with the reason",
        missing.join("; "),
        path.display()
    );
    Ok(())
}
