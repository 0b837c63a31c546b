//! `[cost_model]`: how the cycles cost model prices purchases (vqos-sched's `cost` module).
//!
//! ```toml
//! cost = "cycles"
//! cycles_per_sec = 2600000000   # the cycle counter's rate (TSC)
//!
//! [cost_model]
//! base_cycles = 1300.0          # cycles(frame) = base_cycles + cycles_per_byte · bytes,
//! cycles_per_byte = 0.25        # in cycle-counter units (from `vqos calibrate`)
//! price_frame_bytes = 354       # purchases are priced at frames of this size (default: iMIX)
//! core_share = 0.9              # purchases may add up to this share of cycles_per_sec (default 1)
//! ```
//!
//! Both coefficients or neither: without them a purchase's share of the capacity is its share
//! of the core (and `price_frame_bytes` has no use), `core_share` still bounds what is sold.
//! The table needs `cost = "cycles"`: under bytes nothing is priced in cycles.

use serde::Deserialize;
use vqos_sched::{CostModel, FrameCost, Pricing};

use super::ConfigError;

/// The `[cost_model]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCostModel {
    base_cycles: Option<f64>,
    cycles_per_byte: Option<f64>,
    price_frame_bytes: Option<u32>,
    core_share: Option<f64>,
}

fn invalid(why: impl std::fmt::Display) -> ConfigError {
    ConfigError::CostModel(format!("cost_model: {why}"))
}

/// The pricing `raw` describes under `cost`, validated.
pub(super) fn pricing(raw: Option<RawCostModel>, cost: CostModel) -> Result<Pricing, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Pricing::default());
    };
    if cost != CostModel::Cycles {
        return Err(invalid(
            "the table prices purchases in cycles; it needs cost = \"cycles\"",
        ));
    }
    let model = match (raw.base_cycles, raw.cycles_per_byte) {
        (Some(a), Some(b)) => Some(FrameCost::new(a, b).map_err(invalid)?),
        (None, None) => None,
        _ => {
            return Err(invalid(
                "give both base_cycles and cycles_per_byte (or neither, to price purchases as \
                 their share of the capacity)",
            ))
        }
    };
    let d = Pricing::default();
    let p = Pricing {
        model,
        frame_bytes: raw.price_frame_bytes.unwrap_or(d.frame_bytes),
        core_share: raw.core_share.unwrap_or(d.core_share),
    };
    p.validate().map_err(invalid)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(extra: &str) -> Result<Config, String> {
        let text = format!(
            "capacity = \"10Gbit\"\nengine = \"c2qos\"\ncost = \"cycles\"\n\
             cycles_per_sec = 1540000000\n[[port]]\nname = \"vm1\"\n\
             policy = {{ max = \"4Gbit\" }}\n[[port]]\nname = \"vm2\"\n\
             policy = {{ max = \"4Gbit\" }}\n{extra}"
        );
        Config::parse(&text, |_| None).map_err(|e| vqos_api::chain(&e))
    }

    #[test]
    fn the_table_sets_the_pricing_of_the_policy_set() {
        let c = parse(
            "[cost_model]\nbase_cycles = 1300.0\ncycles_per_byte = 0.25\n\
             price_frame_bytes = 1518\ncore_share = 0.9\n",
        )
        .unwrap();
        let set = c.policy_set();
        let m = set.pricing.model.unwrap();
        assert_eq!((m.base_cycles(), m.cycles_per_byte()), (1300.0, 0.25));
        assert_eq!(
            (set.pricing.frame_bytes, set.pricing.core_share),
            (1518, 0.9)
        );
        // 8 Gbit/s of 1518-byte frames need 72 % of the core: within 90 %.
        assert_eq!(set.cost_per_sec(4_000_000_000), 553_194_993);
        // Without the table: the defaults (no model, iMIX frames, the whole core).
        let d = parse("").unwrap().policy_set().pricing;
        assert_eq!(d, vqos_sched::Pricing::default());
        // A reload cannot change it: the switch's pricing needs a restart.
        assert_eq!(parse("").unwrap().restart_needed(&c), vec!["cost_model"]);
        // Only the share: purchases priced as their share of the capacity, 80 % of 85 %.
        assert!(parse("[cost_model]\ncore_share = 0.85\n").is_ok());
        let e = parse("[cost_model]\ncore_share = 0.75\n").unwrap_err();
        assert_eq!(
            e,
            "Invalid config: Purchases need 1.232G cycles/s, more than the 1.155G cycles/s the \
             switch may sell (c2qos)"
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        for (extra, msg) in [
            (
                "base_cycles = 1300.0\n",
                "Invalid config: cost_model: give both base_cycles and cycles_per_byte (or \
                 neither, to price purchases as their share of the capacity)",
            ),
            (
                "base_cycles = -1.0\ncycles_per_byte = 0.25\n",
                "Invalid config: cost_model: base_cycles = -1 must be a finite number in \
                 0..=100000000",
            ),
            (
                "base_cycles = 0.0\ncycles_per_byte = 0.0\n",
                "Invalid config: cost_model: base_cycles and cycles_per_byte cannot both be 0",
            ),
            (
                "base_cycles = nan\ncycles_per_byte = 0.25\n",
                "Invalid config: cost_model: base_cycles = NaN must be a finite number in \
                 0..=100000000",
            ),
            (
                "price_frame_bytes = 0\n",
                "Invalid config: cost_model: price_frame_bytes = 0 must be in 1..=65536",
            ),
            (
                "core_share = 1.5\n",
                "Invalid config: cost_model: core_share = 1.5 must be above 0 and at most 1",
            ),
        ] {
            assert_eq!(parse(&format!("[cost_model]\n{extra}")).unwrap_err(), msg);
        }
        assert!(parse("[cost_model]\nbase = 1\n")
            .unwrap_err()
            .contains("unknown field `base`"));
        // At iMIX frames the two 4 Gbit/s purchases need more than the core.
        let e = parse("[cost_model]\nbase_cycles = 1300.0\ncycles_per_byte = 0.25\n").unwrap_err();
        assert!(e.contains("Purchases need 3.922G cycles/s"), "{e}");
        let bytes = "capacity = \"1Gbit\"\n[cost_model]\ncore_share = 0.5\n";
        assert_eq!(
            Config::parse(bytes, |_| None)
                .map_err(|e| vqos_api::chain(&e))
                .unwrap_err(),
            "Invalid config: cost_model: the table prices purchases in cycles; it needs cost = \
             \"cycles\""
        );
    }
}
