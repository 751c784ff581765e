//! Who the agent is, read from the real processes' /proc status: uid 1000, every capability set
//! empty, NoNewPrivs. Needs no capability: runs in both modes.

use sandbox_tests::assert::{ProcStatus, assert_agent_processes_unprivileged, assert_unprivileged};
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;

async fn no_network() -> anyhow::Result<Sandbox> {
    let spec = SandboxSpec::smallest().await?.offline();
    spec.start().await
}

#[tokio::test]
async fn the_agents_session_runs_as_uid_1000_with_no_capability() -> anyhow::Result<()> {
    let sb = no_network().await?;
    // Without a network there is nothing to check names of: no checker.
    assert_eq!(assert_agent_processes_unprivileged(&sb).await?, 0);
    Ok(())
}

#[tokio::test]
async fn sandbox_exec_runs_its_command_with_no_capability() -> anyhow::Result<()> {
    let sb = no_network().await?;
    let out = sb.as_agent(&["cat", "/proc/self/status"]).await?;
    let fields = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect();
    assert_unprivileged(&ProcStatus { pid: "exec".into(), name: "cat".into(), fields, gvisor: false });
    let pwd = sb.as_agent(&["sh", "-c", "echo $HOME $USER; pwd"]).await?;
    assert_eq!(pwd.stdout, "/home/agent agent\n/workspace\n");
    Ok(())
}

#[tokio::test]
async fn a_setuid_root_binary_gains_nothing() -> anyhow::Result<()> {
    let sb = no_network().await?;
    let setup = sb
        .exec(&["sh", "-c", "cp /usr/bin/id /tmp/id-suid && chmod 4755 /tmp/id-suid && ls -l /tmp/id-suid"])
        .await?;
    assert!(setup.stdout.starts_with("-rwsr-xr-x 1 root"), "{setup:?}");
    let out = sb.as_agent(&["/tmp/id-suid", "-u"]).await?;
    assert_eq!(out.stdout.trim(), "1000", "a setuid-root binary ran with euid {}", out.stdout.trim());
    let su = sb.as_agent(&["su", "-c", "id -u", "root"]).await?;
    assert_ne!(su.code, 0, "su as the agent: {su:?}");
    Ok(())
}

#[tokio::test]
async fn the_agent_cannot_change_the_policy() -> anyhow::Result<()> {
    let sb = no_network().await?;
    for target in [
        "/etc/agent-sandbox/policy.yaml",
        "/etc/agent-sandbox/policy.d/extra.txt",
        "/usr/local/bin/sandbox-init",
    ] {
        let out = sb.as_agent(&["sh", "-c", &format!("echo '*.evil.test' >> {target}")]).await?;
        assert_ne!(out.code, 0, "the agent wrote {target}");
    }
    let status = sb.as_agent(&["sh", "-c", "echo x > /run/agent-sandbox/status.json"]).await?;
    assert_ne!(status.code, 0, "the agent wrote the status file");
    Ok(())
}

#[tokio::test]
async fn sandbox_exec_refuses_to_run_when_it_cannot_drop_the_bounding_set() -> anyhow::Result<()> {
    let sb = no_network().await?;
    let out = sandbox_tests::docker::exec(sb.id(), &["sandbox-exec", "id"], Some("1000")).await?;
    assert_eq!(out.code, 126, "{out:?}");
    assert!(out.stderr.contains("must start as root"), "{out:?}");
    Ok(())
}
