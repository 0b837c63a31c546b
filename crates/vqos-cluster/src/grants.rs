//! Grants: what each host may enforce of a tenant, so that the hosts' shares in force never add
//! up to more than the tenant's max, even while demands move or a host is cut off.
//!
//! The split ([`mod@crate::split`]) says what each host *should* hold; the hosts compute it
//! at different times from statuses of different ages, so their targets can add up to more
//! than the max for a period (A rises 110 → 500 Mbit/s while B still holds 890 under 1 Gbit/s:
//! 1.39 Gbit/s). A grant is the part of a tenant a host has *published* that it enforces, at
//! `/vqos/v1/grants/<tenant>/<host>` ([`Grant`]); the rules below keep, at every instant,
//! `Σ_hosts enforced ≤ Σ_hosts counted ≤ max` (and the same for the min).
//!
//! ## Behavior
//! - **Published ≥ enforced.** A host lowers its shares first and publishes the lower grant
//!   after; it publishes a higher grant first and raises its shares only once it is committed.
//! - **Raises out of confirmed releases.** A host may raise its grant to at most
//!   `max − Σ counted(others)` ([`headroom`]), and commits it by a compare-and-put: the put
//!   happens only if no other raise of the tenant was committed since it read the grants
//!   (etcd: a transaction comparing the `version` of `/vqos/v1/raises/<tenant>`, which each
//!   raise rewrites). Two hosts that took the same released capacity cannot both commit;
//!   decreases do not stop a raise (they only make room).
//! - **Counting a silent host** ([`counted`]): the others count a host's published grant until
//!   its heartbeat (its status key's revision) has not moved for its lease plus a margin on
//!   *their* clock ([`Liveness`]); then it has surely lapsed and fallen back, and they count its
//!   published fallback.
//! - **Lapse** ([`fall_back`]): a host that has not completed a period (read and published) for
//!   its lease, on its own monotonic clock, holds each tenant to the fallback of its last
//!   committed grant: `min(its grant, max / N)` (the same for the min), `N` the hosts of the
//!   tenant it last saw. A lapsed host that reconnects raises again only by compare-and-put.
//! - Time is an input (`now_ns`, any monotonic origin); nothing here reads a clock.
//!
//! ## Limitations
//! - A host that never comes back keeps its fallback counted while etcd declares its vifs in
//!   the tenant (removing them releases it).
//! - A rise takes up to three periods (the riser's status, the holder's decrease, the riser's
//!   raise) and a raise that loses a compare-and-put waits a period.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::split::{Share, TenantLimits};

/// `/vqos/v1/grants/<tenant>/<host>`: what a host may enforce of a tenant, written by the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Incremented at each write by its host.
    pub epoch: u64,
    /// The most the host's vifs of the tenant may hold in all, bit/s (`None`: no tenant max).
    pub max_bps: Option<u64>,
    /// The most floor they may hold in all, bit/s.
    pub min_bps: u64,
    /// What the host holds itself to once its view lapses (≤ `max_bps`).
    pub fallback_max_bps: Option<u64>,
    /// The floor it holds itself to once its view lapses (≤ `min_bps`).
    pub fallback_min_bps: u64,
    /// Its view's lease, ms on its own clock: it lapses this long after its last good period.
    pub lease_ms: u64,
    /// Fields this version does not know, kept as written.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl Grant {
    /// Parses a stored value.
    pub fn parse(bytes: &[u8]) -> Result<Grant, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("Invalid JSON: {e}"))
    }
}

/// A tenant's total over some shares: (Σ max, Σ min); `None` max when one is unlimited.
pub type Totals = (Option<u64>, u64);

/// When each other host's heartbeat last moved, on this host's clock.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    /// Per host: its last heartbeat and when this host first saw it, ns.
    seen: BTreeMap<String, (u64, u64)>,
}

impl Liveness {
    /// `host`'s heartbeat is `beat` at `now_ns` (0: no status key; a first sighting counts as
    /// a beat, so a restarted reader waits a whole lease before it counts anyone lapsed).
    pub fn observe(&mut self, host: &str, beat: u64, now_ns: u64) {
        match self.seen.get_mut(host) {
            Some((b, t)) if *b != beat && beat != 0 => (*b, *t) = (beat, now_ns),
            Some(_) => {}
            None => {
                self.seen.insert(host.to_string(), (beat, now_ns));
            }
        }
    }

    /// How long `host`'s heartbeat has not moved at `now_ns` (0 when never seen).
    pub fn silent_ns(&self, host: &str, now_ns: u64) -> u64 {
        self.seen
            .get(host)
            .map_or(0, |&(_, t)| now_ns.saturating_sub(t))
    }

    /// Forgets the hosts `keep` says no.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.seen.retain(|h, _| keep(h));
    }
}

/// What the others count of `g`: its grant, or its fallback once its heartbeat has been still
/// for its lease plus `margin_ns` (the longest a period's calls can take: its status may be
/// written that long after the period that confirmed its view began).
pub fn counted(g: &Grant, silent_ns: u64, margin_ns: u64) -> Totals {
    let lease_ns = g.lease_ms.saturating_mul(1_000_000);
    if silent_ns >= lease_ns.saturating_add(margin_ns) {
        (g.fallback_max_bps, g.fallback_min_bps)
    } else {
        (g.max_bps, g.min_bps)
    }
}

/// What a host may hold of `limits` beside the others' counted totals: (max − Σ, min − Σ).
pub fn headroom(limits: &TenantLimits, others: &[Totals]) -> Totals {
    let max = limits.max_bps.map(|m| {
        let used: u128 = others.iter().map(|o| u128::from(o.0.unwrap_or(0))).sum();
        m.saturating_sub(u64::try_from(used).unwrap_or(u64::MAX))
    });
    let used: u128 = others.iter().map(|o| u128::from(o.1)).sum();
    let min = limits
        .min_bps
        .saturating_sub(u64::try_from(used).unwrap_or(u64::MAX));
    (max, min)
}

/// Σ max and Σ min of `shares`.
pub fn totals<'a>(shares: impl IntoIterator<Item = &'a Share>) -> Totals {
    let mut max = Some(0u64);
    let mut min = 0u64;
    for s in shares {
        max = max.zip(s.max_bps).map(|(a, b)| a.saturating_add(b));
        min = min.saturating_add(s.min_bps);
    }
    (max, min)
}

/// `wants` water-filled into `total`: each gets `min(want, level)`, the level the highest that
/// fits, so the small wants are whole and the large ones give up alike (max-min fairness,
/// `Σ ≤ total`, rounded down). Wants that fit are returned as they are.
fn fill(wants: &[u64], total: u64) -> Vec<u64> {
    let sum: u128 = wants.iter().map(|&w| u128::from(w)).sum();
    if sum <= u128::from(total) {
        return wants.to_vec();
    }
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| wants[i]);
    let mut out = vec![0; wants.len()];
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        // An equal part of what is left among the wants not yet served (k of n served).
        let part = left / (wants.len() - k) as u64;
        out[i] = wants[i].min(part);
        left -= out[i];
    }
    out
}

/// `shares` fitted into the totals `to` (max and min apart): water-filled, so that
/// a vif that wants little keeps its share and the large ones give up alike (scaled alike, a
/// light vif held below its rate would turn greedy and its target would swing); an unlimited
/// `to` leaves the maxes; a share without a max under a finite `to` is bounded by it; each min
/// stays ≤ its max.
pub fn fit(shares: &BTreeMap<String, Share>, to: Totals) -> BTreeMap<String, Share> {
    let maxes: Vec<Option<u64>> = match to.0 {
        None => shares.values().map(|s| s.max_bps).collect(),
        Some(t) => {
            let wants: Vec<u64> = shares.values().map(|s| s.max_bps.unwrap_or(t)).collect();
            fill(&wants, t).into_iter().map(Some).collect()
        }
    };
    let floors: Vec<u64> = shares.values().map(|s| s.min_bps).collect();
    let mins = fill(&floors, to.1);
    shares
        .keys()
        .zip(maxes.into_iter().zip(mins))
        .map(|(n, (max_bps, min))| {
            let min_bps = min.min(max_bps.unwrap_or(u64::MAX));
            (n.clone(), Share { min_bps, max_bps })
        })
        .collect()
}

/// The lower of two maxes (`None`: unlimited).
pub(crate) fn lower(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Whether `a` is above `b` in max or min (an unlimited max is above any).
fn above(a: Totals, b: Totals) -> bool {
    let max_up = match (a.0, b.0) {
        (None, Some(_)) => true,
        (Some(x), Some(y)) => x > y,
        _ => false,
    };
    max_up || a.1 > b.1
}

/// One tenant's step on one host: the shares to hold and the grant to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantStep {
    /// The shares to hold now (Σ within what is published and what is enforced).
    pub hold: BTreeMap<String, Share>,
    /// The grant to publish (`None`: the host has no vif of the tenant any more: delete it).
    pub grant: Option<Grant>,
    /// The grant is a raise: commit it by compare-and-put, then hold `raised`.
    pub raise: bool,
    /// The shares once the raise is committed.
    pub raised: BTreeMap<String, Share>,
}

/// What [`step`] needs for one tenant on one host.
#[derive(Debug, Clone)]
pub struct StepInput<'a> {
    /// The tenant's limits.
    pub limits: &'a TenantLimits,
    /// What the split (fitted to the host) gives its vifs of the tenant.
    pub targets: &'a BTreeMap<String, Share>,
    /// Their shares in force.
    pub enforced: &'a BTreeMap<String, Share>,
    /// Its grant as last committed (`None`: none).
    pub published: Option<&'a Grant>,
    /// What the other hosts' grants count for ([`counted`]).
    pub others: &'a [Totals],
    /// The hosts of the tenant it sees, itself included (for the fallback, `max / N`).
    pub hosts: u64,
    /// Its view's lease, ms.
    pub lease_ms: u64,
}

/// One tenant's step (module doc): the grant is `min(targets, headroom)`; at or below what is
/// both published and enforced it is a decrease, held at once and published after; above, a
/// raise, published by compare-and-put first.
pub fn step(i: &StepInput<'_>) -> TenantStep {
    let room = headroom(i.limits, i.others);
    let want = totals(i.targets.values());
    let grant_to = (lower(want.0, room.0), want.1.min(room.1));
    let published = i.published.map_or((Some(0), 0), |g| (g.max_bps, g.min_bps));
    let enforced = if i.enforced.is_empty() {
        (Some(0), 0)
    } else {
        totals(i.enforced.values())
    };
    // What the others may count and what is in force, whichever is lower: a lapsed host holds
    // its fallback though its grant says more, and may not climb back without a commit.
    let base = (
        match (published.0, enforced.0) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        },
        published.1.min(enforced.1),
    );
    let raise = above(grant_to, base);
    let hold = if raise {
        fit(
            i.targets,
            (lower(grant_to.0, base.0), grant_to.1.min(base.1)),
        )
    } else {
        fit(i.targets, grant_to)
    };
    let raised = fit(i.targets, grant_to);
    let grant = (!i.targets.is_empty()).then(|| {
        let n = i.hosts.max(1);
        let epoch = i.published.map_or(1, |g| g.epoch + 1);
        Grant {
            epoch,
            max_bps: grant_to.0,
            min_bps: grant_to.1,
            fallback_max_bps: lower(grant_to.0, i.limits.max_bps.map(|m| m / n)),
            fallback_min_bps: grant_to.1.min(i.limits.min_bps / n),
            lease_ms: i.lease_ms,
            unknown: BTreeMap::new(),
        }
    });
    TenantStep {
        hold,
        grant,
        raise,
        raised,
    }
}

/// Whether `next` differs from `published` in anything the others count.
pub fn changed(published: Option<&Grant>, next: Option<&Grant>) -> bool {
    let key = |g: &Grant| {
        (
            g.max_bps,
            g.min_bps,
            g.fallback_max_bps,
            g.fallback_min_bps,
            g.lease_ms,
        )
    };
    published.map(key) != next.map(key)
}

/// A lapsed host's shares: each tenant's vifs (`tenant_of`) scaled down to the fallback of
/// its last committed grant; vifs of a tenant without a grant keep no tenant share above 0.
pub fn fall_back(
    enforced: &BTreeMap<String, Share>,
    tenant_of: &BTreeMap<String, String>,
    committed: &BTreeMap<String, Grant>,
) -> BTreeMap<String, Share> {
    let mut by_tenant: BTreeMap<&str, BTreeMap<String, Share>> = BTreeMap::new();
    for (port, s) in enforced {
        let t = tenant_of.get(port).map_or("", String::as_str);
        by_tenant.entry(t).or_default().insert(port.clone(), *s);
    }
    let mut out = BTreeMap::new();
    for (t, shares) in by_tenant {
        let to = committed
            .get(t)
            .map_or((Some(0), 0), |g| (g.fallback_max_bps, g.fallback_min_bps));
        out.extend(fit(&shares, to));
    }
    out
}

#[cfg(test)]
#[path = "grants_tests.rs"]
mod tests;
