//! The firewall's address sets as the DNS gate's sink: the allowlist in force and the table
//! change together under one lock, so an answer that races a reload can never put the address
//! of a removed name into the new table. Each write is checked again, under that lock, against
//! the allowlist in force at that moment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::net::dns::{AddressSink, SinkError};
use crate::net::firewall::setelems::SetWriter;
use crate::net::firewall::{Element, ElementKey, FirewallError, Nft, add_elements, create_elements};
use std::net::IpAddr;

use crate::policy::{Allowlist, DomainPattern, Opening};

/// What was written for one element: until when, and the policy entries it was resolved for
/// (a reload keeps it while one of them still allows it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub expiry: Instant,
    pub entries: Vec<DomainPattern>,
}

pub type WrittenMap = HashMap<ElementKey, Written>;

/// What one answer's elements need: `new` ones are created with a plain `add` (an nft run of
/// a few ms); `refresh` ones exist and are past half their time, so they get the new timeout
/// by add, delete, add (older kernels keep an existing element's timeout on `add`), which
/// costs a kernel RCU grace period (tens of ms), hence at most once per half-life. The rest
/// were written recently enough: a cached name costs no nft run at all.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Writes {
    pub new: Vec<Element>,
    pub refresh: Vec<Element>,
}

pub fn plan_writes(written: &WrittenMap, elements: Vec<Element>, now: Instant) -> Writes {
    let mut writes = Writes::default();
    for e in elements {
        match written.get(&e.key()) {
            Some(w) if w.expiry > now => {
                if w.expiry - now < e.timeout / 2 {
                    writes.refresh.push(e);
                }
            }
            _ => writes.new.push(e),
        }
    }
    writes
}

/// The elements a new allowlist keeps, with the entries that still allow each: unexpired ones
/// (a second of margin for the load) that one of their entries still opens on that protocol
/// and port, and at that address (an address of the user's network only while the entry says
/// `private: true`). The rest are forgotten: the table that replaces the old one will not have
/// them, and the reload cuts their connections.
pub fn retain(written: &WrittenMap, allowlist: &Allowlist, now: Instant) -> WrittenMap {
    let soon = now + Duration::from_secs(1);
    written
        .iter()
        .filter(|(_, w)| w.expiry > soon)
        .filter_map(|(&(addr, opening, port), w)| {
            let entries: Vec<DomainPattern> = w
                .entries
                .iter()
                .filter(|p| {
                    allowlist.entry(p).is_some_and(|a| {
                        a.opens(opening, port)
                            && crate::policy::address::scope(addr).opened_by_answer(a.private)
                    })
                })
                .cloned()
                .collect();
            (!entries.is_empty()).then_some(((addr, opening, port), Written { expiry: w.expiry, entries }))
        })
        .collect()
}

/// Writes between two prunings of expired records.
const PRUNE_EVERY: u64 = 1024;

pub struct NftSink {
    nft: Nft,
    /// The most elements the sets hold (their nft `size` too).
    max_elements: usize,
    state: Mutex<State>,
}

struct State {
    allowlist: Arc<Allowlist>,
    written: WrittenMap,
    writes: u64,
    /// The netlink socket elements are written on ([`NftSink::write_over_netlink`]); None:
    /// each write runs `nft` (and after netlink failed once, so does every later one).
    netlink: Option<SetWriter>,
}

impl NftSink {
    pub fn new(nft: Nft, allowlist: Allowlist, max_elements: usize) -> NftSink {
        let state =
            State { allowlist: Arc::new(allowlist), written: WrittenMap::new(), writes: 0, netlink: None };
        NftSink { nft, max_elements, state: Mutex::new(state) }
    }

    /// From now on, elements are written over `writer`'s netlink socket, one transaction a
    /// write, rather than by running `nft`.
    pub fn write_over_netlink(&self, writer: SetWriter) {
        self.state().netlink = Some(writer);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the allowlist and the table in one step. `load` gets the elements the new
    /// allowlist keeps and must load the table that carries them; only if it succeeds do the
    /// allowlist and the record change, and no write of the gate comes between. Returns the
    /// elements kept.
    pub fn reload(
        &self,
        allowlist: Allowlist,
        load: impl FnOnce(&[Element]) -> Result<(), FirewallError>,
    ) -> Result<Vec<Element>, FirewallError> {
        let mut state = self.state();
        let now = Instant::now();
        let kept = retain(&state.written, &allowlist, now);
        let elements: Vec<Element> = kept
            .iter()
            .map(|(&(addr, opening, port), w)| Element { addr, opening, port, timeout: w.expiry - now })
            .collect();
        load(&elements)?;
        state.written = kept;
        state.allowlist = Arc::new(allowlist);
        Ok(elements)
    }

    /// What opened `addr` for TCP on `port`, if something did and has not expired: how (a
    /// checked element wins over an opaque one), and the policy entries it was resolved for.
    pub fn opened(&self, addr: IpAddr, port: u16) -> Option<(Opening, Vec<DomainPattern>)> {
        let now = Instant::now();
        let state = self.state();
        [Opening::Checked, Opening::Opaque].into_iter().find_map(|opening| {
            let written = state.written.get(&(addr, opening, port)).filter(|w| w.expiry > now)?;
            Some((opening, written.entries.clone()))
        })
    }

    /// How many elements the gate has written and that have not expired.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.state().written.values().filter(|w| w.expiry > now).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AddressSink for NftSink {
    fn allowlist(&self) -> Arc<Allowlist> {
        self.state().allowlist.clone()
    }

    fn allow(&self, name: &str, elements: Vec<Element>) -> Result<(), SinkError> {
        let mut state = self.state();
        // Checked again now, under the lock a reload takes: the allowlist the query was
        // decided on may have been replaced since.
        let matched = state.allowlist.matches(name).ok_or(SinkError::NotAllowed)?;
        // The gate left out what the name may not open (dns::split_inward); the entries in
        // force now decide too.
        let private = matched.access.private;
        let elements: Vec<Element> = elements
            .into_iter()
            .filter(|e| matched.access.opens(e.opening, e.port))
            .filter(|e| crate::policy::address::scope(e.addr).opened_by_answer(private))
            .collect();
        if elements.is_empty() {
            return Err(SinkError::NotAllowed);
        }
        let now = Instant::now();
        state.writes += 1;
        if state.writes.is_multiple_of(PRUNE_EVERY) || state.written.len() >= self.max_elements {
            state.written.retain(|_, w| w.expiry > now);
        }
        let keys: Vec<ElementKey> = elements.iter().map(Element::key).collect();
        let writes = plan_writes(&state.written, elements, now);
        if state.written.len() + writes.new.len() > self.max_elements {
            return Err(SinkError::Full { max: self.max_elements });
        }
        if !writes.new.is_empty() || !writes.refresh.is_empty() {
            let written = match state.netlink.as_mut().map(|w| w.write(&writes.new, &writes.refresh)) {
                Some(Ok(())) => true,
                Some(Err(e)) => {
                    // The transaction was not applied: nft writes this one, and every later one.
                    crate::console::err(format!(
                        "sandbox-init: writing set elements over netlink failed ({e}); nft writes them from now on"
                    ));
                    state.netlink = None;
                    false
                }
                None => false,
            };
            if !written {
                let script = create_elements(&writes.new) + &add_elements(&writes.refresh);
                self.nft.apply(&script)?;
            }
        }
        for e in writes.new.iter().chain(&writes.refresh) {
            let record =
                state.written.entry(e.key()).or_insert_with(|| Written { expiry: now, entries: Vec::new() });
            record.expiry = now + e.timeout;
        }
        // Every element of the answer is now also this name's entries' to keep.
        for key in keys {
            if let Some(record) = state.written.get_mut(&key) {
                for entry in &matched.patterns {
                    if !record.entries.contains(entry) {
                        record.entries.push(entry.clone());
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::path::Path;

    fn key(last: u8) -> ElementKey {
        (IpAddr::from([203, 0, 113, last]), Opening::Checked, 443)
    }

    fn element(last: u8, secs: u64) -> Element {
        Element {
            addr: key(last).0,
            opening: Opening::Checked,
            port: 443,
            timeout: Duration::from_secs(secs),
        }
    }

    fn written(expiry: Instant, entries: &[&str]) -> Written {
        Written { expiry, entries: entries.iter().map(|e| DomainPattern::parse(e).unwrap()).collect() }
    }

    #[test]
    fn new_elements_are_created_and_existing_ones_refreshed_only_past_half_their_time() {
        let now = Instant::now();
        let mut map = WrittenMap::new();
        map.insert(key(2), written(now + Duration::from_secs(100), &["a.test"]));
        map.insert(key(3), written(now + Duration::from_secs(20), &["b.test"]));
        map.insert(key(4), written(now - Duration::from_secs(1), &["c.test"]));
        let writes =
            plan_writes(&map, vec![element(1, 60), element(2, 120), element(3, 60), element(4, 60)], now);
        assert_eq!(writes.new, vec![element(1, 60), element(4, 60)], "absent, and expired");
        assert_eq!(writes.refresh, vec![element(3, 60)], "20 s left of a 60 s timeout");
    }

    #[test]
    fn a_reload_keeps_an_address_while_any_entry_that_opened_it_remains() {
        let now = Instant::now();
        let later = now + Duration::from_secs(300);
        let mut map = WrittenMap::new();
        map.insert(key(1), written(later, &["kept.test", "*.removed.test"]));
        map.insert(key(2), written(later, &["*.removed.test"]));
        map.insert(key(3), written(now, &["kept.test"]));
        let udp = (IpAddr::from([203, 0, 113, 9]), Opening::Udp, 443);
        map.insert(udp, written(later, &["kept.test"]));
        let policy = Policy::from_yaml(Path::new("p.yaml"), "version: 1\ndomains: [kept.test]\n").unwrap();
        let kept = retain(&map, &Allowlist::new(&policy), now);
        assert_eq!(kept.keys().copied().collect::<Vec<_>>(), vec![key(1)], "{kept:?}");
        assert_eq!(kept[&key(1)].entries, vec![DomainPattern::parse("kept.test").unwrap()]);
    }

    /// An address of the user's network stays only while its entry says `private: true`: a
    /// reload that takes the word back drops the element (and so cuts its connections).
    #[test]
    fn a_reload_drops_a_private_address_its_entry_no_longer_opens() {
        let now = Instant::now();
        let later = now + Duration::from_secs(300);
        let inside = (IpAddr::from([192, 168, 1, 10]), Opening::Checked, 443);
        let mut map = WrittenMap::new();
        map.insert(inside, written(later, &["opted.test"]));
        map.insert(key(1), written(later, &["opted.test"]));
        let still = Policy::from_yaml(
            Path::new("p.yaml"),
            "version: 1\ndomains: [{domain: opted.test, private: true}]\n",
        )
        .unwrap();
        assert_eq!(retain(&map, &Allowlist::new(&still), now).len(), 2);
        let taken_back =
            Policy::from_yaml(Path::new("p.yaml"), "version: 1\ndomains: [opted.test]\n").unwrap();
        let kept = retain(&map, &Allowlist::new(&taken_back), now);
        assert_eq!(kept.keys().copied().collect::<Vec<_>>(), vec![key(1)], "the public one stays: {kept:?}");
    }
}
