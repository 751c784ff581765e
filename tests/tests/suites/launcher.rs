//! The launcher, `agent-sandbox`, driven as a user drives it: the real binary against the engine.
//! `--offline` sandboxes need no capability, so most of the suite runs in both modes; the live
//! allowlist changes (`net_admin_`) need the firewall and run in the full mode only.

use sandbox_tests::docker::{TestNet, docker, exec};
use sandbox_tests::images::{RemoveTagOnDrop, image, with_change};
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::peers::Peer;
use sandbox_tests::probe::Probe;
use sandbox_tests::sandbox::Sandbox;

fn ls(json: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(serde_json::from_str(json)?)
}

#[tokio::test]
async fn run_detached_is_listed_a_second_run_reattaches_and_stop_ends_it() -> anyhow::Result<()> {
    let shell = image("shell").await?;
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let run = ["run", "shell", &project.path, "--detach", "--offline", "--image", &shell];
    launcher.ok(&run).await?;
    let (id, name) = project.sandbox().await?;

    let rows = ls(&launcher.ok(&["ls", "--json"]).await?.stdout)?;
    let row = rows.iter().find(|r| r["name"] == name.as_str()).expect("ls lists the sandbox");
    assert_eq!(row["agent"], "shell");
    assert_eq!(row["project"], project.path.as_str());
    assert_eq!(row["running"], true);
    let text = launcher.ok(&["ls"]).await?.stdout;
    let line = text.lines().find(|l| l.ends_with(&name)).expect("ls's text lists the sandbox");
    assert!(line.starts_with("shell ") && line.contains(&project.path) && line.contains("Up "), "{text}");

    // The same agent on the same project: the running sandbox, not a second one.
    let again = launcher.ok(&["run", "shell", &project.path, "--detach"]).await?;
    assert!(again.stderr.contains("reattaching"), "{again:?}");
    assert_eq!(project.sandbox().await?.0, id, "a second run started another container");
    // Options that would shape a new sandbox are refused, not dropped without a word.
    let shaped = launcher.run(&run).await?;
    assert_eq!(shaped.code, 64, "{shaped:?}");
    assert!(shaped.stderr.contains("--offline, --image would shape a new sandbox"), "{shaped:?}");
    assert_eq!(project.sandbox().await?.0, id);
    // Without a terminal, attaching says what to do.
    let attach = launcher.run(&["attach", &name]).await?;
    assert_eq!(attach.code, 64, "{attach:?}");
    assert!(attach.stderr.contains("attaching needs a terminal"), "{attach:?}");

    launcher.ok(&["stop", &name]).await?;
    assert!(project.containers().await?.is_empty(), "stop left the container");
    let rows = ls(&launcher.ok(&["ls", "--json"]).await?.stdout)?;
    assert!(!rows.iter().any(|r| r["name"] == name.as_str()), "{rows:?}");
    let gone = launcher.run(&["stop", &name]).await?;
    assert_eq!(gone.code, 68, "{gone:?}");
    Ok(())
}

/// The file at `path` in the sandbox, as root reads it, with its owner.
async fn file_in(id: &str, path: &str) -> anyhow::Result<Option<(String, String)>> {
    let out = exec(id, &["sh", "-c", &format!("stat -c %u {path} && cat {path}")], None).await?;
    Ok((out.code == 0).then(|| {
        let (owner, contents) = out.stdout.split_once('\n').unwrap_or_default();
        (owner.to_string(), contents.to_string())
    }))
}

#[tokio::test]
async fn two_projects_get_two_state_volumes_and_only_the_one_asked_gets_the_host_sign_in()
-> anyhow::Result<()> {
    let claude = image("claude").await?;
    let launcher = Launcher::new()?;
    let credentials = ".claude/.credentials.json";
    let signed_in = r#"{"claudeAiOauth":{"accessToken":"host-token-for-test"}}"#;
    std::fs::create_dir_all(launcher.home.path().join(".claude"))?;
    std::fs::write(launcher.home.path().join(credentials), signed_in)?;
    let (first, second) = (Project::new()?, Project::new()?);
    // The session's command records the arguments it was given (as the contract suite's does).
    let recorder = r#"ASSISTANT_CMD=sh -c 'printf "arg:%s\n" "$@" > /tmp/args; exec sleep 600' recorder"#;
    let run = |project: &str| {
        ["run", "claude", project, "--detach", "--offline", "--image", &claude, "--env", recorder]
            .map(str::to_string)
    };
    let mut with_login = run(&first.path).to_vec();
    with_login.push("--login-from-host".into());
    launcher.ok(&with_login).await?;
    let mut unattended = run(&second.path).to_vec();
    unattended.push("--unattended".into());
    launcher.ok(&unattended).await?;

    let (first_volumes, second_volumes) = (first.volumes().await?, second.volumes().await?);
    assert_eq!(first_volumes.len(), 1, "{first_volumes:?}");
    assert_eq!(second_volumes.len(), 1, "{second_volumes:?}");
    assert_ne!(first_volumes, second_volumes, "two projects share a state volume");
    let (first_id, _) = first.sandbox().await?;
    let (second_id, _) = second.sandbox().await?;
    let inside = format!("/home/agent/{credentials}");
    assert_eq!(
        file_in(&first_id, &inside).await?,
        Some(("1000".to_string(), signed_in.to_string())),
        "the host's sign-in is not in the first project's volume, as the agent's"
    );
    assert_eq!(file_in(&second_id, &inside).await?, None, "the second project got the host's sign-in");
    // --unattended: the session's command gets the image's unattended arguments; without, none.
    let recorded = |id: String| async move {
        for _ in 0..300 {
            let out = exec(&id, &["cat", "/tmp/args"], None).await?;
            if out.code == 0 {
                return anyhow::Ok(
                    out.stdout.lines().filter_map(|l| l.strip_prefix("arg:")).collect::<String>(),
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        anyhow::bail!("the session's command never ran")
    };
    assert_eq!(recorded(second_id.clone()).await?, "--dangerously-skip-permissions");
    assert_eq!(recorded(first_id.clone()).await?, "", "started unattended without --unattended");
    // The volume keeps it: the first project's next sandbox, without the flag, still has it.
    let (first_name, second_name) = (first.sandbox().await?.1, second.sandbox().await?.1);
    launcher.ok(&["stop", &first_name]).await?;
    launcher.ok(&run(&first.path)).await?;
    let (again, _) = first.sandbox().await?;
    assert_eq!(file_in(&again, &inside).await?.map(|f| f.1), Some(signed_in.to_string()));
    launcher.ok(&["stop", &second_name]).await?;

    // No sign-in on the host: the file is named, nothing starts.
    std::fs::remove_file(launcher.home.path().join(credentials))?;
    let third = Project::new()?;
    let mut missing = run(&third.path).to_vec();
    missing.push("--login-from-host".into());
    let out = launcher.run(&missing).await?;
    assert_eq!(out.code, 71, "{out:?}");
    assert!(out.stderr.contains(".claude/.credentials.json"), "{out:?}");
    assert!(third.containers().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_key_goes_in_as_a_root_only_secret_and_no_key_is_refused_by_name() -> anyhow::Result<()> {
    let claude = image("claude").await?;
    let key = "sk-ant-api03-launcher-test-key";
    let project = Project::new()?;
    let run = ["run", "claude", &project.path, "--detach", "--image", &claude];

    // No key, and no --no-key: the variable and the secret file are named, nothing is left.
    let launcher = Launcher::new()?;
    let out = launcher.run(&run).await?;
    assert_eq!(out.code, 67, "{out:?}");
    assert!(
        out.stderr.contains("ANTHROPIC_API_KEY") && out.stderr.contains("/run/secrets/anthropic_api_key"),
        "{out:?}"
    );
    assert!(project.containers().await?.is_empty(), "a refused run left a container");
    assert_eq!(project.volumes().await?, Vec::<String>::new(), "a refused run left its state volume");
    // The image's policy, read from the container, is kept by the image's id; the run below
    // decides the keys from that copy.
    let id = sandbox_tests::docker::docker().await?.inspect_image(&claude).await?.id.unwrap_or_default();
    let copy = launcher
        .home
        .path()
        .join(".cache/agent-sandbox/baked-policy")
        .join(format!("{}.yaml", id.trim_start_matches("sha256:")));
    let kept = std::fs::read_to_string(&copy)?;
    assert!(kept.contains("services: [anthropic]"), "{kept}");

    let launcher = launcher.env("ANTHROPIC_API_KEY", key);
    let mut offline = run.to_vec();
    offline.push("--offline");
    launcher.ok(&offline).await?;
    let (id, _) = project.sandbox().await?;
    let secret = exec(&id, &["stat", "-c", "%u %a", "/run/secrets/anthropic_api_key"], None).await?;
    assert_eq!(secret.stdout.trim(), "0 400", "{secret:?}");
    // Not in the container's configuration, not in the agent's environment.
    let inspect = sandbox_tests::docker::docker()
        .await?
        .inspect_container(&id, None::<bollard::query_parameters::InspectContainerOptions>)
        .await?;
    let env = inspect.config.and_then(|c| c.env).unwrap_or_default();
    assert!(!env.iter().any(|e| e.contains(key)), "{env:?}");
    let agent = exec(
        &id,
        &["sandbox-exec", "--", "sh", "-c", "echo $ANTHROPIC_API_KEY; cat /run/secrets/anthropic_api_key"],
        None,
    )
    .await?;
    assert!(!agent.stdout.contains(key), "the agent read the key: {agent:?}");
    assert!(agent.stdout.contains("held-by-agent-sandbox"), "the agent has no placeholder: {agent:?}");
    Ok(())
}

#[tokio::test]
async fn bad_input_no_engine_and_no_image_give_their_messages_and_codes() -> anyhow::Result<()> {
    let shell = image("shell").await?;
    let launcher = Launcher::new()?;
    let project = Project::new()?;

    let out = launcher
        .run(&["run", "shell", &project.path, "--allow", "docs.rs", "--allow", "exa mple.com"])
        .await?;
    assert_eq!(out.code, 64, "{out:?}");
    assert!(out.stderr.contains("--allow #2 `exa mple.com`, character 4"), "{out:?}");
    let out = launcher.run(&["allow", "shell", "https://docs.rs"]).await?;
    assert_eq!(out.code, 64, "{out:?}");
    assert!(out.stderr.contains("DOMAIN #1 `https://docs.rs`, character 7"), "{out:?}");

    let policy = project.dir.path().join("bad.yaml");
    std::fs::write(&policy, "version: 1\ndomains:\n  - docs.rs\n  - bad domain\n")?;
    let out = launcher
        .run(&["run", "shell", &project.path, "--detach", "--policy", &policy.to_string_lossy()])
        .await?;
    assert_eq!(out.code, 65, "{out:?}");
    assert!(out.stderr.contains("bad.yaml:4:"), "{out:?}");

    let nowhere = Launcher::new()?.env("DOCKER_HOST", "unix:///nonexistent/agent-sandbox-test.sock");
    let out = nowhere.run(&["run", "shell", &project.path, "--detach", "--image", &shell]).await?;
    assert_eq!(out.code, 69, "{out:?}");
    assert!(
        out.stderr.contains("no container engine answers at unix:///nonexistent/agent-sandbox-test.sock"),
        "{out:?}"
    );
    assert_eq!(nowhere.run(&["ls"]).await?.code, 69);

    let unbuilt = Launcher::new()?.env("AGENT_SANDBOX_PREFIX", "localhost/agent-sandbox-test-unbuilt");
    let out = unbuilt.run(&["run", "shell", &project.path, "--detach"]).await?;
    assert_eq!(out.code, 66, "{out:?}");
    assert!(out.stderr.contains("cargo xtask build shell"), "{out:?}");
    let out = launcher
        .run(&["run", "shell", &project.path, "--detach", "--image", "localhost/agent-sandbox-test/none:0"])
        .await?;
    assert_eq!(out.code, 66, "{out:?}");
    // sandbox-init refuses to start (the image names a resolver on loopback): the run says so
    // with sandbox-init's own words and code, once its log ends, and removes what it made.
    let stops =
        with_change(&shell, "localhost/agent-sandbox-test/stops-at-start:1", "ENV SANDBOX_DNS=127.0.0.1")?;
    let out = launcher.run(&["run", "shell", &project.path, "--detach", "--image", &stops.0]).await?;
    assert_eq!(out.code, 70, "{out:?}");
    assert!(
        out.stderr.contains("stopped at start (exit 78); sandbox-init said:")
            && out.stderr.contains("127.0.0.1 is not a resolver outside the container"),
        "{out:?}"
    );
    // Not detached, with no terminal to attach: said before anything starts.
    let out = launcher.run(&["run", "shell", &project.path, "--image", &shell]).await?;
    assert_eq!(out.code, 64, "{out:?}");
    assert!(out.stderr.contains("no terminal to attach to: add --detach"), "{out:?}");
    assert!(project.containers().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_agent_cannot_write_the_runtime_drop_in_nor_signal_a_reload() -> anyhow::Result<()> {
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let id = launcher.offline_shell(&project, &["--allow", "docs.rs"]).await?;
    let drop_in = "/etc/agent-sandbox/policy.d/launcher.txt";
    // Positive control: the launcher wrote it, as root, with the name asked for.
    let before = exec(&id, &["cat", drop_in], None).await?;
    assert!(before.stdout.lines().any(|l| l == "docs.rs"), "{before:?}");

    let attempts = [
        format!("echo evil.test >> {drop_in}"),
        format!("cp {drop_in} /tmp/x && echo evil.test >> /tmp/x && mv -f /tmp/x {drop_in}"),
        "echo evil.test > /etc/agent-sandbox/policy.d/zz-agent.txt".to_string(),
        format!("rm -f {drop_in}"),
        "echo 2099-01-01T00:00:00.000Z > /run/agent-sandbox/launcher-pending.mark".to_string(),
        "kill -HUP 1".to_string(),
    ];
    for attempt in &attempts {
        let out = exec(&id, &["sandbox-exec", "--", "sh", "-c", attempt], None).await?;
        assert_ne!(out.code, 0, "the agent managed `{attempt}`: {out:?}");
    }
    let after = exec(&id, &["sh", "-c", "cat /etc/agent-sandbox/policy.d/*"], None).await?;
    assert_eq!(after.stdout, before.stdout, "the drop-ins changed");
    let logs = sandbox_tests::docker::container_logs(&id).await?;
    assert!(!format!("{}{}", logs.0, logs.1).contains("reloaded"), "the agent made PID 1 reload: {logs:?}");

    // deny never says a name is closed while another entry still allows it.
    launcher.ok(&["allow", &id, "*.wild.launcher.test", "api.wild.launcher.test"]).await?;
    let out = launcher.run(&["deny", &id, "api.wild.launcher.test"]).await?;
    assert_eq!(out.code, 64, "{out:?}");
    assert!(
        out.stderr.contains("`api.wild.launcher.test` stays allowed by `*.wild.launcher.test`"),
        "{out:?}"
    );
    let out = launcher.run(&["deny", &id, "github.com"]).await?;
    assert_eq!(out.code, 64, "{out:?}");
    assert!(
        exec(&id, &["cat", drop_in], None).await?.stdout.contains("api.wild.launcher.test"),
        "deny changed it"
    );
    // allow waits for the policy in force, ports included (deb.debian.org is the image's, on 80
    // and 443).
    launcher.ok(&["allow", &id, "deb.debian.org:8443"]).await?;
    let status = launcher.ok(&["status", &id, "--json"]).await?;
    let domains: serde_json::Value = serde_json::from_str(&status.stdout)?;
    assert!(
        domains["domains"].as_array().is_some_and(|d| d.iter().any(|d| d == "deb.debian.org (80,443,8443)")),
        "{}",
        domains["domains"]
    );
    Ok(())
}

/// With nothing built under the launcher's image name, `run` pulls the digest the lock pins (here
/// $AGENT_SANDBOX_IMAGES_LOCK's, pinning the shell image pushed to a registry on loopback) and
/// starts from it; a lock file that is not there is refused by name.
#[tokio::test]
async fn with_nothing_built_the_image_is_pulled_by_the_digest_the_lock_pins() -> anyhow::Result<()> {
    let shell = image("shell").await?;
    let registry = sandbox_tests::registry::LocalRegistry::start(false)?;
    let engine = xtask::engine::Engine::connect().await?;
    let id = engine.image_id(&shell).await?.expect("the shell image");
    let repository = format!("{}/launcher-pull/agent-shell", registry.addr);
    let _untag = RemoveTagOnDrop(format!("{repository}:published"));
    engine.tag(&id, &repository, "published").await?;
    engine.push(&repository, "published", None, |_| {}).await?;
    let inspect = engine.docker().inspect_image(&format!("{repository}:published")).await?;
    let pinned = inspect
        .repo_digests
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.starts_with(&format!("{repository}@sha256:")))
        .expect("the push recorded the registry's digest");
    let _unpin = RemoveTagOnDrop(pinned.clone());
    engine.remove_tag(&format!("{repository}:published")).await?;
    engine.remove_tag(&pinned).await?;
    assert_eq!(engine.image_id(&pinned).await?, None, "{pinned} still resolves locally: no real pull");

    let dir = tempfile::tempdir()?;
    let lock_path = dir.path().join("images.lock");
    let mut lock = xtask::lock::ImagesLock::read(&sandbox_tests::root().join("images.lock"))?;
    lock.images.get_mut("shell").expect("shell is in the lock").pinned = Some(pinned.clone());
    lock.write(&lock_path)?;
    let lock_path = lock_path.to_string_lossy().into_owned();
    let project = Project::new()?;
    let launcher = Launcher::new()?
        .env("AGENT_SANDBOX_PREFIX", "localhost/agent-sandbox-nothing-built")
        .env("AGENT_SANDBOX_IMAGES_LOCK", &lock_path);
    let out = launcher.ok(&["run", "shell", &project.path, "--detach", "--offline"]).await?;
    assert!(out.stderr.contains(&format!("pulling {pinned}")), "{out:?}");
    let (container, _) = project.sandbox().await?;
    let started = sandbox_tests::docker::docker().await?.inspect_container(&container, None).await?;
    assert_eq!(started.image.as_deref(), Some(id.as_str()), "the sandbox's image");
    assert_eq!(started.config.and_then(|c| c.image).as_deref(), Some(pinned.as_str()));

    // A lock named but not there is refused, naming it; nothing is started.
    let other = Project::new()?;
    let missing = format!("{lock_path}.missing");
    let out = Launcher::new()?
        .env("AGENT_SANDBOX_PREFIX", "localhost/agent-sandbox-nothing-built")
        .env("AGENT_SANDBOX_IMAGES_LOCK", &missing)
        .run(&["run", "shell", &other.path, "--detach", "--offline"])
        .await?;
    assert_eq!(out.code, 64, "{out:?}");
    assert!(out.stderr.contains(&format!("AGENT_SANDBOX_IMAGES_LOCK={missing}: no such file")), "{out:?}");
    assert!(other.containers().await?.is_empty());
    Ok(())
}

/// Changes made at once (two terminals, a script approving while the user denies) are made one
/// after the other: none is lost, and each waits for the policy it made to be in force.
#[tokio::test]
async fn concurrent_allows_and_denies_lose_no_change() -> anyhow::Result<()> {
    let runtime_dir = tempfile::tempdir()?;
    let launcher = Launcher::new()?.env("XDG_RUNTIME_DIR", &runtime_dir.path().to_string_lossy());
    let project = Project::new()?;
    let id = launcher.offline_shell(&project, &["--allow", "gone.test"]).await?;
    let names: Vec<String> = (0..6).map(|i| format!("n{i}.concurrent.test")).collect();
    let mut changes: Vec<Vec<&str>> = names.iter().map(|n| vec!["allow", &id, n.as_str()]).collect();
    changes.push(vec!["deny", &id, "gone.test"]);
    let outcomes = futures_util::future::join_all(changes.iter().map(|args| launcher.run(args))).await;
    for (args, out) in changes.iter().zip(outcomes) {
        let out = out?;
        assert_eq!(out.code, 0, "agent-sandbox {args:?}: {out:?}");
    }
    let drop_in = exec(&id, &["cat", "/etc/agent-sandbox/policy.d/launcher.txt"], None).await?.stdout;
    let held: Vec<&str> = drop_in.lines().filter(|l| !l.starts_with('#')).collect();
    let mut expected: Vec<&str> = names.iter().map(String::as_str).collect();
    expected.sort();
    let mut sorted = held.clone();
    sorted.sort();
    assert_eq!(sorted, expected, "the drop-in after the changes:\n{drop_in}");
    // And PID 1 enforces exactly that: every name allowed, the denied one gone.
    let status: serde_json::Value =
        serde_json::from_str(&launcher.ok(&["status", &id, "--json"]).await?.stdout)?;
    let domains = status["domains"].to_string();
    for name in &names {
        assert!(domains.contains(&format!("\"{name} (")), "{name} is not in force: {domains}");
    }
    assert!(!domains.contains("gone.test"), "the denied name is still in force: {domains}");
    // The lock is the user's alone, in a folder of the user's alone, and goes with the sandbox.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?);
    let folder = runtime_dir.path().join(format!("agent-sandbox-{uid}"));
    let lock = folder.join(format!("{id}.lock"));
    let mode = |path: &std::path::Path| {
        anyhow::Ok(std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path)?.permissions()) & 0o777)
    };
    assert_eq!(mode(&lock)?, 0o600, "{}", lock.display());
    assert_eq!(mode(&folder)?, 0o700, "{}", folder.display());
    launcher.ok(&["stop", &id]).await?;
    assert!(!lock.exists(), "stop left {}", lock.display());
    Ok(())
}

/// The agent's connection to `target` through the probe.
async fn connect(sb: &Sandbox, host: &str) -> anyhow::Result<Probe> {
    sb.probe(&["tcp", host, "443", "--timeout-ms", "3000"]).await
}

/// The pid of the process in the session's pane (the agent's command).
async fn pane_pid(id: &str) -> anyhow::Result<String> {
    let out = exec(
        id,
        &["sandbox-exec", "--", "tmux", "display-message", "-p", "-t", "agent", "#{pane_pid}"],
        None,
    )
    .await?;
    anyhow::ensure!(out.code == 0 && !out.stdout.trim().is_empty(), "{out:?}");
    Ok(out.stdout.trim().to_string())
}

/// What the `upload` probe got through to `host`'s port 80: its outcome and the bytes it sent.
async fn upload(sb: &Sandbox, host: &str, bytes: u64) -> anyhow::Result<(String, u64)> {
    let probe = sb.probe(&["upload", host, "80", &bytes.to_string(), "--timeout-ms", "20000"]).await?;
    let sent = probe.fields.get("sent").and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((probe.outcome().to_string(), sent))
}

/// `agent-sandbox verify IMAGE --json` with the suites' probe: the scorecard, parsed, and checked
/// against docs/verify.schema.json by a JSON Schema validator (kubernetes-validate's Python has
/// `jsonschema`; `cargo xtask setup --tests` installs it).
async fn verify(image: &str, extra: &[&str]) -> anyhow::Result<(i32, serde_json::Value)> {
    let probe = sandbox_tests::probe::probe_binary()?;
    let mut args = vec!["verify", image, "--json", "--probe"];
    let probe = probe.display().to_string();
    args.push(&probe);
    args.extend_from_slice(extra);
    let out = Launcher::new()?.run(&args).await?;
    let card: serde_json::Value = serde_json::from_str(&out.stdout).map_err(|e| {
        anyhow::anyhow!("verify printed no JSON ({e}), exit {}: {}{}", out.code, out.stdout, out.stderr)
    })?;
    let python = xtask::setup::ci_tools(&sandbox_tests::root())
        .join(xtask::setup::KUBERNETES_VALIDATE_DIR)
        .join("bin/python");
    let schema = sandbox_tests::root().join("docs/verify.schema.json");
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("card.json");
    std::fs::write(&file, &out.stdout)?;
    let check = "import json, sys, jsonschema\n\
        jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), \
        cls=jsonschema.Draft202012Validator)";
    let valid = std::process::Command::new(&python).args(["-c", check]).arg(&file).arg(&schema).output()?;
    anyhow::ensure!(
        valid.status.success(),
        "the card breaks its schema: {}",
        String::from_utf8_lossy(&valid.stderr)
    );
    // Nothing of the test world is left: no container, no network.
    eprintln!("verify {image}: exit {}, {} s\n{}", out.code, card["seconds"], out.stderr);
    let world = world_of(&out.stderr)?;
    anyhow::ensure!(left_of(&world) == (0, 0), "the test world {world} is left behind");
    Ok((out.code, card))
}

/// The test world's name, from verify's first line on stderr.
fn world_of(stderr: &str) -> anyhow::Result<String> {
    let name = stderr.split("(network ").nth(1).and_then(|rest| rest.split(')').next());
    name.map(str::to_string).ok_or_else(|| anyhow::anyhow!("verify named no test world: {stderr}"))
}

/// How many containers and networks of the test world `world` the engine still has.
fn left_of(world: &str) -> (usize, usize) {
    let count = |args: &[&str]| {
        let out = std::process::Command::new("docker").args(args).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().count()).unwrap_or(usize::MAX)
    };
    let label = format!("label=io.github.agent-sandbox.verify={world}");
    (count(&["ps", "-aq", "--filter", &label]), count(&["network", "ls", "-q", "--filter", &label]))
}

/// Each check's verdict, by id.
fn verdicts(card: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    card["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["id"].as_str().unwrap_or_default().to_string(),
                c["verdict"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn failed(card: &serde_json::Value) -> Vec<String> {
    verdicts(card).into_iter().filter(|(_, v)| v == "FAIL").map(|(id, _)| id).collect()
}

net_admin! {
    [single, sidecar] {
        /// A name past its upload budget is listed by `pending` with its budget, and `allow NAME
        /// --upload SIZE` raises the budget live: the next upload goes through whole, and the name
        /// leaves the list. A size that is not one, or one that would lower the budget, is refused
        /// with 64.
        #[tokio::test]
        async fn a_spent_upload_budget_is_pending_and_allow_upload_raises_it_live() -> anyhow::Result<()> {
            let shell = image("shell").await?;
            let net = TestNet::create("launcher-budget").await?;
            let peer = Peer::start(&net, &["up.launcher.test"]).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let policy = project.dir.path().join("budget.yaml");
            std::fs::write(&policy, "version: 1\ndomains:\n  - {domain: up.launcher.test, upload: 1MB}\n")?;
            let policy = policy.to_string_lossy().to_string();
            launcher
                .ok(&[
                    "run",
                    "shell",
                    &project.path,
                    "--detach",
                    "--network",
                    &net.name,
                    "--image",
                    &shell,
                    "--policy",
                    &policy,
                ])
                .await?;
            let (id, name) = project.sandbox().await?;
            let sb = Sandbox::adopt(&id).await?;

            // 3 MB to a name of 1 MB an hour: cut (the probe's own count says little, its writes fill
            // the socket's buffers first), and the next connection is refused.
            upload(&sb, "up.launcher.test", 3_000_000).await?;
            let again = sb.probe(&["tcp", "up.launcher.test", "80", "--http"]).await?;
            assert_eq!(again.outcome(), "denied", "a connection past the budget: {:?}", again.fields);
            let queue: Vec<serde_json::Value> =
                serde_json::from_str(&launcher.ok(&["pending", &name, "--json"]).await?.stdout)?;
            let spent =
                queue.iter().find(|p| p["name"] == "up.launcher.test").expect("pending lists the spent budget");
            assert_eq!(
                (&spent["upload"]["budget"], &spent["kind"]),
                (&1_000_000.into(), &"upload".into()),
                "{queue:?}"
            );
            assert!(spent["count"].as_u64() >= Some(1), "{queue:?}");
            let text = launcher.ok(&["pending", &name]).await?;
            assert!(
                text.stdout.contains("UPLOAD BUDGET SPENT") && text.stdout.contains("up.launcher.test"),
                "{text:?}"
            );
            // `why` says what the policy alone does not: allowed, but its budget is spent.
            let why = launcher.run(&["why", &name, "up.launcher.test:80"]).await?;
            assert_eq!(why.code, 1, "{why:?}");
            assert!(
                why.stdout.contains("upload budget of 1000000 bytes an hour (up.launcher.test) was spent")
                    && why.stdout.contains(&format!(
                        "to allow it: agent-sandbox allow {name} up.launcher.test --upload SIZE (above 1000000)"
                    )),
                "{why:?}"
            );

            let bad = launcher.run(&["allow", &name, "up.launcher.test", "--upload", "lots"]).await?;
            assert_eq!(bad.code, 64, "{bad:?}");
            assert!(bad.stderr.contains("--upload lots: `lots` is not a size"), "{bad:?}");
            launcher.ok(&["allow", &name, "up.launcher.test", "--upload", "64MB"]).await?;
            let (outcome, sent) = upload(&sb, "up.launcher.test", 3_000_000).await?;
            assert_eq!((outcome.as_str(), sent), ("sent", 3_000_000), "the raised budget");
            let why = launcher.run(&["why", &name, "up.launcher.test:80"]).await?;
            assert_eq!(why.code, 0, "a raised budget is still spent to `why`: {why:?}");
            let log = peer.log().await?;
            let last: u64 = log
                .iter()
                .rev()
                .find_map(|l| l.strip_prefix("conn 80 ")?.split("bytes=").nth(1)?.parse().ok())
                .unwrap_or(0);
            assert!(last >= 3_000_000, "the peer received {last} bytes of the upload after the raise: {log:#?}");
            let queue = launcher.ok(&["pending", &name, "--json"]).await?.stdout;
            assert!(!queue.contains("up.launcher.test"), "a raised budget is still listed: {queue}");
            let drop_in = sb.exec(&["cat", "/etc/agent-sandbox/policy.d/launcher.txt"]).await?.stdout;
            assert!(drop_in.contains("up.launcher.test upload=64000000"), "{drop_in}");
            // A budget is raised this way, never lowered.
            let lower = launcher.run(&["allow", &name, "up.launcher.test", "--upload", "1KB"]).await?;
            assert_eq!(lower.code, 64, "{lower:?}");
            assert!(lower.stderr.contains("would lower a budget (up.launcher.test has 64000000 bytes"), "{lower:?}");
            launcher.ok(&["stop", &name]).await?;
            Ok(())
        }
        #[tokio::test]
        async fn allow_opens_a_refused_name_live_pending_lists_it_and_deny_closes_it() -> anyhow::Result<()>
        {
            let net = TestNet::create("launcher").await?;
            let _peer = Peer::start(&net, &["docs.launcher.test"]).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let (id, name) = launcher.shell_on(&project, &net).await?;
            let sb = Sandbox::adopt(&id).await?;
            let pid = pane_pid(&id).await?;

            let refused = connect(&sb, "docs.launcher.test").await?;
            assert!(refused.outcome().starts_with("dns:"), "the name was not refused at first: {:?}", refused.fields);
            // `policy check` of the running sandbox says what it did, and what would change it.
            let check = ["policy", "check", name.as_str(), "https://docs.launcher.test/", "docs.launcher.test:443"];
            let said = launcher.run(&check).await?;
            assert_eq!(said.code, 1, "{said:?}");
            let why = launcher.run(&["why", &name, "docs.launcher.test"]).await?;
            assert_eq!(why.code, 1, "{why:?}");
            assert!(why.stdout.contains("; the DNS gate refused it "), "{why:?}");
            assert!(
                said.stdout.contains("refused  https://docs.launcher.test/")
                    && said.stdout.contains("docs.launcher.test is not in the policy")
                    && said.stdout.contains(&format!("to allow it: agent-sandbox allow {name} docs.launcher.test\n")),
                "{said:?}"
            );
            let pending = launcher.ok(&["pending", &name, "--json"]).await?;
            let queue: Vec<serde_json::Value> = serde_json::from_str(&pending.stdout)?;
            let entry =
                queue.iter().find(|p| p["name"] == "docs.launcher.test").expect("pending lists the refused name");
            assert!(entry["count"].as_u64() >= Some(1), "{queue:?}");
            assert!(launcher.ok(&["pending", &name]).await?.stdout.contains("docs.launcher.test"));

            // A name under a site the policy never allowed is approved only with --yes N.
            let unasked = launcher.run(&["allow", &name, "--pending"]).await?;
            assert_eq!(unasked.code, 64, "{unasked:?}");
            assert!(
                unasked.stderr.contains("no entry of the sandbox's policy is under launcher.test"),
                "{unasked:?}"
            );
            launcher.ok(&["allow", &name, "--pending", "--yes", "1"]).await?;
            let allowed = connect(&sb, "docs.launcher.test").await?;
            assert_eq!(allowed.outcome(), "connected", "allow did not open the name: {:?}", allowed.fields);
            let said = launcher.run(&check).await?;
            assert_eq!(said.code, 0, "{said:?}");
            assert!(said.stdout.contains("the entry docs.launcher.test opens it ("), "{said:?}");
            let json = launcher.ok(&[&check[..], &["--json"]].concat()).await?;
            let answers: Vec<serde_json::Value> = serde_json::from_str(&json.stdout)?;
            assert_eq!(answers.len(), 2, "{answers:?}");
            assert!(answers.iter().all(|a| a["allowed"] == true && a["reason"].is_string()), "{answers:?}");
            assert_eq!(pane_pid(&id).await?, pid, "the session was restarted");
            let empty = launcher.ok(&["pending", &name, "--json"]).await?;
            assert_eq!(
                serde_json::from_str::<Vec<serde_json::Value>>(&empty.stdout)?,
                Vec::<serde_json::Value>::new()
            );

            launcher.ok(&["deny", &name, "docs.launcher.test"]).await?;
            let closed = connect(&sb, "docs.launcher.test").await?;
            assert!(
                closed.outcome() == "refused" || closed.outcome().starts_with("dns:"),
                "deny left it open: {:?}",
                closed.fields
            );
            assert_eq!(launcher.run(&check).await?.code, 1, "policy check still allows a denied name");
            assert_eq!(pane_pid(&id).await?, pid, "the session was restarted");
            // A name refused after the approval is queued, until dismissed. (Another name: the denial
            // log folds a name refused again within 10 s into its next line.)
            assert!(connect(&sb, "other.launcher.test").await?.outcome().starts_with("dns:"));
            let queued = launcher.ok(&["pending", &name, "--json"]).await?;
            assert!(queued.stdout.contains("other.launcher.test"), "{queued:?}");
            launcher.ok(&["pending", &name, "--dismiss"]).await?;
            // --pending approves what `pending` showed: after a dismissal, nothing is reviewed. (Asked
            // before the next look: that look reviews whatever was logged since, a late line of the
            // probe's refusals among it.)
            let unreviewed = launcher.run(&["allow", &name, "--pending"]).await?;
            assert_eq!(unreviewed.code, 64, "{unreviewed:?}");
            assert!(unreviewed.stderr.contains("nothing reviewed to approve"), "{unreviewed:?}");
            let dismissed = launcher.ok(&["pending", &name, "--json"]).await?;
            assert!(!dismissed.stdout.contains("other.launcher.test"), "{dismissed:?}");
            // Only what `allow` gave can be taken back.
            let out = launcher.run(&["deny", &name, "github.com"]).await?;
            assert_eq!(out.code, 64, "{out:?}");
            Ok(())
        }
        /// `run --sidecar`: one sandbox in `ls`, three containers in the engine (the agent's, with no
        /// capability, its gateway, and the holder of their network namespace), `status` and `allow`
        /// reach the gateway, and `stop` removes all three and their shared volume, keeping the state.
        #[tokio::test]
        async fn a_sidecar_sandbox_is_listed_once_and_stop_removes_its_three_containers()
        -> anyhow::Result<()> {
            let shell = image("shell").await?;
            let net = TestNet::create("launcher-sidecar").await?;
            let _peer = Peer::start(&net, &["docs.sidecar.test"]).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            launcher
                .ok(&[
                    "run",
                    "shell",
                    &project.path,
                    "--detach",
                    "--sidecar",
                    "--network",
                    &net.name,
                    "--image",
                    &shell,
                ])
                .await?;
            let (id, name) = project.sandbox().await?;
            let all = project.containers().await?;
            for part in [format!("{name}.gateway"), format!("{name}.net")] {
                assert!(all.iter().any(|(_, n)| *n == part), "no {part}: {all:?}");
            }
            let rows = ls(&launcher.ok(&["ls", "--json"]).await?.stdout)?;
            assert_eq!(rows.iter().filter(|r| r["project"] == project.path.as_str()).count(), 1, "{rows:?}");
            // The agent's container: the agent, no capability in any set, PID 1 included.
            let caps = exec(&id, &["sh", "-c", "grep -hE '^(Uid|CapPrm|CapEff|CapBnd|CapAmb)' /proc/1/status"], None)
                .await?;
            assert!(caps.stdout.starts_with("Uid:\t1000\t"), "{caps:?}");
            assert_eq!(caps.stdout.matches("0000000000000000").count(), 4, "{caps:?}");
            // Status and the live allowlist are the gateway's.
            let status = launcher.ok(&["status", &name, "--json"]).await?;
            assert!(status.stdout.contains("\"firewall\": \"on\""), "{status:?}");
            let sb = Sandbox::adopt(&id).await?;
            assert!(sb.probe(&["dns", "docs.sidecar.test"]).await?.outcome().starts_with("dns:refused"));
            launcher.ok(&["allow", &name, "docs.sidecar.test"]).await?;
            assert_eq!(sb.probe(&["tcp", "docs.sidecar.test", "443"]).await?.outcome(), "connected");

            launcher.ok(&["stop", &name]).await?;
            assert!(project.containers().await?.is_empty(), "stop left a container");
            let volumes = project.volumes().await?;
            assert!(!volumes.iter().any(|v| v.ends_with(".shared")), "stop left the shared volume: {volumes:?}");

            // A shared volume a container still uses cannot be made afresh: the next run is
            // refused, saying what holds it, rather than handing the agent's container the last
            // gateway's ready file. Once it is gone, the run starts (the control).
            let shared = format!("{name}.shared");
            let docker = docker().await?;
            let body = bollard::models::ContainerCreateBody {
                image: Some(shell.clone()),
                labels: Some([(sandbox_tests::docker::TEST_LABEL.to_string(), "leftover".to_string())].into()),
                host_config: Some(bollard::models::HostConfig {
                    binds: Some(vec![format!("{shared}:/shared")]),
                    network_mode: Some("none".into()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let options = None::<bollard::query_parameters::CreateContainerOptions>;
            let leftover = sandbox_tests::docker::RemoveOnDrop(docker.create_container(options, body).await?.id);
            let run = ["run", "shell", &project.path, "--detach", "--sidecar", "--network", &net.name, "--image", &shell];
            let refused = launcher.run(&run).await?;
            assert_eq!(refused.code, 1, "{refused:?}");
            assert!(
                refused.stderr.contains(&format!("cannot remove the last run's shared volume {shared}")),
                "{refused:?}"
            );
            assert!(project.containers().await?.is_empty(), "a refused run left a container");
            drop(leftover);
            let mut gone = false;
            for _ in 0..50 {
                let listed = docker
                    .list_containers(Some(
                        bollard::query_parameters::ListContainersOptionsBuilder::default()
                            .all(true)
                            .filters(&[("volume", vec![shared.as_str()])].into())
                            .build(),
                    ))
                    .await?;
                if listed.is_empty() {
                    gone = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(gone, "the leftover container is still there");
            launcher.ok(&run).await?;
            launcher.ok(&["stop", &name]).await?;
            Ok(())
        }
    }
    [single] {
        /// The shell image holds: every check passes but the held key's, which is N/A (no key given),
        /// and the world is gone after.
        #[tokio::test]
        async fn verify_the_shell_image_passes_every_check() -> anyhow::Result<()> {
            let (code, card) = verify(&image("shell").await?, &[]).await?;
            let verdicts = verdicts(&card);
            let ids: Vec<&str> =
                card["checks"].as_array().into_iter().flatten().filter_map(|c| c["id"].as_str()).collect();
            assert_eq!(ids, sandbox_verify::CHECKS, "every check, in order: {card:#}");
            for (id, verdict) in &verdicts {
                let expected = if id == "keys.held" { "N/A" } else { "PASS" };
                assert_eq!(verdict, expected, "{id}: {card:#}");
            }
            assert_eq!(code, 0, "{card:#}");
            Ok(())
        }
        /// `verify S` of a running sandbox: its image in a fresh world with the policy it runs with (its
        /// `--allow` of the blocked name fails exactly the checks that reach it), and its own agent's
        /// processes read where they run; the sandbox itself runs on, untouched.
        #[tokio::test]
        async fn verify_a_running_sandbox_checks_its_policy_and_its_agents_processes() -> anyhow::Result<()> {
            let shell = image("shell").await?;
            let net = TestNet::create("verify-running").await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let run = ["run", "shell", &project.path, "--detach", "--network", &net.name, "--image", &shell];
            launcher.ok(&[&run[..], &["--allow", "blocked.verify.test"]].concat()).await?;
            let (id, name) = project.sandbox().await?;
            let (code, card) = verify(&name, &[]).await?;
            assert_eq!(card["sandbox"], name.as_str(), "{card:#}");
            assert_eq!(code, 73, "{card:#}");
            assert_eq!(failed(&card), ["egress.blocked-name", "names.host", "names.sni"], "{card:#}");
            let running = card["checks"].as_array().into_iter().flatten().find(|c| c["id"] == "running.processes");
            let running = running.cloned().unwrap_or_default();
            assert_eq!(running["verdict"], "PASS", "{card:#}");
            assert!(running["evidence"].as_str().unwrap_or_default().contains("processes as uid 1000"), "{card:#}");
            let state = docker().await?.inspect_container(&id, None).await?.state.and_then(|s| s.running);
            assert_eq!(state, Some(true), "verify left the sandbox running");
            // Flags that would shape the sandbox are refused for a running one.
            let probe = sandbox_tests::probe::probe_binary()?.display().to_string();
            let out = launcher.run(&["verify", &name, "--sidecar", "--probe", &probe]).await?;
            assert_eq!(out.code, 64, "{out:?}");
            assert!(out.stderr.contains("is a running sandbox"), "{out:?}");
            Ok(())
        }
        /// A deliberately broken variant fails exactly what it should: a policy that allows the
        /// blocked name (and an API, whose made-up key the sandbox holds and the agent never finds)
        /// fails the checks that reach it (by name, by Host, by SNI) and no other (a second
        /// request on one connection stays refused: a connection keeps the one name it was opened for);
        /// the firewall left open (SANDBOX_FIREWALL=open in the image) fails every check of the network,
        /// and starts without NET_ADMIN, while the agent's privileges and the policy files hold; an
        /// entrypoint that copies the secrets out fails the held key's check.
        #[tokio::test]
        async fn verify_a_policy_allowing_the_blocked_name_or_an_open_firewall_fails_those_checks()
        -> anyhow::Result<()> {
            let shell = image("shell").await?;
            let dir = tempfile::tempdir()?;
            let policy = dir.path().join("wide.yaml");
            // Anthropic's API too: verify gives the sandbox a made-up key to hold, which the agent's
            // hunt must not find.
            std::fs::write(&policy, "version: 1\ndomains:\n  - blocked.verify.test\n  - api.anthropic.com\n")?;
            let (code, card) = verify(&shell, &["--policy", &policy.display().to_string()]).await?;
            assert_eq!(code, 73, "{card:#}");
            assert_eq!(failed(&card), ["egress.blocked-name", "names.host", "names.sni"], "{card:#}");
            assert_eq!(verdicts(&card)["keys.held"], "PASS", "{card:#}");
            let open =
                with_change(&shell, "localhost/agent-sandbox-test/verify-open:1", "ENV SANDBOX_FIREWALL=open")?;
            let (code, card) = verify(&open.0, &[]).await?;
            assert_eq!(code, 73, "{card:#}");
            // Every check of the network fails; the agent's privileges and the policy files hold.
            let expected = [
                "dns.direct",
                "dns.exfiltration",
                "dns.forged-answer",
                "egress.address",
                "egress.address-ipv6",
                "egress.blocked-name",
                "egress.fail-closed",
                "egress.icmp",
                "egress.udp",
                "firewall.tamper",
                "ingress.listener",
                "names.host",
                "names.second-request",
                "names.sni",
            ];
            assert_eq!(failed(&card), expected, "{card:#}");
            assert_eq!(verdicts(&card)["egress.allowed"], "PASS", "the control: {card:#}");
            // An entrypoint that copies the secrets where the agent reads them before it starts
            // sandbox-init: the held key's check, and only it, fails.
            let copy = r#"ENTRYPOINT ["/bin/sh", "-c", "cp /run/secrets/* /tmp/ && chmod 644 /tmp/*_key; exec /usr/local/bin/sandbox-init"]"#;
            let leaky = with_change(&shell, "localhost/agent-sandbox-test/verify-leaky:1", copy)?;
            let (code, card) = verify(&leaky.0, &["--policy", &policy.display().to_string()]).await?;
            assert_eq!(code, 73, "{card:#}");
            let keys = card["checks"].as_array().into_iter().flatten().find(|c| c["id"] == "keys.held").cloned();
            let keys = keys.unwrap_or_default();
            assert_eq!(keys["verdict"], "FAIL", "{card:#}");
            assert!(
                keys["evidence"].as_str().unwrap_or_default().contains("found it in /tmp/anthropic_api_key"),
                "{card:#}"
            );
            Ok(())
        }
        /// An image with no sandbox at all (the OS layer): verify runs, its probe as the process and the
        /// agent uid 1000, and fails the egress checks; the policy's check is N/A.
        #[tokio::test]
        async fn verify_a_plain_os_image_fails_the_egress_checks_and_does_not_crash() -> anyhow::Result<()> {
            let (code, card) = verify(&image("os").await?, &[]).await?;
            assert_eq!(code, 73, "{card:#}");
            assert_eq!(card["sandbox_init"], false, "{card:#}");
            let verdicts = verdicts(&card);
            for id in [
                "egress.blocked-name",
                "egress.address",
                "egress.address-ipv6",
                "egress.icmp",
                "ingress.listener",
                "dns.exfiltration",
                "egress.fail-closed",
            ] {
                assert_eq!(verdicts[id], "FAIL", "{id}: {card:#}");
            }
            assert_eq!(verdicts["egress.allowed"], "PASS", "the control: {card:#}");
            assert_eq!(verdicts["policy.files"], "N/A", "{card:#}");
            Ok(())
        }
        /// Ctrl-C while the world is up: verify removes it all and exits.
        #[tokio::test]
        async fn verify_interrupted_leaves_no_container_or_network() -> anyhow::Result<()> {
            use tokio::io::AsyncBufReadExt as _;
            let probe = sandbox_tests::probe::probe_binary()?.display().to_string();
            let shell = image("shell").await?;
            let mut child = tokio::process::Command::new(sandbox_tests::launcher::binary()?)
                .args(["verify", &shell, "--probe", &probe])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
            let first = lines.next_line().await?.unwrap_or_default();
            let world = world_of(&first)?;
            // Up: its peers exist.
            let mut up = false;
            for _ in 0..200 {
                if left_of(&world).0 >= 3 {
                    up = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            assert!(up, "the test world {world} never came up");
            // SIGINT, as Ctrl-C sends it.
            let pid = child.id().expect("running").to_string();
            std::process::Command::new("kill").args(["-INT", &pid]).status()?;
            let status = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait()).await??;
            let mut rest = String::new();
            while let Some(line) = lines.next_line().await? {
                rest.push_str(&line);
                rest.push('\n');
            }
            assert!(!status.success(), "an interrupted verify exits non-zero: {status}");
            assert!(rest.contains("interrupted"), "{rest}");
            assert_eq!(left_of(&world), (0, 0), "containers and networks of {world} left behind");
            Ok(())
        }
    }
    [single, sidecar, gvisor] {
        /// `exec` runs a command as the agent in whichever container the agent has: uid 1000 with no
        /// capability, in /workspace, behind the firewall (an allowed name connects, a blocked one
        /// is refused); the command's output on its own streams and its exit status; standard
        /// input only with -i; and the launcher's own codes where it cannot run it.
        #[tokio::test]
        async fn exec_runs_a_command_as_the_agent_with_its_output_and_status() -> anyhow::Result<()> {
            let world = sandbox_tests::world::World::shared().await?;
            let shell = image("shell").await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let net = world.net.name.as_str();
            let args = ["run", "shell", &project.path, "--detach", "--network", net, "--image", &shell];
            launcher.ok(&[&args[..], &["--allow", "api.allowed.test"]].concat()).await?;
            let (_, name) = project.sandbox().await?;

            let who = "id -u; pwd; grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; echo to-stderr >&2; exit 7";
            let out = launcher.run(&["exec", &name, "--", "sh", "-c", who]).await?;
            assert_eq!(out.code, 7, "the command's status: {out:?}");
            let lines: Vec<&str> = out.stdout.lines().collect();
            assert_eq!(lines[..2], ["1000", "/workspace"], "{out:?}");
            // Every capability set is empty (gVisor's /proc shows no ambient set).
            let sets: Vec<&str> = lines.iter().filter(|l| l.starts_with("Cap")).copied().collect();
            assert!(sets.len() >= 3 && sets.iter().any(|l| l.starts_with("CapEff:")), "{out:?}");
            assert!(sets.iter().all(|l| l.ends_with("\t0000000000000000")), "a capability is left: {out:?}");
            assert_eq!(out.stderr.trim(), "to-stderr", "{out:?}");
            // The host's own file, as written: the agent's view of the project.
            std::fs::write(project.dir.path().join("from-host.txt"), "host-wrote-this")?;
            let out = launcher.ok(&["exec", &name, "cat", "from-host.txt"]).await?;
            assert_eq!(out.stdout, "host-wrote-this", "{out:?}");

            // Behind the firewall: the allowed name connects, the blocked one does not.
            let reach = |host: &str| format!("exec 3<>/dev/tcp/{host}/80 && echo connected");
            let allowed = launcher.run(&["exec", &name, "--", "timeout", "20", "bash", "-c", &reach("api.allowed.test")]).await?;
            assert_eq!((allowed.code, allowed.stdout.trim()), (0, "connected"), "{allowed:?}");
            let blocked = launcher.run(&["exec", &name, "--", "timeout", "20", "bash", "-c", &reach("blocked.test")]).await?;
            assert_ne!(blocked.code, 0, "the blocked name was reached: {blocked:?}");
            assert!(!blocked.stdout.contains("connected"), "{blocked:?}");

            // Standard input reaches the command with -i, to its end; without it, nothing does.
            let fed = launcher.run_fed(&["exec", "-i", &name, "--", "wc", "-c"], Some(&[b'x'; 100_000])).await?;
            assert_eq!((fed.code, fed.stdout.trim()), (0, "100000"), "{fed:?}");
            let unfed = launcher.run_fed(&["exec", &name, "--", "wc", "-c"], Some(b"ignored")).await?;
            assert_eq!((unfed.code, unfed.stdout.trim()), (0, "0"), "{unfed:?}");

            // A reader that goes away after 4 bytes of 20 MB: the launcher stops there, with 141 (as a
            // writer killed by SIGPIPE), rather than reading the rest and saying 0.
            let script = r#"set -o pipefail; "$0" exec "$1" -- dd if=/dev/zero bs=1M count=20 status=none | head -c 4; echo " status=${PIPESTATUS[0]}""#;
            let binary = sandbox_tests::launcher::binary()?;
            let piped = tokio::process::Command::new("bash")
                .args(["-c", script])
                .arg(&binary)
                .arg(&name)
                .env("HOME", launcher.home.path())
                .env("XDG_RUNTIME_DIR", launcher.home.path())
                .output();
            let piped = tokio::time::timeout(std::time::Duration::from_secs(120), piped).await??;
            assert_eq!(String::from_utf8_lossy(&piped.stdout), "\0\0\0\0 status=141\n", "{piped:?}");

            // Where the command cannot run, sandbox-exec's 127; where the launcher cannot, its own.
            let missing = launcher.run(&["exec", &name, "--", "no-such-command"]).await?;
            assert_eq!(missing.code, 127, "{missing:?}");
            let nobody = launcher.run(&["exec", "no-such-sandbox", "--", "true"]).await?;
            assert_eq!(nobody.code, 68, "{nobody:?}");
            let no_tty = launcher.run(&["exec", "-t", &name, "--", "true"]).await?;
            assert_eq!(no_tty.code, 64, "{no_tty:?}");
            assert!(no_tty.stderr.contains("leave out -t"), "{no_tty:?}");
            launcher.ok(&["stop", &name]).await?;
            let stopped = launcher.run(&["exec", &name, "--", "true"]).await?;
            assert_eq!(stopped.code, 68, "{stopped:?}");
            Ok(())
        }
    }
    [gvisor] {
        /// Sidecar mode, as `run --sidecar` makes it (the gateway with the firewall and the key, the
        /// agent's container without any capability), and with the agent under gVisor: every check
        /// passes, the made-up key of the policy's API held in the gateway, and nothing is left.
        #[tokio::test]
        async fn verify_in_sidecar_mode_and_under_gvisor_the_shell_image_passes_every_check() -> anyhow::Result<()> {
            let shell = image("shell").await?;
            let dir = tempfile::tempdir()?;
            let policy = dir.path().join("api.yaml");
            std::fs::write(&policy, "version: 1\ndomains:\n  - api.anthropic.com\n")?;
            let policy = policy.display().to_string();
            for (shape, flags) in [
                ("sidecar", ["--sidecar"].as_slice()),
                ("sidecar, agent under runsc", ["--runtime", "runsc"].as_slice()),
            ] {
                let (code, card) = verify(&shell, &[&["--policy", &policy], flags].concat()).await?;
                assert_eq!(card["shape"], shape, "{card:#}");
                for (id, verdict) in verdicts(&card) {
                    assert_eq!(verdict, "PASS", "{id} ({shape}): {card:#}");
                }
                assert_eq!(code, 0, "{card:#}");
                let volumes = std::process::Command::new("docker").args(["volume", "ls", "-q"]).output()?;
                let left = String::from_utf8_lossy(&volumes.stdout).lines().filter(|v| v.contains("verify")).count();
                assert_eq!(left, 0, "the pair's volumes are left behind ({shape})");
            }
            Ok(())
        }
    }
}
