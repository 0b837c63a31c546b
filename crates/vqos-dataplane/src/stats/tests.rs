//! [`merge`]: one snapshot of a switch's shards.

use std::sync::Arc;

use vqos_api::port::LockedAddrs;
use vqos_api::stats::{AfPacketStatus, TapStatus};

use super::*;

/// A `T` whose every number is `n`, found through its JSON: a counter added later is in it
/// without this test naming it.
fn all<T: Default + serde::Serialize + serde::de::DeserializeOwned>(n: u64) -> T {
    fn set(v: &mut serde_json::Value, n: u64) {
        match v {
            serde_json::Value::Number(x) => *x = n.into(),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|v| set(v, n)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|v| set(v, n)),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(T::default()).unwrap();
    set(&mut v, n);
    serde_json::from_value(v).unwrap()
}

/// Port `name` as shard `shard` sees it, read by shard `home`: every counter, rate and gauge
/// 1, its state marked with `shard`.
fn port(name: &str, home: usize, shard: usize, status: Option<PortStatus>) -> PortStats {
    PortStats {
        name: name.into(),
        counters: all(1),
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
        queued_frames: 1,
        queued_bytes: 1,
        handover: Some(HandoverView {
            to: format!("from shard {shard}"),
            complete: false,
        }),
    }
}

/// Every number in `v`, with its path.
fn leaves(v: &serde_json::Value, path: &str, out: &mut Vec<(String, u64)>) {
    match v {
        serde_json::Value::Number(n) => out.push((path.to_string(), n.as_u64().unwrap())),
        serde_json::Value::Object(o) => o
            .iter()
            .for_each(|(k, v)| leaves(v, &format!("{path}.{k}"), out)),
        _ => {}
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
        queue_rx_frames: vec![shard],
    }))
}

fn shard(i: usize, time_ns: u64, ports: Vec<PortStats>) -> Arc<SwitchStats> {
    Arc::new(SwitchStats {
        time_ns: Some(time_ns),
        ports,
        loops: vec![LoopStats {
            name: format!("loop{i}"),
            ..all(1)
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
    for p in &m.ports {
        let mut counts = Vec::new();
        leaves(&serde_json::to_value(p.counters).unwrap(), "", &mut counts);
        counts.extend([
            ("uring_failures".to_string(), p.uring_failures),
            ("rate_bps".to_string(), p.rate_bps),
            ("tx_rate_bps".to_string(), p.tx_rate_bps),
            ("queued_frames".to_string(), p.queued_frames),
            ("queued_bytes".to_string(), p.queued_bytes),
        ]);
        let missed: Vec<_> = counts.iter().filter(|(_, n)| *n != 2).collect();
        assert!(missed.is_empty(), "{}: not summed: {missed:?}", p.name);
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
