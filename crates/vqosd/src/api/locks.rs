//! Learnt locks kept across restarts: port security locks a vif to the first addresses it
//! uses (MACs and, with the address guards, IPs). Those locks live in the switch; the daemon
//! copies them into its ports and the state file as they appear, so that after a restart each
//! port gets its own back when it is added, before it forwards, and a lock another port took
//! while it was away never outranks it (the data plane's `PortSecurity::restored`). The
//! completion of a migration's hand-over (`vqos port migrate`) is copied the same way.

use std::collections::BTreeMap;

use vqos_api::wire::LockedAddrs;

use super::Api;
use crate::state;

impl Api {
    /// Copies the locks the switch reports into the ports and saves the state file when any
    /// changed (the daemon calls it every second). Returns how many ports changed; an error
    /// saving leaves the ports as they were, to be tried again next time.
    pub fn sync_locks(&self) -> Result<usize, state::StateError> {
        let stats = self.backend.stats();
        let seen: BTreeMap<&str, &LockedAddrs> = stats
            .ports
            .iter()
            .map(|p| (p.name.as_str(), &p.locked))
            .collect();
        // A migration the switch completed (the destination's first frame): the source owns
        // nothing from then on, after a restart too.
        let completed: Vec<&str> = stats
            .ports
            .iter()
            .filter(|p| p.handover.as_ref().is_some_and(|h| h.complete))
            .map(|p| p.name.as_str())
            .collect();
        let mut v = self.lock();
        let mut next = v.clone();
        let mut changed = 0;
        for p in &mut next.ports {
            // A port the switch does not list yet (just added) keeps what it has: its
            // restored locks are the switch's too.
            if let Some(&locked) = seen.get(p.config.name.as_str()) {
                if *locked != p.state.locked {
                    p.state.locked = locked.clone();
                    changed += 1;
                }
            }
            if let Some(h) = p.state.handover.as_mut().filter(|h| !h.complete) {
                if completed.contains(&p.config.name.as_str()) {
                    h.complete = true;
                    changed += 1;
                }
            }
        }
        if changed > 0 {
            state::save(&self.state_file, &next.saved())?;
            self.commit(&mut v, next);
        }
        Ok(changed)
    }
}
