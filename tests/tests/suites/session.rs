//! The agent's tmux session: it exists, survives clients that detach or are killed, keeps its
//! scrollback and processes, can be reattached from a pty, keeps a shell when the agent command
//! exits, and PID 1 ends with it. Needs no capability: runs in both modes.

use std::time::Duration;

use anyhow::Context as _;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;

async fn start(env: &[(&str, &str)]) -> anyhow::Result<Sandbox> {
    let mut spec = SandboxSpec::smallest().await?.offline();
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    spec.start().await
}

async fn capture(sb: &Sandbox) -> anyhow::Result<String> {
    Ok(sb.as_agent(&["tmux", "capture-pane", "-p", "-S", "-", "-t", "agent"]).await?.stdout)
}

async fn wait_for_pane(sb: &Sandbox, needle: &str) -> anyhow::Result<String> {
    for _ in 0..100 {
        let pane = capture(sb).await?;
        if pane.contains(needle) {
            return Ok(pane);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the pane never showed `{needle}`:\n{}", capture(sb).await?)
}

#[tokio::test]
async fn the_session_survives_detached_and_killed_clients_with_its_scrollback_and_processes()
-> anyhow::Result<()> {
    let sb = start(&[]).await?;
    assert_eq!(sb.as_agent(&["tmux", "has-session", "-t", "agent"]).await?.code, 0);
    let keys = ["tmux", "send-keys", "-t", "agent", "echo marker-$((6*7)); sleep 1000 &", "Enter"];
    sb.as_agent(&keys).await?;
    wait_for_pane(&sb, "marker-42").await?;

    // A client on a pty that detaches, and one that is killed.
    let detach = sb.exec(&["sh", "-c", "(sleep 1; echo) | timeout 5 script -qec 'sandbox-attach' /dev/null >/dev/null; sandbox-exec tmux detach-client -a; echo done"]).await?;
    assert!(detach.stdout.contains("done"), "{detach:?}");
    let killed = sb
        .exec(&["sh", "-c", "sleep 3 | timeout -s KILL 1 script -qec 'sandbox-attach' /dev/null; echo $?"])
        .await?;
    assert!(killed.stdout.trim().ends_with("137") || killed.stdout.trim().ends_with("124"), "{killed:?}");

    assert_eq!(sb.as_agent(&["tmux", "has-session", "-t", "agent"]).await?.code, 0, "the session is gone");
    assert!(capture(&sb).await?.contains("marker-42"), "the scrollback was lost");
    let sleeping = sb.exec(&["sh", "-c", "grep -l '^Name:.*sleep' /proc/[0-9]*/status | wc -l"]).await?;
    assert_eq!(sleeping.stdout.trim(), "1", "the pane's background process died");
    Ok(())
}

#[tokio::test]
async fn sandbox_attach_shows_the_session_on_a_pty() -> anyhow::Result<()> {
    let sb = start(&[]).await?;
    sb.as_agent(&["tmux", "send-keys", "-t", "agent", "echo visible-$((2+3))", "Enter"]).await?;
    wait_for_pane(&sb, "visible-5").await?;
    // The client runs in the background on a pty; the screen it draws is watched until the
    // marker shows (a loaded machine may take a while), not for a fixed time.
    let attach = "(sleep 15 | timeout 20 script -qfec sandbox-attach /tmp/screen >/dev/null 2>&1 &); \
                  for i in $(seq 150); do grep -q visible-5 /tmp/screen 2>/dev/null && break; sleep 0.1; done; \
                  cat /tmp/screen";
    let out = sb.exec(&["sh", "-c", attach]).await?;
    assert!(out.stdout.contains("visible-5"), "the attached client did not show the session: {out:?}");
    Ok(())
}

/// sandbox-attach relays through a pty of its own (for its output filter): the user's keys reach
/// the session, and the client's window is the user's terminal's size, at the start and after a
/// resize (SIGWINCH).
#[tokio::test]
async fn sandbox_attach_passes_keys_and_follows_the_window_size() -> anyhow::Result<()> {
    let sb = start(&[]).await?;
    // The user's terminal: script(1)'s pty, 101x33, its keys from a fifo held open meanwhile.
    let attach = "mkfifo /run/attach-test-keys && (sleep 60 > /run/attach-test-keys &) && \
                  (timeout 60 script -qfec 'stty cols 101 rows 33; exec sandbox-attach' /dev/null \
                   < /run/attach-test-keys > /dev/null 2>&1 &)";
    assert_eq!(sb.exec(&["sh", "-c", attach]).await?.code, 0);
    let size = |expected: &'static str| {
        let sb = &sb;
        async move {
            let mut seen = String::new();
            for _ in 0..150 {
                let clients =
                    sb.as_agent(&["tmux", "list-clients", "-F", "#{client_width}x#{client_height}"]).await?;
                seen = clients.stdout.trim().to_string();
                if seen == expected {
                    return anyhow::Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::bail!("the client's window is {seen:?}, not {expected}")
        }
    };
    size("101x33").await?;
    // The user resizes the terminal: the pty sandbox-attach reads from (its standard input).
    let resize = "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sandbox-attach ] && \
                  stty -F \"$(readlink $p/fd/0)\" cols 120 rows 40 && exit 0; done; exit 1";
    let resized = sb.exec(&["sh", "-c", resize]).await?;
    assert_eq!(resized.code, 0, "{resized:?}");
    size("120x40").await?;
    assert_eq!(
        sb.exec(&["sh", "-c", "printf 'echo typed-$((6*7))\\r' > /run/attach-test-keys"]).await?.code,
        0
    );
    wait_for_pane(&sb, "typed-42").await?;
    Ok(())
}

#[tokio::test]
async fn when_the_agent_command_exits_the_pane_keeps_a_shell() -> anyhow::Result<()> {
    let sb = start(&[("ASSISTANT_CMD", "echo agent-ran; exit 3")]).await?;
    let pane = wait_for_pane(&sb, "exited with status 3; this shell keeps the session").await?;
    assert!(pane.contains("agent-ran"), "{pane}");
    let command =
        sb.as_agent(&["tmux", "display-message", "-p", "-t", "agent", "#{pane_current_command}"]).await?;
    assert_eq!(command.stdout.trim(), "bash", "{command:?}");
    assert_eq!(sb.as_agent(&["tmux", "has-session", "-t", "agent"]).await?.code, 0);
    Ok(())
}

#[tokio::test]
async fn pid_1_exits_with_the_sessions_status_and_stops_promptly() -> anyhow::Result<()> {
    let sb = start(&[("ASSISTANT_CMD", "sleep 1000")]).await?;
    // The shell after the agent command ends the session with `exit 5`.
    let kill = r#"for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && kill ${p#/proc/}; done; true"#;
    sb.as_agent(&["sh", "-c", kill]).await?;
    wait_for_pane(&sb, "this shell keeps the session").await?;
    sb.as_agent(&["tmux", "send-keys", "-t", "agent", "exit 5", "Enter"]).await?;
    assert_eq!(sb.exit_code().await?, Some(5), "PID 1's exit status");

    // docker stop: SIGTERM reaches the agent command, which ends; PID 1 follows at once.
    let sb = start(&[("ASSISTANT_CMD", "sleep 1000")]).await?;
    let started = std::time::Instant::now();
    sb.stop().await?;
    assert!(started.elapsed() < Duration::from_secs(5), "docker stop took {:?}", started.elapsed());
    assert_eq!(sb.exit_code().await?, Some(143), "sleep ended by SIGTERM");
    Ok(())
}

#[tokio::test]
async fn pid_1_reaps_orphans() -> anyhow::Result<()> {
    let sb = start(&[]).await?;
    // A double fork: the grandchild is orphaned, reparented to PID 1, and exits.
    sb.as_agent(&["sh", "-c", "(sh -c 'sleep 0.2 &' &) ; sleep 1"]).await?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let zombies =
        sb.exec(&["sh", "-c", "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"]).await?;
    assert_eq!(zombies.stdout.trim(), "0", "zombies left: {zombies:?}");
    Ok(())
}

/// `docker run -it`: the session is attached to the container's own terminal, keystrokes reach
/// the agent's shell, and ending the session ends the container with its status.
#[tokio::test]
async fn with_a_tty_the_session_is_the_containers_terminal() -> anyhow::Result<()> {
    use futures_util::StreamExt as _;
    use tokio::io::AsyncWriteExt as _;

    let image = sandbox_tests::images::image(sandbox_tests::spec::SMALLEST).await?;
    let (container, mut attached) = sandbox_tests::docker::start_with_terminal(&image, "tty").await?;
    let id = container.0.clone();

    let mut screen = String::new();
    let mut read_until = async |needle: &str, screen: &mut String| -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !screen.contains(needle) {
            match tokio::time::timeout_at(deadline, attached.output.next()).await {
                Ok(Some(Ok(chunk))) => screen.push_str(&chunk.to_string()),
                other => {
                    anyhow::bail!("`{needle}` never appeared ({other:?}); the terminal showed:\n{screen}")
                }
            }
        }
        Ok(())
    };
    // The attached tmux client draws the session; the shell's prompt ends with `$ `. The ready
    // line came first, on the same terminal: the container's log has it even when the engine
    // hands an attach that raced the start only what followed (seen once under load).
    read_until("$ ", &mut screen).await?;
    let (log, _) = sandbox_tests::docker::container_logs(&id).await?;
    assert!(
        log.contains("sandbox ready"),
        "the terminal never said `sandbox ready`: {log:?}\nscreen: {screen:?}"
    );
    attached.input.write_all(b"echo tty-$((3*3))\r").await?;
    read_until("tty-9", &mut screen).await?;
    attached.input.write_all(b"exit\r").await?;
    read_until("this shell keeps the session", &mut screen).await?;
    attached.input.write_all(b"exit 4\r").await?;
    let code = sandbox_tests::docker::exit_code(&id, Duration::from_secs(15))
        .await?
        .context("the container still ran 15 s after the session's `exit 4`")?;
    assert_eq!(code, 4, "the container's exit status is the session's");
    Ok(())
}

#[tokio::test]
async fn sigint_to_pid_1_reaches_the_agent_command() -> anyhow::Result<()> {
    let sb = start(&[("ASSISTANT_CMD", "trap 'echo got-sigint; exit 9' INT; sleep 1000 & wait")]).await?;
    wait_for_pane(&sb, "").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    sb.signal("SIGINT").await?;
    assert_eq!(sb.exit_code().await?, Some(9), "the agent command's INT trap decides PID 1's status");
    Ok(())
}

net_admin! {
    [single, sidecar, gvisor] {
        /// An idle session costs nothing: its tmux server sleeps. Measured as the kernel (or gVisor's
        /// Sentry) counts it, the server's CPU time over three idle seconds beside a busy loop's
        /// over the same seconds, the control that the count sees a process that spins. Under
        /// gVisor, tmux's libevent on poll(2) spun on a gone client's descriptor and kept two
        /// cores busy (session.rs's `TMUX_EVENT_BACKEND`, which the agent's processes never get).
        #[tokio::test]
        async fn an_idle_session_sleeps() -> anyhow::Result<()> {
            let world = sandbox_tests::world::World::shared().await?;
            let sb = SandboxSpec::smallest().await?.net_admin().on(&world.net).start().await?;
            let measure = r#"ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
                server=$(grep -l '^Name:[[:space:]]tmux: server$' /proc/[0-9]*/status | head -n 1 | cut -d / -f 3)
                [ -n "$server" ] || { echo "no tmux server"; exit 1; }
                sh -c 'while :; do :; done' & busy=$!
                a=$(ticks "$server"); b=$(ticks "$busy"); sleep 3; c=$(ticks "$server"); d=$(ticks "$busy")
                kill "$busy"
                echo "$((c - a)) $((d - b)) $(getconf CLK_TCK)""#;
            let out = sb.as_agent(&["sh", "-c", measure]).await?;
            let figures: Vec<u64> = out.stdout.split_whitespace().filter_map(|f| f.parse().ok()).collect();
            let [server, busy, hz] = figures[..] else { anyhow::bail!("no figures: {out:?}") };
            // The control: a loop that spins gets a tenth of a core at least, on a loaded machine too.
            assert!(busy * 10 >= 3 * hz, "the busy loop's time was not seen ({busy} ticks of {hz}/s in 3 s): {out:?}");
            assert!(
                server * 10 < 3 * hz,
                "the idle session's tmux server used {server} ticks of {hz}/s in 3 s (the busy loop {busy})"
            );
            // The backend's variable is tmux's alone: not in the pane, nor in windows opened later.
            sb.as_agent(&["tmux", "send-keys", "-t", "agent", "echo nopoll-${EVENT_NOPOLL-unset}", "Enter"]).await?;
            wait_for_pane(&sb, "nopoll-unset").await?;
            let global = sb.as_agent(&["tmux", "show-environment", "-g", "EVENT_NOPOLL"]).await?;
            assert_ne!(global.code, 0, "the session's global environment holds it: {global:?}");
            Ok(())
        }
    }
}
