//! An aggregator shard's leader (docs/cluster.md, "Design: aggregators"): the one allocator of
//! its tenants. Each host reports its tenant vifs' measurements and, per tenant, the grant it
//! enforces; the leader splits each tenant once over every host's latest report, with the
//! weights, caps and limits of etcd's desired state, and answers the host with its vifs' shares
//! under a [`Grant`]: an epoch, a fallback and a lease.
//!
//! This module is the leader's bookkeeping and decisions only: no transport, no election, no
//! clock (time is an input, `now_ns`, on the leader's monotonic clock).
//!
//! ## Behavior
//! - **Who says what.** A vif's tenant, weight and own cap come from the declarations (etcd),
//!   never from a report; a reported vif that etcd does not declare for that host is no member
//!   ([`crate::shares::group`]). A host can misstate only its own vifs' demands.
//! - **Counted.** For each tenant and host the leader counts what the host may be enforcing:
//!   the largest of the grant it last acknowledged and every grant sent to it since (it may
//!   have applied any of them). A grant counts in full until `lease + drift` after it was
//!   sent, then its fallback: the host times its lease from when it *sent* the report that the
//!   grant answers, which is before the leader sent the grant, so by then it has surely lapsed.
//! - **Decreases at once, raises out of confirmed releases.** A host's grant is the split's
//!   total for its vifs, cut to `max − Σ counted(others)` (the same for the min): it never takes
//!   capacity another host was told to release but has not confirmed releasing. A decrease
//!   lowers what the host is counted for only once the host acknowledges it.
//! - **The host's side** (what the bound relies on): it applies a grant only if its epoch is
//!   newer than the one it enforces and its lease (from the report's sending) has not run out;
//!   when the lease runs out it holds the grant's fallback, `min(grant, limits / N)` with `N`
//!   the hosts etcd declares in the tenant, so the fallbacks of all hosts add up to at most
//!   the limits.
//! - **Failover.** Epochs carry the leader's term in their high 32 bits, so a grant of an
//!   earlier leader is never taken for one of this leader's. A new leader knows no grants: for
//!   `lease + drift` after it starts (the hold) it grants a host at most what the host reports
//!   enforcing, and nobody more. After the hold every host that has had no grant from it has
//!   lapsed to a fallback: it counts `min(reported, limits / N)`, or `limits / N` for a
//!   declared host that never reported.
//! - So at every instant `Σ_hosts enforced ≤ Σ_hosts counted ≤ limits`, per tenant, once the
//!   hold is over (and during it, at most what the earlier leader's grants allowed).
//!
//! ## Limitations
//! - `drift` must bound how much sooner the leader's clock reaches `lease` than a host's.
//! - A declared host that never reports keeps its fallback counted, as a silent host does in
//!   the etcd grants ([`crate::grants`]).
//! - A host whose vifs etcd no longer declares in a tenant is no longer counted in it: it
//!   stops enforcing the tenant's shares when it sees the declarations change, as today.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::grants::{fit, lower, totals, Grant, Totals};
use crate::model::HostStatus;
use crate::shares::{group, Declarations};
use crate::split::{split, Share, TenantLimits};

/// What a host enforces of a tenant, as it reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcing {
    /// The epoch of the grant it enforces (0: none; another term's: an earlier leader's).
    pub epoch: u64,
    /// The total max of its vifs' shares in force, bit/s (`None`: unlimited).
    pub max_bps: Option<u64>,
    /// Their total floor in force, bit/s.
    pub min_bps: u64,
}

/// A host's report: its tenant vifs' measurements and what it enforces of each tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The host's name, as etcd's declarations key it.
    pub host: String,
    /// Its vifs' measurements (demand, `idle`, `floor_greedy`); tenants, weights and caps in it
    /// are ignored.
    pub status: HostStatus,
    /// Per tenant, what it enforces.
    pub enforcing: BTreeMap<String, Enforcing>,
}

/// The leader's answer for one tenant of a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostGrant {
    /// The totals the host may enforce, its fallback and lease.
    pub grant: Grant,
    /// Its vifs' shares, within the grant's totals.
    pub shares: BTreeMap<String, Share>,
}

/// `host`'s book in `tenant`, made if new (the keys are copied only then: this runs for every
/// tenant of every report).
fn book_of<'a>(
    books: &'a mut HashMap<String, HashMap<String, Vec<Entry>>>,
    tenant: &str,
    host: &str,
) -> &'a mut Vec<Entry> {
    if !books.contains_key(tenant) {
        books.insert(tenant.to_string(), HashMap::new());
    }
    let by_host = books.get_mut(tenant).expect("inserted above");
    if !by_host.contains_key(host) {
        by_host.insert(host.to_string(), Vec::new());
    }
    by_host.get_mut(host).expect("inserted above")
}

/// One host of a tenant, as its shard's leader sees it ([`Leader::tenant_view`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostView {
    /// The host.
    pub host: String,
    /// Σ of its vifs' targets in the latest plan.
    pub target: Totals,
    /// What the leader counts it as possibly enforcing.
    pub counted: Totals,
}

/// The aggregator shard of `tenant` among `shards` (at least 1): rendezvous hashing, so that
/// going from `S` to `S + 1` shards moves only the tenants the new shard wins, about
/// `1 / (S + 1)` of them. The hash is FNV-1a through a 64-bit mixer, written out so that every
/// host and every version agree (std's hasher promises neither).
pub fn shard_of(tenant: &str, shards: u32) -> u32 {
    let score = |s: u32| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in tenant.bytes().chain(s.to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        // splitmix64's finalizer, so that nearby shard numbers score independently.
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    };
    (0..shards.max(1))
        .max_by_key(|&s| (score(s), s))
        .unwrap_or(0)
}

/// A grant that a host may be enforcing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// Its epoch (0: what the host reported holding from before this leader).
    epoch: u64,
    totals: Totals,
    /// Its fallback (`None`: `min(totals, limits / N)`, computed when counted).
    fallback: Option<Totals>,
    /// When it was sent, on the leader's clock.
    sent_ns: u64,
}

/// The larger of two totals in max and in min (an unlimited max is the largest).
fn larger(a: Totals, b: Totals) -> Totals {
    let max = match (a.0, b.0) {
        (Some(x), Some(y)) => Some(x.max(y)),
        _ => None,
    };
    (max, a.1.max(b.1))
}

fn smaller(a: Totals, b: Totals) -> Totals {
    (lower(a.0, b.0), a.1.min(b.1))
}

/// A shard leader's state (module doc).
#[derive(Debug, Clone)]
pub struct Leader {
    term: u32,
    started_ns: u64,
    lease_ns: u64,
    drift_ns: u64,
    /// Each host's latest report.
    reports: BTreeMap<String, HostStatus>,
    /// Per tenant and host, what it may be enforcing.
    books: HashMap<String, HashMap<String, Vec<Entry>>>,
    /// Per tenant and host, its vifs' targets of the latest [`Leader::plan`] (by vif in
    /// order: shares are fitted in it).
    targets: HashMap<String, HashMap<String, BTreeMap<String, Share>>>,
    /// Per tenant: its limits and declared hosts at the latest plan.
    tenants: HashMap<String, (TenantLimits, Vec<String>)>,
    /// Per tenant: Σ of what its hosts are counted for (built on first use after a plan).
    tallies: HashMap<String, Tally>,
    /// Per host: the tenants the latest plan gives its vifs targets in.
    tenants_of: HashMap<String, Vec<String>>,
}

/// Σ of what a tenant's hosts are counted for, and each host's part, so that an answer reads
/// the others' sum in O(log hosts) instead of counting every other host: with a tenant on
/// every host, counting them all made a period O(hosts²) (busiest shard 880 ms a period at
/// 1,000 hosts; docs/cluster.md). A part is refreshed whenever its host's book changes and
/// the whole tally at every plan; in between, grants that expire still count in full, which
/// only overstates the others (a later raise, never an excess).
#[derive(Debug, Clone, Default)]
struct Tally {
    parts: HashMap<String, Totals>,
    /// Σ max (an unlimited max as 0, as [`crate::grants::headroom`] reads it) and Σ min.
    sum: (u128, u128),
}

impl Tally {
    fn set(&mut self, host: &str, t: Totals) {
        let new = (u128::from(t.0.unwrap_or(0)), u128::from(t.1));
        let old = match self.parts.get_mut(host) {
            Some(p) => Some(std::mem::replace(p, t)),
            None => self.parts.insert(host.to_string(), t),
        };
        if let Some(old) = old {
            self.sum.0 -= u128::from(old.0.unwrap_or(0));
            self.sum.1 -= u128::from(old.1);
        }
        self.sum.0 += new.0;
        self.sum.1 += new.1;
    }

    /// What `limits` leave `host` beside the others: [`crate::grants::headroom`] over the others' parts.
    fn headroom(&self, limits: &TenantLimits, host: &str) -> Totals {
        let own = self.parts.get(host).copied().unwrap_or((Some(0), 0));
        let used = |sum: u128, own: u64| u64::try_from(sum - u128::from(own)).unwrap_or(u64::MAX);
        let max = limits
            .max_bps
            .map(|m| m.saturating_sub(used(self.sum.0, own.0.unwrap_or(0))));
        let min = limits.min_bps.saturating_sub(used(self.sum.1, own.1));
        (max, min)
    }
}

impl Leader {
    /// A leader elected for `term` (a number that grows with each leader of the shard: the
    /// wiring keeps a counter in etcd, raised by each new leader) at `now_ns`, answering with
    /// leases of `lease_ns`; `drift_ns` bounds the clocks' disagreement over a lease (module
    /// doc).
    pub fn new(term: u32, now_ns: u64, lease_ns: u64, drift_ns: u64) -> Leader {
        Leader {
            term,
            started_ns: now_ns,
            lease_ns,
            drift_ns,
            reports: BTreeMap::new(),
            books: HashMap::new(),
            targets: HashMap::new(),
            tenants: HashMap::new(),
            tallies: HashMap::new(),
            tenants_of: HashMap::new(),
        }
    }

    /// The next epoch of `host`'s grants in `tenant`: this term's, one above the last sent
    /// (epochs are compared only within one book; 2^32 − 1 grants a term, 68 years at two a
    /// second, then the last epoch repeats, which only delays acknowledgements).
    fn next_epoch(&self, tenant: &str, host: &str) -> u64 {
        let last = self
            .books
            .get(tenant)
            .and_then(|b| b.get(host))
            .into_iter()
            .flatten()
            .filter(|e| self.ours(e.epoch))
            .map(|e| e.epoch & 0xffff_ffff)
            .max()
            .unwrap_or(0);
        (u64::from(self.term) << 32) | (last + 1).min(0xffff_ffff)
    }

    fn ours(&self, epoch: u64) -> bool {
        epoch >> 32 == u64::from(self.term) && epoch & 0xffff_ffff != 0
    }

    fn expired(&self, sent_ns: u64, now_ns: u64) -> bool {
        now_ns
            >= sent_ns
                .saturating_add(self.lease_ns)
                .saturating_add(self.drift_ns)
    }

    /// Its term.
    pub fn term(&self) -> u32 {
        self.term
    }

    /// The tenants of its latest plan, by name.
    pub fn tenants(&self) -> Vec<String> {
        let mut t: Vec<String> = self.tenants.keys().cloned().collect();
        t.sort();
        t
    }

    /// Whether `now_ns` is within the hold after the leader started.
    pub fn holding(&self, now_ns: u64) -> bool {
        !self.expired(self.started_ns, now_ns)
    }

    /// What `host` is counted for in `tenant` at `now_ns`, whose fallback cap is `cap`
    /// (`limits / N`).
    fn counted(&self, tenant: &str, host: &str, cap: Totals, now_ns: u64) -> Totals {
        let entries = self.books.get(tenant).and_then(|b| b.get(host));
        let Some(entries) = entries.filter(|e| !e.is_empty()) else {
            // Never reported: after the hold it has surely lapsed to a fallback.
            return cap;
        };
        entries
            .iter()
            .map(|e| match self.expired(e.sent_ns, now_ns) {
                false => e.totals,
                true => e.fallback.unwrap_or_else(|| smaller(e.totals, cap)),
            })
            .fold((Some(0), 0), larger)
    }

    /// What the leader knows of `tenant` at `now_ns`, host by host: the latest plan's target
    /// for its vifs and what it is counted for (the operators' view, `vqos cluster status
    /// --tenant`, and the simulator's).
    pub fn tenant_view(&self, tenant: &str, now_ns: u64) -> Vec<HostView> {
        let (Some((_, hosts)), Some((_, cap))) = (self.tenants.get(tenant), self.cap(tenant))
        else {
            return Vec::new();
        };
        let targets = self.targets.get(tenant);
        hosts
            .iter()
            .map(|h| HostView {
                host: h.clone(),
                target: targets
                    .and_then(|t| t.get(h))
                    .map_or((Some(0), 0), |t| totals(t.values())),
                counted: self.counted(tenant, h, cap, now_ns),
            })
            .collect()
    }

    /// Splits every tenant over the hosts' latest reports: the targets the next answers give
    /// (run once a period). `declared` and `tenants` are etcd's desired state for this shard's
    /// tenants.
    pub fn plan(&mut self, declared: &Declarations, tenants: &BTreeMap<String, TenantLimits>) {
        let mut hosts_of: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (h, vifs) in declared {
            for d in vifs.values() {
                let v = hosts_of.entry(d.tenant.as_str()).or_default();
                // A host's vifs come one after another: it is new unless it was the last.
                if v.last() != Some(h) {
                    v.push(h.clone());
                }
            }
        }
        self.targets.clear();
        self.tallies.clear();
        self.tenants_of.clear();
        self.tenants.clear();
        for (t, m) in group(&self.reports, declared) {
            let Some(limits) = tenants.get(t) else {
                continue;
            };
            let mut by_host: HashMap<String, BTreeMap<String, Share>> = HashMap::new();
            for (&(h, port), s) in m.who.iter().zip(split(limits, &m.members)) {
                by_host
                    .entry(h.to_string())
                    .or_default()
                    .insert(port.to_string(), s);
            }
            let hosts = hosts_of.remove(t).unwrap_or_default();
            for h in by_host.keys() {
                self.tenants_of
                    .entry(h.clone())
                    .or_default()
                    .push(t.to_string());
            }
            self.targets.insert(t.to_string(), by_host);
            self.tenants.insert(t.to_string(), (*limits, hosts));
        }
    }

    /// Records `r` (its acknowledgements) and answers it: a grant for each tenant the latest
    /// plan gives the host's vifs a target in.
    pub fn report(&mut self, r: Report, now_ns: u64) -> BTreeMap<String, HostGrant> {
        self.acknowledge(&r, now_ns);
        // Keys are copied only for a host new to the leader (this runs for every report).
        match self.reports.get_mut(&r.host) {
            Some(s) => *s = r.status,
            None => drop(self.reports.insert(r.host.clone(), r.status)),
        }
        let Some(tenants) = self.tenants_of.get_mut(&r.host).map(std::mem::take) else {
            return BTreeMap::new();
        };
        let answers = tenants
            .iter()
            .filter_map(|t| {
                let g = self.answer(t, &r.host, now_ns)?;
                Some((t.clone(), g))
            })
            .collect();
        if let Some(v) = self.tenants_of.get_mut(&r.host) {
            *v = tenants;
        }
        answers
    }

    fn acknowledge(&mut self, r: &Report, now_ns: u64) {
        for (tenant, e) in &r.enforcing {
            let ours = self.ours(e.epoch);
            let started_ns = self.started_ns;
            let book = book_of(&mut self.books, tenant, &r.host);
            if ours {
                // It enforces `e.epoch`: the grants before it are superseded (a host never
                // goes back to an older grant), and so is what it held before this leader.
                book.retain(|x| x.epoch >= e.epoch);
            } else if !book.iter().any(|x| x.epoch != 0) {
                // No grant of this leader applied yet: what it reports is what it holds from
                // before (it can only fall without a grant, so the latest report is an upper
                // bound); it lapses by the end of the hold.
                book.clear();
                book.push(Entry {
                    epoch: 0,
                    totals: (e.max_bps, e.min_bps),
                    fallback: None,
                    sent_ns: started_ns,
                });
            }
            self.retally(tenant, &r.host, now_ns);
        }
    }

    /// The grant for `host` in `tenant` at `now_ns`, recorded as sent.
    fn answer(&mut self, tenant: &str, host: &str, now_ns: u64) -> Option<HostGrant> {
        let (limits, cap) = self.cap(tenant)?;
        let want = totals(self.targets.get(tenant)?.get(host)?.values());
        let to = if self.holding(now_ns) {
            // The hold: nobody above what they report enforcing.
            let reported = self
                .books
                .get(tenant)
                .and_then(|b| b.get(host))
                .is_some_and(|es| !es.is_empty());
            let own = match reported {
                true => self.counted(tenant, host, cap, now_ns),
                false => (Some(0), 0),
            };
            smaller(want, own)
        } else {
            if !self.tallies.contains_key(tenant) {
                let tally = self.tally(tenant, &self.tenants.get(tenant)?.1, cap, now_ns);
                self.tallies.insert(tenant.to_string(), tally);
            }
            let room = self.tallies[tenant].headroom(&limits, host);
            smaller(want, room)
        };
        let shares = fit(self.targets.get(tenant)?.get(host)?, to);
        let epoch = self.next_epoch(tenant, host);
        let fallback = smaller(to, cap);
        let grant = Grant {
            epoch,
            max_bps: to.0,
            min_bps: to.1,
            fallback_max_bps: fallback.0,
            fallback_min_bps: fallback.1,
            lease_ms: self.lease_ns / 1_000_000,
            unknown: BTreeMap::new(),
        };
        let entry = Entry {
            epoch,
            totals: to,
            fallback: Some(fallback),
            sent_ns: now_ns,
        };
        self.record(tenant, host, entry, now_ns);
        self.retally(tenant, host, now_ns);
        Some(HostGrant { grant, shares })
    }

    /// A tenant's tally at `now_ns` over its declared `hosts`.
    fn tally(&self, tenant: &str, hosts: &[String], cap: Totals, now_ns: u64) -> Tally {
        let mut t = Tally::default();
        for h in hosts {
            t.set(h, self.counted(tenant, h, cap, now_ns));
        }
        t
    }

    /// Refreshes `host`'s part of `tenant`'s tally, if the tenant has one.
    fn retally(&mut self, tenant: &str, host: &str, now_ns: u64) {
        // The tally has a part for each declared host, and only for them.
        if !self
            .tallies
            .get(tenant)
            .is_some_and(|t| t.parts.contains_key(host))
        {
            return;
        }
        let Some((_, cap)) = self.cap(tenant) else {
            return;
        };
        let part = self.counted(tenant, host, cap, now_ns);
        if let Some(t) = self.tallies.get_mut(tenant) {
            t.set(host, part);
        }
    }

    /// `tenant`'s limits at the latest plan, and its fallback cap `limits / N`.
    fn cap(&self, tenant: &str) -> Option<(TenantLimits, Totals)> {
        let (limits, hosts) = self.tenants.get(tenant)?;
        let n = hosts.len().max(1) as u64;
        Some((*limits, (limits.max_bps.map(|m| m / n), limits.min_bps / n)))
    }

    /// Adds `entry` to the host's book, folding the expired grants into the one with the
    /// largest fallback (they count only their fallbacks), so a host that never acknowledges
    /// keeps a book of at most a lease's worth of grants.
    fn record(&mut self, tenant: &str, host: &str, entry: Entry, now_ns: u64) {
        let (lease_ns, drift_ns) = (self.lease_ns, self.drift_ns);
        let book = book_of(&mut self.books, tenant, host);
        let expired =
            |e: &Entry| now_ns >= e.sent_ns.saturating_add(lease_ns.saturating_add(drift_ns));
        if book.iter().filter(|e| expired(e)).count() > 1 {
            let old: Vec<Entry> = book.iter().copied().filter(|e| expired(e)).collect();
            book.retain(|e| !expired(e));
            // Their fallbacks, as counted: the foreign entry's is computed, so keep it apart.
            let keep_foreign = old.iter().find(|e| e.fallback.is_none()).copied();
            let best = old
                .iter()
                .filter_map(|e| e.fallback)
                .fold(None, |a: Option<Totals>, f| {
                    Some(a.map_or(f, |a| larger(a, f)))
                });
            if let Some(f) = best {
                let epoch = old.iter().map(|e| e.epoch).max().unwrap_or(0);
                let sent_ns = old.iter().map(|e| e.sent_ns).min().unwrap_or(0);
                book.push(Entry {
                    epoch,
                    totals: f,
                    fallback: Some(f),
                    sent_ns,
                });
            }
            book.extend(keep_foreign);
            book.sort_by_key(|e| e.epoch);
        }
        book.push(entry);
    }
}

#[cfg(test)]
#[path = "aggregator_tests.rs"]
mod tests;
