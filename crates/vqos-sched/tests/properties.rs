//! Property tests over random configurations of 1–64 vifs: the reference allocator is
//! work-conserving, respects floors and caps, and is weighted max-min fair; the `vqos` and
//! `ancs` engines, driven by the virtual-time link of `vqos_sched::testing`, converge to it
//! (`ancs` with one documented exception: demand-limited vifs holding most of the weight).

use proptest::prelude::*;

#[path = "../src/proptest_config.rs"]
mod proptest_config;
use proptest_config::config_beside_source as config;
use vqos_sched::alloc::{allocate, check_allocation, Claim};
use vqos_sched::testing::{run_link, Demand};
use vqos_sched::{build, EngineKind, PolicySet, VifPolicy};

const MBIT: u64 = 1_000_000;

/// A random vif: weight 1..=100, optional floor, optional cap, optional demand (Mbit/s).
fn claim() -> impl Strategy<Value = Claim> {
    (
        1u32..=100,
        prop::option::of(1u64..=200),
        prop::option::of(1u64..=800),
        prop::option::of(1u64..=800),
    )
        .prop_map(|(weight, min, max, demand)| {
            let max_bps = max.map(|m| m * MBIT);
            // Keep min ≤ max so the claim is valid on its own.
            let min_bps = min.map_or(0, |m| m * MBIT).min(max_bps.unwrap_or(u64::MAX));
            Claim {
                weight,
                min_bps,
                max_bps,
                demand_bps: demand.map(|d| d * MBIT),
            }
        })
}

/// Random vifs whose floors fit in `capacity` (floors scaled down when they do not).
fn claims(capacity: u64, max_len: usize) -> impl Strategy<Value = Vec<Claim>> {
    prop::collection::vec(claim(), 1..=max_len).prop_map(move |mut v| {
        let sum: u64 = v.iter().map(|c| c.min_bps).sum();
        if sum > capacity {
            for c in &mut v {
                c.min_bps = (u128::from(c.min_bps) * u128::from(capacity) / u128::from(sum)) as u64
                    / MBIT
                    * MBIT;
            }
        }
        v
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn reference_is_work_conserving_bounded_and_max_min_fair(
        capacity_mbit in 1u64..=10_000,
        vifs in claims(10_000 * MBIT, 64),
    ) {
        let capacity = capacity_mbit * MBIT;
        // Re-scale floors to this capacity.
        let mut vifs = vifs;
        let sum: u64 = vifs.iter().map(|c| c.min_bps).sum();
        if sum > capacity {
            for c in &mut vifs {
                c.min_bps = (u128::from(c.min_bps) * u128::from(capacity) / u128::from(sum)) as u64;
            }
        }
        let rates = allocate(capacity, &vifs).unwrap();
        prop_assert_eq!(rates.len(), vifs.len());
        // Tolerance: rounding to whole bit/s, at most one per vif.
        let tol = vifs.len() as f64 + 1.0;
        if let Err(e) = check_allocation(capacity, &vifs, &rates, tol) {
            return Err(TestCaseError::fail(format!("{e}: {vifs:?} -> {rates:?}")));
        }
    }
}

fn policy_set(capacity: u64, vifs: &[Claim]) -> PolicySet {
    vifs.iter()
        .enumerate()
        .fold(PolicySet::new(Some(capacity)), |s, (i, c)| {
            s.with_vif(
                &format!("v{i}"),
                VifPolicy {
                    weight: c.weight,
                    min_bps: c.min_bps,
                    max_bps: c.max_bps,
                    priority: (i % 8) as u8,
                    ..Default::default()
                },
            )
        })
}

fn demands(vifs: &[Claim]) -> Vec<Demand> {
    vifs.iter()
        .map(|c| c.demand_bps.map_or(Demand::Greedy, Demand::Rate))
        .collect()
}

/// How far below its reference a vif may fall: a fraction of the reference rate, and at least a
/// fraction of the capacity.
#[derive(Debug, Clone, Copy)]
struct Short {
    of_reference: f64,
    of_capacity: f64,
}

/// The tolerance of every engine in every case: 2 % of the reference rate, or 0.2 % of the
/// capacity for tiny shares (one 32-frame batch is 48 KB; a vif entitled to a few hundred
/// kbit/s gets only a handful of batches in the measurement window, so its rate is quantised).
const EXACT: Short = Short {
    of_reference: 0.02,
    of_capacity: 0.002,
};

/// ANCS with demand-limited vifs, below the reference (docs/design.md, "ANCS with
/// demand-limited vifs"): a demand-limited vif whose arrivals fall in step with the
/// round-robin is sometimes not found empty in a period, so that period its unused credit is
/// cut as arrears instead of handed on as CreditNext, and CreditNext starts its climb again;
/// the vifs on the level fall short. This bound is empirical: the worst cases seen in some
/// 24 000 random cases (scripts/proptest-deep.sh) are −2.9 % of the reference (2 % of the capacity,
/// weights 33 : 23 at 291 Mbit/s) and −4.8 % for shares of a few tens of Mbit/s. It is
/// checked only when no demand-limited vif has a floor above its demand: such a vif's unused
/// floor credit is what is cut, and the shortfall grows with it (−8 % seen); the derived
/// bound of `ancs_never_does_worse_than_no_redistribution` covers those. Above the
/// reference the 2 % of [`EXACT`] holds in every case.
const ANCS_DEMAND_SHORT: Short = Short {
    of_reference: 0.06,
    of_capacity: 0.005,
};

/// Runs `kind` on the virtual link and compares each vif with the reference: never more than
/// [`EXACT`] above it, never more than `short` below it.
fn converges(kind: EngineKind, capacity: u64, vifs: &[Claim]) -> Result<(), TestCaseError> {
    converges_within(kind, capacity, vifs, EXACT)
}

/// [`converges`] with `short` as the tolerance below the reference.
fn converges_within(
    kind: EngineKind,
    capacity: u64,
    vifs: &[Claim],
    short: Short,
) -> Result<(), TestCaseError> {
    converges_set(kind, capacity, vifs, &policy_set(capacity, vifs), short)
}

/// [`converges_within`] on `set`, the policies of `vifs` with more in them (bursts) that the
/// reference does not take.
fn converges_set(
    kind: EngineKind,
    capacity: u64,
    vifs: &[Claim],
    set: &PolicySet,
    short: Short,
) -> Result<(), TestCaseError> {
    let want = allocate(capacity, vifs).unwrap();
    let mut engine = build(kind, set, 0).unwrap();
    let d = demands(vifs);
    run_link(engine.as_mut(), capacity, &d, 1500, 0, 500_000_000);
    let got = run_link(
        engine.as_mut(),
        capacity,
        &d,
        1500,
        500_000_000,
        3_000_000_000,
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w = *w as f64;
        let over = (EXACT.of_reference * w).max(EXACT.of_capacity * capacity as f64);
        let under = (short.of_reference * w).max(short.of_capacity * capacity as f64);
        prop_assert!(
            *g <= w + over && *g >= w - under,
            "{kind}: vif {i} got {:.2} Mbit/s, reference {:.2} (claims {vifs:?})",
            g / 1e6,
            w / 1e6
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn vqos_engine_converges_to_the_reference(vifs in claims(1_000 * MBIT, 64)) {
        converges(EngineKind::Vqos, 1_000 * MBIT, &vifs)?;
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// A burst is a bounded amount of bytes sent once after idling: with any bursts (1 KiB to
    /// 256 KiB) the `vqos` engine converges to the same reference, which has no burst input.
    #[test]
    fn bursts_do_not_change_long_run_shares(
        vifs in claims(1_000 * MBIT, 32),
        bursts_kib in prop::collection::vec(1u64..=256, 32),
    ) {
        let mut set = policy_set(1_000 * MBIT, &vifs);
        for (v, b) in set.vifs.iter_mut().zip(&bursts_kib) {
            v.policy.burst_bytes = Some(b * 1024);
        }
        converges_set(EngineKind::Vqos, 1_000 * MBIT, &vifs, &set, EXACT)?;
    }
}

/// The same vifs with every demand removed (all greedy).
fn greedy(mut vifs: Vec<Claim>) -> Vec<Claim> {
    for c in &mut vifs {
        c.demand_bps = None;
    }
    vifs
}

proptest! {
    #![proptest_config(config(48))]

    /// ANCS meets the reference whenever every vif is backlogged: weights, floors and caps in
    /// any combination, 1–64 vifs.
    #[test]
    fn ancs_engine_converges_with_backlogged_vifs(vifs in claims(1_000 * MBIT, 64)) {
        converges(EngineKind::Ancs, 1_000 * MBIT, &greedy(vifs))?;
    }

    /// ANCS nears the reference with demand-limited vifs too, as long as the vifs the
    /// reference satisfies (rate = demand) hold at most half the weight of the vifs that share
    /// CreditNext (beyond that, it takes longer than the settling time to converge: see
    /// `ancs_credit_next_converges_slowly_when_satisfied_vifs_hold_most_weight`) and no
    /// demand-limited vif has a floor above its demand. Below the reference within
    /// [`ANCS_DEMAND_SHORT`], not [`EXACT`] (see there and
    /// `ancs_demand_limited_vif_in_step_with_the_round_robin`).
    #[test]
    fn ancs_engine_converges_with_demand_limited_vifs(
        vifs in claims(1_000 * MBIT, 64).prop_map(floors_at_most_demand)
    ) {
        prop_assume!(satisfied_weight_fraction(1_000 * MBIT, &vifs) <= 0.5);
        converges_within(EngineKind::Ancs, 1_000 * MBIT, &vifs, ANCS_DEMAND_SHORT)?;
    }

    /// What ANCS guarantees with demand-limited vifs, whatever their weights and floors: no
    /// vif gets less than it would if no unused credit were ever redistributed (the
    /// reference with every vif greedy, at most its demand), nor more than the reference.
    #[test]
    fn ancs_never_does_worse_than_no_redistribution(vifs in claims(1_000 * MBIT, 64)) {
        prop_assume!(satisfied_weight_fraction(1_000 * MBIT, &vifs) <= 0.5);
        no_worse_than_no_redistribution(1_000 * MBIT, &vifs)?;
    }
}

/// The same vifs with every demand-limited vif's floor lowered to its demand if above.
fn floors_at_most_demand(mut vifs: Vec<Claim>) -> Vec<Claim> {
    for c in &mut vifs {
        if let Some(d) = c.demand_bps {
            c.min_bps = c.min_bps.min(d);
        }
    }
    vifs
}

/// ANCS's rates are within [`EXACT`] above the reference and within [`EXACT`] below the
/// no-redistribution split (the reference with every vif greedy, at most the vif's demand).
fn no_worse_than_no_redistribution(capacity: u64, vifs: &[Claim]) -> Result<(), TestCaseError> {
    let want = allocate(capacity, vifs).unwrap();
    let alone = allocate(capacity, &greedy(vifs.to_vec())).unwrap();
    let set = policy_set(capacity, vifs);
    let mut engine = build(EngineKind::Ancs, &set, 0).unwrap();
    let d = demands(vifs);
    run_link(engine.as_mut(), capacity, &d, 1500, 0, 500_000_000);
    let got = run_link(
        engine.as_mut(),
        capacity,
        &d,
        1500,
        500_000_000,
        3_000_000_000,
    );
    let tol = |w: f64| (EXACT.of_reference * w).max(EXACT.of_capacity * capacity as f64);
    for (i, c) in vifs.iter().enumerate() {
        let w = want[i] as f64;
        let floor = alone[i].min(c.demand_bps.unwrap_or(u64::MAX)) as f64;
        prop_assert!(
            got[i] <= w + tol(w) && got[i] >= floor - tol(floor),
            "ancs: vif {i} got {:.2} Mbit/s, reference {:.2}, no redistribution {:.2} \
             (claims {vifs:?})",
            got[i] / 1e6,
            w / 1e6,
            floor / 1e6
        );
    }
    Ok(())
}

/// CreditNext's convergence ratio at the reference allocation: among the vifs that share it
/// by weight — those whose demand the reference meets in full (they drain their queues and
/// hand their unused credit back) and those on the water level (strictly between their floor
/// and their cap) — the weight fraction of the former. 1 when no vif is on the level.
fn satisfied_weight_fraction(capacity: u64, vifs: &[Claim]) -> f64 {
    let want = allocate(capacity, vifs).unwrap();
    let (mut satisfied, mut level) = (0u64, 0u64);
    for (c, &w) in vifs.iter().zip(&want) {
        if c.demand_bps.is_some_and(|d| w + 1 >= d) {
            satisfied += u64::from(c.weight);
        } else if w > c.lo() + 1 && c.hi().is_none_or(|hi| w + 1 < hi) {
            level += u64::from(c.weight);
        }
    }
    if level == 0 {
        return if satisfied == 0 { 0.0 } else { 1.0 };
    }
    satisfied as f64 / (satisfied + level) as f64
}

/// Beyond the paper's algorithm: CreditNext is shared by weight among all active vifs, the
/// demand-limited ones included, who hand their share back unused the next period. It grows
/// to its fixed point `(f·C − d) / (1 − f)` per period geometrically, with ratio `f` = the
/// weight fraction of the demand-limited vifs, so the greedy vifs reach their reference rate
/// only after about `1 / (1 − f)` periods of 30 ms. Here f = 0.95: ANCS gives the greedy vif
/// far less than the reference over the window `converges` measures (0.5–3.5 s), yet it does
/// reach it (a later window is within 2 %), and the `vqos` engine meets it in the same window.
/// (Backlogged and demand-limited vifs below that weight fraction: the property tests above.)
#[test]
fn ancs_credit_next_converges_slowly_when_satisfied_vifs_hold_most_weight() {
    let capacity = 1_000 * MBIT;
    let vifs = [
        Claim {
            weight: 95,
            min_bps: 0,
            max_bps: None,
            demand_bps: Some(100 * MBIT),
        },
        Claim {
            weight: 5,
            min_bps: 0,
            max_bps: None,
            demand_bps: None,
        },
    ];
    assert_eq!(satisfied_weight_fraction(capacity, &vifs), 0.95);
    let want = allocate(capacity, &vifs).unwrap();
    assert_eq!(want, [100 * MBIT, 900 * MBIT]);

    let set = policy_set(capacity, &vifs);
    let d = demands(&vifs);
    let mut ancs = build(EngineKind::Ancs, &set, 0).unwrap();
    run_link(ancs.as_mut(), capacity, &d, 1500, 0, 500_000_000);
    let early = run_link(
        ancs.as_mut(),
        capacity,
        &d,
        1500,
        500_000_000,
        3_000_000_000,
    );
    // The demand-limited vif gets its demand; the greedy vif is well short of 900 Mbit/s.
    assert!((early[0] - 100e6).abs() <= 2e6, "{early:?}");
    assert!(early[1] < 0.98 * 900e6, "ANCS met the reference: {early:?}");
    // It is a matter of time, not of the fixed point: later it is within 2 %.
    let late = run_link(
        ancs.as_mut(),
        capacity,
        &d,
        1500,
        3_500_000_000,
        3_000_000_000,
    );
    assert!((late[1] - 900e6).abs() <= 0.02 * 900e6, "{late:?}");

    converges(EngineKind::Vqos, capacity, &vifs).unwrap();
    assert!(converges(EngineKind::Ancs, capacity, &vifs).is_err());
}

/// Regression (issue 11): weights 33 (greedy) and 23 (291 Mbit/s) on 1 Gbit/s. The reference
/// is 709 / 291 Mbit/s; ANCS gives 688.7 / 291.0, 20 Mbit/s of the link idle. The demand-limited
/// vif's arrivals fall in step with the round-robin so that in about one period of twelve it is
/// never found empty while holding credit: that period its unused credit is kept as arrears,
/// which the busy link cannot carry and which are cut, and CreditNext restarts its geometric
/// climb (ratio 23/56 per period) from zero. Documented in docs/design.md; the `vqos` engine
/// meets the reference.
#[test]
fn ancs_demand_limited_vif_in_step_with_the_round_robin() {
    let capacity = 1_000 * MBIT;
    let vifs = [
        Claim {
            weight: 33,
            min_bps: 0,
            max_bps: None,
            demand_bps: None,
        },
        Claim {
            weight: 23,
            min_bps: 0,
            max_bps: None,
            demand_bps: Some(291 * MBIT),
        },
    ];
    assert!(satisfied_weight_fraction(capacity, &vifs) <= 0.5);
    assert_eq!(allocate(capacity, &vifs).unwrap(), [709 * MBIT, 291 * MBIT]);
    let set = policy_set(capacity, &vifs);
    let d = demands(&vifs);
    let mut ancs = build(EngineKind::Ancs, &set, 0).unwrap();
    run_link(ancs.as_mut(), capacity, &d, 1500, 0, 500_000_000);
    let got = run_link(
        ancs.as_mut(),
        capacity,
        &d,
        1500,
        500_000_000,
        3_000_000_000,
    );
    // The behaviour documented, exactly (the virtual link is deterministic).
    assert!((got[0] / 1e6 - 688.7).abs() < 0.1, "{got:?}");
    assert!((got[1] / 1e6 - 291.0).abs() < 0.1, "{got:?}");
    assert!(converges(EngineKind::Ancs, capacity, &vifs).is_err());
    converges_within(EngineKind::Ancs, capacity, &vifs, ANCS_DEMAND_SHORT).unwrap();
    converges(EngineKind::Vqos, capacity, &vifs).unwrap();
}
