//! PID-controlled ECN marking (seed 003, Kim & Kim 2013): equal shares of link time.
//!
//! Heterogeneous hosts make the receiving host's CPU scheduling favour some senders: two VMs
//! uploading together got 206 and 717 Mbit/s though each reaches 870–910 alone. The controller
//! gives every active vif an equal share of link time and marks the frames of the vifs that use
//! more with ECN Congestion Experienced, with a probability set by a PID controller every slot,
//! so their TCP senders shrink their windows without losing a packet.
//!
//! ## Behavior
//! Every slot (`T` = 200 ms, [`PidEcn::next_slot`]) the driver calls [`PidEcn::on_slot`] with each
//! vif's cumulative byte counter (sent plus received). For each vif:
//! - `U_i[k] = B_i[k] / (NC · T)`: the fraction of the slot the link spent on the vif (the slot
//!   length actually elapsed is used, so a late call does not inflate it);
//! - active = `U_i ≥ 1 %`; the share `C_i = 1 / (number of active vifs)`; an inactive vif is
//!   never marked and its controller state is reset. With fewer than two active vifs nobody is
//!   marked and every state is reset: a VM alone is never slowed down.
//! - `e_i[k] = (U_i − C_i) / C_i`;
//! - `P_i[k] = Kp·e_i[k−1] + Ki·Σ_{t≤k} e_i[t−1] + Kd·(e_i[k−1] − e_i[k−2]) / T`, clamped to
//!   `[0, 1]` (here `e_i[k−1]` is the error of the slot just measured, `T` in seconds).
//! - Anti-windup: the sum `Σe` is clamped to `[0, 1/Ki]`, so the integral term stays in
//!   `[0, 1]` — a vif long under its share banks no negative credit and is marked as soon as it
//!   goes over; a vif marked with probability 1 without effect (a sender that ignores ECN)
//!   cannot build up more than a probability of 1 either. In addition the sum is frozen while
//!   the output is saturated at 1 and the error is still positive (conditional integration).
//! - A vif that becomes active starts with its derivative history equal to its first error
//!   (no derivative kick).
//! - [`PidEcn::should_mark`] draws per frame from a seeded splitmix64 generator kept in the
//!   struct, against an integer threshold precomputed per slot: deterministic given the seed
//!   and the call sequence, no floating point per frame.
//!
//! Default gains (Kp 0.0005, Ki 0.0005, Kd 0.00005) and why: see `docs/controllers.md`. They
//! were chosen from step responses in the simulator, whose TCP senders see every frame's mark
//! (`vqos-sim` test `pid_ecn_step_response_justifies_the_default_gains`): a probability `P` per
//! frame cuts a window of `W` segments with probability ≈ `P·W` per round trip, so useful
//! probabilities are around 10⁻⁴–10⁻³. The tests in this module use a window-level plant (the
//! probability acts once per round trip) and gains 100× larger to match it.
//!
//! ## Limitations
//! - Equal shares of link time, not max-min: when the link is not full the heavier vif is still
//!   marked down to `NC / n` (as the paper, whose bottleneck is the receiving host's CPU, not
//!   the link). Weights are not part of the paper's algorithm and are not supported.
//! - Marking only slows senders that honour ECN; a non-responsive sender is marked with
//!   probability up to 1 to no effect.
//! - After a long over-use the integral takes up to `1 / (Ki·|e|)` slots to unwind.

use crate::policy::VifId;
use crate::units::NS_PER_SEC;

/// A vif using less than this fraction of the link in a slot is inactive (not counted in the
/// shares, never marked).
pub const ACTIVE_MIN_UTIL: f64 = 0.01;

/// Parameters of the PID-ECN controller.
#[derive(Debug, Clone, PartialEq)]
pub struct PidParams {
    /// Slot length T (paper: 200 ms).
    pub slot_ns: u64,
    /// Proportional gain (per unit of relative error).
    pub kp: f64,
    /// Integral gain (per unit of relative error per slot).
    pub ki: f64,
    /// Derivative gain (per unit of relative error per second).
    pub kd: f64,
    /// Link capacity NC, bit/s (paper: 1 Gbit/s).
    pub capacity_bps: u64,
    /// Seed of the marking generator.
    pub seed: u64,
}

impl Default for PidParams {
    fn default() -> Self {
        PidParams {
            slot_ns: NS_PER_SEC / 5,
            kp: 0.0005,
            ki: 0.0005,
            kd: 0.000_05,
            capacity_bps: 1_000_000_000,
            seed: 0x5eed_ec11_0000_0001,
        }
    }
}

/// Controller state of one vif.
#[derive(Debug, Clone, Copy, Default)]
struct VifPid {
    /// Cumulative bytes at the last slot boundary.
    last_bytes: u64,
    /// False until the vif's counter has been seen once (a vif added by `resize`).
    has_baseline: bool,
    /// Utilisation U of the last slot (fraction of link time).
    util: f64,
    /// Error of the last slot, e[k−1]; `None` while inactive.
    err: Option<f64>,
    /// Error of the slot before, e[k−2].
    prev_err: f64,
    /// Σ e, clamped to [0, 1/Ki].
    err_sum: f64,
    /// Marking probability P in [0, 1].
    probability: f64,
    /// `P · 2^64`, saturated: a frame is marked when a 64-bit draw is below it.
    threshold: u64,
    /// True when `P ≥ 1` (every frame is marked).
    always: bool,
}

/// The PID-ECN controller. See the module docs.
#[derive(Debug, Clone)]
pub struct PidEcn {
    /// Parameters.
    params: PidParams,
    /// Per-vif state, indexed by [`VifId`].
    vifs: Vec<VifPid>,
    /// Time of the last slot boundary, ns.
    last_slot_ns: u64,
    /// When the next slot ends, ns.
    next_slot_ns: u64,
    /// splitmix64 state of the marking generator.
    rng: u64,
}

impl PidEcn {
    /// A controller for `n_vifs` vifs. The first [`PidEcn::on_slot`] (due at `slot_ns`, any
    /// later time is fine) only takes the counters' baseline; marking starts one slot later.
    pub fn new(params: PidParams, n_vifs: usize) -> Self {
        let slot_ns = params.slot_ns.max(1);
        let params = PidParams { slot_ns, ..params };
        let vif = VifPid::default();
        PidEcn {
            rng: params.seed,
            next_slot_ns: slot_ns,
            params,
            vifs: vec![vif; n_vifs],
            last_slot_ns: 0,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &PidParams {
        &self.params
    }

    /// Number of vifs.
    pub fn len(&self) -> usize {
        self.vifs.len()
    }

    /// True when there is no vif.
    pub fn is_empty(&self) -> bool {
        self.vifs.is_empty()
    }

    /// When the driver must next call [`PidEcn::on_slot`] (absolute ns).
    pub fn next_slot(&self) -> u64 {
        self.next_slot_ns
    }

    /// Grows or shrinks to `n_vifs`; a new vif is inactive until its counter has been seen at
    /// one slot boundary.
    pub fn resize(&mut self, n_vifs: usize) {
        self.vifs.resize(n_vifs, VifPid::default());
    }

    /// Marking probability of `vif` for the current slot (0 for an unknown vif).
    pub fn probability(&self, vif: VifId) -> f64 {
        self.vifs.get(vif).map_or(0.0, |v| v.probability)
    }

    /// Link-time fraction `U` of `vif` in the last slot.
    pub fn utilization(&self, vif: VifId) -> f64 {
        self.vifs.get(vif).map_or(0.0, |v| v.util)
    }

    /// Ends a slot: measures every vif from its cumulative byte counter (sent + received) and
    /// computes the probabilities for the next slot. A call before [`PidEcn::next_slot`] does
    /// nothing. Missing counters count as unchanged; extra ones are ignored.
    pub fn on_slot(&mut self, now_ns: u64, cumulative_bytes: &[u64]) {
        if now_ns < self.next_slot_ns || now_ns <= self.last_slot_ns {
            return;
        }
        let elapsed_ns = now_ns - self.last_slot_ns;
        // Bits the link could carry in the elapsed time.
        let link_bits = self.params.capacity_bps as f64 * elapsed_ns as f64 / NS_PER_SEC as f64;
        for (i, v) in self.vifs.iter_mut().enumerate() {
            let now_bytes = cumulative_bytes.get(i).copied().unwrap_or(v.last_bytes);
            let bytes = if v.has_baseline {
                now_bytes.saturating_sub(v.last_bytes)
            } else {
                0
            };
            v.last_bytes = now_bytes;
            v.has_baseline = true;
            v.util = if link_bits > 0.0 {
                bytes as f64 * 8.0 / link_bits
            } else {
                0.0
            };
        }
        let active = self
            .vifs
            .iter()
            .filter(|v| v.util >= ACTIVE_MIN_UTIL)
            .count();
        let share = if active > 0 { 1.0 / active as f64 } else { 1.0 };
        let t_sec = self.params.slot_ns as f64 / NS_PER_SEC as f64;
        let (kp, ki, kd) = (self.params.kp, self.params.ki, self.params.kd);
        let sum_max = if ki > 0.0 { 1.0 / ki } else { 0.0 };
        for v in &mut self.vifs {
            if active < 2 || v.util < ACTIVE_MIN_UTIL {
                // Alone or idle: never marked; forget the controller state.
                v.err = None;
                v.prev_err = 0.0;
                v.err_sum = 0.0;
                v.set_probability(0.0);
                continue;
            }
            let e = (v.util - share) / share;
            let prev = v.err.unwrap_or(e);
            let saturated_high = v.probability >= 1.0 && e > 0.0;
            if !saturated_high {
                v.err_sum = (v.err_sum + e).clamp(0.0, sum_max);
            }
            let p = kp * e + ki * v.err_sum + kd * (e - prev) / t_sec;
            v.prev_err = prev;
            v.err = Some(e);
            v.set_probability(if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) });
        }
        self.last_slot_ns = now_ns;
        let due = self.next_slot_ns.saturating_add(self.params.slot_ns);
        self.next_slot_ns = if due > now_ns {
            due
        } else {
            now_ns.saturating_add(self.params.slot_ns)
        };
    }

    /// Per-frame decision: true if this frame of `vif` must be marked CE. Draws from the
    /// controller's generator only when `0 < P < 1`.
    #[inline]
    pub fn should_mark(&mut self, vif: VifId) -> bool {
        let Some(v) = self.vifs.get(vif) else {
            return false;
        };
        if v.always {
            return true;
        }
        if v.threshold == 0 {
            return false;
        }
        let t = v.threshold;
        self.next_u64() < t
    }

    /// splitmix64: one step of a Weyl sequence through a 64-bit mixer.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl VifPid {
    fn set_probability(&mut self, p: f64) {
        self.probability = p;
        self.always = p >= 1.0;
        // p in [0, 1): p·2^64 < 2^64; `as` saturates anyway.
        self.threshold = (p * 18_446_744_073_709_551_616.0) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MBIT: f64 = 1e6;
    const SLOT_NS: u64 = NS_PER_SEC / 5;

    /// The receiving host of the paper in a few lines: its CPU can take 923 Mbit/s in all and,
    /// when both senders want more than their part, splits it 206:717 (the favoured VM wins
    /// the scheduling races). Each sender is a TCP-like aggregate, updated every RTT (10 ms):
    /// it grows by `alpha` Mbit/s per RTT, never sends much above what it gets through, never
    /// above its rate alone, and shrinks by half the fraction of its frames marked CE:
    /// `d ← min(d, got)·(1 − p/2) + alpha`.
    struct Plant {
        /// Current sending rate of each sender, Mbit/s.
        demand: Vec<f64>,
        /// Rate of each sender alone, Mbit/s.
        alone: Vec<f64>,
        /// How the host's CPU favours each sender when both are backlogged.
        bias: Vec<f64>,
        /// Additive increase per RTT, Mbit/s.
        alpha: f64,
        /// Cumulative bytes delivered per vif.
        bytes: Vec<u64>,
        /// Fractional bytes carried over.
        frac: Vec<f64>,
    }

    const HOST_MBIT: f64 = 923.0;
    const RTT_NS: u64 = 10_000_000;

    impl Plant {
        fn paper() -> Self {
            Plant {
                demand: vec![871.0, 911.0],
                alone: vec![871.0, 911.0],
                bias: vec![206.0, 717.0],
                alpha: 10.0,
                bytes: vec![0; 2],
                frac: vec![0.0; 2],
            }
        }

        /// Weighted max-min of the host's capacity among the senders that are `on`.
        fn got(&self, on: &[bool]) -> Vec<f64> {
            let n = self.demand.len();
            let mut r = vec![0.0; n];
            let mut open: Vec<usize> = (0..n).filter(|&i| on[i]).collect();
            let mut left = HOST_MBIT;
            while !open.is_empty() {
                let w: f64 = open.iter().map(|&i| self.bias[i]).sum();
                let sat: Vec<usize> = open
                    .iter()
                    .copied()
                    .filter(|&i| self.demand[i] < left * self.bias[i] / w)
                    .collect();
                if sat.is_empty() {
                    for &i in &open {
                        r[i] = left * self.bias[i] / w;
                    }
                    break;
                }
                for &i in &sat {
                    r[i] = self.demand[i];
                    left -= r[i];
                }
                open.retain(|i| !sat.contains(i));
            }
            r
        }

        /// Runs one slot; marking probabilities come from `ctl` (if any). Returns the mean
        /// rates of the slot in Mbit/s.
        fn slot(&mut self, ctl: Option<&PidEcn>, on: &[bool]) -> Vec<f64> {
            let n = self.demand.len();
            let mut sum = vec![0.0; n];
            let rtts = SLOT_NS / RTT_NS;
            for _ in 0..rtts {
                let got = self.got(on);
                for i in 0..n {
                    if !on[i] {
                        self.demand[i] = self.alpha;
                        continue;
                    }
                    sum[i] += got[i];
                    let p = ctl.map_or(0.0, |c| c.probability(i));
                    let bytes = got[i] * MBIT / 8.0 * RTT_NS as f64 / NS_PER_SEC as f64;
                    self.frac[i] += bytes;
                    self.bytes[i] += self.frac[i] as u64;
                    self.frac[i] -= self.frac[i].floor();
                    let d = self.demand[i].min(got[i]) * (1.0 - p / 2.0) + self.alpha;
                    self.demand[i] = d.min(self.alone[i]);
                }
            }
            sum.iter().map(|s| s / rtts as f64).collect()
        }
    }

    /// Gains matched to the window-level plant (its probability acts once per RTT, not per
    /// frame): the same loop dynamics as the default gains on per-frame marking.
    const PLANT_GAINS: (f64, f64, f64) = (0.05, 0.03, 0.002);

    fn plant_params() -> PidParams {
        PidParams {
            kp: PLANT_GAINS.0,
            ki: PLANT_GAINS.1,
            kd: PLANT_GAINS.2,
            ..PidParams::default()
        }
    }

    /// Closed loop for `slots` slots with gains `(kp, ki, kd)`; the controller is switched on
    /// at slot `on_at`. Returns the per-slot rates.
    fn closed_loop(gains: (f64, f64, f64), alpha: f64, slots: u64, on_at: u64) -> Vec<Vec<f64>> {
        let params = PidParams {
            kp: gains.0,
            ki: gains.1,
            kd: gains.2,
            ..PidParams::default()
        };
        let mut ctl: Option<PidEcn> = None;
        let mut plant = Plant::paper();
        plant.alpha = alpha;
        let mut out = Vec::new();
        for k in 1..=slots {
            let r = plant.slot(ctl.as_ref(), &[true, true]);
            out.push(r);
            if k == on_at {
                ctl = Some(PidEcn::new(params.clone(), 2));
            }
            if let Some(c) = ctl.as_mut() {
                c.on_slot(k * SLOT_NS, &plant.bytes);
            }
        }
        out
    }

    #[test]
    fn unequal_senders_converge_to_nearly_equal_rates() {
        let out = closed_loop(PLANT_GAINS, 10.0, 200, 25);
        let uncontrolled = &out[20];
        assert!(
            uncontrolled[1] / uncontrolled[0] >= 3.0,
            "plant reproduces 206/717: {uncontrolled:?}"
        );
        assert!((uncontrolled[0] - 206.0).abs() < 2.0 && (uncontrolled[1] - 717.0).abs() < 2.0);
        let n = 100.0;
        let mean = |i: usize| out[100..].iter().map(|r| r[i]).sum::<f64>() / n;
        let (a, b) = (mean(0), mean(1));
        assert!(b / a <= 1.3, "{a:.0} vs {b:.0}");
        // The favoured sender is held at its equal share of link time (500 of 1000 Mbit/s),
        // the other gets what the host has left: the paper's 414 / 500.
        assert!((b - 500.0).abs() < 10.0, "{b}");
        assert!((a - 423.0).abs() < 10.0, "{a}");
    }

    /// Step response on the window-level plant: from the uncontrolled state the favoured sender
    /// is brought to its share within ±2 % in at most 10 slots (2 s), without going more than
    /// 2 % below it. The same loop with gains four times higher rings, and with gains four
    /// times lower has not settled after 10 slots. (The default gains, for per-frame marking,
    /// are justified the same way in the simulator: see the module docs.)
    #[test]
    fn step_response_on_a_window_level_plant() {
        let settle = |gains: (f64, f64, f64)| -> (Option<usize>, f64) {
            let out = closed_loop(gains, 10.0, 80, 10);
            let b: Vec<f64> = out[10..].iter().map(|r| r[1]).collect();
            let within = |x: f64| (x - 500.0).abs() <= 10.0;
            let settled = (0..b.len()).find(|&k| b[k..].iter().all(|&x| within(x)));
            let undershoot = b.iter().fold(f64::MAX, |m, &x| m.min(x));
            (settled, undershoot)
        };
        let (k, low) = settle(PLANT_GAINS);
        let k = k.expect("settles");
        assert!(k <= 10, "settled after {k} slots");
        assert!(low >= 490.0, "undershoot to {low:.0}");
        let (_, low4) = settle((0.2, 0.12, 0.008));
        assert!(low4 < 475.0, "4x gains should overshoot, lowest {low4:.0}");
        let (k_slow, _) = settle((0.0125, 0.0075, 0.0005));
        assert!(k_slow.is_none_or(|k| k > 10), "{k_slow:?}");
        // Robust to the sender's aggressiveness: twice and half the increase still settle.
        for alpha in [5.0, 20.0] {
            let out = closed_loop(PLANT_GAINS, alpha, 80, 10);
            let last = &out[79];
            assert!((last[1] - 500.0).abs() < 10.0, "alpha {alpha}: {last:?}");
        }
        // The derivative term earns its place with gentler senders: it damps the undershoot.
        let lowest = |kd: f64| {
            let out = closed_loop((0.05, 0.03, kd), 5.0, 80, 10);
            out[10..].iter().fold(f64::MAX, |m, r| m.min(r[1]))
        };
        let (with_d, without_d) = (lowest(0.002), lowest(0.0));
        assert!(with_d >= 465.0, "undershoot to {with_d:.0}");
        assert!(with_d > without_d + 5.0, "{with_d:.0} vs {without_d:.0}");
    }

    #[test]
    fn a_vm_alone_is_never_marked() {
        let mut ctl = PidEcn::new(PidParams::default(), 3);
        let mut bytes = [0u64; 3];
        for k in 1..=50u64 {
            // 900 Mbit/s on vif 0; vif 2 trickles below 1 % of the link.
            bytes[0] += 900_000_000 / 8 / 5;
            bytes[2] += 5_000_000 / 8 / 5;
            ctl.on_slot(k * SLOT_NS, &bytes);
            assert_eq!(ctl.probability(0), 0.0);
            for _ in 0..1000 {
                assert!(!ctl.should_mark(0));
            }
        }
        assert!((ctl.utilization(0) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn second_vm_joins_then_leaves() {
        let mut ctl = PidEcn::new(plant_params(), 2);
        let mut plant = Plant::paper();
        let mut on = [true, false];
        let mut rates = Vec::new();
        for k in 1..=180u64 {
            on[1] = (60..120).contains(&k);
            let r = plant.slot(Some(&ctl), &on);
            rates.push(r);
            ctl.on_slot(k * SLOT_NS, &plant.bytes);
            if k < 60 {
                assert_eq!(ctl.probability(0), 0.0, "alone, slot {k}");
            }
            if k >= 121 {
                // The next slot boundary after it stops already sees it idle.
                assert_eq!(ctl.probability(0), 0.0, "slot {k}");
                assert_eq!(ctl.probability(1), 0.0, "slot {k}");
            }
        }
        // Alone, vif 0 runs at its full rate; together they are within 1.3 of each other;
        // alone again, it gets its full rate back.
        assert!(rates[50][0] > 860.0, "{:?}", rates[50]);
        let both: Vec<&Vec<f64>> = rates[90..119].iter().collect();
        let a = both.iter().map(|r| r[0]).sum::<f64>();
        let b = both.iter().map(|r| r[1]).sum::<f64>();
        assert!(a.max(b) / a.min(b) <= 1.3, "{a} {b}");
        assert!(rates[179][0] > 860.0, "{:?}", rates[179]);
    }

    /// Forces `P = 0.25` on vif 0 with a proportional-only controller.
    fn quarter(seed: u64) -> PidEcn {
        let params = PidParams {
            kp: 0.5,
            ki: 0.0,
            kd: 0.0,
            seed,
            ..PidParams::default()
        };
        let mut ctl = PidEcn::new(params, 2);
        // U = 0.75 and 0.25 of 1 Gbit/s over 200 ms: e = +0.5 and −0.5.
        ctl.on_slot(SLOT_NS, &[0, 0]);
        ctl.on_slot(2 * SLOT_NS, &[18_750_000, 6_250_000]);
        ctl
    }

    #[test]
    fn marking_is_bernoulli_and_deterministic_given_the_seed() {
        let mut ctl = quarter(7);
        assert!((ctl.probability(0) - 0.25).abs() < 1e-12);
        assert_eq!(ctl.probability(1), 0.0);
        let draws: Vec<bool> = (0..100_000).map(|_| ctl.should_mark(0)).collect();
        let marked = draws.iter().filter(|&&m| m).count();
        assert!((24_000..26_000).contains(&marked), "{marked}");
        assert!((0..1000).all(|_| !ctl.should_mark(1)));
        let mut again = quarter(7);
        let replay: Vec<bool> = (0..100_000).map(|_| again.should_mark(0)).collect();
        assert_eq!(draws, replay);
        let mut other = quarter(8);
        let different: Vec<bool> = (0..100_000).map(|_| other.should_mark(0)).collect();
        assert_ne!(draws, different);
    }

    #[test]
    fn integral_is_bounded_and_never_negative() {
        let params = plant_params();
        let mut ctl = PidEcn::new(params.clone(), 2);
        let mut bytes = [0u64; 2];
        let per_slot = |mbit: u64| mbit * 1_000_000 / 8 / 5;
        let mut k = 0u64;
        let mut step = |ctl: &mut PidEcn, a: u64, b: u64| {
            k += 1;
            bytes[0] += per_slot(a);
            bytes[1] += per_slot(b);
            ctl.on_slot(k * SLOT_NS, &bytes);
        };
        // 50 slots under its share: no negative credit is banked ...
        for _ in 0..50 {
            step(&mut ctl, 300, 600);
        }
        assert_eq!(ctl.probability(0), 0.0);
        // ... so the first slot over its share marks it at once.
        step(&mut ctl, 600, 300);
        assert!(ctl.probability(0) > 0.0);
        // A sender that ignores ECN: saturated at 1 for 100 slots.
        for _ in 0..100 {
            step(&mut ctl, 980, 20);
        }
        assert_eq!(ctl.probability(0), 1.0);
        // Once it drops to half its share (e = −0.5), the probability unwinds within
        // 1 / (Ki · 0.5) slots.
        let bound = (1.0 / (params.ki * 0.5)).ceil() as usize + 1;
        let mut took = None;
        for s in 0..bound {
            step(&mut ctl, 250, 750);
            if ctl.probability(0) == 0.0 {
                took = Some(s);
                break;
            }
        }
        assert!(took.is_some(), "still marking after {bound} slots");
    }

    #[test]
    fn resize_and_late_calls() {
        let mut ctl = PidEcn::new(PidParams::default(), 1);
        assert_eq!(ctl.next_slot(), SLOT_NS);
        // Early calls are ignored.
        ctl.on_slot(SLOT_NS - 1, &[1_000_000_000]);
        assert_eq!(ctl.next_slot(), SLOT_NS);
        ctl.on_slot(SLOT_NS, &[10_000_000]);
        // The first call only takes the baseline.
        assert_eq!(ctl.utilization(0), 0.0);
        ctl.on_slot(2 * SLOT_NS, &[20_000_000]);
        assert!((ctl.utilization(0) - 0.4).abs() < 1e-9);
        ctl.resize(2);
        assert_eq!(ctl.len(), 2);
        // The new vif's counter is already large: its first slot only sets the baseline.
        ctl.on_slot(3 * SLOT_NS, &[30_000_000, 5_000_000_000]);
        assert_eq!(ctl.utilization(1), 0.0);
        assert_eq!(ctl.probability(0), 0.0);
        // A late call measures over the time really elapsed: 2 slots' worth of bytes over 2 slots.
        ctl.on_slot(5 * SLOT_NS, &[50_000_000, 5_000_000_000]);
        assert!((ctl.utilization(0) - 0.4).abs() < 1e-9);
        assert_eq!(ctl.next_slot(), 6 * SLOT_NS);
        ctl.resize(0);
        assert!(ctl.is_empty());
        assert!(!ctl.should_mark(3));
    }
}
