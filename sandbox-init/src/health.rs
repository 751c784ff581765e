//! `sandbox-status --health`: every image's HEALTHCHECK, so that `docker ps` shows `healthy`
//! only while the sandbox's policy holds. The engine runs it as the container's user, every
//! 30 seconds, and reads its exit status (0 healthy, 1 unhealthy) and its one line.
//!
//! Where the firewall is this container's (one container, or sidecar mode's gateway: both run
//! it as root), it asks the kernel for the table, without its sets' contents: the table must be
//! active (not dormant), its output and input chains hooked with policy drop, and its shape
//! (every chain, rule and set declaration: net/firewall/shape.rs) the one PID 1 recorded when
//! it read the table back after its last load or reload, so that a rule added, replaced or
//! removed shows. The sets' contents are not compared: the DNS gate changes them all the time,
//! and an element root added by hand looks like one the gate added. What it reads is root's;
//! the agent (uid 1000, no capability) can change none of it. Sidecar mode's agent container runs
//! the check as the agent's own uid, which could answer for it: it says so and is unhealthy, and
//! the launcher turns the check off there; the gateway's column is the sandbox's.

use crate::init::Role;
use crate::net::firewall::{Nft, TABLE, shape};
use crate::net::interfaces::Network;
use crate::policy::layout::STATUS_FILE;
use crate::status::Status;

/// The chains whose default verdict is the policy: nothing leaves or enters but what a rule allows.
const DEFAULT_DENY: [&str; 2] = ["output", "input"];

/// Prints the verdict in one line; 0 healthy, 1 not (yet), as HEALTHCHECK reads it.
pub fn run(role: Role) -> u8 {
    let verdict = match role {
        Role::Agent => Err("this is sidecar mode's agent container, whose check would run as the agent's \
                            own uid: the gateway's health check is the sandbox's"
            .to_string()),
        Role::Whole | Role::Gateway => own(),
    };
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
    let table = Nft::find()
        .and_then(|nft| nft.read_table_terse())
        .map_err(|e| format!("cannot read the firewall: {e}"))?;
    holds(&table, shape::recorded().as_deref())?;
    Ok(format!(
        "the firewall holds: {TABLE} is active and its output and input chains drop what no rule allows; {} names allowed",
        status.domains.len()
    ))
}

/// Whether `table` (`nft -j -t list table inet agent_sandbox`: no set contents) is active, with
/// its output and input chains hooked where they belong with policy drop, and of the shape PID 1
/// `recorded`.
pub fn holds(table: &serde_json::Value, recorded: Option<&str>) -> Result<(), String> {
    let items = table["nftables"].as_array().ok_or("nft listed nothing")?;
    let own = items.iter().map(|item| &item["table"]).find(|t| t["name"] == TABLE);
    let own = own.ok_or_else(|| format!("there is no table {TABLE}: the firewall is gone"))?;
    if own["flags"].to_string().contains("dormant") {
        return Err(format!("{TABLE} is dormant: its chains filter nothing"));
    }
    for name in DEFAULT_DENY {
        let chain = items
            .iter()
            .map(|item| &item["chain"])
            .find(|chain| chain["table"] == TABLE && chain["name"] == name)
            .ok_or_else(|| format!("{TABLE} has no {name} chain: the firewall is gone"))?;
        if chain["hook"] != name || chain["policy"] != "drop" {
            return Err(format!(
                "{TABLE}'s {name} chain is not hooked to {name} with policy drop (hook {}, policy {})",
                chain["hook"], chain["policy"]
            ));
        }
    }
    match recorded {
        Some(recorded) if shape::of(table) == recorded => Ok(()),
        Some(_) => Err(format!(
            "{TABLE} is not the table sandbox-init loaded: a rule, a chain or a set was changed since"
        )),
        None => Err("sandbox-init recorded no shape of its table to compare with".into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A table as `nft -j -t` lists it: two output rules, one input rule.
    fn table(output_policy: &str) -> serde_json::Value {
        json!({"nftables": [
            {"metainfo": {"version": "1.1.3"}},
            {"table": {"family": "inet", "name": TABLE, "handle": 1}},
            {"chain": {"family": "inet", "table": TABLE, "name": "output", "type": "filter", "hook": "output", "prio": 0, "policy": output_policy}},
            {"chain": {"family": "inet", "table": TABLE, "name": "input", "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
            {"chain": {"family": "inet", "table": TABLE, "name": "to_checker", "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}},
            {"rule": {"family": "inet", "table": TABLE, "chain": "output", "handle": 4, "expr": []}},
            {"rule": {"family": "inet", "table": TABLE, "chain": "output", "handle": 5, "expr": []}},
            {"rule": {"family": "inet", "table": TABLE, "chain": "input", "handle": 6, "expr": []}},
            {"rule": {"family": "inet", "table": TABLE, "chain": "to_checker", "handle": 7, "expr": []}},
        ]})
    }

    #[test]
    fn the_table_holds_when_both_chains_drop_by_default_in_the_shape_loaded() {
        let loaded = shape::of(&table("drop"));
        assert_eq!(holds(&table("drop"), Some(&loaded)), Ok(()));
        let e = holds(&table("drop"), None).unwrap_err();
        assert!(e.contains("recorded no shape"), "{e}");
    }

    #[test]
    fn an_output_chain_that_accepts_by_default_is_unhealthy() {
        let loaded = shape::of(&table("drop"));
        let e = holds(&table("accept"), Some(&loaded)).unwrap_err();
        assert!(e.contains("output chain is not hooked to output with policy drop"), "{e}");
    }

    #[test]
    fn a_rule_added_or_replaced_is_unhealthy() {
        let loaded = shape::of(&table("drop"));
        let mut replaced = table("drop");
        replaced["nftables"][5]["rule"]["expr"] = json!([{"accept": null}]);
        assert!(holds(&replaced, Some(&loaded)).unwrap_err().contains("not the table sandbox-init loaded"));
        let mut added = table("drop");
        added["nftables"].as_array_mut().unwrap().push(json!({"rule": {"family": "inet", "table": TABLE, "chain": "output", "handle": 9, "expr": [{"accept": null}]}}));
        assert!(holds(&added, Some(&loaded)).is_err());
    }

    #[test]
    fn a_dormant_table_is_unhealthy() {
        let loaded = shape::of(&table("drop"));
        let mut dormant = table("drop");
        dormant["nftables"][1]["table"]["flags"] = json!(["dormant"]);
        assert!(holds(&dormant, Some(&loaded)).unwrap_err().contains("dormant"));
    }

    #[test]
    fn a_missing_table_or_a_chain_of_another_table_is_unhealthy() {
        let e = holds(&json!({"nftables": [{"metainfo": {}}]}), None).unwrap_err();
        assert!(e.contains("there is no table"), "{e}");
        let mut other = table("drop");
        for item in other["nftables"].as_array_mut().unwrap() {
            if item["chain"].is_object() {
                item["chain"]["table"] = json!("someone_else");
            }
        }
        assert!(holds(&other, None).unwrap_err().contains("the firewall is gone"));
    }
}
