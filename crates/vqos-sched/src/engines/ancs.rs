//! `ancs`: the ANCS credit scheduler (Advanced Network Credit Scheduler, seeds/ancs-2016.txt §3).
//!
//! The vifs are polled round-robin, but a vif is served only while it has credit; an accounting
//! pass recharges the credits every period (30 ms by default). The pass is the paper's Figure 3
//! flow chart, whose variables mirror the accounting of Xen's CPU credit scheduler
//! (`csched_acct`), transposed from CPUs and credits to a link and bytes.
//!
//! ## Behavior
//! **Serving.** `select` scans the ready vifs round-robin from one past the vif served last and
//! grants a batch to the first one whose `remain_credit > 0`: as many frames as its credit
//! covers at the mean frame size of its last batch, at most [`MAX_BURST`] (a full batch while
//! no frame size is known yet). A vif without credit is not polled: its frames wait in its own
//! queue (back-pressure into the guest). A TAP read cannot know the size of the frames before
//! reading them, so the batch is charged after it is served (`charge`): credit may dip below
//! zero, by about one frame (one batch if the frame sizes vary widely), and that debt is repaid
//! from the next period's credit, so long-run rates are exact. A vif whose batch came back
//! shorter than granted but that still has frames at the next `select` is polled once more at
//! once (a probe; see the deviations): if that read empties its queue, it had nothing more to
//! send.
//!
//! **Accounting** (`tick`, every period; the per-period capacity is
//! `capacity_bps / 8 × period` bytes, fractions carried to the next period):
//! 1. *Activity.* A vif is active when it had frames waiting at the tick or consumed credit
//!    during the period; a vif with neither leaves the active weight total (Xen's idle
//!    entities leave the active list), so its share goes to the others.
//! 2. *CreditNext.* A vif that still holds credit but drained its queue (it was not ready at the
//!    tick, or the last batch it was served was shorter than granted *and* during the period it
//!    was found without frames while holding credit: not ready right after a short batch, or
//!    passed over by the round-robin for lack of frames) did not use that credit because it had
//!    nothing to send: the credit is taken back and summed into `credit_next`,
//!    which this pass redistributes (added to the credit total and to every `credit_peak`). A
//!    vif that was backlogged keeps an unused positive balance (the link did not reach it
//!    before the tick: arrears), bounded as in step 4. `credit_next` is bounded by 64 periods'
//!    capacity (see the deviations).
//!    *Arrears the link cannot carry.* If the active vifs' balances sum above zero (arrears
//!    exceed the debts still to be repaid), the link was busy all period and the excess is
//!    credit it cannot carry while each pass hands out a full period: it is cut from the
//!    positive balances in proportion (see the deviations).
//! 3. *Shares,* in list order over the active vifs, with `credit_total` = capacity per period +
//!    `credit_next`: `credit_fair = credit_total × weight / weight_total`;
//!    `credit_peak = capacity per period + credit_next`, lowered to `maximum_credit` (the cap);
//!    if `credit_fair > credit_peak` the vif is clamped to its peak and the surplus is handed to
//!    the vifs not yet visited in proportion to their weights; if `credit_fair <
//!    minimum_credit` it is raised to its floor and the extra is taken from the vifs not yet
//!    visited, in the same proportion. (csched writes this as `credit_total += surplus ×
//!    weight_total / weight_left`; we keep the equivalent `credit_total − granted` over
//!    `weight_left`, which hands out every byte, rounding included.)
//! 4. *RemainCredit.* `remain_credit = min(remain_credit, credit_peak) + credit_fair`: a
//!    backlogged vif keeps its arrears up to one period's peak and gets its new grant on top;
//!    arrears above the peak are dropped. The cap is enforced by `credit_fair ≤
//!    maximum_credit`: a capped vif is granted at most its cap per period, whatever it carries.
//!    (The paper's CreditLeft rule is not applied as written; see the deviations.)
//! 5. *Order.* Clamped vifs move to the head of the list (csched's lazy move), so next period
//!    their surplus (or deficit) is spread over every other vif, and the redistribution settles
//!    over a few periods. Where the paper is vague we chose: a vif whose clamp is confirmed by
//!    the level the unclamped vifs finally got stays at the head; an unclamped vif that this
//!    level would clamp goes right after them; a vif clamped at an intermediate level that the
//!    final level contradicts (a cap visited before floors lowered the level, a floor visited
//!    before caps raised it) goes to the tail, where it sees the settled level. If every vif
//!    was clamped, a surplus left after the pass means the level is above every clamp (floors
//!    are contradicted, caps confirmed) and a deficit that it is below (the reverse). With this
//!    order the pass reaches the reference allocator's weighted max-min split for greedy vifs
//!    (ANCS Fig. 5 in two periods); the unit tests check random configurations.
//!
//! **Live changes.** `configure` installs a new policy snapshot; vifs that persist (same name)
//! keep their credits and their place in the list; new vifs start with no credit at the tail;
//! the new weights, floors and caps apply from the next accounting.
//!
//! **Demand-limited vifs.** A vif that sends less than its share drains its queue, so its
//! unused credit becomes `credit_next` and is redistributed by weight the next period: at the
//! fixed point the greedy vifs share the capacity the others leave, i.e. the reference
//! allocation with demands. A vif that stops sending altogether leaves the active total at the
//! next tick and is back in it at the tick after it has frames again.
//!
//! ## Deviations from the paper
//! Each closes a gap between the paper's per-request, per-packet setting and batches charged
//! after the fact; without them the property tests (`tests/properties.rs`) fail by up to −40 %
//! for floored or capped vifs among many vifs.
//! - *Grant size.* The paper serves a request only while the credit covers it; we grant the
//!   frames the credit covers at the last mean frame size (the last frame may overdraw). With
//!   whole batches regardless of credit, every vif ends a period up to a batch (48 KB at
//!   1500 B) in debt; the link, handed exactly its capacity each pass, is then behind by the
//!   sum of those debts (up to ~n batches, most of a period for 64 vifs) and the tick finds the
//!   vifs with the most credit still holding it. Among vifs that hold credit the link is shared
//!   round-robin, i.e. equally, not by weight; these arrears drift for seconds.
//! - *CreditLeft not applied as written* (`remain > peak ⇒ credit_left = remain − fair` to the
//!   others, `remain = fair`). The paper meant it for a vif that idled (§3.4); here an idle or
//!   drained vif already gives all its credit back as CreditNext, so the rule only ever fired
//!   for backlogged vifs in arrears, with two effects: a capped vif (`credit_fair =
//!   credit_peak`, e.g. min = max) lost its arrears every period (−3 % for min = max =
//!   155 Mbit/s among 28 vifs), and the arrears handed to the others were credit the busy link
//!   could not carry, which kept the link over-committed (Σ credit_fair up to 1.13 × capacity)
//!   and turned the split into round-robin. We bound the carried arrears at CreditPeak and drop
//!   the rest. [`Variant::Paper`] (`variant = "paper"` in a scenario file or vqosd's config)
//!   applies the rule as written, so its cost can be measured (docs/experiments.md,
//!   "The departures, measured").
//! - *Arrears the link cannot carry are cut* (step 2). The pass hands out exactly a period's
//!   capacity, so credit that the link did not carry (a pass that raised floors visited after
//!   the total was spent, before the list order settled; a tick late by a batch) would stay in
//!   the system for good, and whoever held it would be served round-robin at the end of every
//!   period. The paper has no such term (it serves no request on credit it lacks); cutting the
//!   excess of the balances over zero leaves exactly the arrears that the debtors' repayments
//!   make room for.
//! - *Drained means found empty, not a short batch* (step 2). The paper's CreditNext is credit a
//!   vif did not use because it had nothing to send. A short batch alone does not show that:
//!   the poll loop may read fewer frames than granted (vqosd reads no more than the uplink's
//!   capacity tokens cover, one 64 KB TSO super-frame at a time when the link is full), and a
//!   vif that keeps its queue full then looks drained at every tick. Its leftover credit became
//!   CreditNext, was handed out again on top of the capacity, could not be carried, was left
//!   over again and grew to its bound; with everyone holding credit the round-robin split the
//!   link equally (measured on real traffic, Fig. 5: phase 1 100/187/219/220/213 Mbit/s,
//!   phases 2–3 ≈ 200 each). We take a short batch as a drain only if the vif was also found
//!   without frames while holding credit in the same period: not ready at the `select` or
//!   `tick` right after a short batch (vqosd clears a port's readiness only when a read returns
//!   fewer frames than it asked for), or passed over for lack of frames when its round-robin
//!   turn came. *Probe:* a loop with instant readiness (the simulator, `testing::run_link`)
//!   shows frames that arrived during the batch as ready again, so a demand-limited vif with
//!   fast arrivals would never be found empty; a vif still ready after a short batch is
//!   therefore polled once more at once, which empties such a vif's queue and leaves a
//!   backlogged one ready. The flag is cleared at every tick, so a backlogged TCP sender whose
//!   queue is momentarily empty (TSO, TCP small queues) gives back at most one period's
//!   leftover.
//! - *All vifs clamped* (step 5): the paper does not reorder; we do, or a floor visited before
//!   the caps that leave a surplus stays at its floor for good, with the link idle.
//! - *CreditNext bound.* 64 periods' capacity instead of one. CreditNext is shared by weight
//!   among all active vifs, the demand-limited ones included, which hand their share back
//!   next period: its fixed point is `(f·C − d) / (1 − f)` per period (`f` the weight fraction
//!   of the demand-limited vifs, `d` what they send, `C` the capacity), above `C` as soon as
//!   `f > ½`; a bound of one period cut it and left the greedy vifs short (500 instead of
//!   985 Mbit/s for weights 51 (15 Mbit/s) : 17 (greedy)). 64 covers `f ≤ 64/65`; the bound
//!   still stops a loop that makes backlogged vifs look drained from inflating credit without
//!   limit.
//!
//! ## Limitations
//! - A policy's `burst_bytes` is ignored: ANCS hands out credit per period and takes back what
//!   a vif does not use, so there is no bucket in which an idle vif could save a burst.
//! - What the paper's algorithm cannot do: CreditNext converges geometrically, with ratio `f`
//!   per period (the weight fraction of the demand-limited vifs, who get a share of it by
//!   weight and hand it back unused), so the greedy vifs reach their reference rate only after
//!   about `1/(1 − f)` periods, and every change of demand restarts the climb. With f = 0.95
//!   (weights 95 (100 Mbit/s) : 5 (greedy) on 1 Gbit/s) the greedy vif averages 826 instead of
//!   900 Mbit/s over 0.5–3.5 s and is within 2 % only after that. The property tests check
//!   demand-limited vifs when they hold at most half the weight and document this case
//!   (`ancs_credit_next_converges_slowly_when_satisfied_vifs_hold_most_weight`).
//! - Redistribution also lags one period. In the period a demand-limited vif ramps up, the
//!   credits handed out exceed the link, and for that period the link is shared round-robin
//!   among the vifs with credit, not by weight; a vif waking from idle sends one batch on
//!   credit (see below) and then waits for the next tick (≤ one period) to rejoin the weight
//!   total. A vif that drains its queue gives its credit back, so a bursty vif cannot save up;
//!   a backlogged vif carries at most one period's peak of arrears. A cap or floor that the
//!   final level contradicts is off for a period or two until the list order settles.
//! - Idle detection relies on the poll loop's ready set: a vif must leave it when a read finds
//!   its queue empty (as vqosd and the simulator do). A loop that reported a backlogged vif as
//!   not ready would make it look drained (bounded: `credit_next` never exceeds 64 periods'
//!   capacity, and what the link cannot carry is cut at the next tick). A probe costs one extra
//!   `select` per short batch; with truncated reads every turn is two batches.
//! - Grant sizes follow the last batch's mean frame size: with widely mixed sizes (64 B and
//!   64 KB TSO frames) a vif may overdraw by more than a frame; the debt is repaid, but the
//!   arrears it leaves others are larger.
//! - A vif that was idle (not active) is allowed one batch at zero credit as soon as it has
//!   frames, so a vif that sends rarely (ping, request/response) is not delayed by up to a
//!   period; that batch is charged as debt and the vif rejoins the accounting at the next tick.
//! - Bytes are charged whatever the policy set's cost model (the paper's unit); for cycles use
//!   `vqos` or `c2qos`. A finite capacity is required.
//! - If a `tick` is late by several periods the pass runs once, with one period's capacity: the
//!   link could not have carried the missed periods while the loop was not running.
//! - `select` intersects the ready set with the set of vifs holding credit word by word, but a
//!   pass is `O(vifs)`.

use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, VifEngineState, MAX_BURST};
use crate::engines::{by_name, rate_bytes, CREDIT_LIMIT};
use crate::policy::{PolicyError, PolicySet, VifId};
use crate::variant::Variant;

/// ANCS's accounting period: 30 ms.
pub const DEFAULT_PERIOD_NS: u64 = 30_000_000;

/// CreditNext is bounded by this many periods' capacity (module docs, deviations).
const CREDIT_NEXT_PERIODS: i64 = 64;

/// How the last accounting pass clamped a vif's share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Clamp {
    /// `credit_fair` is the weighted share.
    #[default]
    None,
    /// Lowered to `credit_peak` (the cap, or the whole capacity).
    Peak,
    /// Raised to `minimum_credit`.
    Minimum,
}

/// One vif's credit state; the names are the paper's.
#[derive(Debug, Clone)]
struct VifCredit {
    /// The vif's name, to carry its state across live policy changes.
    name: String,
    /// Proportional share (> 0).
    weight: u32,
    /// Floor in bits/s (0 = none).
    min_bps: u64,
    /// Cap in bits/s (`None` = none).
    max_bps: Option<u64>,
    /// CreditFair: credit granted by the last accounting pass, bytes.
    credit_fair: i64,
    /// CreditPeak: the most the vif could use in the last period, bytes (capacity per period +
    /// CreditNext, lowered to MaximumCredit).
    credit_peak: i64,
    /// RemainCredit: current credit, bytes; below zero by at most one batch (charged after).
    remain_credit: i64,
    /// MinimumCredit: the floor's worth in one period, bytes (0 = none).
    minimum_credit: i64,
    /// MaximumCredit: the cap's worth in one period, bytes (`None` = none).
    maximum_credit: Option<i64>,
    /// Fraction of a byte of MinimumCredit carried to the next period (over `BYTE_NS_DENOM`).
    minimum_frac: u64,
    /// Fraction of a byte of MaximumCredit carried to the next period (over `BYTE_NS_DENOM`).
    maximum_frac: u64,
    /// In the active weight total (had frames or consumed credit in the last period).
    active: bool,
    /// Bytes charged since the last accounting pass.
    used_bytes: u64,
    /// The last batch charged was shorter than granted: the vif may have emptied its queue (or
    /// the loop read fewer frames than granted; see `missed`).
    drained: bool,
    /// Found without frames while it held credit during this period: right after a short
    /// batch (the read emptied its queue), or when its turn in the round-robin came.
    missed: bool,
    /// Frames granted by the last `select` of this vif.
    granted: u16,
    /// Mean size of the frames of the last batch charged, bytes (0 = none seen yet).
    frame_bytes: u64,
    /// How the last pass clamped `credit_fair`.
    clamp: Clamp,
}

impl VifCredit {
    fn new(name: &str) -> Self {
        VifCredit {
            name: name.to_string(),
            weight: 1,
            min_bps: 0,
            max_bps: None,
            credit_fair: 0,
            credit_peak: 0,
            remain_credit: 0,
            minimum_credit: 0,
            maximum_credit: None,
            minimum_frac: 0,
            maximum_frac: 0,
            active: false,
            used_bytes: 0,
            drained: false,
            missed: false,
            granted: MAX_BURST,
            frame_bytes: 0,
            clamp: Clamp::None,
        }
    }

    /// May be polled: holds credit, or was idle and owes nothing (one batch on wake-up).
    #[inline]
    fn eligible(&self) -> bool {
        self.remain_credit > 0 || (!self.active && self.remain_credit == 0)
    }
}

/// The credit variables of one vif, as of the last accounting pass (bytes per period).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AncsCredits {
    /// CreditFair: credit granted by the last pass.
    pub credit_fair: i64,
    /// CreditPeak: the most the vif could use in one period (capped by MaximumCredit).
    pub credit_peak: i64,
    /// RemainCredit: current credit (negative = debt of the last batch).
    pub remain_credit: i64,
    /// MinimumCredit: the floor's worth per period (0 = none).
    pub minimum_credit: i64,
    /// MaximumCredit: the cap's worth per period (`None` = none).
    pub maximum_credit: Option<i64>,
    /// In the active weight total.
    pub active: bool,
}

/// The ANCS engine. See the module docs.
#[derive(Debug)]
pub struct Ancs {
    /// Accounting period, ns.
    period_ns: u64,
    /// Link capacity, bits/s (0 until configured).
    capacity_bps: u64,
    /// Fraction of a byte of per-period capacity carried to the next pass.
    capacity_frac: u64,
    /// Per-vif credit state, indexed by [`VifId`].
    vifs: Vec<VifCredit>,
    /// The accounting list: every vif once, clamped ones at the head.
    order: Vec<VifId>,
    /// Vifs that may be polled (mirror of [`VifCredit::eligible`]).
    eligible: ReadySet,
    /// Vifs holding credit that have not yet been passed over for lack of frames this period
    /// (`remain_credit > 0 && !missed`): the ones `select` watches for a missed turn.
    watch: ReadySet,
    /// CreditNext: credit left unused in the previous period, redistributed by the last pass.
    credit_next: i64,
    /// Round-robin cursor: one past the vif served last.
    cursor: VifId,
    /// The vif whose last batch came back short, until the next `select` or `tick` looks
    /// whether it still has frames.
    short: Option<VifId>,
    /// The last grant was a probe: the vif was polled again at once because its batch came back
    /// short while it still had frames.
    probed: bool,
    /// When the next accounting pass is due (ns); `u64::MAX` before `configure`.
    next_tick_ns: u64,
    /// Scratch space for reordering the list (kept to avoid allocating every pass).
    scratch: Vec<VifId>,
    /// The paper's CreditLeft rule as written ([`Variant::Paper`]) or ours (module docs).
    variant: Variant,
}

impl Default for Ancs {
    fn default() -> Self {
        Self::new()
    }
}

impl Ancs {
    /// An engine with the paper's 30 ms accounting period.
    pub fn new() -> Self {
        Self::with_period_ns(DEFAULT_PERIOD_NS)
    }

    /// An engine with another accounting period (at least 1 µs).
    pub fn with_period_ns(period_ns: u64) -> Self {
        Ancs {
            period_ns: period_ns.max(1_000),
            capacity_bps: 0,
            capacity_frac: 0,
            vifs: Vec::new(),
            order: Vec::new(),
            eligible: ReadySet::new(0),
            watch: ReadySet::new(0),
            credit_next: 0,
            cursor: 0,
            short: None,
            probed: false,
            next_tick_ns: u64::MAX,
            scratch: Vec::new(),
            variant: Variant::Vqos,
        }
    }

    /// The accounting period, ns.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// CreditNext: credit left unused in the previous period, redistributed by the last pass.
    pub fn credit_next(&self) -> i64 {
        self.credit_next
    }

    /// The credit variables of `vif`, or `None` for an unknown vif.
    pub fn credits(&self, vif: VifId) -> Option<AncsCredits> {
        self.vifs.get(vif).map(|v| AncsCredits {
            credit_fair: v.credit_fair,
            credit_peak: v.credit_peak,
            remain_credit: v.remain_credit,
            minimum_credit: v.minimum_credit,
            maximum_credit: v.maximum_credit,
            active: v.active,
        })
    }

    /// The accounting list order (vif ids, head first).
    pub fn accounting_order(&self) -> &[VifId] {
        &self.order
    }

    #[inline]
    fn refresh(&mut self, vif: VifId) {
        let v = &self.vifs[vif];
        let (on, watched) = (v.eligible(), v.remain_credit > 0 && !v.missed);
        self.eligible.set(vif, on);
        self.watch.set(vif, watched);
    }

    /// The vif whose last batch came back short: if it has no frames now, the read emptied its
    /// queue (a loop that read fewer frames than granted leaves it ready).
    /// Returns the vif to probe: short, still ready, eligible, and not probed just now.
    fn check_short(&mut self, ready: &ReadySet) -> Option<VifId> {
        let s = self.short.take().filter(|&s| s < self.vifs.len())?;
        if !ready.contains(s) {
            self.vifs[s].missed = true;
            self.refresh(s);
            return None;
        }
        (!self.probed && self.eligible.contains(s)).then_some(s)
    }

    /// Marks the vifs in `start..end` that hold credit and are not ready as having missed their
    /// turn (the round-robin passed over them for lack of frames). Each vif is visited at most
    /// once per period: once marked it leaves `watch`.
    fn note_missed(&mut self, ready: &ReadySet, start: VifId, end: VifId) {
        let mut i = start;
        while i < end {
            match self.watch.next_from(i) {
                Some(c) if c >= i && c < end => {
                    if !ready.contains(c) {
                        self.vifs[c].missed = true;
                        self.watch.set(c, false);
                    }
                    i = c + 1;
                }
                _ => return,
            }
        }
    }

    /// One accounting pass. `ready` is `None` for the first pass, where every vif counts as
    /// active.
    fn account(&mut self, ready: Option<&ReadySet>) {
        let capacity = rate_bytes(self.capacity_bps, self.period_ns, &mut self.capacity_frac);

        // 1–2. Activity and CreditNext.
        let mut credit_next: i64 = 0;
        let mut weight_total: u64 = 0;
        for (id, v) in self.vifs.iter_mut().enumerate() {
            let is_ready = ready.is_none_or(|r| r.contains(id));
            // Nothing to send: not ready now, or its last batch came back short and its turn
            // found its queue empty this period. A short batch alone is no proof: the loop may
            // read fewer frames than granted (module docs, deviations).
            if v.remain_credit > 0 && (!is_ready || (v.drained && v.missed)) {
                credit_next = credit_next.saturating_add(v.remain_credit);
                v.remain_credit = 0;
            }
            v.active = is_ready || v.used_bytes > 0;
            v.used_bytes = 0;
            v.drained = false;
            v.missed = false;
            v.clamp = Clamp::None;
            if v.active {
                weight_total += u64::from(v.weight);
            }
            v.minimum_credit = rate_bytes(v.min_bps, self.period_ns, &mut v.minimum_frac);
            v.maximum_credit = v
                .max_bps
                .map(|m| rate_bytes(m, self.period_ns, &mut v.maximum_frac));
        }
        // Bounded so that a loop that makes backlogged vifs look drained cannot inflate credit
        // without limit; 64 periods leave room for CreditNext's fixed point (module docs).
        self.credit_next = credit_next.min(capacity.saturating_mul(CREDIT_NEXT_PERIODS));
        // Arrears the link cannot carry: the balances' excess over zero, cut in proportion.
        let (mut pos, mut net): (i128, i128) = (0, 0);
        for v in self.vifs.iter().filter(|v| v.active) {
            pos += i128::from(v.remain_credit.max(0));
            net += i128::from(v.remain_credit);
        }
        if net > 0 {
            // net ≤ pos, so no cut exceeds its balance.
            for v in self
                .vifs
                .iter_mut()
                .filter(|v| v.active && v.remain_credit > 0)
            {
                let cut = i128::from(v.remain_credit) * net / pos;
                v.remain_credit -= cut as i64;
            }
        }
        if weight_total == 0 {
            for id in 0..self.vifs.len() {
                self.refresh(id);
            }
            return;
        }

        // 3–4. Shares, in list order. `credit_total` is what the vifs not yet visited share,
        // `weight_left` their weight: each gets `credit_total × weight / weight_left`, which is
        // csched's `credit_total × weight / weight_total` after its surplus updates.
        let peak_all = capacity.saturating_add(self.credit_next);
        // i128: credits are below 2^61 each and there are fewer than 2^40 vifs.
        let mut credit_total: i128 = i128::from(peak_all);
        let mut weight_left: u64 = weight_total;
        // The level the last unclamped vif got, as (credit_total, weight_left) before its visit.
        let mut level: Option<(i128, u64)> = None;
        for &id in &self.order {
            let v = &mut self.vifs[id];
            if !v.active {
                continue;
            }
            let w = u64::from(v.weight);
            let before = (credit_total, weight_left);
            let share = credit_total.max(0) * i128::from(w) / i128::from(weight_left);
            let mut credit_fair = i64::try_from(share).unwrap_or(CREDIT_LIMIT);
            let credit_peak = v.maximum_credit.map_or(peak_all, |m| m.min(peak_all));
            if credit_fair > credit_peak {
                credit_fair = credit_peak;
                v.clamp = Clamp::Peak;
            } else if credit_fair < v.minimum_credit {
                credit_fair = v.minimum_credit;
                v.clamp = Clamp::Minimum;
            } else {
                level = Some(before);
            }
            credit_total -= i128::from(credit_fair);
            weight_left -= w;
            v.credit_fair = credit_fair;
            v.credit_peak = credit_peak;
            if self.variant.is_paper() {
                // CreditLeft as written (§3.4): a vif whose credit would exceed its peak hands
                // `RemainCredit − CreditFair` to the vifs visited after it and restarts from
                // its fair share.
                let remain = v.remain_credit.saturating_add(credit_fair);
                if remain > credit_peak {
                    credit_total += i128::from(remain - credit_fair);
                    v.remain_credit = credit_fair;
                } else {
                    v.remain_credit = remain;
                }
            } else {
                // Arrears up to one period's peak, then this period's grant (module docs).
                v.remain_credit = v.remain_credit.min(credit_peak).saturating_add(credit_fair);
            }
        }

        // 5. Order for the next pass.
        // Every vif clamped: a surplus left over means the level is above every clamp (floors
        // contradicted), a deficit that it is below every clamp (caps contradicted).
        let (total, left) = match level {
            Some((total, left)) => (total.max(0), i128::from(left)),
            None if credit_total >= 0 => (1, 0),
            None => (0, 1),
        };
        self.reorder(total, left);
        for id in 0..self.vifs.len() {
            self.refresh(id);
        }
    }

    /// Stable partition of the list by how the final level `total / left` judges each vif:
    /// confirmed clamps, then vifs the level would clamp, then the rest, then contradicted
    /// clamps (see the module docs).
    fn reorder(&mut self, total: i128, left: i128) {
        let rank = |v: &VifCredit| -> u8 {
            if !v.active {
                return 2;
            }
            // share at the final level = total × w / left; compare multiplied out.
            let at_level = total * i128::from(v.weight);
            let peak = i128::from(v.credit_peak) * left;
            let floor = i128::from(v.minimum_credit) * left;
            match v.clamp {
                Clamp::Peak if at_level >= peak => 0,
                Clamp::Minimum if at_level <= floor => 0,
                Clamp::Peak | Clamp::Minimum => 3,
                Clamp::None if at_level > peak || at_level < floor => 1,
                Clamp::None => 2,
            }
        };
        self.scratch.clear();
        for r in 0..4u8 {
            for &id in &self.order {
                if rank(&self.vifs[id]) == r {
                    self.scratch.push(id);
                }
            }
        }
        std::mem::swap(&mut self.order, &mut self.scratch);
    }
}

impl Ancs {
    /// A grant of `vif` sized by its credit.
    fn grant(&mut self, vif: VifId) -> Grant {
        let v = &mut self.vifs[vif];
        // As many frames as the credit covers at the last batch's frame size (the paper serves
        // a request only while the credit covers it); the last frame may overdraw it.
        let max_packets = if v.remain_credit > 0 && v.frame_bytes > 0 {
            let frames = (v.remain_credit as u64).div_ceil(v.frame_bytes);
            frames.min(u64::from(MAX_BURST)) as u16
        } else {
            MAX_BURST
        };
        v.granted = max_packets;
        Grant { vif, max_packets }
    }

    fn charge_batch(&mut self, vif: VifId, usage: Usage) {
        let Some(v) = self.vifs.get_mut(vif) else {
            return;
        };
        let bytes = i64::try_from(usage.bytes).unwrap_or(CREDIT_LIMIT);
        v.remain_credit = v.remain_credit.saturating_sub(bytes).max(-CREDIT_LIMIT);
        v.used_bytes = v.used_bytes.saturating_add(usage.bytes);
        v.drained = usage.packets < u32::from(v.granted);
        self.short = v.drained.then_some(vif);
        if usage.packets > 0 {
            v.frame_bytes = (usage.bytes / u64::from(usage.packets)).max(1);
        }
        self.refresh(vif);
    }
}

impl Engine for Ancs {
    fn kind(&self) -> EngineKind {
        EngineKind::Ancs
    }

    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        policies.validate()?;
        let capacity_bps = policies
            .capacity_bps
            .ok_or(PolicyError::NeedsCapacity("ancs"))?;
        let first = self.next_tick_ns == u64::MAX;
        self.variant = policies.variant;

        let mut new_id_of_old: Vec<Option<VifId>> = vec![None; self.vifs.len()];
        let mut old = by_name(std::mem::take(&mut self.vifs), |v| &v.name);
        let mut vifs = Vec::with_capacity(policies.len());
        let mut fresh = Vec::new();
        for (id, spec) in policies.vifs.iter().enumerate() {
            let mut v = match old.remove(&spec.name) {
                Some((i, kept)) => {
                    new_id_of_old[i] = Some(id);
                    kept
                }
                None => {
                    fresh.push(id);
                    VifCredit::new(&spec.name)
                }
            };
            v.weight = spec.policy.weight;
            v.min_bps = spec.policy.min_bps;
            v.max_bps = spec.policy.max_bps;
            vifs.push(v);
        }
        let mut order: Vec<VifId> = self
            .order
            .iter()
            .filter_map(|&o| new_id_of_old.get(o).copied().flatten())
            .collect();
        order.extend(fresh);

        self.vifs = vifs;
        self.order = order;
        self.capacity_bps = capacity_bps;
        self.eligible = ReadySet::new(self.vifs.len());
        self.watch = ReadySet::new(self.vifs.len());
        if self.cursor >= self.vifs.len() {
            self.cursor = 0;
        }
        if first {
            self.next_tick_ns = now_ns.saturating_add(self.period_ns);
            self.account(None);
        } else {
            for id in 0..self.vifs.len() {
                self.refresh(id);
            }
        }
        Ok(())
    }

    fn select(&mut self, ready: &ReadySet, _now_ns: u64) -> Option<Grant> {
        // A short batch from a vif that still has frames: the loop read less than granted, or
        // frames arrived meanwhile. Poll it once more at once; if that read empties it, it had
        // nothing more to send.
        if let Some(vif) = self.check_short(ready) {
            self.probed = true;
            return Some(self.grant(vif));
        }
        self.probed = false;
        let chosen = self.eligible.next_common_from(ready, self.cursor);
        // The vifs with credit between the cursor and the one chosen had their turn and
        // nothing to send (all of them if nobody could be chosen).
        let (from, n) = (self.cursor, self.vifs.len());
        match chosen {
            Some(c) if c >= from => self.note_missed(ready, from, c),
            Some(c) => {
                self.note_missed(ready, from, n);
                self.note_missed(ready, 0, c);
            }
            None => {
                self.note_missed(ready, from, n);
                self.note_missed(ready, 0, from);
            }
        }
        let vif = chosen?;
        self.cursor = (vif + 1) % self.vifs.len().max(1);
        Some(self.grant(vif))
    }

    fn charge(&mut self, vif: VifId, usage: Usage, _now_ns: u64) {
        self.charge_batch(vif, usage);
    }
    fn next_tick(&self) -> u64 {
        self.next_tick_ns
    }

    fn tick(&mut self, ready: &ReadySet, now_ns: u64) {
        if now_ns < self.next_tick_ns {
            return;
        }
        let late = (now_ns - self.next_tick_ns) / self.period_ns;
        self.next_tick_ns = self
            .next_tick_ns
            .saturating_add((late + 1).saturating_mul(self.period_ns));
        self.check_short(ready);
        self.account(Some(ready));
    }

    fn vif_state(&self, vif: VifId) -> VifEngineState {
        self.vifs
            .get(vif)
            .map(|v| VifEngineState {
                credit: v.remain_credit,
                credit_per_period: v.credit_fair,
                throttled: !v.eligible(),
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
