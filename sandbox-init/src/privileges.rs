//! The agent's identity and the privilege drop every agent process goes through: bounding,
//! ambient and inheritable capability sets cleared, no_new_privs set, then
//! setgroups/setgid/setuid to `agent` (which clears the permitted and effective sets).

use std::ffi::OsStr;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Command;

/// The unprivileged user of every image (created in images/base).
pub use crate::policy::layout::AGENT_USER;

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("cannot read /etc/passwd: {0}")]
    Passwd(#[source] std::io::Error),
    #[error("user `{0}` is not in /etc/passwd")]
    NoSuchUser(String),
    #[error("user `{0}` is root: the agent must not run as uid 0")]
    Root(String),
    #[error(
        "sandbox-exec must start as root to drop the agent's capabilities (run `docker exec` without `--user`)"
    )]
    NotRoot,
}

/// An unprivileged identity, and how a process becomes it: the agent's account, read from
/// /etc/passwd (no NSS in a static binary), or the checker's.
#[derive(Clone, Debug)]
pub struct AgentPrivileges {
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: PathBuf,
    last_cap: u32,
}

impl AgentPrivileges {
    pub fn lookup(user: &str) -> Result<AgentPrivileges, PrivilegeError> {
        let passwd = std::fs::read_to_string("/etc/passwd").map_err(PrivilegeError::Passwd)?;
        Self::from_passwd(user, &passwd)
    }

    /// An identity with no passwd entry (the checker's): its processes get the same drop.
    pub fn system(uid: u32) -> AgentPrivileges {
        AgentPrivileges {
            uid,
            gid: uid,
            home: "/".into(),
            shell: "/usr/sbin/nologin".into(),
            last_cap: last_cap(),
        }
    }

    fn from_passwd(user: &str, passwd: &str) -> Result<AgentPrivileges, PrivilegeError> {
        let fields = passwd
            .lines()
            .map(|line| line.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 7 && f[0] == user)
            .ok_or_else(|| PrivilegeError::NoSuchUser(user.into()))?;
        let (uid, gid) = match (fields[2].parse(), fields[3].parse()) {
            (Ok(uid), Ok(gid)) => (uid, gid),
            _ => return Err(PrivilegeError::NoSuchUser(user.into())),
        };
        if uid == 0 || gid == 0 {
            return Err(PrivilegeError::Root(user.into()));
        }
        Ok(AgentPrivileges {
            uid,
            gid,
            home: fields[5].into(),
            shell: fields[6].into(),
            last_cap: last_cap(),
        })
    }

    /// A command that runs as the agent, with the agent's HOME, USER and SHELL, its capability
    /// sets empty and no_new_privs set. The caller must be root (only root can drop the bounding
    /// set, and a bounding set left full would be regained by any setuid program), or the agent
    /// itself in a container without capabilities (sidecar mode).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Result<Command, PrivilegeError> {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        // Already the agent, in a container that holds no capability in any set (sidecar
        // mode's): nothing to drop, only the way to more to close. With a bounding set left to
        // drop, only root can, so the agent's own uid is refused as before.
        let already = euid == self.uid
            && euid != 0
            && Capabilities::of("self").is_ok_and(|c| {
                c.bounding == 0
                    && c.permitted == 0
                    && c.effective == 0
                    && c.inheritable == 0
                    && c.ambient == 0
            });
        if euid != 0 && !already {
            return Err(PrivilegeError::NotRoot);
        }
        let mut command = Command::new(program);
        // No key reaches any process started this way: the forwarder holds them (net/forwarder/keys.rs).
        for var in crate::apis::key_vars() {
            command.env_remove(var);
        }
        // The forwarder's address and the placeholders, where PID 1 holds keys.
        command.envs(crate::apis::read_session_env());
        // The user's model server, after the scrub: its dummy key is no key (checked at start).
        command.envs(crate::apis::model_server_env().unwrap_or_default());
        command
            .env("HOME", &self.home)
            .env("USER", AGENT_USER)
            .env("LOGNAME", AGENT_USER)
            .env("SHELL", &self.shell);
        let this = self.clone();
        // SAFETY: the closures run between fork and exec and make only raw syscalls, no
        // allocation and no locks.
        if already {
            unsafe { command.pre_exec(no_new_privileges) };
        } else {
            unsafe { command.pre_exec(move || this.drop_privileges()) };
        }
        Ok(command)
    }

    /// A service of PID 1's own (the name checker, the key forwarder) under this identity: named
    /// `name` in its environment, outside the session, never on the terminal the agent's tmux
    /// client shares.
    pub fn service(&self, program: impl AsRef<OsStr>, name: &str) -> Result<Command, PrivilegeError> {
        let mut command = self.command(program)?;
        // The model server's variables are for the agent's CLI: none reaches a process that holds
        // keys or judges connections.
        for (var, _) in crate::apis::model_server_env().unwrap_or_default() {
            command.env_remove(var);
        }
        command
            .env_remove("TMUX_SESSION")
            .env("USER", name)
            .env("LOGNAME", name)
            .stdin(std::process::Stdio::null());
        Ok(command)
    }

    /// The drop itself, in the only order that works: capabilities are needed to drop the
    /// bounding set and to change ids, so the ids change last but one.
    fn drop_privileges(&self) -> std::io::Result<()> {
        fn check(result: libc::c_int) -> std::io::Result<()> {
            if result == -1 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
        }
        drop_bounding_set(self.last_cap, 0)?;
        // SAFETY: plain syscalls on integers and a pointer to a local array.
        unsafe {
            check(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            check(libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0))?;
            let groups = [self.gid];
            check(libc::setgroups(1, groups.as_ptr()))?;
            check(libc::setresgid(self.gid, self.gid, self.gid))?;
            check(libc::setresuid(self.uid, self.uid, self.uid))?;
        }
        // setuid cleared permitted and effective; inheritable is cleared explicitly.
        set_capabilities(0)?;
        // SAFETY: plain syscalls on integers.
        unsafe {
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if libc::getuid() != self.uid || libc::geteuid() != self.uid {
                return Err(std::io::Error::from_raw_os_error(libc::EPERM));
            }
        }
        Ok(())
    }
}

/// The agent, already itself, starts nothing that could gain a capability.
fn no_new_privileges() -> std::io::Result<()> {
    // SAFETY: plain prctl with integers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What PID 1 keeps once the session runs: NET_ADMIN (set updates, reload), KILL (signals to the
/// agent's processes), and SETUID, SETGID, SETPCAP (running tmux as the agent).
pub const INIT_KEEPS: &[u32] = &[CAP_SETGID, CAP_SETUID, CAP_SETPCAP, CAP_KILL, CAP_NET_ADMIN];
/// What PID 1 needs, whatever the network, to start the agent unprivileged: CHOWN (its run and
/// state directories) and what it keeps but NET_ADMIN. All are in Docker's default set.
pub const INIT_NEEDS: &[u32] = &[CAP_CHOWN, CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_KILL];
const CAP_CHOWN: u32 = 0;
const CAP_KILL: u32 = 5;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;
const CAP_SETPCAP: u32 = 8;

/// Reduces this process's bounding, permitted and effective sets to `keep` (so the nft it runs
/// later gets no more either).
pub fn restrict_self(keep: &[u32]) -> std::io::Result<()> {
    let keep = keep.iter().fold(0u64, |m, c| m | (1 << c));
    drop_bounding_set(last_cap(), keep)?;
    // Only what is held can be kept (a container without NET_ADMIN never had it).
    set_capabilities(keep & Capabilities::of("self")?.permitted)
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Drops every capability outside the `keep` mask from the bounding set. Only syscalls: safe
/// between fork and exec.
fn drop_bounding_set(last_cap: u32, keep: u64) -> std::io::Result<()> {
    for cap in (0..=last_cap).filter(|c| keep & (1 << c) == 0) {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets the permitted and effective sets to `mask` and empties the inheritable set. Only a
/// syscall: safe between fork and exec.
fn set_capabilities(mask: u64) -> std::io::Result<()> {
    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let (low, high) = (mask as u32, (mask >> 32) as u32);
    let data = [
        CapData { effective: low, permitted: low, inheritable: 0 },
        CapData { effective: high, permitted: high, inheritable: 0 },
    ];
    // SAFETY: capset with pointers to locals of the kernel's layout.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The capability sets of a process, from /proc/PID/status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub inheritable: u64,
    pub permitted: u64,
    pub effective: u64,
    pub bounding: u64,
    pub ambient: u64,
}

pub const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_BIND_SERVICE: u32 = 10;

impl Capabilities {
    pub fn of(pid: &str) -> std::io::Result<Capabilities> {
        Ok(Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/status"))?))
    }

    pub fn parse(status: &str) -> Capabilities {
        let mut caps = Capabilities::default();
        for line in status.lines() {
            let Some((key, value)) = line.split_once(':') else { continue };
            let value = u64::from_str_radix(value.trim(), 16).unwrap_or(0);
            match key {
                "CapInh" => caps.inheritable = value,
                "CapPrm" => caps.permitted = value,
                "CapEff" => caps.effective = value,
                "CapBnd" => caps.bounding = value,
                "CapAmb" => caps.ambient = value,
                _ => {}
            }
        }
        caps
    }

    pub fn has_effective(&self, cap: u32) -> bool {
        self.effective & (1 << cap) != 0
    }

    /// The names (`CAP_…`) of the capabilities in `needed` that are not effective.
    pub fn missing(&self, needed: &[u32]) -> Vec<&'static str> {
        needed.iter().filter(|cap| !self.has_effective(**cap)).map(|cap| capability_name(*cap)).collect()
    }
}

fn capability_name(cap: u32) -> &'static str {
    match cap {
        CAP_CHOWN => "CAP_CHOWN",
        CAP_KILL => "CAP_KILL",
        CAP_SETGID => "CAP_SETGID",
        CAP_SETUID => "CAP_SETUID",
        CAP_SETPCAP => "CAP_SETPCAP",
        CAP_NET_ADMIN => "CAP_NET_ADMIN",
        CAP_NET_BIND_SERVICE => "CAP_NET_BIND_SERVICE",
        _ => "another capability",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_read_from_passwd_and_root_is_refused() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1000::/home/agent:/bin/bash\n";
        let agent = AgentPrivileges::from_passwd("agent", passwd).unwrap();
        assert_eq!((agent.uid, agent.gid, agent.home.to_str()), (1000, 1000, Some("/home/agent")));
        assert!(matches!(AgentPrivileges::from_passwd("root", passwd), Err(PrivilegeError::Root(_))));
        assert!(matches!(AgentPrivileges::from_passwd("nobody", passwd), Err(PrivilegeError::NoSuchUser(_))));
    }

    #[test]
    fn capability_sets_are_read_from_proc_status() {
        let status = "Name:\tbash\nCapInh:\t0000000000000000\nCapPrm:\t0000000000001000\nCapEff:\t0000000000001000\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n";
        let caps = Capabilities::parse(status);
        assert!(caps.has_effective(CAP_NET_ADMIN));
        assert_eq!(caps.bounding, 0x1ff_ffff_ffff);
        assert!(!Capabilities::parse("CapEff:\t0000000000000000\n").has_effective(CAP_NET_ADMIN));
        // Docker's default set, without CHOWN and KILL.
        let docker = Capabilities::parse("CapEff:\t00000000a80425fb\n");
        assert!(docker.missing(INIT_NEEDS).is_empty(), "{:?}", docker.missing(INIT_NEEDS));
        let reduced = Capabilities::parse("CapEff:\t00000000a80425da\n");
        assert_eq!(reduced.missing(INIT_NEEDS), ["CAP_CHOWN", "CAP_KILL"]);
    }

    /// The launcher and the Kubernetes pod give the gateway these capabilities and no others:
    /// NET_ADMIN, NET_BIND_SERVICE for the gate's port, and what PID 1 needs.
    #[test]
    fn the_gateways_capabilities_are_net_admin_and_what_pid_1_needs() {
        let mut needs: Vec<&str> = INIT_NEEDS
            .iter()
            .chain([&CAP_NET_ADMIN, &CAP_NET_BIND_SERVICE])
            .map(|c| capability_name(*c))
            .collect();
        let mut given: Vec<String> =
            crate::policy::layout::GATEWAY_CAPS.iter().map(|c| format!("CAP_{c}")).collect();
        needs.sort_unstable();
        given.sort_unstable();
        assert_eq!(given, needs);
    }
}
