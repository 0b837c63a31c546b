//! The MAC learning table: source address → port slot, with ageing.
//!
//! ## Behavior
//! [`MacTable::learn`] records where an address was last seen; [`MacTable::lookup`] ignores
//! entries older than the ageing time; [`MacTable::expire`] sweeps them (the loop calls it about
//! once per second). Group addresses are never learnt.
//!
//! ## Limitations
//! At most [`MacTable::capacity`] entries: when full, new addresses are not learnt (their frames
//! are flooded) until old ones age out. The table is reserved up front, so learning never
//! allocates.

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
}

impl MacTable {
    /// A table holding up to `capacity` entries that age out after `age_ns`.
    pub fn new(capacity: usize, age_ns: u64) -> Self {
        let mut map = HashMap::default();
        map.reserve(capacity);
        MacTable {
            map,
            age_ns,
            capacity,
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

    /// Records that `mac` was seen on `slot` at `now_ns`.
    #[inline]
    pub fn learn(&mut self, mac: MacKey, slot: u16, now_ns: u64) {
        if is_group(mac) {
            return;
        }
        if let Some(e) = self.map.get_mut(&mac) {
            e.slot = slot;
            e.seen_ns = now_ns;
        } else if self.map.len() < self.capacity {
            self.map.insert(
                mac,
                Entry {
                    slot,
                    seen_ns: now_ns,
                },
            );
        }
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
    }

    /// Drops aged entries.
    pub fn expire(&mut self, now_ns: u64) {
        let age = self.age_ns;
        self.map
            .retain(|_, e| now_ns.saturating_sub(e.seen_ns) < age);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_moves_ages_and_purges() {
        let mut t = MacTable::new(2, 1_000);
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
}
