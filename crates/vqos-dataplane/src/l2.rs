//! The MAC learning table: source address → port slot, with ageing.
//!
//! ## Behavior
//! [`MacTable::learn`] records where an address was last seen; [`MacTable::lookup`] ignores
//! entries older than the ageing time; [`MacTable::expire`] sweeps them (the loop calls it about
//! once per second). Group addresses are never learnt.
//!
//! ## Limitations
//! At most [`MacTable::capacity`] entries, and at most a per-port limit learnt on any one port
//! ([`MacTable::set_port_capacity`]), so that one port sending from many addresses cannot fill
//! the table for everyone (frames to unlearnt addresses are flooded to every port, a leak
//! across tenants). Beyond either limit a new address is not learnt ([`MacTable::learn`]
//! returns false) until old ones age out. The table is reserved up front; learning allocates
//! only the first time it sees a port slot.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::frame::{is_group, MacKey};

/// A multiplicative hasher for 48-bit keys (SipHash is needlessly slow here and the keys are
/// not attacker-chosen beyond what the capacity limit already bounds).
#[derive(Default)]
pub struct MacHasher(u64);

impl Hasher for MacHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 ^= self.0 >> 32;
    }
}

/// One learnt address.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Port slot where the address was last seen.
    slot: u16,
    /// When, ns.
    seen_ns: u64,
}

/// Address → port slot.
#[derive(Debug)]
pub struct MacTable {
    /// The entries.
    map: HashMap<MacKey, Entry, BuildHasherDefault<MacHasher>>,
    /// Entries older than this are ignored and swept, ns.
    age_ns: u64,
    /// Most entries held.
    capacity: usize,
    /// Entries per port slot.
    per_slot: Vec<usize>,
    /// Most entries per port slot (slots beyond the vector: `default_port_capacity`).
    port_capacity: Vec<usize>,
    /// Most entries on a slot without its own limit.
    default_port_capacity: usize,
}

impl MacTable {
    /// A table holding up to `capacity` entries, at most `port_capacity` learnt on any one
    /// port slot, that age out after `age_ns`.
    pub fn new(capacity: usize, port_capacity: usize, age_ns: u64) -> Self {
        let mut map = HashMap::default();
        map.reserve(capacity);
        MacTable {
            map,
            age_ns,
            capacity,
            per_slot: Vec::new(),
            port_capacity: Vec::new(),
            default_port_capacity: port_capacity,
        }
    }

    /// Sets the most entries learnt on `slot` (e.g. more for an uplink).
    pub fn set_port_capacity(&mut self, slot: u16, n: usize) {
        let s = usize::from(slot);
        if self.port_capacity.len() <= s {
            self.port_capacity.resize(s + 1, self.default_port_capacity);
        }
        self.port_capacity[s] = n;
    }

    /// Entries learnt on `slot`.
    pub fn port_len(&self, slot: u16) -> usize {
        self.per_slot.get(usize::from(slot)).copied().unwrap_or(0)
    }

    /// Takes one more entry for `slot` if its limit allows.
    fn take(&mut self, slot: u16) -> bool {
        let s = usize::from(slot);
        if self.per_slot.len() <= s {
            self.per_slot.resize(s + 1, 0);
        }
        let limit = self
            .port_capacity
            .get(s)
            .copied()
            .unwrap_or(self.default_port_capacity);
        if self.per_slot[s] >= limit {
            return false;
        }
        self.per_slot[s] += 1;
        true
    }

    /// Gives back an entry of `slot`.
    fn release(per_slot: &mut [usize], slot: u16) {
        if let Some(n) = per_slot.get_mut(usize::from(slot)) {
            *n = n.saturating_sub(1);
        }
    }

    /// Most entries held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held (aged ones included until swept).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is learnt.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Records that `mac` was seen on `slot` at `now_ns`. Returns false when the address could
    /// not be learnt there (table or port full); an address moving to a full port is forgotten
    /// (its frames are flooded, as for any unknown address).
    #[inline]
    pub fn learn(&mut self, mac: MacKey, slot: u16, now_ns: u64) -> bool {
        if is_group(mac) {
            return true;
        }
        match self.map.get(&mac).map(|e| e.slot) {
            Some(old) if old == slot => {}
            Some(old) => {
                Self::release(&mut self.per_slot, old);
                if !self.take(slot) {
                    self.map.remove(&mac);
                    return false;
                }
            }
            None => {
                if self.map.len() >= self.capacity || !self.take(slot) {
                    return false;
                }
            }
        }
        self.map.insert(
            mac,
            Entry {
                slot,
                seen_ns: now_ns,
            },
        );
        true
    }

    /// Where `mac` lives, if learnt and not aged out.
    #[inline]
    pub fn lookup(&self, mac: MacKey, now_ns: u64) -> Option<u16> {
        let e = self.map.get(&mac)?;
        (now_ns.saturating_sub(e.seen_ns) < self.age_ns).then_some(e.slot)
    }

    /// Forgets every address on `slot` (the port is gone).
    pub fn purge_slot(&mut self, slot: u16) {
        self.map.retain(|_, e| e.slot != slot);
        if let Some(n) = self.per_slot.get_mut(usize::from(slot)) {
            *n = 0;
        }
    }

    /// Drops aged entries.
    pub fn expire(&mut self, now_ns: u64) {
        let age = self.age_ns;
        let per_slot = &mut self.per_slot;
        self.map.retain(|_, e| {
            let keep = now_ns.saturating_sub(e.seen_ns) < age;
            if !keep {
                Self::release(per_slot, e.slot);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_moves_ages_and_purges() {
        let mut t = MacTable::new(2, 2, 1_000);
        t.learn(0x02_00_00_00_00_01, 1, 0);
        assert_eq!(t.lookup(0x02_00_00_00_00_01, 10), Some(1));
        t.learn(0x02_00_00_00_00_01, 2, 20);
        assert_eq!(t.lookup(0x02_00_00_00_00_01, 30), Some(2), "station moved");
        assert_eq!(t.lookup(0x02_00_00_00_00_01, 1_020), None, "aged out");
        t.learn(0xff_ff_ff_ff_ff_ff, 1, 0);
        assert!(
            t.lookup(0xff_ff_ff_ff_ff_ff, 0).is_none(),
            "group never learnt"
        );
        t.learn(0x02_00_00_00_00_02, 3, 500);
        t.learn(0x02_00_00_00_00_03, 3, 500);
        assert_eq!(t.len(), 2, "capacity bound");
        assert_eq!(t.lookup(0x02_00_00_00_00_03, 500), None);
        t.expire(1_100);
        assert_eq!(t.len(), 1);
        t.purge_slot(3);
        assert!(t.is_empty());
    }

    #[test]
    fn one_port_cannot_fill_the_table() {
        let mut t = MacTable::new(8, 3, 1_000);
        t.set_port_capacity(0, 5);
        for m in 1..=10u64 {
            let learnt = t.learn(0x02_00_00_00_01_00 + m, 1, 0);
            assert_eq!(learnt, m <= 3, "address {m}");
        }
        assert_eq!(t.port_len(1), 3);
        // Another port still learns, up to its own limit.
        assert!(t.learn(0x02_00_00_00_02_01, 2, 0));
        for m in 1..=6u64 {
            assert_eq!(t.learn(0x02_00_00_00_03_00 + m, 0, 0), m <= 4, "uplink {m}");
        }
        assert_eq!(t.port_len(0), 4, "table full (8) before the uplink's 5");
        assert_eq!(t.len(), 8);
        // Refreshing a known address is not refused.
        assert!(t.learn(0x02_00_00_00_01_01, 1, 10));
        // Moving to a full port: forgotten (flooded), not kept on the old port.
        assert!(!t.learn(0x02_00_00_00_02_01, 1, 10));
        assert_eq!(t.lookup(0x02_00_00_00_02_01, 10), None);
        assert_eq!((t.port_len(1), t.port_len(2)), (3, 0));
        // Ageing and purging give the room back.
        t.expire(1_005);
        assert_eq!(t.port_len(1), 1, "only the refreshed address is left");
        assert_eq!(t.port_len(0), 0);
        t.purge_slot(1);
        assert_eq!(t.port_len(1), 0);
        assert!(t.is_empty());
        for m in 1..=3u64 {
            assert!(t.learn(0x02_00_00_00_01_00 + m, 1, 2_000));
        }
    }
}
