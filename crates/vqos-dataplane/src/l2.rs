//! Address tables: where a source address lives (port slot), with ageing and ownership. The
//! MAC learning table ([`MacTable`]) and the IP address guard's table ([`IpTable`]) are the
//! same structure over different keys ([`Addr`]).
//!
//! ## Behavior
//! [`MacTable::learn`] records where an address was seen; [`MacTable::lookup`] ignores
//! entries older than the ageing time; [`MacTable::expire`] sweeps them (the loop calls it about
//! once per second). Group addresses are never learnt. An address belongs to the port it was
//! seen on until it ages out: another port sending from it gets [`Learnt::Owned`] and the
//! entry does not move (the data plane drops such frames as `spoofed`). [`MacTable::pin`] makes
//! a port the owner for as long as the port exists (configured addresses and addresses locked
//! by port security); pinned entries never age or move.
//!
//! ## Limitations
//! At most [`MacTable::capacity`] entries, and at most a per-port limit learnt on any one port
//! ([`MacTable::set_port_capacity`]), so that one port sending from many addresses cannot fill
//! the table for everyone. Beyond either limit a new address is not learnt
//! ([`Learnt::Full`]) until old ones age out. A station that really moves between ports
//! (a VM migrated in) is reachable on its new port only once its old entry aged out, unless
//! the new port is configured with its address. The table is reserved up front; learning
//! allocates only the first time it sees a port slot.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::frame::{is_group, MacKey};
use crate::guard::{is_group_ip, IpKey};

mod assign;
pub(crate) mod handover;
mod locks;

pub(crate) use handover::Handover;
pub(crate) use locks::SharedLocks;

/// A source address a table can hold.
pub trait Addr: Copy + Ord + Hash {
    /// True for a group (multicast or broadcast) address: never learnt, never owned.
    fn is_group(self) -> bool;
}

impl Addr for MacKey {
    #[inline]
    fn is_group(self) -> bool {
        is_group(self)
    }
}

impl Addr for IpKey {
    #[inline]
    fn is_group(self) -> bool {
        is_group_ip(self)
    }
}

/// Source MAC → port slot.
pub type MacTable = AddrTable<MacKey>;
/// Source IP address (IPv4 mapped into IPv6) → port slot.
pub type IpTable = AddrTable<IpKey>;

/// A multiplicative hasher for 48-bit MAC and 128-bit IP keys (SipHash is needlessly slow
/// here and the keys are not attacker-chosen beyond what the capacity limit already bounds).
#[derive(Default)]
pub struct MacHasher(u64);

impl Hasher for MacHasher {
    fn write_u128(&mut self, v: u128) {
        self.write_u64((v as u64) ^ ((v >> 64) as u64).rotate_left(17));
    }
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
    /// Owned by its port for as long as the port exists (configured, or locked by port
    /// security): never ages, never moves.
    pinned: bool,
    /// Pinned by an operator's assignment (configured, or a lock a previous run persisted):
    /// outranks a first-come lock taken in this run.
    assigned: bool,
    /// The port slot the address is being handed over to (`vqos port migrate`): it co-owns
    /// the address until its first frame from it, or until the owner goes ([`handover`]).
    heir: Option<u16>,
}

/// What [`MacTable::learn`] did with a source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learnt {
    /// Recorded (or refreshed) on the port.
    Yes,
    /// Not recorded: the table or the port's share of it is full (frames to it are handled
    /// as unknown).
    Full,
    /// The address belongs to another port (pinned there, or seen there within the ageing
    /// time): a frame claiming it is spoofed, and the entry stays where it is.
    Owned(u16),
    /// Recorded on the port by an assignment ([`AddrTable::pin`] with `force`), taken from the
    /// first-come lock of the port in this slot (which must forget it).
    Taken(u16),
    /// Not recorded yet: the address is being handed over to this port, which co-owns it; the
    /// caller completes the hand-over (`Addresses::complete_handover`).
    Inherited,
}

/// Address → port slot.
#[derive(Debug)]
pub struct AddrTable<K> {
    /// The entries.
    map: HashMap<K, Entry, BuildHasherDefault<MacHasher>>,
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
    /// Entries that moved or went away so far (what a reader's cache must forget).
    changes: u64,
    /// Entries added so far (what makes a cached "unknown" stale).
    inserts: u64,
}

impl<K: Addr> AddrTable<K> {
    /// A table holding up to `capacity` entries, at most `port_capacity` learnt on any one
    /// port slot, that age out after `age_ns`.
    pub fn new(capacity: usize, port_capacity: usize, age_ns: u64) -> Self {
        let mut map = HashMap::default();
        map.reserve(capacity);
        AddrTable {
            map,
            age_ns,
            capacity,
            per_slot: Vec::new(),
            port_capacity: Vec::new(),
            default_port_capacity: port_capacity,
            changes: 0,
            inserts: 0,
        }
    }

    /// Entries that moved or went away, and entries added, since the table was made: a
    /// shard's cache (docs/dataplane.md, "Shards") forgets what it holds when either grows.
    pub fn versions(&self) -> (u64, u64) {
        (self.changes, self.inserts)
    }

    /// Every address held and its port slot (pinned, or seen within the ageing time).
    pub fn placed(&self, now_ns: u64) -> impl Iterator<Item = (K, u16)> + '_ {
        self.map
            .iter()
            .filter(move |(_, e)| self.live(e, now_ns))
            .map(|(&k, e)| (k, e.slot))
    }

    /// Where `addr` lives and until when it does unless seen again (`None`: pinned, for as
    /// long as its port exists); nothing for a group, unknown or aged address.
    #[inline]
    pub fn lookup_until(&self, addr: K, now_ns: u64) -> Option<(u16, Option<u64>)> {
        let e = self.map.get(&addr)?;
        if !self.live(e, now_ns) {
            return None;
        }
        let until = match e.heir {
            // Co-owned: an answer that holds only now (a shard caches nothing that the
            // hand-over's completion could change under it).
            Some(_) => Some(now_ns),
            None => (!e.pinned).then(|| e.seen_ns.saturating_add(self.age_ns)),
        };
        Some((e.slot, until))
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

    /// True when `e` still holds its address at `now_ns`.
    #[inline]
    fn live(&self, e: &Entry, now_ns: u64) -> bool {
        e.pinned || now_ns.saturating_sub(e.seen_ns) < self.age_ns
    }

    /// Records that `mac` was seen on `slot` at `now_ns`. An address never moves away from a
    /// port that owns it ([`Learnt::Owned`]: pinned there, or seen there within the ageing
    /// time), so one port cannot take another's traffic by sending one frame with its source
    /// address; an aged entry moves freely. Group addresses are never learnt.
    #[inline]
    pub fn learn(&mut self, mac: K, slot: u16, now_ns: u64) -> Learnt {
        if mac.is_group() {
            return Learnt::Yes;
        }
        match self.map.get(&mac).copied() {
            Some(e) if e.slot == slot => {
                if !e.pinned {
                    self.map.insert(
                        mac,
                        Entry {
                            seen_ns: now_ns,
                            ..e
                        },
                    );
                }
                Learnt::Yes
            }
            Some(e) if self.live(&e, now_ns) && e.heir == Some(slot) => Learnt::Inherited,
            Some(e) if self.live(&e, now_ns) => Learnt::Owned(e.slot),
            Some(e) => {
                // Aged out: the station moved.
                Self::release(&mut self.per_slot, e.slot);
                self.map.remove(&mac);
                self.changes += 1;
                self.insert(mac, slot, now_ns, false)
            }
            None => self.insert(mac, slot, now_ns, false),
        }
    }

    /// Makes `slot` the owner of `mac` for as long as the port exists (configured addresses,
    /// addresses locked by port security). Without `force` (a first-come lock) it takes only
    /// an address no port holds. With `force` (an assignment: configured, or a lock persisted
    /// by a previous run) it takes the address from a port that only learnt it or locked it
    /// first-come in this run ([`Learnt::Taken`]): an operator's assignment wins over
    /// learning, and a lock taken while its owner was away never outranks a persisted one.
    /// It never takes an address assigned elsewhere.
    pub fn pin(&mut self, mac: K, slot: u16, force: bool, now_ns: u64) -> Learnt {
        if mac.is_group() {
            return Learnt::Owned(u16::MAX);
        }
        match self.map.get(&mac).copied() {
            Some(e) if e.slot == slot => {
                self.map.insert(
                    mac,
                    Entry {
                        pinned: true,
                        assigned: e.assigned || force,
                        seen_ns: now_ns,
                        ..e
                    },
                );
                Learnt::Yes
            }
            Some(e) if e.heir == Some(slot) && self.live(&e, now_ns) => Learnt::Inherited,
            // An address in a hand-over is not taken, not even by an assignment.
            Some(e) if e.assigned || e.heir.is_some() => Learnt::Owned(e.slot),
            Some(e) if !force && (e.pinned || self.live(&e, now_ns)) => Learnt::Owned(e.slot),
            Some(e) => {
                Self::release(&mut self.per_slot, e.slot);
                self.map.remove(&mac);
                self.changes += 1;
                match self.insert_held(mac, slot, now_ns, true, force) {
                    Learnt::Yes if e.pinned => Learnt::Taken(e.slot),
                    other => other,
                }
            }
            None => self.insert_held(mac, slot, now_ns, true, force),
        }
    }

    /// A new entry, if the table and the port's share allow.
    fn insert(&mut self, mac: K, slot: u16, now_ns: u64, pinned: bool) -> Learnt {
        self.insert_held(mac, slot, now_ns, pinned, false)
    }

    /// [`AddrTable::insert`], `assigned` or not.
    fn insert_held(
        &mut self,
        mac: K,
        slot: u16,
        now_ns: u64,
        pinned: bool,
        assigned: bool,
    ) -> Learnt {
        if self.map.len() >= self.capacity || !self.take(slot) {
            return Learnt::Full;
        }
        self.inserts += 1;
        self.map.insert(
            mac,
            Entry {
                slot,
                seen_ns: now_ns,
                pinned,
                assigned,
                heir: None,
            },
        );
        Learnt::Yes
    }

    /// Where `mac` lives, if learnt and not aged out (pinned entries never age).
    #[inline]
    pub fn lookup(&self, mac: K, now_ns: u64) -> Option<u16> {
        let e = self.map.get(&mac)?;
        self.live(e, now_ns).then_some(e.slot)
    }

    /// Forgets every address on `slot` (the port is gone); an address it was handing over
    /// goes to its heir, and one handed over to it stays with its owner.
    pub fn purge_slot(&mut self, slot: u16) {
        self.pass_on(slot);
        self.map.retain(|_, e| e.slot != slot);
        self.changes += 1;
        if let Some(n) = self.per_slot.get_mut(usize::from(slot)) {
            *n = 0;
        }
    }

    /// Drops aged entries.
    pub fn expire(&mut self, now_ns: u64) {
        let age = self.age_ns;
        let per_slot = &mut self.per_slot;
        let before = self.map.len();
        self.map.retain(|_, e| {
            let keep = e.pinned || now_ns.saturating_sub(e.seen_ns) < age;
            if !keep {
                Self::release(per_slot, e.slot);
            }
            keep
        });
        if self.map.len() != before {
            self.changes += 1;
        }
    }
}

/// Where every source address lives: the MAC table and the IP address guard's table, kept
/// together so that a port's addresses of both kinds are pinned, swept and forgotten at once.
#[derive(Debug)]
pub(crate) struct Addresses {
    /// Source MAC → slot.
    pub macs: MacTable,
    /// IP address claimed by a guarded vif, or announced from the network on the uplink → slot.
    pub ips: IpTable,
    /// Hand-overs under way ([`handover`]).
    pub handovers: Vec<Handover>,
    /// Hand-overs the heir completed, until the shard that reads the source took its
    /// addresses off the source's own lists ([`crate::migrate`]).
    pub done: Vec<Handover>,
    /// Hand-overs finished so far (completed, or ended by a port's removal): a shard that
    /// reads a source port looks at the list again when this grows.
    pub finished: u64,
    /// The first-come locks of ports read on several shards ([`locks`]).
    pub locks: SharedLocks,
}

impl Addresses {
    /// Empty tables.
    pub fn new(macs: MacTable, ips: IpTable) -> Self {
        Addresses {
            macs,
            ips,
            handovers: Vec::new(),
            done: Vec::new(),
            finished: 0,
            locks: SharedLocks::default(),
        }
    }

    /// Forgets every address on `slot` (the port is gone): what it was handing over goes to
    /// the heir, what was handed over to it stays with its owner.
    pub fn purge_slot(&mut self, slot: u16) {
        self.macs.purge_slot(slot);
        self.ips.purge_slot(slot);
        self.locks.forget(slot);
        let before = self.handovers.len();
        self.handovers.retain(|h| h.src != slot && h.dst != slot);
        self.done.retain(|h| h.src != slot && h.dst != slot);
        self.finished += (before - self.handovers.len()) as u64;
    }

    /// Drops aged entries of both tables.
    pub fn expire(&mut self, now_ns: u64) {
        self.macs.expire(now_ns);
        self.ips.expire(now_ns);
    }
}

/// A MAC or an IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrKey {
    /// A MAC.
    Mac(MacKey),
    /// An IP address.
    Ip(IpKey),
}

/// What [`Addresses::pin_assigned`] did beyond pinning configured addresses.
#[derive(Debug, Default)]
pub(crate) struct Pinned {
    /// Restored locks now the port's again (its first-come lists must hold them).
    pub locked: Vec<AddrKey>,
    /// Addresses taken from another port's first-come lock, with that port's slot (its list
    /// must forget them).
    pub taken: Vec<(AddrKey, u16)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const M1: MacKey = 0x02_00_00_00_00_01;

    #[test]
    fn learns_ages_moves_only_when_aged_and_purges() {
        let mut t = MacTable::new(2, 2, 1_000);
        assert_eq!(t.learn(M1, 1, 0), Learnt::Yes);
        assert_eq!(t.lookup(M1, 10), Some(1));
        // Another port claiming a live address is refused; the entry stays.
        assert_eq!(t.learn(M1, 2, 20), Learnt::Owned(1));
        assert_eq!(t.lookup(M1, 30), Some(1));
        assert_eq!(t.lookup(M1, 1_000), None, "aged out");
        // Once aged, the station may move.
        assert_eq!(t.learn(M1, 2, 1_020), Learnt::Yes);
        assert_eq!(t.lookup(M1, 1_030), Some(2), "station moved");
        assert_eq!((t.port_len(1), t.port_len(2)), (0, 1));
        t.learn(0xff_ff_ff_ff_ff_ff, 1, 0);
        assert!(
            t.lookup(0xff_ff_ff_ff_ff_ff, 0).is_none(),
            "group never learnt"
        );
        t.learn(0x02_00_00_00_00_02, 3, 1_500);
        assert_eq!(t.learn(0x02_00_00_00_00_03, 3, 1_500), Learnt::Full);
        assert_eq!(t.len(), 2, "capacity bound");
        assert_eq!(t.lookup(0x02_00_00_00_00_03, 1_500), None);
        t.expire(2_100);
        assert_eq!(t.len(), 1);
        t.purge_slot(3);
        assert!(t.is_empty());
    }

    #[test]
    fn pinned_addresses_never_age_or_move_and_configuration_wins_over_learning() {
        let mut t = MacTable::new(8, 4, 1_000);
        assert_eq!(t.learn(M1, 0, 0), Learnt::Yes);
        // A lock (no force) cannot take a live learnt address; a configuration can.
        assert_eq!(t.pin(M1, 1, false, 10), Learnt::Owned(0));
        assert_eq!(t.pin(M1, 1, true, 10), Learnt::Yes);
        assert_eq!((t.port_len(0), t.port_len(1)), (0, 1));
        // Pinned: no one takes it, configured or not, and it never ages.
        assert_eq!(t.pin(M1, 2, true, 20), Learnt::Owned(1));
        assert_eq!(t.learn(M1, 0, 20), Learnt::Owned(1));
        t.expire(1_000_000);
        assert_eq!(t.lookup(M1, 1_000_000), Some(1));
        assert_eq!(
            t.pin(0xff_ff_ff_ff_ff_ff, 1, true, 0),
            Learnt::Owned(u16::MAX)
        );
        t.purge_slot(1);
        assert_eq!(t.pin(M1, 2, false, 1_000_001), Learnt::Yes);
    }

    #[test]
    fn one_port_cannot_fill_the_table() {
        let mut t = MacTable::new(8, 3, 1_000);
        t.set_port_capacity(0, 5);
        for m in 1..=10u64 {
            let learnt = t.learn(0x02_00_00_00_01_00 + m, 1, 0);
            let want = if m <= 3 { Learnt::Yes } else { Learnt::Full };
            assert_eq!(learnt, want, "address {m}");
        }
        assert_eq!(t.port_len(1), 3);
        // Another port still learns, up to its own limit.
        assert_eq!(t.learn(0x02_00_00_00_02_01, 2, 0), Learnt::Yes);
        for m in 1..=6u64 {
            let want = if m <= 4 { Learnt::Yes } else { Learnt::Full };
            assert_eq!(t.learn(0x02_00_00_00_03_00 + m, 0, 0), want, "uplink {m}");
        }
        assert_eq!(t.port_len(0), 4, "table full (8) before the uplink's 5");
        assert_eq!(t.len(), 8);
        // Refreshing a known address is not refused.
        assert_eq!(t.learn(0x02_00_00_00_01_01, 1, 10), Learnt::Yes);
        // Ageing and purging give the room back.
        t.expire(1_005);
        assert_eq!(t.port_len(1), 1, "only the refreshed address is left");
        assert_eq!(t.port_len(0), 0);
        t.purge_slot(1);
        assert_eq!(t.port_len(1), 0);
        assert!(t.is_empty());
        for m in 1..=3u64 {
            assert_eq!(t.learn(0x02_00_00_00_01_00 + m, 1, 2_000), Learnt::Yes);
        }
    }
}
