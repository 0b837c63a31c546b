//! `vqos port migrate SRC DST`: one vif's identity handed over to another vif, for a guest
//! that live-migrates from the source port to the destination port (docs/vhost-user.md,
//! "Live migration").
//!
//! ## Behavior
//! One control call ([`Switch::migrate_port`], [`crate::SwitchHandle::migrate_port`]),
//! applied between batches:
//! - the destination gets the source's **policy** (a copy: the guest keeps running on the
//!   source until the migration completes, under the same policy; the set must hold both);
//! - the destination gets the source's **port security** whole, its first-come locks
//!   included, and becomes the heir of every address the source owns, configured, locked or
//!   learnt (MAC and IP, [`crate::l2`]'s `handover`): both own them, no third port can claim
//!   them at any moment, frames to them still go to the source;
//! - the destination's first frame from one of them completes the hand-over: they all move
//!   to it, and at its next batch the shard that reads the source empties the source's own
//!   lists (it can claim nothing any more);
//! - removing the source completes it too, and adds the source's counters to the
//!   destination's (every shard its own), so the guest's totals continue there; removing
//!   the destination cancels it (the source keeps everything; the destination's copy of the
//!   policy goes with it).
//!
//! Refused, with nothing changed: an unknown port, the uplink on either side, a port
//! migrated to itself, a destination that owns or learnt an address of its own, a port
//! already in a hand-over. Any port kind can be either side: the hand-over is the switch's,
//! not the port's (a vhost-user guest moved by QEMU, a TAP guest restarted elsewhere).

use crate::control::Op;
use crate::error::SwitchError;
use crate::l2::handover::Refusal;
use crate::ports::{AddrGuard, Security};
use crate::switch::Switch;

/// What moves from the shard that reads the source to the one that reads the destination:
/// the source's port security with its locks.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// Source MACs.
    security: Security,
    /// Rules above layer 2.
    guard: Option<AddrGuard>,
}

/// A refusal of migrating `src` to `dst`, saying `reason`.
pub(crate) fn refused(src: &str, dst: &str, reason: impl Into<String>) -> SwitchError {
    SwitchError::Migrate {
        src: src.to_string(),
        dst: dst.to_string(),
        reason: reason.into(),
    }
}

impl Switch {
    /// The slots of vifs `src` and `dst`, checked (see the module docs).
    pub(crate) fn handover_slots(
        &self,
        src: &str,
        dst: &str,
    ) -> Result<(usize, usize), SwitchError> {
        let slot = |name: &str| match self.ports.index_of(name) {
            Some(0) => Err(SwitchError::Uplink(name.to_string())),
            Some(i) => Ok(i),
            None => Err(SwitchError::UnknownPort(name.to_string())),
        };
        let (s, d) = (slot(src)?, slot(dst)?);
        if s == d {
            return Err(refused(src, dst, "a port cannot be migrated to itself"));
        }
        for (i, name) in [(s, src), (d, dst)] {
            if self
                .ports
                .get(i)
                .is_some_and(|p| p.carriers.count_ones() > 1)
            {
                return Err(refused(
                    src,
                    dst,
                    format!(
                        "'{name}' is read on several threads (its queues are spread): its \
                         identity cannot move on every thread at once"
                    ),
                ));
            }
            let busy = self.ports.iter().any(|(j, p)| {
                (j == i && p.heir.is_some_and(|(_, done)| !done))
                    || p.heir.is_some_and(|(h, done)| h == i && !done)
            });
            if busy {
                return Err(refused(src, dst, format!("'{name}' is already migrating")));
            }
        }
        Ok((s, d))
    }

    /// Migrates vif `src`'s identity to vif `dst` on this switch alone (one shard; see the
    /// module docs): `dst` gets `src`'s policy and port security and co-owns its addresses
    /// until its first frame from one of them. On refusal nothing changed.
    pub fn migrate_port(&mut self, src: &str, dst: &str, now_ns: u64) -> Result<(), SwitchError> {
        self.handover_slots(src, dst)?;
        let before = self.policies.clone();
        let policy = self.policies.policy(self.policies.id(src)?).clone();
        self.set_policy(dst, policy, now_ns)?;
        if let Err(e) = self.handover(src, dst, None, now_ns) {
            let _ = self.apply_policies(before, now_ns);
            return Err(e);
        }
        Ok(())
    }

    /// Applies a hand-over on this shard ([`Op::Handover`]). Without `identity` this shard
    /// reads `src`: it starts the hand-over in the tables and returns `src`'s identity; with
    /// it, the shard marks the ports and, if it reads `dst`, gives it the identity.
    pub(crate) fn handover(
        &mut self,
        src: &str,
        dst: &str,
        identity: Option<Identity>,
        now_ns: u64,
    ) -> Result<Option<Identity>, SwitchError> {
        let (s, d) = self.handover_slots(src, dst)?;
        let taken = match identity {
            Some(_) => None,
            None => {
                let Some(p) = self.ports.get(s).filter(|p| p.local) else {
                    return Err(refused(
                        src,
                        dst,
                        "internal: asked of a shard that does not read it",
                    ));
                };
                let id = Identity {
                    security: p.security.clone(),
                    guard: p.guard.clone(),
                };
                let started = self.addrs.lock().start_handover(s as u16, d as u16, now_ns);
                started.map_err(|r| match r {
                    Refusal::Owns(kind, addr) => refused(
                        src,
                        dst,
                        format!(
                            "'{dst}' owns {kind} address {addr} (the destination must own no \
                             address: it takes the source's)"
                        ),
                    ),
                    Refusal::Busy(_) => refused(src, dst, "a port is already migrating"),
                })?;
                Some(id)
            }
        };
        let install = identity.as_ref().or(taken.as_ref());
        if let (Some(id), Some(p)) = (install, self.ports.get_mut(d).filter(|p| p.local)) {
            p.security = id.security.clone();
            p.guard = id.guard.clone();
        }
        if let Some(p) = self.ports.get_mut(s) {
            p.heir = Some((d, false));
        }
        self.next_stats_ns = now_ns;
        Ok(taken)
    }

    /// Ahead of removing slot `idx` from this shard: a source hands its counters to its heir
    /// (what this shard counted: rates continue, no jump); a hand-over to it is cancelled.
    pub(crate) fn handover_removal(&mut self, idx: usize) {
        let heir = self
            .ports
            .get(idx)
            .and_then(|p| p.heir.map(|(h, _)| (h, p.c)));
        if let Some((h, c)) = heir {
            if let Some(p) = self.ports.get_mut(h) {
                p.c.add(&c);
                for sample in &mut p.rate_hist {
                    sample.1 += c.rx_bytes;
                    sample.2 += c.tx_bytes;
                }
            }
        }
        for (_, p) in self.ports.iter_mut_slots() {
            if p.heir.is_some_and(|(h, _)| h == idx) {
                p.heir = None;
            }
        }
    }

    /// Between batches: a source whose hand-over its heir completed (on any shard) loses its
    /// own lists here, on the shard that reads it. One atomic load when nothing finished.
    pub(crate) fn apply_handovers(&mut self) {
        let finished = self.addrs.finished();
        if finished == self.handovers_seen {
            return;
        }
        self.handovers_seen = finished;
        let mut t = self.addrs.lock();
        let ports = &mut self.ports;
        t.done.retain(|h| {
            let s = usize::from(h.src);
            match ports.get_mut(s) {
                // Another shard's source: it takes it.
                Some(p) if !p.local => true,
                Some(p) => {
                    if p.heir == Some((usize::from(h.dst), false)) {
                        p.heir = Some((usize::from(h.dst), true));
                        p.security = Security::Fixed(Vec::new());
                        if let Some(g) = &mut p.guard {
                            g.v4 = Security::Fixed(Vec::new());
                            g.v6 = Security::Fixed(Vec::new());
                        }
                    }
                    false
                }
                None => false,
            }
        });
        drop(t);
        self.next_stats_ns = 0;
    }
}

/// The op that applies a hand-over on a shard.
pub(crate) fn op(src: &str, dst: &str, identity: Option<Identity>) -> Op {
    Op::Handover {
        src: src.to_string(),
        dst: dst.to_string(),
        identity,
    }
}
