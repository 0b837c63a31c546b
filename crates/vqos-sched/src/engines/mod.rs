//! The engines. Each file is one algorithm behind [`crate::Engine`].

pub mod ancs;
pub mod c2qos;
pub mod policer;
pub mod rr;
pub mod tcm;
#[cfg(test)]
pub(crate) mod testkit;
pub mod vqos;

use std::collections::HashMap;

use crate::engine::{Engine, EngineKind};
use crate::policy::{PolicyError, PolicySet};
use crate::units::NS_PER_SEC;

/// Builds an engine of `kind`, configured with `policies` at `now_ns`.
pub fn build(
    kind: EngineKind,
    policies: &PolicySet,
    now_ns: u64,
) -> Result<Box<dyn Engine>, PolicyError> {
    let mut engine: Box<dyn Engine> = match kind {
        EngineKind::Rr => Box::new(rr::RoundRobin::new()),
        EngineKind::Ancs => Box::new(ancs::Ancs::new()),
        EngineKind::Policer => Box::new(policer::Policer::new()),
        EngineKind::Tcm => Box::new(tcm::Tcm::new()),
        EngineKind::C2qos => Box::new(c2qos::C2qos::new()),
        EngineKind::Vqos => Box::new(vqos::Vqos::new()),
    };
    engine.configure(policies, now_ns)?;
    Ok(engine)
}

// Helpers shared by the engines.

/// Largest credit a single quantity may hold; sums of a few such values stay far inside `i64`.
pub(crate) const CREDIT_LIMIT: i64 = i64::MAX / 8;

/// Denominator of a rate × duration product in bytes: bits/s × ns / (8 × 10⁹) = bytes.
const BYTE_NS_DENOM: u128 = 8 * NS_PER_SEC as u128;

/// Bytes a rate is worth over `period_ns`, with the fraction of a byte carried in `frac`
/// (numerator over [`BYTE_NS_DENOM`]).
pub(crate) fn rate_bytes(rate_bps: u64, period_ns: u64, frac: &mut u64) -> i64 {
    // rate_bps, period_ns < 2^64, so the product is < 2^128; frac < BYTE_NS_DENOM < 2^36 and the
    // product of two u64 is at most 2^128 − 2^65 + 1, so adding frac cannot overflow either.
    let num = u128::from(rate_bps) * u128::from(period_ns) + u128::from(*frac);
    *frac = (num % BYTE_NS_DENOM) as u64;
    i64::try_from(num / BYTE_NS_DENOM).map_or(CREDIT_LIMIT, |b| b.min(CREDIT_LIMIT))
}

/// The previous per-vif states keyed by vif name, with their old index, so that a new policy
/// snapshot can take over the states of the vifs that persist (`O(vifs)`).
pub(crate) fn by_name<T>(old: Vec<T>, name: impl Fn(&T) -> &str) -> HashMap<String, (usize, T)> {
    old.into_iter()
        .enumerate()
        .map(|(i, v)| (name(&v).to_string(), (i, v)))
        .collect()
}
