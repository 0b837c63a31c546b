//! The daemon's start: [`Api::plan`] checks everything that can be known before the switch
//! is touched (`vqosd --check` runs it dry), [`Api::start_planned`] brings the ports up and
//! saves the state.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use vqos_sched::PolicySet;

use super::{Api, ApiError, View};
use crate::backend::{Backend, Port};
use crate::config::Config;
use crate::state;

/// The ports and policies the daemon starts with, checked ([`Api::plan`]).
#[derive(Debug, Clone)]
pub struct StartPlan {
    /// The vifs' policies: the config's, the state file's winning, plus the ports added
    /// through the API.
    pub set: PolicySet,
    /// The vif ports, in the set's order.
    pub ports: Vec<Port>,
    /// Config ports deleted through the API (they stay deleted).
    pub removed: Vec<String>,
    /// The next port id to give (every port above has one).
    pub next_id: u64,
    /// What reading the state file warns about (a fallback to the last-good copy, a missing
    /// file that was expected).
    pub warnings: Vec<String>,
}

impl Api {
    /// Restores the state (config ports, except those deleted through the API, plus ports
    /// added through the API, with the state file's policies winning), adds every port to
    /// `backend`, and writes the state back.
    pub fn start(config: &Config, backend: Arc<dyn Backend>) -> Result<Api, ApiError> {
        Api::start_planned(config, Api::plan(config, false)?, backend)
    }

    /// Everything [`Api::start`] checks before it touches the switch: the state file (read
    /// and checked; `dry`: nothing set aside or removed, see [`state::check`]), the config's
    /// and the state file's ports merged, their policies validated as a set, the port limit.
    /// `vqosd --check` runs it dry; the start runs it, then [`Api::start_planned`].
    pub fn plan(config: &Config, dry: bool) -> Result<StartPlan, ApiError> {
        let uplink = config.uplink.as_ref().map(|u| u.config.name.as_str());
        let read = if dry { state::check } else { state::restore };
        let state::Restored {
            state: saved,
            mut warnings,
        } = read(&config.state_file, uplink, config.expect_state)?;
        warnings.extend(config.notices());
        let mut set = config.policy_set();
        let mut ports: Vec<Port> = config.ports.iter().map(|(p, _)| p.clone()).collect();
        let mut removed = Vec::new();
        let saved_next_id = saved.as_ref().map_or(0, |s| s.next_id);
        if let Some(saved) = saved {
            // Config ports deleted through the API stay deleted; a name no longer in the config
            // needs no memory.
            for name in saved.removed {
                if let Some(i) = ports.iter().position(|p| p.config.name == name) {
                    ports.remove(i);
                    set.vifs.remove(i);
                    removed.push(name);
                }
            }
            let heirs: Vec<String> = (saved.ports.iter())
                .filter_map(|p| p.state.handover.as_ref().map(|h| h.to.clone()))
                .collect();
            for sp in saved.ports {
                let (sp, policy) = sp.into_port();
                match set.id(&sp.config.name) {
                    Ok(id) => {
                        // `ports` and `set.vifs` are in the same order.
                        set.vifs[id].policy = policy;
                        let p = &mut ports[id];
                        if heirs.contains(&sp.config.name) {
                            // A config port that took a migrated identity keeps it.
                            let (c, s) = (&mut p.config, sp.config);
                            (c.macs, c.ips, c.serves) = (s.macs, s.ips, s.serves);
                            c.port_security = s.port_security;
                        }
                        p.state = sp.state;
                    }
                    Err(_) => {
                        set = set.with_vif(&sp.config.name, policy);
                        ports.push(sp);
                    }
                }
            }
        }
        set.validate()
            .and_then(|()| set.check_sold(config.engine))
            .map_err(|source| ApiError::Restore {
                path: config.state_file.clone(),
                source,
            })?;
        let mut next_id = saved_next_id;
        crate::api::give_ids(&mut ports, &mut next_id);
        if ports.len() > config.max_ports {
            return Err(ApiError::TooManyPorts {
                path: config.state_file.clone(),
                ports: ports.len(),
                max: config.max_ports,
            });
        }
        Ok(StartPlan {
            set,
            ports,
            removed,
            next_id,
            warnings,
        })
    }

    /// Starts on a plan of [`Api::plan`]: warns what reading the state file found, adds every
    /// port to `backend`, and writes the state back.
    pub fn start_planned(
        config: &Config,
        plan: StartPlan,
        backend: Arc<dyn Backend>,
    ) -> Result<Api, ApiError> {
        let StartPlan {
            set,
            ports,
            removed,
            next_id,
            warnings,
        } = plan;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        // The destination of a migration under way comes up without the identity it took:
        // its source has it, and migrates again once both are up.
        let adds = Api::restart_configs(&ports);
        for (p, v) in adds.iter().zip(&set.vifs) {
            match backend.add_port(p, &v.policy) {
                Ok(opened) => tracing::info!("Port {} up ({opened})", p.config.name),
                Err(source) => {
                    // Leave the switch as we found it.
                    for q in adds.iter().take_while(|q| q.config.name != p.config.name) {
                        let _ = backend.remove_port(&q.config.name);
                    }
                    return Err(ApiError::Backend {
                        name: p.config.name.clone(),
                        source,
                    });
                }
            }
        }
        for (src, dst) in Api::remigrations(&ports) {
            match backend.migrate_port(&src, &dst) {
                Ok(()) => tracing::info!("Port {src}: migration to {dst} under way again"),
                Err(e) => tracing::warn!(
                    "Port {src}: its migration to {dst} could not be made again: {}",
                    vqos_api::chain(&e)
                ),
            }
        }
        let view = View {
            set,
            ports,
            limits: BTreeMap::new(),
            ecn: BTreeMap::new(),
            removed,
            next_id,
            shares: BTreeMap::new(),
            managed: BTreeMap::new(),
            file: Arc::new(config.clone()),
        };
        state::save(&config.state_file, &view.saved())?;
        Ok(Api {
            backend,
            engine: config.engine,
            uplink: config.uplink.as_ref().map(|u| u.config.name.clone()),
            state_file: config.state_file.clone(),
            config_path: OnceLock::new(),
            warnings,
            started: Instant::now(),
            published: RwLock::new(Arc::new(view.clone())),
            view: Mutex::new(view),
            cluster: RwLock::new(None),
            aggregator: std::sync::OnceLock::new(),
        })
    }
}
