//! Attacks on PID 1 and on the container's files. They need no capability: run in both modes.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use sandbox_tests::assert::privileged_files;
use sandbox_tests::docker::{TestNet, TestVolume, exec};
use sandbox_tests::peers::Helper;
use sandbox_tests::probe::PROBE;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;

const STATUS: &str = "/run/agent-sandbox/session/status";

/// A sandbox with no network, the agent's pane running `command`, and a host folder at
/// /evidence every process may write.
async fn offline(command: Option<&str>) -> anyhow::Result<(Sandbox, tempfile::TempDir)> {
    let evidence = tempfile::tempdir()?;
    std::fs::set_permissions(evidence.path(), std::fs::Permissions::from_mode(0o777))?;
    let mut spec =
        SandboxSpec::smallest().await?.mount(&evidence.path().display().to_string(), "/evidence").offline();
    if let Some(command) = command {
        spec = spec.env("ASSISTANT_CMD", command);
    }
    Ok((spec.start().await?, evidence))
}

async fn read_when(path: &std::path::Path, needle: &str) -> anyhow::Result<String> {
    for _ in 0..50 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return Ok(text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("{} never said `{needle}`", path.display())
}

/// The agent owns its tmux server's socket directory: it puts its own "tmux" there, which
/// answers whoever asks for the panes with "1" and the pid of a root process. When the container
/// stops, PID 1 must signal only the session's own processes.
#[tokio::test]
async fn a_forged_tmux_server_cannot_make_pid1_signal_other_processes() -> anyhow::Result<()> {
    let (sb, evidence) = offline(Some(&format!("{PROBE} sentinel /evidence/pane.log"))).await?;
    read_when(&evidence.path().join("pane.log"), "pid ").await?;
    sb.exec_detached(&[PROBE, "sentinel", "/evidence/root.log"], None).await?;
    let root = read_when(&evidence.path().join("root.log"), "pid ").await?;
    let root_pid = root.trim().strip_prefix("pid ").expect("pid line");
    let socket = "/run/agent-sandbox/tmux/tmux-1000/default";
    let payload = format!("1\\n{root_pid}\\n");
    sb.exec_detached(&["sandbox-exec", "--", PROBE, "fake-tmux", socket, &payload, "--ms", "30000"], None)
        .await?;
    // The forgery is in place: tmux, asked for the panes, says what the agent wants.
    let mut forged = String::new();
    for _ in 0..50 {
        forged = sb.as_agent(&["tmux", "list-panes", "-a", "-F", "#{pane_pid}"]).await?.stdout;
        if forged.contains(root_pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(forged, format!("1\n{root_pid}\n"), "the fake tmux server is not answering");

    sb.signal("SIGTERM").await?;
    assert!(sb.exit_code().await?.is_some(), "the sandbox did not stop");
    let root = std::fs::read_to_string(evidence.path().join("root.log"))?;
    assert!(!root.contains("signal"), "PID 1 signalled a root process: {root}");
    // The control: the session's own process got the stop signal.
    let pane = std::fs::read_to_string(evidence.path().join("pane.log"))?;
    assert!(pane.contains("signal 15"), "the pane's process was not stopped: {pane}");
    Ok(())
}

/// PID 1 reads the session's exit status from a file the agent writes: the agent tries to put
/// a link or a FIFO in its place (reading a FIFO nobody writes would hang PID 1 for ever).
#[tokio::test]
async fn pid1_reads_no_file_the_agent_can_replace() -> anyhow::Result<()> {
    let (sb, _evidence) = offline(None).await?;
    for attempt in [
        format!("rm -f {STATUS}"),
        format!("mv {STATUS} /tmp/status"),
        format!("mkfifo /tmp/fifo && ln -sf /tmp/fifo {STATUS}"),
        format!("mkfifo {STATUS}.new && mv -f {STATUS}.new {STATUS}"),
    ] {
        let out = sb.as_agent(&["sh", "-c", &attempt]).await?;
        assert_ne!(out.code, 0, "`{attempt}` as the agent worked: {out:?}");
        assert!(out.stderr.contains("Permission denied"), "`{attempt}`: {out:?}");
    }
    let file = sb.exec(&["stat", "-c", "%u %F", STATUS]).await?;
    assert_eq!(file.stdout.trim(), "0 regular empty file", "{file:?}");
    // The control: the agent may write its status, and PID 1 ends with the session.
    assert_eq!(sb.as_agent(&["sh", "-c", &format!("echo 7 > {STATUS}")]).await?.code, 0);
    sb.as_agent(&["tmux", "kill-server"]).await?;
    assert!(sb.exit_code().await?.is_some(), "PID 1 did not end with the session");
    Ok(())
}

/// A second container on the same state volume swaps directories and links to
/// /etc/agent-sandbox as fast as it can while sandboxes start and hand the volume to the agent:
/// root must never change the owner of anything outside the volume.
#[tokio::test]
async fn a_racing_writer_cannot_make_root_hand_over_a_file_outside_the_volume() -> anyhow::Result<()> {
    let volume = TestVolume::create("state-race").await?;
    let racer = Helper::start(
        // The racer outlasts the six rounds on a loaded machine (one took 112 s under CI's
        // load, past a 90 s racer, and its last rounds found nothing to hand over); it is
        // removed with the test.
        &["race-state", "/vol", "policy.yaml", "/etc/agent-sandbox", "--dirs", "1000", "--ms", "300000"],
        &[(&volume.name, "/vol")],
    )
    .await?;
    racer.wait_for("racer ready").await?;
    let spec = SandboxSpec::smallest()
        .await?
        .env(sandbox_init::state::ENV, "~/.state")
        .mount(&volume.name, "/home/agent/.state")
        .offline();
    let sb = spec.start().await?;
    let rounds = 6;
    for round in 1..=rounds {
        if round > 1 {
            sb.stop().await?;
            sb.start_again().await?;
            sb.wait_for_stdout("sandbox ready", round).await?;
        }
        let owners = sb
            .exec(&[
                "stat",
                "-c",
                "%u:%g %n",
                "/etc/agent-sandbox/policy.yaml",
                "/etc/agent-sandbox/policy.d",
            ])
            .await?;
        assert_eq!(
            owners.stdout, "0:0 /etc/agent-sandbox/policy.yaml\n0:0 /etc/agent-sandbox/policy.d\n",
            "round {round}: root handed a file outside the volume to the agent"
        );
    }
    // The control: every round handed the volume over, under the racer.
    let (_, stderr) = sb.logs().await?;
    let handed = stderr.matches("state /home/agent/.state belonged to uid 0: handed").count();
    assert_eq!(handed, rounds, "{stderr}");
    Ok(())
}

/// A program carrying a file capability would give any process of the agent started outside
/// sandbox-exec (`docker exec -u agent`, an editor's terminal) that capability: the contract's
/// check must find one, wherever an image puts it.
#[tokio::test]
async fn a_file_capability_program_is_caught_by_the_contract() -> anyhow::Result<()> {
    let (sb, _evidence) = offline(None).await?;
    // The control: the image as built has none.
    assert_eq!(privileged_files(&sb).await?, Vec::<String>::new());
    // What an image must never ship, planted by root.
    let planted = sb.exec(&[PROBE, "set-file-cap", "/usr/local/bin/escalate"]).await?;
    assert!(planted.stdout.contains("outcome=set"), "{planted:?}");
    // The threat is real: the agent's `docker exec` process gains the capability.
    let caps = exec(sb.id(), &["/usr/local/bin/escalate", "caps"], Some("agent")).await?;
    let effective = caps.stdout.lines().find_map(|l| l.strip_prefix("CapEff=")).unwrap_or_default();
    let effective = u64::from_str_radix(effective.trim(), 16)?;
    assert_ne!(effective & (1 << 13), 0, "CAP_NET_RAW was not gained: {caps:?}");
    assert_eq!(privileged_files(&sb).await?, vec!["caps /usr/local/bin/escalate".to_string()]);
    Ok(())
}

/// `--network host`: the firewall would be the host's, and the host's loopback services the
/// agent's. Refused before anything is programmed (here without NET_ADMIN, so that even a
/// missing check could not touch the host's firewall).
#[tokio::test]
async fn the_hosts_network_is_refused_at_start() -> anyhow::Result<()> {
    let spec = SandboxSpec::smallest().await?.network_mode("host");
    let exited = spec.run_to_exit().await?;
    assert_eq!(exited.code, 68, "{exited:?}");
    assert!(exited.stderr.contains("this is the host's network namespace (--network host"), "{exited:?}");
    // The control: on a network of its own the same container gets as far as the capability.
    let net = TestNet::create("own-network").await?;
    let own = SandboxSpec::smallest().await?.on(&net).run_to_exit().await?;
    assert_eq!(own.code, 77, "{own:?}");
    Ok(())
}

/// The agent owns tmux's socket directory, which outlives a restart in the container's
/// writable layer, and nests directories in it deeper than a path reaches and than a
/// recursive removal has descriptors for: the next start must still clear it and start.
#[tokio::test]
async fn a_deep_tree_in_the_agents_directory_cannot_stop_the_next_start() -> anyhow::Result<()> {
    let mut spec = SandboxSpec::smallest().await?.offline();
    spec.limits.nofile = Some(1024);
    let sb = spec.start().await?;
    let built = sb.probe(&["deep", "/run/agent-sandbox/tmux", "3000"]).await?;
    assert_eq!(built.outcome(), "built", "{:?}", built.fields);
    sb.stop().await?;
    sb.start_again().await?;
    sb.wait_for_stdout("sandbox ready", 2).await?;
    // The control: the tree was there, and now it is gone.
    let left = sb.exec(&["sh", "-c", "ls -A /run/agent-sandbox/tmux | grep -c '^d$' || true"]).await?;
    assert_eq!(left.stdout.trim(), "0", "{left:?}");
    Ok(())
}

/// The agent's tmux server reads the agent's ~/.tmux.conf, which outlives a restart in the
/// container's writable layer: a configuration that keeps the server from ever answering
/// (`run-shell "sleep …"`) holds PID 1 at the next start only for its limit on a tmux client
/// (30 s), then PID 1 refuses, exit 71, the agent not started. The control: a restart before
/// the plant reaches `sandbox ready`.
#[tokio::test]
async fn a_tmux_configuration_that_never_answers_ends_the_next_start_at_its_limit() -> anyhow::Result<()> {
    let sb = SandboxSpec::smallest().await?.offline().start().await?;
    sb.stop().await?;
    sb.start_again().await?;
    sb.wait_for_stdout("sandbox ready", 2).await?;
    let planted =
        sb.as_agent(&["sh", "-c", "printf 'run-shell \"sleep 600\"\\n' > /home/agent/.tmux.conf"]).await?;
    assert_eq!(planted.code, 0, "{planted:?}");
    sb.stop().await?;
    let started = std::time::Instant::now();
    sb.start_again().await?;
    let mut code = None;
    while code.is_none() && started.elapsed() < Duration::from_secs(90) {
        code = sb.exit_code().await?;
    }
    let (stdout, stderr) = sb.logs().await?;
    assert_eq!(code, Some(71), "PID 1 still waits after {:?}: {stderr}", started.elapsed());
    assert!(stderr.contains("cannot run tmux: no answer within 30 s"), "{stderr}");
    assert_eq!(stdout.matches("sandbox ready").count(), 2, "the agent started: {stdout}");
    Ok(())
}

/// A root-only file for a secret, in `dir`: its path.
fn secret_file(dir: &std::path::Path, name: &str, owner: u32, mode: u32) -> anyhow::Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, "sk-ant-api03-the-secret-of-the-attack-test\n")?;
    std::os::unix::fs::chown(&path, Some(owner), Some(owner))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    Ok(path.display().to_string())
}

/// Gives `path` the access control list `user::rw-, user:1000:r--, group::---, mask::r--,
/// other::---`, as `setfacl -m u:1000:r` would (no setfacl on these hosts).
fn grant_agent_by_acl(path: &str) -> anyhow::Result<()> {
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in
        [(1u16, 6u16, u32::MAX), (2, 4, 1000), (4, 0, u32::MAX), (0x10, 4, u32::MAX), (0x20, 0, u32::MAX)]
    {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    let path = std::ffi::CString::new(path)?;
    // SAFETY: setxattr with a NUL-terminated path and name and a buffer of the given length.
    let set = unsafe {
        libc::setxattr(path.as_ptr(), c"system.posix_acl_access".as_ptr(), acl.as_ptr().cast(), acl.len(), 0)
    };
    anyhow::ensure!(set == 0, "setxattr: {}", std::io::Error::last_os_error());
    Ok(())
}

/// A key file the agent could read after all, or choose: owned by the agent's uid (whose owner
/// may chmod it back, whatever its mode), readable through an access control list the mode does
/// not show, or in a folder the agent owns (where it could swap one API's key for another's, or
/// plant a CA for the next start). Each is refused at start, exit 78, naming the file; the
/// control, a root-only file, starts and stays out of the agent's reach.
#[tokio::test]
async fn a_secret_the_agent_could_read_or_swap_is_refused_at_start() -> anyhow::Result<()> {
    const SECRET: &str = "/run/secrets/anthropic_api_key";
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let owned = secret_file(dir.path(), "owned", 1000, 0o000)?;
    let acl = secret_file(dir.path(), "acl", 0, 0o640)?;
    grant_agent_by_acl(&acl)?;
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder)?;
    secret_file(&folder, "anthropic_api_key", 0, 0o600)?;
    std::os::unix::fs::chown(&folder, Some(1000), Some(1000))?;
    let folder = folder.display().to_string();
    for (source, target, why) in [
        (&owned, SECRET, "owned by the agent's uid"),
        (&acl, SECRET, "access control list"),
        (&folder, "/run/secrets", "/run/secrets is owned by the agent's uid"),
    ] {
        let exited = SandboxSpec::smallest().await?.offline().mount(source, target).run_to_exit().await?;
        assert_eq!(exited.code, 78, "{why}: {exited:?}");
        assert!(exited.stderr.contains(why), "{why}: {exited:?}");
    }
    let good = secret_file(dir.path(), "good", 0, 0o600)?;
    let sb = SandboxSpec::smallest().await?.offline().mount(&good, SECRET).start().await?;
    let read = sb.as_agent(&["sh", "-c", &format!("chmod 644 {SECRET}; cat {SECRET}")]).await?;
    assert!(read.code != 0 && !read.stdout.contains("sk-ant"), "{read:?}");
    let env = sb.as_agent(&["sh", "-c", "echo $ANTHROPIC_API_KEY"]).await?;
    assert_eq!(env.stdout.trim(), "sk-ant-api03-held-by-agent-sandbox", "the key is held: {env:?}");
    Ok(())
}

/// A policy file the agent could write (a developer's file, uid 1000 like the agent's, mounted
/// read-write; or one writable by others) would let it widen its own allowlist at the next
/// reload: sandbox-init refuses to start. The control: the same policy, root's, starts.
#[tokio::test]
async fn a_policy_file_the_agent_could_write_is_refused_at_start() -> anyhow::Result<()> {
    const POLICY: &str = "/etc/agent-sandbox/policy.yaml";
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let policy = |name: &str, owner: u32, mode: u32| -> anyhow::Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, "version: 1\ndomains:\n  - example.com\n")?;
        std::os::unix::fs::chown(&path, Some(owner), Some(owner))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(path.display().to_string())
    };
    for (source, why) in [
        (policy("owned.yaml", 1000, 0o644)?, "owned by the agent's uid 1000"),
        (policy("open.yaml", 0, 0o666)?, "lets the agent write it"),
    ] {
        let exited = SandboxSpec::smallest().await?.offline().mount(&source, POLICY).run_to_exit().await?;
        assert_eq!(exited.code, 78, "{why}: {exited:?}");
        assert!(
            exited.stderr.contains(why) && exited.stderr.contains("widen its own allowlist"),
            "{exited:?}"
        );
    }
    let good = policy("good.yaml", 0, 0o644)?;
    let sb = SandboxSpec::smallest().await?.offline().mount(&good, POLICY).start().await?;
    let write = sb.as_agent(&["sh", "-c", &format!("echo '  - evil.test' >> {POLICY}")]).await?;
    assert_ne!(write.code, 0, "the agent wrote the policy: {write:?}");
    Ok(())
}

/// The agent owns its tmux server: it turns passthrough on and writes an OSC 52 clipboard
/// sequence, wrapped for passthrough, to its pane, while the user is attached with
/// `agent-sandbox attach` from a terminal. The user's terminal gets the pane's text, not the
/// clipboard write.
#[tokio::test]
async fn the_agent_cannot_write_the_users_clipboard_through_the_launchers_attach() -> anyhow::Result<()> {
    let launcher = sandbox_tests::launcher::binary()?.display().to_string();
    let seen = seen_while_attached(move |id| format!("{launcher} attach {id}"), CLIPBOARD_WRITE).await?;
    assert_no_clipboard_write(&seen);
    Ok(())
}

/// The same, with the user attached by hand, `docker exec -it C sandbox-attach` (the way the
/// docs/docker-run.md gives without the launcher, and compose's and the devcontainer's): sandbox-attach
/// filters as root, between the agent's tmux client and the user's terminal.
#[tokio::test]
async fn the_agent_cannot_write_the_users_clipboard_through_sandbox_attach() -> anyhow::Result<()> {
    let seen =
        seen_while_attached(|id| format!("docker exec -it {id} sandbox-attach"), CLIPBOARD_WRITE).await?;
    assert_no_clipboard_write(&seen);
    Ok(())
}

/// The agent leaves a file in the project whose text writes the user's clipboard (OSC 52), and
/// the user reads it with `agent-sandbox exec S -- cat notes.md` from a terminal, with and
/// without `-t`: the terminal gets the text, not the clipboard write. The positive control: the
/// same command into a pipe passes the file's bytes as they are (the payload was there, and
/// scripts get what the command printed).
#[tokio::test]
async fn the_agent_cannot_write_the_users_clipboard_through_exec() -> anyhow::Result<()> {
    use sandbox_tests::launcher::{Launcher, Project};
    use tokio::io::AsyncReadExt as _;
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let id = launcher.offline_shell(&project, &[]).await?;
    let (_, name) = project.sandbox().await?;
    std::fs::set_permissions(project.dir.path(), std::fs::Permissions::from_mode(0o777))?;
    let write = r"printf 'before-mark]52;c;QUdFTlQtQ0xJUEJPQVJEafter-mark
' > /workspace/notes.md";
    assert_eq!(exec(&id, &["sandbox-exec", "--", "sh", "-c", write], None).await?.code, 0);

    let piped = launcher.ok(&["exec", &name, "--", "cat", "notes.md"]).await?;
    assert!(
        piped.raw.windows(9).any(|w| w == b"\x1b]52;c;QU") && piped.stdout.contains("after-mark"),
        "the control: into a pipe the file passes as it is: {piped:?}"
    );
    let binary = sandbox_tests::launcher::binary()?.display().to_string();
    for flags in ["", "-t "] {
        let user = format!("{binary} exec {flags}{name} -- cat notes.md");
        let mut run = on_a_terminal(&launcher, &user)?;
        let mut stdout = run.stdout.take().expect("piped");
        let mut seen = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), stdout.read_to_end(&mut seen)).await??;
        assert_no_clipboard_write(&String::from_utf8_lossy(&seen));
    }
    Ok(())
}

/// The agent's output switches the user's terminal into reporting the mouse (a mode the filter
/// passes, since full-screen programs need it) and then stalls, so that the user presses Ctrl-C
/// on `agent-sandbox exec`: the launcher catches the signal and switches the mode off before it
/// exits (130), rather than dying with the user's terminal turning every click into input. The
/// control: the switch itself reached the terminal.
#[tokio::test]
async fn an_interrupted_exec_leaves_the_users_terminal_as_it_found_it() -> anyhow::Result<()> {
    use sandbox_tests::launcher::{Launcher, Project};
    use tokio::io::AsyncReadExt as _;
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    launcher.offline_shell(&project, &[]).await?;
    let (_, name) = project.sandbox().await?;
    std::fs::write(project.dir.path().join("mouse.md"), "mouse-on\x1b[?1000h\n")?;
    let binary = sandbox_tests::launcher::binary()?.display().to_string();
    let user = format!("{binary} exec {name} -- sh -c 'cat mouse.md; sleep 120'; echo launcher-exited=$?");
    let mut run = on_a_terminal(&launcher, &user)?;
    let mut stdout = run.stdout.take().expect("piped");
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(&seen).contains("\x1b[?1000h") {
        let n = tokio::time::timeout_at(deadline, stdout.read(&mut buffer)).await??;
        anyhow::ensure!(n > 0, "the output ended early: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buffer[..n]);
    }
    // The user's Ctrl-C: SIGINT to the launcher (not to script(1) or its shell, whose command
    // lines hold the launcher's too).
    let wanted = [binary.as_str(), "exec", name.as_str()];
    let launcher_pid = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = line.split(|b| *b == 0).take(3).collect();
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .eq(wanted.iter().map(|w| std::borrow::Cow::Borrowed(*w)))
        })
        .ok_or_else(|| anyhow::anyhow!("no launcher to interrupt"))?;
    // SAFETY: kill(2) with a pid read from /proc and a signal number; no memory is shared.
    assert_eq!(unsafe { libc::kill(launcher_pid, libc::SIGINT) }, 0, "{}", std::io::Error::last_os_error());
    tokio::time::timeout(Duration::from_secs(30), stdout.read_to_end(&mut seen)).await??;
    let seen = String::from_utf8_lossy(&seen).into_owned();
    let after = seen.split("\x1b[?1000h").nth(1).unwrap_or_default();
    assert!(after.contains("\x1b[?1000l"), "the mouse reporting was left on: {seen:?}");
    assert!(after.contains("launcher-exited=130"), "{seen:?}");
    Ok(())
}

/// What the agent writes to its pane (through tmux passthrough, so that tmux passes it
/// unchanged) so that the user clicks it: a link whose text shows the docs over an address
/// carrying its data (the attacker's host named inside other text, or hidden by concealed
/// text), one to the user's own machine, the folder the user's next tab opens in, and a title
/// report, whose answer the terminal would type into the session. The user's terminal gets the
/// text, none of the rest: no link passes, not even one whose text is its address, since its
/// cells could be overwritten once it has passed.
#[tokio::test]
async fn the_agent_cannot_show_the_user_a_link_whose_text_lies() -> anyhow::Result<()> {
    let payload = r"printf '\033Ptmux;\033\033]8;;https://attacker.example/?d=c2VjcmV0\033\033\\\033\\' > $T; \
         printf 'https://docs.anthropic.com/en/docs' > $T; \
         printf '\033Ptmux;\033\033]8;;\033\033\\\033\\' > $T; \
         printf '\033Ptmux;\033\033]8;;http://127.0.0.1:8080/x\033\033\\127.0.0.1\033\033]8;;\033\033\\\033\\' > $T; \
         printf '\033Ptmux;\033\033]7;file://host/home/user/evil\033\033\\\033\\' > $T; \
         printf '\033Ptmux;\033\033[21t\033\\' > $T; \
         printf '\033Ptmux;\033\033]8;;https://attacker.example/?d=2\033\033\\https://docs.anthropic.com/en/attacker.example\033\033]8;;\033\033\\\033\\' > $T; \
         printf '\033Ptmux;\033\033]8;;https://attacker.example/?d=3\033\033\\attacker.example\033\033[8m docs.anthropic.com\033\033]8;;\033\033\\\033\\' > $T; \
         printf '\033[0m\033Ptmux;\033\033]8;;https://docs.anthropic.com/en/docs\033\033\\docs.anthropic.com\033\033]8;;\033\033\\\033\\' > $T";
    let seen = seen_while_attached(|id| format!("docker exec -it {id} sandbox-attach"), payload).await?;
    assert!(
        seen.contains("before-mark") && seen.contains("after-mark"),
        "the terminal showed nothing: {seen:?}"
    );
    // The positive controls: the links' text reached the user.
    assert!(seen.contains("https://docs.anthropic.com/en/docs"), "{seen:?}");
    assert!(seen.contains("https://docs.anthropic.com/en/attacker.example"), "{seen:?}");
    for sequence in ["]8;;https://attacker", "]8;;http://127.0.0.1", "]8;;https://docs", "]7;", "[21t"] {
        assert!(!seen.contains(sequence), "`{sequence}` reached the user's terminal: {seen:?}");
    }
    Ok(())
}

/// The user running `command` with the launcher's home, on a terminal (script(1) gives it one,
/// xterm's type): its output piped to the test, its input held open.
fn on_a_terminal(
    launcher: &sandbox_tests::launcher::Launcher,
    command: &str,
) -> std::io::Result<tokio::process::Child> {
    tokio::process::Command::new("script")
        .args(["-qfec", command, "/dev/null"])
        .env("HOME", launcher.home.path())
        .env("TERM", "xterm-256color")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}

/// The attack, with the user attached by `attach(container id)`, a command run on a terminal:
/// what the terminal received.
async fn seen_while_attached(attach: impl FnOnce(&str) -> String, payload: &str) -> anyhow::Result<String> {
    use sandbox_tests::launcher::{Launcher, Project};
    use tokio::io::AsyncReadExt as _;
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let id = launcher.offline_shell(&project, &[]).await?;

    // The user, on a terminal (script(1) gives the command one).
    let attach = attach(&id);
    let mut user = on_a_terminal(&launcher, &attach)?;
    write_once_attached(&id, payload).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    exec(&id, &["sandbox-exec", "--", "tmux", "detach-client", "-s", "agent"], None).await?;
    let mut stdout = user.stdout.take().expect("piped");
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stdout.read_to_end(&mut seen)).await;
    let _ = user.kill().await;
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

/// The same, with the user on the container's own terminal (`docker run -it`): PID 1 attaches
/// it through sandbox-attach's relay too.
#[tokio::test]
async fn the_agent_cannot_write_the_users_clipboard_through_the_containers_terminal() -> anyhow::Result<()> {
    use futures_util::StreamExt as _;
    let shell = sandbox_tests::images::image("shell").await?;
    let (container, mut attached) =
        sandbox_tests::docker::start_with_terminal(&shell, "tty-clipboard").await?;
    write_once_attached(&container.0, CLIPBOARD_WRITE).await?;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !seen.contains("after-mark") {
        match tokio::time::timeout_at(deadline, attached.output.next()).await {
            Ok(Some(Ok(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk.into_bytes())),
            _ => break,
        }
    }
    assert_no_clipboard_write(&seen);
    Ok(())
}

/// The agent replaces its tmux client, while the user is attached with `docker exec -it C
/// sandbox-attach`, by a long sleep that lets go of the client's terminal: the root relay must
/// not wait on it for as long as the agent likes. It ends, and the sleep with it.
#[tokio::test]
async fn the_agent_cannot_keep_a_root_relay_alive_after_its_client_lets_go() -> anyhow::Result<()> {
    let (launcher, project) =
        (sandbox_tests::launcher::Launcher::new()?, sandbox_tests::launcher::Project::new()?);
    let id = launcher.offline_shell(&project, &[]).await?;
    let _user = tokio::process::Command::new("script")
        .args(["-qfec", &format!("docker exec -it {id} sandbox-attach"), "/dev/null"])
        .env("TERM", "xterm-256color")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let count = |name: &'static str| {
        let id = id.clone();
        async move {
            let list = format!(
                "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -cx '{name}' || true"
            );
            anyhow::Ok(exec(&id, &["sh", "-c", &list], None).await?.stdout.trim().parse::<u32>()?)
        }
    };
    let agent = |script: &'static str| {
        let id = id.clone();
        async move { exec(&id, &["sandbox-exec", "--", "sh", "-c", script], None).await }
    };
    let mut attached = false;
    for _ in 0..100 {
        if !agent("tmux list-clients").await?.stdout.trim().is_empty() {
            attached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attached, "sandbox-attach never attached");
    // Positive control: the relay runs while the user is attached.
    assert_eq!(count("sandbox-attach").await?, 1);
    let replaced =
        agent("tmux detach-client -s agent -E 'exec sleep 300 </dev/null >/dev/null 2>&1'").await?;
    assert_eq!(replaced.code, 0, "{replaced:?}");
    let mut left = (1, 1);
    for _ in 0..100 {
        left = (count("sandbox-attach").await?, count("sleep").await?);
        if left == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, (0, 0), "(root relays, the agent's sleeps) still running 10 s later");
    Ok(())
}

/// OSC 52 clipboard writes, wrapped for tmux passthrough and bare, written to the pane's
/// terminal `$T`.
const CLIPBOARD_WRITE: &str = r"printf '\033Ptmux;\033\033]52;c;QUdFTlQtQ0xJUEJPQVJE\007\033\\' > $T; \
    printf '\033]52;c;QUdFTlQtQ0xJUEJPQVJE\007' > $T";

/// As the agent, once a client is attached: passthrough on, then the pane's text around
/// `payload`, a shell script that writes to the pane's terminal `$T`.
async fn write_once_attached(id: &str, payload: &str) -> anyhow::Result<()> {
    let agent =
        |script: String| async move { exec(id, &["sandbox-exec", "--", "sh", "-c", &script], None).await };
    let mut attached = false;
    for _ in 0..100 {
        if !agent("tmux list-clients".into()).await?.stdout.trim().is_empty() {
            attached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::ensure!(attached, "no client ever attached");
    assert_eq!(agent("tmux set -g allow-passthrough on".into()).await?.code, 0);
    let tty = agent("tmux display-message -p '#{pane_tty}'".into()).await?.stdout.trim().to_string();
    let write =
        format!("T={tty}; printf 'before-%s\\n' mark > $T; {payload}; printf 'after-%s\\n' mark > $T");
    assert_eq!(agent(write).await?.code, 0);
    Ok(())
}

/// What the user's terminal received: the pane's text around the attack (the positive
/// control), and no clipboard write.
fn assert_no_clipboard_write(seen: &str) {
    assert!(
        seen.contains("before-mark") && seen.contains("after-mark"),
        "the terminal showed nothing: {seen:?}"
    );
    assert!(!seen.contains("52;c;"), "the agent wrote the user's clipboard: {seen:?}");
}

/// The project as a host user's repository: its files the agent's (uid 1000, as the host's
/// first user usually is), one commit, and a bare repository inside it to fetch from.
fn git_project(project: &sandbox_tests::launcher::Project) -> anyhow::Result<()> {
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "safe.directory=*",
                "-c",
                "user.name=u",
                "-c",
                "user.email=u@x",
                "-C",
                &project.path,
            ])
            .args(args)
            .output()?;
        anyhow::ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    };
    git(&["init", "-q", "-b", "main"])?;
    std::fs::write(format!("{}/README", project.path), "hello\n")?;
    git(&["add", "README"])?;
    git(&["commit", "-qm", "first"])?;
    git(&["clone", "-q", "--bare", ".", "upstream.git"])?;
    // A submodule at a deep path (its git directory is .git/modules/third_party/lib/foo) and a
    // repository nested in the project before the run.
    git(&[
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "add",
        "-q",
        "./upstream.git",
        "third_party/lib/foo",
    ])?;
    git(&["commit", "-qm", "a submodule"])?;
    git(&["init", "-q", "vendor/x"])?;
    std::process::Command::new("chown").args(["-R", "1000:1000", &project.path]).status()?;
    Ok(())
}

/// The user's own `git status` in the project, on the host: whether it ran the agent's command
/// (which leaves `pwned-by-the-agent` in the project).
fn users_git_status_runs_the_agents_command(
    project: &sandbox_tests::launcher::Project,
) -> anyhow::Result<bool> {
    let pwned = std::path::Path::new(&project.path).join("pwned-by-the-agent");
    let _ = std::fs::remove_file(&pwned);
    std::process::Command::new("git")
        .args(["-c", "safe.directory=*", "-C", &project.path, "status", "--short"])
        .output()?;
    Ok(pwned.exists())
}

/// The agent writes the project's git configuration so that the user's next `git status` on
/// the host runs its command as the user (`core.fsmonitor`; a hook for the next commit; the
/// same in a submodule at a deep path and in a repository nested before the run), moves
/// `.git` away to put its own in its place, points a submodule's `.git` file at a git
/// directory of its own, and then, past what mounts can stop, plants a repository nested in
/// the project (registered as a submodule, whose configuration the user's git runs), a bare
/// one under another name, and a `commondir` that points git at a configuration of its own.
/// The first are refused (read-only mounts, a mount point), and the user's `git status` runs
/// nothing; `stop` names the last two and exits 72. Inside, git still adds, commits, branches
/// and fetches. The control: with `--writable-git-config` the same write makes the user's
/// `git status` run the agent's command.
#[tokio::test]
async fn the_agent_cannot_make_the_users_git_run_its_commands() -> anyhow::Result<()> {
    use sandbox_tests::launcher::{Launcher, Project};
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    git_project(&project)?;
    let config_before = std::fs::read(format!("{}/.git/config", project.path))?;
    let id = launcher.offline_shell(&project, &[]).await?;
    let agent = |script: &str| {
        let (id, script) = (id.clone(), format!("cd /workspace && {script}"));
        async move { exec(&id, &["sandbox-exec", "--", "sh", "-c", &script], None).await }
    };
    for attack in [
        "git config core.fsmonitor 'touch pwned-by-the-agent; false'",
        "printf '#!/bin/sh\\ntouch pwned-by-the-agent\\n' > .git/hooks/pre-commit",
        "mv .git .git-moved",
        "rm -rf .git/hooks",
        // Found by a red team: a submodule at a deep path, its `.git` file pointed at a git
        // directory of the agent's, and a repository nested before the run.
        "git -C third_party/lib/foo config core.fsmonitor 'touch ../../../pwned-by-the-agent; false'",
        "echo 'gitdir: ../../../.git/cache' > third_party/lib/foo/.git",
        "git -C vendor/x config core.fsmonitor 'touch ../../pwned-by-the-agent; false'",
    ] {
        let out = agent(attack).await?;
        assert_ne!(out.code, 0, "`{attack}` succeeded: {out:?}");
    }
    assert!(!users_git_status_runs_the_agents_command(&project)?, "the user's git ran the agent's command");
    assert_eq!(std::fs::read(format!("{}/.git/config", project.path))?, config_before);
    // git's own work goes on inside.
    let work = agent(
        "git checkout -q -b feature && echo more >> README && git add README \
         && git -c user.name=a -c user.email=a@x commit -qm more && git fetch -q /workspace/upstream.git main \
         && git log --oneline | wc -l",
    )
    .await?;
    assert_eq!((work.code, work.stdout.trim()), (0, "3"), "{work:?}");
    // What mounts cannot stop: a nested repository with its own configuration, registered as
    // a submodule, and a redirect of the main repository's configuration.
    let planted = agent(
        "mkdir sub && cd sub && git init -q && git -c user.name=a -c user.email=a@x commit -q --allow-empty -m s \
         && git config core.fsmonitor 'touch ../pwned-by-the-agent; false' && cd .. && git add sub \
         && echo ../evil > .git/commondir \
         && git init -q --bare docs/api",
    )
    .await?;
    assert_eq!(planted.code, 0, "{planted:?}");
    let stopped = launcher.run(&["stop", &id]).await?;
    assert_eq!(stopped.code, 72, "{stopped:?}");
    for named in [
        "new repository in the project: sub/.git",
        ".git/commondir",
        "new repository in the project: docs/api",
    ] {
        assert!(stopped.stderr.contains(named), "{named}: {}", stopped.stderr);
    }

    // The control: the protection off, the same write reaches the user.
    let project = Project::new()?;
    git_project(&project)?;
    let id = launcher.offline_shell(&project, &["--writable-git-config"]).await?;
    let out = exec(
        &id,
        &[
            "sandbox-exec",
            "--",
            "git",
            "-C",
            "/workspace",
            "config",
            "core.fsmonitor",
            "touch pwned-by-the-agent; false",
        ],
        None,
    )
    .await?;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(users_git_status_runs_the_agents_command(&project)?, "the control: the attack works unguarded");
    Ok(())
}

/// The folder `docker-compose config` mounts at /workspace for `file`, with `env`; or its error.
fn compose_workspace(file: &std::path::Path, env: &[(&str, &str)]) -> anyhow::Result<Result<String, String>> {
    let out = std::process::Command::new("docker-compose")
        .args(["--ansi", "never", "-p", "attack", "-f"])
        .arg(file)
        .arg("config")
        .env_remove("WORKSPACE")
        .env("SANDBOX_DNS", "192.0.2.53")
        .envs(env.iter().copied())
        .output()?;
    if !out.status.success() {
        return Ok(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let config: serde_json::Value = yaml_serde::from_str(&String::from_utf8_lossy(&out.stdout))?;
    // docker-compose 1.29 prints each as `SOURCE:TARGET:MODE`.
    let volumes = config["services"]["claude"]["volumes"].as_array().cloned().unwrap_or_default();
    let workspace = volumes
        .iter()
        .filter_map(|v| v.as_str())
        .find_map(|v| v.strip_suffix(":/workspace:rw").map(str::to_string));
    Ok(workspace.ok_or_else(|| format!("no /workspace in {config}")))
}

/// The agent writes what is mounted at /workspace. A compose file that defaulted the project to
/// `.` would mount its own folder there when WORKSPACE is unset (the examples' folder, or the
/// project a user copied it into), and the agent could add a privileged service that the next
/// `up` runs as root on the host. The sidecar example (run by the real docker-compose here)
/// refuses to start without WORKSPACE; the control is the same file with the old default.
#[test]
fn the_agent_never_gets_the_compose_files_own_folder() -> anyhow::Result<()> {
    let example = sandbox_tests::root().join("examples/compose-sidecar.yaml");
    let refused = compose_workspace(&example, &[])?.expect_err("the example started without WORKSPACE");
    assert!(refused.contains("WORKSPACE"), "{refused}");
    let project = tempfile::tempdir()?;
    let given = project.path().to_str().unwrap();
    assert_eq!(compose_workspace(&example, &[("WORKSPACE", given)])?, Ok(given.to_string()));

    // The control: with a default of `.`, the file's own folder is the agent's.
    let copy = tempfile::tempdir()?;
    let text = std::fs::read_to_string(&example)?;
    let required =
        text.lines().find(|l| l.contains("${WORKSPACE:?")).expect("the example requires WORKSPACE");
    let defaulted = required.split("${WORKSPACE").next().unwrap().to_string() + "${WORKSPACE:-.}:/workspace";
    let file = copy.path().join("compose.yaml");
    std::fs::write(&file, text.replace(required, &defaulted))?;
    assert_eq!(compose_workspace(&file, &[])?, Ok(copy.path().to_str().unwrap().to_string()));
    Ok(())
}

/// The user's own tools keep credentials in the home folder (the engine's logins, GitHub's CLI,
/// npm, git, netrc, the clouds', Kubernetes', SSH keys), and an agent that read one would hold
/// them. `run` copies none in: with every one of them in the home folder and
/// `--login-from-host`, the agent finds none of their contents anywhere in its sandbox; and an
/// image whose sign-in label names one is refused before anything is made. The control: the
/// image's own sign-in file is copied in.
#[tokio::test]
async fn the_users_tool_credentials_never_enter_a_sandbox() -> anyhow::Result<()> {
    use sandbox_tests::launcher::{Launcher, Project};
    const MARK: &str = "CREDENTIAL-of-the-users-own-tools-7c2e";
    let launcher = Launcher::new()?;
    let home = launcher.home.path();
    for relative in [
        ".docker/config.json",
        ".config/gh/hosts.yml",
        ".npmrc",
        ".git-credentials",
        ".netrc",
        ".aws/credentials",
        ".config/gcloud/application_default_credentials.json",
        ".kube/config",
        ".ssh/id_ed25519",
    ] {
        let path = home.join(relative);
        std::fs::create_dir_all(path.parent().expect("a folder"))?;
        std::fs::write(&path, format!("{MARK} {relative}\n"))?;
    }
    let signed_in = r#"{"claudeAiOauth":{"accessToken":"the-images-own-sign-in"}}"#;
    std::fs::create_dir_all(home.join(".claude"))?;
    std::fs::write(home.join(".claude/.credentials.json"), signed_in)?;

    let claude = sandbox_tests::images::image("claude").await?;
    let project = Project::new()?;
    let run = ["run", "claude", &project.path, "--detach", "--offline", "--no-key", "--login-from-host"];
    launcher.ok(&[&run[..], &["--image", &claude]].concat()).await?;
    let (id, _) = project.sandbox().await?;
    let copied = exec(&id, &["cat", "/home/agent/.claude/.credentials.json"], None).await?;
    assert_eq!(copied.stdout, signed_in, "the control: the image's own sign-in file");
    let hex: String = MARK.bytes().map(|b| format!("{b:02x}")).collect();
    let sb = Sandbox::adopt(&id).await?;
    let hunt = sb.probe(&["find-string", &hex, "/"]).await?;
    assert_eq!(hunt.fields["found"], "", "the agent found a credential: {:?}", hunt.fields);
    let as_root = exec(
        &id,
        &["sh", "-c", &format!("grep -rlsx --exclude-dir=proc --exclude-dir=sys -e '{MARK}.*' / || true")],
        None,
    )
    .await?;
    assert_eq!(as_root.stdout.trim(), "", "a credential is in the container: {as_root:?}");

    // An image whose label names one among its own files (claude's, with ~/.ssh added).
    let label = format!("LABEL {}=.claude/.credentials.json:.ssh/id_ed25519", xtask::labels::LOGIN_FILES);
    let hostile =
        sandbox_tests::images::with_change(&claude, "localhost/agent-sandbox-test/names-ssh:1", &label)?;
    let other = Project::new()?;
    let refused =
        launcher.run(&[&run[..2], &[&other.path], &run[3..], &["--image", &hostile.0]].concat()).await?;
    assert_eq!(refused.code, 71, "{refused:?}");
    assert!(refused.stderr.contains("`~/.ssh`, a credential of your own tools"), "{refused:?}");
    assert!(other.containers().await?.is_empty(), "something was made");
    Ok(())
}

/// PID 1's start time, as /proc/1/stat's 22nd field gives it (the ready mark's second word).
async fn pid1_start_time(sb: &Sandbox) -> anyhow::Result<String> {
    let out = sb.exec(&["sh", "-c", "cut -d')' -f2- /proc/1/stat | awk '{print $20}'"]).await?;
    anyhow::ensure!(out.code == 0 && !out.stdout.trim().is_empty(), "{out:?}");
    Ok(out.stdout.trim().to_string())
}

/// A restart gives the container a new network namespace, which has no firewall until PID 1
/// loads it, and keeps the last run's ready mark (and `sandbox ready` line) from before. A
/// command the user runs at once after a restart (`agent-sandbox exec`, whose wait that old line
/// satisfies; a script's `docker exec C sandbox-exec`) could reach the network unfiltered in
/// that window, running whatever the agent planted in the project. sandbox-exec runs nothing
/// until this start's PID 1 has written its ready mark: with a mark naming another PID 1 it
/// waits, and is refused (126) when its wait ends first; it runs once the mark is PID 1's. After
/// a real restart, the first command sees this start's mark. The control: with PID 1's own mark
/// a command runs at once.
#[tokio::test]
async fn sandbox_exec_runs_nothing_until_this_starts_pid_1_is_ready() -> anyhow::Result<()> {
    const MARK: &str = "/run/agent-sandbox/ready";
    let sb = SandboxSpec::smallest().await?.offline().start().await?;
    let own = sb.exec(&["cat", MARK]).await?.stdout.trim().to_string();
    let started = |mark: &str| mark.split_once(' ').map(|(_, start)| start.to_string()).unwrap_or_default();
    assert_eq!(started(&own), pid1_start_time(&sb).await?, "the mark does not name PID 1's start: {own}");
    let control = sb.as_agent(&["cat", MARK]).await?;
    assert_eq!((control.code, control.stdout.trim()), (0, own.as_str()), "{control:?}");

    // A mark of another PID 1, as a restart leaves it: nothing runs within a short wait.
    sb.exec(&["sh", "-c", &format!("echo 1 > {MARK}")]).await?;
    let refused =
        sb.exec(&["sh", "-c", "SANDBOX_EXEC_WAIT=1 sandbox-exec -- echo ran; echo code=$?"]).await?;
    assert!(refused.stdout.contains("code=126") && !refused.stdout.contains("ran"), "{refused:?}");
    assert!(refused.stderr.contains("sandbox-exec: the sandbox is not ready"), "{refused:?}");
    // It waits, and runs once PID 1's mark is back (renamed into place, as PID 1 writes it).
    let id = sb.id().to_string();
    let waiting = tokio::spawn(async move { exec(&id, &["sandbox-exec", "--", "cat", MARK], None).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "sandbox-exec ran under another PID 1's mark");
    sb.exec(&["sh", "-c", &format!("echo {own} > {MARK}.t && mv {MARK}.t {MARK}")]).await?;
    let ran = tokio::time::timeout(Duration::from_secs(10), waiting).await???;
    assert_eq!((ran.code, ran.stdout.trim()), (0, own.as_str()), "{ran:?}");

    // A real restart: the first command run sees this start's mark, never the last run's.
    sb.stop().await?;
    sb.start_again().await?;
    let first = sb.as_agent(&["cat", MARK]).await?;
    let now = pid1_start_time(&sb).await?;
    assert_ne!(now, started(&own), "PID 1 did not change");
    assert_eq!((first.code, started(first.stdout.trim())), (0, now), "{first:?}");
    assert_eq!(sb.logs().await?.0.matches("sandbox ready").count(), 2, "it ran before this start was ready");
    Ok(())
}
