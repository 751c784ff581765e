//! The enforcement PID 1 keeps: the table loaded (with the fallbacks a kernel may force), the
//! DNS gate, the sink, the name check, and the reload that replaces all of them in one step.
//! The one place a `Ruleset` is made from the policy. What loads the table is an [`NftApply`],
//! so that the fallback ladder and the reload's choice of connections to cut are unit-tested
//! with a recording one, without root (youki's seam under its init).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::connections::ConnectionLog;
use crate::console;
use crate::denials::DenialLog;
use crate::exit::{Fatal, Refusal};
use crate::net::dns::sink::NftSink;
use crate::net::dns::{DnsGate, GATE_ADDR, gate_resolv_conf, names_only_the_gate, resolv_conf_upstreams};
use crate::net::firewall::conntrack;
use crate::net::firewall::{
    DOCKER_DNS, EGRESS_MARK, Element, FirewallError, INBOUND_MARK, NameCheck, Nft, NftApply, Ruleset, Shape,
    TABLE, verify_table,
};
use crate::net::interfaces::impersonable_resolver;
use crate::net::namecheck::protocol::{CHECK_PORT, FORWARDER_PORT, PASS_PORT};
use crate::net::namecheck::verdicts::{CheckerProcess, Verdicts};
use crate::net::uids::{CHECKER_UID, GATE_UID};
use crate::policy::layout::DNS_ENV;
use crate::policy::{Allowlist, Policy, Protocol};
use crate::privileges::AgentPrivileges;
use crate::timeline;
use crate::verify;

const RESOLV_CONF: &str = "/etc/resolv.conf";

/// How PID 1 was asked to enforce (its settings, read once at start).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// The container has IPv6 (the checker listens on ::1 too).
    pub ipv6: bool,
    /// The most elements each address set holds.
    pub set_size: usize,
    /// The name check is on (`SANDBOX_NAME_CHECK` is not `off`).
    pub name_check: bool,
    /// One container, or the gateway of sidecar mode (whom the rules trust with DNS).
    pub shape: Shape,
    /// The user's model server, which the forwarder alone reaches (apis.rs).
    pub model_server: Option<SocketAddr>,
}

/// The logs the enforcement writes to.
#[derive(Clone)]
pub struct Logs {
    pub denials: Arc<DenialLog>,
    pub connections: Arc<ConnectionLog>,
}

/// How the table came to be loaded: with the denial log's rule, or without it on a kernel that
/// has no nflog backend (the rule would make the whole table fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub log: bool,
}

/// Loads `ruleset`, falling back as a kernel forces: without the log rule where nflog is
/// missing (said on the console); refused (69) where nat redirect is missing and the name check
/// is on, after removing what got loaded, since the agent never runs without the check.
pub fn load_table(nft: &impl NftApply, mut ruleset: Ruleset) -> Result<Loaded, Fatal> {
    // A new network namespace (every start but a restarted gateway's or pod's) has no table to
    // replace, and creating it spares the delete's wait. Where the creation fails (a table is
    // there, or the kernel refuses a rule), nothing of it was loaded, and the table is replaced.
    if nft.apply(&ruleset.render_created()).is_ok() {
        return Ok(Loaded { log: ruleset.log });
    }
    let Err(first) = nft.apply(&ruleset.render()) else { return Ok(Loaded { log: ruleset.log }) };
    ruleset.log = false;
    if let Err(second) = nft.apply(&ruleset.render()) {
        // Without the name check's nat chain the table loads: this kernel cannot redirect.
        let plain = Ruleset { name_check: None, ..ruleset };
        if ruleset.name_check.is_some() && nft.apply(&plain.render()).is_ok() {
            let _ = nft.apply(&format!("delete table inet {TABLE}\n"));
            return Err(Fatal::new(
                Refusal::NftMissing,
                format!(
                    "the kernel cannot redirect connections to the name check (nft nat redirect): {second}"
                ),
            ));
        }
        return Err(Fatal::new(Refusal::SetupFailed, format!("cannot load the firewall: {first}")));
    }
    console::err(format!(
        "sandbox-init: nflog is unavailable, rejected connections will not be logged: {first}"
    ));
    Ok(Loaded { log: false })
}

/// What a tracked connection is, for a reload's choice of what to cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub mark: u32,
    pub protocol: u8,
    pub destination: IpAddr,
    pub port: u16,
}

impl From<&conntrack::Flow> for Tracked {
    fn from(flow: &conntrack::Flow) -> Tracked {
        Tracked { mark: flow.mark, protocol: flow.protocol, destination: flow.destination, port: flow.port }
    }
}

/// Whether a reload to `policy`, which keeps the elements `open`, cuts `flow`: one the policy
/// let out that nothing opens now, or one `inbound` let in through a port it closed. Nobody
/// else's connections (no mark of ours) are touched.
pub fn revokes(policy: &Policy, open: &HashSet<(IpAddr, Protocol, u16)>, flow: Tracked) -> bool {
    match flow.mark {
        EGRESS_MARK => {
            let protocol = match flow.protocol {
                6 => Protocol::Tcp,
                17 => Protocol::Udp,
                _ => return true,
            };
            !(open.contains(&(flow.destination, protocol, flow.port))
                || policy.cidr_allows(flow.destination, flow.port))
        }
        INBOUND_MARK => flow.protocol != 6 || !policy.inbound.contains(&flow.port),
        _ => false,
    }
}

/// The enforcing state PID 1 keeps for reloads.
pub struct Enforcement {
    pub nft: Nft,
    pub sink: Arc<NftSink>,
    pub upstreams: Vec<IpAddr>,
    pub loaded: Loaded,
    pub settings: Settings,
    /// The checker and PID 1's verdicts, with the name check on.
    pub checker: Option<Arc<CheckerProcess>>,
    pub verdicts: Option<Arc<Verdicts>>,
}

/// What a reload did, for its line.
pub struct Reloaded {
    pub kept: usize,
    pub cut: usize,
}

impl Enforcement {
    /// The ruleset of `policy` as this enforcement loads it, carrying `elements`.
    fn ruleset<'a>(&'a self, policy: &'a Policy, elements: &'a [Element]) -> Ruleset<'a> {
        ruleset(policy, &self.upstreams, elements, self.loaded.log, self.settings)
    }

    /// Loads the table for `policy`, starts the DNS gate and points resolv.conf at it. The name
    /// check's process starts in [`Enforcement::start_name_check`], once the firewall is
    /// verified.
    pub async fn start(policy: &Policy, settings: Settings, logs: &Logs) -> Result<Enforcement, Fatal> {
        let setup =
            |what: &str, e: &dyn std::fmt::Display| Fatal::new(Refusal::SetupFailed, format!("{what}: {e}"));
        let nft = Nft::find().map_err(|e| Fatal::new(Refusal::NftMissing, e))?;
        let original =
            std::fs::read_to_string(RESOLV_CONF).map_err(|e| setup("cannot read /etc/resolv.conf", &e))?;
        let setting = std::env::var(DNS_ENV).ok();
        let upstreams = choose_upstreams(setting.as_deref(), &original, settings.shape)?;
        if upstreams.is_empty() {
            console::err("sandbox-init: /etc/resolv.conf names no resolver: allowed names will not resolve");
        }
        timeline::mark("nft found, resolvers");
        let first = ruleset(policy, &upstreams, &[], true, settings);
        let loaded = load_table(&nft, first)?;
        timeline::mark("nft table loaded");
        let table = nft.read_table().map_err(|e| Fatal::new(Refusal::VerificationFailed, e))?;
        verify_table(&table, &ruleset(policy, &upstreams, &[], loaded.log, settings))
            .map_err(|e| Fatal::new(Refusal::VerificationFailed, e))?;
        record_shape(&table);
        timeline::mark("nft table read back");
        if settings.shape == Shape::Sidecar {
            // The namespace outlives the gateway: what its last run let out (a UDP flow kept
            // busy, say) is not this run's to keep. Nothing is open yet.
            match conntrack::revoke(|flow| revokes(policy, &HashSet::new(), Tracked::from(flow))) {
                Ok(0) => {}
                Ok(cut) => console::err(format!(
                    "sandbox-init: cut {cut} connections the gateway's last run let out"
                )),
                Err(e) => console::err(format!(
                    "sandbox-init: WARNING: cannot cut the connections the gateway's last run let out: {e}"
                )),
            }
        }
        let sink = Arc::new(NftSink::new(nft.clone(), Allowlist::new(policy), settings.set_size));
        // The gate's new elements go over netlink (net/firewall/setelems.rs), without a process each;
        // where the socket cannot be had, nft writes them.
        match crate::net::firewall::setelems::SetWriter::open() {
            Ok(writer) => sink.write_over_netlink(writer),
            Err(e) => console::err(format!(
                "sandbox-init: no netlink socket for set elements ({e}); nft writes them"
            )),
        }
        let upstream_addrs = upstreams.iter().map(|a| SocketAddr::new(*a, 53)).collect();
        let owner = (settings.shape == Shape::Sidecar).then_some(GATE_UID);
        let gate = DnsGate::owned_by(upstream_addrs, sink.clone(), logs.denials.clone(), owner);
        timeline::mark("netlink socket");
        gate.serve(GATE_ADDR).await.map_err(|e| setup("cannot start the DNS gate on 127.0.0.1:53", &e))?;
        // Written in place: Docker bind-mounts the file, so it cannot be replaced by a rename. A
        // file that names the gate alone (a Kubernetes pod's dnsConfig) is left as it is: it may
        // be read-only, and it already says what this would write.
        if !names_only_the_gate(&original) {
            std::fs::write(RESOLV_CONF, gate_resolv_conf(&original, &upstreams))
                .map_err(|e| setup("cannot point /etc/resolv.conf at the DNS gate", &e))?;
        }
        timeline::mark("DNS gate");
        Ok(Enforcement { nft, sink, upstreams, loaded, settings, checker: None, verdicts: None })
    }

    /// Starts the name check (its listeners, PID 1's verdicts, the checker process), if it is on.
    pub fn start_name_check(
        &mut self,
        policy: &Policy,
        logs: &Logs,
        program: &std::path::Path,
    ) -> Result<(), Fatal> {
        if !self.settings.name_check {
            return Ok(());
        }
        let setup =
            |what: &str, e: &dyn std::fmt::Display| Fatal::new(Refusal::SetupFailed, format!("{what}: {e}"));
        let verdicts = Verdicts::new(
            self.sink.clone(),
            policy.cidrs.clone(),
            logs.connections.clone(),
            logs.denials.clone(),
        );
        let checker = CheckerProcess::bind(verdicts.clone(), self.settings.ipv6)
            .map_err(|e| setup("cannot listen for the name check on loopback", &e))?;
        crate::process::Service::start(&checker, program)
            .map_err(|e| setup("cannot start the name check", &e))?;
        self.checker = Some(Arc::new(checker));
        self.verdicts = Some(verdicts);
        Ok(())
    }

    /// Replaces the table and the allowlist in one step (the sink's lock: no answer in flight
    /// can slip the address of a removed name into the new table), then cuts the connections
    /// `policy` no longer allows. On an error the current policy stays.
    pub async fn reload(&self, policy: &Policy) -> Result<Reloaded, FirewallError> {
        let kept = self
            .sink
            .reload(Allowlist::new(policy), |kept| self.nft.apply(&self.ruleset(policy, kept).render()))?;
        // The health check's reference: the table as loaded now, or none (unhealthy) if unread.
        match self.nft.read_table_terse() {
            Ok(table) => record_shape(&table),
            Err(e) => {
                let _ = std::fs::remove_file(crate::policy::layout::FIREWALL_SHAPE);
                console::err(format!("sandbox-init: cannot read the reloaded table back: {e}"));
            }
        }
        let open: HashSet<_> = kept.iter().map(|k| (k.addr, k.opening.protocol(), k.port)).collect();
        let cut = match conntrack::revoke(|flow| revokes(policy, &open, Tracked::from(flow))) {
            Ok(cut) => cut,
            Err(err) => {
                // The table holds the new policy already; only connections opened before it stay.
                console::err(format!(
                    "sandbox-init: WARNING: cannot cut connections the new policy no longer allows: {err}"
                ));
                0
            }
        };
        if let Some(verdicts) = &self.verdicts {
            verdicts.recheck(policy.cidrs.clone()).await;
        }
        Ok(Reloaded { kept: kept.len(), cut })
    }
}

/// Records the table's shape for the health check (net/firewall/shape.rs); without it the check
/// says unhealthy, which is what the log line explains.
fn record_shape(table: &serde_json::Value) {
    if let Err(e) = crate::net::firewall::shape::record(table) {
        console::err(format!("sandbox-init: cannot record the table's shape for the health check: {e}"));
    }
}

/// The firewall, the DNS gate and the name check, each proven from the agent's side before the
/// agent starts; and the script that removes the name check's probe element once it has.
pub async fn enforce(
    policy: &Policy,
    agent: &AgentPrivileges,
    settings: Settings,
    logs: &Logs,
) -> Result<(Enforcement, Option<String>), Fatal> {
    let program = crate::process::sandbox_init_exe();
    let mut enforcement = Enforcement::start(policy, settings, logs).await?;
    let target = verify::blocked(policy, agent, &program)?;
    timeline::mark("probe: blocked");
    enforcement.start_name_check(policy, logs, &program)?;
    timeline::mark("name check started");
    let mut after_ready = None;
    if let (Some(verdicts), Some(target)) = (&enforcement.verdicts, target) {
        // Its refusal is PID 1's own, not the agent's to log.
        verdicts.quiet(SocketAddr::new(target, verify::PROBE_PORT));
        after_ready = Some(verify::name_check(&enforcement.nft, agent, &program, target)?);
        timeline::mark("probe: name check");
    }
    Ok((enforcement, after_ready))
}

/// The ruleset of `policy`: the one place one is made.
fn ruleset<'a>(
    policy: &'a Policy,
    upstreams: &'a [IpAddr],
    elements: &'a [Element],
    log: bool,
    settings: Settings,
) -> Ruleset<'a> {
    let name_check = settings.name_check.then_some(NameCheck {
        uid: CHECKER_UID,
        check_port: CHECK_PORT,
        pass_port: PASS_PORT,
        forwarder_port: FORWARDER_PORT,
    });
    Ruleset {
        policy,
        upstreams,
        elements,
        log,
        set_size: settings.set_size,
        name_check,
        shape: settings.shape,
        model_server: settings.model_server,
    }
}

/// The resolvers the gate asks: `SANDBOX_DNS` (comma-separated addresses) if set, else
/// resolv.conf's. A resolver on the container's loopback is refused (the agent could bind its
/// address and answer for it), but for Docker's DNS in one container. The gateway of sidecar mode
/// takes `SANDBOX_DNS` only: resolv.conf is the agent's container's file, and Docker's DNS
/// forwards as root, whom its rules cannot tell from the agent.
pub fn choose_upstreams(
    setting: Option<&str>,
    resolv_conf: &str,
    shape: Shape,
) -> Result<Vec<IpAddr>, Fatal> {
    let refuse = |refusal, message: String| Err(Fatal::new(refusal, message));
    let (upstreams, source) = match setting.map(str::trim) {
        Some(list) if !list.is_empty() => {
            let mut upstreams = Vec::new();
            for item in list.split(',').map(str::trim) {
                match item.parse::<IpAddr>() {
                    Ok(addr) if !crate::policy::resolver_outside(&addr) => {
                        return refuse(
                            Refusal::BadSetting,
                            format!(
                                "{DNS_ENV}={list}: {addr} is not a resolver outside the container (on loopback the \
                                 agent could bind its address and answer for it)"
                            ),
                        );
                    }
                    Ok(addr) => upstreams.push(addr),
                    Err(_) => {
                        return refuse(
                            Refusal::BadSetting,
                            format!(
                                "{DNS_ENV}={list}: `{item}` is not an IP address (give addresses, comma-separated)"
                            ),
                        );
                    }
                }
            }
            (upstreams, DNS_ENV)
        }
        // Docker's DNS, which no one but the gate may ask, is the one resolver the gateway takes
        // from the file: the agent could make it name no other.
        _ if shape == Shape::Sidecar && resolv_conf_upstreams(resolv_conf) == [IpAddr::V4(DOCKER_DNS)] => {
            console::err(format!(
                "sandbox-init: the gateway resolves through Docker's DNS, which answers the network's own \
                 names only (it forwards the rest as root, whom the rules cannot tell from the agent); \
                 {DNS_ENV} (run --dns IP) names a resolver for the rest"
            ));
            (vec![IpAddr::V4(DOCKER_DNS)], "/etc/resolv.conf")
        }
        _ if shape == Shape::Sidecar => {
            return refuse(
                Refusal::BadSetting,
                format!(
                    "the gateway needs {DNS_ENV} (agent-sandbox run --sidecar --dns IP): it does not take a \
                     resolver from /etc/resolv.conf, which the agent's container shares and could rewrite, but \
                     Docker's DNS"
                ),
            );
        }
        _ => (resolv_conf_upstreams(resolv_conf), "/etc/resolv.conf"),
    };
    if let Some(resolver) = upstreams.iter().find(|a| impersonable_resolver(a)) {
        return refuse(
            Refusal::UnsafeNetwork,
            format!(
                "the resolver {resolver} ({source}) is on loopback inside the container, where the agent could \
                 bind its address and answer for it; use a user-defined network (Docker's DNS, 127.0.0.11) or a \
                 resolver outside the container (--dns)"
            ),
        );
    }
    Ok(upstreams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::path::Path;

    /// Records every script and fails those `refuses` picks, as a kernel without a feature does.
    struct Recording {
        scripts: RefCell<Vec<String>>,
        refuses: fn(&str) -> bool,
    }

    impl NftApply for Recording {
        fn apply(&self, script: &str) -> Result<(), FirewallError> {
            self.scripts.borrow_mut().push(script.to_string());
            if (self.refuses)(script) {
                Err(FirewallError::Rejected("Operation not supported".into()))
            } else {
                Ok(())
            }
        }
    }

    fn policy(text: &str) -> Policy {
        Policy::from_yaml(Path::new("p.yaml"), text).unwrap()
    }

    const SETTINGS: Settings =
        Settings { ipv6: false, set_size: 1024, name_check: true, shape: Shape::Single, model_server: None };

    #[test]
    fn the_upstreams_come_from_the_setting_else_resolv_conf_and_never_from_loopback() {
        let conf = "nameserver 127.0.0.11\noptions ndots:0\n";
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(choose_upstreams(None, conf, Shape::Single).unwrap(), [ip("127.0.0.11")]);
        assert_eq!(choose_upstreams(Some(""), conf, Shape::Single).unwrap(), [ip("127.0.0.11")]);
        assert_eq!(
            choose_upstreams(Some("10.0.0.2, fd00::53"), conf, Shape::Single).unwrap(),
            [ip("10.0.0.2"), ip("fd00::53")]
        );
        assert_eq!(choose_upstreams(Some("10.0.0.2"), conf, Shape::Sidecar).unwrap(), [ip("10.0.0.2")]);
        assert_eq!(
            choose_upstreams(None, conf, Shape::Sidecar).unwrap(),
            [ip("127.0.0.11")],
            "the network's names"
        );
        let other = "nameserver 10.0.0.2\n";
        for (setting, shape, refusal, says) in [
            (None, Shape::Sidecar, Refusal::BadSetting, "the gateway needs SANDBOX_DNS"),
            (Some("127.0.0.11"), Shape::Sidecar, Refusal::BadSetting, "127.0.0.11 is not a resolver outside"),
            (Some("127.0.0.1"), Shape::Single, Refusal::BadSetting, "127.0.0.1 is not a resolver outside"),
            (Some("::1"), Shape::Single, Refusal::BadSetting, "::1 is not"),
            (Some("0.0.0.0"), Shape::Single, Refusal::BadSetting, "0.0.0.0 is not"),
            (Some("::ffff:127.0.0.1"), Shape::Sidecar, Refusal::BadSetting, "127.0.0.1 is not"),
            (
                Some("10.0.0.2,resolver"),
                Shape::Single,
                Refusal::BadSetting,
                "`resolver` is not an IP address",
            ),
        ] {
            let fatal =
                choose_upstreams(setting, if setting.is_none() { other } else { conf }, shape).unwrap_err();
            assert_eq!(fatal.refusal, refusal, "{setting:?}");
            assert!(fatal.message.contains(says), "{setting:?}: {}", fatal.message);
        }
        let fatal = choose_upstreams(None, "nameserver 127.0.0.53\n", Shape::Single).unwrap_err();
        assert_eq!(fatal.refusal, Refusal::UnsafeNetwork);
        assert!(fatal.message.contains("127.0.0.53 (/etc/resolv.conf)"), "{}", fatal.message);
    }

    #[test]
    fn a_kernel_without_nflog_loads_the_table_without_the_log_rule() {
        let policy = policy("version: 1\ndomains: [a.example.com]\n");
        let nft = Recording { scripts: RefCell::default(), refuses: |s| s.contains("log group") };
        let loaded = load_table(&nft, ruleset(&policy, &[], &[], true, SETTINGS)).unwrap();
        assert_eq!(loaded, Loaded { log: false });
        let scripts = nft.scripts.borrow();
        assert_eq!(scripts.len(), 3, "created and replaced with the log rule, then replaced without");
        assert!(scripts[0].starts_with("create table inet agent_sandbox\n"), "{}", scripts[0]);
        assert!(!scripts[2].contains("log group") && scripts[2].contains("to_checker"), "{}", scripts[2]);
    }

    #[test]
    fn a_table_already_there_is_replaced_whole() {
        let policy = policy("version: 1\ndomains: [a.example.com]\n");
        // As nft answers `create` for a table that exists: File exists, nothing loaded.
        let nft = Recording { scripts: RefCell::default(), refuses: |s| s.starts_with("create table") };
        let loaded = load_table(&nft, ruleset(&policy, &[], &[], true, SETTINGS)).unwrap();
        assert_eq!(loaded, Loaded { log: true });
        let scripts = nft.scripts.borrow();
        assert_eq!(scripts.len(), 2, "{scripts:?}");
        assert!(
            scripts[1].starts_with("table inet agent_sandbox\ndelete table inet agent_sandbox\ntable inet"),
            "{}",
            scripts[1]
        );
        assert_eq!(scripts[0].split_once('\n').unwrap().1, scripts[1].splitn(3, '\n').nth(2).unwrap());
    }

    #[test]
    fn a_kernel_without_nat_redirect_refuses_with_69_and_leaves_no_table() {
        let policy = policy("version: 1\ndomains: [a.example.com]\n");
        let nft = Recording { scripts: RefCell::default(), refuses: |s| s.contains("redirect to") };
        let refused = load_table(&nft, ruleset(&policy, &[], &[], true, SETTINGS)).unwrap_err();
        assert_eq!(refused.refusal, Refusal::NftMissing);
        assert_eq!(refused.refusal.code(), 69);
        assert!(refused.message.contains("nat redirect"), "{}", refused.message);
        let scripts = nft.scripts.borrow();
        assert_eq!(
            scripts.last().map(String::as_str),
            Some("delete table inet agent_sandbox\n"),
            "{scripts:?}"
        );
    }

    #[test]
    fn a_table_the_kernel_takes_at_once_keeps_its_log_rule() {
        let policy = policy("version: 1\ndomains: [a.example.com]\n");
        let nft = Recording { scripts: RefCell::default(), refuses: |_| false };
        assert_eq!(
            load_table(&nft, ruleset(&policy, &[], &[], true, SETTINGS)).unwrap(),
            Loaded { log: true }
        );
        assert_eq!(nft.scripts.borrow().len(), 1);
        // Without the name check, a kernel with no nflog and nothing else wrong loads plain.
        let plain = Settings { name_check: false, ..SETTINGS };
        let nft = Recording { scripts: RefCell::default(), refuses: |s| s.contains("log group") };
        assert_eq!(load_table(&nft, ruleset(&policy, &[], &[], true, plain)).unwrap(), Loaded { log: false });
    }

    #[test]
    fn a_reload_revokes_only_the_flows_the_new_policy_no_longer_opens() {
        let policy =
            policy("version: 1\ncidrs:\n  - cidr: 10.9.0.0/16\n    ports: [5432]\ninbound: [3000]\n");
        let kept: IpAddr = "203.0.113.7".parse().unwrap();
        let open = HashSet::from([(kept, Protocol::Tcp, 443)]);
        let flow = |mark, protocol, destination: &str, port| Tracked {
            mark,
            protocol,
            destination: destination.parse().unwrap(),
            port,
        };
        let cases = [
            (flow(EGRESS_MARK, 6, "203.0.113.7", 443), false, "an element the policy keeps"),
            (flow(EGRESS_MARK, 17, "203.0.113.7", 443), true, "UDP where only TCP is kept"),
            (flow(EGRESS_MARK, 6, "198.51.100.1", 443), true, "a removed name's address"),
            (flow(EGRESS_MARK, 6, "10.9.3.4", 5432), false, "a range the policy keeps"),
            (flow(EGRESS_MARK, 6, "10.9.3.4", 5433), true, "a port the range does not open"),
            (flow(INBOUND_MARK, 6, "172.17.0.2", 3000), false, "an inbound port kept"),
            (flow(INBOUND_MARK, 6, "172.17.0.2", 3001), true, "an inbound port closed"),
            (flow(0, 6, "198.51.100.1", 443), false, "not ours: Docker's, the gate's"),
        ];
        for (tracked, cut, what) in cases {
            assert_eq!(revokes(&policy, &open, tracked), cut, "{what}");
        }
    }
}
