//! The columns of a file's table in `summary.md`: the simulator, then one per switch, each over
//! every repeat of its run (`vqos lab paper --runs N`).
//!
//! ## Behavior
//! - A switch that ran several times is one column: a rate, unfairness or ratio cell is the
//!   mean over the runs that succeeded, with their range in brackets (`412.3 [405.1–418.0]`);
//!   a single run is its value alone, so a summary of single runs reads as before.
//! - Cells that are not one number (probe RTTs, expectations passed, CPU) list each run's
//!   value in run order, separated by ` · `; a failed run is "failed" in the expectations row.
//! - A column whose runs all failed is "failed" throughout; the errors are listed under the
//!   table (by the caller).

use serde_json::Value;

use super::{latency_cell, FileRecord};

/// One run's parts of `results.json` a table reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct RunView<'a> {
    pub phases: Option<&'a Vec<Value>>,
    /// The whole run as one phase (`whole_run`), when the scenario asks for it.
    pub whole: Option<&'a Value>,
    pub checks: Option<&'a Vec<Value>>,
    /// The probes' results (`latency`; `None`: not measured).
    pub latency: Option<&'a Vec<Value>>,
}

impl<'a> RunView<'a> {
    /// Phase `phase` (1-based; 0: the whole run), as `results.json` has it.
    pub fn phase(&self, phase: usize) -> Option<&'a Value> {
        match phase {
            0 => self.whole,
            n => self.phases?.get(n - 1),
        }
    }
}

/// One column: its heading, each run (in order; `Err` for a failed one) and its CPU text.
pub(super) struct Column<'a> {
    pub head: String,
    /// The switch (`vqos`, a kernel baseline) or `sim`.
    pub switch: &'a str,
    pub runs: Vec<Result<(RunView<'a>, Option<String>), &'a str>>,
}

impl<'a> Column<'a> {
    /// The runs that succeeded.
    pub fn ok(&self) -> impl Iterator<Item = &RunView<'a>> {
        self.runs
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|(v, _)| v))
    }

    /// Every run failed.
    pub fn failed(&self) -> bool {
        self.ok().next().is_none()
    }

    /// The errors of the failed runs, in order.
    pub fn errors(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.runs.iter().filter_map(|r| r.as_ref().err().copied())
    }

    /// Each run's CPU text ("failed" for a failed run), or `None` when no run measured it.
    pub fn cpu(&self) -> Option<String> {
        let cells: Vec<String> = self
            .runs
            .iter()
            .map(|r| match r {
                Ok((_, cpu)) => cpu.clone().unwrap_or_else(|| "–".into()),
                Err(_) => "failed".into(),
            })
            .collect();
        self.runs
            .iter()
            .any(|r| matches!(r, Ok((_, Some(_)))))
            .then(|| cells.join(" · "))
    }

    /// Expectations passed per run, `pass / total`, or "–" when no run checked any.
    pub fn checks_cell(&self) -> String {
        if self.failed() {
            return "failed".into();
        }
        let cells: Vec<String> = self
            .runs
            .iter()
            .map(|r| match r {
                Ok((v, _)) => v.checks.map_or("–".into(), |ch| {
                    let pass = ch
                        .iter()
                        .filter(|x| x.get("pass").and_then(Value::as_bool) == Some(true))
                        .count();
                    format!("{pass} / {}", ch.len())
                }),
                Err(_) => "failed".into(),
            })
            .collect();
        cells.join(" · ")
    }

    /// A numeric cell: the mean over the runs with a value, and their range when more than one.
    pub fn number(
        &self,
        value: impl Fn(&RunView) -> Option<f64>,
        fmt: impl Fn(f64) -> String,
    ) -> String {
        if self.failed() {
            return "failed".into();
        }
        spread(&self.ok().filter_map(value).collect::<Vec<_>>(), fmt)
    }

    /// A probe's cell, one per run.
    pub fn latency(&self, vm: &str, protocol: &str, phase: usize) -> String {
        if self.failed() {
            return "failed".into();
        }
        let cells: Vec<String> = self
            .ok()
            .map(|v| latency_cell(v.latency, vm, protocol, phase))
            .collect();
        cells.join(" · ")
    }
}

/// `values`' mean formatted by `fmt`, with `[min–max]` when there are two or more; "–" for none.
pub fn spread(values: &[f64], fmt: impl Fn(f64) -> String) -> String {
    match values {
        [] => "–".into(),
        [v] => fmt(*v),
        _ => {
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
            let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            format!("{} [{}–{}]", fmt(mean), fmt(min), fmt(max))
        }
    }
}

fn view(v: &Value) -> RunView<'_> {
    RunView {
        phases: v.get("phases").and_then(Value::as_array),
        whole: v.get("whole_run"),
        checks: v.get("checks").and_then(Value::as_array),
        latency: v.get("latency").and_then(Value::as_array),
    }
}

/// The simulator's column, then one per switch in the order the switches first ran; a switch's
/// repeats are that column's runs.
pub(super) fn columns(f: &FileRecord) -> Vec<Column<'_>> {
    let ok = || f.runs.iter().filter_map(|r| r.result.as_ref().ok());
    let sim = ok().find_map(|v| v.get("simulated")?.as_array());
    let sim_checks = ok().find_map(|v| {
        if v.get("mode").and_then(Value::as_str) == Some("sim") {
            v.get("checks")?.as_array()
        } else {
            v.get("simulated_checks")?.as_array()
        }
    });
    let sim_whole = ok().find_map(|v| v.get("simulated_whole_run"));
    let sim_view = RunView {
        phases: sim,
        whole: sim_whole,
        checks: sim_checks,
        latency: None,
    };
    let mut cols = vec![Column {
        head: format!("simulator (`{}`)", f.scenario.engine.name()),
        switch: "sim",
        runs: vec![Ok((sim_view, None))],
    }];
    let mut switches: Vec<&str> = Vec::new();
    for r in f.runs.iter().filter(|r| r.baseline != "sim") {
        if !switches.contains(&r.baseline.as_str()) {
            switches.push(&r.baseline);
        }
    }
    for b in switches {
        let runs: Vec<_> = f.runs.iter().filter(|r| r.baseline == b).collect();
        let engine = runs
            .iter()
            .filter_map(|r| r.result.as_ref().ok())
            .find_map(|v| v.get("engine")?.as_str());
        let head = if b == "vqos" {
            format!("lab (`{}`)", engine.unwrap_or(f.scenario.engine.name()))
        } else {
            format!("`{b}`")
        };
        let runs = runs
            .iter()
            .map(|r| match &r.result {
                Ok(v) => Ok((view(v), cpu_text(b, v))),
                Err(e) => Err(e.as_str()),
            })
            .collect();
        cols.push(Column {
            head,
            switch: b,
            runs,
        });
    }
    cols
}

/// A run's switch CPU, % of a core: vqosd + softirq for `vqos`, softirq for the others.
fn cpu_text(baseline: &str, v: &Value) -> Option<String> {
    let c = v.get("cpu")?;
    let p = |k: &str| c.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    Some(if baseline == "vqos" {
        format!("{:.1} + {:.1}", p("vqosd_percent"), p("softirq_percent"))
    } else {
        format!("{:.1}", p("softirq_percent"))
    })
}
