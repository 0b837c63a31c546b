//! The agent's side of the grants (`vqos_cluster::grants`, docs/cluster.md "Never above the
//! max"): every period it reads the grants and the raise counts at the revision of its status
//! read, plans with its `Guard`, commits each raise by a transaction on the tenant's raise
//! count (`/vqos/v1/raises/<tenant>`: its `version` as read), holds the shares, then publishes its decreases; a watchdog task holds the
//! fallbacks once its view lapses (no period completed for `lease_ttl`, on the monotonic clock).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use vqos_cluster::etcd::{deadline, get_prefix};
use vqos_cluster::etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp};
use vqos_cluster::grants::{changed, TenantStep};
use vqos_cluster::{keys, local_shares, EtcdError, Grant, Guard, HostStatus, Share, View};

use super::desired::Desired;
use super::period::fit_to_host;
use crate::api::Api;

/// What the period and the watchdog share.
#[derive(Debug)]
pub(super) struct Lapse {
    /// The host's grant state.
    pub guard: Guard,
    /// The tenant of each vif with a share, as of the last period.
    pub tenant_of: BTreeMap<String, String>,
    /// The fallbacks are held (the view lapsed and no period has completed since).
    pub fallen: bool,
    /// The last grant of each key that parsed (a grant that does not parse counts as it).
    pub last_good: BTreeMap<String, Grant>,
}

/// The grant state, its clock's origin, and the watchdog's wake-up.
#[derive(Debug, Clone)]
pub(super) struct Grants {
    /// The state.
    pub shared: Arc<Mutex<Lapse>>,
    /// Time 0 of the guard's clock.
    pub origin: Instant,
    /// Wakes the watchdog when the lapse time moves.
    pub wake: Arc<Notify>,
    /// The view's lease, ns.
    pub lease_ns: u64,
}

impl Grants {
    /// The grant state of `host`: its view's lease, and the others' margin beyond theirs.
    pub fn new(host: &str, lease: Duration, margin: Duration) -> Grants {
        let guard = Guard::new(host, lease.as_millis() as u64, margin.as_nanos() as u64);
        Grants {
            shared: Arc::new(Mutex::new(Lapse {
                guard,
                tenant_of: BTreeMap::new(),
                fallen: false,
                last_good: BTreeMap::new(),
            })),
            origin: Instant::now(),
            wake: Arc::new(Notify::new()),
            lease_ns: lease.as_nanos() as u64,
        }
    }

    /// `t` on the guard's clock, ns.
    pub fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// The state, locked (never held across an await).
    pub fn lock(&self) -> MutexGuard<'_, Lapse> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shares to save as the fallback of `shares` (what a restart without etcd holds).
    pub fn fallback(&self, shares: &BTreeMap<String, Share>) -> BTreeMap<String, Share> {
        let l = self.lock();
        l.guard.fallback(shares, &l.tenant_of)
    }
}

/// Every grant and raise count at `rev`, with `beats` (each live host's status
/// `mod_revision`). A grant that does not parse counts as its last version that did, or, if
/// none did, as holding all of the tenant (no raise beside it); it is reported. This host's
/// own grant that does not parse is left out (it counts what it last committed).
pub(super) async fn read_view(
    g: &Grants,
    host: &str,
    kv: &mut KvClient,
    rev: i64,
    beats: BTreeMap<String, u64>,
    timeout: Duration,
    problems: &mut Vec<String>,
) -> Result<View, EtcdError> {
    let (all, rev) = get_prefix(kv, keys::GRANTS, rev, None, timeout).await?;
    let (counts, _) = get_prefix(kv, keys::RAISES, rev, None, timeout).await?;
    let raises = counts
        .iter()
        .filter_map(|kv| {
            let t = keys::name_under(keys::RAISES, kv.key_str().ok()?)?;
            Some((t.to_string(), kv.version().max(0) as u64))
        })
        .collect();
    let mut view = View {
        revision: rev.max(0) as u64,
        beats,
        raises,
        ..View::default()
    };
    for kv in &all {
        let Some((t, h)) = kv.key_str().ok().and_then(keys::tenant_host) else {
            continue;
        };
        let key = kv.key_str().unwrap_or_default();
        let mut l = g.lock();
        let grant = match Grant::parse(kv.value()) {
            Ok(grant) => {
                l.last_good.insert(key.to_string(), grant.clone());
                grant
            }
            Err(e) if h == host => {
                problems.push(format!("{key}: {e}; this host's committed grant counts"));
                continue;
            }
            Err(e) => {
                problems.push(format!("{key}: {e}; its last valid version counts"));
                l.last_good.get(key).cloned().unwrap_or(Grant {
                    max_bps: Some(u64::MAX),
                    min_bps: u64::MAX,
                    fallback_max_bps: Some(u64::MAX),
                    fallback_min_bps: u64::MAX,
                    ..Grant::default()
                })
            }
        };
        drop(l);
        view.grants
            .entry(t.to_string())
            .or_default()
            .insert(h.to_string(), grant);
    }
    Ok(view)
}

/// Commits `grant` only if no raise of `tenant` was committed since `view` was read (the
/// `version` of its raise count is as read), and counts this one. Whether it did.
async fn commit_raise(
    kv: &mut KvClient,
    tenant: &str,
    host: &str,
    grant: &Grant,
    view: &View,
    timeout: Duration,
) -> Result<bool, EtcdError> {
    let body = serde_json::to_vec(grant).unwrap_or_default();
    let seen = view.raises.get(tenant).copied().unwrap_or(0) as i64;
    let count = keys::raises(tenant);
    let txn = Txn::new()
        .when([Compare::version(count.clone(), CompareOp::Equal, seen)])
        .and_then([
            TxnOp::put(keys::grant(tenant, host), body, None),
            TxnOp::put(count, host, None),
        ]);
    let resp = deadline("grant raise", timeout, kv.txn(txn)).await?;
    Ok(resp.succeeded())
}

/// Publishes a decrease: `grant`, or with `None` the grant's deletion.
async fn publish(
    kv: &mut KvClient,
    tenant: &str,
    host: &str,
    grant: Option<&Grant>,
    timeout: Duration,
) -> Result<(), EtcdError> {
    let key = keys::grant(tenant, host);
    match grant {
        Some(g) => {
            let body = serde_json::to_vec(g).unwrap_or_default();
            deadline("grant put", timeout, kv.put(key, body, None)).await?;
        }
        None => {
            deadline("grant delete", timeout, kv.delete(key, None)).await?;
        }
    }
    Ok(())
}

/// `shares` by tenant (ports without one left out).
fn by_tenant(
    shares: &BTreeMap<String, Share>,
    tenant_of: &BTreeMap<String, String>,
) -> BTreeMap<String, BTreeMap<String, Share>> {
    let mut out: BTreeMap<String, BTreeMap<String, Share>> = BTreeMap::new();
    for (port, s) in shares {
        if let Some(t) = tenant_of.get(port) {
            out.entry(t.clone()).or_default().insert(port.clone(), *s);
        }
    }
    out
}

/// What one period's grants need from the agent.
pub(super) struct PeriodInput<'a> {
    /// The host's name.
    pub host: &'a str,
    /// The daemon's API.
    pub api: &'a Api,
    /// The desired state.
    pub desired: &'a Desired,
    /// Every live host's status (this host's included).
    pub statuses: &'a BTreeMap<String, HostStatus>,
    /// The grants and heartbeats read.
    pub view: &'a View,
    /// When the period began, on the guard's clock.
    pub start_ns: u64,
    /// Every etcd call's deadline.
    pub timeout: Duration,
}

/// The plan of one period (the split of the tenants' limits less what silent hosts hold,
/// fitted to the host's capacity, then each tenant's step), with the vifs' tenants.
fn plan(
    g: &Grants,
    i: &PeriodInput<'_>,
) -> (BTreeMap<String, TenantStep>, BTreeMap<String, String>) {
    let limits = i.desired.state.tenant_limits();
    let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (h, vifs) in i.desired.state.declared() {
        for d in vifs.values() {
            members
                .entry(d.tenant.clone())
                .or_default()
                .insert(h.clone());
        }
    }
    let enforced = i.api.cluster_shares();
    if tracing::enabled!(tracing::Level::DEBUG) {
        for (h, s) in i.statuses {
            let vifs: Vec<_> = s
                .vifs
                .iter()
                .map(|(p, v)| (p, v.demand_bps, v.idle))
                .collect();
            tracing::debug!(revision = i.view.revision, host = %h, ?vifs, "Cluster agent: demands read");
        }
    }
    let mut l = g.lock();
    l.guard.observe(i.start_ns, i.view);
    let split_limits = l
        .guard
        .split_limits(i.start_ns, i.view, &limits, &members, |h| {
            i.statuses.contains_key(h)
        });
    let targets = local_shares(
        i.host,
        i.statuses,
        i.desired.state.declared(),
        &split_limits,
    );
    let targets = fit_to_host(i.api, targets);
    let tenant_of: BTreeMap<String, String> = targets
        .keys()
        .chain(enforced.keys())
        .filter_map(|p| Some((p.clone(), i.desired.tenant_of(p)?.to_string())))
        .collect();
    let steps = l.guard.plan(
        i.start_ns,
        i.view,
        &by_tenant(&targets, &tenant_of),
        &by_tenant(&enforced, &tenant_of),
        &limits,
        &members,
    );
    (steps, tenant_of)
}

/// One period's grants (module doc): returns the problems; an etcd failure ends the session
/// (the shares in force are then within what is published).
pub(super) async fn run_period(
    g: &Grants,
    kv: &mut KvClient,
    i: &PeriodInput<'_>,
) -> Result<Vec<String>, EtcdError> {
    let (steps, tenant_of) = plan(g, i);
    for (t, st) in &steps {
        tracing::debug!(
            tenant = %t,
            raise = st.raise,
            hold = ?vqos_cluster::grants::totals(st.hold.values()),
            raised = ?vqos_cluster::grants::totals(st.raised.values()),
            grant = ?st.grant.as_ref().map(|g| (g.max_bps, g.min_bps)),
            revision = i.view.revision,
            "Cluster agent: tenant step"
        );
    }
    let mut problems = Vec::new();
    let mut shares = BTreeMap::new();
    for (t, st) in &steps {
        let mut hold = &st.hold;
        if let (true, Some(grant)) = (st.raise, &st.grant) {
            if commit_raise(kv, t, i.host, grant, i.view, i.timeout).await? {
                g.lock().guard.set_committed(t, Some(grant.clone()));
                hold = &st.raised;
            }
        }
        shares.extend(hold.iter().map(|(p, s)| (p.clone(), *s)));
    }
    // The others count what this period publishes until its start plus the lease (and their
    // margin): holding later would be on a view they may no longer count. The period fails.
    if g.ns(Instant::now()) >= i.start_ns.saturating_add(g.lease_ns) {
        return Err(EtcdError::Timeout {
            what: "a period (it outlasted the lease)",
            ms: u128::from(g.lease_ns / 1_000_000),
        });
    }
    if let Err(e) = i.api.set_cluster_shares(&shares) {
        problems.push(format!("Tenant shares refused by the switch: {e}"));
        // Not in force: publish no decrease (the published grants stay above the shares).
        return Ok(problems);
    }
    for (t, st) in &steps {
        let committed = g.lock().guard.committed().get(t).cloned();
        if !st.raise && changed(committed.as_ref(), st.grant.as_ref()) {
            publish(kv, t, i.host, st.grant.as_ref(), i.timeout).await?;
            g.lock().guard.set_committed(t, st.grant.clone());
        }
    }
    let mut l = g.lock();
    l.tenant_of = tenant_of;
    l.fallen = false;
    l.guard.confirm(i.start_ns);
    drop(l);
    g.wake.notify_one();
    Ok(problems)
}

/// Holds the fallbacks once the view lapses; woken when the lapse time moves.
pub(super) async fn watchdog(g: Grants, api: Arc<Api>) {
    loop {
        let at = {
            let l = g.lock();
            if l.fallen {
                None
            } else {
                l.guard.lapses_at_ns()
            }
        };
        let Some(at) = at else {
            g.wake.notified().await;
            continue;
        };
        let when = g.origin + Duration::from_nanos(at);
        tokio::select! {
            _ = tokio::time::sleep_until(when.into()) => {}
            _ = g.wake.notified() => continue,
        }
        let mut l = g.lock();
        if l.fallen || !l.guard.lapsed(g.ns(Instant::now())) {
            continue;
        }
        let fallback = l.guard.fallback(&api.cluster_shares(), &l.tenant_of);
        match api.set_cluster_shares(&fallback) {
            Ok(()) => tracing::warn!(
                "Cluster agent: no period completed for the lease; tenant shares held to their fallbacks"
            ),
            Err(e) => tracing::warn!("Cluster agent: fallback shares refused by the switch: {e}"),
        }
        l.fallen = true;
        api.set_cluster_fallback(true);
    }
}
