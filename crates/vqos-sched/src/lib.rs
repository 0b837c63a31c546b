//! # vqos-sched
//!
//! The scheduling core of vqos: what tenants bought ([`policy`]), what they should get
//! ([`alloc`], the reference allocator), and the algorithms that decide, batch by batch, which
//! virtual interface a switch serves next ([`engines`]) plus the controllers that adjust limits
//! or mark ECN above them ([`controllers`]).
//!
//! ## Behavior
//! Pure: no I/O, no threads, no clock. Every call that depends on time takes `now_ns`; every
//! decision is returned. The same engines run in the simulator (`vqos-sim`) and in the switch
//! (`vqos-dataplane`).
//!
//! ## Limitations
//! Engines schedule one shared resource (the uplink or one forwarding core). Several cores are
//! several engines.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod alloc;
pub mod aqm;
pub mod bucket;
pub mod calibrate;
pub mod change;
pub mod controllers;
pub mod cost;
pub mod driver;
pub mod engine;
pub mod engines;
pub mod fq;
pub mod policy;
#[cfg(test)]
mod proptest_config;
pub mod sold;
pub mod testing;
pub mod units;
pub mod variant;

pub use alloc::{allocate, allocate_set, Claim};
pub use aqm::{AqmParams, Codel, DownlinkConfig};
pub use bucket::TokenBucket;
pub use cost::{CostError, CycleCostModel, FrameCost, Pricing};
pub use driver::{EngineSlot, Granted, Scheduler, SchedulerCounters, Step};
pub use engine::{Engine, EngineKind, Grant, ReadySet, Usage, Verdict, VifEngineState, MAX_BURST};
pub use engines::build;
pub use fq::FlowQueues;
pub use policy::{CostModel, PolicyError, PolicySet, VifId, VifPolicy, VifSpec};
pub use variant::Variant;
