//! A host's side of the aggregators (docs/cluster.md, "Design: aggregators"): what it enforces
//! of each tenant, which of the leaders' answers it applies, and when it falls back.
//!
//! The shard leader's bound ([`crate::aggregator`]) holds only if every host keeps these
//! rules, so they are code of their own, run by the agent and by the simulator alike:
//! - **Before any grant** of a tenant the host holds its fallback, `limits / N` (`N`: the hosts
//!   etcd declares in the tenant), over its vifs: the leader counts a declared host that has
//!   not reported as holding exactly that.
//! - **An answer** is applied only if its epoch is newer than the one in force (a late answer,
//!   or an earlier leader's, never replaces a newer grant) and its lease has not run out. The
//!   lease is timed from when the host *sent* the report it answers, which is before the leader
//!   sent the grant, so the host's lease ends before the leader stops counting the grant.
//! - **A lapsed lease**: the vifs' shares are fitted into the grant's fallback
//!   (`min(grant, limits / N)`), and stay there until a newer grant arrives.
//! - **The report** says, per tenant, the epoch in force and the totals of the shares in force
//!   ([`Holder::enforcing`]), which is what the leader counts once it acknowledges them.
//!
//! Time is an input (`now_ns`, the host's monotonic clock), as in the leader.

use std::collections::BTreeMap;

use crate::aggregator::{Enforcing, HostGrant};
use crate::grants::{fit, lower, totals, Totals};
use crate::split::Share;

/// What a host holds of one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The epoch of the grant in force (0: none yet).
    pub epoch: u64,
    /// The tenant's vifs' shares in force, by port.
    pub shares: BTreeMap<String, Share>,
    /// The totals it falls back to when the lease runs out.
    pub fallback: Totals,
    /// When the lease runs out, on the host's clock (0: already out).
    pub lease_end_ns: u64,
    /// The lease ran out and the shares are fitted into the fallback.
    pub lapsed: bool,
}

/// A host's holdings of every tenant it has vifs in (module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    held: BTreeMap<String, Held>,
}

impl Holder {
    /// Makes sure the host holds something of `tenant`: if it holds nothing yet, `vifs` (the
    /// vifs' own shares: their caps and floors) fitted into `cap`, the tenant's `limits / N`.
    /// Returns whether it was new.
    pub fn start(&mut self, tenant: &str, cap: Totals, vifs: &BTreeMap<String, Share>) -> bool {
        if self.held.contains_key(tenant) {
            return false;
        }
        let held = Held {
            epoch: 0,
            shares: fit(vifs, cap),
            fallback: cap,
            lease_end_ns: 0,
            lapsed: true,
        };
        self.held.insert(tenant.to_string(), held);
        true
    }

    /// Forgets a tenant the host no longer has vifs in.
    pub fn forget(&mut self, tenant: &str) {
        self.held.remove(tenant);
    }

    /// What the host holds of `tenant`.
    pub fn get(&self, tenant: &str) -> Option<&Held> {
        self.held.get(tenant)
    }

    /// Every tenant's holding.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Held)> {
        self.held.iter()
    }

    /// Per tenant, what the host reports enforcing.
    pub fn enforcing(&self) -> BTreeMap<String, Enforcing> {
        self.held
            .iter()
            .map(|(t, h)| (t.clone(), enforcing(h)))
            .collect()
    }

    /// Applies the leader's answer to the report sent at `sent_ns`, received at `now_ns`
    /// (module doc). Returns the tenants whose shares changed.
    pub fn apply(
        &mut self,
        answer: &BTreeMap<String, HostGrant>,
        sent_ns: u64,
        now_ns: u64,
    ) -> Vec<String> {
        let mut changed = Vec::new();
        for (t, g) in answer {
            let lease_end_ns = sent_ns.saturating_add(g.grant.lease_ms.saturating_mul(1_000_000));
            let Some(h) = self.held.get_mut(t) else {
                // A tenant it has not started: its vifs are not here (any more).
                continue;
            };
            if g.grant.epoch <= h.epoch || now_ns >= lease_end_ns {
                continue;
            }
            // The shares are within the grant's totals by the leader's fit; fit again so that
            // a wrong answer cannot take the host above the totals it acknowledges.
            let to = (g.grant.max_bps, g.grant.min_bps);
            let shares = fit(&g.shares, to);
            if shares != h.shares {
                changed.push(t.clone());
            }
            *h = Held {
                epoch: g.grant.epoch,
                shares,
                fallback: (g.grant.fallback_max_bps, g.grant.fallback_min_bps),
                lease_end_ns,
                lapsed: false,
            };
        }
        changed
    }

    /// Falls back where a lease ran out by `now_ns`. Returns the tenants whose shares changed.
    pub fn lapse(&mut self, now_ns: u64) -> Vec<String> {
        let mut changed = Vec::new();
        for (t, h) in self.held.iter_mut() {
            if h.lapsed || now_ns < h.lease_end_ns {
                continue;
            }
            h.lapsed = true;
            let now = totals(h.shares.values());
            let to = (lower(now.0, h.fallback.0), now.1.min(h.fallback.1));
            let shares = fit(&h.shares, to);
            if shares != h.shares {
                h.shares = shares;
                changed.push(t.clone());
            }
        }
        changed
    }

    /// The earliest lease still running (when [`Holder::lapse`] has something to do).
    pub fn next_lapse_ns(&self) -> Option<u64> {
        self.held
            .values()
            .filter(|h| !h.lapsed)
            .map(|h| h.lease_end_ns)
            .min()
    }
}

fn enforcing(h: &Held) -> Enforcing {
    let (max_bps, min_bps) = totals(h.shares.values());
    Enforcing {
        epoch: h.epoch,
        max_bps,
        min_bps,
    }
}

#[cfg(test)]
#[path = "holder_tests.rs"]
mod tests;
