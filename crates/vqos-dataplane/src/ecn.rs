//! PID-ECN's marking probabilities on the switch: each vif's CE marking probability, set by
//! name (the controller's output, `vqos_sched::ecn`), applied to the ECT frames of the vif's
//! data direction.

use vqos_sched::PolicySet;

use crate::error::SwitchError;
use crate::switch::Switch;

impl Switch {
    /// Sets each named vif's CE marking probability (vifs not named get 0): ECT frames of the
    /// vif's data direction are marked with it, whichever way the vif's traffic goes —
    /// uplink→vif unicast frames, and frames the vif sends to the uplink alone (after the
    /// engine admitted them). Counted on the vif's port (`ecn_marked`, `ecn_not_ect`). Vifs are
    /// found by name when the call is applied, so a port added or removed since the caller
    /// computed them moves no probability to another vif; an unknown name or a probability
    /// outside 0..=1 refuses the call.
    pub fn set_ecn_probabilities(
        &mut self,
        probabilities: &[(String, f64)],
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        check_ecn_probabilities(&self.policies, probabilities)?;
        let mut thresholds = vec![0; self.policies.len()];
        for (name, p) in probabilities {
            if let Ok(id) = self.policies.id(name) {
                thresholds[id] = (p * 4_294_967_296.0) as u64;
            }
        }
        for (vif, threshold) in thresholds.into_iter().enumerate() {
            let slot = self.vif_slots.get(vif).copied();
            if let Some(s) = slot.and_then(|i| self.ports.get_mut(i)) {
                s.ecn_threshold = threshold;
            }
        }
        self.next_stats_ns = now_ns;
        Ok(())
    }
}

/// Checks ECN marking probabilities by vif name against the vifs of `policies`: each name a
/// vif's, each probability in 0..=1.
pub(crate) fn check_ecn_probabilities(
    policies: &PolicySet,
    probabilities: &[(String, f64)],
) -> Result<(), SwitchError> {
    for (name, p) in probabilities {
        if policies.id(name).is_err() {
            return Err(SwitchError::UnknownPort(name.clone()));
        }
        if !(0.0..=1.0).contains(p) {
            return Err(SwitchError::BadEcnProbability {
                vif: name.clone(),
                probability: *p,
            });
        }
    }
    Ok(())
}
