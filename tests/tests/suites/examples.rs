//! The compose and devcontainer examples of README, run the way those tools would run them: the
//! image they name is the one the build tags, the session starts, the workspace is mounted, the
//! state volume is the agent's, and the API key reaches the agent only from the run-time
//! environment. The network is left out (`none`): the firewall has its own suites, and no test
//! may reach a real API.

use std::collections::BTreeMap;

use sandbox_tests::sandbox::{SandboxSpec, TestVolume, image};
use serde_json::Value;

/// What both tools ask of the engine, in the few terms these examples use.
#[derive(Debug, Default)]
struct Run {
    image: String,
    cap_add: Vec<String>,
    env: BTreeMap<String, String>,
    /// (source: a volume name or `workspace`, target)
    mounts: Vec<(String, String)>,
}

const KEY: &str = "sk-ant-example-test-key-not-real";

fn example(path: &str) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(sandbox_tests::root().join("examples").join(path))?)
}

fn compose() -> anyhow::Result<Run> {
    let file: Value = yaml_serde::from_str(&example("compose.yaml")?)?;
    let service = &file["services"]["claude"];
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
        let source = if source == "${WORKSPACE:-.}" { "workspace" } else { source };
        if source != "workspace" {
            assert!(file["volumes"].get(source).is_some(), "{source} is a declared named volume");
        }
        run.mounts.push((source.to_string(), target.to_string()));
    }
    assert_eq!(service["tty"], Value::Bool(true), "the session is the terminal");
    Ok(run)
}

fn devcontainer() -> anyhow::Result<Run> {
    let file: Value = serde_json::from_str(&example("devcontainer/devcontainer.json")?)?;
    assert_eq!(file["overrideCommand"], Value::Bool(false), "sandbox-init must stay the command");
    let mut run = Run { image: file["image"].as_str().unwrap_or_default().to_string(), ..Default::default() };
    for arg in file["runArgs"].as_array().into_iter().flatten() {
        let cap = arg.as_str().and_then(|a| a.strip_prefix("--cap-add="));
        run.cap_add
            .push(cap.unwrap_or_else(|| panic!("runArgs {arg}: only --cap-add= is understood")).into());
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
    let workspace = tempfile::tempdir()?;
    std::fs::write(workspace.path().join("README.md"), "the user's project\n")?;
    let mut volumes = Vec::new();
    let mut spec = SandboxSpec::of(run.image.clone());
    spec.network = Some("none".into());
    // As the example asks, except under `--ci`, where no container gets a capability.
    spec.net_admin = sandbox_tests::sandbox::full_mode();
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
    let out = sb
        .as_agent(&["sh", "-c", "cat /workspace/README.md && test -O /home/agent/.claude && echo ok"])
        .await?;
    assert_eq!(out.stdout, "the user's project\nok\n", "{out:?}");
    // The key reached the agent's session, from the run-time environment.
    let pane = sb.as_agent(&["tmux", "list-panes", "-t", "agent", "-F", "#{pane_pid}"]).await?;
    let pid = pane.stdout.trim();
    let environ = sb.as_agent(&["cat", &format!("/proc/{pid}/environ")]).await?;
    assert!(environ.stdout.split('\0').any(|e| e == format!("ANTHROPIC_API_KEY={KEY}")), "{environ:?}");
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
