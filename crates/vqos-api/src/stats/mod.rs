//! The statistics of the switch: per port ([`PortStats`]: [`PortCounters`], drops by
//! [`DropReason`], rates, engine state, the port kind's [`PortStatus`]) and per forwarding loop
//! ([`LoopStats`]), in one snapshot ([`SwitchStats`]).
//!
//! These are the one definition of the statistics. The data plane (`vqos-dataplane`) counts
//! into [`PortCounters`] and [`LoopStats`] on its hot path and fills the rest when it publishes
//! a snapshot; the daemon serves the snapshot as it is (`GET /v1/stats`, wrapped with what only
//! the daemon knows in `wire::PortStatsView`), `/metrics` reads it, and the CLI and the lab
//! read it back. They live here, not in the data plane, because the API's clients must build
//! without the data plane (this crate needs only serde and `vqos-sched`); the data plane
//! depends on this crate instead. What only the data plane needs (its per-port tables, rate
//! history, the port's own I/O counters, the applied policies and ECN thresholds) stays in the
//! data plane's own types and is not published here.
//!
//! The JSON is the API's contract (docs/api.md): the fields keep their order and names, maps
//! that were sorted by name (drops, vhost-user counters) still are, and a field added later
//! has a default so that an older daemon's answer still reads.

use serde::{Deserialize, Serialize};

use crate::wire::{HandoverView, LockedAddrs};

mod drops;
mod status;
#[cfg(test)]
mod tests;

pub use drops::{DropCounters, DropReason};
pub use status::{AfPacketStatus, PortStatus, TapStatus, VhostUserCounters, VhostUserStatus};

/// What went through a port, as the data plane counts it per frame (flattened into
/// [`PortStats`]). Each shard counts what it read from a port and what it wrote to it; a
/// snapshot adds them up ([`PortCounters::add`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    /// Frames read from the port (sent by the VM; dropped ones included).
    pub rx_frames: u64,
    /// Bytes read from the port as they are on the wire (Ethernet headers counted per GSO
    /// segment; virtio-net header, preamble, IFG and FCS not counted).
    pub rx_bytes: u64,
    /// Frames written to the port (delivered to the VM).
    pub tx_frames: u64,
    /// Of `tx_frames`, those the scheduled downlink sent without queueing them (cut-through:
    /// no queue of the shard held a frame and the engine granted the vif at once).
    #[serde(default)]
    pub tx_cut_through: u64,
    /// Bytes written to the port as they are on the wire (as `rx_bytes`).
    pub tx_bytes: u64,
    /// Frames dropped, by reason (`truncated`, `spoofed`, `policed`, ...).
    pub drops: DropCounters,
    /// Frames marked ECN CE: by the engine on ingress, or with the vif's ECN probability on
    /// either of its directions (frames to the vif, frames from it to the uplink). A GSO
    /// super-frame counts once; every segment cut from it carries CE.
    pub ecn_marked: u64,
    /// Frames chosen for CE marking but not ECN-capable (Not-ECT, or not IP): left unmarked.
    #[serde(default)]
    pub ecn_not_ect: u64,
    /// Reads from the port that failed (retried every stats interval).
    #[serde(default)]
    pub rx_errors: u64,
    /// Source MAC addresses from this port not learnt because the port's share of the MAC
    /// table (or the table) was full; frames to them are flooded. Not a drop.
    #[serde(default)]
    pub mac_learn_refused: u64,
}

impl PortCounters {
    /// Adds `o`'s counts to these (one port's counters from every shard).
    pub fn add(&mut self, o: &PortCounters) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.tx_frames += o.tx_frames;
        self.tx_cut_through += o.tx_cut_through;
        self.tx_bytes += o.tx_bytes;
        self.drops.add(&o.drops);
        self.ecn_marked += o.ecn_marked;
        self.ecn_not_ect += o.ecn_not_ect;
        self.rx_errors += o.rx_errors;
        self.mac_learn_refused += o.mac_learn_refused;
    }
}

/// One port's counters, gauges and state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStats {
    /// Interface name.
    pub name: String,
    /// What went through the port and what was dropped.
    #[serde(flatten)]
    pub counters: PortCounters,
    /// A TAP under `tap_io = "uring"`: 1 once its io_uring failed and it went back to one
    /// system call per frame for good (0 otherwise; every queue of the port added up).
    #[serde(default)]
    pub uring_failures: u64,
    /// Receive rate over the data plane's last ~100 ms (what the VM sends), bit/s.
    pub rate_bps: u64,
    /// Transmit rate over the last ~100 ms (what the VM receives), bit/s.
    pub tx_rate_bps: u64,
    /// Credit or tokens left in the engine's cost unit (negative: debt); `null` for a vif the
    /// engine keeps no bucket for (a `vqos` vif without a max).
    #[serde(default)]
    pub credit: Option<i64>,
    /// True while the engine refuses to serve the port.
    pub throttled: bool,
    /// What the port kind reports beyond its counters, under the kind's name: `vhost_user`
    /// (vhost-user ports), `af_packet` (the uplink on an existing interface) or `tap` (a
    /// multiqueue TAP); absent for single-queue TAPs and null ports.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PortStatus>,
    /// Addresses port security locked to it first come (not its configured ones): what the
    /// daemon persists so that a restart gives them back before the port forwards.
    #[serde(default, skip_serializing_if = "LockedAddrs::is_empty")]
    pub locked: LockedAddrs,
    /// The forwarding loop (`loops[]`, shard) that reads the port: its home thread.
    #[serde(default)]
    pub shard: usize,
    /// Every loop that reads one of its receive queues, home first: more than one for a vif
    /// whose queues are spread over the threads (docs/dataplane.md, "A vif read on several
    /// shards"). The uplink's readers are its kind's (`af_packet.readers`, `tap`). Absent in
    /// snapshots from before it was added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readers: Vec<usize>,
    /// Frames waiting in the vif's downlink queue now (a gauge; every shard's queue added up;
    /// 0 without the scheduled downlink).
    #[serde(default)]
    pub queued_frames: u64,
    /// Their bytes on the wire (a gauge).
    #[serde(default)]
    pub queued_bytes: u64,
    /// Its identity handed over to another port (`vqos port migrate`), while it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverView>,
}

/// Counters of one forwarding loop (a shard's poll loop).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopStats {
    /// Loop name: `loop0`, `loop1`, ... by shard.
    pub name: String,
    /// Cycles spent in iterations that did work.
    pub busy_cycles: u64,
    /// Cycles spent in iterations that found nothing to do (waiting included).
    pub idle_cycles: u64,
    /// Batches read (from vifs and from the uplink).
    pub bursts: u64,
    /// Unit of the cycle counters: `tsc` (x86_64 time-stamp counter) or `ns`.
    #[serde(default)]
    pub cycles_unit: String,
    /// Loop iterations.
    #[serde(default)]
    pub iterations: u64,
    /// Frames read in the bursts.
    #[serde(default)]
    pub burst_frames: u64,
    /// Engine ticks run.
    #[serde(default)]
    pub engine_ticks: u64,
    /// Times the engine refused every ready vif.
    #[serde(default)]
    pub engine_refusals: u64,
    /// Times the uplink capacity bucket held vif traffic back.
    #[serde(default)]
    pub capacity_waits: u64,
    /// Control commands applied (policy snapshots, port changes, ...).
    #[serde(default)]
    pub commands: u64,
    /// Epoll waits that failed (each returned no event; the loop goes round again).
    #[serde(default)]
    pub epoll_errors: u64,
    /// The kernel refused `epoll_pwait2` (< 5.11, seccomp): the loop waits with `epoll_wait`
    /// and millisecond timeouts (rounded up) instead.
    #[serde(default)]
    pub epoll_wait_fallback: bool,
}

impl LoopStats {
    /// Adds `o`'s counts to these (loops added up; the name and unit stay these).
    pub fn add(&mut self, o: &LoopStats) {
        self.busy_cycles += o.busy_cycles;
        self.idle_cycles += o.idle_cycles;
        self.bursts += o.bursts;
        self.iterations += o.iterations;
        self.burst_frames += o.burst_frames;
        self.engine_ticks += o.engine_ticks;
        self.engine_refusals += o.engine_refusals;
        self.capacity_waits += o.capacity_waits;
        self.commands += o.commands;
        self.epoll_errors += o.epoll_errors;
        self.epoll_wait_fallback |= o.epoll_wait_fallback;
    }
}

/// A snapshot of the whole switch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchStats {
    /// When the switch took this snapshot, ns on the switch's own monotonic clock (`None`: the
    /// backend has no clock of its own, as the mock). The controllers measure the counters at
    /// this time, so the publication delay does not distort their windows.
    #[serde(default)]
    pub time_ns: Option<u64>,
    /// Every port (vifs and the uplink), the uplink first.
    pub ports: Vec<PortStats>,
    /// Each loop (shard) on its own, shard 0 first.
    pub loops: Vec<LoopStats>,
    /// Learnt MAC addresses (0 for a backend without a MAC table, as the mock).
    #[serde(default)]
    pub mac_entries: u64,
}

impl SwitchStats {
    /// The port called `name`.
    pub fn port(&self, name: &str) -> Option<&PortStats> {
        self.ports.iter().find(|p| p.name == name)
    }

    /// The loops added up ([`LoopStats::add`]), named `all`.
    pub fn loops_total(&self) -> LoopStats {
        let mut all = LoopStats {
            name: "all".into(),
            cycles_unit: self
                .loops
                .first()
                .map(|l| l.cycles_unit.clone())
                .unwrap_or_default(),
            ..Default::default()
        };
        for l in &self.loops {
            all.add(l);
        }
        all
    }
}
