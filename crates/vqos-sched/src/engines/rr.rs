//! `rr`: round-robin over ready vifs, no policy — the native Xen netback baseline.
//!
//! ## Behavior
//! Every ready vif gets one batch of up to [`MAX_BURST`] frames in turn. With greedy senders of
//! equal frame sizes this splits the link equally (ANCS Fig. 4); a vif sending bigger frames or
//! fuller batches gets more. Weights, floors, caps and bursts are ignored.

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

    #[test]
    fn live_change_adds_and_removes_vifs_between_batches() {
        let two = (0..2).fold(PolicySet::new(None), |s, i| {
            s.with_vif(&format!("v{i}"), VifPolicy::default())
        });
        let mut rr = RoundRobin::new();
        rr.configure(&two, 0).unwrap();
        let mut ready = ReadySet::new(2);
        ready.set(0, true);
        ready.set(1, true);
        assert_eq!(rr.select(&ready, 0).unwrap().vif, 0);
        assert_eq!(rr.select(&ready, 1).unwrap().vif, 1);
        // A third vif joins mid-run: it is served in its turn.
        let three = two.clone().with_vif("v2", VifPolicy::default());
        rr.configure(&three, 2).unwrap();
        ready.resize(3);
        ready.set(2, true);
        let order: Vec<VifId> = (0..3).map(|t| rr.select(&ready, t).unwrap().vif).collect();
        assert_eq!(order, vec![0, 1, 2]);
        // Back to one vif: the cursor wraps instead of pointing past the end.
        let one = PolicySet::new(None).with_vif("v0", VifPolicy::default());
        rr.configure(&one, 3).unwrap();
        ready.resize(1);
        assert_eq!(rr.select(&ready, 4).unwrap().vif, 0);
        // An invalid set is refused and the engine keeps serving the old one.
        let bad = one.clone().with_vif("v0", VifPolicy::default());
        assert!(rr.configure(&bad, 5).is_err());
        assert_eq!(rr.select(&ready, 6).unwrap().vif, 0);
    }
}
