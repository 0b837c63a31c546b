//! [`merge`]: one snapshot of a switch's shards.

use std::sync::Arc;

use vqos_api::port::LockedAddrs;
use vqos_api::stats::{AfPacketStatus, TapStatus};

use super::*;

/// What each shard counted of a port in these tests.
fn counted() -> PortCounters {
    let mut c = PortCounters {
        rx_frames: 1,
        rx_bytes: 2,
        tx_frames: 3,
        tx_bytes: 4,
        ecn_marked: 5,
        ecn_not_ect: 6,
        rx_errors: 7,
        mac_learn_refused: 8,
        ..Default::default()
    };
    c.drops[DropReason::Spoofed] = 9;
    c
}

/// Port `name` as shard `shard` sees it, read by shard `home`: its counters [`counted`], every
/// rate and gauge 1, its state marked with `shard`.
fn port(name: &str, home: usize, shard: usize, status: Option<PortStatus>) -> PortStats {
    PortStats {
        name: name.into(),
        counters: counted(),
        uring_failures: 1,
        rate_bps: 1,
        tx_rate_bps: 1,
        credit: Some(shard as i64),
        throttled: shard == 1,
        status,
        locked: LockedAddrs {
            ips: vec![std::net::Ipv4Addr::new(10, 0, 0, shard as u8).into()],
            ..Default::default()
        },
        shard: home,
        readers: vec![home],
        queued_frames: 1,
        queued_bytes: 1,
        handover: Some(HandoverView {
            to: format!("from shard {shard}"),
            complete: false,
        }),
    }
}

fn af(readers: u32) -> Option<PortStatus> {
    Some(PortStatus::AfPacket(AfPacketStatus {
        kernel_drops: 1,
        readers,
        ..Default::default()
    }))
}

fn tap(shard: u64) -> Option<PortStatus> {
    Some(PortStatus::Tap(TapStatus {
        budget_holds: 0,
        queue_rx_frames: vec![shard],
    }))
}

fn shard(i: usize, time_ns: u64, ports: Vec<PortStats>) -> Arc<SwitchStats> {
    Arc::new(SwitchStats {
        time_ns: Some(time_ns),
        ports,
        loops: vec![LoopStats {
            name: format!("loop{i}"),
            bursts: 1,
            ..Default::default()
        }],
        mac_entries: 7 + i as u64,
    })
}

#[test]
fn merge_sums_every_counter_and_takes_a_ports_state_from_the_shard_that_reads_it() {
    let s0 = shard(
        0,
        20,
        vec![port("up", 0, 0, af(1)), port("vm1", 1, 0, None)],
    );
    // Shard 1 lists a port shard 0 does not know yet (a control call half-way): skipped.
    let s1 = shard(
        1,
        10,
        vec![
            port("up", 0, 1, af(1)),
            port("new", 1, 1, None),
            port("vm1", 1, 1, tap(1)),
        ],
    );
    let m = merge(&[s0, s1]);
    assert_eq!(m.time_ns, Some(10), "the oldest");
    assert_eq!(m.mac_entries, 7, "shard 0's: the table is shared");
    let names: Vec<&str> = m.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["up", "vm1"]);
    let loops: Vec<&str> = m.loops.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(loops, ["loop0", "loop1"], "side by side");
    // Every counter through PortCounters::add (whose own test covers each field), and what
    // merge adds itself.
    let mut twice = counted();
    twice.add(&counted());
    for p in &m.ports {
        assert_eq!(p.counters, twice, "{}", p.name);
        let summed = [
            p.uring_failures,
            p.rate_bps,
            p.tx_rate_bps,
            p.queued_frames,
            p.queued_bytes,
        ];
        assert_eq!(summed, [2; 5], "{}", p.name);
    }
    let vm1 = m.port("vm1").unwrap();
    assert_eq!((vm1.credit, vm1.throttled), (Some(1), true), "its home's");
    assert_eq!(vm1.status, tap(1));
    assert_eq!(vm1.locked.ips, [std::net::Ipv4Addr::new(10, 0, 0, 1)]);
    assert_eq!(vm1.handover.as_ref().unwrap().to, "from shard 1");
    let up = m.port("up").unwrap();
    assert_eq!((up.credit, up.throttled), (Some(0), false), "shard 0's");
    let Some(PortStatus::AfPacket(a)) = &up.status else {
        panic!("{:?}", up.status);
    };
    assert_eq!(
        (a.kernel_drops, a.readers),
        (2, 2),
        "each reader's added up"
    );
}

#[test]
fn one_shard_is_its_own_snapshot_and_none_is_empty() {
    let s0 = shard(0, 5, vec![port("up", 0, 0, None)]);
    assert_eq!(merge(std::slice::from_ref(&s0)), *s0);
    assert_eq!(merge(&[]), SwitchStats::default());
}
