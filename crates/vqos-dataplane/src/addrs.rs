//! Address tables shared by the shards ([`SharedAddrs`]) and each shard's read cache of the
//! MAC table ([`AddrView`]).
//!
//! ## Design
//! The tables ([`Addresses`]) are one authority for the whole switch: an address is owned by
//! one port whichever shard reads it, and port security's rules (first come, pinned,
//! assigned) are decided there, under one mutex. The hot path must not take that mutex per
//! frame, so every shard keeps a cache of the MAC table's answers:
//! - a **source** hit (the address lives on the sending port, fresh) lets the frame pass
//!   without the table: port security already said yes when the address was first claimed;
//! - a source hit on **another** port (fresh) is a spoofed frame, refused without the table;
//! - a **destination** hit gives the port, and a cached "unknown" floods.
//!
//! A cached answer is never older than the table's own: it holds until the entry would age
//! out (as the table saw it when the answer was cached) and at most [`REFRESH_NS`], after
//! which the shard asks the table again, which also refreshes the entry's age for the
//! sender. When an entry moves or goes away (a station moved after ageing, a port removed, a
//! sweep, an assignment taking an address) the table's change version grows and every cache
//! is emptied before its next batch; a new entry makes cached "unknown" answers stale the same
//! way. So the cache changes when the table is consulted, never what it answers.
//!
//! An address being handed over to another port (`vqos port migrate`, [`crate::l2`]'s
//! `handover`) is never cached: while two ports own it every frame from or to it asks the
//! tables, so the hand-over's completion is seen at the next frame.
//!
//! The IP guard's table is consulted under the mutex only where it decides something new (a
//! vif claiming an address it has not locked, the network announcing one): a guarded vif's
//! locked and configured addresses are checked on the port's own lists.
//!
//! ## Cost
//! Per batch two relaxed atomic loads (the versions); per frame two lookups in a
//! shard-local hash map; the mutex about once a second per active address and shard, and for
//! every frame the cache cannot answer (a new address; a refused or full one).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::frame::MacKey;
use crate::l2::{Addresses, MacHasher};

/// The longest a shard trusts a cached answer, ns (and so how often an active address's age
/// is refreshed in the table by each shard that reads it).
pub(crate) const REFRESH_NS: u64 = 1_000_000_000;

/// Which of [`AddrView`]'s last answers: a source's, a destination's.
const SRC: usize = 0;
const DST: usize = 1;

/// Most answers a shard caches; beyond, the cache starts over.
const CACHE_MAX: usize = 16_384;

/// The tables every shard shares.
#[derive(Debug)]
pub(crate) struct SharedAddrs {
    /// The authority.
    tables: Mutex<Addresses>,
    /// The MAC table's change version, published after every locked operation.
    changes: AtomicU64,
    /// The MAC table's insert version, published after every locked operation.
    inserts: AtomicU64,
    /// Hand-overs finished ([`Addresses::finished`]), published after every locked operation.
    finished: AtomicU64,
}

/// The tables, locked; publishes the MAC table's versions when dropped.
pub(crate) struct Locked<'a> {
    guard: MutexGuard<'a, Addresses>,
    shared: &'a SharedAddrs,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Addresses;
    fn deref(&self) -> &Addresses {
        &self.guard
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Addresses {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let (changes, inserts) = self.guard.macs.versions();
        self.shared.changes.store(changes, Ordering::Release);
        self.shared.inserts.store(inserts, Ordering::Release);
        self.shared
            .finished
            .store(self.guard.finished, Ordering::Release);
    }
}

impl SharedAddrs {
    /// Shares `tables`.
    pub fn new(tables: Addresses) -> Arc<SharedAddrs> {
        let (changes, inserts) = tables.macs.versions();
        Arc::new(SharedAddrs {
            finished: AtomicU64::new(tables.finished),
            tables: Mutex::new(tables),
            changes: AtomicU64::new(changes),
            inserts: AtomicU64::new(inserts),
        })
    }

    /// Locks the tables (a shard that panicked holding them left them consistent: every
    /// operation on them is a single call).
    pub fn lock(&self) -> Locked<'_> {
        Locked {
            guard: self.tables.lock().unwrap_or_else(|e| e.into_inner()),
            shared: self,
        }
    }
}

/// A cached answer of the MAC table.
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// Where the address lives (`None`: unknown).
    slot: Option<u16>,
    /// Trusted until, ns.
    until: u64,
}

/// One shard's view of the shared tables: the tables and its cache of MAC answers.
#[derive(Debug)]
pub(crate) struct AddrView {
    /// The tables.
    shared: Arc<SharedAddrs>,
    /// Cached MAC answers.
    cache: HashMap<MacKey, Cached, BuildHasherDefault<MacHasher>>,
    /// The last source and destination answers, copies of cache entries: a batch's frames
    /// mostly share both, and a compare is cheaper than a hash lookup (measured: the two
    /// lookups were a quarter of a 64-byte frame's cycles on null ports).
    last: [Option<(MacKey, Cached)>; 2],
    /// The versions the cache was filled under.
    changes: u64,
    inserts: u64,
}

impl AddrView {
    /// A view with an empty cache.
    pub fn new(shared: Arc<SharedAddrs>) -> Self {
        AddrView {
            changes: shared.changes.load(Ordering::Acquire),
            inserts: shared.inserts.load(Ordering::Acquire),
            shared,
            cache: HashMap::default(),
            last: [None; 2],
        }
    }

    /// The shared tables.
    pub fn shared(&self) -> &Arc<SharedAddrs> {
        &self.shared
    }

    /// Locks the shared tables.
    pub fn lock(&self) -> Locked<'_> {
        self.shared.lock()
    }

    /// Hand-overs finished so far ([`Addresses::finished`]; one relaxed-cost atomic load).
    #[inline]
    pub fn finished(&self) -> u64 {
        self.shared.finished.load(Ordering::Acquire)
    }

    /// Before a batch: forgets what the tables changed since.
    #[inline]
    pub fn begin_batch(&mut self) {
        let changes = self.shared.changes.load(Ordering::Acquire);
        let inserts = self.shared.inserts.load(Ordering::Acquire);
        if changes != self.changes || self.cache.len() > CACHE_MAX {
            self.cache.clear();
            self.last = [None; 2];
        } else if inserts != self.inserts {
            self.cache.retain(|_, c| c.slot.is_some());
            self.last = [None; 2];
        }
        self.changes = changes;
        self.inserts = inserts;
    }

    /// The cached owner of source `mac` if fresh: `Some(slot)` (the sender's own slot: pass;
    /// another: spoofed), `None` = ask the tables.
    #[inline]
    pub fn cached_owner(&mut self, mac: MacKey, now: u64) -> Option<u16> {
        self.cached(SRC, mac, now).and_then(|c| c.slot)
    }

    /// The fresh cached answer for `mac`, through the last answer of kind `which`.
    #[inline]
    fn cached(&mut self, which: usize, mac: MacKey, now: u64) -> Option<Cached> {
        let c = match self.last[which] {
            Some((m, c)) if m == mac => c,
            _ => {
                let c = *self.cache.get(&mac)?;
                self.last[which] = Some((mac, c));
                c
            }
        };
        (now < c.until).then_some(c)
    }

    /// The slot `mac` lives on (`None`: unknown), from the cache or the tables.
    #[inline]
    pub fn lookup(&mut self, mac: MacKey, now: u64) -> Option<u16> {
        if let Some(c) = self.cached(DST, mac, now) {
            return c.slot;
        }
        let found = self.lock().macs.lookup_until(mac, now);
        self.remember(mac, found, now);
        found.map(|(slot, _)| slot)
    }

    /// Caches the tables' answer for `mac` (from [`crate::l2::AddrTable::lookup_until`]).
    pub fn remember(&mut self, mac: MacKey, found: Option<(u16, Option<u64>)>, now: u64) {
        let fresh = now.saturating_add(REFRESH_NS);
        let (slot, until) = match found {
            Some((slot, until)) => (Some(slot), until.map_or(fresh, |u| u.min(fresh))),
            None => (None, fresh),
        };
        let c = Cached { slot, until };
        self.cache.insert(mac, c);
        for last in &mut self.last {
            if last.is_some_and(|(m, _)| m == mac) {
                *last = Some((mac, c));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l2::{IpTable, Learnt, MacTable};

    const M: MacKey = 0x02_00_00_00_00_07;

    fn shared(age: u64) -> Arc<SharedAddrs> {
        SharedAddrs::new(Addresses::new(
            MacTable::new(16, 8, age),
            IpTable::new(16, 8, age),
        ))
    }

    #[test]
    fn a_cached_answer_never_outlives_the_tables_answer() {
        let s = shared(5_000_000_000);
        let mut a = AddrView::new(s.clone());
        let mut b = AddrView::new(s.clone());
        a.begin_batch();
        assert_eq!(a.lookup(M, 0), None, "unknown");
        // Another shard learns it: the insert makes a's cached "unknown" stale.
        assert_eq!(s.lock().macs.learn(M, 3, 10), Learnt::Yes);
        assert_eq!(a.lookup(M, 20), None, "stale until the next batch");
        a.begin_batch();
        assert_eq!(a.lookup(M, 20), Some(3));
        b.begin_batch();
        assert_eq!(b.lookup(M, 30), Some(3));
        // The cached answer holds at most REFRESH_NS, then the tables are asked again.
        assert_eq!(a.cached_owner(M, 20 + REFRESH_NS - 1), Some(3));
        assert_eq!(a.cached_owner(M, 20 + REFRESH_NS), None);
        // The port goes: every cache forgets at its next batch.
        s.lock().purge_slot(3);
        b.begin_batch();
        assert_eq!(b.cached_owner(M, 40), None);
        assert_eq!(b.lookup(M, 40), None);
    }

    #[test]
    fn a_cached_entry_expires_with_the_tables_ageing() {
        let s = shared(100);
        let mut a = AddrView::new(s.clone());
        assert_eq!(s.lock().macs.learn(M, 1, 0), Learnt::Yes);
        a.begin_batch();
        assert_eq!(a.lookup(M, 50), Some(1));
        assert_eq!(a.cached_owner(M, 99), Some(1));
        assert_eq!(a.cached_owner(M, 100), None, "aged in the table at 100");
        assert_eq!(a.lookup(M, 100), None);
    }
}
