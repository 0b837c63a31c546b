//! The verdict tables of docs/experiments.md: for each paper, a row per claim of the paper
//! that a scenario file checks, with how many of the run's lab runs met it under vqos, under
//! the papers' algorithms as written (`paper-literal`) and under another engine the paper
//! enforced with, each run's measurement, and the verdict.
//!
//! ## Behavior
//! - A claim is a key of a scenario file's `[claims]` (the paper's statement, its number and
//!   where the paper gives it); the file's `[[expect]]`s and `[[probe]]`s name the claim they
//!   check (`claim = "id"`). A run meets a claim when every check naming it passed in that run.
//!   Checks that name no claim are ours (the link full, a sanity bound): they are counted
//!   under each paper's table, never in a verdict.
//! - The verdict is the `vqos` column's (the scenario as written): **reproduced** when every
//!   lab run met the claim, **not reproduced** when none did, **in k of n runs** otherwise,
//!   **not run** without runs. The paper-literal and engine columns show what the departure
//!   or the paper's own enforcement changes.
//! - Built from the run directory's `results.json` files ([`crate::paper_all`]'s layout:
//!   `DIR/<experiment>/<file><variant>[-run<k>]/`) and this checkout's scenario files: a run's
//!   checks are matched to the file's expectations by position, so a run whose checks do not
//!   line up with the file (a different count, or a phase that differs) is refused by name
//!   rather than mislabelled. Publish from a checkout whose scenario files the run used, or
//!   that only added claims to them.
//! - The sweeps (ANCS Fig. 8, Tables 1–2: [`sweeps`], from their CSV files) and the sections
//!   that judge claims themselves (C2QoS Fig. 6's real load, Fig. 6(f)-(g)'s applications:
//!   [`sections`], with the functions those sections use) have rows too, so every figure and
//!   table of the four papers has its verdict here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use vqos_sim::Scenario;

use crate::paper::{run_name, PAPERS};

pub mod sections;
pub mod sweeps;
use crate::variant::{vqos_variants, Variant};
use crate::LabError;

/// One lab run of a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum RunVerdict {
    /// Every check of the claim passed; what they measured.
    Met(Vec<String>),
    /// Some did not: `expectation: measured` of each that failed.
    Missed(Vec<String>),
    /// No result (the run failed or is missing), with why.
    NoResult(String),
    /// Its checks passed, but the baseline it is a claim against did not fail in the same
    /// run ([`AGAINST`]): no difference shown.
    NotShown(String),
}

/// A claim of a scenario file, under each of the file's vqos variants.
#[derive(Debug, Clone)]
pub struct ClaimRow {
    /// The experiment (`ancs-fig5`).
    pub experiment: String,
    /// The file's stem.
    pub stem: String,
    /// The claim's id (its key in the file's `[claims]`).
    pub id: String,
    /// The claim's text.
    pub claim: String,
    /// Column label (`vqos`, `paper-literal`, an engine) → its runs.
    pub cells: Vec<(String, Vec<RunVerdict>)>,
}

/// A run's claims (claim id → its verdict), or why the run has none.
type RunClaims = Result<BTreeMap<String, RunVerdict>, String>;

/// The column a vqos variant's runs fill.
pub fn column(v: &Variant) -> String {
    match (v.engine, v.algorithms) {
        (Some(e), _) => e.to_string(),
        (None, vqos_sched::Variant::Paper) => "paper-literal".into(),
        (None, _) => "vqos".into(),
    }
}

/// Which claim each of a run's checks belongs to, in the order the lab reports them: the
/// expectations, then the probes' expectations (`probe_claims`, one per probe with
/// `p99_within`).
fn check_claims<'a>(sc: &'a Scenario, probe_claims: &'a [Option<String>]) -> Vec<Option<&'a str>> {
    (sc.expectations.iter().map(|x| x.claim.as_deref()))
        .chain(probe_claims.iter().map(|c| c.as_deref()))
        .collect()
}

/// The claims of one run: claim id → its verdict. `Err` when the run's checks do not line up
/// with the file's.
pub fn run_claims(sc: &Scenario, probe_claims: &[Option<String>], result: &Value) -> RunClaims {
    let owners = check_claims(sc, probe_claims);
    let checks = result["checks"].as_array().cloned().unwrap_or_default();
    if checks.len() != owners.len() {
        return Err(format!(
            "{} checks in the run, {} in the file",
            checks.len(),
            owners.len()
        ));
    }
    let mut out: BTreeMap<String, RunVerdict> = BTreeMap::new();
    for (i, (c, owner)) in checks.iter().zip(&owners).enumerate() {
        let what = c["expectation"].as_str().unwrap_or("");
        if let Some(x) = sc.expectations.get(i) {
            if !what.starts_with(&format!("{}:", x.phase_label())) {
                return Err(format!(
                    "check {} is `{what}`, the file's is about {}",
                    i + 1,
                    x.phase_label()
                ));
            }
        }
        let Some(id) = owner else { continue };
        let measured = c["measured"].as_str().unwrap_or("").to_string();
        let entry = out
            .entry(id.to_string())
            .or_insert(RunVerdict::Met(Vec::new()));
        match (c["pass"].as_bool() == Some(true), entry) {
            (true, RunVerdict::Met(m)) => m.push(measured),
            (true, _) => {}
            (false, e @ RunVerdict::Met(_)) => {
                *e = RunVerdict::Missed(vec![format!("{what}: {measured}")])
            }
            (false, RunVerdict::Missed(m)) => m.push(format!("{what}: {measured}")),
            (false, RunVerdict::NoResult(_) | RunVerdict::NotShown(_)) => {}
        }
    }
    Ok(out)
}

/// The claims a file's checks name, each once, in the order they are first checked.
fn claim_order(sc: &Scenario, probe_claims: &[Option<String>]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for id in check_claims(sc, probe_claims).into_iter().flatten() {
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_string());
        }
    }
    ids
}

/// The rows of one scenario file: `runs` holds, per vqos variant that ran, its runs' results
/// (or why there is none).
pub fn file_rows(
    experiment: &str,
    stem: &str,
    sc: &Scenario,
    probe_claims: &[Option<String>],
    runs: &[(String, Vec<Result<Value, String>>)],
) -> Vec<ClaimRow> {
    let per_column: Vec<(String, Vec<RunClaims>)> = runs
        .iter()
        .map(|(col, rs)| {
            let verdicts = rs
                .iter()
                .map(|r| {
                    r.as_ref()
                        .map_err(Clone::clone)
                        .and_then(|v| run_claims(sc, probe_claims, v))
                })
                .collect();
            (col.clone(), verdicts)
        })
        .collect();
    claim_order(sc, probe_claims)
        .into_iter()
        .map(|id| ClaimRow {
            experiment: experiment.to_string(),
            stem: stem.to_string(),
            id: id.clone(),
            claim: sc.claim_text(&id).unwrap_or(&id).to_string(),
            cells: (per_column.iter())
                .map(|(col, rs)| {
                    let cell = rs
                        .iter()
                        .map(|r| match r {
                            Ok(m) => m.get(&id).cloned().unwrap_or_else(|| {
                                RunVerdict::NoResult("the claim's checks are missing".into())
                            }),
                            Err(e) => RunVerdict::NoResult(e.clone()),
                        })
                        .collect();
                    (col.clone(), cell)
                })
                .collect(),
        })
        .collect()
}

/// `reproduced`, `not reproduced`, `in k of n runs` or `not run`, from a column's runs.
pub fn verdict(runs: &[RunVerdict]) -> String {
    let met = runs
        .iter()
        .filter(|r| matches!(r, RunVerdict::Met(_)))
        .count();
    let judged = runs
        .iter()
        .filter(|r| !matches!(r, RunVerdict::NoResult(_)))
        .count();
    match (met, judged) {
        (_, 0) => "not run".into(),
        (m, n) if m == n && n == runs.len() => "**reproduced**".into(),
        (0, _) => "**not reproduced**".into(),
        (m, _) => format!("in {m} of {} runs", runs.len()),
    }
}

/// A column's cell: `met / runs`, then each run's measurement (` · `-separated): what a
/// one-check claim measured, else the checks that failed.
fn cell(runs: &[RunVerdict]) -> String {
    let mut why: Vec<&str> = Vec::new();
    for r in runs {
        match r {
            RunVerdict::NoResult(e) if !why.contains(&e.as_str()) => why.push(e),
            RunVerdict::NoResult(_) => {}
            _ => why.clear(),
        }
        if why.is_empty() {
            break;
        }
    }
    if !why.is_empty() {
        return format!("no result ({})", why.join("; ").replace('|', "\\|"));
    }
    let met = runs
        .iter()
        .filter(|r| matches!(r, RunVerdict::Met(_)))
        .count();
    let each: Vec<String> = runs
        .iter()
        .map(|r| match r {
            RunVerdict::Met(m) if m.len() == 1 => m[0].clone(),
            RunVerdict::Met(m) => format!("all {} met", m.len()),
            RunVerdict::Missed(f) => format!("missed {}", f.join("; ")),
            RunVerdict::NoResult(e) => format!("no result ({e})"),
            RunVerdict::NotShown(why) => format!("not shown ({why})"),
        })
        .collect();
    format!(
        "{met} / {}: {}",
        runs.len(),
        each.join(" · ").replace('|', "\\|")
    )
}

/// The paper an experiment belongs to, by its name.
fn paper_of(experiment: &str) -> &'static str {
    [
        ("ancs-", "ANCS"),
        ("fairness-", "The fairness paper"),
        ("c2qos-", "C2QoS"),
        ("pid-ecn-", "PID-ECN"),
    ]
    .iter()
    .find(|(p, _)| experiment.starts_with(p))
    .map_or("Other", |(_, n)| n)
}

/// Claims made *against* a baseline, `(file, claim, baseline's file, baseline's claim)`: the
/// paper's C2TB keeps a VM's rate where the byte policer loses it. A run of the first meets
/// its claim only when run `k` of the second met the baseline's (the policer lost): where the
/// policer kept the rate too, the run shows no difference (issue 25).
pub const AGAINST: &[(&str, &str, &str, &str)] = &[
    (
        "c2qos-fig1-lab-c2qos",
        "keeps",
        "c2qos-fig1-lab-tcm",
        "loses",
    ),
    (
        "c2qos-fig6-lab-c2qos",
        "keeps",
        "c2qos-fig6-lab-tcm",
        "loses",
    ),
    ("c2qos-fig6fg-c2qos", "ftp", "c2qos-fig6fg-tcm", "ftp"),
    ("c2qos-fig6fg-c2qos-hbs", "ftp", "c2qos-fig6fg-tcm", "ftp"),
];

/// Applies [`AGAINST`] to the `vqos` column of `rows`, run by run.
pub fn hold_against_baselines(rows: &mut [ClaimRow]) {
    let vqos_runs = |rows: &[ClaimRow], stem: &str, id: &str| -> Option<Vec<RunVerdict>> {
        let r = rows.iter().find(|r| r.stem == stem && r.id == id)?;
        let (_, runs) = r.cells.iter().find(|(c, _)| c == "vqos")?;
        Some(runs.clone())
    };
    for (stem, id, base_stem, base_id) in AGAINST {
        let Some(base) = vqos_runs(rows, base_stem, base_id) else {
            continue;
        };
        let Some(row) = rows.iter_mut().find(|r| r.stem == *stem && r.id == *id) else {
            continue;
        };
        for (col, runs) in row.cells.iter_mut() {
            if col != "vqos" {
                continue;
            }
            for (k, run) in runs.iter_mut().enumerate() {
                let lost = matches!(base.get(k), Some(RunVerdict::Met(_)));
                if matches!(run, RunVerdict::Met(_)) && !lost {
                    *run = RunVerdict::NotShown(format!(
                        "`{base_stem}` did not lose it in run {}",
                        k + 1
                    ));
                }
            }
        }
    }
}

/// The verdict tables (Markdown) of `rows`, one per paper; `ours` counts, per experiment, the
/// checks that name no claim.
pub fn tables_md(rows: &[ClaimRow], ours: &BTreeMap<String, usize>) -> String {
    let mut s = String::new();
    let mut papers: Vec<&str> = Vec::new();
    for (name, _) in PAPERS {
        let p = paper_of(name);
        if !papers.contains(&p) {
            papers.push(p);
        }
    }
    for paper in papers {
        let mut mine: Vec<&ClaimRow> = rows
            .iter()
            .filter(|r| paper_of(&r.experiment) == paper)
            .collect();
        mine.sort_by_key(|r| PAPERS.iter().position(|(n, _)| *n == r.experiment));
        if mine.is_empty() {
            continue;
        }
        let mut cols: Vec<String> = Vec::new();
        for r in &mine {
            for (c, _) in &r.cells {
                if !cols.contains(c) {
                    cols.push(c.clone());
                }
            }
        }
        cols.sort_by_key(|c| match c.as_str() {
            "vqos" => 0,
            "paper-literal" => 2,
            _ => 1,
        });
        let _ = write!(
            s,
            "\n#### {paper}\n\n| experiment (file) | the paper's claim |"
        );
        for c in &cols {
            let _ = write!(s, " {c}: runs met |");
        }
        s.push_str(" verdict |\n|---|---|");
        s.push_str(&"---|".repeat(cols.len() + 1));
        s.push('\n');
        for r in &mine {
            let _ = write!(
                s,
                "| [{}](paper-lab.md#{}) (`{}`) | {} |",
                r.experiment,
                r.experiment,
                r.stem,
                r.claim.replace('|', "\\|")
            );
            for c in &cols {
                let text = (r.cells.iter().find(|(k, _)| k == c))
                    .map_or("–".to_string(), |(_, runs)| cell(runs));
                let _ = write!(s, " {text} |");
            }
            let v = (r.cells.iter().find(|(k, _)| k == "vqos"))
                .map_or("not run".to_string(), |(_, runs)| verdict(runs));
            let _ = writeln!(s, " {v} |");
        }
        let own: Vec<String> = (ours.iter())
            .filter(|(e, n)| paper_of(e) == paper && **n > 0)
            .map(|(e, n)| format!("{e} {n}"))
            .collect();
        if !own.is_empty() {
            let _ = writeln!(
                s,
                "\nChecks of ours, not claims of the paper (not counted above): {}.",
                own.join(", ")
            );
        }
    }
    s
}

/// Reads the run in `run_dir` against the scenario files in `scenarios_dir` and returns its
/// verdict tables, headed by the run's date, commit and runs per cell.
pub fn verdicts_md(run_dir: &Path, scenarios_dir: &Path) -> Result<String, LabError> {
    let info_path = run_dir.join("run-info.json");
    let info: crate::resume::RunInfo = std::fs::read_to_string(&info_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            LabError::Invalid(format!(
                "{}: missing or not a run's info",
                info_path.display()
            ))
        })?;
    let mut rows = Vec::new();
    let mut ours = BTreeMap::new();
    for (experiment, files) in PAPERS {
        for f in files.iter() {
            let path = scenarios_dir.join(f);
            let text = std::fs::read_to_string(&path).map_err(|source| LabError::Io {
                what: path.display().to_string(),
                source,
            })?;
            let sc = Scenario::parse(&text).map_err(|source| LabError::Scenario {
                file: path.display().to_string(),
                source,
            })?;
            let probe_claims: Vec<Option<String>> = crate::probe::parse_probes(&text, &sc)?
                .into_iter()
                .filter(|p| p.p99_within.is_some())
                .map(|p| p.claim)
                .collect();
            *ours.entry(experiment.to_string()).or_insert(0) += check_claims(&sc, &probe_claims)
                .iter()
                .filter(|c| c.is_none())
                .count();
            let stem = f.trim_end_matches(".toml");
            let runs: Vec<(String, Vec<Result<Value, String>>)> = vqos_variants(f)
                .iter()
                .map(|v| {
                    let rs = (1..=info.repeats.max(1))
                        .map(|k| {
                            let name = run_name(stem, &v.suffix(), k, info.repeats);
                            read_result(&run_dir.join(experiment).join(name))
                        })
                        .collect();
                    (column(v), rs)
                })
                .collect();
            rows.extend(file_rows(experiment, stem, &sc, &probe_claims, &runs));
        }
    }
    let read = |p: &str| std::fs::read_to_string(run_dir.join(p)).ok();
    rows.push(sweeps::fig8(read("ancs-fig8/cpu.csv").as_deref()));
    rows.extend(sweeps::tables(read("ancs-table1-2/latency.csv").as_deref()));
    rows.extend(sections::real_load(
        &run_dir.join(crate::real_load::REAL_LOAD_PAPER),
    ));
    let apps = crate::paper_apps::APPS_PAPER;
    let apps_runs: Vec<[Result<Value, String>; 4]> = (1..=info.repeats.max(1))
        .map(|k| {
            ["native", "tcm", "c2qos", "c2qos-hbs"].map(|f| {
                let name = run_name(&format!("{apps}-{f}"), "", k, info.repeats);
                read_result(&run_dir.join(apps).join(name))
            })
        })
        .collect();
    rows.extend(sections::apps(&apps_runs));
    hold_against_baselines(&mut rows);
    Ok(format!(
        "Generated by `vqos lab publish` from the run of {} (commit `{}`, {} lab run{} per \
         cell); do not edit by hand. A cell reads `runs that met the claim / runs: each run's \
         measurement`.\n{}",
        info.started,
        info.commit,
        info.repeats,
        if info.repeats == 1 { "" } else { "s" },
        tables_md(&rows, &ours)
    ))
}

/// A run directory's `results.json`, or why there is none.
fn read_result(dir: &Path) -> Result<Value, String> {
    let p = dir.join("results.json");
    let text = std::fs::read_to_string(&p).map_err(|_| "not run".to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

#[cfg(test)]
#[path = "verdict_tests.rs"]
mod tests;
