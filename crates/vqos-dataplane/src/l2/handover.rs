//! A port's addresses handed over to another port (`vqos port migrate`, docs/vhost-user.md,
//! "Live migration").
//!
//! ## Behavior
//! [`Addresses::start_handover`] makes the destination port the **heir** of every live
//! address of the source (MAC table and IP table, configured, locked or learnt): from then on
//! both own it. The source keeps sending from it and frames to it still go to the source (the
//! guest runs there until the migration completes); the destination may send from it too, and
//! its first frame from one of them ([`Learnt::Inherited`]) completes the hand-over
//! ([`Addresses::complete_handover`]): every address moves to it at once, pinned as it was,
//! and the source loses them. A third port gets [`Learnt::Owned`] throughout, even an
//! assignment (`pin` with `force`) does: at no moment is an address of the guest free.
//! The source's removal completes the hand-over too (its addresses go to the heir); the
//! destination's removal cancels it (the source keeps everything).
//!
//! One operation under the tables' lock sets a hand-over up, and one completes it, so every
//! shard sees either the old owner, both, or the new one.

#[cfg(any(test, doc))]
use super::Learnt;
use super::{Addr, AddrTable, Addresses};
use crate::frame::format_mac;
use crate::guard::key_ip;

/// A hand-over under way: `dst` co-owns the addresses of `src`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handover {
    /// The port slot handing its addresses over.
    pub src: u16,
    /// The port slot they go to.
    pub dst: u16,
}

/// Why a hand-over cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The destination owns an address of its own ("MAC" or "IP", the address as text).
    Owns(&'static str, String),
    /// The slot already takes part in a hand-over.
    Busy(u16),
}

impl<K: Addr> AddrTable<K> {
    /// A live address that lives on `slot` or is being handed over to it.
    fn any_of(&self, slot: u16, now_ns: u64) -> Option<K> {
        self.map
            .iter()
            .filter(|(_, e)| (e.slot == slot || e.heir == Some(slot)) && self.live(e, now_ns))
            .map(|(&k, _)| k)
            .min()
    }

    /// Makes `dst` the heir of every live address of `src`; how many.
    fn bequeath(&mut self, src: u16, dst: u16, now_ns: u64) -> usize {
        let age = self.age_ns;
        let mut n = 0;
        for e in self.map.values_mut() {
            if e.slot == src && (e.pinned || now_ns.saturating_sub(e.seen_ns) < age) {
                e.heir = Some(dst);
                n += 1;
            }
        }
        // Cached answers for them must go (they are not cached while co-owned).
        self.changes += 1;
        n
    }

    /// Moves every address whose heir is `dst` to it, pinned and aged as it was.
    fn inherit(&mut self, dst: u16) {
        let mut moved = Vec::new();
        for e in self.map.values_mut() {
            if e.heir == Some(dst) {
                moved.push(e.slot);
                e.slot = dst;
                e.heir = None;
            }
        }
        for from in moved {
            Self::release(&mut self.per_slot, from);
            self.count(dst);
        }
        self.changes += 1;
    }

    /// Ahead of `slot`'s purge: what it was handing over goes to the heir, what was handed
    /// over to it stays with its owner.
    pub(super) fn pass_on(&mut self, slot: u16) {
        let mut heirs = Vec::new();
        for e in self.map.values_mut() {
            if e.heir == Some(slot) {
                e.heir = None;
            } else if e.slot == slot {
                if let Some(h) = e.heir.take() {
                    e.slot = h;
                    heirs.push(h);
                }
            }
        }
        for h in heirs {
            self.count(h);
        }
    }

    /// One more entry on `slot`, whatever its limit (an inherited address is the heir's).
    fn count(&mut self, slot: u16) {
        let s = usize::from(slot);
        if self.per_slot.len() <= s {
            self.per_slot.resize(s + 1, 0);
        }
        self.per_slot[s] += 1;
    }
}

impl Addresses {
    /// Starts handing every live address of `src` over to `dst` (see the module docs).
    /// Refused, with nothing changed, when `dst` owns an address of its own or either port
    /// already takes part in a hand-over.
    pub fn start_handover(&mut self, src: u16, dst: u16, now_ns: u64) -> Result<(), Refusal> {
        for s in [src, dst] {
            if self.handovers.iter().any(|h| h.src == s || h.dst == s) {
                return Err(Refusal::Busy(s));
            }
        }
        if let Some(m) = self.macs.any_of(dst, now_ns) {
            return Err(Refusal::Owns("MAC", format_mac(m)));
        }
        if let Some(ip) = self.ips.any_of(dst, now_ns) {
            return Err(Refusal::Owns("IP", key_ip(ip).to_string()));
        }
        self.macs.bequeath(src, dst, now_ns);
        self.ips.bequeath(src, dst, now_ns);
        self.handovers.push(Handover { src, dst });
        Ok(())
    }

    /// Completes the hand-over to `dst` (its first frame from an inherited address): every
    /// address of it moves to `dst`, and the source loses them.
    pub fn complete_handover(&mut self, dst: u16) {
        self.macs.inherit(dst);
        self.ips.inherit(dst);
        let (done, going): (Vec<Handover>, Vec<Handover>) =
            self.handovers.iter().partition(|h| h.dst == dst);
        self.handovers = going;
        self.finished += done.len() as u64;
        self.done.extend(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::ipv4_key;
    use crate::l2::{IpTable, MacTable};

    const M: u64 = 0x02_00_00_00_00_0a;

    fn tables() -> Addresses {
        Addresses::new(MacTable::new(16, 4, 1_000), IpTable::new(16, 4, 1_000))
    }

    /// A third port (3) never gets the address, whatever step the hand-over (1 → 2) is at;
    /// during it not even by an assignment (which outranks a first-come lock otherwise).
    fn third_is_refused(t: &mut Addresses, now: u64, handing_over: bool) {
        assert!(matches!(t.macs.learn(M, 3, now), Learnt::Owned(_)));
        assert!(matches!(t.macs.pin(M, 3, false, now), Learnt::Owned(_)));
        if handing_over {
            assert!(matches!(t.macs.pin(M, 3, true, now), Learnt::Owned(_)));
            let ip = ipv4_key([10, 0, 0, 5]);
            assert!(matches!(t.ips.pin(ip, 3, true, now), Learnt::Owned(_)));
        }
    }

    #[test]
    fn the_heir_co_owns_then_takes_everything_at_its_first_frame() {
        let mut t = tables();
        let ip = ipv4_key([10, 0, 0, 5]);
        assert_eq!(t.macs.pin(M, 1, false, 0), Learnt::Yes);
        assert_eq!(t.ips.pin(ip, 1, false, 0), Learnt::Yes);
        third_is_refused(&mut t, 10, false);
        t.start_handover(1, 2, 10).unwrap();
        third_is_refused(&mut t, 20, true);
        // Both own it: the source refreshes, the heir is told it inherits.
        assert_eq!(t.macs.learn(M, 1, 20), Learnt::Yes);
        assert_eq!(t.macs.learn(M, 2, 20), Learnt::Inherited);
        assert_eq!(t.ips.pin(ip, 2, false, 20), Learnt::Inherited);
        assert_eq!(
            t.macs.lookup(M, 20),
            Some(1),
            "frames still go to the source"
        );
        assert_eq!(t.handovers, vec![Handover { src: 1, dst: 2 }]);
        t.complete_handover(2);
        third_is_refused(&mut t, 30, false);
        assert_eq!(t.macs.lookup(M, 30), Some(2));
        assert_eq!(t.ips.lookup(ip, 30), Some(2));
        assert_eq!(
            t.macs.learn(M, 1, 30),
            Learnt::Owned(2),
            "the source lost it"
        );
        assert_eq!((t.macs.port_len(1), t.macs.port_len(2)), (0, 1));
        assert_eq!((t.handovers.len(), t.done.len(), t.finished), (0, 1, 1));
        // Pinned as it was: it never ages.
        t.expire(1_000_000);
        assert_eq!(t.macs.lookup(M, 1_000_000), Some(2));
    }

    #[test]
    fn removing_the_source_completes_and_removing_the_heir_cancels() {
        let mut t = tables();
        assert_eq!(t.macs.pin(M, 1, false, 0), Learnt::Yes);
        t.start_handover(1, 2, 0).unwrap();
        t.purge_slot(2);
        assert_eq!(
            t.macs.lookup(M, 5),
            Some(1),
            "cancelled: the source keeps it"
        );
        assert_eq!(t.macs.learn(M, 2, 5), Learnt::Owned(1));
        assert_eq!((t.handovers.len(), t.finished), (0, 1));
        t.start_handover(1, 2, 5).unwrap();
        t.purge_slot(1);
        assert_eq!(
            t.macs.lookup(M, 6),
            Some(2),
            "the source went: the heir has it"
        );
        assert_eq!(t.macs.learn(M, 3, 6), Learnt::Owned(2));
        assert_eq!(t.macs.port_len(2), 1);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut t = tables();
        assert_eq!(t.macs.pin(M, 1, false, 0), Learnt::Yes);
        assert_eq!(t.macs.learn(M + 1, 2, 0), Learnt::Yes);
        assert_eq!(
            t.start_handover(1, 2, 10),
            Err(Refusal::Owns("MAC", "02:00:00:00:00:0b".into()))
        );
        assert_eq!(t.macs.learn(M, 2, 10), Learnt::Owned(1), "no heir was set");
        t.start_handover(1, 3, 10).unwrap();
        assert_eq!(t.start_handover(1, 4, 10), Err(Refusal::Busy(1)));
        assert_eq!(t.start_handover(4, 3, 10), Err(Refusal::Busy(3)));
        assert_eq!(t.handovers.len(), 1);
    }
}
