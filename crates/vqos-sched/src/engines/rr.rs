//! `rr`: round-robin over ready vifs, no policy — the native Xen netback baseline.
//!
//! ## Behavior
//! Every ready vif gets one batch of up to [`MAX_BURST`] frames in turn. With greedy senders of
//! equal frame sizes this splits the link equally (ANCS Fig. 4); a vif sending bigger frames or
//! fuller batches gets more. Weights, floors and caps are ignored.

use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, MAX_BURST};
use crate::policy::{PolicyError, PolicySet, VifId};

/// Round-robin engine.
#[derive(Debug, Default)]
pub struct RoundRobin {
    /// Where the next scan starts: one past the vif served last.
    cursor: VifId,
    /// Number of vifs configured.
    len: usize,
}

impl RoundRobin {
    /// A round-robin engine with no vifs.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Engine for RoundRobin {
    fn kind(&self) -> EngineKind {
        EngineKind::Rr
    }

    fn configure(&mut self, policies: &PolicySet, _now_ns: u64) -> Result<(), PolicyError> {
        policies.validate()?;
        self.len = policies.len();
        if self.cursor >= self.len {
            self.cursor = 0;
        }
        Ok(())
    }

    fn select(&mut self, ready: &ReadySet, _now_ns: u64) -> Option<Grant> {
        let vif = ready.next_from(self.cursor)?;
        self.cursor = (vif + 1) % self.len.max(1);
        Some(Grant {
            vif,
            max_packets: MAX_BURST,
        })
    }

    fn charge(&mut self, _vif: VifId, _usage: Usage, _now_ns: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::VifPolicy;

    #[test]
    fn serves_ready_vifs_in_turn_and_skips_idle_ones() {
        let set = (0..4).fold(PolicySet::new(None), |s, i| {
            s.with_vif(&format!("v{i}"), VifPolicy::default())
        });
        let mut rr = RoundRobin::new();
        rr.configure(&set, 0).unwrap();
        let mut ready = ReadySet::new(4);
        assert_eq!(rr.select(&ready, 0), None);
        for v in [0, 2, 3] {
            ready.set(v, true);
        }
        let order: Vec<VifId> = (0..6).map(|t| rr.select(&ready, t).unwrap().vif).collect();
        assert_eq!(order, vec![0, 2, 3, 0, 2, 3]);
    }
}
