//! Failing closed: every reason the agent must not start gives its documented exit code and a
//! one-line message, and the agent never runs. Plus the two cases that run unfiltered on
//! purpose. Needs no capability: runs in both modes.

use sandbox_tests::docker::TestNet;
use sandbox_tests::spec::SandboxSpec;

#[tokio::test]
async fn without_net_admin_the_agent_never_starts() -> anyhow::Result<()> {
    let net = TestNet::create("no-cap").await?;
    let exited = SandboxSpec::smallest().await?.on(&net).run_to_exit().await?;
    assert_eq!(exited.code, 77, "{exited:?}");
    assert!(exited.stderr.contains("no CAP_NET_ADMIN: cannot program the egress firewall"), "{exited:?}");
    assert!(!exited.stdout.contains("sandbox ready"), "{exited:?}");
    Ok(())
}

#[tokio::test]
async fn without_dockers_default_capabilities_the_agent_never_starts() -> anyhow::Result<()> {
    let mut spec = SandboxSpec::smallest().await?.offline();
    spec.cap_drop_all = true;
    let exited = spec.run_to_exit().await?;
    assert_eq!(exited.code, 77, "{exited:?}");
    let line = exited.stderr.lines().last().unwrap_or_default();
    assert!(
        line.starts_with(
            "sandbox-init: missing CAP_CHOWN, CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_KILL: sandbox-init needs"
        ) && line.contains("--cap-add them back"),
        "{exited:?}"
    );
    assert!(!exited.stdout.contains("sandbox ready"), "{exited:?}");
    Ok(())
}

#[tokio::test]
async fn an_invalid_drop_in_is_refused_with_its_file_line_and_column() -> anyhow::Result<()> {
    let net = TestNet::create("invalid").await?;
    let exited = SandboxSpec::smallest()
        .await?
        .on(&net)
        .drop_in("bad.yaml", "version: 1\ndomains:\n  - ok.test\n  - \"api.*.test\"\n")
        .run_to_exit()
        .await?;
    assert_eq!(exited.code, 65, "{exited:?}");
    let line = exited.stderr.lines().last().unwrap_or_default();
    assert!(line.starts_with("sandbox-init: /etc/agent-sandbox/policy.d/bad.yaml:4:5: "), "{line}");
    assert!(line.contains("`*` is only allowed as a whole first label"), "{line}");
    Ok(())
}

#[tokio::test]
async fn an_invalid_policy_is_refused_even_where_nothing_is_filtered() -> anyhow::Result<()> {
    let spec = SandboxSpec::smallest().await?.drop_in("bad.txt", "https://example.test/\n").offline();
    let exited = spec.run_to_exit().await?;
    assert_eq!(exited.code, 65, "{exited:?}");
    assert!(exited.stderr.contains("bad.txt:1:1: `https://example.test/` is a URL"), "{exited:?}");
    Ok(())
}

#[tokio::test]
async fn an_unknown_firewall_mode_is_refused() -> anyhow::Result<()> {
    let net = TestNet::create("mode").await?;
    let exited =
        SandboxSpec::smallest().await?.on(&net).env("SANDBOX_FIREWALL", "disabled").run_to_exit().await?;
    assert_eq!(exited.code, 78, "{exited:?}");
    assert!(exited.stderr.contains("SANDBOX_FIREWALL=disabled is not one of on, off, open"), "{exited:?}");
    Ok(())
}

#[tokio::test]
async fn with_no_network_but_loopback_the_agent_runs() -> anyhow::Result<()> {
    let spec = SandboxSpec::smallest().await?.offline();
    let sb = spec.start().await?;
    let (stdout, _) = sb.logs().await?;
    assert!(stdout.contains("sandbox ready: no network but loopback, nothing to filter"), "{stdout}");
    assert_eq!(sb.as_agent(&["tmux", "has-session", "-t", "agent"]).await?.code, 0);
    Ok(())
}

#[tokio::test]
async fn the_explicit_opt_outs_run_unfiltered_and_say_so_loudly() -> anyhow::Result<()> {
    for mode in ["off", "open"] {
        let net = TestNet::create(&format!("opt-out-{mode}")).await?;
        let sb = SandboxSpec::smallest().await?.on(&net).env("SANDBOX_FIREWALL", mode).start().await?;
        let (stdout, stderr) = sb.logs().await?;
        assert!(stdout.contains(&format!("sandbox ready: firewall {mode}, no filtering")), "{stdout}");
        assert!(
            stderr.contains(&format!("WARNING: SANDBOX_FIREWALL={mode}: NO EGRESS FIREWALL")),
            "{stderr}"
        );
        assert_eq!(sb.as_agent(&["tmux", "has-session", "-t", "agent"]).await?.code, 0);
    }
    Ok(())
}

#[tokio::test]
async fn sandbox_init_check_validates_policies_offline() -> anyhow::Result<()> {
    let spec = SandboxSpec::smallest().await?.drop_in("good.txt", "ok.test\n").offline();
    let sb = spec.start().await?;
    let ok = sb.exec(&["sandbox-init", "check"]).await?;
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(ok.stdout.contains("ok (9 domains, 0 cidrs, services: debian, github)"), "{ok:?}");
    sb.exec(&["sh", "-c", "printf 'version: 1\\ncidrs: [10.1.2.3/8]\\n' > /tmp/p.yaml"]).await?;
    let bad = sb.exec(&["sandbox-init", "check", "/tmp/p.yaml", "/tmp/missing.yaml"]).await?;
    assert_eq!(bad.code, 65, "{bad:?}");
    assert!(bad.stderr.contains("/tmp/p.yaml:2:9: cidrs[0]: `10.1.2.3/8` has host bits set"), "{bad:?}");
    assert!(bad.stderr.contains("cannot read policy /tmp/missing.yaml"), "{bad:?}");
    Ok(())
}
