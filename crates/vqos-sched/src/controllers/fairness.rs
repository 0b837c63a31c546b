//! Fairness adjuster: "suppress the strong, help the weak" (seed 001, Algorithm 1).
//!
//! When the bottleneck is outside the host (a router somewhere on the path), TCP splits it by
//! connection count: a VM with ten connections takes ten times what a VM with one takes, though
//! both bought the same share. The host cannot see the bottleneck, only the rates its vifs reach;
//! this controller lowers the rate limit of the vifs that get more than their weighted share and
//! keeps a cut only if the others really picked up what was taken.
//!
//! It is a pure state machine: the driver calls [`FairnessAdjuster::on_sample`] at
//! [`FairnessAdjuster::next_wake`] with each vif's cumulative byte counter and applies the
//! returned [`LimitChange`]s as `min(user max, controller limit)`.
//!
//! ## Behavior
//! Every period (5 s by default), at `T`:
//! 1. Measure `RBW_i` over the period, `NBW_i = RBW_i / W_i`, `NBW_AVE` = the mean over the
//!    *active* vifs (period rate ≥ ξ); `fair_i = W_i · NBW_AVE`. Strong: `NBW_i > NBW_AVE`;
//!    weak: the others. Fewer than two active vifs: every limit is released (nobody to protect).
//! 2. Relax (our addition, see below): a limited vif that is now weak is raised at once to
//!    `fair_i + δ_min` if it presses against its limit, or released if it does not use it.
//! 3. For each strong vif, largest `NBW_i` first:
//!    - **relax probe** (our addition) if it presses against a limit of ours: raise the limit by a
//!      step for one probe; if the weak vifs *lost* about the step (`|loss − step| < ξ`) the
//!      limit still protects them and is put back; if they did not and the vif used the extra,
//!      the raise is kept and the step doubles for the next probe; if the vif did not use it,
//!      the limit is released;
//!    - **cut probe** (Algorithm 1): while its excess `RBW_i − fair_i` (measured over the last
//!      probe) is above `δ_min`, lower its limit by `ΔBW = max(δ_min, excess · delta_percent %)`
//!      from `min(limit, measured rate)`, wait `probe_ns`, and keep the cut only if the weak vifs
//!      gained about as much (`|ΔBW_weak − ΔBW| < ξ`); otherwise give `ΔBW` back. Recomputing
//!      `ΔBW` from the remaining excess plays the role of the paper's "goto line 7".
//! 4. After every change that is not itself probed (an immediate relax, a revert) the adjuster
//!    waits one probe before the next probe so that each probe's baseline reflects the limits in
//!    force. Each probe compares two windows of the same length (`probe_ns`): the one just
//!    before the change and the one just after.
//! 5. A vif whose cut proved ineffective is not cut again for 1, 2, 4, then 8 periods (reset by
//!    an effective cut), so that a strong vif whose neighbours simply do not want more is not
//!    throttled for a probe in every period.
//!
//! ## Limitations
//! - Rates are measured, not demanded: a vif whose demand drops below its limit looks exactly
//!   like one held back elsewhere. Limits are released when a limited vif is weak and not
//!   using its limit, when it is alone, or by a relax probe that shows nobody loses.
//! - A probe that coincides with a change of the outside bottleneck can be judged wrongly; the
//!   next period corrects it.
//! - Probes are sequential; at most `period_ns / probe_ns − 1` of them run per period and a
//!   period is stretched if they run past its end.

use crate::policy::VifId;
use crate::units::NS_PER_SEC;

/// Parameters of the fairness adjuster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairnessParams {
    /// How often the adjustment procedure runs (paper: 5 s).
    pub period_ns: u64,
    /// How long a cut (or relax) is observed before it is judged (paper: 0.5 s).
    pub probe_ns: u64,
    /// A cut is this percentage of the strong vif's current excess over its fair share.
    pub delta_percent: u32,
    /// Smallest cut or raise, and the excess under which a vif is left alone (dead band).
    /// Must exceed `xi_bps`, or a cut that helps nobody would pass the effectiveness test.
    pub delta_min_bps: u64,
    /// Tolerance ξ of the effectiveness test `|ΔBW_weak − ΔBW| < ξ` (paper: 0.5 Mbit/s); also
    /// the rate under which a vif counts as inactive.
    pub xi_bps: u64,
    /// No limit is ever set below this.
    pub min_limit_bps: u64,
}

impl Default for FairnessParams {
    fn default() -> Self {
        FairnessParams {
            period_ns: 5 * NS_PER_SEC,
            probe_ns: NS_PER_SEC / 2,
            delta_percent: 50,
            delta_min_bps: 1_000_000,
            xi_bps: 500_000,
            min_limit_bps: 1_000_000,
        }
    }
}

/// A new controller limit for one vif.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitChange {
    /// The vif.
    pub vif: VifId,
    /// The controller's limit in bit/s; `None` = no controller limit. The driver applies
    /// `min(user max, this)`.
    pub max_bps: Option<u64>,
}

/// Unfairness of a rate vector: `(1/N) Σ |NBW_i − NBW_AVE| / NBW_AVE` with `NBW_i = rate_i / w_i`
/// (0 when every rate is 0 or there are no vifs). A weight of 0 counts as 1.
pub fn unfairness(rates_bps: &[u64], weights: &[u32]) -> f64 {
    let n = rates_bps.len().min(weights.len());
    if n == 0 {
        return 0.0;
    }
    let nbw: Vec<f64> = (0..n)
        .map(|i| rates_bps[i] as f64 / f64::from(weights[i].max(1)))
        .collect();
    let avg = nbw.iter().sum::<f64>() / n as f64;
    if avg <= 0.0 {
        return 0.0;
    }
    nbw.iter().map(|x| (x - avg).abs()).sum::<f64>() / avg / n as f64
}

/// What the adjuster waits for at its next wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Take the baseline sample one probe before the period ends.
    PreSample,
    /// The period ends: classify, relax, plan the probes.
    PeriodEnd,
    /// Let the rates settle after an unprobed change, then start the next probe.
    Settle,
    /// A cut or a raise is being observed.
    Probe(Probe),
}

/// What is being probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    /// The limit was lowered by `amount_bps`.
    Cut,
    /// The limit was raised by `amount_bps`.
    Relax,
}

/// One probe in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Probe {
    /// The vif whose limit changed.
    vif: VifId,
    /// Cut or raise.
    kind: ProbeKind,
    /// Its limit before the change (restored if the change is judged ineffective).
    prev_limit: Option<u64>,
    /// Size of the change, bit/s.
    amount_bps: u64,
    /// Σ rate of the weak vifs over the window before the change, bit/s.
    weak_base_bps: u64,
    /// Rate of the vif over the window before the change, bit/s.
    vif_base_bps: u64,
}

/// The fairness adjuster. See the module docs.
#[derive(Debug, Clone)]
pub struct FairnessAdjuster {
    /// Parameters.
    params: FairnessParams,
    /// Per-vif weight (0 treated as 1).
    weights: Vec<u32>,
    /// Per-vif controller limit, bit/s (`None` = none).
    limits: Vec<Option<u64>>,
    /// Cumulative bytes at the last sample.
    last_bytes: Vec<u64>,
    /// Time of the last sample, ns.
    last_ns: u64,
    /// Cumulative bytes when the current period's measurement window opened.
    period_bytes: Vec<u64>,
    /// When the current period's measurement window opened, ns.
    period_start_ns: u64,
    /// When `on_sample` must next be called, ns.
    next_wake_ns: u64,
    /// What the next wake is for.
    phase: Phase,
    /// This period's fair rate per vif, bit/s (`W_i · NBW_AVE`).
    fair_bps: Vec<u64>,
    /// This period's weak set (NBW_i ≤ NBW_AVE).
    weak: Vec<bool>,
    /// This period's strong vifs, largest NBW first.
    plan: Vec<VifId>,
    /// Index in `plan` of the vif being worked on.
    plan_pos: usize,
    /// True once the current plan vif's relax stage is over.
    relax_done: bool,
    /// Step of the next relax probe of the current plan vif, bit/s (doubles while raises work).
    relax_step_bps: u64,
    /// Probes still allowed in this period.
    probes_left: u32,
    /// Periods during which a vif is not cut (after an ineffective cut).
    cut_skip_periods: Vec<u32>,
    /// Length of the next skip if a cut of the vif is ineffective again (1, 2, 4, 8).
    cut_backoff_periods: Vec<u32>,
}

/// Longest back-off after repeated ineffective cuts, in periods.
const MAX_BACKOFF_PERIODS: u32 = 8;

impl FairnessAdjuster {
    /// An adjuster for `weights.len()` vifs. Time and the byte counters are taken to start at 0;
    /// the first wake is one probe before the end of the first period.
    pub fn new(params: FairnessParams, weights: &[u32]) -> Self {
        let n = weights.len();
        let probe_ns = params.probe_ns.max(1);
        let period_ns = params.period_ns.max(probe_ns.saturating_mul(2));
        let params = FairnessParams {
            probe_ns,
            period_ns,
            ..params
        };
        FairnessAdjuster {
            next_wake_ns: period_ns - probe_ns,
            params,
            weights: weights.iter().map(|&w| w.max(1)).collect(),
            limits: vec![None; n],
            last_bytes: vec![0; n],
            last_ns: 0,
            period_bytes: vec![0; n],
            period_start_ns: 0,
            phase: Phase::PreSample,
            fair_bps: vec![0; n],
            weak: vec![false; n],
            plan: Vec::new(),
            plan_pos: 0,
            relax_done: false,
            relax_step_bps: 0,
            probes_left: 0,
            cut_skip_periods: vec![0; n],
            cut_backoff_periods: vec![1; n],
        }
    }

    /// The parameters in force (the period is raised to at least two probes).
    pub fn params(&self) -> &FairnessParams {
        &self.params
    }

    /// When the driver must next call [`FairnessAdjuster::on_sample`] (absolute ns).
    pub fn next_wake(&self) -> u64 {
        self.next_wake_ns
    }

    /// The controller's current limit per vif, bit/s (`None` = none).
    pub fn limits(&self) -> &[Option<u64>] {
        &self.limits
    }

    /// Feeds the per-vif cumulative byte counters at `now_ns`; returns the limits that changed.
    /// A call before [`FairnessAdjuster::next_wake`] does nothing. Counters beyond the vifs
    /// given to `new` are ignored; missing ones count as unchanged.
    pub fn on_sample(&mut self, now_ns: u64, cumulative_bytes: &[u64]) -> Vec<LimitChange> {
        let mut changes = Vec::new();
        if now_ns < self.next_wake_ns || now_ns <= self.last_ns {
            return changes;
        }
        let bytes: Vec<u64> = (0..self.weights.len())
            .map(|i| {
                cumulative_bytes
                    .get(i)
                    .copied()
                    .unwrap_or(self.last_bytes[i])
            })
            .collect();
        let recent = rates_bps(&self.last_bytes, &bytes, now_ns - self.last_ns);
        match self.phase {
            Phase::PreSample => {
                self.phase = Phase::PeriodEnd;
                self.next_wake_ns = self.period_start_ns.saturating_add(self.params.period_ns);
            }
            Phase::PeriodEnd => self.period_end(now_ns, &bytes, &recent, &mut changes),
            Phase::Settle => self.next_action(now_ns, &recent, &mut changes),
            Phase::Probe(p) => self.judge(now_ns, p, &recent, &mut changes),
        }
        self.last_bytes = bytes;
        self.last_ns = now_ns;
        changes
    }

    fn set_limit(&mut self, vif: VifId, max_bps: Option<u64>, changes: &mut Vec<LimitChange>) {
        if self.limits[vif] != max_bps {
            self.limits[vif] = max_bps;
            changes.push(LimitChange { vif, max_bps });
        }
    }

    /// True when `vif` runs (within 5 % or ξ) at its controller limit.
    fn pressing(&self, vif: VifId, rate_bps: u64) -> bool {
        match self.limits[vif] {
            Some(limit) => rate_bps.saturating_add(self.params.xi_bps.max(limit / 20)) >= limit,
            None => false,
        }
    }

    fn weak_sum(&self, rates: &[u64]) -> u64 {
        rates
            .iter()
            .zip(&self.weak)
            .filter(|(_, &w)| w)
            .map(|(&r, _)| r)
            .sum()
    }

    fn period_end(
        &mut self,
        now_ns: u64,
        bytes: &[u64],
        recent: &[u64],
        changes: &mut Vec<LimitChange>,
    ) {
        let period = rates_bps(
            &self.period_bytes,
            bytes,
            now_ns.saturating_sub(self.period_start_ns).max(1),
        );
        self.period_bytes = bytes.to_vec();
        self.period_start_ns = now_ns;
        for s in &mut self.cut_skip_periods {
            *s = s.saturating_sub(1);
        }
        let n = self.weights.len();
        let active: Vec<bool> = period.iter().map(|&r| r >= self.params.xi_bps).collect();
        let n_active = active.iter().filter(|&&a| a).count() as u128;
        // NBW in bit/s per unit of weight; Σ over ≤ 2^32 vifs of values < 2^64 fits in u128.
        let nbw: Vec<u128> = (0..n)
            .map(|i| u128::from(period[i]) / u128::from(self.weights[i]))
            .collect();
        let active_sum: u128 = nbw
            .iter()
            .zip(&active)
            .filter(|(_, &a)| a)
            .map(|(&x, _)| x)
            .sum();
        let avg = active_sum.checked_div(n_active).unwrap_or(0);
        for (i, &x) in nbw.iter().enumerate() {
            let fair = avg * u128::from(self.weights[i]);
            self.fair_bps[i] = u64::try_from(fair).unwrap_or(u64::MAX);
            self.weak[i] = x <= avg;
        }
        self.plan.clear();
        self.plan_pos = 0;
        self.relax_done = false;
        self.relax_step_bps = self.params.delta_min_bps;
        self.probes_left = u32::try_from(self.params.period_ns / self.params.probe_ns - 1)
            .unwrap_or(u32::MAX)
            .max(1);
        if n_active < 2 {
            // Nobody to help: no limit of ours has a reason to exist.
            for i in 0..n {
                self.set_limit(i, None, changes);
            }
            self.end_period(now_ns);
            return;
        }
        // Immediate relax of limited vifs that are now weak or inactive.
        for i in 0..n {
            let strong_and_active = !self.weak[i] && active[i];
            if self.limits[i].is_none() || strong_and_active {
                continue;
            }
            if active[i] && self.pressing(i, recent[i]) {
                let raised = self.fair_bps[i].saturating_add(self.params.delta_min_bps);
                if raised > self.limits[i].unwrap_or(u64::MAX) {
                    self.set_limit(i, Some(raised), changes);
                }
            } else {
                self.set_limit(i, None, changes);
            }
        }
        let mut strong: Vec<VifId> = (0..n).filter(|&i| active[i] && !self.weak[i]).collect();
        strong.sort_by(|&a, &b| nbw[b].cmp(&nbw[a]).then(a.cmp(&b)));
        self.plan = strong;
        if changes.is_empty() {
            self.next_action(now_ns, recent, changes);
        } else {
            self.settle(now_ns);
        }
    }

    fn settle(&mut self, now_ns: u64) {
        self.phase = Phase::Settle;
        self.next_wake_ns = now_ns.saturating_add(self.params.probe_ns);
    }

    /// Starts the next probe of the plan, or ends the period.
    fn next_action(&mut self, now_ns: u64, recent: &[u64], changes: &mut Vec<LimitChange>) {
        while self.plan_pos < self.plan.len() && self.probes_left > 0 {
            let vif = self.plan[self.plan_pos];
            let rate = recent[vif];
            let base = Probe {
                vif,
                kind: ProbeKind::Cut,
                prev_limit: self.limits[vif],
                amount_bps: 0,
                weak_base_bps: self.weak_sum(recent),
                vif_base_bps: rate,
            };
            if !self.relax_done && self.pressing(vif, rate) {
                let limit = self.limits[vif].unwrap_or(u64::MAX);
                let step = self.relax_step_bps.max(1);
                self.set_limit(vif, Some(limit.saturating_add(step)), changes);
                return self.start_probe(
                    now_ns,
                    Probe {
                        kind: ProbeKind::Relax,
                        amount_bps: step,
                        ..base
                    },
                );
            }
            self.relax_done = true;
            let excess = rate.saturating_sub(self.fair_bps[vif]);
            if self.cut_skip_periods[vif] == 0 && excess > self.params.delta_min_bps {
                let pct = u128::from(self.params.delta_percent);
                // excess < 2^64 and pct < 2^32: the product fits in u128.
                let delta = u64::try_from(u128::from(excess) * pct / 100)
                    .unwrap_or(u64::MAX)
                    .max(self.params.delta_min_bps);
                let from = self.limits[vif].map_or(rate, |l| l.min(rate));
                let to = from.saturating_sub(delta).max(self.params.min_limit_bps);
                if to < from {
                    self.set_limit(vif, Some(to), changes);
                    return self.start_probe(
                        now_ns,
                        Probe {
                            kind: ProbeKind::Cut,
                            amount_bps: from - to,
                            ..base
                        },
                    );
                }
            }
            self.next_plan_vif();
        }
        self.end_period(now_ns);
    }

    fn next_plan_vif(&mut self) {
        self.plan_pos += 1;
        self.relax_done = false;
        self.relax_step_bps = self.params.delta_min_bps;
    }

    fn start_probe(&mut self, now_ns: u64, probe: Probe) {
        self.probes_left -= 1;
        self.phase = Phase::Probe(probe);
        self.next_wake_ns = now_ns.saturating_add(self.params.probe_ns);
    }

    /// Judges the probe that just ended.
    fn judge(&mut self, now_ns: u64, p: Probe, recent: &[u64], changes: &mut Vec<LimitChange>) {
        let weak_now = self.weak_sum(recent);
        let xi = i128::from(self.params.xi_bps);
        let amount = i128::from(p.amount_bps);
        match p.kind {
            ProbeKind::Cut => {
                let gain = i128::from(weak_now) - i128::from(p.weak_base_bps);
                if (gain - amount).abs() < xi {
                    // Effective: keep it, and cut again while the excess is still large.
                    self.cut_backoff_periods[p.vif] = 1;
                    self.next_action(now_ns, recent, changes);
                } else {
                    self.set_limit(p.vif, p.prev_limit, changes);
                    let b = self.cut_backoff_periods[p.vif];
                    // +1: the next period's start counts down before it looks.
                    self.cut_skip_periods[p.vif] = b + 1;
                    self.cut_backoff_periods[p.vif] = (b * 2).min(MAX_BACKOFF_PERIODS);
                    self.next_plan_vif();
                    self.settle(now_ns);
                }
            }
            ProbeKind::Relax => {
                let loss = i128::from(p.weak_base_bps) - i128::from(weak_now);
                if (loss - amount).abs() < xi {
                    // The limit still protects the weak: put it back, then consider a cut.
                    self.set_limit(p.vif, p.prev_limit, changes);
                    self.relax_done = true;
                    self.settle(now_ns);
                } else if recent[p.vif].saturating_mul(2)
                    >= p.vif_base_bps
                        .saturating_mul(2)
                        .saturating_add(p.amount_bps)
                {
                    // Nobody lost and the vif used the extra: keep it, raise faster.
                    self.relax_step_bps = self.relax_step_bps.saturating_mul(2);
                    self.next_action(now_ns, recent, changes);
                } else {
                    // The vif does not even use its limit any more: release it.
                    self.set_limit(p.vif, None, changes);
                    self.next_plan_vif();
                    self.next_action(now_ns, recent, changes);
                }
            }
        }
    }

    /// Schedules the next period: its baseline sample one probe before its end, or now if the
    /// probes ran late.
    fn end_period(&mut self, now_ns: u64) {
        let end = self.period_start_ns.saturating_add(self.params.period_ns);
        let pre = end.saturating_sub(self.params.probe_ns);
        if pre > now_ns {
            self.phase = Phase::PreSample;
            self.next_wake_ns = pre;
        } else {
            self.phase = Phase::PeriodEnd;
            self.next_wake_ns = now_ns.saturating_add(self.params.probe_ns);
        }
    }
}

/// Per-vif rates in bit/s between two counter snapshots `dt_ns` apart.
fn rates_bps(before: &[u64], after: &[u64], dt_ns: u64) -> Vec<u64> {
    before
        .iter()
        .zip(after)
        .map(|(&b, &a)| {
            // bytes < 2^64, ·8·10^9 < 2^97: fits in u128.
            let bits = u128::from(a.saturating_sub(b)) * 8 * u128::from(NS_PER_SEC);
            u64::try_from(bits / u128::from(dt_ns.max(1))).unwrap_or(u64::MAX)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MBIT: u64 = 1_000_000;
    const MS: u64 = 1_000_000;

    /// A bottleneck of `capacity_bps` outside the host, shared by connection count, with the
    /// host's per-vif limits: weighted max-min with weights = connections, caps = limits and
    /// the vifs' own demands.
    fn bottleneck(capacity_bps: u64, conns: &[u64], caps: &[Option<u64>]) -> Vec<u64> {
        let n = conns.len();
        let mut rate = vec![0u64; n];
        let mut open: Vec<usize> = (0..n).filter(|&i| conns[i] > 0).collect();
        let mut left = capacity_bps;
        loop {
            let total: u64 = open.iter().map(|&i| conns[i]).sum();
            if total == 0 || left == 0 {
                return rate;
            }
            // Vifs whose cap is below their connection share of what is left are fixed.
            let capped: Vec<usize> = open
                .iter()
                .copied()
                .filter(|&i| caps[i].is_some_and(|c| c * total < left * conns[i]))
                .collect();
            if capped.is_empty() {
                for &i in &open {
                    rate[i] = left * conns[i] / total;
                }
                return rate;
            }
            for &i in &capped {
                rate[i] = caps[i].unwrap();
                left -= rate[i];
            }
            open.retain(|i| !capped.contains(i));
        }
    }

    /// Closed loop: the adjuster, a host that applies its limits, the bottleneck. Advances in
    /// 10 ms steps up to `end_ns`; `capacity(t)` and `conns(t)` describe the outside world.
    /// Records the per-vif mean rates of every 10 s window.
    struct Loop {
        ctl: FairnessAdjuster,
        /// Cumulative traffic per vif in bit·ns (rate × step), exact.
        bits_ns: Vec<u128>,
        now_ns: u64,
        history: Vec<Vec<u64>>,
    }

    impl Loop {
        fn new(params: FairnessParams, weights: &[u32]) -> Self {
            Loop {
                ctl: FairnessAdjuster::new(params, weights),
                bits_ns: vec![0; weights.len()],
                now_ns: 0,
                history: Vec::new(),
            }
        }

        fn bytes(&self) -> Vec<u64> {
            self.bits_ns
                .iter()
                .map(|&b| (b / 8 / u128::from(NS_PER_SEC)) as u64)
                .collect()
        }

        fn run(
            &mut self,
            end_ns: u64,
            capacity: impl Fn(u64) -> u64,
            conns: impl Fn(u64) -> Vec<u64>,
        ) {
            let step = 10 * MS;
            let mut window = vec![0u128; self.bits_ns.len()];
            let mut window_start = self.now_ns;
            while self.now_ns < end_ns {
                if self.now_ns >= self.ctl.next_wake() {
                    self.ctl.on_sample(self.now_ns, &self.bytes());
                }
                let r = bottleneck(
                    capacity(self.now_ns),
                    &conns(self.now_ns),
                    self.ctl.limits(),
                );
                for (i, &x) in r.iter().enumerate() {
                    self.bits_ns[i] += u128::from(x) * u128::from(step);
                    window[i] += u128::from(x) * u128::from(step);
                }
                self.now_ns += step;
                if self.now_ns - window_start >= 10_000 * MS {
                    let dt = u128::from(self.now_ns - window_start);
                    self.history
                        .push(window.iter().map(|&b| (b / dt) as u64).collect());
                    window.iter_mut().for_each(|b| *b = 0);
                    window_start = self.now_ns;
                }
            }
        }
    }

    #[test]
    fn unfairness_metric() {
        assert_eq!(unfairness(&[50, 50], &[1, 1]), 0.0);
        // The paper's 86.4 vs 8.63 Mbit/s: 81 %.
        let u = unfairness(&[86_400_000, 8_630_000], &[1, 1]);
        assert!((u - 0.818).abs() < 0.001, "{u}");
        // Weighted: 2:1 rates with 2:1 weights are fair.
        assert_eq!(unfairness(&[200, 100], &[2, 1]), 0.0);
        assert_eq!(unfairness(&[0, 0], &[1, 1]), 0.0);
        assert_eq!(unfairness(&[], &[]), 0.0);
    }

    #[test]
    fn static_bottleneck_ten_vs_one_connections_becomes_fair() {
        let mut l = Loop::new(FairnessParams::default(), &[1, 1]);
        l.run(600_000 * MS, |_| 100 * MBIT, |_| vec![10, 1]);
        let first = unfairness(&l.history[0][..], &[1, 1]);
        // Before the first adjustment (t < 5 s) the split is 10:1.
        let r0 = bottleneck(100 * MBIT, &[10, 1], &[None, None]);
        assert!((unfairness(&r0, &[1, 1]) - 0.818).abs() < 0.01);
        assert!(first < 0.5, "first window {first}");
        for (k, w) in l.history.iter().enumerate().skip(1) {
            let u = unfairness(w, &[1, 1]);
            assert!(u <= 0.10, "window {k}: {w:?} unfairness {u:.3}");
            // The bottleneck stays full: limits move share, they do not waste it.
            assert!(w[0] + w[1] >= 97 * MBIT, "window {k}: {w:?}");
        }
        let lim = l.ctl.limits()[0].expect("the strong vif is limited");
        assert!((45 * MBIT..=56 * MBIT).contains(&lim), "{lim}");
        assert_eq!(l.ctl.limits()[1], None);
    }

    #[test]
    fn fluctuating_bottleneck_stays_fair() {
        // The path's capacity changes every 7 to 20 s, anywhere between 60 and 100 Mbit/s.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut changes = Vec::new();
        let mut t = 0;
        while t < 600_000 * MS {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let cap = 60 * MBIT + (seed % 41) * MBIT;
            changes.push((t, cap));
            t += (7_000 + (seed >> 20) % 13_000) * MS;
        }
        let capacity = move |now: u64| {
            changes
                .iter()
                .rev()
                .find(|(at, _)| *at <= now)
                .map_or(100 * MBIT, |&(_, c)| c)
        };
        let mut l = Loop::new(FairnessParams::default(), &[1, 1]);
        l.run(600_000 * MS, capacity, |_| vec![10, 1]);
        let u: Vec<f64> = l.history.iter().map(|w| unfairness(w, &[1, 1])).collect();
        let mean = u[1..].iter().sum::<f64>() / (u.len() - 1) as f64;
        assert!(mean <= 0.15, "mean unfairness {mean:.3}: {u:?}");
    }

    #[test]
    fn ineffective_cut_is_reverted() {
        // Two vifs that do not share a bottleneck: vif 0 has 80 Mbit/s of its own path, vif 1
        // 10 Mbit/s of another. Cutting vif 0 helps nobody.
        let mut ctl = FairnessAdjuster::new(FairnessParams::default(), &[1, 1]);
        let mut bytes = [0u64; 2];
        let mut now = 0;
        let mut seen = Vec::new();
        while now < 8_000 * MS {
            if now >= ctl.next_wake() {
                for c in ctl.on_sample(now, &bytes) {
                    seen.push((now, c));
                }
            }
            let r0 = ctl.limits()[0].map_or(80 * MBIT, |l| l.min(80 * MBIT));
            let step = 10 * MS;
            bytes[0] += r0 / 8 * step / NS_PER_SEC;
            bytes[1] += 10 * MBIT / 8 * step / NS_PER_SEC;
            now += step;
        }
        // At 5 s: cut by half its 35 Mbit/s excess over the 45 Mbit/s average; at 5.5 s the weak
        // vif has gained nothing, so the cut is given back.
        let cut = LimitChange {
            vif: 0,
            max_bps: Some(80 * MBIT - 17_500_000),
        };
        let back = LimitChange {
            vif: 0,
            max_bps: None,
        };
        assert_eq!(seen, vec![(5_000 * MS, cut), (5_500 * MS, back)]);
        assert_eq!(ctl.limits(), &[None, None]);
    }

    #[test]
    fn back_off_after_ineffective_cuts() {
        let mut ctl = FairnessAdjuster::new(FairnessParams::default(), &[1, 1]);
        let mut bytes = [0u64; 2];
        let mut now = 0;
        let mut cuts = Vec::new();
        while now < 200_000 * MS {
            if now >= ctl.next_wake() {
                for c in ctl.on_sample(now, &bytes) {
                    if c.max_bps.is_some() {
                        cuts.push(now / (5_000 * MS));
                    }
                }
            }
            let r0 = ctl.limits()[0].map_or(80 * MBIT, |l| l.min(80 * MBIT));
            bytes[0] += r0 / 8 / 100;
            bytes[1] += 10 * MBIT / 8 / 100;
            now += 10 * MS;
        }
        // Periods 1, 3, 6, 11, then every 9th: far fewer than one cut per period.
        assert_eq!(&cuts[..4], &[1, 3, 6, 11], "{cuts:?}");
        assert!(cuts.len() < 10, "{cuts:?}");
    }

    #[test]
    fn stale_limit_is_released_when_the_weak_vif_leaves() {
        let mut l = Loop::new(FairnessParams::default(), &[1, 1]);
        l.run(60_000 * MS, |_| 100 * MBIT, |_| vec![10, 1]);
        assert!(l.ctl.limits()[0].is_some());
        // The weak vif stops: the strong one must get the whole bottleneck back.
        l.run(120_000 * MS, |_| 100 * MBIT, |_| vec![10, 0]);
        assert_eq!(l.ctl.limits()[0], None);
        let last = l.history.last().unwrap();
        assert!(last[0] >= 99 * MBIT, "{last:?}");
        // It comes back: fair again.
        l.run(200_000 * MS, |_| 100 * MBIT, |_| vec![10, 1]);
        let u = unfairness(l.history.last().unwrap(), &[1, 1]);
        assert!(u <= 0.10, "{u}");
    }

    #[test]
    fn weighted_shares_and_three_vifs() {
        // Weights 2:1:1, connections 1:2:12 → target 50/25/25.
        let w = [2, 1, 1];
        let mut l = Loop::new(FairnessParams::default(), &w);
        l.run(300_000 * MS, |_| 100 * MBIT, |_| vec![1, 2, 12]);
        let first = bottleneck(100 * MBIT, &[1, 2, 12], &[None; 3]);
        assert!(unfairness(&first, &w) > 0.7);
        for wdw in &l.history[3..] {
            let u = unfairness(wdw, &w);
            assert!(u <= 0.10, "{wdw:?} {u:.3}");
        }
    }
}
