//! The reference allocator: exact weighted max-min fairness with floors, caps and demands.
//!
//! This is the oracle every engine is judged against (DESIGN.md §4). For capacity `C` and vifs
//! with weight `w_i > 0`, floor `m_i`, cap `M_i` and demand `d_i`, let `lo_i = min(d_i, m_i)` and
//! `hi_i = min(d_i, M_i)`. If `Σ hi_i ≤ C` every vif gets `hi_i`; otherwise every vif gets
//! `a_i = clamp(w_i·L, lo_i, hi_i)` for the water level `L` at which `Σ a_i = C`.
//!
//! ## Behavior
//! - Work-conserving: nothing is left idle while some vif wants more.
//! - A floor binds only when the weighted share falls below it (ANCS Fig. 5: VM1 gets exactly
//!   its 200 Mbit/s minimum, not the minimum plus a share).
//! - Long-run rates only: a policy's `burst_bytes` is not an input (a burst is a bounded amount
//!   of bytes, sent once after idling, so it changes no long-run share), nor is `max_in_bps`
//!   (it limits what the vif receives; the shares here are what vifs send on the uplink).
//! - Computed by a sweep over the breakpoints `lo_i/w_i` and `hi_i/w_i` of the piecewise-linear
//!   function `L ↦ Σ a_i(L)`: `O(n log n)`.
//!
//! ## Limitations
//! The level is found in `f64`; rates are rounded down to whole bits per second, so the sum
//! can fall short of `C` by at most `n` bit/s up to 2^53 bit/s, and by up to a few ulps of `C`
//! per vif above (2048 bit/s per vif at 2^64). It never exceeds `C`: above 2^53 bit/s the
//! level's rounding can overshoot, and the excess is taken back exactly, in integers.

use crate::policy::{PolicyError, PolicySet, VifPolicy};
use crate::units::format_rate;

/// One vif as the allocator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Proportional share, > 0.
    pub weight: u32,
    /// Floor, bits/s.
    pub min_bps: u64,
    /// Cap, bits/s (`None` = unlimited).
    pub max_bps: Option<u64>,
    /// What the vif would send if nothing held it back (`None` = greedy).
    pub demand_bps: Option<u64>,
}

impl Claim {
    /// A claim from a policy and a demand.
    pub fn new(policy: &VifPolicy, demand_bps: Option<u64>) -> Self {
        Claim {
            weight: policy.weight,
            min_bps: policy.min_bps,
            max_bps: policy.max_bps,
            demand_bps,
        }
    }

    /// `min(demand, floor)`: the part of the floor the vif can use.
    pub fn lo(&self) -> u64 {
        self.demand_bps
            .map_or(self.min_bps, |d| d.min(self.min_bps))
    }

    /// `min(demand, cap)`: the most the vif may get (`None` = no bound).
    pub fn hi(&self) -> Option<u64> {
        match (self.demand_bps, self.max_bps) {
            (Some(d), Some(m)) => Some(d.min(m)),
            (Some(x), None) | (None, Some(x)) => Some(x),
            (None, None) => None,
        }
    }
}

/// Weighted max-min allocation of `capacity_bps` among `claims`; one rate per claim, in order.
///
/// Refuses weight 0, a floor above its cap, and floors summing above the capacity.
pub fn allocate(capacity_bps: u64, claims: &[Claim]) -> Result<Vec<u64>, PolicyError> {
    let mut sum_min: u128 = 0;
    for (i, c) in claims.iter().enumerate() {
        let name = format!("#{i}");
        if c.weight == 0 {
            return Err(PolicyError::ZeroWeight(name));
        }
        if let Some(max) = c.max_bps {
            if c.min_bps > max {
                return Err(PolicyError::MinAboveMax {
                    vif: name,
                    min: format_rate(Some(c.min_bps)),
                    max: format_rate(Some(max)),
                });
            }
        }
        sum_min += u128::from(c.min_bps);
    }
    if sum_min > u128::from(capacity_bps) {
        return Err(PolicyError::MinsOverCapacity {
            sum: format_rate(Some(u64::try_from(sum_min).unwrap_or(u64::MAX))),
            capacity: format_rate(Some(capacity_bps)),
        });
    }

    // Everyone can have what they want.
    let all_hi: Option<u128> = claims
        .iter()
        .map(|c| c.hi().map(u128::from))
        .sum::<Option<u128>>();
    if let Some(total) = all_hi {
        if total <= u128::from(capacity_bps) {
            return Ok(claims.iter().map(|c| c.hi().unwrap_or(0)).collect());
        }
    }

    let level = water_level(capacity_bps as f64, claims);
    let mut rates: Vec<u64> = claims
        .iter()
        .map(|c| {
            let share = f64::from(c.weight) * level;
            let lo = c.lo() as f64;
            let hi = c.hi().map_or(f64::INFINITY, |h| h as f64);
            // `as` saturates: a share rounded above u64::MAX is clamped, never wrapped.
            (share.clamp(lo, hi).floor() as u64).clamp(c.lo(), c.hi().unwrap_or(u64::MAX))
        })
        .collect();
    take_back_excess(capacity_bps, claims, &mut rates);
    Ok(rates)
}

/// Makes `Σ rates ≤ capacity` exactly. Above 2^53 bit/s an `f64` cannot hold every whole
/// rate, and the level's rounding can hand out up to a few ulps per vif too much: the excess
/// is taken back, in integers, from the vifs above their floor with the highest rate per
/// weight first (never below a floor: the floors fit, `allocate` checked).
fn take_back_excess(capacity_bps: u64, claims: &[Claim], rates: &mut [u64]) {
    let sum: u128 = rates.iter().map(|&r| u128::from(r)).sum();
    let Some(mut excess) = sum.checked_sub(u128::from(capacity_bps)).filter(|&e| e > 0) else {
        return;
    };
    let mut above: Vec<usize> = (0..claims.len())
        .filter(|&i| rates[i] > claims[i].lo())
        .collect();
    // rate_a / w_a > rate_b / w_b, multiplied out (< 2^96).
    above.sort_by(|&a, &b| {
        let ka = u128::from(rates[a]) * u128::from(claims[b].weight);
        let kb = u128::from(rates[b]) * u128::from(claims[a].weight);
        kb.cmp(&ka)
    });
    for i in above {
        let take = u128::from(rates[i] - claims[i].lo()).min(excess);
        rates[i] -= take as u64;
        excess -= take;
        if excess == 0 {
            return;
        }
    }
}

/// The level `L` at which `Σ clamp(w_i·L, lo_i, hi_i) = capacity`, assuming it exists
/// (`Σ lo ≤ capacity < Σ hi`).
fn water_level(capacity: f64, claims: &[Claim]) -> f64 {
    // Breakpoints: at lo/w the vif starts following the level (slope += w); at hi/w it stops.
    let mut events: Vec<(f64, f64)> = Vec::with_capacity(claims.len() * 2);
    let mut value: f64 = 0.0;
    for c in claims {
        let w = f64::from(c.weight);
        value += c.lo() as f64;
        events.push((c.lo() as f64 / w, w));
        if let Some(hi) = c.hi() {
            events.push((hi as f64 / w, -w));
        }
    }
    // Starts before stops at equal levels, so a vif with lo == hi contributes no slope.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let (mut level, mut slope) = (0.0f64, 0.0f64);
    for (at, dw) in events {
        let next = value + slope * (at - level);
        if slope > 0.0 && next >= capacity {
            return level + (capacity - value) / slope;
        }
        value = next;
        level = at;
        slope += dw;
    }
    // Past the last breakpoint only greedy vifs follow the level.
    if slope > 0.0 {
        level + (capacity - value) / slope
    } else {
        level
    }
}

/// The reference allocation of a whole [`PolicySet`] for the given demands (one per vif).
pub fn allocate_set(set: &PolicySet, demands_bps: &[Option<u64>]) -> Result<Vec<u64>, PolicyError> {
    set.validate()?;
    let cap = set
        .capacity_bps
        .ok_or(PolicyError::NeedsCapacity("reference allocator"))?;
    let claims: Vec<Claim> = set
        .vifs
        .iter()
        .zip(demands_bps)
        .map(|(v, d)| Claim::new(&v.policy, *d))
        .collect();
    allocate(cap, &claims)
}

/// Checks the three properties of a weighted max-min allocation; `Err` says which one broke.
///
/// `tol_bps` absorbs rounding. Used by the property tests and by engines' self-checks.
pub fn check_allocation(
    capacity_bps: u64,
    claims: &[Claim],
    rates: &[u64],
    tol_bps: f64,
) -> Result<(), String> {
    let sum: f64 = rates.iter().map(|&r| r as f64).sum();
    let mut any_unsatisfied = false;
    for (i, (c, &r)) in claims.iter().zip(rates).enumerate() {
        let r = r as f64;
        if r + tol_bps < c.lo() as f64 {
            return Err(format!("vif {i}: {r} below its floor {}", c.lo()));
        }
        if let Some(hi) = c.hi() {
            if r > hi as f64 + tol_bps {
                return Err(format!("vif {i}: {r} above its cap/demand {hi}"));
            }
            if r + tol_bps < hi as f64 {
                any_unsatisfied = true;
            }
        } else {
            any_unsatisfied = true;
        }
    }
    if sum > capacity_bps as f64 + tol_bps {
        return Err(format!("sum {sum} exceeds capacity {capacity_bps}"));
    }
    if any_unsatisfied && sum + tol_bps * (claims.len() as f64) < capacity_bps as f64 {
        return Err(format!(
            "not work-conserving: sum {sum} < capacity {capacity_bps} while a vif wants more"
        ));
    }
    // Max-min: a vif that wants more never has a lower normalised rate than one above its floor.
    for (i, (ci, &ri)) in claims.iter().zip(rates).enumerate() {
        let wants_more = ci.hi().is_none_or(|h| (ri as f64) + tol_bps < h as f64);
        if !wants_more {
            continue;
        }
        for (j, (cj, &rj)) in claims.iter().zip(rates).enumerate() {
            let above_floor = rj as f64 > cj.lo() as f64 + tol_bps;
            let ni = ri as f64 / f64::from(ci.weight);
            let nj = rj as f64 / f64::from(cj.weight);
            if above_floor && ni + tol_bps < nj - tol_bps {
                return Err(format!(
                    "not max-min fair: vif {i} wants more at {ni}/weight, vif {j} has {nj}/weight"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy(weight: u32) -> Claim {
        Claim {
            weight,
            min_bps: 0,
            max_bps: None,
            demand_bps: None,
        }
    }

    fn mbit(r: u64) -> f64 {
        r as f64 / 1e6
    }

    #[test]
    fn ancs_fig5_targets() {
        let cap = 940_000_000;
        let mut v: Vec<Claim> = (1..=5).map(greedy).collect();
        let p1 = allocate(cap, &v).unwrap();
        let want1 = [62.7, 125.3, 188.0, 250.7, 313.3];
        for (r, w) in p1.iter().zip(want1) {
            assert!((mbit(*r) - w).abs() < 0.1, "{p1:?}");
        }
        v[4].max_bps = Some(150_000_000);
        let p2 = allocate(cap, &v).unwrap();
        for (r, w) in p2.iter().zip([79.0, 158.0, 237.0, 316.0, 150.0]) {
            assert!((mbit(*r) - w).abs() < 0.1, "{p2:?}");
        }
        v[0].min_bps = 200_000_000;
        let p3 = allocate(cap, &v).unwrap();
        for (r, w) in p3.iter().zip([200.0, 131.1, 196.7, 262.2, 150.0]) {
            assert!((mbit(*r) - w).abs() < 0.1, "{p3:?}");
        }
        check_allocation(cap, &v, &p3, 10.0).unwrap();
    }

    #[test]
    fn demand_limited_vif_leaves_the_rest() {
        let mut v = vec![greedy(1), greedy(1), greedy(1)];
        v[0].demand_bps = Some(100);
        assert_eq!(allocate(1000, &v).unwrap(), vec![100, 450, 450]);
    }

    #[test]
    fn under_subscribed_gives_everyone_their_demand() {
        let mut v = vec![greedy(1), greedy(3)];
        v[0].demand_bps = Some(10);
        v[1].demand_bps = Some(20);
        assert_eq!(allocate(1000, &v).unwrap(), vec![10, 20]);
    }

    #[test]
    fn floor_binds_only_below_share() {
        let mut v = vec![greedy(1), greedy(1)];
        v[0].min_bps = 300;
        assert_eq!(allocate(1000, &v).unwrap(), vec![500, 500]);
        v[0].min_bps = 700;
        assert_eq!(allocate(1000, &v).unwrap(), vec![700, 300]);
    }

    #[test]
    fn refuses_impossible_policies() {
        let mut v = vec![greedy(1), greedy(0)];
        assert!(matches!(allocate(10, &v), Err(PolicyError::ZeroWeight(_))));
        v[1].weight = 1;
        v[0].min_bps = 8;
        v[1].min_bps = 8;
        assert!(matches!(
            allocate(10, &v),
            Err(PolicyError::MinsOverCapacity { .. })
        ));
    }

    #[test]
    fn checker_catches_unfair_allocations() {
        let v = vec![greedy(1), greedy(1)];
        assert!(check_allocation(1000, &v, &[500, 500], 1.0).is_ok());
        assert!(check_allocation(1000, &v, &[400, 600], 1.0)
            .unwrap_err()
            .contains("max-min"));
        assert!(check_allocation(1000, &v, &[400, 400], 1.0)
            .unwrap_err()
            .contains("work-conserving"));
    }

    #[test]
    fn capacities_above_2_pow_53_are_never_over_allocated() {
        // Before the integer fix-up: 2^64 − 1 among weights 5, 13, 17, 19, 23 handed out 1793
        // bit/s more than the capacity, 2^63 − 1 897 bit/s more.
        let v: Vec<Claim> = [5, 13, 17, 19, 23].into_iter().map(greedy).collect();
        for cap in [
            u64::MAX,
            i64::MAX as u64,
            (1 << 53) + 1,
            12_345_678_901_234_567,
        ] {
            let r = allocate(cap, &v).unwrap();
            let sum: u128 = r.iter().map(|&x| u128::from(x)).sum();
            assert!(sum <= u128::from(cap), "{cap}: {sum} {r:?}");
            // Still work-conserving to within a few ulps per vif, and in weight order.
            assert!(u128::from(cap) - sum <= 5 * 4096, "{cap}: {sum}");
            assert!(r.windows(2).all(|w| w[0] < w[1]), "{r:?}");
        }
        // Floors are kept when the excess is taken back.
        let mut v = v;
        v[4].min_bps = u64::MAX / 2;
        let r = allocate(u64::MAX, &v).unwrap();
        assert!(r[4] >= u64::MAX / 2);
        assert!(r.iter().map(|&x| u128::from(x)).sum::<u128>() <= u128::from(u64::MAX));
    }
}
