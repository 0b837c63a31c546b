//! The reference `select`: the `O(ready)` scan the engine used before its index, kept for the
//! tests to compare against (`equivalence.rs`). Configuration and charging are the engine's
//! own ([`Core`]); only the choice differs.

use super::{burst, FLOOR_BURST_NS};
use super::{Core, NS_PER_SEC};
use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, VifEngineState, MAX_BURST};
use crate::policy::{PolicyError, PolicySet, VifId};

/// The `vqos` engine choosing by a scan of every ready vif at every decision.
#[derive(Debug)]
pub(super) struct ScanVqos {
    /// Vif states, configuration and charging, as the engine's.
    pub(super) core: Core,
}

impl ScanVqos {
    pub(super) fn new() -> Self {
        ScanVqos { core: Core::new() }
    }
}

impl Engine for ScanVqos {
    fn kind(&self) -> EngineKind {
        EngineKind::Vqos
    }

    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        self.core.configure(policies, now_ns)
    }

    /// The engine's `select` as it was (but for `active` flags in place of generation numbers:
    /// a vif is "seen at the previous generation" when its flag is set).
    fn select(&mut self, ready: &ReadySet, now_ns: u64) -> Option<Grant> {
        // One pass over the ready vifs: refill their buckets, restart the tags of vifs that were
        // idle, and pick the winner (the rule is in the comment of `Vqos::select`).
        let core = &mut self.core;
        let mut seen = vec![false; core.vifs.len()];
        let max_batch = core.max_batch_cost;
        let window = core.vtime + core.slack;
        let mut vmin: Option<u128> = None;
        let mut lowest: Option<(u128, VifId)> = None;
        let mut best: Option<(u8, u64, u128, VifId)> = None;
        for id in ready.iter() {
            let Some(v) = core.vifs.get_mut(id) else {
                continue;
            };
            if let Some(cap) = v.cap.as_mut() {
                // A refill only adds: a cap still positive needs none to be eligible (the
                // next `charge` refills before it takes).
                if !cap.positive() {
                    cap.refill(now_ns);
                    if !cap.positive() {
                        continue;
                    }
                }
            }
            if let Some(f) = v.floor.as_mut() {
                f.refill(now_ns);
            }
            if !v.active {
                // Idle → busy: idleness earns no credit, in shares or in floor service.
                v.tag = v.tag.max(core.vtime);
                if let Some(f) = v.floor.as_mut() {
                    f.limit(burst(f.rate_per_sec(), FLOOR_BURST_NS) + 2 * max_batch);
                }
            }
            seen[id] = true;
            if vmin.is_none_or(|m| v.tag < m) {
                vmin = Some(v.tag);
                lowest = Some((v.tag, id));
            }
            let owed_ns = v.floor.as_ref().and_then(|f| {
                (f.positive() && f.rate_per_sec() > 0).then(|| {
                    let tokens = f.tokens() as u64;
                    // A u64 division where the product fits (any floor bucket of a real link
                    // does); u128 otherwise.
                    match tokens.checked_mul(NS_PER_SEC) {
                        Some(x) => x / f.rate_per_sec(),
                        None => {
                            (u128::from(tokens) * u128::from(NS_PER_SEC)
                                / u128::from(f.rate_per_sec())) as u64
                        }
                    }
                })
            });
            let key = match owed_ns {
                Some(owed) => (0, u64::MAX - owed, v.tag, id),
                None if v.tag <= window => (1, u64::from(v.priority), v.tag, id),
                None => continue,
            };
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        for (v, seen) in core.vifs.iter_mut().zip(seen) {
            v.active = seen;
        }
        core.vtime = core.vtime.max(vmin?);
        let vif = best.map(|b| b.3).or(lowest.map(|l| l.1))?;
        Some(Grant {
            vif,
            max_packets: MAX_BURST,
        })
    }

    fn charge(&mut self, vif: VifId, usage: Usage, now_ns: u64) {
        self.core.charge(vif, usage, now_ns);
    }

    fn eligible_at(&self, now_ns: u64) -> u64 {
        self.core.eligible_at(now_ns)
    }

    fn vif_state(&self, vif: VifId) -> VifEngineState {
        self.core.vif_state(vif, |cap| cap.tokens())
    }
}
