//! The control API: routes requests to changes of the switch, validated first, persisted after.
//!
//! [`Api`] owns the daemon's view of the ports and their policies (one [`PolicySet`] plus the
//! port specs, in the same order). Every change is computed on a copy, validated as a whole set,
//! applied to the [`Backend`], written to the state file, and only then made current; at each
//! step a failure leaves the switch, the file and the view as they were.
//!
//! | endpoint | methods |
//! |---|---|
//! | `/v1/health` | GET |
//! | `/v1/ports` | GET, POST |
//! | `/v1/ports/NAME` | GET, DELETE |
//! | `/v1/ports/NAME/migrate` | POST |
//! | `/v1/policies` | GET |
//! | `/v1/policies/NAME` | GET, PUT |
//! | `/v1/stats` | GET |
//! | `/v1/reload` | POST |
//! | `/v1/cost-model` | GET |
//! | `/v1/calibrate` | POST |
//! | `/metrics` | GET |

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Instant;

use thiserror::Error;
use vqos_sched::{EngineKind, PolicyError, PolicySet, VifPolicy};

use crate::backend::{
    check_thread, configured_address_in_use, Backend, BackendError, Port, PortStats,
};
use crate::config::Config;
use crate::http::{Request, Response};
use crate::state::{self, SavedPort, SavedState, StateError, STATE_VERSION};
use crate::wire::{
    check_port_name, PolicyPatch, PolicyView, PortId, PortRequest, PortStatsView, PortView,
    RemovedView, StatsView,
};
use vqos_api::chain;
use vqos_api::wire::ClusterHealthView;
use vqos_cluster::Share;

mod cluster;
mod cost;
mod health;
mod locks;
mod migrate;
mod reload;
mod start;

pub use start::StartPlan;

/// Why the API could not start.
#[derive(Debug, Error)]
pub enum ApiError {
    /// The state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// The config's ports with the state file's policies do not form a valid set.
    #[error("Restored policies from {path} are invalid")]
    Restore {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: PolicyError,
    },
    /// The config's and the state file's ports are more than `max_ports`.
    #[error("{ports} ports (config and {path}) exceed max_ports = {max}")]
    TooManyPorts {
        /// The state file.
        path: PathBuf,
        /// How many ports there would be.
        ports: usize,
        /// The config's `max_ports`.
        max: usize,
    },
    /// The switch refused a restored port.
    #[error("Cannot restore port '{name}'")]
    Backend {
        /// The port.
        name: String,
        /// What the switch said.
        #[source]
        source: BackendError,
    },
}

/// The daemon's view of its ports; `ports[i]` is the port of `set.vifs[i]`.
#[derive(Debug, Clone)]
struct View {
    /// Capacity, cost model and every vif's policy, as the user set them (persisted, answered).
    set: PolicySet,
    /// How each vif's port was made.
    ports: Vec<Port>,
    /// The controllers' limits by port id, bit/s (never persisted).
    limits: BTreeMap<PortId, u64>,
    /// The ECN probabilities last pushed to the switch, by port id.
    ecn: BTreeMap<PortId, f64>,
    /// The next port id to give ([`View::give_ids`]; persisted).
    next_id: u64,
    /// Ports of the config deleted through the API (persisted, so they stay deleted).
    removed: Vec<String>,
    /// The etcd agent's tenant shares by vif name (saved by the agent in a file of its own,
    /// not in the state file; docs/cluster.md).
    shares: BTreeMap<String, Share>,
    /// Vifs whose policy etcd sets, with their key: the local API refuses to change them.
    managed: BTreeMap<String, String>,
    /// The config file as last loaded (at start or by a reload): its ports are the ones whose
    /// deletion is remembered, and a reload applies what changed since.
    file: Arc<Config>,
}

/// Gives each of `ports` without an id the next of `next` (kept above every id in `ports`,
/// and never 0).
pub(crate) fn give_ids(ports: &mut [Port], next: &mut u64) {
    let top = ports.iter().map(|p| p.state.id.0).max().unwrap_or(0);
    *next = (*next).max(top.saturating_add(1)).max(1);
    for p in ports.iter_mut().filter(|p| !p.state.id.is_given()) {
        p.state.id = PortId(*next);
        *next += 1;
    }
}

/// The policy the switch enforces for `policy` under a controller limit: max = min(user max,
/// limit), never below the user's min. Everything else is the user's.
pub fn effective_policy(policy: &VifPolicy, limit: Option<u64>) -> VifPolicy {
    let mut p = policy.clone();
    if let Some(l) = limit {
        let l = l.max(p.min_bps);
        p.max_bps = Some(p.max_bps.map_or(l, |m| m.min(l)));
    }
    p
}

impl View {
    /// Vif `id`'s policy as the API shows it: its own, and what the switch enforces when a
    /// cluster share or a controller's limit changes it (`eff`: [`View::effective`]).
    fn policy_view(&self, eff: &PolicySet, id: usize) -> PolicyView {
        let own = &self.set.vifs[id];
        let mut view = PolicyView::from(&own.policy);
        let by: Vec<String> = [
            (self.shares.contains_key(&own.name), "cluster"),
            (
                self.limits.contains_key(&self.ports[id].state.id),
                "controller",
            ),
        ]
        .into_iter()
        .filter(|&(on, _)| on)
        .map(|(_, what)| what.to_string())
        .collect();
        if let Some(e) = eff.vifs.get(id) {
            view.enforced = vqos_api::wire::EnforcedView::of(&own.policy, &e.policy, by);
        }
        view
    }

    /// The set the switch enforces: the user's policies under the controllers' limits.
    fn effective(&self) -> PolicySet {
        let mut set = self.set.clone();
        for (v, p) in set.vifs.iter_mut().zip(&self.ports) {
            if let Some(share) = self.shares.get(&v.name) {
                v.policy = cluster::shared_policy(&v.policy, share);
            }
            v.policy = effective_policy(&v.policy, self.limits.get(&p.state.id).copied());
        }
        set
    }

    /// Gives every port without an id the next one (ports made from the config, by a request
    /// or a reload, and ports of state files older than ids).
    fn give_ids(&mut self) {
        give_ids(&mut self.ports, &mut self.next_id);
    }

    /// The id of the port named `name`, if it is a vif.
    fn port_id(&self, name: &str) -> Option<PortId> {
        self.set.id(name).ok().map(|i| self.ports[i].state.id)
    }

    fn saved(&self) -> SavedState {
        SavedState {
            version: STATE_VERSION,
            ports: (self.ports.iter().zip(&self.set.vifs))
                .map(|(p, v)| SavedPort::new(p, v.policy.clone()))
                .collect(),
            removed: self.removed.clone(),
            next_id: self.next_id,
        }
    }

    fn port_view(&self, i: usize) -> PortView {
        let policy = PolicyView::from(&self.set.vifs[i].policy);
        PortView {
            port: self.ports[i].config.clone().with_policy(policy),
            state: self.ports[i].state.clone(),
        }
    }
}

/// The control API of one switch.
pub struct Api {
    /// The switch.
    backend: Arc<dyn Backend>,
    /// The engine the switch runs (reported, not changeable).
    engine: EngineKind,
    /// Name of the uplink port, to label it in stats.
    uplink: Option<String>,
    /// Where the state is persisted.
    state_file: PathBuf,
    /// The config file a reload reads (set by the daemon; none: reload is refused).
    config_path: OnceLock<PathBuf>,
    /// The warnings of the start (state file fallbacks), as printed.
    warnings: Vec<String>,
    /// When the API started, for `uptime_s`.
    started: Instant,
    /// Ports and policies; held for the whole of a change so changes are serialised.
    view: Mutex<View>,
    /// The last committed view, for readers (GETs, stats, metrics): replaced, never changed in
    /// place, when a change commits, so a read never waits for a change in progress (switch
    /// calls, fsync of the state file).
    published: RwLock<Arc<View>>,
    /// The etcd agent's state for `/v1/health` and `/metrics` (`None`: no agent).
    cluster: RwLock<Option<ClusterHealthView>>,
    /// The agent's aggregator node, when it has one (its shards' metrics).
    aggregator: std::sync::OnceLock<vqos_cluster::rpc::server::AggregatorService>,
}

/// A failed request: its status and message.
type Fail = (u16, String);

fn policy_status(e: &PolicyError) -> u16 {
    match e {
        PolicyError::UnknownVif(_) => 404,
        PolicyError::DuplicateVif(_) => 409,
        _ => 422,
    }
}

pub(crate) fn backend_fail(e: BackendError) -> Fail {
    let status = match &e {
        BackendError::Policy(p) => policy_status(p),
        BackendError::UnknownPort(_) => 404,
        BackendError::PortExists(_) | BackendError::MacInUse(_) | BackendError::Migrate(_) => 409,
        BackendError::Port { .. } | BackendError::Switch(_) => 500,
    };
    (status, e.to_string())
}

fn save_fail(e: StateError) -> Fail {
    (
        500,
        format!("Change not saved, nothing changed: {}", chain(&e)),
    )
}

impl Api {
    fn lock(&self) -> MutexGuard<'_, View> {
        // Changes are computed on copies and committed in one assignment, so a panic in another
        // request thread cannot leave a half-made change behind the poison.
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The committed view, without waiting for a change in progress.
    fn snapshot(&self) -> Arc<View> {
        self.published
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes `next` the view (`v` is the changers' lock, held) and publishes it to readers.
    fn commit(&self, v: &mut View, next: View) {
        *self.published.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next.clone());
        *v = next;
    }

    /// The current policy set (for tests and the daemon's startup message).
    pub fn policies(&self) -> PolicySet {
        self.snapshot().set.clone()
    }

    /// The warnings printed at start (a state file restored from its last-good copy, a missing
    /// state file that was expected); empty on a clean start.
    pub fn startup_warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The switch behind the API.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Answers one request from within the daemon (controllers, tests).
    pub fn handle(&self, req: &Request) -> Response {
        self.handle_as(req, "internal")
    }

    /// Answers one request from `caller` (`uid=N`, `token`: named in the audit lines of a
    /// reload's changes).
    pub fn handle_as(&self, req: &Request, caller: &str) -> Response {
        let segs: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
        let m = req.method.as_str();
        let result = match (segs.as_slice(), m) {
            (["v1", "health"], "GET") => Ok(self.health()),
            (["v1", "ports"], "GET") => Ok(self.list_ports()),
            (["v1", "ports"], "POST") => self.add_port(&req.body),
            (["v1", "ports", name], "GET") => self.get_port(name),
            (["v1", "ports", name], "DELETE") => self.remove_port(name),
            (["v1", "ports", name, "migrate"], "POST") => self.migrate_port(name, &req.body),
            (["v1", "policies"], "GET") => Ok(self.list_policies()),
            (["v1", "policies", name], "GET") => self.get_policy(name),
            (["v1", "policies", name], "PUT") => self.set_policy(name, &req.body),
            (["v1", "stats"], "GET") => Ok(Response::json(200, &self.stats())),
            (["v1", "reload"], "POST") => self.reload_request(caller),
            (["v1", "cost-model"], "GET") => Ok(self.get_cost_model()),
            (["v1", "calibrate"], "POST") => self.calibrate(&req.body),
            (["metrics"], "GET") => Ok(self.metrics()),
            (s, _) => Err(match allowed(s) {
                Some(allow) => {
                    return Response::error(
                        405,
                        format!("Method {m} not allowed on {} (allowed: {allow})", req.path),
                    )
                    .with_header("Allow", allow)
                }
                None => (404, format!("Unknown endpoint {m} {}", req.path)),
            }),
        };
        result.unwrap_or_else(|(status, msg)| Response::error(status, msg))
    }

    fn list_ports(&self) -> Response {
        let v = self.snapshot();
        let ports: Vec<PortView> = (0..v.ports.len()).map(|i| v.port_view(i)).collect();
        Response::json(200, &ports)
    }

    fn get_port(&self, name: &str) -> Result<Response, Fail> {
        let v = self.snapshot();
        let id = v.set.id(name).map_err(|e| (404, e.to_string()))?;
        Ok(Response::json(200, &v.port_view(id)))
    }

    fn list_policies(&self) -> Response {
        let v = self.snapshot();
        let eff = v.effective();
        let map: std::collections::BTreeMap<&str, PolicyView> = (0..v.set.len())
            .map(|id| (v.set.vifs[id].name.as_str(), v.policy_view(&eff, id)))
            .collect();
        Response::json(200, &map)
    }

    fn get_policy(&self, name: &str) -> Result<Response, Fail> {
        let v = self.snapshot();
        let id = v.set.id(name).map_err(|e| (404, e.to_string()))?;
        Ok(Response::json(200, &v.policy_view(&v.effective(), id)))
    }

    fn add_port(&self, body: &[u8]) -> Result<Response, Fail> {
        let req: PortRequest = parse_json(body)?;
        check_port_name(&req.name).map_err(|e| (422, e.to_string()))?;
        if self.uplink.as_deref() == Some(req.name.as_str()) {
            return Err((409, format!("Port '{}' is the uplink", req.name)));
        }
        let policy = (req.policy)
            .apply(&VifPolicy::default(), &req.name)
            .map_err(|e| (422, e.to_string()))?;
        let mut v = self.lock();
        if v.ports.len() >= v.file.max_ports {
            return Err((
                409,
                format!(
                    "Port limit reached: {} ports (max_ports = {})",
                    v.ports.len(),
                    v.file.max_ports
                ),
            ));
        }
        if let Some(e) = configured_address_in_use(&v.ports, &req.name, &req.macs, &req.ips) {
            return Err((409, e));
        }
        let mut next = v.clone();
        next.set = next.set.with_vif(&req.name, policy.clone());
        next.set
            .validate()
            .map_err(|e| (policy_status(&e), e.to_string()))?;
        self.check_sold(&next.set)?;
        let port = Port::checked(&req).map_err(|e| (422, e))?;
        check_thread(&port.config, v.file.threads).map_err(|e| (422, e))?;
        let name = port.config.name.clone();
        next.ports.push(port);
        next.give_ids();
        let port = next.ports.last().cloned().expect("just pushed");
        next.removed.retain(|n| *n != name);
        let opened = self
            .backend
            .add_port(&port, &policy)
            .map_err(backend_fail)?;
        if let Err(e) = state::save(&self.state_file, &next.saved()) {
            let _ = self.backend.remove_port(&name);
            return Err(save_fail(e));
        }
        self.commit(&mut v, next);
        tracing::info!("Port {name} up ({opened})");
        let id = v.ports.len() - 1;
        Ok(Response::json(201, &v.port_view(id)))
    }

    fn remove_port(&self, name: &str) -> Result<Response, Fail> {
        let mut v = self.lock();
        let id = v.set.id(name).map_err(|e| (404, e.to_string()))?;
        let mut next = v.clone();
        next.ports.remove(id);
        next.set.vifs.remove(id);
        migrate::cancel_to(&mut next.ports, name);
        if v.file.ports.iter().any(|(p, _)| p.config.name == name) {
            next.removed.push(name.to_string());
        }
        let gone = v.ports[id].state.id;
        next.limits.remove(&gone);
        next.ecn.remove(&gone);
        next.shares.remove(name);
        next.managed.remove(name);
        // Saved first: a removed port cannot be put back as it was (a created TAP would come
        // back without its namespace and addresses, at the end of the list), so if the save
        // fails the switch is not touched.
        state::save(&self.state_file, &next.saved()).map_err(save_fail)?;
        if let Err(e) = self.backend.remove_port(name) {
            let (status, msg) = backend_fail(e);
            return Err(match state::save(&self.state_file, &v.saved()) {
                Ok(()) => (status, msg),
                Err(s) => (
                    500,
                    format!(
                        "{msg}; the port is still in the switch but the state file lists it \
                         as removed: {}",
                        chain(&s)
                    ),
                ),
            });
        }
        self.commit(&mut v, next);
        tracing::info!("Port {name} down (removed)");
        Ok(Response::json(
            200,
            &RemovedView {
                removed: name.to_string(),
            },
        ))
    }

    fn set_policy(&self, name: &str, body: &[u8]) -> Result<Response, Fail> {
        let patch: PolicyPatch = parse_json(body)?;
        let mut v = self.lock();
        let id = v.set.id(name).map_err(|e| (404, e.to_string()))?;
        if let Some(key) = v.managed.get(name) {
            return Err((409, cluster::managed_message(name, key)));
        }
        let policy = patch
            .apply(v.set.policy(id), name)
            .map_err(|e| (422, e.to_string()))?;
        self.put_policy(&mut v, name, &policy)?;
        Ok(Response::json(200, &v.policy_view(&v.effective(), id)))
    }

    /// Makes `policy` the policy of vif `name` (which exists; `v` is the changers' lock, held):
    /// validated as a set, applied to the switch, saved, committed. Nothing changes on error.
    fn put_policy(&self, v: &mut View, name: &str, policy: &VifPolicy) -> Result<(), Fail> {
        let id = v.set.id(name).map_err(|e| (404, e.to_string()))?;
        if policy == v.set.policy(id) {
            return Ok(());
        }
        let next_set = v
            .set
            .with_policy(name, policy.clone())
            .map_err(|e| (policy_status(&e), e.to_string()))?;
        self.check_sold(&next_set)?;
        let next = View {
            set: next_set,
            ..v.clone()
        };
        self.backend
            .set_policies(&next.effective())
            .map_err(backend_fail)?;
        if let Err(e) = state::save(&self.state_file, &next.saved()) {
            let _ = self.backend.set_policies(&v.effective());
            return Err(save_fail(e));
        }
        self.commit(v, next);
        Ok(())
    }

    /// The policy set the switch enforces: the user's policies under the controllers' limits
    /// (equal to [`Api::policies`] without controllers).
    pub fn effective_policies(&self) -> PolicySet {
        self.snapshot().effective()
    }

    /// The vifs' policies and their ports' ids (`ids[i]` is the port of `set.vifs[i]`), from
    /// one committed view: what the controllers index.
    pub fn vifs(&self) -> (PolicySet, Vec<PortId>) {
        let v = self.snapshot();
        (v.set.clone(), v.ports.iter().map(|p| p.state.id).collect())
    }

    /// The controllers' limits in force, by vif name (bit/s).
    pub fn controller_limits(&self) -> BTreeMap<String, u64> {
        let v = self.snapshot();
        (v.set.vifs.iter().zip(&v.ports))
            .filter_map(|(s, p)| Some((s.name.clone(), *v.limits.get(&p.state.id)?)))
            .collect()
    }

    /// Replaces the controllers' limits (by port id, bit/s; ids of ports that are gone are
    /// ignored, so a port made again under a deleted one's name starts without its limit)
    /// and, if that changes what the switch enforces, installs the effective policy set
    /// through the same snapshot path as a policy change. The user's policies (stored,
    /// persisted, answered by `GET /v1/policies`) are not touched. On error nothing changes.
    pub fn set_controller_limits(
        &self,
        limits: &BTreeMap<PortId, u64>,
    ) -> Result<(), BackendError> {
        let mut v = self.lock();
        let mut next = v.clone();
        next.limits = (next.ports.iter())
            .filter_map(|p| Some((p.state.id, *limits.get(&p.state.id)?)))
            .collect();
        let eff = next.effective();
        if eff != v.effective() {
            self.backend.set_policies(&eff)?;
        }
        self.commit(&mut v, next);
        Ok(())
    }

    /// Pushes the PID-ECN controller's marking probabilities (by port id, each in [0, 1]; vifs
    /// not named get 0, ids of ports that are gone are ignored) to the switch. The ids are
    /// turned into names under the lock that orders this with port changes, so a probability
    /// never reaches another port than the one it was computed for. On error nothing changes.
    pub fn set_ecn_probabilities(&self, probs: &BTreeMap<PortId, f64>) -> Result<(), BackendError> {
        let mut v = self.lock();
        let (list, ecn): (Vec<(String, f64)>, BTreeMap<PortId, f64>) = (v.set.vifs.iter())
            .zip(&v.ports)
            .map(|(s, p)| {
                let prob = probs.get(&p.state.id).copied().unwrap_or(0.0);
                ((s.name.clone(), prob), (p.state.id, prob))
            })
            .unzip();
        self.backend.set_ecn_probabilities(&list)?;
        let next = View { ecn, ..v.clone() };
        self.commit(&mut v, next);
        Ok(())
    }

    /// The body of `GET /v1/stats`.
    pub fn stats(&self) -> StatsView {
        let view = self.snapshot();
        let (set, limits, ecn) = (&view.set, &view.limits, &view.ecn);
        let mut raw = self.backend.stats();
        // The switch publishes its counters asynchronously: a vif added a moment ago is shown
        // with zero counters until its first snapshot, so the stats always list every vif.
        for v in &set.vifs {
            if !raw.ports.iter().any(|p| p.name == v.name) {
                raw.ports.push(PortStats {
                    name: v.name.clone(),
                    ..Default::default()
                });
            }
        }
        let ports = raw
            .ports
            .into_iter()
            .map(|s| {
                let uplink = self.uplink.as_deref() == Some(s.name.as_str());
                let policy = set
                    .id(&s.name)
                    .ok()
                    .map(|i| PolicyView::from(set.policy(i)));
                let id = view.port_id(&s.name);
                PortStatsView {
                    role: if uplink { "uplink" } else { "vif" }.to_string(),
                    policy,
                    id: id.unwrap_or_default(),
                    controller_limit_bps: id.and_then(|i| limits.get(&i).copied()),
                    ecn_probability: id.map(|i| ecn.get(&i).copied().unwrap_or(0.0)),
                    stats: s,
                }
            })
            .collect();
        StatsView {
            engine: self.engine.to_string(),
            capacity_bps: set.capacity_bps,
            ports,
            loops: raw.loops,
            mac_entries: raw.mac_entries,
            cost_model: (set.cost == vqos_sched::CostModel::Cycles)
                .then(|| self.cost_model_view(&view, 0)),
        }
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Fail> {
    serde_json::from_slice(body).map_err(|e| (400, format!("Invalid JSON body: {e}")))
}

/// The methods an endpoint accepts, `None` if there is no such endpoint.
fn allowed(segs: &[&str]) -> Option<&'static str> {
    match segs {
        ["v1", "health"] | ["v1", "stats"] | ["v1", "policies"] | ["metrics"] => Some("GET"),
        ["v1", "ports"] => Some("GET, POST"),
        ["v1", "ports", _] => Some("GET, DELETE"),
        ["v1", "ports", _, "migrate"] => Some("POST"),
        ["v1", "policies", _] => Some("GET, PUT"),
        ["v1", "reload"] | ["v1", "calibrate"] => Some("POST"),
        ["v1", "cost-model"] => Some("GET"),
        _ => None,
    }
}
