//! Test utilities that ship with the crate: a minimal virtual-time link that drives any
//! [`Engine`] the way a poll loop does, so engines can be checked against the reference
//! allocator without the full simulator.
//!
//! ## Behavior
//! One link of `capacity_bps`; each vif offers frames of one size according to its [`Demand`];
//! the loop ticks the engine when due, asks `select`, serves up to the granted number of frames,
//! asks `admit` per frame, advances time by the frames' serialisation time, and charges the
//! batch (cycles = 2 000 per frame + 1 per byte, a stand-in cost model).
//!
//! ## Limitations
//! No TCP, no queues beyond a per-vif backlog counter: use `vqos-sim` for experiments.

use crate::driver::{Scheduler, Step};
use crate::engine::{Engine, Usage, Verdict};
use crate::units::NS_PER_SEC;

/// What a vif offers to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    /// Always has frames waiting.
    Greedy,
    /// Never sends.
    Idle,
    /// Offers this many bits per second (a backlog that fills at this rate).
    Rate(u64),
}

/// Cycles a batch costs in this harness: a per-frame and a per-byte part.
pub fn harness_cycles(packets: u64, bytes: u64) -> u64 {
    2_000 * packets + bytes
}

/// Runs `engine` on a link of `capacity_bps` for `duration_ns` from `start_ns` with frames of
/// `frame_bytes`; returns each vif's forwarded rate in bits per second.
pub fn run_link(
    engine: &mut dyn Engine,
    capacity_bps: u64,
    demands: &[Demand],
    frame_bytes: u32,
    start_ns: u64,
    duration_ns: u64,
) -> Vec<f64> {
    let n = demands.len();
    let end = start_ns + duration_ns;
    let mut sched = Scheduler::<&mut dyn Engine>::new(engine, n);
    // Backlog of rate-limited vifs, in bits (so sub-frame arrivals accumulate exactly).
    let mut backlog_bits = vec![0u128; n];
    let mut sent_bytes = vec![0u64; n];
    let mut now = start_ns;
    let mut last_arrival = start_ns;
    let frame_bits = u128::from(frame_bytes) * 8;
    while now < end {
        // Arrivals since the last step.
        for (i, d) in demands.iter().enumerate() {
            if let Demand::Rate(r) = d {
                backlog_bits[i] += u128::from(*r) * u128::from(now - last_arrival);
            }
        }
        last_arrival = now;
        for (i, d) in demands.iter().enumerate() {
            let has = match d {
                Demand::Greedy => true,
                Demand::Idle => false,
                Demand::Rate(_) => backlog_bits[i] / u128::from(NS_PER_SEC) >= frame_bits,
            };
            sched.set_ready(i, has);
        }
        let granted = match sched.step(now) {
            Step::Serve(g) => g,
            Step::Refused { until_ns } | Step::Idle { until_ns } => {
                // Nothing may go: jump to the next event, at most 10 µs away (new arrivals).
                now = until_ns.min(now + 10_000).max(now + 1);
                continue;
            }
        };
        let v = granted.vif();
        let mut packets = 0u64;
        let mut bytes = 0u64;
        let mut read = 0u64;
        for _ in 0..granted.max_packets() {
            let available = match demands[v] {
                Demand::Greedy => true,
                Demand::Idle => false,
                Demand::Rate(_) => backlog_bits[v] / u128::from(NS_PER_SEC) >= frame_bits,
            };
            if !available {
                break;
            }
            if let Demand::Rate(_) = demands[v] {
                backlog_bits[v] -= frame_bits * u128::from(NS_PER_SEC);
            }
            read += 1;
            if sched.admit(&granted, frame_bytes, now) != Verdict::Drop {
                packets += 1;
                bytes += u64::from(frame_bytes);
            }
        }
        // Serialisation time on the link (rounded up to whole ns).
        let link_ns = (u128::from(bytes) * 8 * u128::from(NS_PER_SEC))
            .div_ceil(u128::from(capacity_bps)) as u64;
        now += link_ns.max(1);
        if now <= end {
            sent_bytes[v] += bytes;
        }
        sched.charge(
            granted,
            Usage {
                packets: packets as u32,
                bytes,
                cycles: harness_cycles(read, read * u64::from(frame_bytes)),
            },
            now,
        );
    }
    sent_bytes
        .iter()
        .map(|&b| b as f64 * 8.0 * NS_PER_SEC as f64 / duration_ns as f64)
        .collect()
}
