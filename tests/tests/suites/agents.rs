//! Every agent CLI completes a real turn in its sandbox (generated from images/*/turn.yaml by
//! tests/build.rs): the image's own policy plus only the mock model API's names, the API key
//! as a root-only secret that sandbox-init's forwarder holds, and the mock (tests/probe's
//! mock.rs, under the real API host names, with the test CA as the forwarder's extra CA)
//! answering the CLI's first request with a tool call that writes a file. The test asserts the
//! mock got the real key, the file is there, the CLI exited 0, and the agent can find the key
//! nowhere, before the turn and after it (the same key is in the container's environment too). DNS comes from a peer that knows only the API names, so a CLI's other hosts
//! (telemetry, updates) resolve to nothing and are listed. NET_ADMIN, private networks.

use std::collections::BTreeMap;

use sandbox_tests::docker::TestNet;
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::peers::Peer;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::{SandboxSpec, ca_secret_file, secret_file};

/// The model APIs' hosts, from sandbox-init's table: the mock API plays each.
fn api_hosts() -> Vec<&'static str> {
    sandbox_init::apis::APIS.iter().map(|api| api.host).collect()
}

/// What the mock's tool call writes (tests/probe/src/mock.rs).
const FILE: &str = "/workspace/agent-turn.txt";
const CONTENT: &str = "written by the mock API's tool call\n";

/// images/<name>/turn.yaml.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    /// The API whose key the turn needs: a name of sandbox-init's table (anthropic, openai,
    /// gemini, mistral).
    api: String,
    /// A shell command, run as the agent in /workspace.
    run: String,
    /// Files written under the agent's home first.
    #[serde(default)]
    files: BTreeMap<String, String>,
    /// Why the CLI writes the file even without its unattended arguments, where it does (the
    /// test then asserts that it does, so that a change of the CLI's is noticed).
    #[serde(default)]
    acts_without_unattended: Option<String>,
    /// How the CLI's own sign-in is copied in, expired, for the refresh test.
    #[serde(default)]
    refresh: Option<Refresh>,
    /// The turn's command on a model server of the user's (`run --model-server`), where the
    /// CLI can use one: `run` without what names a cloud model.
    #[serde(default)]
    local: Option<String>,
}

/// A CLI's sign-in as `agent-sandbox run --login-from-host` copies it, with its access token
/// expired: the CLI must refresh it through the sandbox (its policy allowing its sign-in's
/// hosts), and finish its turn with the new token, with no key held.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Refresh {
    /// The sign-in file under the agent's home (in its state directory).
    file: String,
    /// Its contents: `{EXPIRED_MS}` and `{EXPIRED_S}` become a time an hour ago (milliseconds,
    /// seconds since the epoch), `{EXPIRED_JWT}` an OpenAI token that expired then,
    /// `{ID_JWT}` a valid one, `{REFRESH}` the refresh token the mock must be sent.
    content: String,
    /// More files under the home (a setting that selects the sign-in).
    #[serde(default)]
    files: BTreeMap<String, String>,
    /// Variables for the turn: how the CLI trusts the test CA (`{CA}`, its path).
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// The hosts of its sign-in and of the API a sign-in's requests go to, which the mock
    /// answers for (its policy must allow them: they are not added).
    hosts: Vec<String>,
    /// The turn's command, if not `run`.
    #[serde(default)]
    run: Option<String>,
}

macro_rules! agent_tests {
    ($name:literal) => {
        #[tokio::test]
        async fn completes_a_turn_with_a_sandbox_held_key() -> anyhow::Result<()> {
            super::completes_a_turn($name).await
        }
    };
}

macro_rules! refresh_tests {
    ($name:literal) => {
        #[tokio::test]
        async fn refreshes_an_expired_sign_in_and_completes_a_turn() -> anyhow::Result<()> {
            super::refreshes_and_completes_a_turn($name).await
        }
    };
}

macro_rules! local_model_tests {
    ($name:literal) => {
        #[tokio::test]
        async fn completes_a_turn_on_a_model_server_of_the_users() -> anyhow::Result<()> {
            super::completes_a_local_turn($name).await
        }
    };
}

// Each agent's module, `agents::net_admin::single::<image>::…`: a turn's sandbox is on a test
// network with its firewall.
net_admin! {
    [single] {
        include!(concat!(env!("OUT_DIR"), "/agent_turns.rs"));
    }
}

fn read_turn(name: &str) -> anyhow::Result<Turn> {
    let path = sandbox_tests::root().join("images").join(name).join("turn.yaml");
    yaml_serde::from_str(&std::fs::read_to_string(&path)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The refresh token the copied sign-in holds, which the CLI must send to its sign-in's host.
const HOST_REFRESH: &str = "host-refresh-token-of-the-agents-suite";
/// What the mock's refresh hands out (tests/probe/src/oauth.rs).
const REFRESHED: &str = "mock-access-refreshed";
const ROTATED: &str = "mock-refresh-rotated";

/// Writes `contents` to `$HOME/<file>` as the agent, mode 600.
async fn write_as_agent(
    sb: &sandbox_tests::sandbox::Sandbox,
    file: &str,
    contents: &str,
) -> anyhow::Result<()> {
    let write = r#"mkdir -p "$(dirname "$HOME/$F")" && umask 077 && printf %s "$C" > "$HOME/$F""#;
    let out =
        sb.as_agent(&["env", &format!("F={file}"), &format!("C={contents}"), "sh", "-c", write]).await?;
    anyhow::ensure!(out.code == 0, "writing {file}: {out:?}");
    Ok(())
}

/// The mock model API on `net` under `hosts`, which the DNS peer resolves to it.
async fn mock_api(net: &TestNet, dns: &Peer, hosts: &[&str]) -> anyhow::Result<Peer> {
    let mock = Peer::start_mock_api(net, hosts).await?;
    for host in hosts {
        dns.set_dns(host, mock.ipv4, 300).await?;
    }
    Ok(mock)
}

/// The agent's sandbox on `net`, resolving through `dns`, its policy allowing the mock's API
/// names besides its own.
fn on_the_mock(image: String, net: &TestNet, dns: &Peer) -> SandboxSpec {
    let names: String = api_hosts().iter().map(|h| format!("  - {h}\n")).collect();
    // The session idles: the turn runs the CLI itself, and a second CLI in the pane would spin
    // beside it and could answer the mock, or refresh the sign-in, in the turn's place.
    SandboxSpec::of(image)
        .idle_session()
        .net_admin()
        .on(net)
        .dns(dns)
        .drop_in("mock-api.yaml", &format!("version: 1\ndomains:\n{names}"))
}

/// The CLI starts with its own sign-in, copied from the host as `--login-from-host` does, whose
/// access token expired an hour ago, and no key: it refreshes the sign-in at its provider's
/// token endpoint (the mock, under the real host name, which the image's own policy must
/// allow), completes its turn with the new access token, and keeps the new tokens where it
/// keeps its sign-in (the state volume).
async fn refreshes_and_completes_a_turn(name: &str) -> anyhow::Result<()> {
    let turn = read_turn(name)?;
    let refresh = turn.refresh.as_ref().expect("generated for a turn.yaml with `refresh`");
    let image = sandbox_tests::images::image(name).await?;
    let net = TestNet::create(&format!("refresh-{name}")).await?;
    let dns = Peer::start_dns(&net).await?;
    let mut hosts: Vec<&str> = api_hosts();
    hosts.extend(refresh.hosts.iter().map(String::as_str));
    let mock = mock_api(&net, &dns, &hosts).await?;
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("ca.pem");
    std::fs::copy(sandbox_tests::tls::ca_file()?, &ca)?;
    std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    const CA: &str = "/etc/ssl/agent-sandbox-test-ca.pem";
    let sb = on_the_mock(image, &net, &dns).mount(&ca.display().to_string(), CA).start().await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let jwt = |exp: u64, signature: &str| {
        let mock = &mock;
        let (exp, signature) = (exp.to_string(), signature.to_string());
        async move { anyhow::Ok(mock.probe(&["openai-jwt", &exp, &signature]).await?.fields["jwt"].clone()) }
    };
    let content = refresh
        .content
        .replace("{EXPIRED_MS}", &((now - 3600) * 1000).to_string())
        .replace("{EXPIRED_S}", &(now - 3600).to_string())
        .replace("{EXPIRED_JWT}", &jwt(now - 3600, "expired-access").await?)
        .replace("{ID_JWT}", &jwt(now + 3600, "mock-id").await?)
        .replace("{REFRESH}", HOST_REFRESH);
    write_as_agent(&sb, &refresh.file, &content).await?;
    for (file, contents) in turn.files.iter().chain(&refresh.files) {
        write_as_agent(&sb, file, contents).await?;
    }
    let env: String = refresh
        .env
        .iter()
        .map(|(var, value)| format!("export {var}={}; ", shell_quote(&value.replace("{CA}", CA))))
        .collect();
    let run = refresh.run.as_deref().unwrap_or(&turn.run);
    let unattended = format!(
        "cd /workspace && {env}set -f && IFS=';' && for kv in $SANDBOX_UNATTENDED_ENV; do export \"$kv\"; done; \
         unset IFS; set +f; {run} $SANDBOX_UNATTENDED_ARGS < /dev/null"
    );
    let out =
        tokio::time::timeout(std::time::Duration::from_secs(300), sb.as_agent(&["sh", "-c", &unattended]))
            .await??;
    let log = mock.log().await?;
    let context =
        format!("exit {:?}\nstdout: {}\nstderr: {}\nmock: {log:#?}", out.code, out.stdout, out.stderr);
    // The refresh reached the provider's token endpoint with the copied refresh token.
    assert!(
        log.iter().any(|l| l.contains(" mock=refresh ") && l.contains(&format!("refresh={HOST_REFRESH}"))),
        "no refresh with the copied token\n{context}"
    );
    assert_eq!(out.code, 0, "{context}");
    let written = sb.exec(&["cat", FILE]).await?;
    assert_eq!(written.stdout, CONTENT, "the tool call's file: {written:?}\n{context}");
    // The turn went with the refreshed token, and none with the expired one.
    let turns: Vec<&String> =
        log.iter().filter(|l| l.contains(" mock=tool ") || l.contains(" mock=final ")).collect();
    assert!(!turns.is_empty() && turns.iter().all(|l| l.contains(REFRESHED)), "{context}");
    // The CLI kept the new tokens where it keeps its sign-in.
    let kept = sb.exec(&["cat", &format!("/home/agent/{}", refresh.file)]).await?.stdout;
    assert!(kept.contains(ROTATED) || kept.contains(REFRESHED), "{} after the turn: {kept}", refresh.file);
    Ok(())
}

async fn completes_a_turn(name: &str) -> anyhow::Result<()> {
    let turn = read_turn(name)?;
    let image = sandbox_tests::images::image(name).await?;
    let net = TestNet::create(&format!("agent-{name}")).await?;
    let dns = Peer::start_dns(&net).await?;
    let mock = mock_api(&net, &dns, &api_hosts()).await?;
    let key = format!("sk-REAL-{name}-key-of-the-agents-suite-5e1f");
    let dir = tempfile::tempdir()?;
    let key_file = secret_file(dir.path(), "key", &key)?;
    let ca_file = ca_secret_file(dir.path())?;
    let sb = on_the_mock(image, &net, &dns)
        .mount(&key_file, &format!("/run/secrets/{}_api_key", turn.api))
        .mount(&ca_file, "/run/secrets/sandbox_api_ca.pem")
        // The same key in the container's environment too, as `-e` passed keys before: no
        // process of the agent's may see it there either.
        .env(&format!("{}_API_KEY", turn.api.to_uppercase()), &key)
        .start()
        .await?;
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    let hunt = sb.probe(&["find-string", &hex, "/"]).await?;
    assert_eq!(hunt.fields["found"], "", "before the turn, the agent found the key: {:?}", hunt.fields);
    for (file, contents) in &turn.files {
        let write = r#"mkdir -p "$(dirname "$HOME/$F")" && printf %s "$C" > "$HOME/$F""#;
        let out =
            sb.as_agent(&["env", &format!("F={file}"), &format!("C={contents}"), "sh", "-c", write]).await?;
        anyhow::ensure!(out.code == 0, "writing {file}: {out:?}");
    }
    // As written: the CLI must not act on the tool call by itself. It refuses the tool, or waits
    // at a prompt no one answers; the half ends once it has shown which: the file written, the
    // CLI gone, or the mock's tool call served and no file for a few seconds after (a CLI that
    // acts writes it at once). A CLI that acts by default (turn.yaml says why) is waited for as
    // the unattended run is: its first start under the full suites' load has taken over a minute.
    let limit = if turn.acts_without_unattended.is_some() { 240 } else { 60 };
    let (acted, ended) = without_unattended(&sb, &mock, &turn.run, limit).await?;
    let out =
        sb.as_agent(&["sh", "-c", "cat /tmp/turn.out 2>/dev/null; cat /tmp/turn.code 2>/dev/null"]).await?;
    eprintln!("{name}: without unattended mode: {ended}, file written: {acted}");
    assert_eq!(
        acted,
        turn.acts_without_unattended.is_some(),
        "without its unattended arguments (turn.yaml: acts_without_unattended {:?}): {ended}\n{}",
        turn.acts_without_unattended,
        out.stdout,
    );
    // Whatever the first half left, the unattended turn's file is its own.
    sb.exec(&["rm", "-f", FILE]).await?;
    // What the mock logs from here on is the unattended turn's: a CLI that acts by default made a
    // whole turn already, whose requests must not stand in for this one's. Counted once the log
    // has stopped growing (a request of the first half's still in flight lands before).
    let mut earlier = mock.log().await?.len();
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = mock.log().await?.len();
        if now == earlier {
            break;
        }
        earlier = now;
    }
    // Unattended, as SANDBOX_UNATTENDED=1 starts the session's command: the image's arguments
    // appended, its variables set.
    let unattended = format!(
        "cd /workspace && set -f && IFS=';' && for kv in $SANDBOX_UNATTENDED_ENV; do export \"$kv\"; done; \
         unset IFS; set +f; {} $SANDBOX_UNATTENDED_ARGS < /dev/null",
        turn.run
    );
    let started = std::time::Instant::now();
    let out =
        tokio::time::timeout(std::time::Duration::from_secs(300), sb.as_agent(&["sh", "-c", &unattended]))
            .await??;
    let seconds = started.elapsed().as_secs_f64();
    let log: Vec<String> = mock.log().await?.into_iter().skip(earlier).collect();
    let asked: Vec<String> = dns.dns_log().await?.into_iter().map(|q| q.name).collect();
    let others: std::collections::BTreeSet<&str> =
        asked.iter().map(|n| n.trim_end_matches('.')).filter(|n| !api_hosts().contains(n)).collect();
    let denials =
        sb.exec(&["sh", "-c", "cat /run/agent-sandbox/denials.jsonl 2>/dev/null || true"]).await?.stdout;
    let refused: std::collections::BTreeSet<String> = denials
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|d| Some(d.get("name")?.as_str()?.to_string()))
        .collect();
    // For docs/agents.md's per-agent rows: what the CLI asked for beyond its API, allowed by its
    // policy (and answered by no one here) or refused by it.
    eprintln!(
        "{name}: turn in {seconds:.1} s; its policy's other names asked: {others:?}; refused: {refused:?}"
    );
    let context =
        format!("exit {:?}\nstdout: {}\nstderr: {}\nmock: {log:#?}", out.code, out.stdout, out.stderr);
    assert_eq!(out.code, 0, "{context}");
    let written = sb.exec(&["cat", FILE]).await?;
    assert_eq!(written.stdout, CONTENT, "the tool call's file: {written:?}\n{context}");
    // Every request reached the mock with the real key, in the CLI's own header, and one was
    // the turn's tool call.
    let requests: Vec<&String> = log.iter().filter(|l| l.starts_with("http 443 ")).collect();
    assert!(log.iter().any(|l| l.contains(" mock=tool ") && l.contains(&key)), "{context}");
    // The CLI told the model about the sandbox (base's instructions.md, which names refused.txt)
    // in the turn's request, by the image's own wiring of its instructions.
    assert!(
        log.iter().any(|l| l.contains(" mock=tool ") && l.contains(" told=refused.txt")),
        "{name}: the sandbox's note (/etc/agent-sandbox/instructions.md) did not reach the model\n{context}"
    );
    for request in &requests {
        assert!(request.contains(&key), "a request without the real key: {request}\n{context}");
    }
    // The key, hunted as the agent again (the CLI wrote its files): every readable file, every
    // process's environment, command line and memory file; and the session's scrollback.
    let hunt = sb.probe(&["find-string", &hex, "/"]).await?;
    assert_eq!(hunt.fields["found"], "", "the agent found the key: {:?}", hunt.fields);
    let scrollback = sb.as_agent(&["tmux", "capture-pane", "-p", "-S", "-", "-t", "agent"]).await?.stdout;
    assert!(!scrollback.contains(&key), "the key in the scrollback");
    Ok(())
}

/// The model the local turns ask for: a name as Ollama spells them.
const LOCAL_MODEL: &str = "local-coder:7b";

/// The CLI on a model server of the user's, as `agent-sandbox run AGENT --model-server URL
/// --model NAME` starts it (the launcher itself): the server an Ollama-like peer on the test
/// network (the mock, plain HTTP on 11434), no key handed over, and a resolver that knows no
/// name, so that no cloud host answers. The turn, run by `agent-sandbox exec` as a script would,
/// asks the server for the model named, on its port alone, and writes the file.
async fn completes_a_local_turn(name: &str) -> anyhow::Result<()> {
    let turn = read_turn(name)?;
    let run = turn.local.as_deref().expect("generated for a turn.yaml with `local`");
    let image = sandbox_tests::images::image(name).await?;
    let net = TestNet::create_private(&format!("local-{name}")).await?;
    let dns = Peer::start_dns(&net).await?;
    let server = Peer::start_model_server(&net).await?;
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    // The project is the agent's to write, as a user's own folder is (the CLI keeps its history
    // there).
    std::fs::set_permissions(&project.path, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let url = format!("http://{}:11434", server.ipv4);
    let (dns_ip, model) = (dns.ipv4.to_string(), LOCAL_MODEL);
    launcher
        .ok(&[
            "run",
            name,
            &project.path,
            "--detach",
            "--network",
            &net.name,
            "--dns",
            &dns_ip,
            "--image",
            &image,
            "--model-server",
            &url,
            "--model",
            model,
            // The session idles: the turn runs the CLI itself.
            "--env",
            "ASSISTANT_CMD=sleep infinity",
        ])
        .await?;
    let (id, sandbox) = project.sandbox().await?;
    let sb = Sandbox::adopt(&id).await?;
    for (file, contents) in &turn.files {
        write_as_agent(&sb, file, contents).await?;
    }
    let unattended = format!(
        "cd /workspace && set -f && IFS=';' && for kv in $SANDBOX_UNATTENDED_ENV; do export \"$kv\"; done; \
         unset IFS; set +f; {run} $SANDBOX_UNATTENDED_ARGS < /dev/null"
    );
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(300),
        launcher.run(&["exec", &sandbox, "--", "sh", "-c", &unattended]),
    )
    .await??;
    let log = server.log().await?;
    let context = format!("{out:?}\nserver: {log:#?}");
    assert_eq!(out.code, 0, "{context}");
    let written = std::fs::read_to_string(project.dir.path().join("agent-turn.txt")).unwrap_or_default();
    assert_eq!(written, CONTENT, "the tool call's file in the project\n{context}");
    // The turn's requests went to the server's port, for the model the user named.
    assert!(
        log.iter().any(|l| l.starts_with("http 11434 ")
            && l.contains(" mock=tool ")
            && l.contains(&format!(" model={model} "))),
        "no tool call for {model} on the server's port\n{context}"
    );
    let elsewhere: Vec<&String> =
        log.iter().filter(|l| l.starts_with("http ") && !l.starts_with("http 11434 ")).collect();
    assert!(elsewhere.is_empty(), "requests on the server's other ports: {elsewhere:?}");
    // What the CLI asked of the server, for the forwarder's list of a model server's endpoints.
    let asked: std::collections::BTreeSet<&str> = log
        .iter()
        .filter(|l| l.starts_with("http 11434 "))
        .filter_map(|l| l.split(' ').find(|w| w.starts_with("path=")))
        .collect();
    eprintln!("{name} asked the model server for {asked:?}");
    Ok(())
}

/// Runs the turn's command without its unattended arguments, as the agent, until it has shown
/// whether it acts on the mock's tool call: (the file was written, how the half ended). It ends
/// at the CLI's exit, [`TOOL_GRACE`] after the mock served the tool call with no file, or
/// [`FINISH_GRACE`] after the file appeared with the CLI still running; at `limit` seconds at
/// most. The CLI, if still running, is stopped.
///
/// A CLI that wrote the file is let finish its turn rather than stopped at once: stopped in the
/// middle, it can leave its state locked (Kilo's snapshot lock, which the unattended half then
/// waited out for two minutes, one run in three).
async fn without_unattended(
    sb: &Sandbox,
    mock: &Peer,
    run: &str,
    limit: u64,
) -> anyhow::Result<(bool, String)> {
    let script = format!(
        "cd /workspace; timeout {limit} sh -c {} </dev/null >/tmp/turn.out 2>&1 & echo $! > /tmp/turn.pid; \
         wait $!; echo \"exit $?\" > /tmp/turn.code",
        shell_quote(run)
    );
    sb.exec_detached(&["sandbox-exec", "--", "sh", "-c", &script], None).await?;
    let started = std::time::Instant::now();
    let mut served: Option<std::time::Instant> = None;
    // One exec watches inside the container for up to 2 s: each `docker exec` costs the engine
    // and runc tens of milliseconds of CPU, and this polled three every half second.
    // The file is looked for every 0.2 s and the sighting kept (/tmp/turn.wrote), so that a
    // CLI that writes it and takes it back while it runs on has still acted.
    let watch = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do \
           if [ -e {FILE} ]; then : > /tmp/turn.wrote; fi; \
           if [ -s /tmp/turn.code ]; then cat /tmp/turn.code; exit; fi; \
           sleep 0.2; \
         done; if [ -e /tmp/turn.wrote ]; then echo file; else echo running; fi"
    );
    let mut wrote: Option<std::time::Instant> = None;
    let ended = loop {
        let seen = sb.exec(&["sh", "-c", &watch]).await?.stdout;
        let seen = seen.trim();
        if seen.starts_with("exit") {
            break format!("it ended ({seen})");
        }
        if seen == "file" {
            let at = *wrote.get_or_insert_with(std::time::Instant::now);
            if at.elapsed() >= FINISH_GRACE {
                break format!("it wrote the file, and ran on {} s after", FINISH_GRACE.as_secs());
            }
            if started.elapsed() >= std::time::Duration::from_secs(limit) {
                break format!("it wrote the file, and ran on to {limit} s");
            }
            continue;
        }
        if served.is_none() && mock.log().await?.iter().any(|l| l.contains(" mock=tool ")) {
            served = Some(std::time::Instant::now());
        }
        if let Some(at) = served.filter(|at| at.elapsed() >= TOOL_GRACE) {
            break format!("no file {:.0} s after the mock served the tool call", at.elapsed().as_secs_f64());
        }
        if started.elapsed() >= std::time::Duration::from_secs(limit) {
            break format!("nothing within {limit} s");
        }
    };
    // Stopped as its own `timeout` would stop it, then given a moment to write what it was
    // writing: a file that lands in that moment counts.
    sb.as_agent(&["sh", "-c", "kill -TERM $(cat /tmp/turn.pid) 2>/dev/null; true"]).await?;
    for _ in 0..20 {
        if sb.as_agent(&["test", "-e", "/tmp/turn.code"]).await?.code == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // What of its process group (`timeout` leads one) outlived the TERM goes now, before the
    // unattended run opens the same state; a process that left the group is not found here.
    // (dash's `kill` takes a negative pid only after `--`; the killed stay as zombies until
    // reaped, so the group is looked for among the processes that are not.)
    let killed = sb.as_agent(&["sh", "-c", KILL_THE_FIRST_HALF]).await?;
    anyhow::ensure!(killed.code == 0, "the first half's process group outlived a KILL: {killed:?}");
    // Read once nothing of the half is left to write it.
    let acted =
        sb.exec(&["sh", "-c", &format!("test -e {FILE} || test -e /tmp/turn.wrote")]).await?.code == 0;
    Ok((acted, ended))
}

/// Kills the process group of /tmp/turn.pid and waits up to a second for none of it to be left
/// but zombies: exit 0, else 1.
const KILL_THE_FIRST_HALF: &str = r#"g=$(cat /tmp/turn.pid); kill -s KILL -- -"$g" 2>/dev/null
alive() { for s in /proc/[0-9]*/stat; do r=$(cat "$s" 2>/dev/null) || continue; r=${r##*) }; set -- $r; [ "$1" != Z ] && [ "$3" = "$g" ] && return 0; done; return 1; }
for i in 1 2 3 4 5 6 7 8 9 10; do alive || exit 0; sleep 0.1; done; exit 1"#;

/// How long after the mock served its tool call a CLI that acts on it has written the file: it
/// writes at once (the unattended runs write it within a second of the tool call).
const TOOL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a CLI that wrote the file is given to end its turn (the mock's final answer follows
/// the tool call at once) before it is stopped.
const FINISH_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// `text` as one word for sh.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}
