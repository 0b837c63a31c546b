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
use crate::ids::{IdMap, Names};
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
///
/// Hosts and tenants are numbered (`ids::Names`): a report looks its host and each of its
/// tenants up by name once, and the books, plans and tallies by number after (the lookups by
/// name were half the leader's time, docs/benchmarks.md, "The aggregator leader's books by
/// number").
#[derive(Debug, Clone)]
pub struct Leader {
    term: u32,
    started_ns: u64,
    clock: Clock,
    /// Each host's latest report.
    reports: BTreeMap<String, HostStatus>,
    hosts: Names,
    tenant_ids: Names,
    /// Per (tenant, host), what it may be enforcing (kept across plans).
    books: IdMap<(u32, u32), Vec<Entry>>,
    /// Per tenant, its latest plan.
    plans: IdMap<u32, TenantPlan>,
    /// Per host: the tenants the latest plan gives its vifs targets in.
    tenants_of: IdMap<u32, Vec<u32>>,
    /// Answers pushed ahead of the hosts' reports (`push.rs`).
    pending: push::Pending,
}

/// The leases' timing.
#[derive(Debug, Clone, Copy)]
struct Clock {
    lease_ns: u64,
    drift_ns: u64,
}

impl Clock {
    fn expired(self, sent_ns: u64, now_ns: u64) -> bool {
        now_ns
            >= sent_ns
                .saturating_add(self.lease_ns)
                .saturating_add(self.drift_ns)
    }

    /// What a host with the book `entries` is counted for at `now_ns`, its fallback cap
    /// being `cap` (`limits / N`).
    fn counted(self, entries: Option<&Vec<Entry>>, cap: Totals, now_ns: u64) -> Totals {
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
}

/// A tenant as the latest [`Leader::plan`] left it.
#[derive(Debug, Clone)]
struct TenantPlan {
    limits: TenantLimits,
    /// Its declared hosts.
    hosts: Vec<u32>,
    /// The fallback cap, `limits / N` over its declared hosts.
    cap: Totals,
    /// Per host, its vifs' targets (by vif in order: shares are fitted in it).
    targets: IdMap<u32, BTreeMap<String, Share>>,
    /// Σ of what its hosts are counted for (built on first use after the plan).
    tally: Option<Tally>,
}

/// Σ of what a tenant's hosts are counted for, and each host's part, so that an answer reads
/// the others' sum in O(log hosts) instead of counting every other host: with a tenant on
/// every host, counting them all made a period O(hosts²) (busiest shard 880 ms a period at
/// 1,000 hosts; docs/cluster.md). A part is refreshed whenever its host's book changes and
/// the whole tally at every plan; in between, grants that expire still count in full, which
/// only overstates the others (a later raise, never an excess).
#[derive(Debug, Clone, Default)]
struct Tally {
    parts: IdMap<u32, Totals>,
    /// Σ max (an unlimited max as 0, as [`crate::grants::headroom`] reads it) and Σ min.
    sum: (u128, u128),
}

impl Tally {
    fn set(&mut self, host: u32, t: Totals) {
        let new = (u128::from(t.0.unwrap_or(0)), u128::from(t.1));
        let old = self.parts.insert(host, t);
        if let Some(old) = old {
            self.sum.0 -= u128::from(old.0.unwrap_or(0));
            self.sum.1 -= u128::from(old.1);
        }
        self.sum.0 += new.0;
        self.sum.1 += new.1;
    }

    /// What `limits` leave `host` beside the others: [`crate::grants::headroom`] over the others' parts.
    fn headroom(&self, limits: &TenantLimits, host: u32) -> Totals {
        let own = self.parts.get(&host).copied().unwrap_or((Some(0), 0));
        let used = |sum: u128, own: u64| u64::try_from(sum - u128::from(own)).unwrap_or(u64::MAX);
        let max = limits
            .max_bps
            .map(|m| m.saturating_sub(used(self.sum.0, own.0.unwrap_or(0))));
        let min = limits.min_bps.saturating_sub(used(self.sum.1, own.1));
        (max, min)
    }
}

/// The tenant's limits and fallback cap `limits / N` over its `hosts` declared hosts.
fn cap_of(limits: &TenantLimits, hosts: usize) -> Totals {
    let n = hosts.max(1) as u64;
    (limits.max_bps.map(|m| m / n), limits.min_bps / n)
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
            clock: Clock { lease_ns, drift_ns },
            reports: BTreeMap::new(),
            hosts: Names::default(),
            tenant_ids: Names::default(),
            books: IdMap::default(),
            plans: IdMap::default(),
            tenants_of: IdMap::default(),
            pending: push::Pending::default(),
        }
    }

    fn ours(&self, epoch: u64) -> bool {
        ours(self.term, epoch)
    }

    /// Its term.
    pub fn term(&self) -> u32 {
        self.term
    }

    /// The tenants of its latest plan, by name.
    pub fn tenants(&self) -> Vec<String> {
        let mut t: Vec<String> = self
            .plans
            .keys()
            .map(|&t| self.tenant_ids.name(t).to_string())
            .collect();
        t.sort();
        t
    }

    /// Whether `now_ns` is within the hold after the leader started.
    pub fn holding(&self, now_ns: u64) -> bool {
        !self.clock.expired(self.started_ns, now_ns)
    }

    /// What the leader knows of `tenant` at `now_ns`, host by host: the latest plan's target
    /// for its vifs and what it is counted for (the operators' view, `vqos cluster status
    /// --tenant`, and the simulator's).
    pub fn tenant_view(&self, tenant: &str, now_ns: u64) -> Vec<HostView> {
        let Some((t, plan)) = self
            .tenant_ids
            .get(tenant)
            .and_then(|t| Some((t, self.plans.get(&t)?)))
        else {
            return Vec::new();
        };
        plan.hosts
            .iter()
            .map(|&h| HostView {
                host: self.hosts.name(h).to_string(),
                target: plan
                    .targets
                    .get(&h)
                    .map_or((Some(0), 0), |t| totals(t.values())),
                counted: self
                    .clock
                    .counted(self.books.get(&(t, h)), plan.cap, now_ns),
            })
            .collect()
    }

    /// Splits every tenant over the hosts' latest reports: the targets the next answers give
    /// (run once a period). `declared` and `tenants` are etcd's desired state for this shard's
    /// tenants.
    pub fn plan(&mut self, declared: &Declarations, tenants: &BTreeMap<String, TenantLimits>) {
        // Each tenant's declared hosts, in order (a host's vifs come one after another).
        let mut hosts_of: HashMap<&str, Vec<u32>> = HashMap::new();
        for (h, vifs) in declared {
            let mut id = None;
            for d in vifs.values() {
                let h = *id.get_or_insert_with(|| self.hosts.id(h));
                let v = hosts_of.entry(d.tenant.as_str()).or_default();
                if v.last() != Some(&h) {
                    v.push(h);
                }
            }
        }
        // The last plan's targets are refilled where a host's vifs are the same (the usual
        // case): no name copied, no map made or dropped (measured, docs/benchmarks.md).
        let mut last = std::mem::take(&mut self.plans);
        self.tenants_of.values_mut().for_each(Vec::clear);
        for (name, m) in group(&self.reports, declared) {
            let Some(limits) = tenants.get(name) else {
                continue;
            };
            let t = self.tenant_ids.id(name);
            let mut before = last.remove(&t).map(|p| p.targets).unwrap_or_default();
            // `who` is by host, then port: each host's targets are one run of it.
            let mut targets: IdMap<u32, BTreeMap<String, Share>> = IdMap::default();
            let mut run: Vec<(&str, Share)> = Vec::new();
            let shares = split(limits, &m.members);
            for (i, (&(h, port), s)) in m.who.iter().zip(shares).enumerate() {
                run.push((port, s));
                if m.who.get(i + 1).is_some_and(|next| next.0 == h) {
                    continue;
                }
                let h = self.hosts.id(h);
                targets.insert(h, refill(before.remove(&h), &mut run));
                self.tenants_of.entry(h).or_default().push(t);
            }
            let hosts = hosts_of.remove(name).unwrap_or_default();
            let plan = TenantPlan {
                limits: *limits,
                cap: cap_of(limits, hosts.len()),
                hosts,
                targets,
                tally: None,
            };
            self.pending
                .lowered(t, &plan.targets, &self.books, self.term);
            self.plans.insert(t, plan);
        }
    }

    /// Records `r` (its acknowledgements) and answers it: a grant for each tenant the latest
    /// plan gives the host's vifs a target in.
    pub fn report(&mut self, r: Report, now_ns: u64) -> BTreeMap<String, HostGrant> {
        let host = self.hosts.id(&r.host);
        self.acknowledge(&r, host, now_ns);
        // Keys are copied only for a host new to the leader (this runs for every report).
        match self.reports.get_mut(&r.host) {
            Some(s) => *s = r.status,
            None => drop(self.reports.insert(r.host, r.status)),
        }
        let Some(tenants) = self.tenants_of.get_mut(&host).map(std::mem::take) else {
            return BTreeMap::new();
        };
        let answers = tenants
            .iter()
            .filter_map(|&t| {
                let g = self.answer(t, host, now_ns)?;
                Some((self.tenant_ids.name(t).to_string(), g))
            })
            .collect();
        if let Some(v) = self.tenants_of.get_mut(&host) {
            *v = tenants;
        }
        answers
    }

    fn acknowledge(&mut self, r: &Report, host: u32, now_ns: u64) {
        for (tenant, e) in &r.enforcing {
            let ours = self.ours(e.epoch);
            let t = self.tenant_ids.id(tenant);
            let cap = self.plans.get(&t).map_or((Some(0), 0), |p| p.cap);
            let book = self.books.entry((t, host)).or_default();
            let before = self.clock.counted(Some(book), cap, now_ns);
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
                    sent_ns: self.started_ns,
                });
            }
            let book = &*book;
            let after = self.clock.counted(Some(book), cap, now_ns);
            if smaller(after, before) != before {
                self.pending.released(t);
            }
            if let Some(plan) = self.plans.get_mut(&t) {
                retally(plan, self.clock, host, book, now_ns);
            }
        }
    }

    /// The grant for `host` in `tenant` at `now_ns`, recorded as sent.
    fn answer(&mut self, tenant: u32, host: u32, now_ns: u64) -> Option<HostGrant> {
        let (want, to) = self.totals_for(tenant, host, now_ns)?;
        self.grant(tenant, host, (want, to), now_ns)
    }

    /// What `host` wants of `tenant` (its targets' totals) and what it may have at `now_ns`:
    /// `want` cut to what the others leave (or, in the hold, to what it holds).
    fn totals_for(&mut self, tenant: u32, host: u32, now_ns: u64) -> Option<(Totals, Totals)> {
        let holding = self.holding(now_ns);
        let clock = self.clock;
        let plan = self.plans.get_mut(&tenant)?;
        let targets = plan.targets.get(&host)?;
        let want = totals(targets.values());
        let books = &self.books;
        let to = if holding {
            // The hold: nobody above what they report enforcing.
            let book = books.get(&(tenant, host));
            let own = match book.is_some_and(|es| !es.is_empty()) {
                true => clock.counted(book, plan.cap, now_ns),
                false => (Some(0), 0),
            };
            smaller(want, own)
        } else {
            let (hosts, cap) = (&plan.hosts, plan.cap);
            let tally = plan.tally.get_or_insert_with(|| {
                let mut t = Tally::default();
                for &h in hosts {
                    t.set(h, clock.counted(books.get(&(tenant, h)), cap, now_ns));
                }
                t
            });
            smaller(want, tally.headroom(&plan.limits, host))
        };
        Some((want, to))
    }

    /// The grant of `to` for `host` in `tenant`, its shares fitted from the plan's targets,
    /// recorded as sent at `now_ns`.
    fn send(&mut self, tenant: u32, host: u32, to: Totals, now_ns: u64) -> Option<HostGrant> {
        let clock = self.clock;
        let plan = self.plans.get_mut(&tenant)?;
        let targets = plan.targets.get(&host)?;
        let shares = fit(targets, to);
        let fallback = smaller(to, plan.cap);
        let book = self.books.entry((tenant, host)).or_default();
        let epoch = next_epoch(self.term, book);
        let grant = Grant {
            epoch,
            max_bps: to.0,
            min_bps: to.1,
            fallback_max_bps: fallback.0,
            fallback_min_bps: fallback.1,
            lease_ms: clock.lease_ns / 1_000_000,
            unknown: BTreeMap::new(),
        };
        let entry = Entry {
            epoch,
            totals: to,
            fallback: Some(fallback),
            sent_ns: now_ns,
        };
        record(book, clock, entry, now_ns);
        retally(plan, clock, host, book, now_ns);
        Some(HostGrant { grant, shares })
    }
}

/// `run` (a host's vifs in order, with their targets) as a map, made from `old` when it holds
/// the same vifs (only the targets written), else anew. Empties `run`.
fn refill(
    old: Option<BTreeMap<String, Share>>,
    run: &mut Vec<(&str, Share)>,
) -> BTreeMap<String, Share> {
    let same = old.as_ref().is_some_and(|o| {
        o.len() == run.len() && o.keys().zip(run.iter()).all(|(k, (p, _))| k == p)
    });
    let map = match old {
        Some(mut o) if same => {
            for (v, (_, s)) in o.values_mut().zip(run.iter()) {
                *v = *s;
            }
            o
        }
        _ => run.iter().map(|&(p, s)| (p.to_string(), s)).collect(),
    };
    run.clear();
    map
}

/// Whether `epoch` is one of term `term`'s grants.
fn ours(term: u32, epoch: u64) -> bool {
    epoch >> 32 == u64::from(term) && epoch & 0xffff_ffff != 0
}

/// The next epoch of term `term` for a host whose book is `book`: one above the last it was
/// sent (epochs are compared only within one book; 2^32 − 1 grants a term, 68 years at two a
/// second, then the last epoch repeats, which only delays acknowledgements).
fn next_epoch(term: u32, book: &[Entry]) -> u64 {
    let last = book
        .iter()
        .filter(|e| ours(term, e.epoch))
        .map(|e| e.epoch & 0xffff_ffff)
        .max()
        .unwrap_or(0);
    (u64::from(term) << 32) | (last + 1).min(0xffff_ffff)
}

/// Refreshes `host`'s part of `plan`'s tally from its `book`, if the tenant has a tally.
fn retally(plan: &mut TenantPlan, clock: Clock, host: u32, book: &Vec<Entry>, now_ns: u64) {
    let cap = plan.cap;
    // The tally has a part for each declared host, and only for them.
    if let Some(t) = plan.tally.as_mut().filter(|t| t.parts.contains_key(&host)) {
        t.set(host, clock.counted(Some(book), cap, now_ns));
    }
}

/// Adds `entry` to a host's `book`, folding the expired grants into the one with the largest
/// fallback (they count only their fallbacks), so a host that never acknowledges keeps a book
/// of at most a lease's worth of grants.
fn record(book: &mut Vec<Entry>, clock: Clock, entry: Entry, now_ns: u64) {
    let expired = |e: &Entry| clock.expired(e.sent_ns, now_ns);
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

#[path = "aggregator_push.rs"]
mod push;

#[cfg(test)]
#[path = "aggregator_tests.rs"]
mod tests;
