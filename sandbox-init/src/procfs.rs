//! What /proc says about the container's processes: parent, process group, session, the
//! terminal's foreground group, and owner. PID 1 decides whom to signal from this, never from
//! what a process of the agent (its tmux server among them) reports.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// One process, as /proc/PID/stat and the owner of /proc/PID give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// The foreground process group of its controlling terminal (-1 without one).
    pub tpgid: i32,
    pub uid: u32,
}

impl ProcessInfo {
    /// Parses /proc/PID/stat: the fields after the command name, which may itself contain
    /// spaces and parentheses (the last `)` ends it).
    pub fn parse(pid: i32, stat: &str, uid: u32) -> Option<ProcessInfo> {
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i)?.parse::<i32>().ok();
        Some(ProcessInfo { pid, ppid: field(1)?, pgrp: field(2)?, session: field(3)?, tpgid: field(5)?, uid })
    }

    pub fn read(pid: i32) -> Option<ProcessInfo> {
        let dir = Path::new("/proc").join(pid.to_string());
        let uid = std::fs::metadata(&dir).ok()?.uid();
        ProcessInfo::parse(pid, &std::fs::read_to_string(dir.join("stat")).ok()?, uid)
    }

    /// Every process of the container's pid namespace.
    pub fn all() -> Vec<ProcessInfo> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(ProcessInfo::read)
            .collect()
    }
}

/// Whom PID 1 signals to stop the agent's session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Process(i32),
    Group(i32),
}

/// The targets of a stop signal: the process group of each pane of the tmux server `server` (a
/// child of it, owned by the agent, leading its own session and group; the agent command runs
/// in that group) and the foreground process group of the pane's terminal when that group lives
/// in the pane's session. A group never reaches beyond its session. Never pid 1 or below, never
/// a process of another user.
pub fn stop_targets(processes: &[ProcessInfo], server: i32, agent_uid: u32) -> Vec<Target> {
    let mut targets = Vec::new();
    let panes = processes
        .iter()
        .filter(|p| p.ppid == server && p.uid == agent_uid && p.session == p.pid && p.pid > 1);
    for pane in panes {
        targets.push(if pane.pgrp == pane.pid { Target::Group(pane.pid) } else { Target::Process(pane.pid) });
        let group_in_session =
            processes.iter().any(|p| p.pgrp == pane.tpgid && p.session == pane.pid && p.uid == agent_uid);
        if pane.tpgid > 1 && pane.tpgid != pane.pid && group_in_session {
            targets.push(Target::Group(pane.tpgid));
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgrp: i32, session: i32, tpgid: i32, uid: u32) -> ProcessInfo {
        ProcessInfo { pid, ppid, pgrp, session, tpgid, uid }
    }

    #[test]
    fn stat_lines_are_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "42 (tmux: server (x)) S 1 42 42 0 -1 4194560 0 0";
        assert_eq!(ProcessInfo::parse(42, stat, 1000), Some(p(42, 1, 42, 42, -1, 1000)));
        assert_eq!(ProcessInfo::parse(42, "42 (broken", 0), None);
    }

    #[test]
    fn only_the_panes_of_the_server_and_their_foreground_groups_are_targets() {
        let processes = [
            p(1, 0, 1, 1, -1, 0),        // PID 1
            p(20, 1, 20, 20, -1, 1000),  // the tmux server
            p(21, 20, 21, 21, 30, 1000), // a pane, whose terminal's foreground is group 30
            p(30, 21, 30, 21, 30, 1000), // the agent's command in that group
            p(22, 20, 22, 22, 1, 1000),  // a pane claiming group 1 in the foreground
            p(23, 20, 23, 23, 50, 1000), // a pane naming a group of another session
            p(26, 20, 27, 26, -1, 1000), // a pane that left its own group
            p(50, 1, 50, 50, -1, 0),     // root's `docker exec` shell
            p(24, 20, 24, 24, -1, 0),    // a child of the server that is not the agent's
            p(25, 99, 25, 25, -1, 1000), // the agent's, but not a pane of this server
        ];
        assert_eq!(
            stop_targets(&processes, 20, 1000),
            vec![
                Target::Group(21),
                Target::Group(30),
                Target::Group(22),
                Target::Group(23),
                Target::Process(26)
            ]
        );
        assert!(
            stop_targets(&processes, 1, 1000)
                .iter()
                .all(|t| !matches!(t, Target::Process(1) | Target::Group(1)))
        );
    }
}
