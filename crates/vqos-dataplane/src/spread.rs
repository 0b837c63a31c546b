//! A vif read on several shards: its receive queues spread over them.
//!
//! ## Behavior
//! A vif port with several receive queues (a multiqueue TAP: the guest's kernel spreads its
//! flows over them) is read by its home shard and, queue by queue, by the least loaded shards
//! not reading it yet (`Placement::spread`, after the port was added everywhere; re-placed
//! queue by queue when ports go, `crate::rehome`): each such shard
//! takes one queue ([`crate::Port::rx_queue`], which the port stops reading itself) and reads
//! and sends on it. Every shard learns which shards read the vif (`PortEntry::carriers`):
//! - the vif's rate and its floor and cap are divided among the shards that read it by the
//!   capacity balance ([`crate::balance`], the same division that divides what a vif
//!   receives among the downlinks that carry it);
//! - its first-come locks become one list under the address tables' mutex
//!   ([`crate::l2::SharedLocks`]), so that the port locks at most its `learn N` addresses
//!   whichever shards its frames arrive on;
//! - its counters are written by each reader and summed when read.
//!
//!
//! The uplink read on several shards (the scheduled downlink, an uplink with a receive queue
//! per shard) splits its storm budget the same way ([`Switch::set_uplink_readers`]).
//!
//! ## Limitations
//! A vif read on several shards cannot be handed over (`vqos port migrate`): its identity
//! would have to move on every shard at once.

use std::sync::Arc;

use crate::error::SwitchError;
use crate::ports::PortIo;
use crate::switch::Switch;

impl Switch {
    /// Shard `reader` now reads vif `name` too, on `io` (given to that shard only; the others
    /// learn that it does): the port's locks become shared, and the vif joins `reader`'s
    /// engine. Returns the slot and the transmit queue the new reader no longer needs.
    pub(crate) fn read_queue(
        &mut self,
        name: &str,
        reader: usize,
        io: Option<Arc<PortIo>>,
        now_ns: u64,
    ) -> Result<(usize, Option<Arc<PortIo>>), SwitchError> {
        let slot = match self.ports.index_of(name) {
            Some(0) => return Err(SwitchError::Uplink(name.to_string())),
            Some(i) => i,
            None => return Err(SwitchError::UnknownPort(name.to_string())),
        };
        if reader >= self.balance.shards().min(64) {
            return Err(SwitchError::Threads(format!(
                "no shard {reader} to read '{name}'"
            )));
        }
        let shard = self.shard;
        let Some(s) = self.ports.get_mut(slot) else {
            return Err(SwitchError::UnknownPort(name.to_string()));
        };
        if s.local {
            // What it locked alone so far becomes the whole port's list.
            self.addrs.lock().locks.share(slot as u16, s.locks());
        }
        s.carriers |= 1 << reader;
        let old = match io {
            Some(io) if reader == shard && !s.local => {
                s.fd = io.lock().readiness_fd();
                s.local = true;
                s.own_queue = true;
                // Frames may already wait: the edge may have passed before we watched.
                s.ready = true;
                Some(std::mem::replace(&mut s.port, io))
            }
            _ => None,
        };
        // Each reader floods at most its part of the port's storm budget.
        let (readers, local) = (s.carriers.count_ones(), s.local);
        if local {
            let storm = self.storm_part(readers, now_ns);
            if let Some(s) = self.ports.get_mut(slot) {
                s.storm = storm;
            }
        }
        // The vif joins this shard's engine (a reader), or runs under its part (the others).
        if let Err(e) = self.apply_policies(self.policies.clone(), now_ns) {
            // The engine refused (it accepted the same set before: a bug): not read here.
            if let (Some(old), Some(s)) = (old, self.ports.get_mut(slot)) {
                s.port = old;
                s.local = false;
                s.fd = None;
                s.carriers &= !(1 << reader);
            }
            return Err(e);
        }
        Ok((slot, old))
    }

    /// Whether this shard reads the uplink (shard 0 always; another when the uplink lent it a
    /// receive queue: the scheduled downlink on several threads).
    pub(crate) fn reads_uplink(&self) -> bool {
        self.ports.get(0).is_some_and(|s| s.local)
    }

    /// The uplink is read by the shards of `carriers` (a bit per shard): every shard's entry
    /// says so (the stats' `readers`), and on a reader the storm bucket holds its part of
    /// `storm_pps`, so the network floods the vifs no more through several readers than
    /// through one (as a vif read on several shards: [`Switch::read_queue`]).
    pub(crate) fn set_uplink_readers(&mut self, carriers: u64, now_ns: u64) {
        let reads = self.reads_uplink();
        let storm = self.storm_part(carriers.count_ones(), now_ns);
        if let Some(s) = self.ports.get_mut(0) {
            s.carriers = carriers;
            if reads {
                s.storm = storm;
            }
        }
    }
}
