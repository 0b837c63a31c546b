//! # vqos-dataplane
//!
//! The data plane of vqos: ports that carry frames with a virtio-net header (Linux TAP with
//! TCP segmentation offload, in-memory ports for tests, a fault-injecting wrapper), an L2
//! learning switch between vif ports and one uplink, and the poll loop that asks a
//! [`vqos_sched::Engine`] which vif to serve next.
//!
//! ## API
//! - [`SwitchHandle::start`]`(`[`SwitchConfig`]`) -> Result<SwitchHandle, SwitchError>` (also
//!   [`start`]): opens the uplink, builds the engine, starts the loop thread.
//! - [`SwitchHandle::add_port`]`(`[`PortSpec`]`, VifPolicy)`: a vif port ([`PortSpec::tap`]
//!   creates a TAP, [`PortSpec::tap_attach`] attaches to a persistent one,
//!   [`PortSpec::custom`] takes any [`Port`]; [`PortSpec::with_allowed_macs`] sets the
//!   anti-spoofing allow-list).
//! - [`SwitchHandle::remove_port`]`(name)`: only that port is affected.
//! - [`SwitchHandle::set_policies`]`(PolicySet)` / [`SwitchHandle::set_policy`]`(name,
//!   VifPolicy)`: validated (→ [`SwitchError::Policy`] wrapping `PolicyError`, nothing changes),
//!   then handed to the loop as an immutable snapshot and applied between batches; the call
//!   returns once the engine's `configure` accepted it. The set's `capacity_bps` is the uplink
//!   capacity.
//! - [`SwitchHandle::set_ecn_probabilities`]`(Vec<f64>)`: per-vif CE marking probability on the
//!   uplink→vif direction (the PID-ECN controller's output).
//! - [`SwitchHandle::stats`]`() -> Arc<`[`SwitchStats`]`>` (serde `Serialize`): per port rx/tx
//!   frames and bytes, [`DropCounters`] by reason, ECN marks, engine state (`vif_state`), rx/tx
//!   rate over the last ~100 ms, the policy; per loop busy/idle cycles, bursts, iterations.
//!   Published by the loop every 25 ms and right after every policy change.
//! - [`SwitchHandle::stop`]`()`; dropping the handle stops too.
//!
//! ## Behavior
//! A frame travels: port → [`Batch`] buffer (read by the loop, at most the engine's grant) →
//! [`frame::validate`] (`truncated`, `oversized`, `bad_vnet_hdr`) → allow-list (`spoofed`) →
//! engine `admit` (`policed`, or CE marking) → MAC learning and lookup (unknown, broadcast and
//! multicast destinations are flooded to every other port) → destination port, virtio-net header
//! unchanged. The switch holds no packet queue: a vif the engine refuses, or every vif while
//! the uplink capacity bucket is empty, is simply not read and its frames wait in its own queue
//! (the TAP's), so the guest's TCP feels back-pressure. The uplink→vif direction is always
//! served; frames above a vif's maximum there are dropped (`rate_limited`), and CE is set with
//! the vif's ECN probability. Every drop reason has its own counter.
//!
//! ## Limitations
//! - One loop thread, one queue per TAP, one `read`/`write` per frame.
//! - The capacity bucket gates all vif batches, vif-to-vif traffic included (it is meant for
//!   the vif→uplink direction, which is what vifs normally send).
//! - Flooded frames are not subject to the downlink maximum nor to ECN marking.
//! - Every port must use the 12-byte virtio-net header ([`frame::VNET_HDR_LEN`]).
//! - Bytes are counted and charged as they are on the wire ([`frame::wire_bytes`]: a GSO
//!   super-frame's headers once per segment), without preamble, inter-frame gap and FCS.
//! - At most 64 MAC addresses are learnt per vif port (`mac_capacity_per_vif`); beyond that
//!   frames to its addresses are flooded (`mac_learn_refused`).
#![deny(missing_docs)]

pub mod bucket;
pub mod fault;
pub mod frame;
pub mod l2;
pub mod mem;
pub mod port;
pub mod stats;
pub mod switch;
pub mod sys;
pub mod tap;
pub mod vhost_user;

pub use fault::{FaultPlan, FaultPort};
pub use frame::{FrameError, MacKey, VnetHdr, VNET_HDR_LEN};
pub use mem::{MemPort, MemPortPeer};
pub use port::{Batch, Port, PortError, PortIoCounters, BATCH_FRAMES};
pub use stats::{DropCounters, LoopStats, PortRole, PortStats, SwitchStats};
pub use switch::{
    start, EmulatedWork, LoopHealth, PortBackend, PortSpec, Readiness, SwitchConfig, SwitchError,
    SwitchHandle,
};
pub use tap::{TapMode, TapPort};
pub use vhost_user::{
    VhostUserConfig, VhostUserCounters, VhostUserError, VhostUserHandle, VhostUserMode,
    VhostUserPort, VhostUserStatus,
};
