//! Re-placing ports when ports go: what a shard reads of a vif moves to another shard.
//!
//! New ports are read by the shard reading the fewest vif queues (`crate::shards`), so ports
//! coming keep the shards even; ports going can leave one shard with all of them (two
//! shards, four ports, the two of shard 1 removed). After each removal the placement moves
//! what shards read, one port or queue at a time, from the most loaded shard to the least
//! loaded while they differ by two or more (OVS re-assigns its rx queues to PMD threads on
//! every port change in the same spirit). A shard's load is the receive queues it reads: a
//! vif read on several shards (its queues spread, `crate::spread`) counts on each, and each
//! of its readers can move, to a shard that does not read it yet.
//!
//! ## Behavior
//! A move of what shard A reads of vif `name` (the port itself on its home, a queue lent to
//! it elsewhere) to shard B, between batches on each ([`Op::Rehome`]):
//! 1. **A lets go**: it stops reading the port or queue, keeps a transmit handle to send to
//!    it ([`PortIo::for_sender`]), and gives it and the first-come locks it holds to the
//!    control thread. Its engine forgets the vif; its counters stay (the stats add every
//!    shard's), so nothing counted is lost.
//! 2. **B takes it**: it replaces B's transmit handle, B reads it (ready at once: frames that
//!    waited in its queue while no shard read it are read now, none is lost), its engine runs
//!    the vif under the same policy (its part of it, for a vif read on several shards), the
//!    locks become B's, and B floods at most its part of the port's storm budget.
//! 3. **The others learn** that B reads it instead of A (the home moves with the port: A was
//!    the home). The capacity balance divides the vif's rate among its readers as before.
//!
//! Frames are never between shards at a move: a shard holds none of a vif's frames between
//! two batches on the uplink side (it reads a vif only when its engine grants it), and the
//! frames queued for the vif on each shard's downlink stay there and go out through that
//! shard's handle. What restarts on B is the engine's own state for the vif (its credit or
//! bucket level), as after a policy change. The locks of a vif read on several shards are
//! the port's one list under the address tables' mutex (`crate::l2::SharedLocks`); what A
//! hands over is its cache of it.
//!
//! ## What is not moved
//! - A port an operator placed (`thread = N`), all its queues: the operator's choice stands.
//! - A vif whose identity is being handed over (`vqos port migrate`, `crate::migrate`).
//!
//! A refused move changes nothing and the placement tries another port.

use std::sync::Arc;

use crate::config::Locks;
use crate::control::{Answer, Op};
use crate::error::SwitchError;
use crate::l2::AddrKey;
use crate::ports::PortIo;
use crate::shards::{Caller, Placement};
use crate::switch::Switch;

/// A port on its way from its old home to its new one, with the locks its vif took.
pub(crate) struct Given {
    /// The port (its receive side).
    pub port: Arc<PortIo>,
    /// The first-come locks its addresses hold.
    pub locks: Locks,
}

/// A refused move: why, and the port it was given, handed back.
pub(crate) type Refused = (SwitchError, Option<Given>);

/// What one shard did in a move.
pub(crate) enum Rehomed {
    /// It read the port and let go of it.
    Gave(Given),
    /// It reads the port now; its transmit handle (and whether it was a queue of its own) is
    /// no longer needed.
    Took(Arc<PortIo>, bool),
    /// It learnt who reads the port.
    Learnt,
}

impl Switch {
    /// What shard `from` reads of vif `name` is read by shard `to` from now on
    /// ([`Op::Rehome`]): this shard lets go of it (it is `from`), takes it (it is `to`:
    /// `given` is the port or queue), or learns of it. Returns the slot and what this shard
    /// did; on refusal nothing changed and `given` comes back with the error.
    pub(crate) fn rehome(
        &mut self,
        name: &str,
        (from, to): (usize, usize),
        given: Option<Given>,
        now_ns: u64,
    ) -> Result<(usize, Rehomed), Box<Refused>> {
        let (slot, gives) = match self.check_move(name, from, to) {
            Ok(found) => found,
            Err(e) => return Err(Box::new((e, given))),
        };
        let shard = self.shard;
        let done = match given {
            _ if gives => Rehomed::Gave(self.give_up(slot, None)),
            Some(g) if shard == to => {
                let (old, own) = self.take(slot, g, now_ns);
                Rehomed::Took(old, own)
            }
            None if shard == to => {
                let why = format!("'{name}' moves to thread {to} without its port");
                return Err(Box::new((SwitchError::Threads(why), None)));
            }
            _ => Rehomed::Learnt,
        };
        self.move_reader(slot, from, to);
        // The vif leaves this shard's engine, joins it, or is divided as read by `to`. The
        // engine accepted the same set with the vif on the other shard: a refusal is a bug,
        // reported, and this shard is put back as it was.
        if let Err(e) = self.apply_policies(self.policies.clone(), now_ns) {
            self.move_reader(slot, to, from);
            let back = match done {
                Rehomed::Gave(g) => {
                    drop(self.take(slot, g, now_ns));
                    None
                }
                Rehomed::Took(old, own) => Some(self.give_up(slot, Some((old, own)))),
                Rehomed::Learnt => None,
            };
            let _ = self.apply_policies(self.policies.clone(), now_ns);
            return Err(Box::new((e, back)));
        }
        Ok((slot, done))
    }

    /// The slot of vif `name` and whether this shard gives up what it reads of it to move it
    /// to `to`; refused for the uplink, an unknown port, a shard that does not exist or
    /// already reads the vif, a `from` that does not read it, and on `from` for a vif being
    /// handed over.
    fn check_move(&self, name: &str, from: usize, to: usize) -> Result<(usize, bool), SwitchError> {
        let refuse = |why: String| SwitchError::Threads(format!("'{name}' {why}"));
        let slot = match self.ports.index_of(name) {
            Some(0) => return Err(SwitchError::Uplink(name.to_string())),
            Some(i) => i,
            None => return Err(SwitchError::UnknownPort(name.to_string())),
        };
        let Some(s) = self.ports.get(slot) else {
            return Err(SwitchError::UnknownPort(name.to_string()));
        };
        let shards = self.balance.shards().min(64);
        if to >= shards || from >= shards {
            let why = format!("cannot move from thread {from} to thread {to}: no such thread");
            return Err(refuse(why));
        }
        if s.carriers & (1 << from) == 0 {
            return Err(refuse(format!("is not read by thread {from}")));
        }
        if from != to && s.carriers & (1 << to) != 0 {
            return Err(refuse(format!("is read by thread {to} already")));
        }
        if self.shard == from && from != to && !s.local {
            let why = format!("is not read here (thread {from}): nothing to give up");
            return Err(refuse(why));
        }
        let gives = s.local && self.shard == from && from != to;
        if gives && s.heir.is_some() {
            let why = format!("is being handed over: it stays on thread {}", self.shard);
            return Err(refuse(why));
        }
        Ok((slot, gives))
    }

    /// Stops reading the port in `slot` and sends to it through `sender` (`None`: a
    /// transmit handle of its own, [`PortIo::for_sender`]); returns the port and its locks.
    fn give_up(&mut self, slot: usize, sender: Option<(Arc<PortIo>, bool)>) -> Given {
        self.balance.forget(slot);
        let s = self.ports.get_mut(slot).expect("a port in its slot");
        let (sender, own_queue) = sender.unwrap_or_else(|| PortIo::for_sender(&s.port));
        let locks = s.locks();
        let port = std::mem::replace(&mut s.port, sender);
        s.own_queue = own_queue;
        s.local = false;
        s.fd = None;
        s.ready = false;
        s.rx_failed = false;
        s.storm = None;
        Given { port, locks }
    }

    /// Reads the port in `slot` from now on (`given`); returns the transmit handle it used
    /// and whether it was a queue of its own.
    fn take(&mut self, slot: usize, given: Given, now_ns: u64) -> (Arc<PortIo>, bool) {
        // A move changes who reads, not how many: this reader floods at most its part.
        let readers = self.ports.get(slot).map_or(1, |s| s.carriers.count_ones());
        let storm = self.storm_part(readers, now_ns);
        let s = self.ports.get_mut(slot).expect("a port in its slot");
        s.fd = given.port.lock().readiness_fd();
        let old = (std::mem::replace(&mut s.port, given.port), s.own_queue);
        s.own_queue = false;
        s.local = true;
        // Frames may already wait: no shard read the port while it moved.
        s.ready = true;
        let macs = given.locks.macs.into_iter().map(AddrKey::Mac);
        for a in macs.chain(given.locks.ips.into_iter().map(AddrKey::Ip)) {
            s.lock(a);
        }
        s.storm = storm;
        old
    }

    /// The port in `slot` is polled, not watched (its descriptor could not be registered).
    pub(crate) fn poll_only(&mut self, slot: usize) {
        if let Some(s) = self.ports.get_mut(slot) {
            s.fd = None;
        }
    }

    /// Shard `to` reads in `from`'s place; the home moves with it when `from` was the home.
    fn move_reader(&mut self, slot: usize, from: usize, to: usize) {
        if let Some(s) = self.ports.get_mut(slot) {
            s.carriers = (s.carriers & !(1 << from)) | (1 << to);
            if s.home == from {
                s.home = to;
            }
        }
    }
}

impl Placement {
    /// Moves what shards read, one port or queue at a time, from the most loaded shard to
    /// the least loaded while they differ by two or more (a shard's load is the receive
    /// queues it reads: a vif read on several shards counts on each); ports an operator
    /// placed stay. The newest port (highest slot) moves first, and only to a shard that does
    /// not read it yet. Returns the moves made (name, from, to). A port a shard refuses to
    /// move is left and another one tried.
    pub fn rebalance(&mut self, c: &mut dyn Caller) -> Vec<(String, usize, usize)> {
        let mut moved = Vec::new();
        let mut stuck: Vec<String> = Vec::new();
        loop {
            let load = self.load();
            let (Some(most), Some(least)) = (
                (0..load.len()).max_by_key(|&i| (load[i], std::cmp::Reverse(i))),
                (0..load.len()).min_by_key(|&i| (load[i], i)),
            ) else {
                return moved;
            };
            if load[most] < load[least] + 2 {
                return moved;
            }
            // The port in the highest slot first: the newest, its state the least settled.
            let (from, to) = (1u64 << most, 1u64 << least);
            let pick = self
                .homes
                .iter()
                .filter(|(_, h)| h.readers & from != 0 && h.readers & to == 0)
                .filter(|(n, h)| !h.pinned && !stuck.contains(n))
                .max_by_key(|(_, h)| h.slot)
                .map(|(n, _)| n.clone());
            let Some(name) = pick else {
                return moved;
            };
            match self.move_reader(c, &name, most, least) {
                Ok(()) => moved.push((name, most, least)),
                Err(_) => stuck.push(name),
            }
        }
    }

    /// Moves what shard `from` reads of vif `name` (the port, or a queue lent to it) to shard
    /// `to` (see the module docs); when `from` or `to` refuses, every shard is as before (a
    /// refusal by a shard that only learns of the move is a bug, reported after the move).
    pub fn move_reader(
        &mut self,
        c: &mut dyn Caller,
        name: &str,
        from: usize,
        to: usize,
    ) -> Result<(), SwitchError> {
        if !self.homes.contains_key(name) {
            return Err(SwitchError::UnknownPort(name.to_string()));
        }
        let op = |from, to, given| Op::Rehome {
            name: name.to_string(),
            from,
            to,
            given,
        };
        let a = self.call(c, from, op(from, to, None));
        a.result?;
        let Some(given) = a.given else {
            return Err(SwitchError::Threads(format!(
                "thread {from} did not give '{name}' up"
            )));
        };
        let b: Answer = self.call(c, to, op(from, to, Some(given)));
        if let Err(e) = b.result {
            // It comes back: `from`, which took it as read by `to`, takes it back.
            let Some(given) = b.given else {
                return Err(e);
            };
            return match self.call(c, from, op(to, from, Some(given))).result {
                Ok(()) => Err(e),
                // Both engines refused a set they had accepted (a bug): say what is unread.
                Err(back) => Err(SwitchError::Threads(format!(
                    "'{name}': thread {to} refused it ({e}) and thread {from} could not take \
                     it back ({back}): it is not read until it is added again"
                ))),
            };
        }
        // `from` and `to` have moved it: the placement says so whatever the others answer.
        if let Some(h) = self.homes.get_mut(name) {
            h.readers = (h.readers & !(1 << from)) | (1 << to);
            if h.shard == from {
                h.shard = to;
            }
        }
        for i in (0..self.shards).filter(|&i| i != from && i != to) {
            // Validated the same way on every shard: a refusal here is a bug; say so.
            self.call(c, i, op(from, to, None)).result?;
        }
        Ok(())
    }
}
