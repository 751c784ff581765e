//! Agent state on mounted volumes: sandbox-init hands a directory of `SANDBOX_STATE_DIRS` that
//! another user owns to the agent, without following what the agent could have planted in it.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, lchown, symlink};

use sandbox_tests::spec::SandboxSpec;

#[tokio::test]
async fn a_bind_mounted_state_dir_of_another_uid_becomes_the_agents_and_links_are_not_followed()
-> anyhow::Result<()> {
    // What a host user (uid 4242) keeps for the agent, with a link left by an earlier run that
    // points at the policy.
    let host = tempfile::tempdir()?;
    let state = host.path().join("state");
    std::fs::create_dir_all(state.join("sessions"))?;
    std::fs::write(state.join("sessions/one.jsonl"), "{\"kept\":true}\n")?;
    symlink("/etc/agent-sandbox/policy.yaml", state.join("escape"))?;
    for path in [&state, &state.join("sessions"), &state.join("sessions/one.jsonl"), &state.join("escape")] {
        lchown(path, Some(4242), Some(4242))?;
    }
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700))?;

    let spec = (SandboxSpec::smallest().await?)
        .env(sandbox_init::state::ENV, "~/.state:/etc/agent-sandbox")
        .mount(&state.display().to_string(), "/home/agent/.state")
        .offline();
    let sb = spec.start().await?;

    let out = sb
        .as_agent(&[
            "sh",
            "-c",
            "cat ~/.state/sessions/one.jsonl && touch ~/.state/new ~/.state/sessions/two",
        ])
        .await?;
    assert_eq!(out.code, 0, "the agent reads and writes its state: {out:?}");
    assert_eq!(out.stdout, "{\"kept\":true}\n");
    for file in ["sessions/one.jsonl", "new", "escape"] {
        assert_eq!(std::fs::symlink_metadata(state.join(file))?.uid(), 1000, "{file} on the host");
    }
    let policy =
        sb.exec(&["stat", "-c", "%u:%g %a", "/etc/agent-sandbox/policy.yaml", "/etc/agent-sandbox"]).await?;
    assert_eq!(
        policy.stdout, "0:0 644\n0:0 755\n",
        "the link's target and a path outside the home stay root's"
    );
    let write = sb.as_agent(&["sh", "-c", "echo x >> ~/.state/escape"]).await?;
    assert_ne!(write.code, 0, "the planted link gives no write access to the policy: {write:?}");

    let (_, stderr) = sb.logs().await?;
    assert!(
        stderr.contains("state /home/agent/.state belonged to uid 4242: handed 4 entries to the agent"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARNING: SANDBOX_STATE_DIRS: `/etc/agent-sandbox` is not a directory inside the agent's home (/home/agent): ignored"),
        "{stderr}"
    );
    Ok(())
}
