//! `summary.md` of `vqos lab paper all`: per figure a table of the paper's numbers
//! (`[[paper]]`), the simulator's prediction and the lab's measurements under each baseline,
//! built from the runs' `results.json` (pure: no I/O, testable on synthetic results).
//!
//! ## Behavior
//! - One section per experiment of [`crate::PAPERS`], one table per scenario file: a row per
//!   phase and active VM (Mbit/s), the aggregate, and the unfairness index or the largest /
//!   smallest ratio where the paper or the scenario's expectations speak of them; then the
//!   expectations passed and the switch's CPU per column.
//! - The simulator column is the `simulated` phases of the first run that has them; the lab
//!   column is the `vqos` run (headed with its engine), one more column per other baseline.
//! - A failed run is a column of "failed" and a line with its error under the table.

use std::fmt::Write as _;

use serde_json::Value;
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
    /// The parsed scenario (duration-scaled as run), for its VMs and `[[paper]]`.
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
}

fn mbit(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{:.1}", x / 1e6))
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

/// What a column shows: per phase the `phases` array of a report.
struct Column<'a> {
    head: String,
    phases: Option<&'a Vec<Value>>,
    checks: Option<&'a Vec<Value>>,
    cpu: Option<String>,
    error: Option<&'a str>,
}

fn phase_vm(phases: Option<&Vec<Value>>, k: usize, vm: &str) -> Option<f64> {
    phases?
        .get(k)?
        .get("vifs")?
        .get(vm)?
        .get("mean_bps")?
        .as_f64()
}

fn phase_key(phases: Option<&Vec<Value>>, k: usize, key: &str) -> Option<f64> {
    phases?.get(k)?.get(key)?.as_f64()
}

fn ratio(phases: Option<&Vec<Value>>, k: usize, vms: &[&str]) -> Option<f64> {
    let vifs = phases?.get(k)?.get("vifs")?.as_object()?;
    let rates: Vec<f64> = vifs
        .iter()
        .filter(|(n, _)| vms.is_empty() || vms.contains(&n.as_str()))
        .filter_map(|(_, v)| v.get("mean_bps")?.as_f64())
        .collect();
    let max = rates.iter().cloned().fold(f64::NAN, f64::max);
    let min = rates.iter().cloned().fold(f64::NAN, f64::min);
    (rates.len() >= 2 && min > 0.0).then(|| max / min)
}

fn columns(f: &FileRecord) -> Vec<Column<'_>> {
    let sim = f
        .runs
        .iter()
        .filter_map(|r| r.result.as_ref().ok())
        .find_map(|v| v.get("simulated")?.as_array());
    let sim_checks = f
        .runs
        .iter()
        .filter_map(|r| r.result.as_ref().ok())
        .find_map(|v| {
            if v.get("mode").and_then(Value::as_str) == Some("sim") {
                v.get("checks")?.as_array()
            } else {
                v.get("simulated_checks")?.as_array()
            }
        });
    let mut cols = vec![Column {
        head: "simulator".into(),
        phases: sim,
        checks: sim_checks,
        cpu: None,
        error: None,
    }];
    for r in f.runs.iter().filter(|r| r.baseline != "sim") {
        let engine = r
            .result
            .as_ref()
            .ok()
            .and_then(|v| v.get("engine")?.as_str());
        let head = if r.baseline == "vqos" {
            format!("lab (`{}`)", engine.unwrap_or(f.scenario.engine.name()))
        } else {
            format!("`{}`", r.baseline)
        };
        let (phases, checks, cpu, error) = match &r.result {
            Ok(v) => {
                let cpu = v.get("cpu").map(|c| {
                    let p = |k: &str| c.get(k).and_then(Value::as_f64).unwrap_or(0.0);
                    if r.baseline == "vqos" {
                        format!("{:.1} + {:.1}", p("vqosd_percent"), p("softirq_percent"))
                    } else {
                        format!("{:.1}", p("softirq_percent"))
                    }
                });
                (
                    v.get("phases").and_then(Value::as_array),
                    v.get("checks").and_then(Value::as_array),
                    cpu,
                    None,
                )
            }
            Err(e) => (None, None, None, Some(e.as_str())),
        };
        cols.push(Column {
            head,
            phases,
            checks,
            cpu,
            error,
        });
    }
    cols
}

/// The rows of one phase: each active VM, the aggregate, and the unfairness or ratio where
/// the paper or the expectations speak of them.
enum Row {
    Vm(usize),
    Aggregate,
    Unfairness,
    Ratio(Vec<usize>),
}

fn rows(sc: &Scenario, k: usize) -> Vec<Row> {
    let start = sc.phases().get(k).map_or(0, |p| p.0);
    let mut rows: Vec<Row> = (0..sc.vms.len())
        .filter(|&i| sc.active_at(i, start))
        .map(Row::Vm)
        .collect();
    rows.push(Row::Aggregate);
    let phase = k + 1;
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
        Check::RatioAtMost(_) | Check::RatioAtLeast(_) if x.phase == phase => Some(x.vms.clone()),
        _ => None,
    });
    if let Some(v) = paper_ratio.or(expect_ratio) {
        rows.push(Row::Ratio(v));
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
            (PaperQuantity::Ratio(_), Row::Ratio(_)) => true,
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
    let mut s = String::from("| phase | | paper |");
    for c in &cols {
        let _ = write!(s, " {} |", c.head);
    }
    s.push_str("\n|---|---|---|");
    for _ in &cols {
        s.push_str("---:|");
    }
    s.push('\n');
    for k in 0..sc.phases().len() {
        for row in rows(sc, k) {
            let label = match &row {
                Row::Vm(i) => sc.vms[*i].name.clone(),
                Row::Aggregate => "aggregate".into(),
                Row::Unfairness => "unfairness".into(),
                Row::Ratio(_) => "largest / smallest".into(),
            };
            let _ = write!(
                s,
                "| {} | {label} | {} |",
                k + 1,
                paper_cell(sc, k + 1, &row)
            );
            for c in &cols {
                let cell = if c.error.is_some() {
                    "failed".into()
                } else {
                    match &row {
                        Row::Vm(i) => mbit(phase_vm(c.phases, k, &sc.vms[*i].name)),
                        Row::Aggregate => mbit(phase_key(c.phases, k, "aggregate_bps")),
                        Row::Unfairness => phase_key(c.phases, k, "unfairness")
                            .map_or("–".into(), |u| format!("{:.1} %", u * 100.0)),
                        Row::Ratio(v) => {
                            let names: Vec<&str> =
                                v.iter().map(|&i| sc.vms[i].name.as_str()).collect();
                            ratio(c.phases, k, &names).map_or("–".into(), |r| format!("{r:.2}"))
                        }
                    }
                };
                let _ = write!(s, " {cell} |");
            }
            s.push('\n');
        }
    }
    s.push_str("| | expectations passed | |");
    for c in &cols {
        let cell = match (c.error, c.checks) {
            (Some(_), _) => "failed".into(),
            (None, Some(ch)) => {
                let pass = ch
                    .iter()
                    .filter(|x| x.get("pass").and_then(Value::as_bool) == Some(true))
                    .count();
                format!("{pass} / {}", ch.len())
            }
            (None, None) => "–".into(),
        };
        let _ = write!(s, " {cell} |");
    }
    s.push('\n');
    if cols.iter().any(|c| c.cpu.is_some()) {
        s.push_str("| | switch CPU, % of a core (vqosd + softirq) | |");
        for c in &cols {
            let _ = write!(s, " {} |", c.cpu.as_deref().unwrap_or("–"));
        }
        s.push('\n');
    }
    for (c, r) in cols
        .iter()
        .skip(1)
        .zip(f.runs.iter().filter(|r| r.baseline != "sim"))
    {
        if let Some(e) = c.error {
            let _ = writeln!(s, "\nThe `{}` run failed: {e}", r.baseline);
        }
    }
    s
}

/// The whole `summary.md`.
pub fn summary_md(h: &Header, experiments: &[ExperimentRecord]) -> String {
    let mut s = String::from("# The papers' experiments: paper, simulator and lab\n\n");
    let mode = if h.sim_only {
        "simulator only (`--sim-only`: no lab runs)"
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
    s.push_str(
        "Rates in Mbit/s, means over each phase minus its settle time; the paper's numbers come \
         from the scenario files' `[[paper]]` tables (with their figure). Plots: measured solid, \
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
            let _ = writeln!(s, "### {}\n", f.stem);
            if !f.scenario.description.is_empty() {
                let _ = writeln!(s, "{}\n", f.scenario.description);
            }
            s.push_str(&file_table(f));
            for r in &f.runs {
                if let Some(p) = &r.plot {
                    let _ = writeln!(s, "\n![{} {}]({p})", f.stem, r.baseline);
                }
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sc() -> Scenario {
        Scenario::parse(
            "name = \"t\"\ndescription = \"two VMs\"\nduration = \"20s\"\ncapacity = \"100Mbit\"\n\
             [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n\
             [[expect]]\nphase = 2\nunfairness_at_most = 0.1\n\
             [[paper]]\nfigure = \"Fig. 9\"\nphase = 2\nvm = \"vm2\"\nmbit = 8.63\n\
             [[paper]]\nfigure = \"Fig. 9\"\nphase = 2\nratio = true\nvalue = 1.5\n",
        )
        .unwrap()
    }

    fn phases(a: f64, b: f64) -> Value {
        json!([
            {"vifs": {"vm1": {"mean_bps": 100e6}}, "aggregate_bps": 100e6, "unfairness": 0.0},
            {"vifs": {"vm1": {"mean_bps": a}, "vm2": {"mean_bps": b}},
             "aggregate_bps": a + b, "unfairness": 0.25}
        ])
    }

    fn lab(baseline: &str) -> RunRecord {
        RunRecord {
            baseline: baseline.into(),
            result: Ok(json!({
                "mode": "lab", "engine": "ancs", "phases": phases(60e6, 40e6),
                "simulated": phases(50e6, 50e6),
                "checks": [{"pass": true}, {"pass": false}],
                "simulated_checks": [{"pass": true}, {"pass": true}],
                "cpu": {"vqosd_percent": 12.34, "softirq_percent": 1.0}
            })),
            plot: Some("img/t.svg".into()),
        }
    }

    fn header() -> Header {
        Header {
            date: "2026-11-24 07:00 UTC".into(),
            commit: "abc1234".into(),
            duration_scale: 0.5,
            total_s: 725.0,
            sim_only: false,
            command: "vqos lab paper all --out x".into(),
        }
    }

    fn one(runs: Vec<RunRecord>) -> String {
        let e = ExperimentRecord {
            name: "exp".into(),
            secs: 61.0,
            files: vec![FileRecord {
                stem: "t".into(),
                scenario: sc(),
                runs,
            }],
            paper_text: None,
            sweep_md: None,
        };
        summary_md(&header(), &[e])
    }

    #[test]
    fn the_header_says_when_what_and_how_long() {
        let md = one(vec![lab("vqos")]);
        assert!(md.contains("2026-11-24 07:00 UTC"), "{md}");
        assert!(md.contains("commit `abc1234`") && md.contains("duration scale 0.5"));
        assert!(md.contains("total run time 12 min 5 s"), "{md}");
        assert!(md.contains("| [exp](#exp) | 1 min 1 s |"), "{md}");
    }

    #[test]
    fn cells_come_from_the_results_and_the_paper() {
        let md = one(vec![lab("vqos"), lab("htb")]);
        assert!(
            md.contains("| phase | | paper | simulator | lab (`ancs`) | `htb` |"),
            "{md}"
        );
        assert!(
            md.contains("| 1 | vm1 |  | 100.0 | 100.0 | 100.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| 2 | vm2 | 8.63 (Fig. 9) | 50.0 | 40.0 | 40.0 |"),
            "{md}"
        );
        assert!(md.contains("| 2 | unfairness |  | 25.0 % |"), "{md}");
        assert!(
            md.contains("| 2 | largest / smallest | 1.50 (Fig. 9) | 1.00 | 1.50 | 1.50 |"),
            "{md}"
        );
        // Phase 1 has one VM: no unfairness row (neither paper nor expectation speaks of it).
        assert!(!md.contains("| 1 | unfairness |"), "{md}");
        assert!(
            md.contains("| | expectations passed | | 2 / 2 | 1 / 2 | 1 / 2 |"),
            "{md}"
        );
        assert!(md.contains("| 12.3 + 1.0 | 1.0 |"), "{md}");
        assert!(md.contains("![t vqos](img/t.svg)"), "{md}");
    }

    #[test]
    fn a_failed_run_is_shown_as_failed() {
        let mut bad = lab("htb");
        bad.result = Err("Missing tool: iperf3".into());
        bad.plot = None;
        let md = one(vec![lab("vqos"), bad]);
        assert!(
            md.contains("| 2 | vm2 | 8.63 (Fig. 9) | 50.0 | 40.0 | failed |"),
            "{md}"
        );
        assert!(
            md.contains("The `htb` run failed: Missing tool: iperf3"),
            "{md}"
        );
    }

    #[test]
    fn simulator_only_fills_the_simulator_column() {
        let sim = RunRecord {
            baseline: "sim".into(),
            result: Ok(
                json!({"mode": "sim", "engine": "ancs", "phases": phases(50e6, 50e6),
                "simulated": phases(50e6, 50e6), "checks": [{"pass": true}]}),
            ),
            plot: Some("img/t.svg".into()),
        };
        let md = one(vec![sim]);
        assert!(md.contains("| phase | | paper | simulator |\n"), "{md}");
        assert!(md.contains("| 2 | vm1 |  | 50.0 |"), "{md}");
        assert!(md.contains("| | expectations passed | | 1 / 1 |"), "{md}");
    }
}
