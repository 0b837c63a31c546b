//! `vqos`: our default engine — weighted max-min shares with floors, caps and latency
//! priorities, charged in bytes or in measured cycles.
//!
//! ## Behavior
//! The engine converges to the reference allocator ([`crate::alloc`]): every vif gets
//! `clamp(w·L, min(d, floor), min(d, cap))` of the shared resource (the link's bytes, or the
//! forwarding core's cycles under [`CostModel::Cycles`]).
//!
//! It is start-time fair queuing over vifs, with two buckets per vif:
//! - **Shares.** Each vif carries a virtual tag that grows by `cost / weight` for everything it
//!   is served. Among the ready vifs, the one with the smallest tag is served: backlogged vifs
//!   advance their tags at the same pace, i.e. they get service in proportion to their weights,
//!   and a vif that wants less simply is not ready, so its share goes to the others
//!   (work-conserving). A vif that becomes ready after being idle starts at the system's
//!   virtual time: idleness earns no credit.
//! - **Every frame pays in what it uses up** ([`PolicySet::cpu_fair`], bytes cost model). A
//!   tag advances by the batch's *dominant* resource (Ghodsi et al., "Multi-resource fair
//!   queueing for packet processing", SIGCOMM 2012, DRFQ): its bytes, or the cycles it took
//!   priced in link bytes (`cycles × capacity / cycles_per_sec`: the link time the core's
//!   time is worth), whichever is more. With no finite capacity the core is the only scarce
//!   resource and the cycles alone count. So a tenant flooding 64-byte frames, whose batches
//!   cost the core far more than their bytes, gets a weight's share of the core and not the
//!   core; a TCP tenant's super-frames are charged their bytes as before. One batch's cycles
//!   count at most 1 ms of the core (a batch the kernel preempted is not the tenant's doing).
//!   Caps and floors are sold in bytes and stay so.
//! - **Caps.** A token bucket at the vif's maximum; a vif with no tokens is not eligible (it is
//!   not read, its frames wait in its own queue: back-pressure). The bucket holds the policy's
//!   `burst_bytes` (priced in the cost unit), or by default 5 ms of its rate (at least two
//!   batches): after idling, a vif sends that much above its max, then its max. A cap set or
//!   changed starts with at most that burst in the bucket (a cap of 0 sends nothing).
//! - **Floors.** A token bucket at the vif's minimum; a ready vif with floor tokens is served
//!   first (the one owed the most time first, not by priority: a guarantee must not wait
//!   behind another vif's burst of owed service), and that service advances its tag like any
//!   other. So a floor binds only when the weighted share is below it: the floored vif's tag
//!   runs ahead of the others, the fair tier stops choosing it, and it gets exactly its floor
//!   (ANCS Fig. 5: 200 Mbit/s, not 200 plus a share). The lead a floored vif builds is capped a couple of batches ahead of the system's
//!   virtual time, so the moment its weighted share rises above the floor it is back in the fair
//!   tier. Σ floors ≤ capacity is validated, so floors can always be honoured; under cycles the
//!   floors are priced by the set's [`crate::cost::Pricing`] (a frame cost model at a reference
//!   frame size, or their share of the capacity) and Σ priced floors ≤ the core's sellable
//!   cycles is checked on `configure` ([`PolicySet::check_sold`]).
//! - **Priorities.** Among the vifs whose tag is within a small slack of the smallest (1 ms of
//!   the resource divided by the total weight), the most urgent priority is served first. A
//!   latency-sensitive vif that sends little is always within the slack (its tag restarts at the
//!   system virtual time), so it jumps the queue; a greedy vif cannot turn priority into
//!   bandwidth beyond the slack, because its tag leaves the window after one batch.
//!
//! No periodic accounting: buckets refill lazily from `now`, so `tick` is never needed.
//!
//! ## How `select` finds the winner: `O(log n)`, not a scan
//! The decision is the one a scan of every ready vif would make (the scan is kept as the
//! reference the tests compare against, `vqos/scan.rs`), but `select` touches only
//! what changed since the previous decision (`vqos/index.rs`):
//! - the ready set is compared with the previous one a 64-bit word at a time, so only vifs
//!   that became ready, idle or capped are visited (`O(n/64)` word operations);
//! - the vifs in the fair tier sit in one binary heap per priority (std's `BinaryHeap`), keyed
//!   on (tag, vif id); a decision peeks the eight tops: the first priority whose smallest tag
//!   is within the window wins, and the smallest top overall is the system virtual time. A
//!   served vif's tag changes, so `charge` pushes a new entry and the old one, marked stale by
//!   a stamp, is dropped when it surfaces (a heap more than twice its live size is compacted);
//! - a vif with an empty cap or floor bucket waits in a timer heap keyed on when the bucket
//!   turns positive ([`TokenBucket::positive_at`], exact: the instant a refill would make it
//!   positive), so nothing is refilled just to find it still empty;
//! - the floor tier (vifs whose floor bucket holds tokens: owed guaranteed service) is scanned,
//!   because "most owed" changes with time in steps that no static key orders (a slow floor's
//!   owed time jumps a whole token at a time); it holds only vifs whose floor binds and is
//!   usually empty or one vif.
//!
//! A decision costs `O(n/64 + 8 + f + k·log n)`: `f` vifs in the floor tier, `k` vifs whose
//! state changed (the one served last, those that became ready or idle, timers that fell due).
//!
//! ## Limitations
//! - Charging after the batch means a vif may overdraw a bucket by one batch (32 frames, up to
//!   2 MiB with TSO); the debt is repaid before it is eligible again, so long-run rates hold.
//! - The link itself is not modelled here: the poll loop enforces the capacity.
//! - Many floors binding at once (several vifs owed floor service at the same instant) make
//!   the floor tier, and so the decision, `O(f)` in those vifs, as the scan was.

mod index;
#[cfg(test)]
mod scan;

use crate::bucket::TokenBucket;
use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, VifEngineState, MAX_BURST};
use crate::engines::by_name;
use crate::policy::{CostModel, PolicyError, PolicySet, VifId};
use crate::units::NS_PER_SEC;
use index::Index;

/// Fixed-point scale of virtual tags: tag units are `cost × 2^20 / weight`.
const TAG_SCALE: u128 = 1 << 20;

/// Slack window for priorities and bucket depths: this much time's worth of the resource.
const SLACK_NS: u64 = 1_000_000;

/// Burst allowed by a cap bucket when the policy states none: this much time at the capped rate
/// (plus two batches). A policy's `burst_bytes` replaces it (and the two batches).
const CAP_BURST_NS: u64 = 5_000_000;

/// Burst a floor bucket keeps across an idle period (plus two batches).
const FLOOR_BURST_NS: u64 = 10_000_000;

/// How much floor service a backlogged vif may be owed: while it stays ready its floor bucket
/// banks up to this much, so waiting behind other floored vifs never forfeits its guarantee.
const FLOOR_MEMORY_NS: u64 = 200_000_000;

/// Fallback resource rate when the link is unlimited: 10 Gbit/s in bytes.
const DEFAULT_RESOURCE_PER_SEC: u64 = 1_250_000_000;

/// One vif's scheduling state.
#[derive(Debug, Clone)]
struct VifState {
    /// The vif's name: its state follows the name across live changes, not the index.
    name: String,
    /// Proportional share (> 0).
    weight: u32,
    /// 0 = most urgent .. 7.
    priority: u8,
    /// Virtual start tag, in `cost × TAG_SCALE / weight` units.
    tag: u128,
    /// True when the vif was ready and eligible at the previous `select` (a vif that was not
    /// is idle → busy when next seen: its tag restarts at the system virtual time).
    active: bool,
    /// Cap bucket (at the vif's maximum), `None` = unlimited.
    cap: Option<TokenBucket>,
    /// Floor bucket (at the vif's minimum), `None` = no floor.
    floor: Option<TokenBucket>,
    /// Cost charged to this vif in total (for stats and tests).
    served_cost: u64,
}

impl VifState {
    /// True when the vif is owed floor service (its floor bucket holds tokens): the floor tier.
    fn owed_floor(&self) -> bool {
        self.floor
            .as_ref()
            .is_some_and(|f| f.positive() && f.rate_per_sec() > 0)
    }

    /// Idle → busy: idleness earns no credit, in shares or in floor service. The floor bucket
    /// must have been refilled to now.
    fn wake(&mut self, vtime: u128, max_batch_cost: u64) {
        self.tag = self.tag.max(vtime);
        if let Some(f) = self.floor.as_mut() {
            f.limit(burst(f.rate_per_sec(), FLOOR_BURST_NS) + 2 * max_batch_cost);
        }
    }
}

/// How long a floor bucket's tokens last at its rate, ns (how much floor service is owed), or
/// `None` outside the floor tier (empty bucket, or a floor of rate 0). Refill it first.
fn owed_ns(floor: &TokenBucket) -> Option<u64> {
    (floor.positive() && floor.rate_per_sec() > 0).then(|| {
        let tokens = floor.tokens() as u64;
        // A u64 division where the product fits (any floor bucket of a real link does); u128
        // otherwise.
        match tokens.checked_mul(NS_PER_SEC) {
            Some(x) => x / floor.rate_per_sec(),
            None => {
                (u128::from(tokens) * u128::from(NS_PER_SEC) / u128::from(floor.rate_per_sec()))
                    as u64
            }
        }
    })
}

/// What every way of choosing shares: the vifs' states and the system's, configuration and
/// charging (the index of [`Vqos`] and the reference scan differ only in `select`).
#[derive(Debug)]
struct Core {
    /// Per-vif state, indexed by [`VifId`].
    vifs: Vec<VifState>,
    /// Cost model of the current policy set.
    cost: CostModel,
    /// System virtual time: the smallest tag among eligible ready vifs, never decreasing.
    vtime: u128,
    /// The priority window, in tag units (at weight 1; divided by no weight: it is absolute).
    slack: u128,
    /// Largest single batch cost seen (bounds bucket debt and the floored lead).
    max_batch_cost: u64,
    /// Resource units per second (link bytes/s or core cycles/s).
    resource_per_sec: u64,
    /// Shares charge the dominant resource ([`PolicySet::cpu_fair`]): whether there is a
    /// finite link to weigh the core's time against, and the core's cycles per second.
    core_price: Option<(bool, u64)>,
}

/// The `vqos` engine. See the module docs.
#[derive(Debug)]
pub struct Vqos {
    /// Vif states, configuration and charging.
    core: Core,
    /// The eligible vifs, ordered for `select`.
    index: Index,
}

impl Default for Vqos {
    fn default() -> Self {
        Self::new()
    }
}

impl Vqos {
    /// An engine with no vifs; call [`Engine::configure`].
    pub fn new() -> Self {
        Vqos {
            core: Core::new(),
            index: Index::default(),
        }
    }

    /// Total cost served to `vif` since it was configured.
    pub fn served_cost(&self, vif: VifId) -> u64 {
        self.core.vifs[vif].served_cost
    }
}

/// `rate × ns / 1 s` without overflow.
fn burst(rate_per_sec: u64, ns: u64) -> u64 {
    (u128::from(rate_per_sec) * u128::from(ns) / u128::from(NS_PER_SEC)) as u64
}

impl Core {
    fn new() -> Self {
        Core {
            vifs: Vec::new(),
            cost: CostModel::Bytes,
            vtime: 0,
            slack: 0,
            max_batch_cost: 64 * 1024,
            resource_per_sec: DEFAULT_RESOURCE_PER_SEC,
            core_price: None,
        }
    }

    /// What a batch advances its vif's tag by: its cost, or under [`PolicySet::cpu_fair`] its
    /// dominant resource (see the module doc).
    fn share_cost(&self, usage: &Usage, cost: u64) -> u64 {
        let Some((link, cycles_per_sec)) = self.core_price else {
            return cost;
        };
        // The core's time in link bytes, one batch counting at most 1 ms of it.
        let core = (u128::from(usage.cycles) * u128::from(self.resource_per_sec)
            / u128::from(cycles_per_sec.max(1)))
        .min(u128::from(burst(self.resource_per_sec, SLACK_NS))) as u64;
        match link {
            true => cost.max(core),
            // No link to share: the core alone (a batch that measured no cycles still moves
            // its tag, so no vif is served forever for free).
            false => core.max(1),
        }
    }

    fn cap_depth(&self, rate_per_sec: u64) -> u64 {
        burst(rate_per_sec, CAP_BURST_NS).max(2 * self.max_batch_cost)
    }

    fn floor_depth(&self, rate_per_sec: u64) -> u64 {
        burst(rate_per_sec, FLOOR_MEMORY_NS).max(2 * self.max_batch_cost)
    }

    /// The lead, in tag units, a vif may hold over the system virtual time.
    fn lead_limit(&self, weight: u32) -> u128 {
        self.slack + 2 * u128::from(self.max_batch_cost) * TAG_SCALE / u128::from(weight)
    }

    /// Installs a policy snapshot; the vifs that persist keep their state (by name).
    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        policies.validate()?;
        policies.check_sold(EngineKind::Vqos)?;
        self.cost = policies.cost;
        self.core_price = (policies.cpu_fair && policies.cost == CostModel::Bytes)
            .then_some((policies.capacity_bps.is_some(), policies.cycles_per_sec));
        self.resource_per_sec = policies
            .capacity_cost_per_sec()
            .unwrap_or(DEFAULT_RESOURCE_PER_SEC)
            .max(1);
        let total_weight: u128 = policies
            .vifs
            .iter()
            .map(|v| u128::from(v.policy.weight))
            .sum::<u128>()
            .max(1);
        self.slack = u128::from(burst(self.resource_per_sec, SLACK_NS)) * TAG_SCALE / total_weight;
        let mut old = by_name(std::mem::take(&mut self.vifs), |v| &v.name);
        for spec in &policies.vifs {
            let p = &spec.policy;
            let cap_rate = p.max_bps.map(|m| policies.cost_per_sec(m));
            // The burst a fresh or changed cap starts with: the policy's, else 5 ms at its rate.
            let cap_burst = |r: u64| match p.burst_bytes {
                Some(b) => policies.burst_cost(b).max(1),
                None => burst(r, CAP_BURST_NS),
            };
            let floor_rate = (p.min_bps > 0).then(|| policies.cost_per_sec(p.min_bps));
            let debt = 2 * self.max_batch_cost;
            let mut state = match old.remove(&spec.name) {
                Some((_, prev)) => prev,
                None => VifState {
                    name: spec.name.clone(),
                    weight: p.weight,
                    priority: p.priority,
                    tag: self.vtime,
                    active: false,
                    cap: None,
                    floor: None,
                    served_cost: 0,
                },
            };
            state.weight = p.weight;
            state.priority = p.priority;
            // A new policy must not leave a vif starved by a lead it built under the old one.
            state.tag = state.tag.min(self.vtime + self.lead_limit(p.weight));
            state.cap = cap_rate.map(|r| {
                // A stated burst is the depth itself: after idling the vif sends exactly that
                // above its max (a batch is charged in full, so it may overdraw by one batch,
                // repaid before it is served again).
                let depth = match p.burst_bytes {
                    Some(_) => cap_burst(r),
                    None => self.cap_depth(r),
                };
                let (mut b, changed) = match state.cap.take() {
                    Some(mut b) => {
                        let changed = b.rate_per_sec() != r;
                        b.reconfigure(r, depth, debt, now_ns);
                        (b, changed)
                    }
                    None => (TokenBucket::new(r, depth, debt, now_ns), true),
                };
                // A new or changed cap starts with at most its own burst: the depth's floor of
                // two batches is room to charge big batches, not an allowance (a 0 or 1 Mbit/s
                // cap would otherwise send two 2 MB batches at once; found by fuzzing).
                if changed {
                    b.limit(cap_burst(r));
                }
                b
            });
            state.floor = floor_rate.map(|r| {
                let depth = self.floor_depth(r);
                // Debt of up to two batches: a floor-tier batch is charged in full, so a small
                // floor is not turned into a batch every refill.
                match state.floor.take() {
                    Some(mut b) => {
                        b.reconfigure(r, depth, debt, now_ns);
                        b
                    }
                    None => {
                        // Floor service is owed from now on, not banked in advance: with
                        // floors summing close to the capacity, an initial bank would take
                        // the little unreserved capacity for seconds to drain.
                        let mut b = TokenBucket::new(r, depth, debt, now_ns);
                        b.limit(0);
                        b
                    }
                }
            });
            self.vifs.push(state);
        }
        Ok(())
    }

    /// Charges a served batch: advances the vif's tag, takes from its buckets.
    fn charge(&mut self, vif: VifId, usage: Usage, now_ns: u64) {
        let cost = usage.cost(self.cost);
        let share = self.share_cost(&usage, cost);
        self.max_batch_cost = self.max_batch_cost.max(cost);
        let lead = self.lead_limit(self.vifs.get(vif).map_or(1, |v| v.weight));
        // Buckets configured before the biggest batches were seen (a max from the config file,
        // set before traffic) must still charge those batches in full.
        let debt = 2 * self.max_batch_cost;
        let Some(v) = self.vifs.get_mut(vif) else {
            return;
        };
        v.served_cost = v.served_cost.saturating_add(cost);
        // cost < 2^64, TAG_SCALE = 2^20: the product fits in u128 with room for 2^44 batches.
        v.tag += u128::from(share) * TAG_SCALE / u128::from(v.weight);
        v.tag = v.tag.min(self.vtime + lead);
        if let Some(cap) = v.cap.as_mut() {
            cap.refill(now_ns);
            cap.allow_debt(debt);
            cap.consume(cost);
        }
        if let Some(floor) = v.floor.as_mut() {
            floor.refill(now_ns);
            floor.allow_debt(debt);
            floor.consume(cost);
        }
    }

    /// When the first empty cap turns positive.
    fn eligible_at(&self, now_ns: u64) -> u64 {
        self.vifs
            .iter()
            .filter_map(|v| v.cap.as_ref())
            .filter(|c| !c.positive())
            .map(|c| c.positive_at().max(now_ns))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The stats of `vif` whose cap holds `credit` tokens.
    fn vif_state(&self, vif: VifId, credit: impl FnOnce(&TokenBucket) -> i64) -> VifEngineState {
        let Some(v) = self.vifs.get(vif) else {
            return VifEngineState::default();
        };
        VifEngineState {
            credit: v.cap.as_ref().map_or(i64::MAX, credit),
            credit_per_period: v
                .cap
                .as_ref()
                .map_or(0, |c| i64::try_from(c.rate_per_sec()).unwrap_or(i64::MAX)),
            throttled: v.cap.as_ref().is_some_and(|c| !c.positive()),
        }
    }
}

impl Engine for Vqos {
    fn kind(&self) -> EngineKind {
        EngineKind::Vqos
    }

    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        self.core.configure(policies, now_ns)?;
        self.index.rebuild(&self.core.vifs);
        Ok(())
    }

    fn select(&mut self, ready: &ReadySet, now_ns: u64) -> Option<Grant> {
        // Among the ready vifs with cap tokens, the smallest key wins: the floor tier first,
        // most owed first (earliest deadline: a guarantee must not wait behind another vif's
        // burst of owed service because of a priority); then the fair tier — tags within the
        // slack of the system virtual time — most urgent priority first, then the smallest
        // tag; ties go to the smallest vif id.
        //
        // The window is taken from the virtual time of the previous decision. Tags of vifs that
        // stayed backlogged never fall below it and idle vifs are raised to it, so the smallest
        // tag is at or above it; if every tag has moved past the window, the vif with the
        // smallest tag is served (the fair choice), and the window catches up for the next
        // decision.
        let vif = self.index.select(&mut self.core, ready, now_ns)?;
        Some(Grant {
            vif,
            max_packets: MAX_BURST,
        })
    }

    fn charge(&mut self, vif: VifId, usage: Usage, now_ns: u64) {
        self.core.charge(vif, usage, now_ns);
        self.index.charged(&self.core.vifs, vif);
    }

    fn eligible_at(&self, now_ns: u64) -> u64 {
        self.core.eligible_at(now_ns)
    }

    fn vif_state(&self, vif: VifId) -> VifEngineState {
        self.core
            .vif_state(vif, |cap| self.index.cap_credit(vif, cap))
    }
}

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod tests;
