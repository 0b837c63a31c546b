//! Tests of the cluster simulation: fixed seeds, small clusters, exact fixed points.

use super::*;

const MBIT: u64 = 1_000_000;

fn small(seed: u64) -> ClusterSimConfig {
    ClusterSimConfig {
        hosts: 8,
        vifs: 60,
        tenants: 4,
        seed,
        periods: 20,
        ..Default::default()
    }
}

/// Two hosts, one tenant (max 100 Mbit/s): a greedy vif on host 0, one wanting 20 Mbit/s on
/// host 1.
fn two_vifs() -> World {
    let config = ClusterSimConfig {
        hosts: 2,
        vifs: 2,
        tenants: 1,
        periods: 10,
        ..Default::default()
    };
    let mut w = World::new(&config).unwrap();
    for (i, want) in [Want::Greedy, Want::Light(20 * MBIT)]
        .into_iter()
        .enumerate()
    {
        w.vifs[i] = SimVif {
            host: i as u32,
            tenant: 0,
            weight: 1,
            max_bps: None,
            want,
        };
    }
    w.tenants.insert(
        "t0".into(),
        TenantLimits {
            min_bps: 0,
            max_bps: Some(100 * MBIT),
        },
    );
    w
}

#[test]
fn a_light_vif_keeps_its_estimate_and_the_greedy_one_the_rest_for_good() {
    let mut w = two_vifs();
    // Period 1: no shares yet, both publish rate + 10 % (the greedy one its line rate): the
    // light one gets 22, the other 78. From then on the greedy one fills its share (greedy)
    // and the light one sends 20 of its 22 (below the greedy mark): a fixed point.
    let mut seen = Vec::new();
    for _ in 0..10 {
        w.step();
        seen.push((w.rates_bps[0] / MBIT, w.rates_bps[1] / MBIT));
    }
    assert_eq!(seen[0], (LINE_BPS / MBIT, 20));
    assert!(seen[1..].iter().all(|&r| r == (78, 20)), "{seen:?}");
    assert_eq!(w.shares[1].unwrap().max_bps, Some(22 * MBIT));
    // The reference gives the greedy vif 80: the 2 the light one holds are its slack.
    assert_eq!(w.reference_bps(), vec![80 * MBIT, 20 * MBIT]);
    let (d, over) = w.distance(&w.reference_bps());
    assert!(d <= 0.0, "{d}");
    assert_eq!(over, -2 * MBIT as i128);
}

#[test]
fn when_the_light_vif_turns_greedy_they_split_the_max_in_two_periods() {
    let mut w = two_vifs();
    let (p, _, _) = w.run(10);
    assert_eq!(p, Some(2));
    w.vifs[1].want = Want::Greedy;
    let (p, curve, over) = w.run(10);
    // It fills its 22 (greedy) in the first period, and the split gives 50 + 50 in the next.
    assert_eq!(p, Some(2), "{curve:?}");
    assert_eq!((w.rates_bps[0], w.rates_bps[1]), (50 * MBIT, 50 * MBIT));
    assert!(over <= 0);
}

#[test]
fn small_clusters_converge_to_the_reference_and_never_exceed_a_tenant_max() {
    // A fall of demand is seen once the higher rate has left the window (docs/cluster.md,
    // "Convergence"), and what it frees is taken in the 2 periods of a rise.
    let window = window_periods(small(1).period_ms, small(1).probe_bps) as u32;
    for seed in 1..=8 {
        let r = simulate_cluster(&small(seed)).unwrap();
        assert!(
            r.start_periods.is_some_and(|p| p <= 4),
            "seed {seed}: start {:?}",
            r.start_periods
        );
        assert!(
            r.shift_periods.is_some_and(|p| p <= window + 2),
            "seed {seed}: shift {:?} {:?}",
            r.shift_periods,
            r.shift_distance
        );
        // A bit/s per vif of rounding at most.
        assert!(r.max_over_bps <= 60, "seed {seed}: {}", r.max_over_bps);
    }
}

#[test]
fn the_same_seed_gives_the_same_report_and_another_seed_another_cluster() {
    let a = simulate_cluster(&small(7)).unwrap();
    assert_eq!(a, simulate_cluster(&small(7)).unwrap());
    let b = World::new(&small(8)).unwrap();
    let hosts_a: Vec<u32> = World::new(&small(7))
        .unwrap()
        .vifs
        .iter()
        .map(|v| v.host)
        .collect();
    assert_ne!(hosts_a, b.vifs.iter().map(|v| v.host).collect::<Vec<_>>());
}

#[test]
fn etcd_traffic_counts_every_status_and_sharding_reads_less() {
    let mut w = World::new(&small(3)).unwrap();
    w.run(3);
    let all = w.statuses();
    let t = traffic(&all);
    assert_eq!(t.keys_written, 8);
    let bytes: usize = all
        .iter()
        .map(|(h, s)| vqos_cluster::keys::status(h).len() + serde_json::to_vec(s).unwrap().len())
        .sum();
    assert_eq!(t.bytes_written, bytes as u64);
    assert_eq!(t.bytes_read_total, 8 * bytes as u128);
    // Each (tenant, host) with a vif is one sharded key; a host reads its tenants' keys only.
    let pairs: std::collections::BTreeSet<(u32, u32)> =
        w.vifs.iter().map(|v| (v.tenant, v.host)).collect();
    assert_eq!(t.sharded_keys_written, pairs.len() as u64);
    assert!(t.sharded_read_per_agent_max <= t.bytes_read_per_agent + 64 * 4);
    assert!(t.sharded_read_per_agent_mean <= t.sharded_read_per_agent_max);
    // One small aggregate per (tenant, host) reads less than the vifs themselves.
    assert!(t.aggregate_read_total < t.sharded_read_total);
    assert!(t.aggregate_read_per_agent_max <= t.sharded_read_per_agent_max);
}

#[test]
fn tenants_are_zipf_sized_and_every_vif_is_placed() {
    let w = World::new(&ClusterSimConfig {
        hosts: 50,
        vifs: 5000,
        tenants: 100,
        ..Default::default()
    })
    .unwrap();
    let mut sizes = vec![0u64; 100];
    for v in &w.vifs {
        assert!(v.host < 50);
        sizes[v.tenant as usize] += 1;
    }
    assert!(sizes.iter().all(|&n| n >= 1));
    // Tenant 0 draws about 1 / H(100) ≈ 19 % of the vifs; tenant 99 about 0.2 %.
    assert!(sizes[0] > 700 && sizes[0] < 1200, "{}", sizes[0]);
    assert!(sizes[99] < 40, "{}", sizes[99]);
    assert_eq!(w.tenants["t0"].max_bps, Some(sizes[0] * 40 * MBIT));
}

#[test]
fn settings_out_of_range_are_refused() {
    let e = |c: ClusterSimConfig| World::new(&c).unwrap_err().to_string();
    let base = ClusterSimConfig::default();
    assert_eq!(
        e(ClusterSimConfig {
            hosts: 0,
            ..base.clone()
        }),
        "Invalid cluster simulation: hosts must be 1 to 10^6"
    );
    assert!(e(ClusterSimConfig {
        tenants: 2000,
        ..base.clone()
    })
    .contains("tenants"));
    assert!(e(ClusterSimConfig {
        shift: 1.5,
        ..base.clone()
    })
    .contains("shift"));
    assert!(e(ClusterSimConfig { periods: 0, ..base }).contains("periods"));
}
