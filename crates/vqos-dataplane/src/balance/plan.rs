//! The division itself, a pure function: from every vif's policy and what each shard says it
//! wants, each shard's part of the capacity and how each shard runs each vif ([`Local`]).
//!
//! ## A vif carried by several shards
//! A vif's frames may cross more than one shard: what it receives is queued on the downlink
//! of whichever shard switched it (the uplink's frames on shard 0, a neighbour's on the
//! neighbour's shard). Its floor and its cap are one floor and one cap, so they are divided
//! among those shards, by the same reference allocator that divides the capacity:
//! - the vif's rate is its reference allocation over the sum of its demands on every shard;
//! - a vif active on one shard only (the common case) runs there under its own policy, its
//!   max lowered by what the other shards may let through ([`SLIVER_BPS`] each);
//! - a vif active on several shards has its rate divided among them by their demands
//!   (water-filling: a shard that wants less gets what it wants, the others share the rest
//!   evenly) and runs on each at exactly that part, as floor and as max;
//! - on a shard where it is idle, it has no floor and at most [`SLIVER_BPS`] if it has a
//!   max: enough for a first frame to pass, queue up and make that shard ask for more at
//!   the next period.
//!
//! Every shard's caps of one vif add up to at most its max (and, under a finite capacity,
//! exactly to its reference rate), so N shards never let a vif receive more than its max
//! beyond one period after a change (each shard takes a new division at its own next
//! period).

use vqos_sched::alloc::{allocate, Claim};
use vqos_sched::VifPolicy;

/// What a vif that is not held back is given beyond its rate, bits/s (and 1 % more): room to
/// grow before its reads fill up and it counts as greedy.
pub(crate) const HEADROOM_BPS: u64 = 10_000;

/// A vif is active on a shard that sends more than this, bits/s, or is held back there.
pub(crate) const IDLE_BPS: u64 = HEADROOM_BPS;

/// Most a capped vif may pass on a shard where it is idle, bits/s (see the module docs).
pub(crate) const SLIVER_BPS: u64 = 10_000;

/// What one shard says about one vif for one period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    /// Its frames were held back: it wants more than it gets.
    pub greedy: bool,
    /// What it passed, smoothed, bits/s.
    pub rate: u64,
}

impl Want {
    /// Held back, or passing more than [`IDLE_BPS`].
    fn active(self) -> bool {
        self.greedy || self.rate > IDLE_BPS
    }

    /// Its demand with headroom (`None`: greedy).
    fn demand(self) -> Option<u64> {
        (!self.greedy).then(|| self.rate.saturating_add(self.rate / 100))
    }
}

/// How one shard runs one vif (applied to its policy by [`Local::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Local {
    /// Its own policy, its max lowered by `cut` (never below its floor).
    Own {
        /// What the other shards may let through.
        cut: u64,
    },
    /// Idle here: no floor, at most [`SLIVER_BPS`] if it has a max.
    Sliver,
    /// Active on several shards: this shard's part, as floor and max.
    Part {
        /// Its floor here.
        min: u64,
        /// Its cap here (`None`: it has none, under an unlimited capacity).
        max: Option<u64>,
    },
}

impl Local {
    /// `policy` as this shard runs it.
    pub fn apply(self, policy: &VifPolicy) -> VifPolicy {
        let mut p = policy.clone();
        match self {
            Local::Own { cut } => {
                p.max_bps = p.max_bps.map(|m| m.saturating_sub(cut).max(p.min_bps));
            }
            Local::Sliver => {
                p.min_bps = 0;
                p.max_bps = p.max_bps.map(|m| m.min(SLIVER_BPS));
            }
            Local::Part { min, max } => {
                p.min_bps = min;
                p.max_bps = max;
            }
        }
        p
    }
}

/// One vif, as the division sees it.
#[derive(Debug, Clone)]
pub(crate) struct VifIn<'a> {
    /// Its policy in this direction.
    pub policy: &'a VifPolicy,
    /// The shard that runs it when it is active nowhere (or its only carrier).
    pub home: usize,
    /// The shards that may carry it, a bit each (`u64::MAX`: every shard, the downlink; the
    /// uplink: the shards that read it, [`crate::spread`]); `home` always may.
    pub carriers: u64,
    /// What each shard said, `(shard, want)`.
    pub wants: Vec<(usize, Want)>,
}

impl VifIn<'_> {
    fn want(&self, shard: usize) -> Option<Want> {
        self.wants
            .iter()
            .find(|(s, _)| *s == shard)
            .map(|&(_, w)| w)
    }

    fn carriers(&self, shards: usize) -> Vec<usize> {
        let home = self.home.min(shards - 1);
        (0..shards)
            .filter(|&s| s == home || (s < 64 && self.carriers & (1 << s) != 0))
            .collect()
    }

    /// Its demand over every shard (`None`: greedy; also before any shard said anything).
    fn demand(&self) -> Option<u64> {
        if self.wants.is_empty() {
            return None;
        }
        let mut sum = HEADROOM_BPS;
        for (_, w) in &self.wants {
            sum = sum.saturating_add(w.demand()?);
        }
        Some(sum)
    }
}

/// A division: each shard's part of the capacity and how it runs each vif.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The capacity divided (`None`: unlimited).
    pub capacity: Option<u64>,
    /// Each shard's part (all `u64::MAX` under an unlimited capacity).
    pub parts: Vec<u64>,
    /// Per vif, in the order given, per shard.
    pub locals: Vec<Vec<Local>>,
}

/// Divides `capacity` (`None`: unlimited) among `shards` shards for `vifs`; see the module
/// docs. Parts add up to the capacity: the vifs' rates where they run, and an even part of
/// what nobody wants. Policies the allocator refuses (floors above the capacity: only a race
/// with a change, the set was validated) leave an even split, every vif on its home shard.
pub(crate) fn plan(capacity: Option<u64>, vifs: &[VifIn], shards: usize) -> Plan {
    let shards = shards.max(1);
    let cap = capacity.unwrap_or(u64::MAX);
    let claims: Vec<Claim> = vifs
        .iter()
        .map(|v| Claim::new(v.policy, v.demand()))
        .collect();
    let rates = allocate(cap, &claims).ok();
    let mut parts = vec![0u64; shards];
    let locals = vifs
        .iter()
        .enumerate()
        .map(|(i, v)| match &rates {
            Some(rates) => place(v, rates[i], capacity.is_some(), shards, &mut parts),
            None => at_home(v, v.home.min(shards - 1), shards),
        })
        .collect();
    if rates.is_none() {
        parts.iter_mut().for_each(|p| *p = 0);
    }
    match capacity {
        Some(c) => {
            let used = parts.iter().fold(0u64, |a, &p| a.saturating_add(p)).min(c);
            let spare = c - used;
            let each = spare / shards as u64;
            parts.iter_mut().for_each(|p| *p += each);
            parts[0] += spare - each * shards as u64;
        }
        None => parts.iter_mut().for_each(|p| *p = u64::MAX),
    }
    Plan {
        capacity,
        parts,
        locals,
    }
}

/// How a shard runs a vif carried by `carriers` shards before a division for it exists:
/// at its home (`at_home`) under its own policy, its max lowered by a sliver for each other
/// carrier; elsewhere a sliver.
pub(crate) fn undivided(at_home: bool, carriers: u32, capped: bool) -> Local {
    match (at_home, capped) {
        (true, true) => Local::Own {
            cut: SLIVER_BPS * u64::from(carriers.saturating_sub(1)),
        },
        (true, false) => Local::Own { cut: 0 },
        (false, _) => Local::Sliver,
    }
}

/// `v` run at `home` under its own policy, a sliver on its other carriers.
fn at_home(v: &VifIn, home: usize, shards: usize) -> Vec<Local> {
    let carriers = v.carriers(shards);
    let sliver = if v.policy.max_bps.is_some() {
        SLIVER_BPS
    } else {
        0
    };
    let mut locals = vec![Local::Sliver; shards];
    locals[home] = Local::Own {
        cut: sliver * (carriers.len() as u64 - 1),
    };
    locals
}

/// How each shard runs `v` at its reference `rate`; adds what each shard carries of it to
/// `parts`.
fn place(v: &VifIn, rate: u64, finite: bool, shards: usize, parts: &mut [u64]) -> Vec<Local> {
    let carriers = v.carriers(shards);
    let active: Vec<usize> = carriers
        .iter()
        .copied()
        .filter(|&s| v.want(s).is_some_and(Want::active))
        .collect();
    if active.len() <= 1 {
        let home = active.first().copied().unwrap_or(v.home.min(shards - 1));
        parts[home] = parts[home].saturating_add(rate);
        return at_home(v, home, shards);
    }
    let capped = v.policy.max_bps.is_some();
    let idle = (carriers.len() - active.len()) as u64;
    let rate = if capped {
        rate.saturating_sub(SLIVER_BPS * idle)
    } else {
        rate
    };
    let demands: Vec<Option<u64>> = active
        .iter()
        .map(|&s| v.want(s).and_then(Want::demand))
        .collect();
    let mut locals = vec![Local::Sliver; shards];
    for (&s, p) in active.iter().zip(water_fill(rate, &demands)) {
        parts[s] = parts[s].saturating_add(p);
        locals[s] = if finite {
            Local::Part {
                min: p,
                max: Some(p.max(1)),
            }
        } else {
            // No capacity to compete for: only the cap (and the floor, as a share) split.
            let share = |x: u64| (u128::from(x) * u128::from(p) / u128::from(rate.max(1))) as u64;
            Local::Part {
                min: share(v.policy.min_bps),
                max: capped.then_some(p.max(1)),
            }
        };
    }
    locals
}

/// `total` divided among demands (`None`: greedy): each gets at most its demand, the
/// greedy ones share the rest evenly; what is left when every demand is met is spread
/// evenly too. The parts add up to `total`.
pub(crate) fn water_fill(total: u64, demands: &[Option<u64>]) -> Vec<u64> {
    let n = demands.len();
    let mut parts = vec![0u64; n];
    if n == 0 {
        return parts;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| demands[i].unwrap_or(u64::MAX));
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let even = left / (n - k) as u64;
        let give = demands[i].map_or(even, |d| d.min(even));
        parts[i] = give;
        left -= give;
    }
    let each = left / n as u64;
    parts.iter_mut().for_each(|p| *p += each);
    parts[order[n - 1]] += left - each * n as u64;
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy() -> Want {
        Want {
            greedy: true,
            rate: 0,
        }
    }

    fn sends(rate: u64) -> Want {
        Want {
            greedy: false,
            rate,
        }
    }

    fn capped(max: u64) -> VifPolicy {
        VifPolicy {
            max_bps: Some(max),
            ..VifPolicy::default()
        }
    }

    fn down<'a>(policy: &'a VifPolicy, wants: &[(usize, Want)]) -> VifIn<'a> {
        VifIn {
            policy,
            home: 0,
            carriers: u64::MAX,
            wants: wants.to_vec(),
        }
    }

    /// What shard `s` lets vif `i` of `plan` pass at most (`u64::MAX`: no cap).
    fn cap_on(plan: &Plan, policy: &VifPolicy, i: usize, s: usize) -> u64 {
        plan.locals[i][s].apply(policy).max_bps.unwrap_or(u64::MAX)
    }

    #[test]
    fn water_filling_meets_small_demands_and_shares_the_rest() {
        assert_eq!(water_fill(100, &[Some(10), None, None]), vec![10, 45, 45]);
        assert_eq!(water_fill(100, &[Some(70), Some(70)]), vec![50, 50]);
        // Every demand met: the rest spread evenly.
        assert_eq!(water_fill(100, &[Some(10), Some(20)]), vec![45, 55]);
        assert_eq!(water_fill(7, &[None, None]).iter().sum::<u64>(), 7);
        assert!(water_fill(5, &[]).is_empty());
    }

    #[test]
    fn a_vif_held_back_on_two_shards_gets_its_max_once_split_between_them() {
        let p = capped(20_000_000);
        for capacity in [None, Some(1_000_000_000)] {
            let plan = plan(capacity, &[down(&p, &[(0, greedy()), (1, greedy())])], 2);
            let caps: Vec<u64> = (0..2).map(|s| cap_on(&plan, &p, 0, s)).collect();
            assert_eq!(caps, vec![10_000_000, 10_000_000], "{capacity:?}");
        }
    }

    #[test]
    fn a_vif_active_on_one_shard_runs_there_under_its_own_policy_and_a_sliver_elsewhere() {
        let p = capped(20_000_000);
        let wants = [(0, sends(1_000)), (1, greedy()), (2, sends(0))];
        let plan = plan(Some(100_000_000), &[down(&p, &wants)], 3);
        assert_eq!(
            plan.locals[0][1],
            Local::Own {
                cut: 2 * SLIVER_BPS
            }
        );
        assert_eq!(plan.locals[0][0], Local::Sliver);
        let total: u64 = (0..3).map(|s| cap_on(&plan, &p, 0, s)).sum();
        assert_eq!(total, 20_000_000, "the caps add up to the max");
        assert_eq!(plan.parts.iter().sum::<u64>(), 100_000_000);
        // Its rate (20 Mbit/s) is carried by shard 1; the spare (80) is split evenly.
        assert_eq!(plan.parts[1], 20_000_000 + 80_000_000 / 3);
    }

    #[test]
    fn the_caps_of_a_split_vif_never_add_up_above_its_max() {
        let p = capped(30_000_000);
        let cases: [&[(usize, Want)]; 4] = [
            &[(0, sends(25_000_000)), (1, greedy()), (2, sends(0))],
            &[(0, sends(1_000_000)), (1, sends(2_000_000)), (2, greedy())],
            &[(0, greedy()), (1, greedy()), (2, greedy())],
            &[(0, sends(40_000_000)), (1, sends(40_000_000))],
        ];
        for wants in cases {
            for capacity in [None, Some(50_000_000), Some(10_000_000_000)] {
                let plan = plan(capacity, &[down(&p, wants)], 3);
                let total: u64 = (0..3).map(|s| cap_on(&plan, &p, 0, s)).sum();
                assert!(total <= 30_000_000, "{wants:?} {capacity:?}: {total}");
                assert!(total >= 30_000_000 * 9 / 10 || capacity == Some(50_000_000));
            }
        }
    }

    #[test]
    fn weights_hold_when_a_vif_is_split_and_another_is_not() {
        // a (weight 1) on shard 0 only, c (weight 3) on shards 0 and 1, both held back,
        // capacity 60: a 15, c 45 split 22.5 / 22.5; shard parts 37.5 / 22.5.
        let a = VifPolicy::default();
        let c = VifPolicy {
            weight: 3,
            ..VifPolicy::default()
        };
        let vifs = [
            down(&a, &[(0, greedy()), (1, sends(0))]),
            down(&c, &[(0, greedy()), (1, greedy())]),
        ];
        let plan = plan(Some(60_000_000), &vifs, 2);
        assert_eq!(plan.locals[0][0], Local::Own { cut: 0 });
        assert_eq!(
            plan.locals[1][1],
            Local::Part {
                min: 22_500_000,
                max: Some(22_500_000)
            }
        );
        assert_eq!(plan.parts, vec![37_500_000, 22_500_000]);
    }

    #[test]
    fn one_reader_per_vif_gives_the_reference_rates_to_the_readers() {
        // The uplink: every vif has one carrier; parts are the sum of its vifs' rates and
        // an even part of the spare, every vif under its own policy.
        let w = |weight| VifPolicy {
            weight,
            ..VifPolicy::default()
        };
        let (a, b, c) = (w(1), w(2), w(3));
        let up = |policy, home, want| VifIn {
            policy,
            home,
            carriers: 1 << home,
            wants: vec![(home, want)],
        };
        let vifs = [
            up(&a, 0, greedy()),
            up(&b, 1, sends(5_000_000)),
            up(&c, 0, greedy()),
        ];
        let plan = plan(Some(60_000_000), &vifs, 2);
        assert!(plan
            .locals
            .iter()
            .enumerate()
            .all(|(i, l)| l[vifs[i].home] == Local::Own { cut: 0 }));
        assert_eq!(plan.parts.iter().sum::<u64>(), 60_000_000);
        let b_rate = 5_000_000 + 5_000_000 / 100 + HEADROOM_BPS;
        assert_eq!(plan.parts[1], b_rate);
    }

    #[test]
    fn floors_the_allocator_refuses_leave_an_even_split() {
        let p = VifPolicy {
            min_bps: 80,
            ..VifPolicy::default()
        };
        let plan = plan(Some(50), &[down(&p, &[(0, greedy())])], 2);
        assert_eq!(plan.parts, vec![25, 25]);
    }
}
