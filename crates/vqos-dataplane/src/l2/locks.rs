//! First-come locks of the ports read on several shards.
//!
//! A port whose port security learns (`macs = learn N`, the address guard's `learn`) keeps the
//! addresses it locked in its own lists, which the shard that reads it checks per frame
//! without a lock. A port read on several shards (a multiqueue TAP whose queues are spread,
//! docs/dataplane.md "Shards") has a copy of those lists on each: each copy alone could lock
//! N addresses, so the port as a whole could lock N per shard. For such a port the lists
//! here are the authority, kept under the address tables' mutex (which a claim already takes
//! on a miss); each shard's copy is a cache of them: an address found there passes without
//! the mutex, a new one is decided here, against the whole port's count.

use std::collections::HashMap;

use crate::config::Locks;
use crate::guard::is_ipv4_key;

use super::{AddrKey, Addresses, Learnt};

/// The lock lists of the ports read on several shards, by slot.
#[derive(Debug, Default)]
pub(crate) struct SharedLocks(HashMap<u16, Locks>);

impl SharedLocks {
    /// Makes `slot`'s locks shared, starting from `locks` (the lists of the shard that read
    /// it alone until now), kept if already shared.
    pub fn share(&mut self, slot: u16, locks: Locks) {
        let l = self.0.entry(slot).or_default();
        for m in locks.macs {
            if !l.macs.contains(&m) {
                l.macs.push(m);
            }
        }
        for ip in locks.ips {
            if !l.ips.contains(&ip) {
                l.ips.push(ip);
            }
        }
    }

    /// True when `slot`'s locks are kept here.
    pub fn is_shared(&self, slot: u16) -> bool {
        self.0.contains_key(&slot)
    }

    /// What `slot` locked, if shared.
    pub fn get(&self, slot: u16) -> Option<&Locks> {
        self.0.get(&slot)
    }

    /// Forgets `slot` (its port is gone).
    pub fn forget(&mut self, slot: u16) {
        self.0.remove(&slot);
    }

    /// Takes `addr` off `slot`'s lists (an assignment took it).
    pub fn unlock(&mut self, slot: u16, addr: AddrKey) {
        if let Some(l) = self.0.get_mut(&slot) {
            match addr {
                AddrKey::Mac(m) => l.macs.retain(|&x| x != m),
                AddrKey::Ip(ip) => l.ips.retain(|&x| x != ip),
            }
        }
    }

    /// `slot` holds `addr`: `Some(true)`; has room for one more of its kind (at most `max`
    /// MACs, or `max` addresses of its IP family): `Some(false)`; neither: `None`.
    pub fn room(&self, slot: u16, addr: AddrKey, max: usize) -> Option<bool> {
        let l = self.0.get(&slot)?;
        let (holds, n) = match addr {
            AddrKey::Mac(m) => (l.macs.contains(&m), l.macs.len()),
            AddrKey::Ip(ip) => {
                let v4 = is_ipv4_key(ip);
                let family = l.ips.iter().filter(|&&x| is_ipv4_key(x) == v4).count();
                (l.ips.contains(&ip), family)
            }
        };
        match (holds, n < max) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        }
    }

    /// Adds `addr` to `slot`'s lists (a claim the tables granted).
    pub fn add(&mut self, slot: u16, addr: AddrKey) {
        if let Some(l) = self.0.get_mut(&slot) {
            match addr {
                AddrKey::Mac(m) => l.macs.push(m),
                AddrKey::Ip(ip) => l.ips.push(ip),
            }
        }
    }
}

impl Addresses {
    /// May `slot` lock `addr` first come, within `max` of its kind? For a port whose locks
    /// are shared ([`SharedLocks`]: read on several shards) against the whole port's lists,
    /// which then hold it; else the tables' first-come pin alone (the port's own lists count).
    pub fn claim(&mut self, addr: AddrKey, slot: u16, max: usize, now_ns: u64) -> bool {
        let shared = self.locks.is_shared(slot);
        if shared {
            match self.locks.room(slot, addr, max) {
                Some(true) => return true,
                Some(false) => {}
                None => return false,
            }
        }
        let got = match addr {
            AddrKey::Mac(m) => self.macs.pin(m, slot, false, now_ns),
            AddrKey::Ip(ip) => self.ips.pin(ip, slot, false, now_ns),
        };
        let ok = matches!(got, Learnt::Yes | Learnt::Inherited);
        if ok && shared {
            self.locks.add(slot, addr);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::ipv4_key;

    #[test]
    fn the_count_is_the_whole_ports_and_per_family() {
        let mut s = SharedLocks::default();
        assert_eq!(
            s.room(3, AddrKey::Mac(1), 1),
            None,
            "not shared: nothing here"
        );
        s.share(
            3,
            Locks {
                macs: vec![1],
                ips: vec![],
            },
        );
        assert!(s.is_shared(3));
        assert_eq!(s.room(3, AddrKey::Mac(1), 1), Some(true));
        assert_eq!(s.room(3, AddrKey::Mac(2), 1), None, "full at 1");
        assert_eq!(s.room(3, AddrKey::Mac(2), 2), Some(false));
        let v4 = ipv4_key([10, 0, 0, 1]);
        let v4b = ipv4_key([10, 0, 0, 2]);
        let v6 = 0x2001_0db8 << 96;
        s.add(3, AddrKey::Ip(v4));
        assert_eq!(s.room(3, AddrKey::Ip(v4b), 1), None, "one IPv4 address");
        assert_eq!(
            s.room(3, AddrKey::Ip(v6), 1),
            Some(false),
            "IPv6 counted apart"
        );
        s.unlock(3, AddrKey::Ip(v4));
        assert_eq!(s.room(3, AddrKey::Ip(v4b), 1), Some(false));
        s.share(
            3,
            Locks {
                macs: vec![1, 5],
                ips: vec![],
            },
        );
        assert_eq!(s.get(3).map(|l| l.macs.clone()), Some(vec![1, 5]));
        s.forget(3);
        assert!(!s.is_shared(3));
    }
}
