//! A host's side of the grants ([`mod@crate::grants`]): its view of the others' liveness, its
//! committed grants and its lease, and [`Ledger`], an in-memory stand-in for etcd's grant keys
//! (revisions, raise counts and compare-and-put) with which the simulation and the tests drive the same code
//! as the agent.
//!
//! The agent (crates/vqosd/src/cluster/) runs a period as: `beat` (its status), read the grants
//! at a revision `R`, [`Guard::plan`], for each raise a compare-and-put against `R`, hold the
//! shares (raised where committed), publish the decreases, [`Guard::confirm`] the period's
//! start. Between periods it calls [`Guard::lapsed`] and, once lapsed, holds
//! [`Guard::fallback`]. Time is an input (`now_ns`, monotonic, any origin).

use std::collections::{BTreeMap, BTreeSet};

use crate::grants::{
    counted, fall_back, headroom, step, Grant, Liveness, StepInput, TenantStep, Totals,
};
use crate::split::{Share, TenantLimits};

/// What a host read: every grant, by tenant then host, and every host's heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The revision the grants were read at.
    pub revision: u64,
    /// The grants, by tenant then host.
    pub grants: BTreeMap<String, BTreeMap<String, Grant>>,
    /// Each live host's heartbeat (its status key's revision).
    pub beats: BTreeMap<String, u64>,
    /// Each tenant's raise count (the `version` of `/vqos/v1/raises/<tenant>`; absent: 0).
    pub raises: BTreeMap<String, u64>,
}

/// One host's grant state (module doc).
#[derive(Debug, Clone)]
pub struct Guard {
    /// The host's name.
    host: String,
    /// Its view's lease, ms on its own clock.
    lease_ms: u64,
    /// How long after the lease the others wait before counting a silent host's fallback, ns.
    margin_ns: u64,
    /// When the others' heartbeats last moved.
    liveness: Liveness,
    /// Its own grants as last committed, by tenant.
    committed: BTreeMap<String, Grant>,
    /// The start of its last period that completed, ns (`None`: none yet).
    confirmed_ns: Option<u64>,
}

impl Guard {
    /// A host's guard: `lease_ms` its view's lease, `margin_ns` the others' wait beyond it.
    pub fn new(host: &str, lease_ms: u64, margin_ns: u64) -> Guard {
        Guard {
            host: host.to_string(),
            lease_ms,
            margin_ns,
            liveness: Liveness::default(),
            committed: BTreeMap::new(),
            confirmed_ns: None,
        }
    }

    /// Its grants as last committed, by tenant.
    pub fn committed(&self) -> &BTreeMap<String, Grant> {
        &self.committed
    }

    /// Its grant of `tenant` is now `grant` in etcd (`None`: deleted).
    pub fn set_committed(&mut self, tenant: &str, grant: Option<Grant>) {
        match grant {
            Some(g) => self.committed.insert(tenant.to_string(), g),
            None => self.committed.remove(tenant),
        };
    }

    /// The period that began at `start_ns` completed: its view holds until `start_ns + lease`.
    pub fn confirm(&mut self, start_ns: u64) {
        self.confirmed_ns = Some(self.confirmed_ns.map_or(start_ns, |c| c.max(start_ns)));
    }

    /// When its view lapses (`None`: it never held one).
    pub fn lapses_at_ns(&self) -> Option<u64> {
        self.confirmed_ns
            .map(|c| c.saturating_add(self.lease_ms.saturating_mul(1_000_000)))
    }

    /// Whether its view has lapsed at `now_ns` (also before any period completed).
    pub fn lapsed(&self, now_ns: u64) -> bool {
        self.lapses_at_ns().is_none_or(|t| now_ns >= t)
    }

    /// The shares to hold once lapsed: `enforced` with each tenant held to its fallback.
    pub fn fallback(
        &self,
        enforced: &BTreeMap<String, Share>,
        tenant_of: &BTreeMap<String, String>,
    ) -> BTreeMap<String, Share> {
        fall_back(enforced, tenant_of, &self.committed)
    }

    /// Notes the heartbeats of `view`'s hosts at `now_ns`, and takes its own grants from it.
    pub fn observe(&mut self, now_ns: u64, view: &View) {
        for (t, hosts) in &view.grants {
            for h in hosts.keys() {
                self.liveness
                    .observe(h, view.beats.get(h).copied().unwrap_or(0), now_ns);
            }
            if let Some(own) = hosts.get(&self.host) {
                self.committed.insert(t.clone(), own.clone());
            }
        }
    }

    /// The limits the split shares among the hosts that publish a status (`present`): each
    /// tenant's less what the others count for its declared hosts that publish none (a silent
    /// host's grant, then its fallback), so that the hosts in sight do not aim at its part.
    pub fn split_limits(
        &self,
        now_ns: u64,
        view: &View,
        limits: &BTreeMap<String, TenantLimits>,
        members: &BTreeMap<String, BTreeSet<String>>,
        present: impl Fn(&str) -> bool,
    ) -> BTreeMap<String, TenantLimits> {
        let mut out = limits.clone();
        for (t, lim) in &mut out {
            let absent: Vec<Totals> = view
                .grants
                .get(t)
                .into_iter()
                .flatten()
                .filter(|(h, _)| {
                    **h != self.host
                        && !present(h)
                        && members.get(t).is_some_and(|d| d.contains(*h))
                })
                .map(|(h, g)| counted(g, self.liveness.silent_ns(h, now_ns), self.margin_ns))
                .collect();
            let (max_bps, min_bps) = headroom(lim, &absent);
            *lim = TenantLimits { min_bps, max_bps };
        }
        out
    }

    /// One period's plan, per tenant with a vif here or a grant of its own: `targets` and
    /// `enforced` by tenant then port, `members` the hosts etcd declares in each tenant (only
    /// their grants count), `now_ns` when the view was read.
    pub fn plan(
        &mut self,
        now_ns: u64,
        view: &View,
        targets: &BTreeMap<String, BTreeMap<String, Share>>,
        enforced: &BTreeMap<String, BTreeMap<String, Share>>,
        limits: &BTreeMap<String, TenantLimits>,
        members: &BTreeMap<String, BTreeSet<String>>,
    ) -> BTreeMap<String, TenantStep> {
        self.observe(now_ns, view);
        let empty = BTreeMap::new();
        let mut tenants: BTreeSet<&String> = targets.keys().collect();
        tenants.extend(self.committed.keys());
        let mut out = BTreeMap::new();
        for t in tenants {
            let Some(lim) = limits.get(t) else { continue };
            let declared = members.get(t);
            let others: Vec<Totals> = view
                .grants
                .get(t)
                .into_iter()
                .flatten()
                .filter(|(h, _)| **h != self.host && declared.is_some_and(|d| d.contains(*h)))
                .map(|(h, g)| counted(g, self.liveness.silent_ns(h, now_ns), self.margin_ns))
                .collect();
            let input = StepInput {
                limits: lim,
                targets: targets.get(t).unwrap_or(&empty),
                enforced: enforced.get(t).unwrap_or(&empty),
                published: self.committed.get(t),
                others: &others,
                hosts: declared.map_or(1, |d| d.len() as u64),
                lease_ms: self.lease_ms,
            };
            out.insert(t.clone(), step(&input));
        }
        out
    }
}

/// etcd's grant keys and status heartbeats in memory: revisions and compare-and-put, for the
/// simulation and the tests.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// The store's revision (+1 per write).
    revision: u64,
    /// Each grant and its `mod_revision`, by tenant then host.
    grants: BTreeMap<String, BTreeMap<String, (Grant, u64)>>,
    /// Each host's heartbeat (the revision of its last status write).
    beats: BTreeMap<String, u64>,
    /// Each tenant's raise count.
    raises: BTreeMap<String, u64>,
}

impl Ledger {
    /// Everything, at the current revision.
    pub fn read(&self) -> View {
        View {
            revision: self.revision,
            grants: self
                .grants
                .iter()
                .map(|(t, hs)| {
                    let hs = hs.iter().map(|(h, (g, _))| (h.clone(), g.clone()));
                    (t.clone(), hs.collect())
                })
                .collect(),
            beats: self.beats.clone(),
            raises: self.raises.clone(),
        }
    }

    /// `host` writes its status.
    pub fn beat(&mut self, host: &str) {
        self.revision += 1;
        self.beats.insert(host.to_string(), self.revision);
    }

    /// `host`'s status key expires (its etcd lease ended).
    pub fn expire(&mut self, host: &str) {
        self.beats.remove(host);
    }

    /// Writes (or with `None` deletes) `host`'s grant of `tenant`.
    pub fn put(&mut self, tenant: &str, host: &str, grant: Option<Grant>) {
        self.revision += 1;
        let hs = self.grants.entry(tenant.to_string()).or_default();
        match grant {
            Some(g) => hs.insert(host.to_string(), (g, self.revision)),
            None => hs.remove(host),
        };
    }

    /// Commits a raise: writes `grant` and counts a raise of `tenant`, only if no raise of the
    /// tenant was committed since `view` was read (etcd: a transaction comparing the `version`
    /// of `/vqos/v1/raises/<tenant>`). Decreases do not count: they only make room. Whether it
    /// was committed.
    pub fn commit_raise(&mut self, tenant: &str, host: &str, grant: Grant, view: &View) -> bool {
        let seen = view.raises.get(tenant).copied().unwrap_or(0);
        let now = self.raises.get(tenant).copied().unwrap_or(0);
        if now != seen {
            return false;
        }
        self.put(tenant, host, Some(grant));
        self.raises.insert(tenant.to_string(), now + 1);
        true
    }
}
