//! The compose and devcontainer examples (docs/agents.md), run the way those tools would run them: the
//! image they name is the one the build tags, the session starts, the workspace is mounted, the
//! state volume is the agent's, and the API key reaches the agent only from the run-time
//! environment. The network is left out (`none`): the firewall has its own suites, and no test
//! may reach a real API.

use std::collections::BTreeMap;

use sandbox_tests::docker::TestVolume;
use sandbox_tests::images::image;
use sandbox_tests::spec::{Limits, SandboxSpec};
use serde_json::Value;

/// What both tools ask of the engine, in the few terms these examples use.
#[derive(Debug, Default)]
struct Run {
    image: String,
    cap_add: Vec<String>,
    env: BTreeMap<String, String>,
    /// (source: a volume name or `workspace`, target)
    mounts: Vec<(String, String)>,
    limits: Limits,
}

/// `4g`, `512m`: a size as Docker writes it, in bytes.
fn bytes(size: &str) -> i64 {
    let (number, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        other => panic!("unknown size unit `{other}` in {size}"),
    };
    number.parse::<i64>().unwrap_or_else(|_| panic!("not a size: {size}")) * scale
}

const KEY: &str = "sk-ant-example-test-key-not-real";
/// How both compose files take the project: from WORKSPACE, with no default.
const WORKSPACE_SOURCE: &str = "${WORKSPACE:?set WORKSPACE to your project folder}";

fn example(path: &str) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(sandbox_tests::root().join("examples").join(path))?)
}

fn compose() -> anyhow::Result<Run> {
    compose_from(&example("compose.yaml")?)
}

/// The keys the translation knows, at the top, in the service and in its logging: any other
/// is an error (compose would act on it; the suite would not).
const COMPOSE_TOP: &[&str] = &["name", "services", "volumes"];
const COMPOSE_SERVICE: &[&str] = &[
    "image",
    "cap_add",
    "pids_limit",
    "mem_limit",
    "logging",
    "stdin_open",
    "tty",
    "environment",
    "volumes",
];
const COMPOSE_LOGGING: &[&str] = &["driver", "options"];

fn known_keys(value: &Value, known: &[&str], at: &str) -> anyhow::Result<()> {
    let map = value.as_object().ok_or_else(|| anyhow::anyhow!("{at}: not a mapping"))?;
    for key in map.keys() {
        anyhow::ensure!(known.contains(&key.as_str()), "{at}.{key}: a key this suite does not translate");
    }
    Ok(())
}

fn compose_from(text: &str) -> anyhow::Result<Run> {
    let file: Value = yaml_serde::from_str(text)?;
    known_keys(&file, COMPOSE_TOP, "compose")?;
    let services = file["services"].as_object().ok_or_else(|| anyhow::anyhow!("compose: no services"))?;
    anyhow::ensure!(services.keys().collect::<Vec<_>>() == ["claude"], "compose: one service, claude");
    let service = &file["services"]["claude"];
    known_keys(service, COMPOSE_SERVICE, "services.claude")?;
    known_keys(&service["logging"], COMPOSE_LOGGING, "services.claude.logging")?;
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
    };
    let mut run = Run {
        image: service["image"].as_str().unwrap_or_default().to_string(),
        cap_add: strings(&service["cap_add"]),
        ..Default::default()
    };
    for name in strings(&service["environment"]) {
        assert!(!name.contains('='), "compose passes {name} with a value: keys come from the environment");
        run.env.insert(name, KEY.to_string());
    }
    for volume in strings(&service["volumes"]) {
        let (source, target) = volume.rsplit_once(':').expect("source:target");
        // Required: a default (`.`) would be the compose file's own folder, the agent's to rewrite.
        let source = if source == WORKSPACE_SOURCE { "workspace" } else { source };
        if source != "workspace" {
            assert!(file["volumes"].get(source).is_some(), "{source} is a declared named volume");
        }
        run.mounts.push((source.to_string(), target.to_string()));
    }
    assert_eq!(service["tty"], Value::Bool(true), "the session is the terminal");
    run.limits.pids = service["pids_limit"].as_i64();
    run.limits.memory = service["mem_limit"].as_str().map(bytes);
    let logging = &service["logging"];
    assert_eq!(logging["driver"], "json-file", "a log the engine rotates");
    for (key, value) in logging["options"].as_object().into_iter().flatten() {
        run.limits.log_options.insert(key.clone(), value.as_str().expect("a string").to_string());
    }
    Ok(run)
}

/// The devcontainer.json keys the translation knows.
const DEVCONTAINER: &[&str] = &[
    "name",
    "image",
    "runArgs",
    "overrideCommand",
    "workspaceMount",
    "workspaceFolder",
    "mounts",
    "containerEnv",
    "remoteUser",
    "updateRemoteUserUID",
];

fn devcontainer() -> anyhow::Result<Run> {
    let file: Value = serde_json::from_str(&example("devcontainer/devcontainer.json")?)?;
    known_keys(&file, DEVCONTAINER, "devcontainer")?;
    assert_eq!(file["overrideCommand"], Value::Bool(false), "sandbox-init must stay the command");
    let mut run = Run { image: file["image"].as_str().unwrap_or_default().to_string(), ..Default::default() };
    for arg in file["runArgs"].as_array().into_iter().flatten() {
        let arg = arg.as_str().expect("runArgs are strings");
        let (flag, value) =
            arg.split_once('=').unwrap_or_else(|| panic!("runArgs {arg}: write --flag=value"));
        match flag {
            "--cap-add" => run.cap_add.push(value.into()),
            "--pids-limit" => run.limits.pids = Some(value.parse()?),
            "--memory" => run.limits.memory = Some(bytes(value)),
            "--log-opt" => {
                let (key, value) = value.split_once('=').expect("--log-opt=key=value");
                run.limits.log_options.insert(key.into(), value.into());
            }
            other => panic!("runArgs {other}: not understood by this suite"),
        }
    }
    for (name, value) in file["containerEnv"].as_object().into_iter().flatten() {
        assert_eq!(value.as_str(), Some(format!("${{localEnv:{name}}}").as_str()), "{name}");
        run.env.insert(name.clone(), KEY.to_string());
    }
    let mount = |spec: &str| -> (String, String) {
        let fields: BTreeMap<&str, &str> = spec.split(',').filter_map(|f| f.split_once('=')).collect();
        let source =
            if fields["source"] == "${localWorkspaceFolder}" { "workspace" } else { fields["source"] };
        (source.to_string(), fields["target"].to_string())
    };
    run.mounts.push(mount(file["workspaceMount"].as_str().unwrap_or_default()));
    assert_eq!(file["workspaceFolder"], "/workspace");
    for spec in file["mounts"].as_array().into_iter().flatten() {
        run.mounts.push(mount(spec.as_str().unwrap_or_default()));
    }
    assert_eq!(file["remoteUser"], "agent", "the editor's processes are not root");
    Ok(run)
}

async fn runs_as_written(run: Run) -> anyhow::Result<()> {
    assert_eq!(run.image, image("claude").await?, "the example names the image the build tags");
    assert_eq!(run.cap_add, ["NET_ADMIN"]);
    // The agent is assumed hostile: the engine bounds its processes, memory and log.
    assert_eq!(run.limits.pids, Some(512), "{:?}", run.limits);
    assert_eq!(run.limits.memory, Some(4 << 30), "{:?}", run.limits);
    assert_eq!(run.limits.log_options.get("max-size").map(String::as_str), Some("10m"), "{:?}", run.limits);
    let workspace = tempfile::tempdir()?;
    std::fs::write(workspace.path().join("README.md"), "the user's project\n")?;
    let mut volumes = Vec::new();
    let mut spec = SandboxSpec::of(run.image.clone()).offline();
    spec.limits = run.limits.clone();
    // No capability: this test's place is not `net_admin` (the example's NET_ADMIN is checked
    // in its translation above); offline, the firewall has nothing to filter.
    let mut state_dirs = Vec::new();
    for (source, target) in &run.mounts {
        if source == "workspace" {
            spec = spec.mount(&workspace.path().display().to_string(), target);
        } else {
            let volume = TestVolume::create("example").await?;
            spec = spec.mount(&volume.name, target);
            volumes.push(volume);
            state_dirs.push(target.clone());
        }
    }
    for (k, v) in &run.env {
        spec = spec.env(k, v);
    }
    assert_eq!(state_dirs, ["/home/agent/.claude"], "the example keeps claude's state");
    let sb = spec.start().await?;
    let host = xtask::engine::Engine::connect().await?.docker().inspect_container(sb.id(), None).await?;
    let host = host.host_config.unwrap_or_default();
    assert_eq!((host.pids_limit, host.memory), (run.limits.pids, run.limits.memory), "as the engine runs it");
    let out = sb
        .as_agent(&["sh", "-c", "cat /workspace/README.md && test -O /home/agent/.claude && echo ok"])
        .await?;
    assert_eq!(out.stdout, "the user's project\nok\n", "{out:?}");
    // The key from the run-time environment is sandbox-init's: the agent's session has the
    // forwarder's address and a placeholder, never the key.
    let pane = sb.as_agent(&["tmux", "list-panes", "-t", "agent", "-F", "#{pane_pid}"]).await?;
    let pid = pane.stdout.trim();
    let environ = sb.as_agent(&["cat", &format!("/proc/{pid}/environ")]).await?;
    let vars: Vec<&str> = environ.stdout.split('\0').collect();
    assert!(vars.contains(&"ANTHROPIC_BASE_URL=http://127.0.0.1:15101"), "{environ:?}");
    assert!(vars.contains(&"ANTHROPIC_API_KEY=sk-ant-api03-held-by-agent-sandbox"), "{environ:?}");
    assert!(!environ.stdout.contains(KEY), "{environ:?}");
    Ok(())
}

#[tokio::test]
async fn the_compose_example_runs_as_written() -> anyhow::Result<()> {
    runs_as_written(compose()?).await
}

#[tokio::test]
async fn the_devcontainer_example_runs_as_written() -> anyhow::Result<()> {
    runs_as_written(devcontainer()?).await
}

/// The translation refuses what it does not know, so that a key compose would act on can never
/// pass unnoticed: a fixture with a misspelt `environment`.
#[test]
fn the_compose_translation_refuses_a_key_it_does_not_know() {
    let fixture =
        std::fs::read_to_string(sandbox_tests::root().join("tests/tests/fixtures/compose-unknown-key.yaml"))
            .expect("the fixture");
    let refused = compose_from(&fixture).expect_err("an unknown key is refused");
    assert!(refused.to_string().contains("services.claude.enviroment"), "{refused}");
    // The example itself passes the same check.
    compose().expect("the example's keys are all known");
}

/// The Dev Containers CLI (`@devcontainers/cli`): `AGENT_SANDBOX_DEVCONTAINER_CLI`, the one
/// `cargo xtask setup --tests` installs under target/, or `devcontainer` on the PATH.
fn devcontainer_cli() -> anyhow::Result<String> {
    if let Ok(path) = std::env::var("AGENT_SANDBOX_DEVCONTAINER_CLI") {
        return Ok(path);
    }
    let installed = xtask::setup::ci_tools(&sandbox_tests::root())
        .join(xtask::setup::DEVCONTAINER_DIR)
        .join("node_modules/.bin/devcontainer");
    if installed.is_file() {
        return Ok(installed.display().to_string());
    }
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| format!("{d}/devcontainer"))
        .find(|p| std::path::Path::new(p).is_file());
    found.ok_or_else(|| {
        anyhow::anyhow!(
            "the Dev Containers CLI is not installed: `cargo xtask setup --tests` installs it, or \
             set AGENT_SANDBOX_DEVCONTAINER_CLI to its `devcontainer`"
        )
    })
}

/// The sidecar compose example, brought up by the real docker-compose (Debian's; `cargo xtask
/// setup --tests` installs it), its namespace's holder on a private network whose DNS peer is
/// the gateway's resolver. Taken down with its volumes when dropped.
struct ComposeRun {
    project: String,
    files: Vec<String>,
    env: Vec<(String, String)>,
}

impl ComposeRun {
    fn compose(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let mut cmd = std::process::Command::new("docker-compose");
        cmd.args(["--ansi", "never", "-p", &self.project]);
        for file in &self.files {
            cmd.args(["-f", file]);
        }
        cmd.args(args).envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.output().map_err(|e| {
            anyhow::anyhow!("cannot run docker-compose ({e}): `cargo xtask setup --tests` installs Debian's")
        })
    }

    fn id(&self, service: &str) -> anyhow::Result<String> {
        let out = self.compose(&["ps", "-q", service])?;
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        anyhow::ensure!(!id.is_empty(), "compose has no {service} container: {out:?}");
        Ok(id)
    }
}

impl Drop for ComposeRun {
    fn drop(&mut self) {
        let _ = self.compose(&["down", "--volumes", "--timeout", "1"]);
    }
}

net_admin! {
    [single] {
        /// The devcontainer example, copied to a project's `.devcontainer/` and run with the real Dev
        /// Containers CLI as an editor would: `devcontainer up`, then `devcontainer exec` as the user
        /// the editor uses. The one change: the state volume is a test volume, not the user's. The CLI
        /// is kept off the network: its control manifest (containers.dev) is pre-seeded, fresh.
        #[tokio::test]
        async fn the_devcontainer_example_runs_with_the_devcontainer_cli() -> anyhow::Result<()> {
            let cli = devcontainer_cli()?;
            let example = example("devcontainer/devcontainer.json")?;
            let mut config: Value = serde_json::from_str(&example)?;
            assert_eq!(config["image"].as_str(), Some(image("claude").await?.as_str()), "the image the build tags");
            let volume = TestVolume::create("devcontainer-cli").await?;
            let state = "source=agent-sandbox-claude-state,target=/home/agent/.claude,type=volume";
            assert_eq!(config["mounts"], serde_json::json!([state]), "the example's state volume");
            config["mounts"] = serde_json::json!([state.replace("agent-sandbox-claude-state", &volume.name)]);
            let project = tempfile::tempdir()?;
            std::fs::create_dir(project.path().join(".devcontainer"))?;
            std::fs::write(
                project.path().join(".devcontainer/devcontainer.json"),
                serde_json::to_string_pretty(&config)?,
            )?;
            std::fs::write(project.path().join("README.md"), "the user's project\n")?;
            let tmp = tempfile::tempdir()?;
            for user in ["root".to_string(), std::env::var("USER").unwrap_or_default()] {
                let cache = tmp.path().join(format!("devcontainercli-{user}"));
                std::fs::create_dir_all(&cache)?;
                std::fs::write(
                    cache.join("control-manifest.json"),
                    r#"{"disallowedFeatures":[],"featureAdvisories":[]}"#,
                )?;
            }
            let folder = project.path().display().to_string();
            let id_label = format!("{}=devcontainer-cli-{}", sandbox_tests::docker::TEST_LABEL, std::process::id());
            let run = |args: Vec<String>| {
                let (cli, tmp) = (cli.clone(), tmp.path().to_path_buf());
                async move {
                    let out = tokio::process::Command::new(&cli)
                        .args(&args)
                        .env("ANTHROPIC_API_KEY", KEY)
                        .env("TMPDIR", &tmp)
                        .stdin(std::process::Stdio::null())
                        .output()
                        .await?;
                    Ok::<_, anyhow::Error>((
                        out.status.code(),
                        String::from_utf8_lossy(&out.stdout).into_owned(),
                        String::from_utf8_lossy(&out.stderr).into_owned(),
                    ))
                }
            };
            let common = |verb: &str| -> Vec<String> {
                [verb, "--workspace-folder", &folder, "--id-label", &id_label].iter().map(|s| s.to_string()).collect()
            };
            let (code, stdout, stderr) = run(common("up")).await?;
            let last: Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap_or(Value::Null);
            assert_eq!((code, last["outcome"].as_str()), (Some(0), Some("success")), "up: {stdout}\n{stderr}");
            let id = last["containerId"].as_str().unwrap_or_default().to_string();
            let _remove = sandbox_tests::docker::RemoveOnDrop(id.clone());
            let mut logs = String::new();
            for _ in 0..100 {
                logs = sandbox_tests::docker::container_logs(&id).await?.0;
                if logs.contains("sandbox ready") {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(logs.contains("sandbox ready: ") && !logs.contains("firewall off"), "{logs}");
            let script = r#"id -u
        cat /workspace/README.md
        test -O /home/agent/.claude && echo state-is-the-agents
        getent hosts example.com >/dev/null; echo blocked-lookup=$?
        pane=$(tmux -S /run/agent-sandbox/tmux/tmux-1000/default list-panes -t agent -F '#{pane_pid}')
        tr '\0' '\n' < /proc/$pane/environ | grep '^ANTHROPIC_' | sort"#;
            let mut exec = common("exec");
            exec.extend(["sh".into(), "-c".into(), script.into()]);
            let (code, stdout, stderr) = run(exec).await?;
            assert_eq!(code, Some(0), "exec: {stdout}\n{stderr}");
            assert_eq!(
                stdout.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
                [
                    "1000",
                    "the user's project",
                    "state-is-the-agents",
                    "blocked-lookup=2",
                    "ANTHROPIC_API_KEY=sk-ant-api03-held-by-agent-sandbox",
                    "ANTHROPIC_BASE_URL=http://127.0.0.1:15101",
                ],
                "{stderr}"
            );
            let denials =
                sandbox_tests::docker::exec(&id, &["cat", "/run/agent-sandbox/denials.jsonl"], None).await?;
            assert!(denials.stdout.contains("\"name\":\"example.com\""), "the gate refused it: {denials:?}");
            Ok(())
        }
        #[tokio::test]
        async fn the_sidecar_compose_example_runs_with_docker_compose() -> anyhow::Result<()> {
            use sandbox_tests::docker::{copy_in, exec};
            use sandbox_tests::probe::{PROBE, probe_binary, spawn};

            let claude = image("claude").await?;
            let example = sandbox_tests::root().join("examples/compose-sidecar.yaml");
            let file: Value = yaml_serde::from_str(&std::fs::read_to_string(&example)?)?;
            for service in ["net", "gateway", "claude"] {
                assert_eq!(file["services"][service]["image"], claude.as_str(), "the image the build tags");
            }
            // The gateway's capabilities are the launcher's, from the one definition.
            let mut caps: Vec<&str> =
                file["services"]["gateway"]["cap_add"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            let mut launchers = sandbox_init::policy::layout::GATEWAY_CAPS.to_vec();
            caps.sort_unstable();
            launchers.sort_unstable();
            assert_eq!(caps, launchers);

            let world =
                sandbox_tests::peers::ResolvedNet::start("compose", &["platform.claude.com", "example.com"]).await?;
            let workspace = tempfile::tempdir()?;
            std::fs::write(workspace.path().join("README.md"), "the user's project\n")?;
            let overrides = tempfile::Builder::new().suffix(".yaml").tempfile()?;
            std::fs::write(
                overrides.path(),
                format!("networks:\n  default:\n    external: true\n    name: {}\n", world.net.name),
            )?;
            let run = ComposeRun {
                project: format!("agentsandboxtestcompose{}", std::process::id()),
                files: vec![example.display().to_string(), overrides.path().display().to_string()],
                env: vec![
                    ("WORKSPACE".into(), workspace.path().display().to_string()),
                    ("SANDBOX_DNS".into(), world.dns.ipv4.to_string()),
                    ("ANTHROPIC_API_KEY".into(), KEY.into()),
                ],
            };
            let up = run.compose(&["up", "-d"])?;
            anyhow::ensure!(up.status.success(), "docker-compose up: {}", String::from_utf8_lossy(&up.stderr));
            let (agent, gateway) = (run.id("claude")?, run.id("gateway")?);
            sandbox_tests::docker::wait_for_log(&agent, "sandbox ready: agent container", 60).await?;

            // Every process of the agent's container, its PID 1 and the session's included: uid 1000,
            // no capability in any set, no privilege to gain.
            let processes = sandbox_tests::assert::processes_of(&agent).await?;
            assert!(processes.iter().any(|p| p.name == "tmux: server"), "{processes:?}");
            processes.iter().for_each(sandbox_tests::assert::assert_unprivileged);
            let readme = exec(&agent, &["sandbox-exec", "--", "cat", "/workspace/README.md"], None).await?;
            assert_eq!(readme.stdout, "the user's project\n", "{readme:?}");

            // The key: the gateway's; the session has the forwarder's address and a placeholder.
            let environ = sandbox_tests::docker::pane_environ(&agent).await?;
            assert!(environ.contains("ANTHROPIC_API_KEY=sk-ant-api03-held-by-agent-sandbox"), "{environ:?}");
            assert!(!environ.contains(KEY), "the agent's session has the key: {environ:?}");
            let inspect =
                exec(&agent, &["sh", "-c", "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"], None).await?;
            assert!(!inspect.stdout.contains(KEY), "a process of the agent's container has the key");

            // Through the gateway: an allowed name is reached, any other is refused at the gate and
            // never asked upstream.
            copy_in(&agent, PROBE, &std::fs::read(probe_binary()?)?, 0o755).await?;
            let allowed =
                spawn(&agent, true, &["tcp", "platform.claude.com", "443", "--timeout-ms", "3000"]).await??;
            assert_eq!(allowed.outcome(), "connected", "{:?}", allowed.fields);
            let refused = spawn(&agent, true, &["tcp", "example.com", "443", "--timeout-ms", "3000"]).await??;
            assert!(refused.outcome().starts_with("dns:"), "{:?}", refused.fields);
            let asked = world.dns.dns_queries().await?;
            assert!(asked.iter().any(|q| q.contains("platform.claude.com")), "{asked:?}");
            assert!(
                !asked.iter().any(|q| q.contains("example.com")),
                "the gate asked upstream for a refused name: {asked:?}"
            );
            let denials = exec(&gateway, &["cat", "/run/agent-sandbox/denials.jsonl"], None).await?;
            assert!(denials.stdout.contains("example.com"), "the gateway logs the refusal: {denials:?}");

            // `down` takes every container it made.
            let down = run.compose(&["down", "--volumes", "--timeout", "1"])?;
            anyhow::ensure!(down.status.success(), "docker-compose down: {}", String::from_utf8_lossy(&down.stderr));
            let left = run.compose(&["ps", "-q"])?;
            assert!(String::from_utf8_lossy(&left.stdout).trim().is_empty(), "{left:?}");
            Ok(())
        }
    }
}
