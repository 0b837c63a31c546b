//! # vqos-dataplane
//!
//! The data plane of vqos: ports that carry frames with a virtio-net header (Linux TAP with
//! TCP segmentation offload, in-memory ports for tests, a fault-injecting wrapper), an L2
//! learning switch between vif ports and one uplink with port security, and the poll loop that
//! asks a [`vqos_sched::Engine`] (through [`vqos_sched::Scheduler`]) which vif to serve next.
//!
//! ## API
//! - [`Switch`]: the switch as a deterministic step function. [`Switch::new`]`(config, now)`,
//!   [`Switch::poll`]`(now) -> `[`Poll`], control calls (`add_port`, `remove_port`,
//!   `set_policies`, `set_policy`, `set_ecn_probabilities`) and [`Switch::stats`]`(now)`; it
//!   never reads a clock nor waits, so tests step it in virtual time.
//! - [`SwitchHandle::start`]`(`[`SwitchConfig`]`) -> Result<SwitchHandle, SwitchError>` (also
//!   [`start`]): the same switch on a loop thread that owns the clock and epoll.
//! - [`SwitchHandle::add_port`]`(`[`PortSpec`]`, VifPolicy)`: a vif port ([`PortSpec::tap`]
//!   creates a TAP, [`PortSpec::tap_attach`] attaches to a persistent one,
//!   [`PortSpec::custom`] takes any [`Port`]; [`PortSpec::af_packet`] attaches the uplink to
//!   an existing interface through an `AF_PACKET` socket, [`AfPacketPort`]; [`PortSpec::with_mac_policy`] /
//!   [`PortSpec::with_allowed_macs`] set its port security, [`MacPolicy`]).
//! - [`SwitchHandle::remove_port`]`(name)`: only that port is affected.
//! - [`SwitchHandle::set_policies`]`(PolicySet)` / [`SwitchHandle::set_policy`]`(name,
//!   VifPolicy)`: validated by the loop as a whole (→ [`SwitchError::Policy`], nothing
//!   changes), applied between batches; the call returns once the engine accepted it. The set's
//!   `capacity_bps` is the uplink capacity.
//! - [`SwitchHandle::set_ecn_probabilities`]`(Vec<(name, f64)>)`: per-vif CE marking
//!   probability on the vif's data direction (the PID-ECN controller's output), by vif name
//!   (others get 0; an unknown name refuses the call).
//! - [`SwitchHandle::stats`]`() -> Arc<`[`SwitchStats`]`>`: per port rx/tx frames and bytes,
//!   [`DropCounters`] by [`DropReason`], ECN marks, engine state, rx/tx rate over the last
//!   ~100 ms, the port kind's status; per loop busy/idle cycles, bursts, iterations. The types
//!   are the API's (`vqos_api::stats`, re-exported here): the daemon serves them as they are
//!   ([`stats`] says why they live there). Published every 25 ms and right after every change.
//!   [`SwitchHandle::loop_health`]: is the loop alive, how old are its stats.
//! - [`SwitchHandle::stop`]`()`; dropping the handle stops too.
//! - [`SwitchConfig::threads`] / [`SwitchConfig::cpus`]: several loop threads (shards), each
//!   reading its own ports with its own engine, sharing the address tables, the ports' I/O
//!   and the uplink capacity (divided every 10 ms by the reference allocator): docs/dataplane.md,
//!   "Shards". [`Shards`] runs them without threads, in virtual time.
//!
//! ## Behavior
//! A frame travels (docs/dataplane.md names each function): port → [`Batch`] buffer (read by
//! the loop, at most the engine's grant) → [`frame::validate`] (`truncated`, `oversized`,
//! `bad_vnet_hdr`) → port security and address ownership (`spoofed`) → engine `admit`
//! (`policed`, or CE marking) → lookup → destination port, virtio-net header unchanged;
//! broadcast, multicast and unknown destinations pass storm control (`storm`) and are flooded,
//! except a vif's unknown unicast, which goes to the uplink only. The switch holds no packet
//! queue: a vif the engine refuses, or every vif while the uplink capacity bucket is empty, is
//! simply not read and its frames wait in its own queue (the TAP's), so the guest's TCP feels
//! back-pressure. The uplink→vif direction is always served; frames above a vif's maximum there
//! (flooded copies included) are dropped (`rate_limited`), and unicast ones are CE-marked with
//! the vif's ECN probability. Every drop reason has its own counter.
//!
//! ## Limitations
//! - Each port is read by one loop thread, all its queues with it (a multiqueue TAP's, a
//!   vhost-user port's pairs); one `read`/`write` per frame on a TAP (unless io_uring).
//! - The capacity bucket gates all vif batches, vif-to-vif traffic included (it is meant for
//!   the vif→uplink direction, which is what vifs normally send).
//! - Flooded copies are not CE-marked (one buffer shared by the copies).
//! - Every port must use the 12-byte virtio-net header ([`frame::VNET_HDR_LEN`]).
//! - Bytes are counted and charged as they are on the wire ([`frame::wire_bytes`]: a GSO
//!   super-frame's headers once per segment), without preamble, inter-frame gap and FCS.
//! - An address stays with the port it was seen on until it ages out (300 s): a station that
//!   moves between ports (a migrated VM) is reachable at once only if its new port is
//!   configured with its address.
#![deny(missing_docs)]

mod addrs;
pub mod afpacket;
pub mod balance;
pub mod calib;
pub mod config;
mod control;
pub mod downlink;
mod ecn;
pub mod error;
pub mod fault;
pub mod flow;
pub mod frame;
pub mod guard;
pub mod handle;
pub mod l2;
pub mod mem;
mod migrate;
pub mod null;
mod pipeline;
pub mod port;
mod ports;
mod rehome;
mod runner;
pub mod shaper;
pub mod shards;
mod spread;
pub mod stats;
pub mod switch;
pub mod sys;
pub mod tap;
pub mod tap_budget;
pub mod tap_queue;
pub mod tap_steer;
pub mod tap_uring;
mod uplink_queues;
pub mod vhost_user;

pub use afpacket::{AfPacketOptions, AfPacketPort, AfPacketStatus};
pub use calib::{CostSamples, COST_SAMPLES};
pub use config::{
    EmulatedWork, IpAddrs, IpPolicy, Locks, MacPolicy, PortBackend, PortSecurity, PortSpec,
    Readiness, SwitchConfig, DEFAULT_LEARN_IPV4, DEFAULT_LEARN_IPV6, DEFAULT_LEARN_MACS,
};
pub use downlink::{DownlinkConfig, QueueDepth};
pub use error::SwitchError;
pub use fault::{FaultPlan, FaultPort};
pub use frame::{FrameError, MacKey, VnetHdr, VNET_HDR_LEN};
pub use guard::Services;
pub use handle::{start, LoopHealth, ShardSamples, SwitchHandle};
pub use mem::{MemPort, MemPortPeer};
pub use null::NullPort;
pub use port::{Batch, Port, PortError, PortIoCounters, PortStatus, BATCH_FRAMES};
pub use shards::Shards;
pub use stats::{
    DropCounters, DropReason, HandoverView, LoopStats, PortCounters, PortRole, PortStats,
    SwitchStats,
};
pub use switch::{Poll, Switch};
pub use tap::{TapMode, TapOrigin, TapPort, MAX_TAP_QUEUES};
pub use tap_queue::TapTxQueue;
pub use tap_uring::TapIo;
pub use vhost_user::{
    VhostUserConfig, VhostUserCounters, VhostUserError, VhostUserHandle, VhostUserPort,
    VhostUserRole, VhostUserStatus,
};
pub use vqos_api::stats::TapStatus;
