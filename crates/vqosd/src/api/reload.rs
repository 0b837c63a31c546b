//! Reloading the config file live (SIGHUP, `POST /v1/reload`, `vqos reload`).
//!
//! ## Behavior
//! - The file is compared with the file as last loaded (at start or by the previous reload),
//!   not with the running state: a reload applies what changed *in the file*. A `[[port]]`
//!   entry that is new is added (or, if a port of that name was added through the API, its
//!   policy is set from the file); an entry gone from the file is removed (a TAP vqosd created
//!   is deleted, as by `vqos port del`); an entry whose policy changed has that policy set.
//!   Entries that did not change leave their ports alone, so a policy changed through the API
//!   stays, ports added through the API and not named in the file stay, and a config port
//!   deleted through the API stays deleted unless its entry is new in the file.
//! - `capacity` and `max_ports` change live. Every other key (engine, cost, API, uplink,
//!   controllers, ...) needs a restart: a reload that changes one is refused as a whole, as is
//!   a port entry whose settings other than its policy (kind, socket, MACs, ...) changed.
//! - All or nothing: the new file is parsed and the resulting ports and policies validated as
//!   one set before anything is touched; a refusal changes nothing (switch, state file, view).
//!   Ports that stay keep forwarding throughout: the switch gets one policy snapshot first
//!   (new policies and capacity; ports about to leave lose only their minimum), then the new
//!   ports, then the state file is written, then the old ports are removed and the final
//!   snapshot installed. A failure before the state file is written is rolled back.
//! - One audit line (target `vqosd::audit`) per change, with the caller (`uid=N`, `token`,
//!   or `signal SIGHUP`).

use std::collections::BTreeSet;

use thiserror::Error;
use vqos_api::wire::ReloadView;

use super::{backend_fail, effective_policy, Api, View};
use crate::backend::{configured_address_in_use, Port};
use crate::config::Config;
use crate::http::Response;
use crate::state;
use crate::wire::PolicyView;
use std::sync::Arc;
use vqos_api::chain;
use vqos_sched::units::format_rate;
use vqos_sched::VifPolicy;

/// Why a reload was refused (nothing changed) or only partly done.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct ReloadError {
    /// The HTTP status of the answer (409 needs a restart or conflicts, 422 invalid, 500
    /// switch or disk).
    pub status: u16,
    /// What went wrong; starts with "Reload refused, nothing changed" when nothing did.
    pub message: String,
}

fn refused(status: u16, why: impl std::fmt::Display) -> ReloadError {
    ReloadError {
        status,
        message: format!("Reload refused, nothing changed: {why}"),
    }
}

/// The first setting (in the order of their names) that differs between two descriptions
/// of one port; the policy is none of them. Every field of the port's configuration counts,
/// so a new one needs nothing here.
fn port_change(old: &Port, new: &Port) -> Option<String> {
    let json = |p: &Port| match serde_json::to_value(&p.config) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (old, new) = (json(old), json(new));
    (old.keys().chain(new.keys()))
        .find(|k| old.get(*k) != new.get(*k))
        .cloned()
}

impl Api {
    /// Sets the config file that a reload reads (the daemon calls it once, after the start);
    /// without it a reload is refused.
    pub fn set_config_path(&self, path: std::path::PathBuf) {
        let _ = self.config_path.set(path);
    }

    /// `POST /v1/reload`.
    pub(super) fn reload_request(&self, caller: &str) -> Result<Response, (u16, String)> {
        self.reload_file(caller)
            .map(|r| Response::json(200, &r))
            .map_err(|e| (e.status, e.message))
    }

    /// Re-reads the config file set by [`Api::set_config_path`] and applies what changed
    /// (see the module docs); `caller` is named in the audit lines.
    pub fn reload_file(&self, caller: &str) -> Result<ReloadView, ReloadError> {
        let Some(path) = self.config_path.get() else {
            return Err(refused(409, "the daemon has no config file to reload"));
        };
        let next = Config::load(path).map_err(|e| refused(422, chain(&e)))?;
        self.reload(&next, caller)
    }

    /// Applies `next` as the new config file (see the module docs).
    pub fn reload(&self, next: &Config, caller: &str) -> Result<ReloadView, ReloadError> {
        let mut v = self.lock();
        let old = v.file.clone();
        let keys = old.restart_needed(next);
        if !keys.is_empty() {
            return Err(refused(
                409,
                format!("{} cannot change without a restart", keys.join(", ")),
            ));
        }
        let mut report = ReloadView::default();
        let mut nv = v.clone();
        nv.file = Arc::new(next.clone());
        nv.set.capacity_bps = next.capacity_bps;
        nv.set.capacity_in_bps = next.capacity_in_bps;
        // Entries gone from the file.
        for (p, _) in &old.ports {
            if next
                .ports
                .iter()
                .any(|(q, _)| q.config.name == p.config.name)
            {
                continue;
            }
            nv.removed.retain(|n| *n != p.config.name);
            if let Ok(id) = nv.set.id(&p.config.name) {
                nv.set.vifs.remove(id);
                let gone = nv.ports.remove(id).state.id;
                nv.limits.remove(&gone);
                nv.ecn.remove(&gone);
                report.removed.push(p.config.name.clone());
            }
        }
        // Entries new in the file, or changed.
        let mut added: Vec<(Port, VifPolicy)> = Vec::new();
        for (p, policy) in &next.ports {
            let before = old
                .ports
                .iter()
                .find(|(q, _)| q.config.name == p.config.name);
            if let Some((q, _)) = before {
                if let Some(what) = port_change(q, p) {
                    return Err(refused(
                        409,
                        format!(
                            "port '{}': its {what} changed; only a policy changes live \
                             (remove the entry, reload, then add it back)",
                            p.config.name
                        ),
                    ));
                }
            } else {
                nv.removed.retain(|n| *n != p.config.name);
            }
            let file_policy_changed = before.is_none_or(|(_, old_policy)| old_policy != policy);
            match nv.set.id(&p.config.name) {
                Ok(id) => {
                    if before.is_none() {
                        if let Some(what) = port_change(&nv.ports[id], p) {
                            return Err(refused(
                                409,
                                format!(
                                    "port '{}' exists with another {what}; only a policy \
                                     changes live",
                                    p.config.name
                                ),
                            ));
                        }
                    }
                    if file_policy_changed && nv.set.vifs[id].policy != *policy {
                        nv.set.vifs[id].policy = policy.clone();
                        report.policies.push(p.config.name.clone());
                    }
                }
                // Not in the switch: new in the file, or deleted through the API (stays so).
                Err(_) if before.is_none() => {
                    nv.set = nv.set.with_vif(&p.config.name, policy.clone());
                    nv.ports.push(p.clone());
                    added.push((p.clone(), policy.clone()));
                    report.added.push(p.config.name.clone());
                }
                Err(_) => {}
            }
        }
        nv.give_ids();
        for (p, _) in &mut added {
            if let Some(q) = nv.ports.iter().find(|q| q.config.name == p.config.name) {
                p.state.id = q.state.id;
            }
        }
        nv.set.validate().map_err(|e| refused(422, e))?;
        self.check_sold(&nv.set).map_err(|(s, e)| refused(s, e))?;
        if nv.ports.len() > next.max_ports {
            return Err(refused(
                409,
                format!(
                    "{} ports exceed max_ports = {}",
                    nv.ports.len(),
                    next.max_ports
                ),
            ));
        }
        for (p, _) in &added {
            if let Some(e) =
                configured_address_in_use(&nv.ports, &p.config.name, &p.config.macs, &p.config.ips)
            {
                return Err(refused(409, e));
            }
        }
        if old.capacity_bps != next.capacity_bps || old.capacity_in_bps != next.capacity_in_bps {
            report.capacity = Some(format_rate(next.capacity_bps));
        }
        if old.max_ports != next.max_ports {
            report.max_ports = Some(next.max_ports);
        }
        if report.is_empty() {
            // Comments, order, or entries of ports deleted through the API: nothing to apply
            // to the switch; a deletion no longer needed is forgotten on disk too.
            if nv.removed != v.removed {
                state::save(&self.state_file, &nv.saved())
                    .map_err(|e| refused(500, format!("state not saved: {}", chain(&e))))?;
            }
            self.commit(&mut v, nv);
            return Ok(report);
        }
        self.apply(&mut v, nv, &added, &report)?;
        audit(caller, &v, &report);
        Ok(report)
    }

    /// Drives the switch and the state file from `v` to `nv` (see the module docs).
    fn apply(
        &self,
        v: &mut View,
        nv: View,
        added: &[(Port, VifPolicy)],
        report: &ReloadView,
    ) -> Result<(), ReloadError> {
        let leaving: BTreeSet<&str> = report.removed.iter().map(String::as_str).collect();
        let before = v.effective();
        // First snapshot: the ports now in the switch, with their new policies and the new
        // capacity; those about to leave keep theirs without a minimum (Σ min stays within
        // the new capacity, as the new set's does).
        let mut first = before.clone();
        first.capacity_bps = nv.set.capacity_bps;
        first.capacity_in_bps = nv.set.capacity_in_bps;
        for spec in &mut first.vifs {
            if leaving.contains(spec.name.as_str()) {
                spec.policy.min_bps = 0;
            } else if let Ok(id) = nv.set.id(&spec.name) {
                let limit = nv.limits.get(&nv.ports[id].state.id).copied();
                spec.policy = effective_policy(nv.set.policy(id), limit);
            }
        }
        if first != before {
            self.backend.set_policies(&first).map_err(|e| {
                let (status, msg) = backend_fail(e);
                refused(status, msg)
            })?;
        }
        let undo = |done: &[&str]| {
            for name in done {
                let _ = self.backend.remove_port(name);
            }
            let _ = self.backend.set_policies(&before);
        };
        let mut done: Vec<&str> = Vec::new();
        let mut opened = Vec::new();
        for (p, policy) in added {
            match self.backend.add_port(p, policy) {
                Ok(o) => opened.push(format!("Port {} up ({o})", p.config.name)),
                Err(e) => {
                    undo(&done);
                    let (status, msg) = backend_fail(e);
                    return Err(refused(status, msg));
                }
            }
            done.push(&p.config.name);
        }
        if let Err(e) = state::save(&self.state_file, &nv.saved()) {
            undo(&done);
            return Err(refused(500, format!("state not saved: {}", chain(&e))));
        }
        for line in opened {
            tracing::info!("{line}");
        }
        // From here the change is saved: what fails is told, the rest still applies.
        let mut errors = Vec::new();
        for name in &report.removed {
            if let Err(e) = self.backend.remove_port(name) {
                errors.push(format!("port '{name}' not removed from the switch: {e}"));
            }
        }
        let last = nv.effective();
        if last != first || !added.is_empty() || !leaving.is_empty() {
            if let Err(e) = self.backend.set_policies(&last) {
                errors.push(format!("final policy snapshot refused: {e}"));
            }
        }
        self.commit(v, nv);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ReloadError {
                status: 500,
                message: format!("Reload saved, but: {}", errors.join("; ")),
            })
        }
    }
}

/// One audit line per change the reload made.
fn audit(caller: &str, v: &View, report: &ReloadView) {
    let describe = |name: &str| {
        v.set.id(name).map_or_else(
            |_| String::new(),
            |id| {
                let p = PolicyView::from(v.set.policy(id));
                serde_json::to_string(&p).unwrap_or_default()
            },
        )
    };
    for name in &report.added {
        tracing::info!(target: "vqosd::audit", caller, "reload: port {name} added, policy {}", describe(name));
    }
    for name in &report.removed {
        tracing::info!(target: "vqosd::audit", caller, "reload: port {name} removed");
    }
    for name in &report.policies {
        tracing::info!(target: "vqosd::audit", caller, "reload: policy of {name} set to {}", describe(name));
    }
    if let Some(c) = &report.capacity {
        tracing::info!(target: "vqosd::audit", caller, "reload: capacity set to {c}");
    }
    if let Some(m) = report.max_ports {
        tracing::info!(target: "vqosd::audit", caller, "reload: max_ports set to {m}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vqos_api::wire::{PortKind, PortRequest};

    /// Every setting of a port counts, those added after the reload was written too (`queues`
    /// and `frame_len` were once let through).
    #[test]
    fn any_setting_but_the_policy_is_a_change() {
        let vhost = |queues| PortRequest {
            kind: PortKind::VhostUser,
            socket: Some("/run/vqos/vm1.sock".into()),
            queues,
            ..PortRequest::tap("vm1")
        };
        let port = |r: &PortRequest| Port::checked(r).unwrap();
        let one = port(&vhost(None));
        assert_eq!(port_change(&one, &port(&vhost(None))), None);
        let mut weighted = vhost(None);
        weighted.policy.weight = Some(3);
        assert_eq!(
            port_change(&one, &port(&weighted)),
            None,
            "the policy is none"
        );
        assert_eq!(
            port_change(&one, &port(&vhost(Some(2)))).as_deref(),
            Some("queues")
        );
        let null = |frame_len| PortRequest {
            kind: PortKind::Null,
            frame_len,
            ..PortRequest::tap("vm1")
        };
        assert_eq!(
            port_change(&port(&null(None)), &port(&null(Some(1500)))).as_deref(),
            Some("frame_len")
        );
    }
}
