//! What sandbox-init, the launcher, the build and the suites agree on about a sandbox from the
//! outside: where its files are, who its agent is, the variables it reads, and the lines it
//! says. Data only. A suite keeps a literal where the literal is what it tests.

/// The policy baked into every image.
pub const BAKED_POLICY: &str = "/etc/agent-sandbox/policy.yaml";
/// Where users mount extra policies (`*.yaml`, `*.yml`) and plain domain lists (`*.txt`).
pub const DROP_IN_DIR: &str = "/etc/agent-sandbox/policy.d";
/// The drop-in `agent-sandbox allow` and `deny` write (root's, in a folder only root may write).
pub const RUNTIME_DROP_IN: &str = "/etc/agent-sandbox/policy.d/launcher.txt";
/// The project, in every sandbox.
pub const WORKSPACE: &str = "/workspace";

/// PID 1's folder of what it writes while it runs: root's, readable by all.
pub const RUN_DIR: &str = "/run/agent-sandbox";
/// The policy in force, as PID 1 last (re)loaded it (`sandbox-status` reads it).
pub const STATUS_FILE: &str = "/run/agent-sandbox/status.json";
/// Refused names and connections, as JSON lines (rotated to `<file>.1`).
pub const DENIAL_LOG: &str = "/run/agent-sandbox/denials.jsonl";
/// Every connection the agent attempts, as JSON lines (rotated to `<file>.1`).
pub const CONNECTION_LOG: &str = "/run/agent-sandbox/connections.jsonl";
/// The connections and bytes per name, as PID 1 counts them.
pub const CONNECTION_TOTALS: &str = "/run/agent-sandbox/connection-totals.json";
/// What PID 1 (or, in sidecar mode, the gateway) gives the agent's session: root's, readable by
/// all. In sidecar mode a volume, the gateway's to write and read-only in the agent's container.
pub const SHARED_DIR: &str = "/run/agent-sandbox/shared";
/// The variables every agent process gets for the held keys (base URLs, placeholders).
pub const SESSION_ENV_FILE: &str = "/run/agent-sandbox/shared/session-env.json";
/// The agent's last refusals in plain words, one line each, newest last: what it was refused,
/// why, and what only the user can do about it. Root's (in sidecar mode the gateway's),
/// readable by the agent, in the shared folder so that both shapes' agents read it here.
pub const REFUSED_FILE: &str = "/run/agent-sandbox/shared/refused.txt";
/// git's `insteadOf` for the forwarded hosts, which the base image's system configuration includes.
pub const GITCONFIG: &str = "/run/agent-sandbox/shared/gitconfig";
/// Written by the gateway once its firewall holds (sidecar mode): the agent's container starts
/// the session only then. Holds the gateway's ready line.
pub const GATEWAY_READY: &str = "/run/agent-sandbox/shared/gateway-ready";
/// This start of the container (the kernel's boot id and /proc/1/stat's 22nd field, PID 1's
/// start time), written once the sandbox is ready (the firewall holds, the session runs):
/// sandbox-exec runs a command only while it names the start that runs now. A restart gives the container a new network namespace, without a firewall
/// until PID 1 loads it, and leaves the last run's mark in the writable layer.
pub const READY_MARK: &str = "/run/agent-sandbox/ready";
/// The shape of the firewall's table as PID 1 last loaded and read it back, root's alone: the
/// health check compares the kernel's table with it.
pub const FIREWALL_SHAPE: &str = "/run/agent-sandbox/firewall-shape.json";
/// tmux's socket folder: the agent's alone.
pub const TMUX_TMPDIR: &str = "/run/agent-sandbox/tmux";
/// The session's status folder: root's, the pane's status file in it the agent's to write.
pub const SESSION_DIR: &str = "/run/agent-sandbox/session";
/// Left by PID 1 while it stops the session.
pub const STOPPING: &str = "/run/agent-sandbox/stopping";
/// The time of the last denial `agent-sandbox allow --pending` or `--dismiss` took.
pub const PENDING_MARK: &str = "/run/agent-sandbox/launcher-pending.mark";
/// What the last `agent-sandbox pending` showed.
pub const REVIEWED_MARK: &str = "/run/agent-sandbox/launcher-pending.reviewed";
/// Root-only secret files: API keys (`<variable in lower case>`) and the extra CA.
pub const SECRETS_DIR: &str = "/run/secrets";

/// The agent: its user, uid and home in every image.
pub const AGENT_USER: &str = "agent";
pub const AGENT_UID: u32 = 1000;
pub const AGENT_HOME: &str = "/home/agent";

/// The command the session runs (set per image).
pub const ASSISTANT_CMD_ENV: &str = "ASSISTANT_CMD";
/// The tmux session's name (default `agent`).
pub const TMUX_SESSION_ENV: &str = "TMUX_SESSION";
/// `on` (the default), `off` or `open`.
pub const FIREWALL_ENV: &str = "SANDBOX_FIREWALL";
/// `on` (the default) or `off`.
pub const NAME_CHECK_ENV: &str = "SANDBOX_NAME_CHECK";
/// `gateway` or `agent` in sidecar mode (two containers, one network namespace); unset, the one
/// container is both.
pub const ROLE_ENV: &str = "SANDBOX_ROLE";
/// The capabilities sidecar mode's gateway is given, and no other: NET_ADMIN for its table,
/// NET_BIND_SERVICE for the gate's port 53 where the engine leaves unprivileged ports at 1024
/// (podman, containerd's default before 2.0; Docker opens them all), and what PID 1 needs to start
/// its processes under their own uids (sandbox-init's `INIT_NEEDS`). PID 1 keeps only what it
/// still uses once the gate listens.
pub const GATEWAY_CAPS: &[&str] =
    &["NET_ADMIN", "NET_BIND_SERVICE", "CHOWN", "SETUID", "SETGID", "SETPCAP", "KILL"];
/// The upstream resolvers, comma-separated (`run --dns`): instead of /etc/resolv.conf's. Required
/// by the gateway, which must not trust a file the agent's container shares.
pub const DNS_ENV: &str = "SANDBOX_DNS";
/// How many elements the address sets may hold.
pub const MAX_ADDRESSES_ENV: &str = "SANDBOX_MAX_ADDRESSES";
/// The agent's state directories, `:`-separated, inside its home.
pub const STATE_DIRS_ENV: &str = "SANDBOX_STATE_DIRS";
/// `1` starts the agent's command unattended, with the image's arguments and variables.
pub const UNATTENDED_ENV: &str = "SANDBOX_UNATTENDED";
pub const UNATTENDED_ARGS_ENV: &str = "SANDBOX_UNATTENDED_ARGS";
pub const UNATTENDED_VARS_ENV: &str = "SANDBOX_UNATTENDED_ENV";

/// The line PID 1 prints once the firewall holds and the session runs, then counts and time.
pub const READY: &str = "sandbox ready";
/// The line PID 1 prints after a reload that applied.
pub const RELOADED: &str = "sandbox reloaded";
