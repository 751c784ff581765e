//! The table's shape: everything of it a change by hand would alter (its flags, each chain's
//! type, hook, priority and policy, each rule in order, each set's declaration), without the
//! handles nft numbers things with and without the sets' contents, which the DNS gate changes
//! all the time. PID 1 records it when it has read the table back after a load or a reload;
//! the health check compares the kernel's table with it, so that a rule replaced, added or
//! removed, a chain changed or the table made dormant shows.

use serde_json::{Value, json};

use super::TABLE;
use crate::policy::layout::FIREWALL_SHAPE;

/// The shape of our table in `listing` (`nft -j list table`, with or without `-t`), as one line.
pub fn of(listing: &Value) -> String {
    let ours = |item: &Value, key: &str| item[key].is_object() && item[key]["table"] == TABLE;
    let parts: Vec<Value> = listing["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| {
            if item["table"].is_object() && item["table"]["name"] == TABLE {
                Some(json!({"table": TABLE, "flags": item["table"]["flags"]}))
            } else if ours(item, "chain") {
                let c = &item["chain"];
                Some(json!({"chain": c["name"], "type": c["type"], "hook": c["hook"], "prio": c["prio"], "policy": c["policy"]}))
            } else if ours(item, "rule") {
                Some(json!({"rule": item["rule"]["chain"], "expr": item["rule"]["expr"]}))
            } else if ours(item, "set") {
                let s = &item["set"];
                Some(json!({"set": s["name"], "type": s["type"], "flags": s["flags"], "size": s["size"], "timeout": s["timeout"]}))
            } else {
                None
            }
        })
        .collect();
    Value::Array(parts).to_string()
}

/// Records the shape of `listing` for the health check: root's alone (0600), replaced whole.
pub fn record(listing: &Value) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = format!("{FIREWALL_SHAPE}.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::File::options().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(of(listing).as_bytes())?;
    std::fs::rename(&tmp, FIREWALL_SHAPE)
}

/// The shape PID 1 recorded, if it has.
pub fn recorded() -> Option<String> {
    std::fs::read_to_string(FIREWALL_SHAPE).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(policy: &str, elements: Value, handle: u32) -> Value {
        json!({"nftables": [
            {"metainfo": {"version": "1.1.3"}},
            {"table": {"family": "inet", "name": TABLE, "handle": handle}},
            {"chain": {"family": "inet", "table": TABLE, "name": "output", "handle": handle + 1, "type": "filter", "hook": "output", "prio": 0, "policy": policy}},
            {"set": {"family": "inet", "table": TABLE, "name": "checked_v4", "handle": handle + 2, "type": ["ipv4_addr", "inet_service"], "flags": ["timeout"], "elem": elements}},
            {"rule": {"family": "inet", "table": TABLE, "chain": "output", "handle": handle + 3, "expr": [{"accept": null}]}},
            {"table": {"family": "ip", "name": "docker", "handle": 9}},
        ]})
    }

    #[test]
    fn handles_and_the_sets_contents_are_not_the_shape_and_a_policy_is() {
        let loaded = of(&listing("drop", json!([]), 1));
        assert_eq!(of(&listing("drop", json!([{"elem": {"val": "203.0.113.7"}}]), 40)), loaded);
        assert_ne!(of(&listing("accept", json!([]), 1)), loaded);
        assert!(!loaded.contains("docker"), "another table is not ours: {loaded}");
    }

    #[test]
    fn a_rule_replaced_or_a_dormant_table_changes_the_shape() {
        let loaded = listing("drop", json!([]), 1);
        let mut replaced = loaded.clone();
        replaced["nftables"][4]["rule"]["expr"] = json!([{"drop": null}]);
        assert_ne!(of(&replaced), of(&loaded));
        let mut dormant = loaded.clone();
        dormant["nftables"][1]["table"]["flags"] = json!(["dormant"]);
        assert_ne!(of(&dormant), of(&loaded));
    }
}
