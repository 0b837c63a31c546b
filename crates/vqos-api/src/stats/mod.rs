//! The statistics the API reports (`GET /v1/stats`, `/metrics`): per port and per poll loop.
//! The daemon fills them from its switch (the data plane's own stats types are converted), so
//! clients need nothing of the data plane.

use serde::{Deserialize, Serialize};

use crate::wire::{HandoverView, LockedAddrs};

mod drops;
mod status;

pub use drops::{DropCounters, DropReason};
pub use status::{AfPacketStatus, PortStatus, TapStatus, VhostUserCounters, VhostUserStatus};

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
    pub drops: DropCounters,
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
    /// A TAP under `tap_io = "uring"`: 1 once its io_uring failed and it went back to one
    /// system call per frame for good (0 otherwise).
    #[serde(default)]
    pub uring_failures: u64,
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
    /// What the port kind reports beyond its counters, under the kind's name: `vhost_user`
    /// (vhost-user ports), `af_packet` (the uplink on an existing interface) or `tap` (a
    /// multiqueue TAP); absent for single-queue TAPs and null ports.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PortStatus>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{PortStatsView, VhostUserRole};

    #[test]
    fn a_port_status_is_read_under_its_kinds_name_beside_the_counters() {
        let counters = r#""rx_frames":3,"rx_bytes":0,"tx_frames":0,"tx_bytes":0,"drops":{},
            "ecn_marked":0,"rate_bps":0,"tx_rate_bps":0,"throttled":false"#;
        let vif = r#"{"name":"vm1","role":"vif","policy":null,COUNTERS,
            "vhost_user":{"name":"vm1","mode":"client","socket":"/run/vqos/vm1.sock",
                "connected":false,"quarantined":false,"last_error":"Connection refused",
                "counters":{"connect_failures":2}}}"#
            .replace("COUNTERS", counters);
        let v: PortStatsView = serde_json::from_str(&vif).unwrap();
        let s = v.stats.status.as_ref().and_then(PortStatus::vhost_user);
        let s = s.expect("a vhost-user status");
        assert_eq!(s.mode, VhostUserRole::Client);
        assert_eq!(s.last_error.as_deref(), Some("Connection refused"));
        assert_eq!(s.counters.connect_failures, 2);
        assert_eq!(v.stats.rx_frames, 3);
        let back: PortStatsView =
            serde_json::from_value(serde_json::to_value(&v).unwrap()).unwrap();
        assert_eq!(back, v);
        let up = r#"{"name":"up0","role":"uplink","policy":null,COUNTERS,
            "af_packet":{"ifindex":2,"vnet_hdr_bytes":12,"qdisc_bypass":true,"kernel_drops":1,
                "skipped_host":0,"skipped_outgoing":0,"readers":1}}"#
            .replace("COUNTERS", counters);
        let v: PortStatsView = serde_json::from_str(&up).unwrap();
        match v.stats.status {
            Some(PortStatus::AfPacket(a)) => assert_eq!(a.kernel_drops, 1),
            other => panic!("{other:?}"),
        }
        // An older daemon put the uplink's AF_PACKET status under `vhost_user`: it is none.
        let old = up.replace("af_packet", "vhost_user");
        let v: PortStatsView = serde_json::from_str(&old).unwrap();
        assert_eq!(v.stats.status, None);
    }
}
