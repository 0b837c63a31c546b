//! Answers pushed ahead of the hosts' reports (docs/cluster.md, "Pushed raises").
//!
//! ## Why
//! A raise is given only out of capacity the other hosts have confirmed releasing
//! ([`super`]'s module doc). Answered only when it reports, a host whose raise waits for
//! another's release gets it one of its own periods after that release is confirmed: a move of
//! a tenant's max from one host to another is a chain of whole periods (the falling host's
//! report, the decrease, its acknowledgement at its next report, then the rising host's next
//! report), and the chains were what the simulator's convergence waited for.
//!
//! ## Behavior
//! - A host is **short** in a tenant when its latest answer gave it less than its target (in
//!   max or in min). The leader keeps the short hosts per tenant.
//! - A tenant is **released** when a report's acknowledgement lowers what its host is counted
//!   for (it confirmed a decrease).
//! - [`Leader::push`], called after the reports that arrived, answers every short host of every
//!   released tenant whose grant would now rise above the last one it was sent: a grant like
//!   any other (a new epoch, recorded as sent now, counted in full for its lease), so the
//!   bound does not change. A host that would not rise stays short, for the next release.
//! - **The host's side**: a pushed answer is applied like an answer to the host's latest
//!   report to the shard, its lease timed from that report's sending (earlier than the push,
//!   so the host's lease still ends before the leader stops counting the grant).
//! - Nothing is pushed in the hold after a failover (the leader grants nobody more than they
//!   hold then).
//!
//! ## Limitations
//! - Only releases confirmed by acknowledgements wake the short hosts; capacity freed by a
//!   lease running out waits for the short host's next report, as before.
//! - A pushed answer that is lost counts for its lease like any lost answer: a later raise,
//!   never an excess.

use std::collections::BTreeMap;

use super::{smaller, Entry, HostGrant, Leader, Totals};
use crate::grants::totals;
use crate::ids::IdMap;
use crate::split::Share;

/// The short hosts per tenant, the tenants released and the hosts lowered since the last
/// push.
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    short: IdMap<u32, Vec<u32>>,
    released: Vec<u32>,
    lowered: Vec<(u32, u32)>,
}

impl Pending {
    /// Notes whether `host`'s latest answer in `tenant` fell short of its target.
    pub(super) fn short(&mut self, tenant: u32, host: u32, short: bool) {
        let hosts = self.short.entry(tenant).or_default();
        match (short, hosts.iter().position(|&h| h == host)) {
            (true, None) => hosts.push(host),
            (false, Some(i)) => drop(hosts.swap_remove(i)),
            _ => {}
        }
    }

    /// Notes that a host of `tenant` confirmed a decrease.
    pub(super) fn released(&mut self, tenant: u32) {
        if self.short.get(&tenant).is_some_and(|h| !h.is_empty())
            && !self.released.contains(&tenant)
        {
            self.released.push(tenant);
        }
    }
}

impl Pending {
    /// Notes the hosts of `tenant` whose new `targets` are below the last grant they were
    /// sent (of term `term`, in `books`).
    pub(super) fn lowered(
        &mut self,
        tenant: u32,
        targets: &IdMap<u32, BTreeMap<String, Share>>,
        books: &IdMap<(u32, u32), Vec<Entry>>,
        term: u32,
    ) {
        for (&h, t) in targets {
            let Some(last) = last_sent(books.get(&(tenant, h)), term) else {
                continue;
            };
            if rises(last, totals(t.values())) {
                self.lowered.push((tenant, h));
            }
        }
    }
}

/// The totals of the last grant of term `term` in `book`.
fn last_sent(book: Option<&Vec<Entry>>, term: u32) -> Option<Totals> {
    let ours = book?.iter().filter(|e| super::ours(term, e.epoch));
    ours.max_by_key(|e| e.epoch).map(|e| e.totals)
}

/// Whether `to` is above `last` in max or in min (an unlimited max is above any).
fn rises(to: Totals, last: Totals) -> bool {
    smaller(to, last) != to
}

impl Leader {
    /// The answers to push at `now_ns` (module doc): per host, its raised grants by tenant.
    pub fn push(&mut self, now_ns: u64) -> Vec<(String, BTreeMap<String, HostGrant>)> {
        let released = std::mem::take(&mut self.pending.released);
        let lowered = std::mem::take(&mut self.pending.lowered);
        if self.holding(now_ns) {
            return Vec::new();
        }
        let mut out: BTreeMap<u32, BTreeMap<String, HostGrant>> = BTreeMap::new();
        // Decreases first: the sooner a host lowers, the sooner it confirms the release.
        for (t, h) in lowered {
            let Some((want, to)) = self.totals_for(t, h, now_ns) else {
                continue;
            };
            // Not if an answer to a report has told it since the plan.
            let last = last_sent(self.books.get(&(t, h)), self.term);
            if !last.is_some_and(|l| rises(l, to)) {
                continue;
            }
            self.push_one(t, h, (want, to), now_ns, &mut out);
        }
        for t in released {
            let hosts = self.pending.short.remove(&t).unwrap_or_default();
            for h in hosts {
                let Some((want, to)) = self.totals_for(t, h, now_ns) else {
                    // No target in this tenant any more: no longer short.
                    continue;
                };
                let last = last_sent(self.books.get(&(t, h)), self.term);
                if last.is_some_and(|l| !rises(to, l)) {
                    self.pending.short(t, h, true);
                    continue;
                }
                self.push_one(t, h, (want, to), now_ns, &mut out);
            }
        }
        let hosts = &self.hosts;
        out.into_iter()
            .map(|(h, a)| (hosts.name(h).to_string(), a))
            .collect()
    }

    /// Sends `host` the grant of `to` in `tenant` (of its `want`), noting whether it falls
    /// short of it (`push.rs`).
    pub(super) fn grant(
        &mut self,
        tenant: u32,
        host: u32,
        (want, to): (Totals, Totals),
        now_ns: u64,
    ) -> Option<HostGrant> {
        self.pending.short(tenant, host, smaller(want, to) != want);
        self.send(tenant, host, to, now_ns)
    }

    /// Grants `host` its `totals` in `tenant` and adds the grant to `out`.
    fn push_one(
        &mut self,
        tenant: u32,
        host: u32,
        totals: (Totals, Totals),
        now_ns: u64,
        out: &mut BTreeMap<u32, BTreeMap<String, HostGrant>>,
    ) {
        if let Some(g) = self.grant(tenant, host, totals, now_ns) {
            let name = self.tenant_ids.name(tenant).to_string();
            out.entry(host).or_default().insert(name, g);
        }
    }
}
