//! `POST /v1/ports/SRC/migrate` (`vqos port migrate SRC DST`): the identity of a vif whose
//! guest live-migrates moves to the destination's vif in one switch call, without a window in
//! which another guest could claim its addresses (docs/vhost-user.md, "Live migration").
//!
//! ## Behavior
//! The destination (any vif kind; a vhost-user port in the migration recipe) takes the
//! source's policy, its port security (configured MACs and IPs, services, first-come locks)
//! and, in the switch, co-owns its addresses until it carries its first frame from one of
//! them (QEMU's `SEND_RARP`, or the guest's own traffic); then the source may claim none.
//! The source keeps its policy and its addresses until then (the guest runs there until the
//! migration completes) and is deleted by the orchestrator (`vqos port del`) once QEMU says
//! `completed`: its counters then continue on the destination. Deleting the destination
//! instead (a failed or cancelled migration) leaves the source as it was.
//!
//! Persisted: the destination's new policy and addresses, and on the source
//! `handover = {to, complete}` (`complete` follows the switch, copied with the locks every
//! second). A restart before `complete` adds the source with its identity and the destination
//! without it, and migrates again: the locks stay on the source, co-owned by the
//! destination; after `complete` the source is added owning nothing.
//!
//! Refused with nothing changed: an unknown port (404), the uplink on either side (409), a
//! port migrated to itself (422), a destination with configured addresses of its own, or
//! whose policy etcd manages, a port already in a migration that has not completed (409);
//! the switch's refusals (a destination that owns or learnt an address) are 409 too.

use vqos_api::migrate::{HandoverView, MigrateRequest, MigratedView};
use vqos_api::wire::LockedAddrs;

use super::{backend_fail, cluster, parse_json, policy_status, save_fail, Api, Fail, View};
use crate::backend::Port;
use crate::http::Response;
use crate::state;
use vqos_api::chain;

impl Api {
    pub(super) fn migrate_port(&self, src: &str, body: &[u8]) -> Result<Response, Fail> {
        let req: MigrateRequest = parse_json(body)?;
        let dst = req.to.as_str();
        for name in [src, dst] {
            if self.uplink.as_deref() == Some(name) {
                return Err((409, format!("Port '{name}' is the uplink")));
            }
        }
        let mut v = self.lock();
        let i = v.set.id(src).map_err(|e| (404, e.to_string()))?;
        let j = v.set.id(dst).map_err(|e| (404, e.to_string()))?;
        if i == j {
            return Err((
                422,
                format!("Cannot migrate '{src}' to '{dst}': a port cannot be migrated to itself"),
            ));
        }
        for name in [src, dst] {
            let busy = v.ports.iter().any(|p| {
                p.state
                    .handover
                    .as_ref()
                    .is_some_and(|h| !h.complete && (p.config.name == name || h.to == name))
            });
            if busy {
                return Err((
                    409,
                    format!("Cannot migrate '{src}' to '{dst}': '{name}' is already migrating"),
                ));
            }
        }
        if let Some(key) = v.managed.get(dst) {
            return Err((409, cluster::managed_message(dst, key)));
        }
        let d = &v.ports[j];
        if !d.config.macs.is_empty() || !d.config.ips.is_empty() {
            return Err((
                409,
                format!(
                    "Cannot migrate '{src}' to '{dst}': '{dst}' has configured addresses of its \
                     own (the destination takes the source's: add it without --mac/--ip)"
                ),
            ));
        }
        let next = handed_over(&v, i, j);
        next.set
            .validate()
            .map_err(|e| (policy_status(&e), e.to_string()))?;
        self.check_sold(&next.set)?;
        // Saved first, as a removal is: the switch's hand-over cannot be taken back.
        state::save(&self.state_file, &next.saved()).map_err(save_fail)?;
        if let Err(e) = self.backend.migrate_port(src, dst) {
            let (status, msg) = backend_fail(e);
            return Err(match state::save(&self.state_file, &v.saved()) {
                Ok(()) => (status, msg),
                Err(s) => (
                    500,
                    format!(
                        "{msg}; the state file lists the migration that the switch refused: {}",
                        chain(&s)
                    ),
                ),
            });
        }
        // The switch copied the source's enforced policy; the destination's own limits (none
        // yet) apply from now on.
        if let Err(e) = self.backend.set_policies(&next.effective()) {
            tracing::warn!(
                "Port {dst}: its policy after the migration was not applied: {}",
                chain(&e)
            );
        }
        self.commit(&mut v, next);
        tracing::info!("Port {src}: identity handed over to {dst} (migration)");
        Ok(Response::json(
            200,
            &MigratedView {
                from: src.to_string(),
                port: v.port_view(j),
            },
        ))
    }

    /// The ports a restart adds for `ports` (see the module docs): a destination of a migration
    /// under way without the identity it took (its source has it and migrates again, [`Api::
    /// remigrations`]). Ports in the same order.
    pub(super) fn restart_configs(ports: &[Port]) -> Vec<Port> {
        ports
            .iter()
            .map(|p| {
                let pending = ports.iter().any(|s| {
                    s.state
                        .handover
                        .as_ref()
                        .is_some_and(|h| h.to == p.config.name && !h.complete)
                });
                let mut p = p.clone();
                if pending {
                    p.config.macs.clear();
                    p.config.ips.clear();
                    p.state.locked = LockedAddrs::default();
                }
                p
            })
            .collect()
    }

    /// The migrations a restart makes again (source, destination): those not complete whose
    /// destination is there.
    pub(super) fn remigrations(ports: &[Port]) -> Vec<(String, String)> {
        ports
            .iter()
            .filter_map(|p| {
                let h = p.state.handover.as_ref().filter(|h| !h.complete)?;
                ports
                    .iter()
                    .any(|q| q.config.name == h.to)
                    .then(|| (p.config.name.clone(), h.to.clone()))
            })
            .collect()
    }
}

/// Cancels a migration to `name` (being deleted) that had not completed: its source keeps
/// its identity.
pub(super) fn cancel_to(ports: &mut [Port], name: &str) {
    for p in ports {
        if p.state
            .handover
            .as_ref()
            .is_some_and(|h| h.to == name && !h.complete)
        {
            p.state.handover = None;
        }
    }
}

/// `v` with vif `i`'s identity handed over to vif `j`.
fn handed_over(v: &View, i: usize, j: usize) -> View {
    let mut next = v.clone();
    next.set.vifs[j].policy = next.set.vifs[i].policy.clone();
    let s = next.ports[i].clone();
    let d = &mut next.ports[j];
    d.config.macs = s.config.macs;
    d.config.ips = s.config.ips;
    d.config.serves = s.config.serves;
    d.config.port_security = s.config.port_security;
    d.state.locked = s.state.locked;
    next.ports[i].state.handover = Some(HandoverView {
        to: d.config.name.clone(),
        complete: false,
    });
    next
}
