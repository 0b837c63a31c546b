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
//!   the rest.
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
            // Arrears up to one period's peak, then this period's grant (module docs).
            v.remain_credit = v.remain_credit.min(credit_peak).saturating_add(credit_fair);
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

/// A tiny virtual-time poll loop for the engines' unit tests (shared by the `ancs`, `policer`
/// and `tcm` tests): sources, a link of fixed capacity, batches of [`MAX_BURST`] frames.
#[cfg(test)]
pub(crate) mod testkit {
    use crate::engine::{Engine, ReadySet, Usage, Verdict};
    use crate::units::NS_PER_SEC;

    /// What a vif's guest sends.
    #[derive(Debug, Clone)]
    pub(crate) enum Demand {
        /// Always has frames waiting.
        Greedy,
        /// Frames arrive at a constant rate (bits/s); at most 256 frames queue, the rest are
        /// lost in the guest.
        Rate(u64),
        /// Sends nothing.
        Off,
        /// Always has frames, but at most this many waiting at a time: a backlogged TCP sender
        /// over a TAP with TSO, whose queue refills as fast as it is read but shows only a few
        /// super-frames (or a poll loop that reads fewer frames than granted), so every batch
        /// is shorter than the grant.
        Short(u64),
    }

    /// One vif's source and counters.
    #[derive(Debug, Clone)]
    pub(crate) struct Source {
        /// What it sends.
        pub demand: Demand,
        /// Size of its frames on the wire, bytes.
        pub frame_bytes: u32,
        /// Frames waiting (for `Rate` sources).
        backlog: u64,
        /// Fraction of a frame's bits accrued (numerator over frame bits × 10⁹).
        arrival_frac: u128,
        /// Bytes forwarded so far.
        pub forwarded_bytes: u64,
        /// Frames forwarded so far.
        pub forwarded_frames: u64,
        /// Frames dropped by `admit`.
        pub dropped_frames: u64,
    }

    impl Source {
        pub(crate) fn new(demand: Demand, frame_bytes: u32) -> Self {
            Source {
                demand,
                frame_bytes,
                backlog: 0,
                arrival_frac: 0,
                forwarded_bytes: 0,
                forwarded_frames: 0,
                dropped_frames: 0,
            }
        }

        pub(crate) fn greedy() -> Self {
            Source::new(Demand::Greedy, 1500)
        }

        fn accrue(&mut self, dt_ns: u64) {
            if let Demand::Rate(bps) = self.demand {
                let frame_bits = u128::from(self.frame_bytes) * 8 * u128::from(NS_PER_SEC);
                let acc = self.arrival_frac + u128::from(bps) * u128::from(dt_ns);
                self.backlog = (self.backlog + (acc / frame_bits) as u64).min(256);
                self.arrival_frac = acc % frame_bits;
            }
        }

        fn waiting(&self) -> u64 {
            match self.demand {
                Demand::Greedy => u64::MAX,
                Demand::Short(n) => n,
                Demand::Rate(_) => self.backlog,
                Demand::Off => 0,
            }
        }

        /// When the next frame arrives, given that none is waiting.
        fn next_arrival_ns(&self) -> Option<u64> {
            match self.demand {
                Demand::Rate(bps) if bps > 0 => {
                    let frame_bits = u128::from(self.frame_bytes) * 8 * u128::from(NS_PER_SEC);
                    Some((frame_bits - self.arrival_frac).div_ceil(u128::from(bps)) as u64)
                }
                _ => None,
            }
        }
    }

    /// The poll loop: a link of `capacity_bps`, each frame read costing `read_ns` of loop time
    /// on top of the link time of what is forwarded.
    pub(crate) struct Harness {
        /// Virtual now, ns.
        pub now_ns: u64,
        /// Link capacity, bits/s.
        pub capacity_bps: u64,
        /// Loop time per frame read, ns (so batches that forward nothing still take time).
        pub read_ns: u64,
        /// The vifs' sources, by vif id.
        pub sources: Vec<Source>,
        /// Link time owed, as a fraction of a ns (numerator over capacity_bps).
        link_frac: u128,
    }

    impl Harness {
        pub(crate) fn new(capacity_bps: u64, sources: Vec<Source>) -> Self {
            Harness {
                now_ns: 0,
                capacity_bps,
                read_ns: 0,
                sources,
                link_frac: 0,
            }
        }

        fn advance(&mut self, to_ns: u64) {
            let dt = to_ns.saturating_sub(self.now_ns);
            for s in &mut self.sources {
                s.accrue(dt);
            }
            self.now_ns = self.now_ns.max(to_ns);
        }

        fn ready(&self) -> ReadySet {
            let mut r = ReadySet::new(self.sources.len());
            for (i, s) in self.sources.iter().enumerate() {
                r.set(i, s.waiting() > 0);
            }
            r
        }

        /// Runs the loop until `until_ns`.
        pub(crate) fn run(&mut self, engine: &mut dyn Engine, until_ns: u64) {
            while self.now_ns < until_ns {
                let ready = self.ready();
                if self.now_ns >= engine.next_tick() {
                    engine.tick(&ready, self.now_ns);
                }
                let Some(grant) = engine.select(&ready, self.now_ns) else {
                    let mut wake = engine.next_tick().min(engine.eligible_at(self.now_ns));
                    for s in &self.sources {
                        if s.waiting() == 0 {
                            if let Some(dt) = s.next_arrival_ns() {
                                wake = wake.min(self.now_ns + dt);
                            }
                        }
                    }
                    self.advance(wake.clamp(self.now_ns + 1, until_ns));
                    continue;
                };
                let v = grant.vif;
                assert!(ready.contains(v), "granted a vif with nothing waiting");
                let frames = self.sources[v].waiting().min(u64::from(grant.max_packets));
                let len = self.sources[v].frame_bytes;
                let mut usage = Usage::default();
                for _ in 0..frames {
                    match engine.admit(v, len, self.now_ns) {
                        Verdict::Drop => self.sources[v].dropped_frames += 1,
                        _ => {
                            usage.packets += 1;
                            usage.bytes += u64::from(len);
                        }
                    }
                }
                if let Demand::Rate(_) = self.sources[v].demand {
                    self.sources[v].backlog -= frames;
                }
                self.sources[v].forwarded_bytes += usage.bytes;
                self.sources[v].forwarded_frames += u64::from(usage.packets);
                // Link time of the forwarded bits, fractions of a ns carried.
                let num = u128::from(usage.bytes) * 8 * u128::from(NS_PER_SEC) + self.link_frac;
                let cap = u128::from(self.capacity_bps);
                self.link_frac = num % cap;
                let busy = (num / cap) as u64 + frames * self.read_ns;
                let end = self.now_ns + busy.max(1);
                engine.charge(v, usage, end);
                self.advance(end);
            }
        }

        /// Bytes forwarded per vif so far.
        pub(crate) fn forwarded(&self) -> Vec<u64> {
            self.sources.iter().map(|s| s.forwarded_bytes).collect()
        }
    }

    /// Rate in bits/s of `bytes` over `ns`.
    pub(crate) fn bps(bytes: u64, ns: u64) -> f64 {
        bytes as f64 * 8.0 * 1e9 / ns as f64
    }

    /// Per-vif rates between two snapshots of [`Harness::forwarded`].
    pub(crate) fn rates(before: &[u64], after: &[u64], ns: u64) -> Vec<f64> {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| bps(a - b, ns))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::{rates, Demand, Harness, Source};
    use super::*;
    use crate::alloc::{allocate, Claim};
    use crate::policy::VifPolicy;
    use crate::units::NS_PER_SEC;
    use proptest::prelude::*;

    const SEC: u64 = NS_PER_SEC;
    const MBIT: u64 = 1_000_000;

    fn weighted(cap: u64, weights: &[u32]) -> PolicySet {
        weights
            .iter()
            .enumerate()
            .fold(PolicySet::new(Some(cap)), |s, (i, &w)| {
                s.with_vif(
                    &format!("vm{}", i + 1),
                    VifPolicy {
                        weight: w,
                        ..Default::default()
                    },
                )
            })
    }

    fn targets(set: &PolicySet, demands: &[Option<u64>]) -> Vec<f64> {
        crate::alloc::allocate_set(set, demands)
            .unwrap()
            .into_iter()
            .map(|r| r as f64)
            .collect()
    }

    fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * w,
                "{what}: vif {i} got {:.1} Mbit/s, want {:.1} (±{}%); all: {:?}",
                g / 1e6,
                w / 1e6,
                tol * 100.0,
                got.iter()
                    .map(|r| (r / 1e5).round() / 10.0)
                    .collect::<Vec<_>>()
            );
        }
    }

    /// Runs `[from, to)` and returns the per-vif rates over `[from + settle, to)`.
    fn measure(h: &mut Harness, e: &mut Ancs, to: u64, settle: u64) -> Vec<f64> {
        h.run(e, h.now_ns + settle);
        let before = h.forwarded();
        let start = h.now_ns;
        h.run(e, to);
        rates(&before, &h.forwarded(), h.now_ns - start)
    }

    #[test]
    fn needs_a_capacity_and_keeps_its_state_on_error() {
        let mut e = Ancs::new();
        let set = weighted(940 * MBIT, &[1, 2]);
        e.configure(&set, 0).unwrap();
        let before = e.credits(1).unwrap();
        let mut unlimited = set.clone();
        unlimited.capacity_bps = None;
        assert_eq!(
            e.configure(&unlimited, 5),
            Err(PolicyError::NeedsCapacity("ancs"))
        );
        let mut bad = set.clone();
        bad.vifs[0].policy.weight = 0;
        assert!(matches!(
            e.configure(&bad, 5),
            Err(PolicyError::ZeroWeight(_))
        ));
        assert_eq!(e.credits(1).unwrap(), before);
        assert_eq!(e.next_tick(), DEFAULT_PERIOD_NS);
        // 940 Mbit/s over 30 ms = 3 525 000 bytes, split 1:2.
        assert_eq!(before.credit_fair, 2_350_000);
        assert_eq!(e.credits(0).unwrap().credit_fair, 1_175_000);
        assert_eq!(before.credit_peak, 3_525_000);
    }

    #[test]
    fn a_vif_without_credit_is_not_polled() {
        let mut e = Ancs::new();
        e.configure(&weighted(940 * MBIT, &[1, 1]), 0).unwrap();
        let mut ready = ReadySet::new(2);
        ready.set(0, true);
        ready.set(1, true);
        assert_eq!(e.select(&ready, 0).unwrap().vif, 0);
        assert_eq!(e.select(&ready, 0).unwrap().vif, 1);
        // vif 0 spends its 1 762 500 bytes and a bit more: it goes into debt and is skipped.
        let batch = Usage {
            packets: 32,
            bytes: 1_800_000,
            cycles: 0,
        };
        e.charge(0, batch, 1);
        let s = e.vif_state(0);
        assert_eq!(s.credit, 1_762_500 - 1_800_000);
        assert!(s.throttled);
        for _ in 0..3 {
            assert_eq!(e.select(&ready, 2).unwrap().vif, 1);
        }
        // The next accounting repays the debt from the new credit.
        e.tick(&ready, DEFAULT_PERIOD_NS);
        assert_eq!(e.vif_state(0).credit, 1_762_500 * 2 - 1_800_000);
        assert!(!e.vif_state(0).throttled);
        assert_eq!(e.next_tick(), 2 * DEFAULT_PERIOD_NS);
    }

    /// ANCS Fig. 5: weights 1:2:3:4:5 on 940 Mbit/s, then VM5 max 150 Mbit/s, then VM1 min
    /// 200 Mbit/s, changed live; every VM within 3 % of the reference allocator and the link
    /// ≥ 99 % busy in every phase.
    #[test]
    fn fig5_three_phases_converge_to_the_reference_allocator() {
        let cap = 940 * MBIT;
        let mut set = weighted(cap, &[1, 2, 3, 4, 5]);
        let mut e = Ancs::new();
        e.configure(&set, 0).unwrap();
        let mut h = Harness::new(cap, (0..5).map(|_| Source::greedy()).collect());
        let greedy = vec![None; 5];
        let expected = [
            [62.7, 125.3, 188.0, 250.7, 313.3],
            [79.0, 158.0, 237.0, 316.0, 150.0],
            [200.0, 131.1, 196.7, 262.2, 150.0],
        ];
        for (phase, paper) in expected.iter().enumerate() {
            match phase {
                1 => set.vifs[4].policy.max_bps = Some(150 * MBIT),
                2 => set.vifs[0].policy.min_bps = 200 * MBIT,
                _ => {}
            }
            e.configure(&set, h.now_ns).unwrap();
            let want = targets(&set, &greedy);
            for (w, p) in want.iter().zip(paper) {
                assert!((w / 1e6 - p).abs() < 0.1);
            }
            let until = h.now_ns + 6 * SEC;
            let got = measure(&mut h, &mut e, until, SEC);
            assert_close(&got, &want, 0.03, &format!("phase {}", phase + 1));
            let sum: f64 = got.iter().sum();
            assert!(sum >= 0.99 * cap as f64, "phase {}: {sum}", phase + 1);
        }
        // The credits behind it, per period of 30 ms (940 Mbit/s = 3 525 000 bytes).
        let vm1 = e.credits(0).unwrap();
        let vm5 = e.credits(4).unwrap();
        assert_eq!(vm1.minimum_credit, 750_000);
        assert_eq!(vm1.credit_fair, 750_000);
        assert_eq!(vm5.maximum_credit, Some(562_500));
        assert_eq!(vm5.credit_peak, 562_500);
        assert_eq!(vm5.credit_fair, 562_500);
        assert!(vm5.remain_credit <= 562_500);
        // Clamped vifs lead the accounting list.
        assert_eq!(&e.accounting_order()[..2], &[4, 0]);
    }

    /// Fig. 5 as on real TAPs with TSO through vqosd: every VM always has frames, but each
    /// batch holds one 64 KB super-frame (the loop reads no more than the link's tokens cover,
    /// or the sender's queue shows only a few super-frames), and each read costs the loop 2 µs,
    /// so the link carries slightly less than its capacity and the vifs end each period with
    /// some credit. A short batch from a vif that is still ready is not a drained queue: the
    /// shares must be the reference allocation. (Before the fix every vif's leftover credit was
    /// taken as CreditNext, the credit handed out outgrew the link, and the round-robin split
    /// it equally: 89/179/221/224/224, then ≈ 200 each, as measured in the lab.)
    #[test]
    fn fig5_holds_when_backlogged_vifs_deliver_short_batches() {
        let cap = 940 * MBIT;
        let mut set = weighted(cap, &[1, 2, 3, 4, 5]);
        let mut e = Ancs::new();
        e.configure(&set, 0).unwrap();
        let sources = (0..5)
            .map(|_| Source::new(Demand::Short(1), 65_226))
            .collect();
        let mut h = Harness::new(cap, sources);
        h.read_ns = 2_000;
        let greedy = vec![None; 5];
        for phase in 0..3 {
            match phase {
                1 => set.vifs[4].policy.max_bps = Some(150 * MBIT),
                2 => set.vifs[0].policy.min_bps = 200 * MBIT,
                _ => {}
            }
            e.configure(&set, h.now_ns).unwrap();
            let want = targets(&set, &greedy);
            let until = h.now_ns + 6 * SEC;
            let got = measure(&mut h, &mut e, until, SEC);
            assert_close(&got, &want, 0.03, &format!("phase {}", phase + 1));
            let sum: f64 = got.iter().sum();
            assert!(sum >= 0.99 * cap as f64, "phase {}: {sum}", phase + 1);
            assert_eq!(e.credit_next(), 0, "phase {}", phase + 1);
        }
    }

    #[test]
    fn an_idle_vif_gives_its_share_away_and_gets_it_back() {
        let cap = 900 * MBIT;
        let set = weighted(cap, &[1, 1, 2]);
        let mut e = Ancs::new();
        e.configure(&set, 0).unwrap();
        let mut h = Harness::new(cap, (0..3).map(|_| Source::greedy()).collect());
        let all = measure(&mut h, &mut e, 3 * SEC, SEC);
        assert_close(&all, &[225e6, 225e6, 450e6], 0.03, "all busy");

        h.sources[0].demand = Demand::Off;
        let idle = measure(&mut h, &mut e, 6 * SEC, SEC);
        assert_eq!(idle[0], 0.0);
        assert_close(&idle[1..], &[300e6, 600e6], 0.03, "vm1 idle");
        assert!(idle.iter().sum::<f64>() >= 0.99 * cap as f64);
        let s = e.credits(0).unwrap();
        assert!(!s.active);
        assert_eq!(s.remain_credit, 0, "an idle vif keeps no credit");

        h.sources[0].demand = Demand::Greedy;
        let back = measure(&mut h, &mut e, 9 * SEC, SEC);
        assert_close(&back, &[225e6, 225e6, 450e6], 0.03, "vm1 back");
        assert!(e.credits(0).unwrap().active);
    }

    /// A vif that wants less than its share: its unused credit comes back as CreditNext and
    /// the greedy vifs share the rest by weight (the reference allocation with demands).
    #[test]
    fn demand_limited_vif_leaves_its_unused_credit_to_the_others() {
        let cap = 940 * MBIT;
        let set = weighted(cap, &[2, 1, 1]);
        let mut e = Ancs::new();
        e.configure(&set, 0).unwrap();
        let mut h = Harness::new(
            cap,
            vec![
                Source::new(Demand::Rate(100 * MBIT), 1500),
                Source::greedy(),
                Source::greedy(),
            ],
        );
        let got = measure(&mut h, &mut e, 6 * SEC, SEC);
        let want = targets(&set, &[Some(100 * MBIT), None, None]);
        assert_close(&got, &want, 0.03, "demand-limited");
        assert!(got.iter().sum::<f64>() >= 0.99 * cap as f64);
        assert!(e.credit_next() > 0);
    }

    #[test]
    fn live_change_keeps_the_credits_of_vifs_that_persist() {
        let cap = 940 * MBIT;
        let mut e = Ancs::new();
        e.configure(&weighted(cap, &[1, 1, 1]), 0).unwrap();
        let mut h = Harness::new(cap, (0..3).map(|_| Source::greedy()).collect());
        h.run(&mut e, SEC + 12_345);
        let vm3 = e.credits(2).unwrap();
        // vm2 leaves, vm4 joins; vm3 becomes vif 1.
        let next = PolicySet::new(Some(cap))
            .with_vif("vm1", VifPolicy::default())
            .with_vif(
                "vm3",
                VifPolicy {
                    weight: 3,
                    ..Default::default()
                },
            )
            .with_vif("vm4", VifPolicy::default());
        e.configure(&next, h.now_ns).unwrap();
        assert_eq!(e.credits(1).unwrap(), vm3);
        assert_eq!(e.credits(2).unwrap().remain_credit, 0);
        assert_eq!(
            *e.accounting_order().last().unwrap(),
            2,
            "new vifs at the tail"
        );
        let got = measure(&mut h, &mut e, 4 * SEC, SEC);
        assert_close(&got, &[188e6, 564e6, 188e6], 0.03, "after the change");
    }

    #[test]
    fn a_vif_waking_from_idle_is_served_at_once() {
        let cap = 940 * MBIT;
        let mut e = Ancs::new();
        e.configure(&weighted(cap, &[1, 1]), 0).unwrap();
        let mut ready = ReadySet::new(2);
        ready.set(1, true);
        // vif 0 sends nothing for two periods: it leaves the active total.
        e.tick(&ready, DEFAULT_PERIOD_NS);
        assert!(!e.credits(0).unwrap().active);
        // Its unused credit came back as CreditNext, and vif 1 alone shares it this pass.
        assert_eq!(e.credit_next(), 1_762_500);
        assert_eq!(e.credits(1).unwrap().credit_fair, 3_525_000 + 1_762_500);
        assert_eq!(e.credits(0).unwrap().remain_credit, 0);
        // It wakes up between ticks: one batch, then it waits for the accounting.
        ready.set(0, true);
        let g = e.select(&ready, DEFAULT_PERIOD_NS + 1).unwrap();
        assert_eq!(g.vif, 0);
        e.charge(
            0,
            Usage {
                packets: 1,
                bytes: 98,
                cycles: 0,
            },
            DEFAULT_PERIOD_NS + 2,
        );
        assert!(e.vif_state(0).throttled);
        assert_eq!(e.select(&ready, DEFAULT_PERIOD_NS + 3).unwrap().vif, 1);
        e.tick(&ready, 2 * DEFAULT_PERIOD_NS);
        let s = e.credits(0).unwrap();
        assert!(s.active);
        assert_eq!(s.remain_credit, s.credit_fair - 98);
    }

    /// Greedy vifs, each charged exactly what it was granted: after a few passes every
    /// `credit_fair` is the reference allocation's share of one period.
    fn passes_converge(cap_bps: u64, claims: &[Claim]) -> Result<(), String> {
        let set = claims
            .iter()
            .enumerate()
            .fold(PolicySet::new(Some(cap_bps)), |s, (i, c)| {
                s.with_vif(
                    &format!("v{i}"),
                    VifPolicy {
                        weight: c.weight,
                        min_bps: c.min_bps,
                        max_bps: c.max_bps,
                        ..Default::default()
                    },
                )
            });
        let mut e = Ancs::new();
        e.configure(&set, 0).map_err(|err| err.to_string())?;
        let n = claims.len();
        let mut ready = ReadySet::new(n);
        (0..n).for_each(|i| ready.set(i, true));
        let want = allocate(cap_bps, claims).map_err(|err| err.to_string())?;
        let period = DEFAULT_PERIOD_NS;
        for k in 1..=(2 * n as u64 + 4) {
            for v in 0..n {
                let fair = e.credits(v).unwrap().credit_fair as u64;
                let full = Usage {
                    packets: 32,
                    bytes: fair,
                    cycles: 0,
                };
                e.charge(v, full, k * period - 1);
            }
            e.tick(&ready, k * period);
        }
        for (v, w) in want.iter().enumerate() {
            let got = e.credits(v).unwrap().credit_fair as f64 * 8e9 / period as f64;
            let w = *w as f64;
            if (got - w).abs() > 1e-3 * w.max(cap_bps as f64 / 1000.0) {
                return Err(format!("vif {v}: {got} vs {w}; want {want:?}"));
            }
        }
        Ok(())
    }

    #[test]
    fn passes_settle_on_mixed_floors_and_caps() {
        // Cap visited before the floor lowers the level, and floor before caps raise it.
        let mut c = vec![
            Claim {
                weight: 1,
                min_bps: 0,
                max_bps: Some(90),
                demand_bps: None,
            },
            Claim {
                weight: 1,
                min_bps: 200,
                max_bps: None,
                demand_bps: None,
            },
            Claim {
                weight: 1,
                min_bps: 0,
                max_bps: None,
                demand_bps: None,
            },
        ];
        passes_converge(300 * MBIT, &scale(&c)).unwrap();
        c[0].max_bps = Some(10);
        c[1].min_bps = 110;
        c.swap(0, 1);
        passes_converge(300 * MBIT, &scale(&c)).unwrap();
    }

    fn scale(c: &[Claim]) -> Vec<Claim> {
        c.iter()
            .map(|c| Claim {
                min_bps: c.min_bps * MBIT,
                max_bps: c.max_bps.map(|m| m * MBIT),
                ..*c
            })
            .collect()
    }

    proptest! {
        #![proptest_config(crate::proptest_config::config(200))]
        #[test]
        fn passes_reach_weighted_max_min(
            raw in prop::collection::vec((1u32..10, 0u64..400, prop::option::of(1u64..1000)), 1..12)
        ) {
            let cap = 1_000 * MBIT;
            let mut floors: u64 = 0;
            let claims: Vec<Claim> = raw
                .iter()
                .map(|&(weight, min, max)| {
                    // Keep Σ floors ≤ capacity and every floor ≤ its cap.
                    let mut min_bps = min * MBIT / 4;
                    if floors + min_bps > cap {
                        min_bps = 0;
                    }
                    floors += min_bps;
                    let max_bps = max.map(|m| (m * MBIT).max(min_bps));
                    Claim { weight, min_bps, max_bps, demand_bps: None }
                })
                .collect();
            prop_assert!(passes_converge(cap, &claims).is_ok(), "{:?}", passes_converge(cap, &claims));
        }
    }
}
