//! `sandbox-status --health`: every image's HEALTHCHECK, so that `docker ps` shows `healthy`
//! only while the sandbox's policy holds. The engine runs it as the container's user, every
//! 30 seconds, and reads its exit status (0 healthy, 1 unhealthy) and its one line.
//!
//! Where the firewall is this container's (one container, or sidecar mode's gateway), it asks the
//! kernel: the table's output and input chains must be hooked with policy drop. The gateway
//! also writes its answer into the shared folder, and sidecar mode's agent container, which
//! holds no capability to read the table, says what its gateway last said. What it reads is
//! root's (the status file, the table, the shared folder read-only on the agent's side): the
//! agent can make it neither healthy nor unhealthy but by what it cannot do, changing the table.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;

use crate::init::Role;
use crate::net::firewall::{Nft, TABLE};
use crate::net::interfaces::Network;
use crate::policy::layout::{GATEWAY_HEALTH, GATEWAY_READY, STATUS_FILE};
use crate::status::Status;

/// The chains whose default verdict is the policy: nothing leaves or enters but what a rule allows.
const DEFAULT_DENY: [(&str, &str); 2] = [("output", "output"), ("input", "input")];

/// Prints the verdict in one line; 0 healthy, 1 not (yet), as HEALTHCHECK reads it.
pub fn run(role: Role) -> u8 {
    let verdict = match role {
        Role::Agent => mirrored(),
        Role::Whole | Role::Gateway => own(),
    };
    if role == Role::Gateway {
        // Best effort: the agent's container then mirrors a stale verdict, which says so.
        let _ = publish(&verdict);
    }
    match verdict {
        Ok(line) => {
            println!("healthy: {line}");
            0
        }
        Err(line) => {
            println!("unhealthy: {line}");
            1
        }
    }
}

/// This container's firewall, as the kernel holds it.
fn own() -> Result<String, String> {
    let status: Status = match std::fs::read_to_string(STATUS_FILE) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{STATUS_FILE} is unreadable: {e}"))?,
        Err(_) => return Err("sandbox-init has not put a policy in force yet".into()),
    };
    if status.firewall != "on" {
        return Err(format!("no egress firewall: SANDBOX_FIREWALL={}", status.firewall));
    }
    if Network::detect().loopback_only() {
        return Ok("no network but loopback, nothing to filter".into());
    }
    let chains = Nft::find()
        .and_then(|nft| nft.list_chains())
        .map_err(|e| format!("cannot read the firewall: {e}"))?;
    default_deny(&chains)?;
    Ok(format!(
        "the firewall holds: {TABLE}'s output and input chains drop what no rule allows; {} names allowed",
        status.domains.len()
    ))
}

/// Whether `chains` (`nft -j list chains inet`) hold the table's output and input chains, each
/// hooked where it belongs with policy drop.
pub fn default_deny(chains: &serde_json::Value) -> Result<(), String> {
    let items = chains["nftables"].as_array().ok_or("nft listed no chains")?;
    for (name, hook) in DEFAULT_DENY {
        let chain = items
            .iter()
            .map(|item| &item["chain"])
            .find(|chain| chain["table"] == TABLE && chain["name"] == name)
            .ok_or_else(|| format!("{TABLE} has no {name} chain: the firewall is gone"))?;
        if chain["hook"] != hook || chain["policy"] != "drop" {
            return Err(format!(
                "{TABLE}'s {name} chain is not hooked to {hook} with policy drop (hook {}, policy {})",
                chain["hook"], chain["policy"]
            ));
        }
    }
    Ok(())
}

/// Sidecar mode's agent container: its gateway's last verdict; before the gateway's first
/// health check, its ready line.
fn mirrored() -> Result<String, String> {
    if std::fs::metadata(GATEWAY_READY).is_err() {
        return Err("the gateway has not said that its firewall holds".into());
    }
    match std::fs::read_to_string(GATEWAY_HEALTH) {
        Ok(text) => match text.trim_end().split_once(": ") {
            Some(("healthy", line)) => Ok(format!("the gateway says: {line}")),
            Some((_, line)) => Err(format!("the gateway says: {line}")),
            None => Err(format!("{GATEWAY_HEALTH} is unreadable")),
        },
        Err(_) => Ok("the gateway said its firewall holds, and has run no health check yet".into()),
    }
}

/// The gateway's verdict, for its agent's container (the shared folder is read-only there).
fn publish(verdict: &Result<String, String>) -> std::io::Result<()> {
    let line = match verdict {
        Ok(line) => format!("healthy: {line}"),
        Err(line) => format!("unhealthy: {line}"),
    };
    let tmp = format!("{GATEWAY_HEALTH}.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{line}")?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, GATEWAY_HEALTH)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chains(output_policy: &str) -> serde_json::Value {
        json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "inet", "table": TABLE, "name": "output", "type": "filter", "hook": "output", "prio": 0, "policy": output_policy}},
            {"chain": {"family": "inet", "table": TABLE, "name": "input", "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
            {"chain": {"family": "inet", "table": TABLE, "name": "to_checker", "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}},
        ]})
    }

    #[test]
    fn the_table_holds_when_both_chains_drop_by_default() {
        assert_eq!(default_deny(&chains("drop")), Ok(()));
    }

    #[test]
    fn an_output_chain_that_accepts_by_default_is_unhealthy() {
        let e = default_deny(&chains("accept")).unwrap_err();
        assert!(e.contains("output chain is not hooked to output with policy drop"), "{e}");
    }

    #[test]
    fn a_missing_table_or_a_chain_of_another_table_is_unhealthy() {
        let e = default_deny(&json!({"nftables": [{"metainfo": {}}]})).unwrap_err();
        assert!(e.contains("no output chain"), "{e}");
        let mut other = chains("drop");
        for item in other["nftables"].as_array_mut().unwrap() {
            if item["chain"].is_object() {
                item["chain"]["table"] = json!("someone_else");
            }
        }
        assert!(default_deny(&other).unwrap_err().contains("the firewall is gone"));
    }
}
