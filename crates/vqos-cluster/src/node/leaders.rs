//! Every shard's leader as a host sees it, kept by one etcd watch instead of a lookup after each
//! failure (docs/cluster.md, "The agent on the aggregators").
//!
//! etcd's election API keeps each candidate's key under `…/aggregators/<shard>/leader/` (the
//! key ends with the candidate's lease), and the leader is the live key with the lowest create
//! revision. [`Leaders`] applies the keys as read and as watched, and answers with the same
//! rule, so a host learns a new leader when etcd does, from events pushed to it.
//!
//! Why: at 10⁴ hosts a failover made each host look the leader up after its session broke and
//! again after each backoff: thousands of range requests a second for a few seconds, at the
//! moment etcd is busiest. With the watch a failover costs etcd one event per host, pushed.
//!
//! [`LeaderWatch`] is driven by its owner's period (`HostSide::period`): it reads the prefix and
//! starts the watch when it has none, and takes the events that have arrived without waiting.
//! A broken or cancelled watch is dropped and read again at the next period; until then the
//! host opens sessions to the leaders it last knew (a stale one answers "does not lead", and
//! the host tries again after its backoff), and keeps the sessions it has.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use etcd_client::{Client, EventType, KeyValue, WatchOptions, WatchStream};

use crate::etcd::{self, deadline, get_prefix, EtcdError};
use crate::keys;

/// Each shard's candidates, by create revision, as etcd's election keys say.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leaders {
    /// shard → create revision → the candidate's endpoint.
    by_shard: BTreeMap<u32, BTreeMap<i64, String>>,
    /// key → (shard, create revision), to apply deletes.
    keys: HashMap<String, (u32, i64)>,
}

/// The shard of a candidate's election key (`…/aggregators/<shard>/leader/<lease>`), or
/// `None` for any other key (the terms, for one).
fn shard_of_key(key: &str) -> Option<u32> {
    let rest = key.strip_prefix(keys::AGGREGATORS)?;
    let mut parts = rest.splitn(3, '/');
    let shard = parts.next()?.parse().ok()?;
    (parts.next()? == "leader" && !parts.next()?.is_empty()).then_some(shard)
}

impl Leaders {
    /// A candidate's key put (a campaign, or a leader's proclamation of a new value).
    pub fn put(&mut self, key: &str, create_revision: i64, endpoint: &str) {
        let Some(shard) = shard_of_key(key) else {
            return;
        };
        self.delete(key);
        let s = self.by_shard.entry(shard).or_default();
        s.insert(create_revision, endpoint.to_string());
        self.keys.insert(key.to_string(), (shard, create_revision));
    }

    /// A candidate's key deleted (it resigned, or its lease expired).
    pub fn delete(&mut self, key: &str) {
        if let Some((shard, rev)) = self.keys.remove(key) {
            let s = self.by_shard.get_mut(&shard).expect("indexed");
            s.remove(&rev);
            if s.is_empty() {
                self.by_shard.remove(&shard);
            }
        }
    }

    /// Shard `shard`'s leader's endpoint: its oldest live candidate's.
    pub fn leader(&self, shard: u32) -> Option<&str> {
        let s = self.by_shard.get(&shard)?;
        s.values().next().map(String::as_str)
    }

    fn put_kv(&mut self, kv: &KeyValue) {
        if let Ok(key) = kv.key_str() {
            let endpoint = String::from_utf8_lossy(kv.value());
            self.put(key, kv.create_revision(), &endpoint);
        }
    }
}

/// The leaders, kept by a watch (module doc).
#[derive(Default)]
pub struct LeaderWatch {
    leaders: Leaders,
    /// The watch, once the prefix was read; `None`: read it again.
    stream: Option<WatchStream>,
    /// Reads of the prefix so far (each one a range request and a new watch).
    reads: u64,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("leaders", &self.leaders)
            .field("watching", &self.stream.is_some())
            .field("reads", &self.reads)
            .finish()
    }
}

impl LeaderWatch {
    /// Shard `shard`'s leader, as the watch last said (`None`: nobody leads, or the prefix
    /// was never read).
    pub fn leader(&self, shard: u32) -> Option<&str> {
        self.leaders.leader(shard)
    }

    /// Whether the watch is on (the leaders are known without asking etcd).
    pub fn watching(&self) -> bool {
        self.stream.is_some()
    }

    /// How many times the prefix was read (1 while a watch has lasted since the first).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Brings the leaders up to date: reads the prefix and starts the watch if there is none,
    /// then applies what the watch has delivered, without waiting for more. A broken watch is
    /// dropped (the error returned) and read again next time.
    pub async fn refresh(&mut self, client: &Client, timeout: Duration) -> Result<(), EtcdError> {
        if self.stream.is_none() {
            self.start(client, timeout).await?;
        }
        loop {
            let stream = self.stream.as_mut().expect("started above");
            // `timeout` polls the message first: a zero deadline takes what has arrived.
            let Ok(msg) = tokio::time::timeout(Duration::ZERO, stream.message()).await else {
                return Ok(());
            };
            if let Err(e) = self.apply(msg) {
                self.stream = None;
                return Err(e);
            }
        }
    }

    async fn start(&mut self, client: &Client, timeout: Duration) -> Result<(), EtcdError> {
        let mut kv = etcd::kv_client(client);
        let (read, rev) = get_prefix(&mut kv, keys::AGGREGATORS, 0, None, timeout).await?;
        self.reads += 1;
        let mut leaders = Leaders::default();
        read.iter().for_each(|kv| leaders.put_kv(kv));
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        let mut w = etcd::watch_client(client);
        let watched = w.watch(keys::AGGREGATORS, Some(opts));
        let stream = deadline("watch", timeout, watched).await?;
        self.leaders = leaders;
        self.stream = Some(stream);
        Ok(())
    }

    fn apply(
        &mut self,
        msg: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    ) -> Result<(), EtcdError> {
        let broken = |why: String| EtcdError::Client(etcd_client::Error::WatchError(why));
        let resp = msg?.ok_or_else(|| broken("leaders' watch closed".into()))?;
        if resp.canceled() {
            let why = format!(
                "leaders' watch cancelled (compacted at {}): {}",
                resp.compact_revision(),
                resp.cancel_reason()
            );
            return Err(broken(why));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            match ev.event_type() {
                EventType::Put => self.leaders.put_kv(kv),
                EventType::Delete => {
                    if let Ok(key) = kv.key_str() {
                        self.leaders.delete(key);
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

    fn key(shard: &str, lease: &str) -> String {
        format!("{}{shard}/leader/{lease}", keys::AGGREGATORS)
    }

    #[test]
    fn the_oldest_live_candidate_leads_each_shard() {
        let mut l = Leaders::default();
        assert_eq!(l.leader(0), None);
        l.put(&key("0", "a1"), 10, "https://a:1");
        l.put(&key("0", "b2"), 12, "https://b:1");
        l.put(&key("1", "b2"), 11, "https://b:1");
        assert_eq!(l.leader(0), Some("https://a:1"));
        assert_eq!(l.leader(1), Some("https://b:1"));
        // A proclamation: the same key, a new value, its create revision kept.
        l.put(&key("0", "a1"), 10, "https://a:2");
        assert_eq!(l.leader(0), Some("https://a:2"));
        // The leader's key goes: the next oldest leads; the last one gone, nobody.
        l.delete(&key("0", "a1"));
        assert_eq!(l.leader(0), Some("https://b:1"));
        l.delete(&key("0", "b2"));
        assert_eq!(l.leader(0), None);
        assert_eq!(l.leader(1), Some("https://b:1"));
        // A later candidate never leads before an older live one.
        l.put(&key("1", "c3"), 30, "https://c:1");
        assert_eq!(l.leader(1), Some("https://b:1"));
        // Deleting a key it never had changes nothing.
        let before = l.clone();
        l.delete(&key("1", "zz"));
        assert_eq!(l, before);
    }

    #[test]
    fn keys_other_than_candidates_are_left_out() {
        let mut l = Leaders::default();
        for k in [
            format!("{}0/term", keys::AGGREGATORS),
            format!("{}x/leader/a1", keys::AGGREGATORS),
            format!("{}0/leader/", keys::AGGREGATORS),
            format!("{}0/leaderx/a1", keys::AGGREGATORS),
            "/vqos/v1/tenants/acme".to_string(),
        ] {
            l.put(&k, 5, "https://x:1");
        }
        assert_eq!(l, Leaders::default());
        assert_eq!(shard_of_key(&key("4095", "694d8a")), Some(4095));
    }
}
