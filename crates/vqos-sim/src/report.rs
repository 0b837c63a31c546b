//! Per-phase results: measured means beside the reference allocation, the unfairness index,
//! and the scenario's own expectations — one format for `vqos sim` and `vqos lab run`.
//!
//! ## Behavior
//! A phase's mean leaves out the first `settle` of the phase (the time the system takes to react
//! to the change); when the phase is not longer than `settle`, its second half is used. The
//! reference is [`vqos_sched::alloc::allocate`] applied to the phase's policies, the capacity of
//! the tightest shared link, and demands from the traffic: greedy TCP or unlimited UDP =
//! unlimited, rate-limited traffic = its rate, stopped VMs = 0 (left out of the table).

use serde::Serialize;
use std::collections::BTreeMap;
use vqos_sched::alloc::{allocate, Claim};
use vqos_sched::VifPolicy;

use crate::scenario::{Check, Scenario};

/// One VM in one phase.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VifPhase {
    /// Measured mean over the phase minus its settle time, bits/s.
    pub mean_bps: f64,
    /// The reference allocation, bits/s.
    pub expected_bps: f64,
}

/// One phase.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Phase {
    /// Start, seconds.
    pub start_s: f64,
    /// End, seconds.
    pub end_s: f64,
    /// Active VMs by name.
    pub vifs: BTreeMap<String, VifPhase>,
    /// Sum of the means, bits/s.
    pub aggregate_bps: f64,
    /// (1/N) Σ |NBW_i − NBW_avg| / NBW_avg over active VMs, NBW = rate / weight.
    pub unfairness: f64,
}

/// One expectation's outcome.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckResult {
    /// Human-readable statement of the expectation.
    pub expectation: String,
    /// What was measured.
    pub measured: String,
    /// Whether it held.
    pub pass: bool,
}

/// The whole result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// "sim" or "lab".
    pub mode: String,
    /// Engine name.
    pub engine: String,
    /// Phases in order.
    pub phases: Vec<Phase>,
    /// The whole run as one phase (means from the first settle to the end), when an
    /// expectation or a `[[paper]]` number is about it ([`Scenario::wants_whole_run`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whole_run: Option<Phase>,
    /// Expectations in file order.
    pub checks: Vec<CheckResult>,
    /// Fraction of the switch core that was busy.
    pub cpu_busy: f64,
    /// The scenario's warnings (keys that cannot act); absent from the JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Report {
    /// True when every expectation held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }
}

/// The unfairness index of the fairness paper.
pub fn unfairness(rates_bps: &[f64], weights: &[u32]) -> f64 {
    let n = rates_bps.len();
    if n == 0 {
        return 0.0;
    }
    let nbw: Vec<f64> = rates_bps
        .iter()
        .zip(weights)
        .map(|(r, w)| r / f64::from(*w))
        .collect();
    let avg = nbw.iter().sum::<f64>() / n as f64;
    if avg <= 0.0 {
        return 0.0;
    }
    nbw.iter().map(|x| (x - avg).abs() / avg).sum::<f64>() / n as f64
}

/// Mean rate over `[from, to)` ns from bins of `bin_ns` holding bytes.
fn mean_bps(bins: &[u64], bin_ns: u64, from: u64, to: u64) -> f64 {
    let a = (from / bin_ns) as usize;
    let b = ((to / bin_ns) as usize).min(bins.len());
    if b <= a {
        return 0.0;
    }
    let bytes: u64 = bins[a..b].iter().sum();
    bytes as f64 * 8.0 / ((b - a) as f64 * bin_ns as f64 / 1e9)
}

/// Builds the report from per-VM bins of delivered bytes. `mode` is `"sim"` for the
/// simulator's (which leaves out the `lab_only` expectations), else what measured them.
pub fn build_report(
    sc: &Scenario,
    mode: &str,
    bins: &[Vec<u64>],
    bin_ns: u64,
    cpu_busy: f64,
) -> Report {
    let mut phases = Vec::new();
    for (start, end) in sc.phases() {
        let settle = if end - start > sc.settle_ns {
            sc.settle_ns
        } else {
            (end - start) / 2
        };
        let policies = sc.policies_at(start);
        let state = sc.state_at(start);
        let active: Vec<usize> = (0..sc.vms.len())
            .filter(|&i| sc.active_at(i, start))
            .collect();
        let claims: Vec<(usize, VifPolicy, Option<u64>)> = active
            .iter()
            .map(|&i| {
                let s = &state[i].0;
                // An on/off source with a rate offers that rate over its duty cycle; a greedy
                // one is taken as unlimited (the reference then overstates what it can use).
                let demand = match (s.rate_bps, s.on_off_ns) {
                    (Some(r), Some((on, off))) => {
                        Some((u128::from(r) * u128::from(on) / u128::from(on + off)) as u64)
                    }
                    (r, _) => r,
                };
                (i, sc.reference_policy(i, &policies.vifs[i].policy), demand)
            })
            .collect();
        let expected = reference(sc, start, &claims);
        let mut vifs = BTreeMap::new();
        let mut rates = Vec::new();
        let mut weights = Vec::new();
        for (k, &i) in active.iter().enumerate() {
            let m = mean_bps(&bins[i], bin_ns, start + settle, end);
            rates.push(m);
            weights.push(policies.vifs[i].policy.weight);
            vifs.insert(
                sc.vms[i].name.clone(),
                VifPhase {
                    mean_bps: m,
                    expected_bps: expected.get(k).copied().unwrap_or(0) as f64,
                },
            );
        }
        phases.push(Phase {
            start_s: start as f64 / 1e9,
            end_s: end as f64 / 1e9,
            aggregate_bps: rates.iter().sum(),
            unfairness: unfairness(&rates, &weights),
            vifs,
        });
    }
    let whole = sc.wants_whole_run().then(|| whole_run(sc, bins, bin_ns));
    let checks = sc
        .expectations
        .iter()
        .filter(|x| !(x.lab_only && mode == "sim"))
        .map(|x| evaluate(sc, (&phases, whole.as_ref()), x))
        .collect();
    Report {
        scenario: sc.name.clone(),
        mode: mode.to_string(),
        engine: sc.engine.to_string(),
        phases,
        whole_run: whole,
        checks,
        cpu_busy,
        warnings: sc.warnings.clone(),
    }
}

/// The reference allocation of a phase starting at `start`, one rate per claim `(vm, policy,
/// demand)` in order. A bottleneck is one link that everything crosses, both directions
/// included (docs/scenarios.md); without one, what VMs send and what they receive cross the
/// host link in its two directions, each of `capacity`.
fn reference(sc: &Scenario, start: u64, claims: &[(usize, VifPolicy, Option<u64>)]) -> Vec<u64> {
    let groups: Vec<Vec<usize>> = if sc.bottleneck_at(start).is_some() {
        vec![(0..claims.len()).collect()]
    } else {
        [false, true]
            .iter()
            .map(|&down| {
                (0..claims.len())
                    .filter(|&k| sc.is_download(claims[k].0) == down)
                    .collect()
            })
            .collect()
    };
    let mut out = vec![0; claims.len()];
    let one = groups.len() == 1;
    for (down, g) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
        let c: Vec<Claim> = g
            .iter()
            .map(|&k| Claim::new(&claims[k].1, claims[k].2))
            .collect();
        // Validated at parse time.
        let capacity = if one || down == 0 {
            sc.tightest_at(start)
        } else {
            sc.tightest_in_at(start)
        };
        let a = allocate(capacity, &c).unwrap_or_default();
        for (&k, r) in g.iter().zip(a) {
            out[k] = r;
        }
    }
    out
}

fn mbit(b: f64) -> String {
    format!("{:.1} Mbit/s", b / 1e6)
}

/// The whole run as one phase, for whole-run expectations: each VM's mean over its active time
/// after the first phase's settle, with the weights in force at the start.
fn whole_run(sc: &Scenario, bins: &[Vec<u64>], bin_ns: u64) -> Phase {
    let (from, to) = sc.whole_run_span();
    let policies = sc.policies_at(0);
    let mut vifs = BTreeMap::new();
    let (mut rates, mut weights) = (Vec::new(), Vec::new());
    for (i, vm) in sc.vms.iter().enumerate() {
        let Some((start, stop)) = sc.whole_run_active(i) else {
            continue;
        };
        let m = mean_bps(&bins[i], bin_ns, start, stop);
        rates.push(m);
        weights.push(policies.vifs[i].policy.weight);
        vifs.insert(
            vm.name.clone(),
            VifPhase {
                mean_bps: m,
                expected_bps: 0.0,
            },
        );
    }
    Phase {
        start_s: from as f64 / 1e9,
        end_s: to as f64 / 1e9,
        aggregate_bps: rates.iter().sum(),
        unfairness: unfairness(&rates, &weights),
        vifs,
    }
}

fn evaluate(
    sc: &Scenario,
    (phases, whole): (&[Phase], Option<&Phase>),
    x: &crate::scenario::Expectation,
) -> CheckResult {
    let p = match (x.phase, whole) {
        (0, Some(w)) => w,
        _ => &phases[x.phase - 1],
    };
    let vm_name = x.vm.map(|i| sc.vms[i].name.clone()).unwrap_or_default();
    let vif = |ph: &Phase| ph.vifs.get(&vm_name).cloned();
    let missing = |what: String| CheckResult {
        expectation: what,
        measured: format!("{vm_name} is not active in that phase"),
        pass: false,
    };
    // Largest over smallest, or (`ordered`) the first VM's rate over the second's.
    let ratio_over = || {
        let names: Vec<String> = if x.vms.is_empty() {
            p.vifs.keys().cloned().collect()
        } else {
            x.vms.iter().map(|&i| sc.vms[i].name.clone()).collect()
        };
        let rates: Vec<f64> = names
            .iter()
            .filter_map(|n| p.vifs.get(n).map(|v| v.mean_bps))
            .collect();
        let (hi, lo) = match (x.ordered, rates.as_slice()) {
            (true, [a, b]) => (*a, *b),
            // One of the two is not active: no ratio to speak of.
            (true, _) => (0.0, 0.0),
            (false, _) => (
                rates.iter().cloned().fold(0.0, f64::max),
                rates.iter().cloned().fold(f64::INFINITY, f64::min),
            ),
        };
        if lo > 0.0 {
            hi / lo
        } else if hi > 0.0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    };
    let ph = x.phase_label();
    match &x.check {
        Check::NearReference(pct) => {
            let what = format!("{ph}: {vm_name} within {pct}% of the reference");
            let Some(v) = vif(p) else {
                return missing(what);
            };
            let dev = if v.expected_bps > 0.0 {
                (v.mean_bps - v.expected_bps).abs() / v.expected_bps * 100.0
            } else {
                v.mean_bps
            };
            CheckResult {
                expectation: what,
                measured: format!(
                    "{} vs {} ({dev:.1}%)",
                    mbit(v.mean_bps),
                    mbit(v.expected_bps)
                ),
                pass: dev <= *pct,
            }
        }
        Check::AggregateAtLeast(frac) => {
            let link = sc.tightest_at((p.start_s * 1e9) as u64) as f64;
            CheckResult {
                expectation: format!(
                    "{ph}: aggregate at least {:.0}% of {}",
                    frac * 100.0,
                    mbit(link)
                ),
                measured: format!(
                    "{} ({:.1}%)",
                    mbit(p.aggregate_bps),
                    p.aggregate_bps / link * 100.0
                ),
                pass: p.aggregate_bps >= frac * link,
            }
        }
        Check::KeepsAtLeast(frac, of) | Check::LosesAtLeast(frac, of) => {
            let keeps = matches!(x.check, Check::KeepsAtLeast(..));
            let what = format!(
                "{ph}: {vm_name} {} at least {:.0}% of its phase-{of} rate",
                if keeps { "keeps" } else { "loses" },
                frac * 100.0
            );
            let (Some(now), Some(before)) = (vif(p), vif(&phases[of - 1])) else {
                return missing(what);
            };
            let kept = if before.mean_bps > 0.0 {
                now.mean_bps / before.mean_bps
            } else {
                0.0
            };
            CheckResult {
                expectation: what,
                measured: format!(
                    "{} of {} ({:.1}% kept)",
                    mbit(now.mean_bps),
                    mbit(before.mean_bps),
                    kept * 100.0
                ),
                pass: if keeps {
                    kept >= *frac
                } else {
                    1.0 - kept >= *frac
                },
            }
        }
        Check::MaxAtLeast(frac) => {
            let what = format!(
                "{ph}: {vm_name} gets at least {:.0}% of its max",
                frac * 100.0
            );
            let at = (p.start_s * 1e9) as u64;
            let max =
                x.vm.and_then(|i| sc.state_at(at).get(i).and_then(|s| s.0.policy.max_bps));
            let Some(v) = vif(p) else {
                return missing(what);
            };
            let Some(max) = max else {
                return CheckResult {
                    expectation: what,
                    measured: format!("{vm_name} has no max in that phase"),
                    pass: false,
                };
            };
            CheckResult {
                expectation: what,
                measured: format!(
                    "{} of {} ({:.1}%)",
                    mbit(v.mean_bps),
                    mbit(max as f64),
                    v.mean_bps / max as f64 * 100.0
                ),
                pass: v.mean_bps >= frac * max as f64,
            }
        }
        Check::UnfairnessAtMost(v) | Check::UnfairnessAtLeast(v) => {
            let most = matches!(x.check, Check::UnfairnessAtMost(_));
            CheckResult {
                expectation: format!(
                    "{ph}: unfairness {} {:.0}%",
                    if most { "at most" } else { "at least" },
                    v * 100.0
                ),
                measured: format!("{:.1}%", p.unfairness * 100.0),
                pass: if most {
                    p.unfairness <= *v
                } else {
                    p.unfairness >= *v
                },
            }
        }
        Check::RatioAtMost(v) | Check::RatioAtLeast(v) => {
            let most = matches!(x.check, Check::RatioAtMost(_));
            let r = ratio_over();
            let of = match x.vms.as_slice() {
                [a, b] if x.ordered => format!("{}/{}", sc.vms[*a].name, sc.vms[*b].name),
                _ => "largest/smallest".to_string(),
            };
            CheckResult {
                expectation: format!(
                    "{ph}: {of} rate {} {v}",
                    if most { "at most" } else { "at least" }
                ),
                measured: format!("{r:.2}"),
                // NaN (neither VM active) passes neither.
                pass: if most { r <= *v } else { r >= *v },
            }
        }
    }
}

/// A time series as CSV (`t_s,vm,rate_bps,control`): per VM, the delivered rate over windows of
/// `window_ns` (a multiple of `bin_ns`) and the controller's value at the window's start
/// (fairness: the rate limit in bit/s, 0 = none; PID-ECN: the marking probability × 10⁶), empty
/// without a controller.
pub fn timeseries_csv(
    sc: &Scenario,
    bins: &[Vec<u64>],
    bin_ns: u64,
    control: &[Vec<u64>],
    window_ns: u64,
) -> String {
    use std::fmt::Write;
    let per = (window_ns / bin_ns).max(1) as usize;
    let mut s = String::from("t_s,vm,rate_bps,control\n");
    let n = bins.first().map_or(0, Vec::len);
    for w in 0..n.div_ceil(per) {
        let (a, b) = (w * per, ((w + 1) * per).min(n));
        let secs = (b - a) as f64 * bin_ns as f64 / 1e9;
        for (i, vm) in sc.vms.iter().enumerate() {
            let bytes: u64 = bins[i][a..b].iter().sum();
            let ctrl = control
                .get(a)
                .and_then(|c| c.get(i))
                .map_or(String::new(), |c| c.to_string());
            let _ = writeln!(
                s,
                "{:.3},{},{:.0},{}",
                a as f64 * bin_ns as f64 / 1e9,
                vm.name,
                bytes as f64 * 8.0 / secs,
                ctrl
            );
        }
    }
    s
}

/// Renders the report as a plain-text table.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} ({} mode, engine {}), switch core busy {:.1}%",
        r.scenario,
        r.mode,
        r.engine,
        r.cpu_busy * 100.0
    );
    for w in &r.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    for (i, p) in r.phases.iter().enumerate() {
        let _ = writeln!(
            s,
            "\nphase {} [{:.1}s, {:.1}s)  aggregate {:.1} Mbit/s  unfairness {:.1}%",
            i + 1,
            p.start_s,
            p.end_s,
            p.aggregate_bps / 1e6,
            p.unfairness * 100.0
        );
        let _ = writeln!(
            s,
            "  {:<10} {:>12} {:>12} {:>8}",
            "vm", "Mbit/s", "reference", "dev"
        );
        for (name, v) in &p.vifs {
            let dev = if v.expected_bps > 0.0 {
                format!(
                    "{:+.1}%",
                    (v.mean_bps - v.expected_bps) / v.expected_bps * 100.0
                )
            } else {
                "-".to_string()
            };
            let _ = writeln!(
                s,
                "  {:<10} {:>12.1} {:>12.1} {:>8}",
                name,
                v.mean_bps / 1e6,
                v.expected_bps / 1e6,
                dev
            );
        }
    }
    if let Some(w) = &r.whole_run {
        let _ = writeln!(
            s,
            "\nwhole run [{:.1}s, {:.1}s)  aggregate {:.1} Mbit/s  unfairness {:.1}%",
            w.start_s,
            w.end_s,
            w.aggregate_bps / 1e6,
            w.unfairness * 100.0
        );
        for (name, v) in &w.vifs {
            let _ = writeln!(s, "  {:<10} {:>12.1}", name, v.mean_bps / 1e6);
        }
    }
    if !r.checks.is_empty() {
        let _ = writeln!(s, "\nexpectations:");
        for c in &r.checks {
            let _ = writeln!(
                s,
                "  [{}] {} — {}",
                if c.pass { "pass" } else { "FAIL" },
                c.expectation,
                c.measured
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfairness_of_the_fairness_paper() {
        // 86.4 vs 8.63 Mbit/s, equal weights: the paper's 81 %.
        let u = unfairness(&[86.4e6, 8.63e6], &[1, 1]);
        assert!((u - 0.818).abs() < 0.01, "{u}");
        assert_eq!(unfairness(&[5.0, 5.0], &[1, 1]), 0.0);
        // Weighted: 2:1 rates with 2:1 weights are fair.
        assert!(unfairness(&[200.0, 100.0], &[2, 1]) < 1e-9);
    }

    #[test]
    fn csv_windows_sum_bins() {
        let sc = Scenario::parse(
            "name = \"t\"\nduration = \"1s\"\ncapacity = \"1Gbit\"\n[[vm]]\nname = \"a\"\n",
        )
        .unwrap();
        // Ten 100 ms bins of 1 250 000 bytes = 100 Mbit/s.
        let bins = vec![vec![1_250_000u64; 10]];
        let csv = timeseries_csv(&sc, &bins, 100_000_000, &[], 500_000_000);
        assert_eq!(
            csv,
            "t_s,vm,rate_bps,control\n0.000,a,100000000,\n0.500,a,100000000,\n"
        );
    }

    #[test]
    fn max_at_least_holds_a_vm_to_its_purchase_in_that_phase() {
        let text = "name = \"t\"\nduration = \"2s\"\ncapacity = \"1Gbit\"\nsettle = \"0s\"\n\
            [[vm]]\nname = \"a\"\nmax = \"100Mbit\"\n[[vm]]\nname = \"b\"\n\
            [[event]]\nat = \"1s\"\nvm = \"a\"\nmax = \"200Mbit\"\n\
            [[expect]]\nphase = 1\nvm = \"a\"\nmax_at_least = 0.95\n\
            [[expect]]\nphase = 2\nvm = \"a\"\nmax_at_least = 0.95\n\
            [[expect]]\nphase = 1\nvm = \"b\"\nmax_at_least = 0.5\n";
        let sc = Scenario::parse(text).unwrap();
        assert_eq!(sc.expectations[0].check, Check::MaxAtLeast(0.95));
        // a sends 96 Mbit/s throughout (12 000 000 bytes per 1 s bin): 96 % of its first max,
        // 48 % of its second; b has no max.
        let bins = vec![vec![12_000_000u64; 2], vec![1u64; 2]];
        let r = build_report(&sc, "lab", &bins, 1_000_000_000, 0.0);
        let pass: Vec<bool> = r.checks.iter().map(|c| c.pass).collect();
        assert_eq!(pass, [true, false, false], "{:?}", r.checks);
        assert!(
            r.checks[1].measured.contains("(48.0%)"),
            "{:?}",
            r.checks[1]
        );
        assert!(
            r.checks[2].measured.contains("has no max"),
            "{:?}",
            r.checks[2]
        );
    }

    #[test]
    fn mean_leaves_out_the_settle_time() {
        // 10 bins of 1 s; first 2 at 0, then 125 000 bytes (1 Mbit) each.
        let mut bins = vec![125_000u64; 10];
        bins[0] = 0;
        bins[1] = 0;
        let m = mean_bps(&bins, 1_000_000_000, 2_000_000_000, 10_000_000_000);
        assert!((m - 1e6).abs() < 1.0);
    }
}
