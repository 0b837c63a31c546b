//! The `vqos` engine's unit tests, in virtual time.

use super::*;
use crate::alloc::allocate_set;
use crate::policy::VifPolicy;
use crate::testing::{run_link, Demand};

fn five(cap: u64) -> PolicySet {
    (1..=5).fold(PolicySet::new(Some(cap)), |s, w| {
        s.with_vif(
            &format!("vm{w}"),
            VifPolicy {
                weight: w,
                ..Default::default()
            },
        )
    })
}

fn assert_close(got: &[f64], want: &[u64], tol: f64) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let w = *w as f64;
        assert!(
            (g - w).abs() <= tol * w,
            "vif {i}: got {:.1} Mbit/s, want {:.1} (all: {got:?})",
            g / 1e6,
            w / 1e6
        );
    }
}

#[test]
fn ancs_fig5_three_phases_with_live_changes() {
    let cap = 940_000_000;
    let mut set = five(cap);
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let greedy = vec![Demand::Greedy; 5];
    let mut now = 0;
    for phase in 0..3 {
        if phase == 1 {
            let mut p = set.vifs[4].policy.clone();
            p.max_bps = Some(150_000_000);
            set = set.with_policy("vm5", p).unwrap();
            e.configure(&set, now).unwrap();
        }
        if phase == 2 {
            let mut p = set.vifs[0].policy.clone();
            p.min_bps = 200_000_000;
            set = set.with_policy("vm1", p).unwrap();
            e.configure(&set, now).unwrap();
        }
        // Settle, then measure.
        run_link(&mut e, cap, &greedy, 1500, now, 500_000_000);
        now += 500_000_000;
        let rates = run_link(&mut e, cap, &greedy, 1500, now, 2_000_000_000);
        now += 2_000_000_000;
        let want = allocate_set(&set, &[None; 5]).unwrap();
        assert_close(&rates, &want, 0.02);
        let total: f64 = rates.iter().sum();
        assert!(total >= 0.99 * cap as f64, "aggregate {total}");
    }
}

#[test]
fn idle_share_goes_to_others_and_comes_back() {
    let cap = 1_000_000_000;
    let set = five(cap);
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let mut d = vec![Demand::Greedy; 5];
    d[4] = Demand::Idle;
    let rates = run_link(&mut e, cap, &d, 1500, 0, 1_000_000_000);
    let mut idle = set.clone();
    idle.vifs.truncate(4);
    let want = allocate_set(&idle, &[None; 4]).unwrap();
    assert_close(&rates[..4], &want, 0.02);
    assert_eq!(rates[4], 0.0);
    // vm5 resumes: it gets its share back at once, not after a penalty.
    d[4] = Demand::Greedy;
    let rates = run_link(&mut e, cap, &d, 1500, 1_000_000_000, 500_000_000);
    assert_close(&rates, &allocate_set(&set, &[None; 5]).unwrap(), 0.02);
}

#[test]
fn demand_limited_vifs_get_their_demand() {
    let cap = 1_000_000_000;
    let set = five(cap);
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let mut d = vec![Demand::Greedy; 5];
    d[4] = Demand::Rate(100_000_000);
    d[3] = Demand::Rate(20_000_000);
    let rates = run_link(&mut e, cap, &d, 1500, 0, 2_000_000_000);
    let demands = [None, None, None, Some(20_000_000), Some(100_000_000)];
    assert_close(&rates, &allocate_set(&set, &demands).unwrap(), 0.02);
}

#[test]
fn floor_releases_when_share_rises_above_it() {
    let cap = 1_000_000_000;
    let set = PolicySet::new(Some(cap))
        .with_vif(
            "a",
            VifPolicy {
                min_bps: 600_000_000,
                ..Default::default()
            },
        )
        .with_vif("b", VifPolicy::default())
        .with_vif("c", VifPolicy::default());
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let d = vec![Demand::Greedy; 3];
    let rates = run_link(&mut e, cap, &d, 1500, 0, 2_000_000_000);
    assert_close(&rates, &[600_000_000, 200_000_000, 200_000_000], 0.02);
    // c leaves: a's weighted share (500) is still below its floor; b gets the rest.
    let d2 = vec![Demand::Greedy, Demand::Greedy, Demand::Idle];
    let rates = run_link(&mut e, cap, &d2, 1500, 2_000_000_000, 1_000_000_000);
    assert_close(&rates[..2], &[600_000_000, 400_000_000], 0.02);
    // Floor lowered live below the share: a gets its plain half at once.
    let mut p = set.vifs[0].policy.clone();
    p.min_bps = 100_000_000;
    let set = set.with_policy("a", p).unwrap();
    e.configure(&set, 3_000_000_000).unwrap();
    let rates = run_link(&mut e, cap, &d2, 1500, 3_000_000_000, 1_000_000_000);
    assert_close(&rates[..2], &[500_000_000, 500_000_000], 0.02);
}

#[test]
fn priority_vif_is_served_first_without_gaining_bandwidth() {
    let cap = 1_000_000_000;
    let set = PolicySet::new(Some(cap))
        .with_vif(
            "urgent",
            VifPolicy {
                priority: 0,
                ..Default::default()
            },
        )
        .with_vif("bulk1", VifPolicy::default())
        .with_vif("bulk2", VifPolicy::default());
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    // All greedy: priority buys no bandwidth.
    let d = vec![Demand::Greedy; 3];
    let rates = run_link(&mut e, cap, &d, 1500, 0, 1_000_000_000);
    assert_close(&rates, &[333_333_333; 3], 0.02);
    // A sparse urgent vif becoming ready is chosen at the very next decision.
    let mut ready = ReadySet::new(3);
    ready.set(1, true);
    ready.set(2, true);
    let now = 1_000_000_000;
    for _ in 0..10 {
        let g = e.select(&ready, now).unwrap();
        e.charge(
            g.vif,
            Usage {
                packets: 32,
                bytes: 48_000,
                cycles: 0,
            },
            now,
        );
    }
    ready.set(0, true);
    assert_eq!(e.select(&ready, now).unwrap().vif, 0);
}

/// Found by fuzzing (fuzz/ engine_sequence): after big batches raised the bucket depth's
/// two-batch floor, a vif given a cap of 0 (or a tiny one) started with two batches of
/// tokens and sent 3.4 MB against a cap of 0.
#[test]
fn a_new_cap_starts_with_its_own_burst_only() {
    let set = |max: u64| {
        PolicySet::new(Some(1_000_000_000)).with_vif(
            "a",
            VifPolicy {
                max_bps: Some(max),
                ..Default::default()
            },
        )
    };
    let mut e = Vqos::new();
    e.configure(&set(1_000_000_000), 0).unwrap();
    let mut ready = ReadySet::new(1);
    ready.set(0, true);
    let big = Usage {
        packets: 32,
        bytes: 32 * 65_000,
        cycles: 0,
    };
    let g = e.select(&ready, 0).unwrap();
    e.charge(g.vif, big, 0);
    // Cap 0: nothing, now or later.
    e.configure(&set(0), 1_000_000_000).unwrap();
    assert!(e.select(&ready, 1_000_000_000).is_none());
    assert!(e.select(&ready, 60_000_000_000).is_none());
    assert_eq!(e.eligible_at(60_000_000_000), u64::MAX);
    // Cap 8 Mbit/s (1 MB/s), from an empty bucket: eligible once it earned a token, then
    // one batch, and nothing until its 2 MB of debt is repaid.
    e.configure(&set(8_000_000), 60_000_000_000).unwrap();
    assert!(e.select(&ready, 60_000_000_000).is_none());
    let g = e.select(&ready, 60_001_000_000).unwrap();
    e.charge(g.vif, big, 60_001_000_000);
    assert!(e.select(&ready, 61_000_000_000).is_none());
    assert!(e.select(&ready, 62_000_000_000).is_none());
}

#[test]
fn cap_throttles_and_reports_when_eligible_again() {
    let set = PolicySet::new(Some(1_000_000_000)).with_vif(
        "a",
        VifPolicy {
            max_bps: Some(8_000_000), // 1 MB/s
            ..Default::default()
        },
    );
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let mut ready = ReadySet::new(1);
    ready.set(0, true);
    let mut now = 0;
    // Drain the burst.
    while let Some(g) = e.select(&ready, now) {
        e.charge(
            g.vif,
            Usage {
                packets: 32,
                bytes: 48_000,
                cycles: 0,
            },
            now,
        );
    }
    assert!(e.vif_state(0).throttled);
    let at = e.eligible_at(now);
    assert!(at > now && at < u64::MAX);
    assert!(e.select(&ready, at - 1).is_none());
    now = at;
    assert!(e.select(&ready, now).is_some());
}

/// A cap configured before any traffic (from a config file, restored after a restart)
/// holds when the batches turn out to be 32 TSO super-frames of 64 KB: the debt a bucket
/// tolerates grows with the biggest batch seen.
#[test]
fn cap_set_before_traffic_holds_with_super_frames() {
    let cap = 10_000_000_000;
    let set = PolicySet::new(Some(cap))
        .with_vif(
            "capped",
            VifPolicy {
                max_bps: Some(300_000_000),
                ..Default::default()
            },
        )
        .with_vif("other", VifPolicy::default());
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let d = vec![Demand::Greedy, Demand::Idle];
    let rates = run_link(&mut e, cap, &d, 65_536, 0, 2_000_000_000);
    assert_close(&rates[..1], &[300_000_000], 0.02);
}

/// A stated burst is what an idle capped vif sends above its max, then the max holds:
/// exactly `burst + rate × t` up to the one batch charged after it ran.
#[test]
fn burst_is_sent_above_the_max_after_idling_then_the_rate_holds() {
    let policy = |burst| VifPolicy {
        max_bps: Some(8_000_000), // 1 MB/s
        burst_bytes: burst,
        ..Default::default()
    };
    let batch = Usage {
        packets: 1,
        bytes: 1_000,
        cycles: 0,
    };
    let mut ready = ReadySet::new(1);
    ready.set(0, true);
    // Greedy from `from` for `dur` ns, stepping 100 µs: bytes sent.
    let run = |e: &mut Vqos, from: u64, dur: u64| {
        let mut sent = 0u64;
        let mut now = from;
        while now <= from + dur {
            while let Some(g) = e.select(&ready, now) {
                e.charge(g.vif, batch, now);
                sent += batch.bytes;
            }
            now += 100_000;
        }
        sent
    };
    for burst in [200_000u64, 1_000_000] {
        let set = PolicySet::new(Some(1_000_000_000)).with_vif("a", policy(Some(burst)));
        let mut e = Vqos::new();
        e.configure(&set, 0).unwrap();
        // Drain, then idle 10 s: the bucket fills to the burst, no more.
        run(&mut e, 0, 2_000_000_000);
        let t0 = 12_000_000_000;
        // At the first instant: the burst (to one batch of overdraft).
        let at_once = run(&mut e, t0, 0);
        assert!(
            at_once >= burst && at_once <= burst + batch.bytes,
            "burst {burst}: {at_once}"
        );
        // Over the next second: the rate, 1 MB, to one batch.
        let after = run(&mut e, t0 + 100_000, 1_000_000_000);
        let want = 1_000_000 + 100_000 / 1_000; // + the 100 µs before
        assert!(
            after.abs_diff(want) <= 2 * batch.bytes,
            "burst {burst}: {after} after"
        );
    }
    // No burst stated: the default, 5 ms at the rate (5 kB) or two batches (128 KiB): 132
    // batches of 1 000 bytes take the full bucket below zero.
    let set = PolicySet::new(Some(1_000_000_000)).with_vif("a", policy(None));
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    run(&mut e, 0, 2_000_000_000);
    let at_once = run(&mut e, 12_000_000_000, 0);
    assert_eq!(at_once, 132 * batch.bytes);
}

/// Removing a vif keeps every other vif's state with its name, not with its index: the
/// throttled vif's debt does not land on its neighbour.
#[test]
fn state_follows_the_name_when_a_vif_is_removed() {
    let set = PolicySet::new(Some(1_000_000_000))
        .with_vif(
            "gone",
            VifPolicy {
                max_bps: Some(8_000_000),
                ..Default::default()
            },
        )
        .with_vif(
            "kept",
            VifPolicy {
                max_bps: Some(8_000_000),
                ..Default::default()
            },
        );
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    // Drive "gone" deep into debt; "kept" stays full.
    let mut ready = ReadySet::new(2);
    ready.set(0, true);
    while let Some(g) = e.select(&ready, 0) {
        e.charge(
            g.vif,
            Usage {
                packets: 32,
                bytes: 48_000,
                cycles: 0,
            },
            0,
        );
    }
    assert!(e.vif_state(0).throttled);
    assert!(!e.vif_state(1).throttled);
    let kept_credit = e.vif_state(1).credit;
    let mut smaller = set.clone();
    smaller.vifs.remove(0);
    e.configure(&smaller, 0).unwrap();
    assert!(!e.vif_state(0).throttled, "kept inherited gone's debt");
    assert_eq!(e.vif_state(0).credit, kept_credit);
    assert_eq!(e.served_cost(0), 0);
}

#[test]
fn cycles_cost_model_shares_the_core_not_the_link() {
    let mut set = PolicySet::new(Some(10_000_000_000))
        .with_vif("a", VifPolicy::default())
        .with_vif("b", VifPolicy::default());
    set.cost = CostModel::Cycles;
    let mut e = Vqos::new();
    e.configure(&set, 0).unwrap();
    let mut ready = ReadySet::new(2);
    ready.set(0, true);
    ready.set(1, true);
    // b's batches cost 10× the cycles of a's for the same bytes (small packets).
    let mut served = [0u64; 2];
    for t in 0..10_000u64 {
        let g = e.select(&ready, t * 1_000).unwrap();
        let cycles = if g.vif == 0 { 10_000 } else { 100_000 };
        served[g.vif] += 1;
        e.charge(
            g.vif,
            Usage {
                packets: 32,
                bytes: 48_000,
                cycles,
            },
            t * 1_000,
        );
    }
    // Equal cycles → a gets 10× the batches.
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((ratio - 10.0).abs() < 0.3, "ratio {ratio}");
}

/// Serves two always-ready vifs 10,000 times under `set`: vif 0 sends 32 × 64-byte frames
/// that cost the core 1,500 cycles each, vif 1 32 × 1,514-byte frames at 2,000 cycles each
/// (a flood and a bulk sender). Returns (bytes, cycles) served to each, and the last vif 1
/// cap credit.
fn flood_beside_bulk(set: &PolicySet) -> [(u64, u64); 2] {
    let mut e = Vqos::new();
    e.configure(set, 0).unwrap();
    let mut ready = ReadySet::new(2);
    ready.set(0, true);
    ready.set(1, true);
    let mut served = [(0u64, 0u64); 2];
    for t in 0..10_000u64 {
        let now = t * 1_000;
        let Some(g) = e.select(&ready, now) else {
            continue;
        };
        let (bytes, cycles) = if g.vif == 0 {
            (32 * 64, 32 * 1_500)
        } else {
            (32 * 1_514, 32 * 2_000)
        };
        served[g.vif].0 += bytes;
        served[g.vif].1 += cycles;
        e.charge(
            g.vif,
            Usage {
                packets: 32,
                bytes,
                cycles,
            },
            now,
        );
    }
    served
}

#[test]
fn with_cpu_fair_a_small_frame_flood_gets_a_share_of_the_core_not_the_core() {
    // No finite link: the core is what is shared. Bytes alone give the flood 24x the bulk
    // sender's batches (its bytes are 1/24th), so 18x its cycles; with cpu_fair both get
    // the same cycles.
    let mut set = PolicySet::new(None)
        .with_vif("flood", VifPolicy::default())
        .with_vif("bulk", VifPolicy::default());
    let bytes_only = flood_beside_bulk(&set);
    let by_bytes = bytes_only[0].1 as f64 / bytes_only[1].1 as f64;
    assert!(by_bytes > 15.0, "bytes alone: flood/bulk cycles {by_bytes}");
    set.cpu_fair = true;
    let fair = flood_beside_bulk(&set);
    let by_core = fair[0].1 as f64 / fair[1].1 as f64;
    assert!(
        (by_core - 1.0).abs() < 0.05,
        "cpu_fair: flood/bulk cycles {by_core}"
    );
    // Weights hold in the core's currency too: 1:3.
    set.vifs[1].policy.weight = 3;
    let weighted = flood_beside_bulk(&set);
    let by_core = weighted[1].1 as f64 / weighted[0].1 as f64;
    assert!(
        (by_core - 3.0).abs() < 0.1,
        "cpu_fair 1:3: bulk/flood cycles {by_core}"
    );
}

#[test]
fn with_cpu_fair_on_a_finite_link_the_dominant_resource_is_charged_and_caps_stay_bytes() {
    // A 1 Gbit/s link (125 MB/s) and a 2 GHz core: a core second is worth 62.5 link bytes per
    // 1,000 cycles. The flood's batch: 2,048 bytes or 48,000 cycles = 3,000 link bytes (the
    // core dominates); the bulk batch: 48,448 bytes or 64,000 cycles = 4,000 (the link does).
    let mut set = PolicySet::new(Some(1_000_000_000))
        .with_vif("flood", VifPolicy::default())
        .with_vif("bulk", VifPolicy::default());
    set.cpu_fair = true;
    let served = flood_beside_bulk(&set);
    // Equal dominant shares: the flood's 3,000 per batch against the bulk's 48,448.
    let batches = [served[0].0 / 2_048, served[1].0 / 48_448];
    let want = 48_448.0 / 3_000.0;
    let got = batches[0] as f64 / batches[1] as f64;
    assert!(
        (got / want - 1.0).abs() < 0.05,
        "flood/bulk batches {got}, want {want}"
    );
    // A cap is bytes on the wire whatever the core's time: 8 Mbit/s = 1 MB/s over 10 ms of
    // virtual time is 10 kB, plus its 5 ms burst and one batch of overdraft; charged the
    // core's time instead it would be a third less.
    set.vifs[0].policy.max_bps = Some(8_000_000);
    let capped = flood_beside_bulk(&set);
    assert!(
        (12_000..=20_000).contains(&capped[0].0),
        "capped flood sent {} bytes",
        capped[0].0
    );
}
