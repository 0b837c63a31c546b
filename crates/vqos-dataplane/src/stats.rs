//! What the loops publish: a [`SwitchStats`] per shard, every stats interval and right after a
//! change, and [`merge`], which makes one snapshot of them.
//!
//! The statistics types are the API's (`vqos_api::stats`, re-exported here): one definition
//! that the data plane fills, the daemon serves, `/metrics` exports and the CLI reads, with no
//! conversion on the way. They live in `vqos-api` because the API's clients build without the
//! data plane; this crate depends on `vqos-api` for them. The loop counts straight into
//! [`PortCounters`] (its port table) and [`LoopStats`] (its own counters); the rest of a
//! [`PortStats`] (rates, engine state, the port kind's status, locks, queue depths) is filled
//! when a snapshot is taken ([`crate::Switch::stats`]). What only the data plane needs stays in
//! its own types and out of the snapshot: the ports' own I/O counters
//! ([`crate::PortIoCounters`], of which `uring_failures` is published), the applied policies
//! ([`crate::Switch::policies`]), the ECN thresholds ([`crate::Switch::ecn_probability`]) and
//! the count of applied snapshots ([`crate::Switch::policy_epoch`]).

use std::sync::Arc;

pub use vqos_api::stats::{
    DropCounters, DropReason, LoopStats, PortCounters, PortStats, SwitchStats,
};
pub use vqos_api::wire::HandoverView;

use crate::config::Locks;
use crate::port::PortStatus;
use crate::ports::RATE_SAMPLES;
use crate::switch::Switch;

/// A port's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortRole {
    /// The shared link to the outside.
    Uplink,
    /// A tenant's interface, scheduled by the engine.
    Vif,
}

/// One snapshot of a switch from its shards' (shard 0 first): each port's counters, rates,
/// `uring_failures` and queue depths added up over the shards (every shard counts what it sent
/// to a port and holds its own queue for it, the shard that reads it what it read; the I/O
/// counters of a port's queues are its shards'), its engine state, status and locks from the
/// shard that reads it (an `AF_PACKET` uplink read by several shards: each reader's counts
/// added up); the loops side by side; the oldest time; the MAC table's size from shard 0 (the
/// table is shared).
pub fn merge(shards: &[Arc<SwitchStats>]) -> SwitchStats {
    let Some(first) = shards.first() else {
        return SwitchStats::default();
    };
    let mut out = (**first).clone();
    for (i, s) in shards.iter().enumerate().skip(1) {
        out.time_ns = out.time_ns.min(s.time_ns);
        out.loops.extend(s.loops.iter().cloned());
        for (k, p) in s.ports.iter().enumerate() {
            // Every shard lists the ports in slot order: the same position, unless a
            // control call is half-way through the shards.
            let at = match out.ports.get(k) {
                Some(o) if o.name == p.name => Some(k),
                _ => out.ports.iter().position(|o| o.name == p.name),
            };
            let Some(o) = at.and_then(|k| out.ports.get_mut(k)) else {
                continue;
            };
            o.counters.add(&p.counters);
            o.uring_failures += p.uring_failures;
            o.rate_bps += p.rate_bps;
            o.tx_rate_bps += p.tx_rate_bps;
            o.queued_frames += p.queued_frames;
            o.queued_bytes += p.queued_bytes;
            if let (Some(PortStatus::AfPacket(a)), Some(PortStatus::AfPacket(b))) =
                (&mut o.status, &p.status)
            {
                // The uplink read by several shards (fanout): one socket each.
                a.add(b);
            } else if let (Some(PortStatus::Tap(a)), Some(PortStatus::Tap(b))) =
                (&mut o.status, &p.status)
            {
                // A TAP whose queues are read on several shards: each counts its own.
                a.add(b);
            } else if p.shard == i {
                // A port's state is its home shard's.
                o.credit = p.credit;
                o.throttled = p.throttled;
                o.status = p.status.clone();
                o.locked = p.locked.clone();
                o.handover = p.handover.clone();
            }
        }
    }
    out
}

impl Switch {
    /// Policy snapshots applied so far (port changes included): grows by one per change.
    pub fn policy_epoch(&self) -> u64 {
        self.policy_epoch
    }

    /// The CE-marking probability this shard applies to the frames of the vif called `name`
    /// (0 until one is set; [`Switch::set_ecn_probabilities`]); `None` for the uplink and for
    /// a port it does not know.
    pub fn ecn_probability(&self, name: &str) -> Option<f64> {
        let s = self.ports.get(self.slot_of(name)?)?;
        s.global_vif?;
        // The threshold is the probability scaled to 2^32 (exact for 0 and 1).
        Some(s.ecn_threshold as f64 / 4_294_967_296.0)
    }

    /// True when a stats snapshot is due (every `stats_interval_ns`, and right after a
    /// change).
    pub fn stats_due(&self, now_ns: u64) -> bool {
        now_ns >= self.next_stats_ns
    }

    /// A snapshot of every port and the loop. Ports whose last read failed are retried from
    /// here (their frames may still wait, and an edge-triggered descriptor will not say so).
    pub fn stats(&mut self, now_ns: u64) -> SwitchStats {
        self.next_stats_ns = now_ns + self.stats_interval_ns;
        let mut ports = Vec::new();
        let heirs: Vec<(usize, String)> = (self.ports.iter())
            .filter_map(|(_, s)| s.heir.map(|(h, _)| (h, self.port_name(h))))
            .collect();
        for (slot, s) in self.ports.iter_mut_slots() {
            if s.local && s.rx_failed {
                s.rx_failed = false;
                s.ready = true;
                if let Some(v) = s.vif {
                    self.sched.set_ready(v, true);
                }
            }
            let oldest = s.rate_hist[s.rate_pos];
            s.rate_hist[s.rate_pos] = (now_ns, s.c.rx_bytes, s.c.tx_bytes);
            s.rate_pos = (s.rate_pos + 1) % RATE_SAMPLES;
            let dt = now_ns.saturating_sub(oldest.0).max(1);
            // bytes < 2^64, ×8e9 fits in u128.
            let rate = |b: u64| (u128::from(b) * 8_000_000_000 / u128::from(dt)) as u64;
            // The depth of this shard's own queue to the vif.
            let depth = match (&self.downlink, s.global_vif) {
                (Some(d), Some(v)) => d.depth(v),
                _ => Default::default(),
            };
            // The port's own counters and status from the shard that reads it, and the
            // counters of a transmit queue of this shard's own.
            let (io, status) = if s.local || s.own_queue {
                let p = s.port.lock();
                (p.counters(), p.status())
            } else {
                Default::default()
            };
            // No engine state (the uplink, a vif another shard reads) reads as credit 0.
            let engine = s.vif.map(|v| self.sched.vif_state(v)).unwrap_or_default();
            ports.push(PortStats {
                name: s.name.clone(),
                counters: s.c,
                uring_failures: io.uring_failures,
                rate_bps: rate(s.c.rx_bytes - oldest.1),
                tx_rate_bps: rate(s.c.tx_bytes - oldest.2),
                // The engines report i64::MAX for a vif they keep no bucket for.
                credit: (engine.credit != i64::MAX).then_some(engine.credit),
                throttled: engine.throttled,
                status,
                locked: match (s.local, s.carriers.count_ones() > 1) {
                    (false, _) => Default::default(),
                    (true, false) => s.locks().addrs(),
                    // Read on several shards: the port's list is the shared one.
                    (true, true) => (self.addrs.lock().locks.get(slot as u16))
                        .map(Locks::addrs)
                        .unwrap_or_default(),
                },
                shard: s.home,
                readers: std::iter::once(s.home)
                    .chain((0..64).filter(|&t| t != s.home && s.carriers & (1 << t) != 0))
                    .collect(),
                queued_frames: depth.frames,
                queued_bytes: depth.bytes,
                handover: s
                    .heir
                    .filter(|_| s.local)
                    .map(|(h, complete)| HandoverView {
                        to: heirs
                            .iter()
                            .find(|(slot, _)| *slot == h)
                            .map_or_else(String::new, |(_, n)| n.clone()),
                        complete,
                    }),
            });
        }
        SwitchStats {
            time_ns: Some(now_ns),
            ports,
            loops: vec![self.counters.clone()],
            mac_entries: self.addrs.lock().macs.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests;
