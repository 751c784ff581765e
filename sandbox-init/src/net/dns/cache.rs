//! The gate's cache of answers: a name asked again within its answer's TTL is answered from here,
//! without the upstream, with the TTLs lowered by the time since, so that no client keeps an
//! answer past the moment the firewall's elements for it (written when it was fetched, for at
//! least its TTL) expire. An entry counts only under the allowlist it was allowed by: a reload
//! makes every entry a miss. Keyed by the exact question the gate forwards (all of it but the
//! id) and the transport; bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};

use super::Transport;
use crate::policy::Allowlist;

/// Entries at most; past it, the expired go, and if none had, all.
pub const MAX_ENTRIES: usize = 4096;

struct Entry {
    answer: Vec<u8>,
    stored: Instant,
    expires: Instant,
    /// The allowlist in force when the answer's addresses were allowed (a `Weak`: its address
    /// cannot be reused by a later allowlist while the entry holds it).
    allowlist: Weak<Allowlist>,
}

/// The longest an answer is kept, and the most TTL it is served with: the elements written for
/// it live no longer ([`crate::net::firewall::MAX_TIMEOUT`]).
pub const MAX_TTL: u32 = crate::net::firewall::MAX_TIMEOUT.as_secs() as u32;

/// `answer` with no record's TTL past [`MAX_TTL`]: a client keeps it no longer than the firewall
/// keeps what it opened. As it came when no TTL is that long (nearly always).
pub fn capped(answer: Vec<u8>) -> Vec<u8> {
    let Ok(mut message) = Message::from_vec(&answer) else { return answer };
    if message.answers().iter().all(|r| r.ttl() <= MAX_TTL) {
        return answer;
    }
    for record in message.answers_mut() {
        record.set_ttl(record.ttl().min(MAX_TTL));
    }
    message.to_vec().unwrap_or(answer)
}

#[derive(Default)]
pub struct AnswerCache {
    entries: Mutex<HashMap<(Vec<u8>, Transport), Entry>>,
}

impl AnswerCache {
    /// The answer to `question` (the forwarded query without its id) under `allowlist`, with
    /// `id` and TTLs lowered by its age; None if there is none, it expired, or the allowlist
    /// changed since.
    pub fn get(
        &self,
        question: &[u8],
        transport: Transport,
        allowlist: &Arc<Allowlist>,
        id: u16,
    ) -> Option<Vec<u8>> {
        let now = Instant::now();
        let (answer, age) = {
            let mut entries = self.entries.lock().ok()?;
            let key = (question.to_vec(), transport);
            let entry = entries.get(&key)?;
            let current = entry.allowlist.upgrade().is_some_and(|a| Arc::ptr_eq(&a, allowlist));
            if !current || now >= entry.expires {
                entries.remove(&key);
                return None;
            }
            (entry.answer.clone(), now.duration_since(entry.stored))
        };
        let mut message = Message::from_vec(&answer).ok()?;
        let elapsed = u32::try_from(age.as_secs()).unwrap_or(u32::MAX);
        for record in message.answers_mut() {
            record.set_ttl(record.ttl().min(MAX_TTL).saturating_sub(elapsed));
        }
        message.set_id(id);
        message.to_vec().ok()
    }

    /// Keeps `answer` (the upstream's, checked, its addresses allowed under `allowlist`) for
    /// its lowest TTL, if it is a whole answer with records: not truncated, no error.
    pub fn put(&self, question: &[u8], transport: Transport, allowlist: &Arc<Allowlist>, answer: &[u8]) {
        let Ok(message) = Message::from_vec(answer) else { return };
        if message.truncated() || message.response_code() != ResponseCode::NoError {
            return;
        }
        let Some(ttl) = message.answers().iter().map(|r| r.ttl()).min().filter(|ttl| *ttl > 0) else {
            return;
        };
        // No longer than the elements written for it live (their ceiling).
        let ttl = ttl.min(MAX_TTL);
        let now = Instant::now();
        let entry = Entry {
            answer: answer.to_vec(),
            stored: now,
            expires: now + Duration::from_secs(ttl.into()),
            allowlist: Arc::downgrade(allowlist),
        };
        let Ok(mut entries) = self.entries.lock() else { return };
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.expires > now);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert((question.to_vec(), transport), entry);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, Query};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    fn allowlist() -> Arc<Allowlist> {
        let policy = crate::policy::Policy::from_yaml(
            std::path::Path::new("t.yaml"),
            "version: 1\ndomains: [a.test]\n",
        )
        .unwrap();
        Arc::new(Allowlist::new(&policy))
    }

    fn answer(ttl: u32, truncated: bool) -> Vec<u8> {
        let name = Name::from_ascii("a.test.").unwrap();
        let mut message = Message::new();
        message.set_id(7).set_message_type(MessageType::Response).set_truncated(truncated);
        message.add_query(Query::query(name.clone(), RecordType::A));
        message.add_answer(Record::from_rdata(name, ttl, RData::A(A::new(192, 0, 2, 1))));
        message.to_vec().unwrap()
    }

    #[test]
    fn an_answer_is_served_again_with_the_clients_id_under_the_same_allowlist_only() {
        let (cache, list) = (AnswerCache::default(), allowlist());
        cache.put(b"q", Transport::Udp, &list, &answer(300, false));
        let hit = Message::from_vec(&cache.get(b"q", Transport::Udp, &list, 4242).unwrap()).unwrap();
        assert_eq!(hit.id(), 4242);
        assert_eq!(hit.answers()[0].ttl(), 300);
        assert!(cache.get(b"other", Transport::Udp, &list, 1).is_none());
        assert!(cache.get(b"q", Transport::Tcp, &list, 1).is_none(), "keyed by transport");
        // A reload: a new allowlist, even with the same contents, makes it a miss, and it goes.
        assert!(cache.get(b"q", Transport::Udp, &allowlist(), 1).is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn nothing_truncated_or_without_a_ttl_is_kept_and_the_cache_is_bounded() {
        let (cache, list) = (AnswerCache::default(), allowlist());
        cache.put(b"t", Transport::Udp, &list, &answer(300, true));
        cache.put(b"z", Transport::Udp, &list, &answer(0, false));
        cache.put(b"x", Transport::Udp, &list, b"not dns");
        assert!(cache.is_empty());
        for i in 0..MAX_ENTRIES + 10 {
            cache.put(format!("q{i}").as_bytes(), Transport::Udp, &list, &answer(300, false));
        }
        assert!(cache.len() <= MAX_ENTRIES);
    }

    /// An answer whose TTL is a week is kept, and served, no longer than the day its elements
    /// live: a client would otherwise keep an address the firewall no longer opens.
    #[test]
    fn no_answer_outlives_the_elements_written_for_it() {
        let (cache, list) = (AnswerCache::default(), allowlist());
        cache.put(b"q", Transport::Udp, &list, &answer(7 * 86400, false));
        let hit = Message::from_vec(&cache.get(b"q", Transport::Udp, &list, 1).unwrap()).unwrap();
        assert_eq!(hit.answers()[0].ttl(), MAX_TTL);
        let expires = cache.entries.lock().unwrap().values().next().unwrap().expires;
        assert!(expires <= Instant::now() + Duration::from_secs(MAX_TTL.into()));
        let first = Message::from_vec(&capped(answer(7 * 86400, false))).unwrap();
        assert_eq!(first.answers()[0].ttl(), MAX_TTL, "the first answer too");
        assert_eq!(capped(answer(300, false)), answer(300, false));
    }

    #[test]
    fn an_expired_answer_is_a_miss() {
        let (cache, list) = (AnswerCache::default(), allowlist());
        cache.put(b"q", Transport::Udp, &list, &answer(1, false));
        std::thread::sleep(Duration::from_millis(1100));
        assert!(cache.get(b"q", Transport::Udp, &list, 1).is_none());
    }
}
