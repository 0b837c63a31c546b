//! The data plane's statistics in the API's form ([`switch_stats`]): the one place they are
//! converted. Each data plane struct is taken apart field by field, all of them named, so a
//! field added to the data plane does not compile here until it is carried or said to be left
//! out.

use vqos_api::wire::{HandoverView, LockedAddrs};
use vqos_dataplane::guard::key_ip;
use vqos_dataplane::{HandoverStats, PortCounters, PortIoCounters};

use super::mac_addr;
use crate::backend::{LoopStats, PortStats, SwitchStats};

/// The API's statistics of the switch's snapshot `raw`.
pub fn switch_stats(raw: &vqos_dataplane::SwitchStats) -> SwitchStats {
    let vqos_dataplane::SwitchStats {
        time_ns,
        // The API reports its own view of these (`GET /v1/stats`'s engine, capacity; the
        // policies it set).
        policy_epoch: _,
        engine: _,
        capacity_bps: _,
        mac_entries,
        ports,
        // Each loop is reported on its own.
        loop_stats: _,
        loops,
    } = raw;
    SwitchStats {
        time_ns: Some(*time_ns),
        ports: ports.iter().map(port_stats).collect(),
        loops: loops
            .iter()
            .enumerate()
            .map(|(i, l)| loop_stats(i, l))
            .collect(),
        mac_entries: *mac_entries as u64,
    }
}

/// One port's statistics.
fn port_stats(p: &vqos_dataplane::PortStats) -> PortStats {
    let vqos_dataplane::PortStats {
        name,
        // The API adds the role and the policy from its own view.
        role: _,
        vif: _,
        policy: _,
        counters,
        // The API reports the probabilities it set.
        ecn_probability: _,
        engine,
        rx_rate_bps,
        tx_rate_bps,
        io,
        status,
        locked,
        shard,
        handover,
    } = p;
    let PortCounters {
        rx_frames,
        rx_bytes,
        tx_frames,
        tx_bytes,
        drops,
        ecn_marked,
        ecn_not_ect,
        rx_errors,
        mac_learn_refused,
        queued_frames,
        queued_bytes,
    } = counters;
    let PortIoCounters {
        // The port's own view of what the switch counts above.
        rx_frames: _,
        rx_bytes: _,
        tx_frames: _,
        tx_bytes: _,
        rx_errors: _,
        tx_errors: _,
        uring_failures,
    } = io;
    let engine = engine.unwrap_or_default();
    PortStats {
        name: name.clone(),
        rx_frames: *rx_frames,
        rx_bytes: *rx_bytes,
        tx_frames: *tx_frames,
        tx_bytes: *tx_bytes,
        drops: *drops,
        ecn_marked: *ecn_marked,
        ecn_not_ect: *ecn_not_ect,
        rx_errors: *rx_errors,
        mac_learn_refused: *mac_learn_refused,
        uring_failures: *uring_failures,
        rate_bps: *rx_rate_bps,
        tx_rate_bps: *tx_rate_bps,
        // The engines report i64::MAX for a vif they keep no bucket for.
        credit: (engine.credit != i64::MAX).then_some(engine.credit),
        throttled: engine.throttled,
        status: status.clone(),
        locked: LockedAddrs {
            macs: locked.macs.iter().map(|&m| mac_addr(m)).collect(),
            ips: locked.ips.iter().map(|&k| key_ip(k)).collect(),
        },
        shard: *shard,
        queued_frames: *queued_frames,
        queued_bytes: *queued_bytes,
        handover: handover
            .as_ref()
            .map(|HandoverStats { to, complete }| HandoverView {
                to: to.clone(),
                complete: *complete,
            }),
    }
}

/// Loop `i`'s counters.
fn loop_stats(i: usize, l: &vqos_dataplane::LoopStats) -> LoopStats {
    let vqos_dataplane::LoopStats {
        iterations,
        bursts,
        burst_frames,
        busy_cycles,
        idle_cycles,
        cycles_unit,
        engine_ticks,
        engine_refusals,
        capacity_waits,
        commands,
        epoll_errors,
        epoll_wait_fallback,
    } = l;
    LoopStats {
        name: format!("loop{i}"),
        busy_cycles: *busy_cycles,
        idle_cycles: *idle_cycles,
        bursts: *bursts,
        cycles_unit: cycles_unit.to_string(),
        iterations: *iterations,
        burst_frames: *burst_frames,
        engine_ticks: *engine_ticks,
        engine_refusals: *engine_refusals,
        capacity_waits: *capacity_waits,
        commands: *commands,
        epoll_errors: *epoll_errors,
        epoll_wait_fallback: *epoll_wait_fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vqos_dataplane::{Locks, PortRole};

    /// Each of a port's counters reaches the API (`uring_failures` once did not).
    #[test]
    fn a_ports_counters_reach_the_api() {
        let raw = vqos_dataplane::PortStats {
            name: "vm1".into(),
            role: PortRole::Vif,
            vif: Some(0),
            policy: None,
            counters: PortCounters {
                rx_frames: 1,
                ecn_not_ect: 2,
                mac_learn_refused: 3,
                queued_bytes: 4,
                ..Default::default()
            },
            ecn_probability: 0.0,
            engine: Some(vqos_sched::VifEngineState {
                credit: i64::MAX,
                ..Default::default()
            }),
            rx_rate_bps: 5,
            tx_rate_bps: 6,
            io: PortIoCounters {
                uring_failures: 1,
                ..Default::default()
            },
            status: None,
            locked: Locks::default(),
            shard: 7,
            handover: Some(HandoverStats {
                to: "vm2".into(),
                complete: true,
            }),
        };
        let p = port_stats(&raw);
        assert_eq!(
            (
                p.rx_frames,
                p.ecn_not_ect,
                p.mac_learn_refused,
                p.queued_bytes
            ),
            (1, 2, 3, 4)
        );
        assert_eq!((p.rate_bps, p.tx_rate_bps, p.shard), (5, 6, 7));
        assert_eq!(p.uring_failures, 1);
        assert_eq!(p.credit, None, "no bucket");
        assert_eq!(
            p.handover.map(|h| (h.to, h.complete)),
            Some(("vm2".into(), true))
        );
    }
}
