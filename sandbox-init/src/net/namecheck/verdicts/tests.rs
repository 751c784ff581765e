//! The verdicts' unit tests: the upload budgets' accounting against 200 connections opened at
//! once (sandbox-wire's `namecheck::budgets` tests it alone), the start probe's quiet refusal.

use super::*;

/// 200 connections opened at once to a name of 1 MB an hour, each sending all it is
/// granted: what they are granted in all, before and after their reports, stays within
/// the budget (grants are reserved), each is cut once, and first bytes that do not fit in
/// what is left are refused.
#[test]
fn connections_opened_at_once_share_one_budget() {
    use crate::net::dns::AddressSink as _;
    use crate::net::firewall::{Element, Nft};
    let policy = crate::policy::Policy::from_list(std::path::Path::new("x.txt"), "paste.test upload=1MB\n");
    // An nft that reads its script and succeeds.
    let dir = tempfile::tempdir().unwrap();
    let nft = dir.path().join("nft");
    std::fs::write(&nft, "#!/bin/sh\ncat >/dev/null\n").unwrap();
    std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let allowlist = sandbox_policy::Allowlist::new(&policy.unwrap());
    let sink = Arc::new(NftSink::new(Nft::at(&nft), allowlist, 100));
    let addr: IpAddr = "203.0.113.7".parse().unwrap();
    let element =
        Element { addr, opening: Opening::Checked, port: 443, timeout: std::time::Duration::from_secs(300) };
    sink.allow("paste.test", vec![element]).unwrap();
    let log = Arc::new(ConnectionLog::stderr_only());
    let verdicts = Verdicts::new(sink, Default::default(), log, Arc::new(DenialLog::stderr_only()));
    let dst = SocketAddr::new(addr, 443);
    let ask = |id: u64, first: u64| {
        let name = Some("paste.test".to_string());
        let (via, ech, forwarder, check) = ("tls".to_string(), false, false, true);
        verdicts.handle(Report::Ask { id, dst, check, name, via, ech, forwarder, first })
    };
    let mut granted = vec![0u64; 201];
    for id in 1..=200 {
        match ask(id, 500).as_slice() {
            [Order::Verdict { allow: true, allowance: Some(a), .. }] => granted[id as usize] = *a,
            [Order::Verdict { allow: false, .. }] => {}
            other => panic!("{other:?}"),
        }
    }
    let total: u64 = granted.iter().sum();
    assert!(total <= 1_000_000, "200 connections at once were granted {total} bytes");
    // Each sends all it was granted and reports it, until no grant comes.
    let mut cuts = 0;
    loop {
        let mut more = false;
        for (id, up) in granted.iter_mut().enumerate().filter(|(_, up)| **up > 0) {
            for order in verdicts.handle(Report::Progress { id: id as u64, up: *up }) {
                match order {
                    Order::Close { .. } => cuts += 1,
                    Order::Allowance { total, .. } => (*up, more) = (total, true),
                    _ => {}
                }
            }
        }
        if !more {
            break;
        }
    }
    let sent: u64 = granted.iter().sum();
    assert!(sent <= 1_000_000, "sent {sent} bytes in all against a budget of 1,000,000");
    assert!(cuts <= 200, "{cuts} cut orders for 200 connections");
    // Nothing is left: a new connection's hello does not fit.
    assert!(matches!(ask(999, 500).as_slice(), [Order::Verdict { allow: false, .. }]));
}

/// PID 1's probe at start is refused by the checker, whose report may come after the probe
/// returned: it is the one refusal left out of the log, whenever it comes, and only once.
#[test]
fn the_start_probes_refusal_is_left_out_once() {
    let quiet = Quiet::default();
    let probe: SocketAddr = "172.17.0.1:9".parse().unwrap();
    *quiet.0.lock().unwrap() = Some(probe);
    assert!(!quiet.takes("172.17.0.1:10".parse().unwrap()), "another destination");
    assert!(quiet.takes(probe), "the probe's report, late");
    assert!(!quiet.takes(probe), "the agent's own connection there is logged");
}
