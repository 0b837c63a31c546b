//! The statistics' JSON: read back whole, byte for byte what the API has served.

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
    assert_eq!(v.stats.counters.rx_frames, 3);
    let back: PortStatsView = serde_json::from_value(serde_json::to_value(&v).unwrap()).unwrap();
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

/// Every number in `v` (nested ones too) set to `n`.
fn set_numbers(v: &mut serde_json::Value, n: u64) {
    match v {
        serde_json::Value::Number(x) => *x = n.into(),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|v| set_numbers(v, n)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|v| set_numbers(v, n)),
        _ => {}
    }
}

/// Every number in `v` (nested ones too).
fn numbers(v: &serde_json::Value, path: &str, out: &mut Vec<(String, u64)>) {
    match v {
        serde_json::Value::Number(x) => out.push((path.to_string(), x.as_u64().unwrap())),
        serde_json::Value::Object(o) => o
            .iter()
            .for_each(|(k, v)| numbers(v, &format!("{path}.{k}"), out)),
        _ => {}
    }
}

/// A `T` whose every counter is `n`, found through its JSON: a counter added later is in it
/// without this test naming it.
fn all<T: Default + Serialize + serde::de::DeserializeOwned>(n: u64) -> T {
    let mut v = serde_json::to_value(T::default()).unwrap();
    set_numbers(&mut v, n);
    serde_json::from_value(v).unwrap()
}

/// `add` sums every counter: one that it forgot stays at 1.
#[test]
fn add_sums_every_counter_of_a_port_and_of_a_loop() {
    let mut c: PortCounters = all(1);
    c.add(&all(1));
    let mut l: LoopStats = all(1);
    l.add(&all(1));
    let mut seen = Vec::new();
    numbers(&serde_json::to_value(c).unwrap(), "port", &mut seen);
    numbers(&serde_json::to_value(&l).unwrap(), "loop", &mut seen);
    assert!(seen.len() > 30, "{seen:?}");
    let missed: Vec<_> = seen.iter().filter(|(_, n)| *n != 2).collect();
    assert!(missed.is_empty(), "not summed: {missed:?}");
}

/// What `GET /v1/stats` served before the data plane filled these types itself (the API of
/// 123c8fc serialised tests/data/stats-v1.json: every field set, every port kind's status; and
/// `tx_cut_through`, `dirty_logs_refused` and `budget_holds`, added since, at 0):
/// read and written again, it is the same bytes, as `vqos stats --json` prints it.
#[test]
fn the_stats_json_is_what_the_api_served_byte_for_byte() {
    let served = include_str!("../../tests/data/stats-v1.json");
    let view: crate::wire::StatsView = serde_json::from_str(served).unwrap();
    let vm1 = &view.ports[1].stats;
    assert_eq!(vm1.counters.drops[DropReason::Spoofed], 103);
    assert_eq!((vm1.counters.rx_frames, vm1.uring_failures), (1, 1));
    assert_eq!((vm1.credit, vm1.queued_bytes), (Some(-11), 21));
    let vhost = vm1
        .status
        .as_ref()
        .and_then(PortStatus::vhost_user)
        .unwrap();
    let c = vhost.counters;
    assert_eq!((c.sessions, c.chain_loop), (1_000, 1_014), "by name");
    assert_eq!(vm1.handover.as_ref().map(|h| h.to.as_str()), Some("vm2"));
    assert_eq!(view.loops[1].epoll_errors, 40);
    let again = serde_json::to_string_pretty(&view).unwrap() + "\n";
    assert_eq!(again, served);
}

/// A whole snapshot, every field set, reads back as it was.
#[test]
fn a_switch_snapshot_reads_back_whole() {
    let served = include_str!("../../tests/data/stats-v1.json");
    let view: crate::wire::StatsView = serde_json::from_str(served).unwrap();
    let s = SwitchStats {
        time_ns: Some(123),
        ports: view.ports.into_iter().map(|p| p.stats).collect(),
        loops: view.loops,
        mac_entries: 4,
    };
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<SwitchStats>(&json).unwrap(), s);
    assert_eq!(s.port("vm2").map(|p| p.counters.drops.total()), Some(1953));
    let total = s.loops_total();
    assert_eq!((total.bursts, total.epoll_wait_fallback), (32 + 33, true));
}
