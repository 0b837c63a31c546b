//! Property tests over random configurations of 1–64 vifs: the reference allocator is
//! work-conserving, respects floors and caps, and is weighted max-min fair; the `vqos` and
//! `ancs` engines, driven by the virtual-time link of `vqos_sched::testing`, converge to it
//! (`ancs` with one documented exception: demand-limited vifs holding most of the weight).

use proptest::prelude::*;
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
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

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
                },
            )
        })
}

fn demands(vifs: &[Claim]) -> Vec<Demand> {
    vifs.iter()
        .map(|c| c.demand_bps.map_or(Demand::Greedy, Demand::Rate))
        .collect()
}

/// Runs `kind` on the virtual link and compares each vif with the reference. A vif may be off
/// by 2 % of its reference rate, or by 0.2 % of the capacity for tiny shares (one 32-frame
/// batch is 48 KB; a vif entitled to a few hundred kbit/s gets only a handful of batches in
/// the measurement window, so its rate is quantised).
fn converges(kind: EngineKind, capacity: u64, vifs: &[Claim]) -> Result<(), TestCaseError> {
    let set = policy_set(capacity, vifs);
    let want = allocate(capacity, vifs).unwrap();
    let mut engine = build(kind, &set, 0).unwrap();
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
        let tol = (0.02 * w).max(0.002 * capacity as f64);
        prop_assert!(
            (g - w).abs() <= tol,
            "{kind}: vif {i} got {:.2} Mbit/s, reference {:.2} (claims {vifs:?})",
            g / 1e6,
            w / 1e6
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases_or(48)))]

    #[test]
    fn vqos_engine_converges_to_the_reference(vifs in claims(1_000 * MBIT, 64)) {
        converges(EngineKind::Vqos, 1_000 * MBIT, &vifs)?;
    }
}

/// The same vifs with every demand removed (all greedy).
fn greedy(mut vifs: Vec<Claim>) -> Vec<Claim> {
    for c in &mut vifs {
        c.demand_bps = None;
    }
    vifs
}

/// `default` cases, or `PROPTEST_CASES` when set (an explicit `cases` ignores the variable).
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases_or(48)))]

    /// ANCS meets the reference whenever every vif is backlogged: weights, floors and caps in
    /// any combination, 1–64 vifs.
    #[test]
    fn ancs_engine_converges_with_backlogged_vifs(vifs in claims(1_000 * MBIT, 64)) {
        converges(EngineKind::Ancs, 1_000 * MBIT, &greedy(vifs))?;
    }

    /// ANCS meets the reference with demand-limited vifs too, as long as the vifs the
    /// reference satisfies (rate = demand) hold at most half the weight of the vifs that share
    /// CreditNext: beyond that, it takes longer than the settling time to converge (see
    /// `ancs_credit_next_converges_slowly_when_satisfied_vifs_hold_most_weight`).
    #[test]
    fn ancs_engine_converges_with_demand_limited_vifs(vifs in claims(1_000 * MBIT, 64)) {
        prop_assume!(satisfied_weight_fraction(1_000 * MBIT, &vifs) <= 0.5);
        converges(EngineKind::Ancs, 1_000 * MBIT, &vifs)?;
    }
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
