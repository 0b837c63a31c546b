//! Names numbered ([`Names`]): an aggregator leader's hosts and tenants, and a transport
//! session's vif and tenant tables ([`crate::rpc`]); and the hasher of maps keyed by those
//! numbers ([`IdMap`]).
//!
//! ## Why
//! A leader answers every tenant of every host each period, and each answer looked its tenant
//! and host up by name in several maps: string hashing and comparison were half of its time
//! (measured, docs/benchmarks.md, "The aggregator leader's books by number"). Now a report's
//! host and each of its tenants are looked up by name once, and everything after by number.
//!
//! ## Behavior
//! - [`Names::id`] numbers a name the first time it is met, from 0, and gives the same
//!   number after; numbers are never reused, so a map keyed by them never confuses two names.
//! - [`IdMap`] hashes its integer keys by one multiplication (Fibonacci hashing). The numbers
//!   are ours, handed out in order, not chosen by a host, so a cheap hash cannot be attacked
//!   through them; names, which hosts do choose, stay in std's keyed hasher.
//!
//! ## Limitations
//! A name is kept as long as the leader leads (a host or tenant that left is a few bytes).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Names numbered in the order they were met.
#[derive(Debug, Clone, Default)]
pub struct Names {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Names {
    /// `name`'s number, given now if it has none.
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).expect("fewer than 2^32 names");
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    /// `name`'s number, if it has one.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The name numbered `id` (one this table gave).
    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// The name numbered `id`, if there is one.
    // The transport's tables (`rpc`) use it; a build without that feature does not.
    #[cfg_attr(not(feature = "rpc"), allow(dead_code))]
    pub fn try_name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(String::as_str)
    }

    /// How many numbers were given.
    // The transport's tables (`rpc`) use it; a build without that feature does not.
    #[cfg_attr(not(feature = "rpc"), allow(dead_code))]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Numbers `name` next even if it has a number already (a table that mirrors a peer's,
    /// which may send a name twice); looking it up still gives its first number.
    // The transport's tables (`rpc`) use it; a build without that feature does not.
    #[cfg_attr(not(feature = "rpc"), allow(dead_code))]
    pub fn push(&mut self, name: String) -> u32 {
        let id = u32::try_from(self.names.len()).expect("fewer than 2^32 names");
        if !self.ids.contains_key(&name) {
            self.ids.insert(name.clone(), id);
        }
        self.names.push(name);
        id
    }

    /// Forgets every number from `n` on (a refused message's names).
    // The transport's tables (`rpc`) use it; a build without that feature does not.
    #[cfg_attr(not(feature = "rpc"), allow(dead_code))]
    pub fn truncate(&mut self, n: usize) {
        for k in self.names.drain(n.min(self.names.len())..) {
            if self.ids.get(&k).is_some_and(|&i| i as usize >= n) {
                self.ids.remove(&k);
            }
        }
    }
}

/// A hasher for keys made of our own numbers ([`Names`]): each integer written is mixed in by
/// a multiplication by 2^64 / φ.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by integer keys; correct (if slower) for anything else.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by numbers of [`Names`] (or tuples of them).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_number_and_numbers_are_never_shared() {
        let mut n = Names::default();
        assert_eq!((n.id("h1"), n.id("h2"), n.id("h1")), (0, 1, 0));
        assert_eq!((n.get("h2"), n.get("h3")), (Some(1), None));
        assert_eq!((n.name(0), n.name(1)), ("h1", "h2"));
        // A peer's table: a name sent again takes the next number, found by its first.
        assert_eq!(n.push("h1".into()), 2);
        assert_eq!(
            (n.get("h1"), n.try_name(2), n.len()),
            (Some(0), Some("h1"), 3)
        );
        n.push("h4".into());
        n.truncate(2);
        assert_eq!(
            (n.len(), n.get("h1"), n.get("h4"), n.try_name(2)),
            (2, Some(0), None, None)
        );
    }

    #[test]
    fn pairs_of_numbers_spread_over_the_table() {
        // Every (tenant, host) of a 64 × 64 grid in a map: all found, and the hashes distinct
        // enough that the map's buckets are not piled up (a bad mix would put many pairs
        // under one hash).
        let mut m: IdMap<(u32, u32), u32> = IdMap::default();
        for t in 0..64 {
            for h in 0..64 {
                m.insert((t, h), t * 64 + h);
            }
        }
        assert!((0..64).all(|t| (0..64).all(|h| m[&(t, h)] == t * 64 + h)));
        let hashes: std::collections::HashSet<u64> = m
            .keys()
            .map(|k| {
                let mut s = IdHasher::default();
                std::hash::Hash::hash(k, &mut s);
                s.finish()
            })
            .collect();
        assert_eq!(hashes.len(), 64 * 64);
    }
}
