//! The etcd agent's hooks into the API (docs/cluster.md): policies set from etcd go through the
//! same path as `PUT /v1/policies/NAME` and mark the vif as managed (the local API then refuses
//! to change it); tenant shares bound what the switch enforces without touching the stored
//! policy; the agent's state shows in `/v1/health` and `/metrics`.

use std::collections::BTreeMap;

use vqos_api::wire::ClusterHealthView;
use vqos_cluster::Share;
use vqos_sched::VifPolicy;

use super::{Api, View};
use crate::backend::BackendError;

/// The policy the switch enforces for a tenant vif: max = min(own max, share max), min = the
/// larger of its own min and its share of the tenant's floor, never above that max.
pub(super) fn shared_policy(policy: &VifPolicy, share: &Share) -> VifPolicy {
    let mut p = policy.clone();
    p.max_bps = match (p.max_bps, share.max_bps) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    p.min_bps = p.min_bps.max(share.min_bps);
    if let Some(max) = p.max_bps {
        p.min_bps = p.min_bps.min(max);
    }
    p
}

/// The answer to a local change of a vif etcd manages.
pub(super) fn managed_message(name: &str, key: &str) -> String {
    format!("Policy of '{name}' is managed by etcd ({key}): change it there (vqos cluster vif set)")
}

/// Why the health is degraded by the agent, if it is.
pub(super) fn degraded(cluster: &Option<ClusterHealthView>) -> Option<String> {
    let c = cluster.as_ref()?;
    let held = "tenant shares held to their fallbacks (the view's lease lapsed)";
    match (c.state != "connected", c.fallback_held) {
        (true, fallback) => Some(format!(
            "etcd {}: {}; the last applied policies stay in force{}",
            c.state,
            c.error
                .as_deref()
                .map_or("not synced yet", |e| e.strip_prefix("etcd: ").unwrap_or(e)),
            if fallback {
                format!(", {held}")
            } else {
                String::new()
            }
        )),
        (false, true) => Some(format!("etcd connected, {held} until a period completes")),
        (false, false) => None,
    }
}

impl Api {
    /// Sets vif `name`'s policy from etcd `key` (validated as a set, applied, saved, as a local
    /// change) and marks the vif managed. `Ok(false)`: no such port here.
    pub fn apply_managed_policy(
        &self,
        name: &str,
        key: &str,
        policy: &VifPolicy,
    ) -> Result<bool, String> {
        let mut v = self.lock();
        if v.set.id(name).is_err() {
            return Ok(false);
        }
        self.put_policy(&mut v, name, policy)
            .map_err(|(_, msg)| msg)?;
        if v.managed.get(name).map(String::as_str) != Some(key) {
            let mut next = v.clone();
            next.managed.insert(name.to_string(), key.to_string());
            self.commit(&mut v, next);
        }
        Ok(true)
    }

    /// Ends etcd's management of the vifs not in `keep` (their policy stays as last applied;
    /// the local API may change it again) and drops their shares.
    pub fn release_managed(&self, keep: &dyn Fn(&str) -> bool) -> Result<(), BackendError> {
        let mut v = self.lock();
        let mut next: View = v.clone();
        next.managed.retain(|n, _| keep(n));
        next.shares.retain(|n, _| keep(n));
        if next.managed == v.managed && next.shares == v.shares {
            return Ok(());
        }
        self.install_effective(&mut v, next)
    }

    /// Commits `next` (a change of managed vifs or shares), installing its effective policy
    /// set in the switch first when that differs from the current one. On error nothing
    /// changes.
    fn install_effective(&self, v: &mut View, next: View) -> Result<(), BackendError> {
        let eff = next.effective();
        if eff != v.effective() {
            self.backend.set_policies(&eff)?;
        }
        self.commit(v, next);
        Ok(())
    }

    /// The vifs etcd manages, with their keys.
    pub fn managed(&self) -> BTreeMap<String, String> {
        self.snapshot().managed.clone()
    }

    /// Replaces the tenant shares (by vif name; names that are not vifs are ignored) and
    /// installs the effective set if it changed. On error nothing changes.
    pub fn set_cluster_shares(&self, shares: &BTreeMap<String, Share>) -> Result<(), BackendError> {
        let mut v = self.lock();
        let mut next = v.clone();
        next.shares = shares
            .iter()
            .filter(|(n, _)| next.set.id(n).is_ok())
            .map(|(n, s)| (n.clone(), *s))
            .collect();
        if next.shares == v.shares {
            return Ok(());
        }
        self.install_effective(&mut v, next)
    }

    /// Where the etcd agent saves the tenant shares in force: `<state file>.cluster-shares.json`.
    pub fn cluster_shares_file(&self) -> std::path::PathBuf {
        let mut name = self.state_file.as_os_str().to_owned();
        name.push(".cluster-shares.json");
        name.into()
    }

    /// The tenant shares in force, by vif name.
    pub fn cluster_shares(&self) -> BTreeMap<String, Share> {
        self.snapshot().shares.clone()
    }

    /// Publishes the agent's state for `/v1/health` and `/metrics`.
    pub fn set_cluster_health(&self, health: ClusterHealthView) {
        *self.cluster.write().unwrap_or_else(|e| e.into_inner()) = Some(health);
    }

    /// Records whether the tenant shares are held to their fallbacks (the agent's view
    /// lapsed), in the agent's state published last.
    pub fn set_cluster_fallback(&self, held: bool) {
        let mut c = self.cluster.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = c.as_mut() {
            c.fallback_held = held;
        }
    }

    /// The agent's aggregator node (set once, when it starts), for the leaders' metrics.
    pub fn set_aggregator(&self, service: vqos_cluster::rpc::server::AggregatorService) {
        let _ = self.aggregator.set(service);
    }

    /// The agent's state (`None`: no agent).
    pub fn cluster_health(&self) -> Option<ClusterHealthView> {
        self.cluster
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The agent's metric families (docs/api.md), empty without an agent.
    pub(super) fn cluster_metrics(&self) -> String {
        let Some(c) = self.cluster_health() else {
            return String::new();
        };
        let shares = self.cluster_shares();
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            crate::metrics::write_family(&mut out, name, kind, help, samples)
        };
        let one = |v: u64| vec![(String::new(), v)];
        family(
            "vqos_cluster_connected",
            "gauge",
            "1 while the etcd agent is connected and synced, 0 while it runs fail-static.",
            &one(u64::from(c.state == "connected")),
        );
        family(
            "vqos_cluster_fallback",
            "gauge",
            "1 while the agent's view has lapsed and every tenant share is held to its fallback.",
            &one(u64::from(c.fallback_held)),
        );
        family(
            "vqos_cluster_revision",
            "gauge",
            "The etcd revision of the desired state last applied.",
            &one(u64::try_from(c.revision).unwrap_or(0)),
        );
        family(
            "vqos_cluster_managed_vifs",
            "gauge",
            "Vifs whose policy etcd sets.",
            &one(c.managed_vifs as u64),
        );
        family(
            "vqos_cluster_problems",
            "gauge",
            "Problems with the desired state (bad keys, missing ports, refused policies).",
            &one(c.problems.len() as u64),
        );
        family(
            "vqos_cluster_syncs_total",
            "counter",
            "Times the agent connected and read the whole desired state.",
            &one(c.syncs),
        );
        family(
            "vqos_cluster_events_total",
            "counter",
            "etcd watch events applied.",
            &one(c.events),
        );
        let per_port = |f: &dyn Fn(&Share) -> Option<u64>| -> Vec<(String, u64)> {
            shares
                .iter()
                .filter_map(|(n, s)| f(s).map(|v| (format!("port=\"{}\"", esc(n)), v)))
                .collect()
        };
        family(
            "vqos_cluster_share_max_bps",
            "gauge",
            "The vif's share of its tenant's max, bit/s (vifs with a bounded share).",
            &per_port(&|s| s.max_bps),
        );
        family(
            "vqos_cluster_share_min_bps",
            "gauge",
            "The vif's share of its tenant's min, bit/s.",
            &per_port(&|s| Some(s.min_bps)),
        );
        if let Some(service) = self.aggregator.get() {
            leader_metrics(&mut out, &service.summary());
        }
        out
    }
}

/// The families of the shards this node leads (docs/api.md): each shard's term, and per
/// tenant its declared hosts, Σ of their targets and of what the leader counts.
fn leader_metrics(out: &mut String, summary: &[vqos_cluster::rpc::server::ShardSummary]) {
    let mut family = |name: &str, help: &str, samples: &[(String, u64)]| {
        crate::metrics::write_family(out, name, "gauge", help, samples)
    };
    let terms: Vec<(String, u64)> = summary
        .iter()
        .map(|s| (format!("shard=\"{}\"", s.shard), u64::from(s.term)))
        .collect();
    family(
        "vqos_aggregator_term",
        "The term of each aggregator shard this node leads.",
        &terms,
    );
    let tenants = || summary.iter().flat_map(|s| s.tenants.iter());
    let per_tenant = |f: &dyn Fn(&[vqos_cluster::aggregator::HostView]) -> Option<u64>| {
        tenants()
            .filter_map(|(t, v)| f(v).map(|x| (format!("tenant=\"{}\"", esc(t)), x)))
            .collect::<Vec<_>>()
    };
    let sum = |v: &[vqos_cluster::aggregator::HostView],
               f: &dyn Fn(&vqos_cluster::aggregator::HostView) -> Option<u64>| {
        v.iter().map(f).sum::<Option<u64>>()
    };
    family(
        "vqos_aggregator_tenant_hosts",
        "Hosts etcd declares in the tenant, on the shards this node leads.",
        &per_tenant(&|v| Some(v.len() as u64)),
    );
    family(
        "vqos_aggregator_tenant_target_max_bps",
        "Σ of the tenant's hosts' targets in the latest plan, bit/s (absent when unlimited).",
        &per_tenant(&|v| sum(v, &|h| h.target.0)),
    );
    family(
        "vqos_aggregator_tenant_counted_max_bps",
        "Σ of what the leader counts the tenant's hosts as possibly enforcing, bit/s: at most \
         the tenant's max (absent when unlimited).",
        &per_tenant(&|v| sum(v, &|h| h.counted.0)),
    );
}

/// A label value escaped for the exposition format.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_bounds_the_policy_and_never_inverts_it() {
        let own = VifPolicy {
            weight: 2,
            min_bps: 10,
            max_bps: Some(300),
            priority: 1,
            ..Default::default()
        };
        let p = shared_policy(
            &own,
            &Share {
                min_bps: 50,
                max_bps: Some(200),
            },
        );
        assert_eq!((p.min_bps, p.max_bps, p.weight), (50, Some(200), 2));
        let p = shared_policy(
            &own,
            &Share {
                min_bps: 0,
                max_bps: Some(5),
            },
        );
        assert_eq!((p.min_bps, p.max_bps), (5, Some(5)));
        let p = shared_policy(
            &own,
            &Share {
                min_bps: 0,
                max_bps: None,
            },
        );
        assert_eq!(p, own);
        let free = VifPolicy::default();
        let p = shared_policy(
            &free,
            &Share {
                min_bps: 7,
                max_bps: Some(9),
            },
        );
        assert_eq!((p.min_bps, p.max_bps), (7, Some(9)));
    }
}
