//! What the loop publishes: [`SwitchStats`], a snapshot taken at least every 50 ms.

use serde::Serialize;
pub use vqos_api::stats::{DropCounters, DropReason};
use vqos_sched::{EngineKind, VifEngineState, VifPolicy};

use crate::config::Locks;
use crate::port::{PortIoCounters, PortStatus};

/// A port's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PortRole {
    /// The shared link to the outside.
    Uplink,
    /// A tenant's interface, scheduled by the engine.
    Vif,
}

/// What went through a port, as the loop counts it (one definition for the loop's own table
/// and for [`PortStats`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PortCounters {
    /// Frames read from the port (dropped ones included).
    pub rx_frames: u64,
    /// Bytes read from the port as they are on the wire (`frame::wire_bytes`: Ethernet headers
    /// counted per GSO segment, virtio-net header, preamble, IFG and FCS not counted).
    pub rx_bytes: u64,
    /// Frames written to the port.
    pub tx_frames: u64,
    /// Bytes written to the port as they are on the wire (as `rx_bytes`).
    pub tx_bytes: u64,
    /// Drops by reason.
    pub drops: DropCounters,
    /// Frames marked ECN CE: by the engine on ingress, or with the vif's ECN probability on
    /// either of its directions (frames to the vif, frames from it to the uplink). A GSO
    /// super-frame counts once; every segment cut from it carries CE.
    pub ecn_marked: u64,
    /// Frames chosen for CE marking but not ECN-capable (Not-ECT, or not IP): left unmarked.
    pub ecn_not_ect: u64,
    /// Reads from the port that failed (retried every stats interval).
    pub rx_errors: u64,
    /// Source MAC addresses from this port not learnt because the port's share of the MAC
    /// table (or the table) was full; frames to them are flooded. Not a drop.
    pub mac_learn_refused: u64,
    /// Frames waiting in the vif's downlink queue now (a gauge; every shard's queue added
    /// up; 0 without the scheduled downlink).
    pub queued_frames: u64,
    /// Their bytes on the wire (a gauge).
    pub queued_bytes: u64,
}

/// One port's counters and state.
#[derive(Debug, Clone, Serialize)]
pub struct PortStats {
    /// Port name.
    pub name: String,
    /// Uplink or vif.
    pub role: PortRole,
    /// Vif id in the current policy set (vifs only).
    pub vif: Option<usize>,
    /// The vif's policy (vifs only).
    pub policy: Option<VifPolicy>,
    /// What went through the port and what was dropped.
    #[serde(flatten)]
    pub counters: PortCounters,
    /// Probability of CE marking of the vif's data, to it from the uplink and from it to the
    /// uplink (vifs only).
    pub ecn_probability: f64,
    /// The engine's view of the vif (credit, throttled).
    pub engine: Option<VifEngineState>,
    /// Receive rate over the last ~100 ms, bits per second.
    pub rx_rate_bps: u64,
    /// Transmit rate over the last ~100 ms, bits per second.
    pub tx_rate_bps: u64,
    /// The port's own I/O counters.
    pub io: PortIoCounters,
    /// The port kind's own status ([`crate::Port::status`]; vhost-user: connection, features,
    /// the guest's misbehaviour counters), under the kind's name (`vhost_user`, `af_packet`);
    /// absent for TAPs.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub status: Option<PortStatus>,
    /// The addresses port security locked to it first come (not its configured ones): what
    /// the daemon persists so that a restart gives them back before the port forwards.
    #[serde(skip_serializing_if = "Locks::is_empty")]
    pub locked: Locks,
    /// The shard (forwarding thread) that reads the port.
    pub shard: usize,
    /// The hand-over of its identity to another port (`vqos port migrate`), if one was made
    /// and the port is still there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverStats>,
}

/// A source port's hand-over ([`PortStats::handover`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HandoverStats {
    /// The port its identity goes to.
    pub to: String,
    /// The destination carried its first frame: the addresses are its own, this port may
    /// claim none.
    pub complete: bool,
}

/// The poll loop's counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoopStats {
    /// Loop iterations.
    pub iterations: u64,
    /// Batches read (from vifs and from the uplink).
    pub bursts: u64,
    /// Frames read in those batches.
    pub burst_frames: u64,
    /// Cycles spent in iterations that did work.
    pub busy_cycles: u64,
    /// Cycles spent in iterations that found nothing to do (waiting included).
    pub idle_cycles: u64,
    /// Unit of the cycle counters: `tsc` (x86_64 rdtsc) or `ns`.
    pub cycles_unit: &'static str,
    /// Engine ticks run.
    pub engine_ticks: u64,
    /// Times the engine refused every ready vif.
    pub engine_refusals: u64,
    /// Times the uplink capacity bucket held vif traffic back.
    pub capacity_waits: u64,
    /// Control commands applied.
    pub commands: u64,
    /// Epoll waits that failed (each returned no event; the loop goes round again).
    pub epoll_errors: u64,
    /// The kernel refused `epoll_pwait2` (< 5.11, seccomp): `epoll_wait` with millisecond
    /// timeouts (rounded up) is used instead.
    pub epoll_wait_fallback: bool,
}

/// A snapshot of the whole switch.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchStats {
    /// Loop clock when taken, ns since the switch started.
    pub time_ns: u64,
    /// Counts applied policy snapshots (port changes included); grows by one per change.
    pub policy_epoch: u64,
    /// The engine.
    pub engine: EngineKind,
    /// Uplink capacity, bits per second (`None` = unlimited).
    pub capacity_bps: Option<u64>,
    /// Learnt MAC addresses.
    pub mac_entries: usize,
    /// Every port, uplink first.
    pub ports: Vec<PortStats>,
    /// The loops' counters added up.
    #[serde(rename = "loop")]
    pub loop_stats: LoopStats,
    /// Each loop (shard) on its own, shard 0 first.
    pub loops: Vec<LoopStats>,
}

impl PortCounters {
    /// Adds `o`'s counts to these (one port's counters from every shard).
    pub fn add(&mut self, o: &PortCounters) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.tx_frames += o.tx_frames;
        self.tx_bytes += o.tx_bytes;
        self.drops.add(&o.drops);
        self.ecn_marked += o.ecn_marked;
        self.ecn_not_ect += o.ecn_not_ect;
        self.rx_errors += o.rx_errors;
        self.mac_learn_refused += o.mac_learn_refused;
        self.queued_frames += o.queued_frames;
        self.queued_bytes += o.queued_bytes;
    }
}

impl LoopStats {
    /// Adds `o`'s counts to these (the loops added up).
    fn add(&mut self, o: &LoopStats) {
        self.iterations += o.iterations;
        self.bursts += o.bursts;
        self.burst_frames += o.burst_frames;
        self.busy_cycles += o.busy_cycles;
        self.idle_cycles += o.idle_cycles;
        self.engine_ticks += o.engine_ticks;
        self.engine_refusals += o.engine_refusals;
        self.capacity_waits += o.capacity_waits;
        self.commands += o.commands;
        self.epoll_errors += o.epoll_errors;
        self.epoll_wait_fallback |= o.epoll_wait_fallback;
    }
}

impl SwitchStats {
    /// One snapshot of a switch from its shards' (shard 0 first): each port's counters added
    /// up over the shards (every shard counts what it sent to a port, the shard that reads it
    /// what it read), its I/O counters added up over its queues, its engine state, status and
    /// locks from the shard that reads it; the loops side by side and added up; the oldest
    /// time.
    pub fn merge(shards: &[std::sync::Arc<SwitchStats>]) -> SwitchStats {
        let Some(first) = shards.first() else {
            return SwitchStats {
                time_ns: 0,
                policy_epoch: 0,
                engine: EngineKind::Rr,
                capacity_bps: None,
                mac_entries: 0,
                ports: Vec::new(),
                loop_stats: LoopStats::default(),
                loops: Vec::new(),
            };
        };
        if shards.len() == 1 {
            return (**first).clone();
        }
        let mut out = (**first).clone();
        out.loops = shards.iter().map(|s| s.loop_stats.clone()).collect();
        for (i, s) in shards.iter().enumerate().skip(1) {
            out.time_ns = out.time_ns.min(s.time_ns);
            out.loop_stats.add(&s.loop_stats);
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
                o.io.add(&p.io);
                o.rx_rate_bps += p.rx_rate_bps;
                o.tx_rate_bps += p.tx_rate_bps;
                if let (Some(PortStatus::AfPacket(a)), Some(PortStatus::AfPacket(b))) =
                    (&mut o.status, &p.status)
                {
                    // The uplink read by several shards (fanout): one socket each.
                    a.add(b);
                } else if p.shard == i {
                    // A port's state is its home shard's.
                    o.engine = p.engine;
                    o.status = p.status.clone();
                    o.locked = p.locked.clone();
                    o.handover = p.handover.clone();
                }
            }
        }
        out
    }

    /// The port called `name`.
    pub fn port(&self, name: &str) -> Option<&PortStats> {
        self.ports.iter().find(|p| p.name == name)
    }
}
