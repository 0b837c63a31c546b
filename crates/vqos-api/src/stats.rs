//! The statistics the API reports (`GET /v1/stats`, `/metrics`): per port and per poll loop.
//! The daemon fills them from its switch (the data plane's own stats types are converted), so
//! clients need nothing of the data plane.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::wire::{HandoverView, LockedAddrs};

/// Counters and gauges of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStats {
    /// Interface name.
    pub name: String,
    /// Frames read from the port (sent by the VM).
    pub rx_frames: u64,
    /// Bytes read from the port.
    pub rx_bytes: u64,
    /// Frames written to the port (delivered to the VM).
    pub tx_frames: u64,
    /// Bytes written to the port.
    pub tx_bytes: u64,
    /// Frames dropped, by reason (`truncated`, `spoofed`, `policed`, ...).
    pub drops: BTreeMap<String, u64>,
    /// Frames of the port marked ECN CE: on their way to it, or from it to the uplink.
    pub ecn_marked: u64,
    /// Frames chosen for CE marking but not ECN-capable (left unmarked).
    #[serde(default)]
    pub ecn_not_ect: u64,
    /// Reads from the port that failed.
    #[serde(default)]
    pub rx_errors: u64,
    /// Source MACs from the port not learnt because its share of the MAC table was full
    /// (frames to them are flooded; not a drop).
    #[serde(default)]
    pub mac_learn_refused: u64,
    /// Recent rate read from the port (what the VM sends), bit/s.
    pub rate_bps: u64,
    /// Recent rate written to the port (what the VM receives), bit/s.
    pub tx_rate_bps: u64,
    /// Credit or tokens left in the engine's cost unit (negative: debt); `null` for a vif the
    /// engine keeps no bucket for (a `vqos` vif without a max).
    #[serde(default)]
    pub credit: Option<i64>,
    /// True while the engine refuses to serve the port.
    pub throttled: bool,
    /// vhost-user ports: connected, socket role and path, negotiated features, the guest's
    /// misbehaviour counters (the data plane's `VhostUserStatus`); absent for TAPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<serde_json::Value>,
    /// Addresses port security locked to it first come.
    #[serde(default, skip_serializing_if = "LockedAddrs::is_empty")]
    pub locked: LockedAddrs,
    /// The forwarding loop (`loops[]`, shard) that reads the port.
    #[serde(default)]
    pub shard: usize,
    /// Frames waiting in the vif's downlink queue now (scheduled downlink; 0 otherwise).
    #[serde(default)]
    pub queued_frames: u64,
    /// Their bytes on the wire.
    #[serde(default)]
    pub queued_bytes: u64,
    /// Its identity handed over to another port (`vqos port migrate`), while it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverView>,
}

/// Counters of one poll loop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopStats {
    /// Loop name (e.g. `pmd0`).
    pub name: String,
    /// Cycles spent in bursts that moved frames.
    pub busy_cycles: u64,
    /// Cycles spent polling without work.
    pub idle_cycles: u64,
    /// Bursts served.
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
    /// Epoll waits that failed.
    #[serde(default)]
    pub epoll_errors: u64,
    /// The kernel refused `epoll_pwait2`: the loop waits with `epoll_wait` and millisecond
    /// timeouts (rounded up) instead.
    #[serde(default)]
    pub epoll_wait_fallback: bool,
}

/// Everything the switch reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchStats {
    /// When the switch took this snapshot, ns on the switch's own monotonic clock (`None`: the
    /// backend has no clock of its own, as the mock). The controllers measure the counters at
    /// this time, so the publication delay does not distort their windows.
    #[serde(default)]
    pub time_ns: Option<u64>,
    /// Per port (vifs and the uplink).
    pub ports: Vec<PortStats>,
    /// Per poll loop.
    pub loops: Vec<LoopStats>,
    /// Learnt MAC addresses (0 for a backend without a MAC table, as the mock).
    #[serde(default)]
    pub mac_entries: u64,
}

/// Drop reasons of the data plane; every port reports each of them (zero included), so each
/// `drops{reason}` series exists from the start. The data plane's `DropReason::ALL` is the
/// source; vqosd's tests check that this list names exactly those (this crate does not link
/// the data plane).
pub const DROP_REASONS: [&str; 18] = [
    "truncated",
    "oversized",
    "bad_vnet_hdr",
    "spoofed",
    "policed",
    "rate_limited",
    "tx_error",
    "hairpin",
    "storm",
    "ip_spoofed",
    "arp_spoofed",
    "nd_spoofed",
    "rogue_router",
    "rogue_dhcp",
    "reserved",
    "tagged",
    "queue_full",
    "aqm",
];
