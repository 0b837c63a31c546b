//! What a policy set sells of the forwarding core (or the link), against what may be sold: the
//! oversell check C2TB's promise needs (see [`crate::cost`] for how purchases are priced).

use crate::engine::EngineKind;
use crate::policy::{CostModel, PolicyError, PolicySet};

/// What a set sells of the core, cycles (or bytes) per second, next to what it may sell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sold {
    /// Σ of the guarantees, priced (cost units per second).
    pub sold_per_sec: u64,
    /// What may be sold: `core_share × cycles_per_sec` (cycles), or the capacity (bytes).
    pub budget_per_sec: u64,
}

impl PolicySet {
    /// What `engine` guarantees the vifs of this set, priced, against what may be sold; `None`
    /// when the engine guarantees nothing in this set's cost unit or there is nothing to price
    /// against (bytes on an unlimited link; cycles with neither a model nor a capacity).
    pub fn sold(&self, engine: EngineKind) -> Option<Sold> {
        let guarantee: fn(&crate::VifPolicy) -> u64 = match engine {
            // C2TB's token rate is the purchase (max), or the min of a vif without a max.
            EngineKind::C2qos => |p| p.max_bps.unwrap_or(p.min_bps),
            // The floors; Σ min ≤ capacity is `validate`'s business under bytes.
            EngineKind::Vqos if self.cost == CostModel::Cycles => |p| p.min_bps,
            _ => return None,
        };
        let budget_per_sec = match self.cost {
            CostModel::Bytes => self.capacity_bps? / 8,
            CostModel::Cycles => {
                if self.pricing.model.is_none() && self.capacity_bps.is_none() {
                    return None;
                }
                (self.cycles_per_sec as f64 * self.pricing.core_share) as u64
            }
        };
        let sold: u128 = self
            .vifs
            .iter()
            .map(|v| u128::from(self.cost_per_sec(guarantee(&v.policy))))
            .sum();
        Some(Sold {
            sold_per_sec: u64::try_from(sold).unwrap_or(u64::MAX),
            budget_per_sec,
        })
    }

    /// Refuses a set whose guarantees under `engine` need more of the core (or link) than may
    /// be sold ([`PolicySet::sold`]); the engines that price in cycles call it on `configure`.
    pub fn check_sold(&self, engine: EngineKind) -> Result<(), PolicyError> {
        match self.sold(engine) {
            Some(s) if s.sold_per_sec > s.budget_per_sec => Err(PolicyError::Oversold {
                engine: engine.to_string(),
                sold: format_cost(s.sold_per_sec, self.cost),
                budget: format_cost(s.budget_per_sec, self.cost),
            }),
            _ => Ok(()),
        }
    }
}

/// `1.54G cycles/s`, `125M bytes/s`: a cost rate for messages.
pub fn format_cost(per_sec: u64, cost: CostModel) -> String {
    let unit = match cost {
        CostModel::Bytes => "bytes/s",
        CostModel::Cycles => "cycles/s",
    };
    let v = per_sec as f64;
    let (x, prefix) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    format!("{x:.3}{prefix} {unit}")
}
