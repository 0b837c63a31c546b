//! When a stage of a cluster model has settled: the whole world (every tenant within its
//! slack of the reference, `crate::cluster`'s module doc), and each tenant on its own.
//!
//! ## Why each tenant
//! The world settles when its slowest tenant does, so one small tenant whose max moves between
//! two hosts sets the count for all (docs/cluster.md, "What the numbers say"). The aim,
//! "a demand change in force within 2 s", is about a tenant's change: [`Settled::moved`] says
//! how long the tenants the stage moved took, as percentiles.

use serde::Serialize;

use crate::cluster::World;

/// The periods to converge, from the last period of `periods` that was off: converged for at
/// least the last two periods, a flapping split is not (`None`).
pub(crate) fn settled(last_off: Option<u32>, periods: u32) -> Option<u32> {
    match last_off {
        Some(p) if p + 1 >= periods => None,
        Some(p) => Some(p + 1),
        None => Some(1),
    }
}

/// How the tenants a stage moved settled, in periods.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Moved {
    /// Tenants off the reference in some period of the stage.
    pub tenants: u32,
    /// The median tenant's periods to settle (`None`: not settled within the stage).
    pub p50: Option<u32>,
    /// The 90th percentile's.
    pub p90: Option<u32>,
    /// The 99th percentile's.
    pub p99: Option<u32>,
}

/// How a stage settled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settled {
    /// The periods until every tenant had (`None`: not within the stage).
    pub all: Option<u32>,
    /// The tenants it moved.
    pub moved: Moved,
}

/// The `q`-quantile (0 < q ≤ 1) of `sorted` periods, `None` (not settled) above every number.
fn quantile(sorted: &[Option<u32>], q: f64) -> Option<u32> {
    if sorted.is_empty() {
        return Some(0);
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

impl Moved {
    /// From each moved tenant's periods to settle.
    fn of(mut each: Vec<Option<u32>>) -> Moved {
        // `None` (not settled) sorts after every number.
        each.sort_by_key(|p| p.unwrap_or(u32::MAX));
        Moved {
            tenants: each.len() as u32,
            p50: quantile(&each, 0.50),
            p90: quantile(&each, 0.90),
            p99: quantile(&each, 0.99),
        }
    }
}

/// Runs `periods` periods of a model `m` (`period` runs one) over the world `world(m)`
/// returns; how it settled on the reference of the world as it is at the start.
pub(crate) fn settle<M>(
    periods: u32,
    m: &mut M,
    world: impl Fn(&M) -> &World,
    mut period: impl FnMut(&mut M),
) -> Settled {
    let reference = world(m).reference_bps();
    let mut last_off = None;
    let mut tenant_off: Vec<Option<u32>> = Vec::new();
    for p in 1..=periods {
        period(m);
        let (each, _) = world(m).tenant_distances(&reference);
        tenant_off.resize(each.len(), None);
        for (t, d) in each.into_iter().enumerate() {
            if d > 0.0 {
                tenant_off[t] = Some(p);
                last_off = Some(p);
            }
        }
    }
    let moved = tenant_off
        .into_iter()
        .flatten()
        .map(|p| settled(Some(p), periods))
        .collect();
    Settled {
        all: settled(last_off, periods),
        moved: Moved::of(moved),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_settles_when_its_last_tenant_does_and_the_percentiles_say_how_the_rest_did() {
        assert_eq!(settled(None, 10), Some(1));
        assert_eq!(settled(Some(3), 10), Some(4));
        // Off in one of the last two periods: not settled.
        assert_eq!(settled(Some(9), 10), None);
        let m = Moved::of(vec![Some(2), Some(2), Some(3), Some(9), None]);
        assert_eq!(m.tenants, 5);
        assert_eq!((m.p50, m.p90, m.p99), (Some(3), None, None));
        let m = Moved::of((1..=100).map(Some).collect());
        assert_eq!((m.p50, m.p90, m.p99), (Some(50), Some(90), Some(99)));
        assert_eq!(Moved::of(Vec::new()).tenants, 0);
    }
}
