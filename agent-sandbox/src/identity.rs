//! Which sandbox is which: the container's and state volumes' names, derived from the agent and
//! the project's canonical path (the labels they carry are sandbox-images' `labels::LAUNCHER_*`). Pure.

use std::path::Path;

use sha2::{Digest as _, Sha256};

/// The container every sandbox of `agent` on `project` is: `agent-sandbox-<agent>-<folder>-<hash>`,
/// where the hash is of the canonical path, so that two folders of the same name differ.
pub fn container_name(agent: &str, project: &Path) -> String {
    format!("agent-sandbox-{agent}-{}-{}", slug(&folder_name(project)), path_hash(project))
}

/// The state volume of a state directory: the base name (derived like the container's, or the
/// user's `--state`) for the image's first state directory, the base and the directory's slug for
/// the others.
pub fn state_volume(base: &str, index: usize, dir: &str) -> String {
    if index == 0 { base.to_string() } else { format!("{base}-{}", slug(dir)) }
}

/// Sidecar mode: the gateway's container, beside the agent's container `name`.
pub fn gateway_name(name: &str) -> String {
    format!("{name}.gateway")
}

/// Sidecar mode: the holder, which owns the network namespace the gateway and the agent's
/// container `name` join, and runs nothing (a pod's pause container).
pub fn holder_name(name: &str) -> String {
    format!("{name}.net")
}

/// Sidecar mode: the volume of the folder the gateway shares with the agent's container `name`
/// (read-only there). A dot keeps it apart from every state volume's name.
pub fn shared_volume(name: &str) -> String {
    format!("{name}.shared")
}

/// The project's folder name, as `ls` shows it and as a sandbox can be named by.
pub fn folder_name(project: &Path) -> String {
    project.file_name().map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned())
}

fn path_hash(project: &Path) -> String {
    let digest = Sha256::digest(project.as_os_str().as_encoded_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case letters, digits and single dashes: what names of containers and volumes take.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-');
    let out: String = out.chars().take(40).collect();
    if out.is_empty() { "project".to_string() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_agent_and_the_canonical_path() {
        let a = container_name("claude", Path::new("/home/ana/src/My App"));
        assert!(a.starts_with("agent-sandbox-claude-my-app-"), "{a}");
        assert_eq!(a.len(), "agent-sandbox-claude-my-app-".len() + 8);
        // Same folder name elsewhere: another sandbox.
        assert_ne!(a, container_name("claude", Path::new("/home/ana/code/My App")));
        assert_ne!(a, container_name("codex", Path::new("/home/ana/src/My App")));
        assert_eq!(a, container_name("claude", Path::new("/home/ana/src/My App")));
        assert!(container_name("shell", Path::new("/")).starts_with("agent-sandbox-shell-root-"));
        assert!(container_name("shell", Path::new("/tmp/...")).starts_with("agent-sandbox-shell-project-"));
    }

    #[test]
    fn further_state_directories_get_their_own_volume() {
        assert_eq!(state_volume("v", 0, "/home/agent/.config/opencode"), "v");
        assert_eq!(
            state_volume("v", 1, "/home/agent/.local/share/opencode"),
            "v-home-agent-local-share-opencode"
        );
    }
}
