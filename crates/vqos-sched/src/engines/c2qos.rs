//! `c2qos`: C2QoS — CPU-cycle token buckets (C2TB) with hierarchical batch scheduling (HBS).
//!
//! In a software switch the scarce resource is the forwarding core, not the wire: a 64-byte
//! frame costs about ten times more cycles per bit than a 1518-byte one, so a tenant that stays
//! inside its purchased *bit* rate can still take most of the core. C2QoS apportions the core
//! itself: every vif owns a bucket of cycles, refilled at the share of the core it bought.
//!
//! ## Behavior
//! - **C2TB.** A vif's tokens are cost units ([`Usage::cost`] under the policy's cost model:
//!   cycles with [`CostModel::Cycles`], the normal mode of this engine; bytes with
//!   [`CostModel::Bytes`]). They are refilled at `policies.cost_per_sec(max_bps)`: the vif's
//!   purchased rate (its `max_bps`) priced in cycles by the set's [`crate::cost::Pricing`] —
//!   with a frame cost model `cycles(frame) = a + b·bytes` (configured or calibrated), the
//!   frames per second the purchase is at the reference frame size times what one costs
//!   (C2QoS §III); without one, the purchase's fraction of the capacity as the same fraction
//!   of the core. `max_bps = None` means unlimited: the vif is never throttled.
//! - **Admission.** [`Engine::configure`] refuses a set whose token rates (a vif without a
//!   max: its min) add up to more than the core may sell ([`PolicySet::check_sold`]): C2TB
//!   guarantees each vif its cycles, and a core sold twice guarantees nobody anything. A batch is granted only while the vif's tokens are
//!   `> 0`; the batch's measured cost is subtracted afterwards in [`Engine::charge`], so tokens
//!   may go negative (the engine cannot know in advance what a batch will cost).
//! - **Bucket depth** = one manager period of the vif's allotment plus the largest batch the vif
//!   has been charged so far. One period covers the wait until the next refill; one batch lets a
//!   vif that was passed over while other vifs ran their batches still spend what it was given.
//!   Anything beyond is lost, so an idle vif cannot save up a burst.
//! - **HBS.** Eight FIFO ready queues, one per priority (0 = most urgent), hold the vifs with
//!   tokens `> 0` (and every unlimited vif); a waiting queue holds the vifs with tokens `≤ 0`.
//!   [`Engine::select`] serves the first backlogged vif of the highest-priority non-empty ready
//!   queue and moves it to the tail of its queue (FIFO rotation inside a level). A charge that
//!   leaves tokens `≤ 0` moves the vif to the waiting queue.
//! - **Manager.** [`Engine::tick`], due every manager period (50 µs by default, as the paper's
//!   manager thread), refills every bucket for the exact time elapsed (fractions of a token are
//!   carried over, not dropped) and moves waiting vifs whose tokens are back above 0 to the tail
//!   of their ready queue, in the order they started waiting.
//! - **Live changes.** [`Engine::configure`] re-prices every vif: tokens are kept (clamped to the
//!   new depth), priorities and rates take effect at once.
//!
//! ## Limitations
//! - A policy's `burst_bytes` is ignored: C2QoS's buckets hold one period's worth by design
//!   (an idle vif cannot save up, see above), so a stated burst has no bucket to deepen.
//! - Not work-conserving, by design (as the paper): a vif is held to its purchased share of the
//!   core even when the core is otherwise idle.
//! - The admission check prices purchases at the reference frame size: it cannot know what
//!   frames tenants will send. A vif sending smaller frames runs out of its own cycles first.
//! - A vif stays in its ready queue while it has tokens, whether or not frames are waiting (the
//!   paper's PMD polls it); `select` skips idle vifs in place, so its cost is O(levels) plus one
//!   bit test per idle vif ahead of the first backlogged one in the queues it scans.
//! - The manager's tick is O(vifs). With thousands of vifs, a longer manager period keeps its cost
//!   down at the price of coarser refills.
//! - Live changes rebuild the queues in vif-id order (the FIFO order of the moment is lost).

use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, VifEngineState, MAX_BURST};
use crate::engines::by_name;
use crate::policy::{CostModel, PolicyError, PolicySet, VifId, PRIORITY_LEVELS};
use crate::units::NS_PER_SEC;

/// Default manager period: the paper's manager thread wakes every 50 µs.
pub const DEFAULT_MANAGER_PERIOD_NS: u64 = 50_000;

/// End-of-list marker in the intrusive queues.
const NIL: usize = usize::MAX;

/// Index of the waiting queue in [`C2qos::queues`]; the ready queues are `0..PRIORITY_LEVELS`.
const WAITING: usize = PRIORITY_LEVELS;

/// One FIFO queue of vifs, linked through [`VifSlot::next`] / [`VifSlot::prev`].
#[derive(Debug, Clone, Copy)]
struct Queue {
    /// First vif (served or refilled first), or [`NIL`].
    head: usize,
    /// Last vif, or [`NIL`].
    tail: usize,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            head: NIL,
            tail: NIL,
        }
    }
}

/// Per-vif state.
#[derive(Debug, Clone)]
struct VifSlot {
    /// The vif's name: its tokens follow the name across live changes, not the index.
    name: String,
    /// Tokens in cost units; may be negative after a batch that cost more than was left.
    tokens: i64,
    /// Refill rate in cost units per second; `None` = unlimited (never throttled).
    rate_cost_per_sec: Option<u64>,
    /// Refill carried over between ticks: cost-unit·ns not yet worth a whole token (< 1 s·unit).
    refill_rem: u128,
    /// Largest cost of one batch charged so far (the "one batch" of the bucket depth).
    max_batch_cost: u64,
    /// Bucket depth in cost units: one manager period of allotment plus `max_batch_cost`.
    depth: i64,
    /// Latency priority, 0 (most urgent) ..= 7.
    priority: usize,
    /// The queue the vif is in: a priority level, or [`WAITING`].
    queue: usize,
    /// Next vif in the same queue, or [`NIL`].
    next: usize,
    /// Previous vif in the same queue, or [`NIL`].
    prev: usize,
}

impl VifSlot {
    fn new() -> Self {
        VifSlot {
            name: String::new(),
            tokens: 0,
            rate_cost_per_sec: None,
            refill_rem: 0,
            max_batch_cost: 0,
            depth: 0,
            priority: PRIORITY_LEVELS - 1,
            queue: WAITING,
            next: NIL,
            prev: NIL,
        }
    }

    /// Tokens are what gates a batch: true when the vif may run a batch now.
    fn runnable(&self) -> bool {
        self.rate_cost_per_sec.is_none() || self.tokens > 0
    }
}

/// The C2QoS engine. See the module docs.
#[derive(Debug)]
pub struct C2qos {
    /// Per-vif buckets and queue links, indexed by [`VifId`].
    vifs: Vec<VifSlot>,
    /// Ready queues by priority (`0..PRIORITY_LEVELS`), then the waiting queue.
    queues: [Queue; PRIORITY_LEVELS + 1],
    /// Cost model of the installed policy set (what `charge` subtracts).
    cost: CostModel,
    /// How often the manager refills buckets, ns.
    manager_period_ns: u64,
    /// When the manager must run next (absolute ns).
    next_tick_ns: u64,
    /// Up to when buckets have been refilled (absolute ns).
    refilled_ns: u64,
    /// False until the first `configure` (which sets the time origin).
    configured: bool,
}

impl Default for C2qos {
    fn default() -> Self {
        Self::new()
    }
}

impl C2qos {
    /// An engine with no vifs and the paper's 50 µs manager period.
    pub fn new() -> Self {
        Self::with_manager_period(DEFAULT_MANAGER_PERIOD_NS)
    }

    /// An engine whose manager refills buckets every `manager_period_ns` (at least 1 ns).
    pub fn with_manager_period(manager_period_ns: u64) -> Self {
        C2qos {
            vifs: Vec::new(),
            queues: [Queue::default(); PRIORITY_LEVELS + 1],
            cost: CostModel::Cycles,
            manager_period_ns: manager_period_ns.max(1),
            next_tick_ns: u64::MAX,
            refilled_ns: 0,
            configured: false,
        }
    }

    /// The manager period in ns.
    pub fn manager_period_ns(&self) -> u64 {
        self.manager_period_ns
    }

    /// Vifs of ready queue `level` (0..=7) in FIFO order (for stats and tests).
    pub fn ready_queue(&self, level: usize) -> Vec<VifId> {
        self.queue_members(level)
    }

    /// Vifs of the waiting queue (tokens ≤ 0) in the order they started waiting.
    pub fn waiting_queue(&self) -> Vec<VifId> {
        self.queue_members(WAITING)
    }

    fn queue_members(&self, q: usize) -> Vec<VifId> {
        let mut out = Vec::new();
        let mut v = self.queues[q].head;
        while v != NIL {
            out.push(v);
            v = self.vifs[v].next;
        }
        out
    }

    /// Appends `vif` (not linked anywhere) to the tail of queue `q`.
    fn push_back(&mut self, q: usize, vif: usize) {
        let tail = self.queues[q].tail;
        {
            let s = &mut self.vifs[vif];
            s.queue = q;
            s.prev = tail;
            s.next = NIL;
        }
        if tail == NIL {
            self.queues[q].head = vif;
        } else {
            self.vifs[tail].next = vif;
        }
        self.queues[q].tail = vif;
    }

    /// Removes `vif` from the queue it is in.
    fn unlink(&mut self, vif: usize) {
        let VifSlot {
            queue, prev, next, ..
        } = self.vifs[vif];
        if prev == NIL {
            self.queues[queue].head = next;
        } else {
            self.vifs[prev].next = next;
        }
        if next == NIL {
            self.queues[queue].tail = prev;
        } else {
            self.vifs[next].prev = prev;
        }
        let s = &mut self.vifs[vif];
        s.prev = NIL;
        s.next = NIL;
    }

    /// Moves `vif` to the tail of queue `q` (possibly its own queue: FIFO rotation).
    fn move_to_tail(&mut self, q: usize, vif: usize) {
        if self.vifs[vif].queue == q && self.queues[q].tail == vif {
            return;
        }
        self.unlink(vif);
        self.push_back(q, vif);
    }

    /// One manager period of allotment plus the largest batch seen.
    fn depth_of(&self, rate_cost_per_sec: u64, max_batch_cost: u64) -> i64 {
        // rate < 2^64 and period < 2^64: the product fits in u128.
        let period_cost = u128::from(rate_cost_per_sec) * u128::from(self.manager_period_ns)
            / u128::from(NS_PER_SEC);
        let depth = period_cost + u128::from(max_batch_cost);
        i64::try_from(depth).unwrap_or(i64::MAX)
    }

    /// Adds the allotment for `elapsed_ns` to every limited bucket, carrying fractions.
    fn refill(&mut self, elapsed_ns: u64) {
        if elapsed_ns == 0 {
            return;
        }
        for s in &mut self.vifs {
            let Some(rate) = s.rate_cost_per_sec else {
                continue;
            };
            // rate·elapsed < 2^128; the carried remainder is < 10^9, so the sum cannot overflow.
            let num = u128::from(rate) * u128::from(elapsed_ns) + s.refill_rem;
            let whole = num / u128::from(NS_PER_SEC);
            s.refill_rem = num % u128::from(NS_PER_SEC);
            let add = i64::try_from(whole).unwrap_or(i64::MAX);
            s.tokens = s.tokens.saturating_add(add).min(s.depth);
            if s.tokens == s.depth {
                // A full bucket forgets fractions too: nothing is owed beyond the depth.
                s.refill_rem = 0;
            }
        }
    }

    /// Puts every vif in the queue its tokens and priority call for, in vif-id order.
    fn rebuild_queues(&mut self) {
        self.queues = [Queue::default(); PRIORITY_LEVELS + 1];
        for v in 0..self.vifs.len() {
            let s = &mut self.vifs[v];
            s.next = NIL;
            s.prev = NIL;
            let q = if s.runnable() { s.priority } else { WAITING };
            self.push_back(q, v);
        }
    }
}

impl Engine for C2qos {
    fn kind(&self) -> EngineKind {
        EngineKind::C2qos
    }

    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        policies.validate()?;
        policies.check_sold(EngineKind::C2qos)?;
        if !self.configured {
            self.configured = true;
            self.refilled_ns = now_ns;
            self.next_tick_ns = now_ns.saturating_add(self.manager_period_ns);
        } else if now_ns > self.refilled_ns {
            // Settle the old rates up to now before the new ones apply.
            self.refill(now_ns - self.refilled_ns);
            self.refilled_ns = now_ns;
        }
        self.cost = policies.cost;
        let mut old = by_name(std::mem::take(&mut self.vifs), |v| &v.name);
        let mut is_new = Vec::with_capacity(policies.len());
        for spec in &policies.vifs {
            let prev = old.remove(&spec.name).map(|(_, s)| s);
            is_new.push(prev.is_none());
            self.vifs.push(prev.unwrap_or_else(|| VifSlot {
                name: spec.name.clone(),
                ..VifSlot::new()
            }));
        }
        for (v, spec) in policies.vifs.iter().enumerate() {
            let rate = spec.policy.max_bps.map(|bps| policies.cost_per_sec(bps));
            let depth = rate.map_or(0, |r| self.depth_of(r, self.vifs[v].max_batch_cost));
            let s = &mut self.vifs[v];
            s.rate_cost_per_sec = rate;
            s.priority = usize::from(spec.policy.priority).min(PRIORITY_LEVELS - 1);
            s.depth = depth;
            if rate.is_none() {
                s.tokens = 0;
                s.refill_rem = 0;
            } else if is_new[v] {
                // A new vif starts with a full bucket.
                s.tokens = depth;
            } else {
                s.tokens = s.tokens.min(depth);
            }
        }
        self.rebuild_queues();
        Ok(())
    }

    fn select(&mut self, ready: &ReadySet, _now_ns: u64) -> Option<Grant> {
        for level in 0..PRIORITY_LEVELS {
            let mut v = self.queues[level].head;
            while v != NIL {
                if ready.contains(v) {
                    // FIFO rotation: the vif served goes to the back of its level.
                    self.move_to_tail(level, v);
                    return Some(Grant {
                        vif: v,
                        max_packets: MAX_BURST,
                    });
                }
                v = self.vifs[v].next;
            }
        }
        None
    }

    fn charge(&mut self, vif: VifId, usage: Usage, _now_ns: u64) {
        let Some(s) = self.vifs.get_mut(vif) else {
            return;
        };
        let Some(rate) = s.rate_cost_per_sec else {
            return;
        };
        let cost = usage.cost(self.cost);
        if cost > s.max_batch_cost {
            s.max_batch_cost = cost;
            let depth = self.depth_of(rate, cost);
            self.vifs[vif].depth = depth;
        }
        let s = &mut self.vifs[vif];
        s.tokens = s
            .tokens
            .saturating_sub(i64::try_from(cost).unwrap_or(i64::MAX));
        if s.tokens <= 0 && s.queue != WAITING {
            self.move_to_tail(WAITING, vif);
        }
    }

    fn next_tick(&self) -> u64 {
        self.next_tick_ns
    }

    fn tick(&mut self, _ready: &ReadySet, now_ns: u64) {
        if !self.configured || now_ns < self.next_tick_ns {
            return;
        }
        self.refill(now_ns.saturating_sub(self.refilled_ns));
        self.refilled_ns = now_ns;
        // Back to the ready queues, in the order they started waiting.
        let mut v = self.queues[WAITING].head;
        while v != NIL {
            let next = self.vifs[v].next;
            if self.vifs[v].runnable() {
                let level = self.vifs[v].priority;
                self.move_to_tail(level, v);
            }
            v = next;
        }
        // Keep the phase of the period; if the loop fell far behind, restart from now.
        let due = self.next_tick_ns.saturating_add(self.manager_period_ns);
        self.next_tick_ns = if due > now_ns {
            due
        } else {
            now_ns.saturating_add(self.manager_period_ns)
        };
    }

    fn eligible_at(&self, _now_ns: u64) -> u64 {
        if self.queues[WAITING].head == NIL {
            u64::MAX
        } else {
            self.next_tick_ns
        }
    }

    fn vif_state(&self, vif: VifId) -> VifEngineState {
        let Some(s) = self.vifs.get(vif) else {
            return VifEngineState::default();
        };
        let per_period = s.rate_cost_per_sec.map_or(0, |r| {
            // r < 2^64, period < 2^64: fits in u128.
            let c = u128::from(r) * u128::from(self.manager_period_ns) / u128::from(NS_PER_SEC);
            i64::try_from(c).unwrap_or(i64::MAX)
        });
        VifEngineState {
            credit: s.tokens,
            credit_per_period: per_period,
            throttled: s.queue == WAITING,
        }
    }
}

#[cfg(test)]
mod tests;
