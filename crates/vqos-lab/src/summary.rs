//! `summary.md` of `vqos lab paper all`: per figure a table of the paper's numbers
//! (`[[paper]]`), the simulator's prediction and the lab's measurements under each baseline,
//! built from the runs' `results.json` (pure: no I/O, testable on synthetic results).
//!
//! ## Behavior
//! - One section per experiment of [`crate::PAPERS`], one table per scenario file: a row per
//!   phase and active VM (Mbit/s), the aggregate, and the unfairness index or the largest /
//!   smallest ratio where the paper or the scenario's expectations speak of them; then, when a
//!   `[[paper]]` number or an expectation is about the whole run (`whole_run = true`), the
//!   same rows for the whole run (`whole_run` / `simulated_whole_run` of `results.json`), so
//!   that a paper's whole-run figure sits beside whole-run means; then the expectations
//!   passed and the switch's CPU per column.
//! - The simulator column is the `simulated` phases of the first run that has them, headed
//!   with the engine it simulated; the lab column is the `vqos` run (headed with its engine),
//!   one more column per other baseline. A run variant under another engine (the fairness
//!   files under `policer`) is a table of its own, its heading naming the engine.
//! - Runs with latency probes (`[[probe]]`, `latency` in `results.json`) add a row per probe
//!   and phase: RTT p50 / p99 in µs, and the requests lost when any were; the simulator does
//!   not model latency, so its cells are "–".
//! - A failed run is a column of "failed" and a line with its error under the table.

use std::fmt::Write as _;

use serde_json::Value;

use columns::{columns, Column};
use vqos_sim::scenario::{Check, PaperQuantity};
use vqos_sim::Scenario;

/// The header of the summary.
#[derive(Debug, Clone)]
pub struct Header {
    /// UTC date and time of the run's start, `YYYY-MM-DD HH:MM UTC`.
    pub date: String,
    /// Short git commit (`unknown` outside a repository).
    pub commit: String,
    /// The runs' duration scale.
    pub duration_scale: f64,
    /// Wall time of the whole run, seconds.
    pub total_s: f64,
    /// Only the simulator ran (`--sim-only`).
    pub sim_only: bool,
    /// The command that produced the summary.
    pub command: String,
    /// Lab runs per scenario file and switch (`--runs`).
    pub repeats: u32,
    /// Runs finished by earlier invocations and kept (`--resume`); the run time is this
    /// invocation's.
    pub kept_runs: usize,
}

/// One run of a scenario file.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// `vqos` (the lab through vqosd), a kernel baseline's name, or `sim` (simulator only).
    pub baseline: String,
    /// Its `results.json`, or why it failed.
    pub result: Result<Value, String>,
    /// The plot's path relative to the summary (`img/<file>.svg`), when one was written.
    pub plot: Option<String>,
}

/// One scenario file of an experiment and its runs.
#[derive(Debug, Clone)]
pub struct FileRecord {
    /// The file's stem (`ancs-fig5`).
    pub stem: String,
    /// The engine its runs used instead of the scenario's, a run variant
    /// ([`crate::variant`]; `None`: the scenario's own). Shown in the table's heading.
    pub engine: Option<String>,
    /// The papers' algorithms as written instead of vqos's departures, a run variant
    /// ([`crate::variant::PAPER_ALGORITHM_FILES`]). Shown in the table's heading.
    pub algorithms: vqos_sched::Variant,
    /// The parsed scenario (duration-scaled as run, its engine the one run), for its VMs and
    /// `[[paper]]`.
    pub scenario: Scenario,
    /// Its runs in order.
    pub runs: Vec<RunRecord>,
}

/// One experiment of [`crate::PAPERS`].
#[derive(Debug, Clone)]
pub struct ExperimentRecord {
    /// Its name (`ancs-fig5`).
    pub name: String,
    /// Wall time, seconds.
    pub secs: f64,
    /// Its scenario files (empty for a sweep).
    pub files: Vec<FileRecord>,
    /// What the paper reports, as text (sweeps: their numbers are in `crate::paper`).
    pub paper_text: Option<String>,
    /// A sweep's own Markdown (its table and plot), or why it was not run.
    pub sweep_md: Option<String>,
    /// Markdown after the files' tables: C2QoS Fig. 6's real-load run
    /// ([`crate::real_load::section_md`]).
    pub after_md: Option<String>,
}

fn mbit(x: f64) -> String {
    format!("{:.1}", x / 1e6)
}

/// Human-readable seconds: `45 s`, `12 min 3 s`, `1 h 02 min`.
pub fn duration_text(secs: f64) -> String {
    let s = secs.round() as u64;
    if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{} h {:02} min", s / 3600, s / 60 % 60)
    }
}

fn phase_vm(phase: Option<&Value>, vm: &str) -> Option<f64> {
    phase?.get("vifs")?.get(vm)?.get("mean_bps")?.as_f64()
}

fn phase_key(phase: Option<&Value>, key: &str) -> Option<f64> {
    phase?.get(key)?.as_f64()
}

/// Largest over smallest among `vms` (all when empty), or with `ordered` the first's rate
/// over the second's (an `ordered = true` expectation's direction).
fn ratio(phase: Option<&Value>, vms: &[&str], ordered: bool) -> Option<f64> {
    let vifs = phase?.get("vifs")?.as_object()?;
    if let (true, [a, b]) = (ordered, vms) {
        let rate = |n: &str| vifs.get(n)?.get("mean_bps")?.as_f64();
        let (a, b) = (rate(a)?, rate(b)?);
        return (b > 0.0).then(|| a / b);
    }
    let rates: Vec<f64> = vifs
        .iter()
        .filter(|(n, _)| vms.is_empty() || vms.contains(&n.as_str()))
        .filter_map(|(_, v)| v.get("mean_bps")?.as_f64())
        .collect();
    let max = rates.iter().cloned().fold(f64::NAN, f64::max);
    let min = rates.iter().cloned().fold(f64::NAN, f64::min);
    (rates.len() >= 2 && min > 0.0).then(|| max / min)
}

/// The rows of one phase: each active VM, the aggregate, and the unfairness or ratio where
/// the paper or the expectations speak of them.
enum Row {
    Vm(usize),
    Aggregate,
    Unfairness,
    /// Over these VMs; directional (the first over the second) when an expectation says so.
    Ratio(Vec<usize>, bool),
    /// A latency probe, by its VM and protocol.
    Latency(String, String),
}

/// The probes any run of the file measured, as (VM, protocol), in the runs' order.
fn probes(f: &FileRecord) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for r in &f.runs {
        let list = r
            .result
            .as_ref()
            .ok()
            .and_then(|v| v.get("latency")?.as_array());
        for p in list.into_iter().flatten() {
            let key = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
            let id = (key("vm"), key("protocol"));
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
    out
}

/// One probe's cell for phase `phase` (from 1): `p50 / p99` in µs, the requests lost when
/// any were, "no samples" when the phase has none, "–" when the run did not measure it.
pub fn latency_cell(
    latency: Option<&Vec<Value>>,
    vm: &str,
    protocol: &str,
    phase: usize,
) -> String {
    let Some(ph) = latency
        .into_iter()
        .flatten()
        .filter(|p| p.get("vm").and_then(Value::as_str) == Some(vm))
        .filter(|p| p.get("protocol").and_then(Value::as_str) == Some(protocol))
        .filter_map(|p| p.get("phases")?.as_array())
        .flatten()
        .find(|x| x.get("phase").and_then(Value::as_u64) == Some(phase as u64))
    else {
        return "–".into();
    };
    let us = |k: &str| ph.get(k).and_then(Value::as_f64);
    let lost = ph.get("lost").and_then(Value::as_u64).unwrap_or(0);
    let mut cell = match (us("p50_us"), us("p99_us")) {
        (Some(a), Some(b)) => format!("{a:.0} / {b:.0}"),
        _ => "no samples".into(),
    };
    if lost > 0 {
        let _ = write!(cell, " ({lost} lost)");
    }
    cell
}

/// The rows of phase `phase` (1-based; 0: the whole run, its VMs those active in it).
fn rows(sc: &Scenario, phase: usize) -> Vec<Row> {
    let active = |i: usize| match phase {
        0 => sc.whole_run_active(i).is_some(),
        n => sc.active_at(i, sc.phases().get(n - 1).map_or(0, |p| p.0)),
    };
    let mut rows: Vec<Row> = (0..sc.vms.len())
        .filter(|&i| active(i))
        .map(Row::Vm)
        .collect();
    rows.push(Row::Aggregate);
    let cites = |f: &dyn Fn(&PaperQuantity) -> bool| {
        sc.paper.iter().any(|p| p.phase == phase && f(&p.quantity))
    };
    let expects = |f: &dyn Fn(&Check) -> bool| {
        sc.expectations
            .iter()
            .any(|x| x.phase == phase && f(&x.check))
    };
    if cites(&|q| matches!(q, PaperQuantity::Unfairness))
        || expects(&|c| matches!(c, Check::UnfairnessAtMost(_) | Check::UnfairnessAtLeast(_)))
    {
        rows.push(Row::Unfairness);
    }
    let paper_ratio = sc.paper.iter().find_map(|p| match &p.quantity {
        PaperQuantity::Ratio(v) if p.phase == phase => Some(v.clone()),
        _ => None,
    });
    let expect_ratio = sc.expectations.iter().find_map(|x| match x.check {
        Check::RatioAtMost(_) | Check::RatioAtLeast(_) if x.phase == phase => {
            Some((x.vms.clone(), x.ordered))
        }
        _ => None,
    });
    let ordered = expect_ratio.as_ref().is_some_and(|(_, o)| *o);
    if let Some(v) = paper_ratio.or(expect_ratio.map(|(v, _)| v)) {
        rows.push(Row::Ratio(v, ordered));
    }
    rows
}

fn paper_cell(sc: &Scenario, phase: usize, row: &Row) -> String {
    sc.paper
        .iter()
        .filter(|p| p.phase == phase)
        .filter(|p| match (&p.quantity, row) {
            (PaperQuantity::Vm(a), Row::Vm(b)) => a == b,
            (PaperQuantity::Aggregate, Row::Aggregate)
            | (PaperQuantity::Unfairness, Row::Unfairness) => true,
            (PaperQuantity::Ratio(_), Row::Ratio(..)) => true,
            _ => false,
        })
        .map(|p| match (p.number(), p.note.is_empty()) {
            (Some(n), true) => format!("{n} ({})", p.figure),
            (Some(n), false) => format!("{n} ({}; {})", p.note, p.figure),
            (None, _) => format!("{} ({})", p.note, p.figure),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn file_table(f: &FileRecord) -> String {
    let sc = &f.scenario;
    let cols = columns(f);
    let probes = probes(f);
    let mut s = String::from("| phase | | paper |");
    for c in &cols {
        let _ = write!(s, " {} |", c.head);
    }
    s.push_str("\n|---|---|---|");
    for _ in &cols {
        s.push_str("---:|");
    }
    s.push('\n');
    // The phases, then the whole run when a number of the paper or an expectation is about it
    // (the paper's whole-run figures beside whole-run means, not beside a phase's).
    let whole = sc.wants_whole_run().then_some(0);
    for phase in (1..=sc.phases().len()).chain(whole) {
        let mut phase_rows = rows(sc, phase);
        if phase > 0 {
            phase_rows.extend(
                probes
                    .iter()
                    .map(|(vm, p)| Row::Latency(vm.clone(), p.clone())),
            );
        }
        let phase_cell = match phase {
            0 => "whole run".to_string(),
            n => n.to_string(),
        };
        for row in phase_rows {
            let label = match &row {
                Row::Vm(i) => sc.vms[*i].name.clone(),
                Row::Aggregate => "aggregate".into(),
                Row::Unfairness => "unfairness".into(),
                Row::Ratio(v, true) if v.len() == 2 => {
                    format!("{} / {}", sc.vms[v[0]].name, sc.vms[v[1]].name)
                }
                Row::Ratio(..) => "largest / smallest".into(),
                Row::Latency(vm, p) => format!("{vm} {p} probe RTT p50 / p99, µs"),
            };
            let _ = write!(
                s,
                "| {phase_cell} | {label} | {} |",
                paper_cell(sc, phase, &row)
            );
            for c in &cols {
                let cell = match &row {
                    Row::Vm(i) => c.number(|v| phase_vm(v.phase(phase), &sc.vms[*i].name), mbit),
                    Row::Aggregate => {
                        c.number(|v| phase_key(v.phase(phase), "aggregate_bps"), mbit)
                    }
                    Row::Unfairness => c.number(
                        |v| phase_key(v.phase(phase), "unfairness"),
                        |u| format!("{:.1} %", u * 100.0),
                    ),
                    Row::Ratio(v, ordered) => {
                        let names: Vec<&str> = v.iter().map(|&i| sc.vms[i].name.as_str()).collect();
                        c.number(
                            |r| ratio(r.phase(phase), &names, *ordered),
                            |r| format!("{r:.2}"),
                        )
                    }
                    Row::Latency(vm, p) => c.latency(vm, p, phase),
                };
                let _ = write!(s, " {cell} |");
            }
            s.push('\n');
        }
    }
    s.push_str("| | expectations passed | |");
    for c in &cols {
        let _ = write!(s, " {} |", c.checks_cell());
    }
    s.push('\n');
    let cpu: Vec<Option<String>> = cols.iter().map(Column::cpu).collect();
    if cpu.iter().any(Option::is_some) {
        s.push_str("| | switch CPU, % of a core (vqosd + softirq) | |");
        for c in &cpu {
            let _ = write!(s, " {} |", c.as_deref().unwrap_or("–"));
        }
        s.push('\n');
    }
    if !probes.is_empty() {
        s.push_str(
            "\nProbe rows: round-trip times of the scenario's `[[probe]]` requests, one client \
             per phase over the phase minus its settle; the simulator does not model latency.\n",
        );
    }
    for c in cols.iter().skip(1) {
        let errors: Vec<&str> = c.errors().collect();
        let name = c.switch;
        match errors.as_slice() {
            [] => {}
            [e] if c.runs.len() == 1 => {
                let _ = writeln!(s, "\nThe `{name}` run failed: {e}");
            }
            _ => {
                for e in errors {
                    let _ = writeln!(s, "\nA `{name}` run failed: {e}");
                }
            }
        }
    }
    s
}

/// The first line of every `summary.md` ([`mod@crate::publish`] recognises a summary by it).
pub const TITLE: &str = "# The papers' experiments: paper, simulator and lab";

/// The header's words for a `--sim-only` run.
pub const SIM_ONLY_MODE: &str = "simulator only (`--sim-only`: no lab runs)";

/// The line appended to the summary of an interrupted run.
pub const INTERRUPTED: &str =
    "\n**Interrupted**: the experiments after the last section did not run; the same command \
     with `--resume` runs them and keeps what finished.\n";

/// The whole `summary.md`.
pub fn summary_md(h: &Header, experiments: &[ExperimentRecord]) -> String {
    let mut s = format!("{TITLE}\n\n");
    let mode = if h.sim_only {
        SIM_ONLY_MODE
    } else {
        "lab runs with the simulator's prediction"
    };
    let _ = writeln!(
        s,
        "Run {} · commit `{}` · duration scale {} · total run time {} · {mode}  ",
        h.date,
        h.commit,
        h.duration_scale,
        duration_text(h.total_s)
    );
    let _ = writeln!(s, "Command: `{}`\n", h.command);
    if h.kept_runs > 0 {
        let _ = writeln!(
            s,
            "Resumed (`--resume`): {} runs were finished by earlier invocations into the same \
             directory, at the same commit and duration scale, and kept; the run time is the \
             last invocation's.\n",
            h.kept_runs
        );
    }
    if h.repeats > 1 {
        let _ = writeln!(
            s,
            "Each lab cell is {} runs: rates are their mean with the range in brackets \
             (`mean [min–max]`); expectations, CPU and probe cells list each run, separated by \
             ` · `. The sweeps and the real load ran once.\n",
            h.repeats
        );
    }
    s.push_str(
        "Rates in Mbit/s, means over each phase minus its settle time (\"whole run\" rows: from \
         the first settle to the end); the paper's numbers come from the scenario files' `[[paper]]` tables (with their figure). Plots: measured solid, \
         simulated dotted, reference dashed.\n\n| experiment | run time |\n|---|---:|\n",
    );
    for e in experiments {
        let _ = writeln!(s, "| [{0}](#{0}) | {1} |", e.name, duration_text(e.secs));
    }
    for e in experiments {
        let _ = writeln!(s, "\n## {}\n", e.name);
        if let Some(p) = &e.paper_text {
            let _ = writeln!(s, "Paper: {p}\n");
        }
        if let Some(md) = &e.sweep_md {
            let _ = writeln!(s, "{}", md.trim_end());
        }
        for f in &e.files {
            match (&f.engine, f.algorithms.is_paper()) {
                (Some(engine), _) => {
                    let _ = writeln!(s, "### {} under engine `{engine}`\n", f.stem);
                }
                (None, true) => {
                    let _ = writeln!(s, "### {} with the papers' algorithms as written\n", f.stem);
                }
                (None, false) => {
                    let _ = writeln!(s, "### {}\n", f.stem);
                }
            }
            if !f.scenario.description.is_empty() {
                let _ = writeln!(s, "{}\n", f.scenario.description);
            }
            // What the simulator says it cannot model (a VM's CPU), beside its column.
            for w in &f.scenario.warnings {
                let _ = writeln!(s, "*Simulator: {w}.*\n");
            }
            if let Some(engine) = &f.engine {
                let _ = writeln!(
                    s,
                    "The same file under the `{engine}` engine instead of its own (a run \
                     variant: the engine the paper enforced with), in the simulator and, in a \
                     lab run, in vqosd.\n"
                );
            }
            if f.algorithms.is_paper() {
                let _ = writeln!(
                    s,
                    "The same file with `variant = \"paper\"`: the papers' algorithms as written \
                     where vqos departs from them (ANCS's CreditLeft, Algorithm 1, PID-ECN \
                     marking only what a VM receives), in the simulator and, in a lab run, in \
                     vqosd. The difference from the table above is what the departures are \
                     worth (docs/experiments.md, \"The departures, measured\").\n"
                );
            }
            s.push_str(&file_table(f));
            for r in &f.runs {
                if let Some(p) = &r.plot {
                    let mut engine = f.engine.as_ref().map_or(String::new(), |e| format!(" {e}"));
                    if f.algorithms.is_paper() {
                        engine.push_str(" paper");
                    }
                    let _ = writeln!(s, "\n![{} {}{engine}]({p})", f.stem, r.baseline);
                }
            }
            s.push('\n');
        }
        if let Some(md) = &e.after_md {
            let _ = writeln!(s, "{}\n", md.trim_end());
        }
    }
    s
}

mod columns;
#[cfg(test)]
mod tests;
