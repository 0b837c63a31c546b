//! `vqos lab paper all`: every experiment of [`PAPERS`] in order, into one directory, and a
//! `summary.md` with the paper's, the simulator's and the lab's numbers per figure
//! ([`crate::summary`]).
//!
//! ## Behavior
//! - Each experiment runs as `vqos lab paper NAME` would, into `OUT/<name>/` (its own
//!   `summary.md` and run directories); a failed run is recorded and the others go on; an
//!   interrupt stops the whole run after writing the summary of what finished.
//! - Every run's `rates.svg` is copied to `OUT/img/<file>[-<baseline>].svg` (the sweeps'
//!   `cpu.svg` / `latency.svg` to `OUT/img/<name>.svg`) and linked from the summary.
//! - `sim_only`: no lab, no root: each scenario file is simulated (in seconds) into
//!   `OUT/<name>/<file>/` (`results.json` as `vqos sim --json` plus `simulated`, and a
//!   simulator-only `rates.svg`); the sweeps, which measure CPU and latency the simulator does
//!   not model, get only the paper's numbers.
//! - A file with engine variants ([`crate::variant`]: the controlled fairness files under
//!   `policer`) gets one more table per engine, headed with it, whose simulator column is that
//!   engine's prediction; its plot is `OUT/img/<file>-<engine>.svg`.
//! - The files of [`SIM_ONLY_FILES`] (a paper's own scale, beyond this lab) are simulated in
//!   either mode, as above, after their experiment's lab runs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use vqos_sim::{build_report, simulate, Scenario, BIN_NS};

use crate::paper::{
    self, run_paper_runs, scenarios_dir, PaperOptions, PaperRun, PAPERS, SIM_ONLY_FILES,
    SWEEP_PAPER,
};
use crate::real_load::{PaperSwitch, REAL_LOAD, REAL_LOAD_PAPER};
use crate::run::scale_scenario;
use crate::summary::{self, ExperimentRecord, FileRecord, Header, RunRecord};
use crate::variant::{vqos_variants, Variant};
use crate::LabError;

/// What `vqos lab paper all` runs.
#[derive(Debug, Clone)]
pub struct AllOptions {
    /// Switches (empty: each experiment's [`paper::default_switches`]); the real load
    /// ([`PaperSwitch::RealLoad`]) goes to C2QoS Fig. 6 only.
    pub baselines: Vec<PaperSwitch>,
    /// Output directory.
    pub out_dir: PathBuf,
    /// Multiplies every time of the scenarios.
    pub duration_scale: f64,
    /// The vqosd binary (default: found or built).
    pub vqosd_bin: Option<PathBuf>,
    /// Progress lines on stderr.
    pub progress: bool,
    /// The scenarios directory (default `scenarios/` here, else the workspace's).
    pub scenarios_dir: Option<PathBuf>,
    /// Only the simulator (no root, seconds).
    pub sim_only: bool,
    /// Only these experiments (empty: all of [`PAPERS`]).
    pub only: Vec<String>,
    /// The command line, for the summary's header.
    pub command: String,
    /// Lab runs of each scenario file and switch ([`PaperOptions::repeats`]).
    pub repeats: u32,
    /// Keep the runs a previous invocation finished in `out_dir` ([`crate::resume`]).
    pub resume: bool,
}

/// The short git commit of the current directory's repository, else `unknown`.
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// `YYYY-MM-DD HH:MM UTC` of now.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60
    )
}

fn copy_plot(from: &Path, out: &Path, name: &str) -> Option<String> {
    let rel = format!("img/{name}.svg");
    std::fs::create_dir_all(out.join("img")).ok()?;
    std::fs::copy(from, out.join(&rel)).ok()?;
    Some(rel)
}

fn parse_scaled(file: &Path, scale: f64) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut sc = Scenario::parse(&text).map_err(|e| {
        format!(
            "{}: {}",
            file.display(),
            paper::error_chain(&e as &dyn std::error::Error)
        )
    })?;
    scale_scenario(&mut sc, scale);
    Ok(sc)
}

/// Simulates `sc` into `dir`: `results.json` (the report as `vqos sim --json`, plus its
/// phases again as `simulated`, its whole run as `simulated_whole_run`, and
/// `duration_scale`) and a simulator-only `rates.svg`.
pub fn simulate_into(sc: &Scenario, dir: &Path, scale: f64) -> Result<serde_json::Value, String> {
    let out = simulate(sc, 1).map_err(|e| format!("Simulator: {e}"))?;
    let report = build_report(sc, "sim", &out.bins, BIN_NS, out.cpu_busy);
    let mut v = serde_json::to_value(&report).map_err(|e| e.to_string())?;
    if let Some(o) = v.as_object_mut() {
        crate::output::insert_simulated(o, &report);
        o.insert("duration_scale".into(), scale.into());
    }
    let json = serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
    paper::write(&dir.join("results.json"), &json).map_err(|e| e.to_string())?;
    let svg = crate::output::rates_svg(sc, &[], &out.bins);
    paper::write(&dir.join("rates.svg"), &svg).map_err(|e| e.to_string())?;
    Ok(v)
}

fn sim_experiment(
    opts: &AllOptions,
    name: &str,
    files: &[&str],
    rec: &mut ExperimentRecord,
) -> Result<(), LabError> {
    let dir = opts.scenarios_dir.clone().unwrap_or_else(scenarios_dir);
    for f in files {
        let stem = f.trim_end_matches(".toml").to_string();
        let sc = match parse_scaled(&dir.join(f), opts.duration_scale) {
            Ok(sc) => sc,
            Err(e) => {
                // Without a scenario there is no table; say so in the section.
                let md = rec.sweep_md.get_or_insert_with(String::new);
                let _ = writeln!(md, "`{stem}`: failed: {e}\n");
                continue;
            }
        };
        // The scenario as written, then each engine and algorithm variant it also runs under.
        for v in vqos_variants(f) {
            if crate::sys::interrupted() {
                return Err(LabError::Interrupted);
            }
            let mut sc = sc.clone();
            v.apply(&mut sc);
            let run_name = format!("{stem}{}", v.suffix());
            let run_dir = opts.out_dir.join(name).join(&run_name);
            let result = simulate_into(&sc, &run_dir, opts.duration_scale);
            let plot = result
                .as_ref()
                .ok()
                .and_then(|_| copy_plot(&run_dir.join("rates.svg"), &opts.out_dir, &run_name));
            rec.files.push(FileRecord {
                stem: stem.clone(),
                engine: v.engine.map(|e| e.to_string()),
                algorithms: v.algorithms,
                scenario: sc,
                runs: vec![RunRecord {
                    baseline: "sim".into(),
                    result,
                    plot,
                }],
            });
        }
    }
    Ok(())
}

/// Runs one experiment in the lab into `rec`; returns how many of its runs were kept from an
/// earlier invocation (`--resume`).
fn lab_experiment(
    opts: &AllOptions,
    name: &str,
    files: &[&str],
    rec: &mut ExperimentRecord,
) -> Result<usize, LabError> {
    let exp_dir = opts.out_dir.join(name);
    // The real load is C2QoS Fig. 6's only: the other experiments run the rest of the list,
    // and none of it when the list was the real load alone.
    let switches: Vec<PaperSwitch> = opts
        .baselines
        .iter()
        .copied()
        .filter(|s| name == REAL_LOAD_PAPER || *s != PaperSwitch::RealLoad)
        .collect();
    if !opts.baselines.is_empty() && switches.is_empty() {
        rec.sweep_md = Some(format!(
            "Not run: `--baseline {REAL_LOAD}` is C2QoS Fig. 6's real load only.\n"
        ));
        return Ok(0);
    }
    let po = PaperOptions {
        name: name.to_string(),
        baselines: switches,
        out_dir: exp_dir.clone(),
        duration_scale: opts.duration_scale,
        vqosd_bin: opts.vqosd_bin.clone(),
        progress: opts.progress,
        scenarios_dir: opts.scenarios_dir.clone(),
        repeats: opts.repeats,
        resume: opts.resume,
    };
    let (md, runs) = match run_paper_runs(&po) {
        Ok(o) => {
            rec.after_md = o.real_load_md;
            if name == crate::paper_apps::APPS_PAPER {
                rec.after_md = Some(crate::paper_apps::section_md(&o.runs));
            }
            (o.md, o.runs)
        }
        Err(LabError::Interrupted) => return Err(LabError::Interrupted),
        Err(e) => {
            rec.sweep_md = Some(format!("Failed: {}\n", paper::error_chain(&e)));
            return Ok(0);
        }
    };
    let kept = runs.iter().filter(|r| r.kept).count();
    if files.is_empty() {
        // A sweep: its own table, its plot under img/.
        let plot = ["cpu.svg", "latency.svg"]
            .iter()
            .find(|p| exp_dir.join(p).is_file())
            .and_then(|p| copy_plot(&exp_dir.join(p), &opts.out_dir, name));
        let mut body: String = md.lines().skip(1).collect::<Vec<_>>().join("\n");
        for p in ["cpu.svg", "latency.svg"] {
            let to = plot.clone().unwrap_or_else(|| format!("{name}/{p}"));
            body = body.replace(&format!("]({p})"), &format!("]({to})"));
        }
        rec.sweep_md = Some(body.trim().to_string() + "\n");
        return Ok(kept);
    }
    let dir = opts.scenarios_dir.clone().unwrap_or_else(scenarios_dir);
    for f in files {
        let stem = f.trim_end_matches(".toml").to_string();
        let sc = match parse_scaled(&dir.join(f), opts.duration_scale) {
            Ok(sc) => sc,
            Err(_) => continue, // run_paper_runs recorded it as failed
        };
        for (variant, sc, group) in by_variant(f, &sc, &runs) {
            let file_runs = group
                .iter()
                .map(|r| {
                    let v = Variant {
                        baseline: r.baseline,
                        engine: r.engine,
                        algorithms: r.algorithms,
                    };
                    let mut img = format!("{stem}{}", v.suffix());
                    if opts.repeats > 1 {
                        img.push_str(&format!("-run{}", r.repeat));
                    }
                    let plot = r
                        .result
                        .as_ref()
                        .ok()
                        .and_then(|_| copy_plot(&r.dir.join("rates.svg"), &opts.out_dir, &img));
                    RunRecord {
                        baseline: r.baseline.to_string(),
                        result: r.result.clone(),
                        plot,
                    }
                })
                .collect();
            rec.files.push(FileRecord {
                stem: stem.clone(),
                engine: variant.engine.map(|e| e.to_string()),
                algorithms: variant.algorithms,
                scenario: sc,
                runs: file_runs,
            });
        }
    }
    Ok(kept)
}

/// The runs of scenario file `file` grouped into tables: the scenario as written (with the
/// kernel baselines beside it), then each vqos variant of the file ([`vqos_variants`]: another
/// engine, the papers' algorithms), each with the scenario as that group ran it so that the
/// simulator column is that variant's prediction. Groups without runs (e.g. only
/// `--baseline htb`: no variant ran) are left out.
pub fn by_variant<'a>(
    file: &str,
    sc: &Scenario,
    runs: &'a [PaperRun],
) -> Vec<(Variant, Scenario, Vec<&'a PaperRun>)> {
    let stem = file.trim_end_matches(".toml");
    vqos_variants(file)
        .into_iter()
        .filter_map(|v| {
            let group: Vec<&PaperRun> = runs
                .iter()
                .filter(|r| r.stem == stem && r.engine == v.engine && r.algorithms == v.algorithms)
                .collect();
            if group.is_empty() {
                return None;
            }
            let mut sc = sc.clone();
            v.apply(&mut sc);
            Some((v, sc, group))
        })
        .collect()
}

/// Runs every experiment and writes `OUT/summary.md`; returns its text.
pub fn run_all(opts: &AllOptions) -> Result<String, LabError> {
    if !(opts.duration_scale > 0.0 && opts.duration_scale.is_finite()) {
        return Err(LabError::Invalid(format!(
            "Invalid duration scale {}: expected a positive number",
            opts.duration_scale
        )));
    }
    if let Some(bad) = opts.only.iter().find(|n| !PAPERS.iter().any(|p| p.0 == *n)) {
        let names: Vec<&str> = PAPERS.iter().map(|p| p.0).collect();
        return Err(LabError::Invalid(format!(
            "Unknown experiment '{bad}': expected one of {}",
            names.join(", ")
        )));
    }
    crate::sys::clear_interrupt();
    let t0 = Instant::now();
    let now = crate::resume::RunInfo {
        commit: git_commit(),
        duration_scale: opts.duration_scale,
        repeats: opts.repeats.max(1),
        started: utc_now(),
    };
    let info = if opts.sim_only {
        now
    } else {
        crate::resume::begin(&opts.out_dir, now, opts.resume)?
    };
    let mut kept_runs = 0;
    let mut records = Vec::new();
    let mut interrupted = false;
    let chosen = PAPERS
        .iter()
        .filter(|(n, _)| opts.only.is_empty() || opts.only.iter().any(|o| o == n));
    for (name, files) in chosen {
        if opts.progress {
            eprintln!("== {name}");
        }
        let t = Instant::now();
        let mut rec = ExperimentRecord {
            name: name.to_string(),
            secs: 0.0,
            files: Vec::new(),
            paper_text: SWEEP_PAPER
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, p)| p.to_string()),
            sweep_md: None,
            after_md: None,
        };
        let r = if opts.sim_only {
            if files.is_empty() {
                rec.sweep_md = Some(
                    "Lab only: the simulator does not model the switch's CPU or latency; \
                     run without `--sim-only` as root.\n"
                        .into(),
                );
                Ok(())
            } else {
                sim_experiment(opts, name, files, &mut rec)
            }
        } else {
            lab_experiment(opts, name, files, &mut rec).map(|k| kept_runs += k)
        };
        let r = r.and_then(|()| {
            let extra = SIM_ONLY_FILES.iter().find(|(n, _)| n == name);
            extra.map_or(Ok(()), |(_, f)| sim_experiment(opts, name, f, &mut rec))
        });
        rec.secs = t.elapsed().as_secs_f64();
        records.push(rec);
        match r {
            Ok(()) => {}
            Err(LabError::Interrupted) => {
                interrupted = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let header = Header {
        date: info.started,
        commit: info.commit,
        kept_runs,
        duration_scale: opts.duration_scale,
        total_s: t0.elapsed().as_secs_f64(),
        sim_only: opts.sim_only,
        command: opts.command.clone(),
        repeats: if opts.sim_only {
            1
        } else {
            opts.repeats.max(1)
        },
    };
    let mut md = summary::summary_md(&header, &records);
    if interrupted {
        md.push_str(summary::INTERRUPTED);
    }
    paper::write(&opts.out_dir.join("summary.md"), &md)?;
    if interrupted {
        return Err(LabError::Interrupted);
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::Baseline;
    use vqos_sched::EngineKind;

    #[test]
    fn sim_only_writes_a_section_per_experiment_and_a_plot_per_file() {
        let out = std::env::temp_dir().join(format!("vqos-paper-all-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let opts = AllOptions {
            baselines: vec![],
            out_dir: out.clone(),
            duration_scale: 0.05,
            vqosd_bin: None,
            progress: false,
            scenarios_dir: None,
            repeats: 1,
            resume: false,
            sim_only: true,
            only: vec![],
            command: "test".into(),
        };
        let md = run_all(&opts).unwrap();
        for (name, files) in PAPERS {
            assert!(md.contains(&format!("\n## {name}\n")), "{name}");
            let extra = SIM_ONLY_FILES.iter().filter(|(n, _)| n == name);
            for f in files.iter().chain(extra.flat_map(|(_, f)| f.iter())) {
                let stem = f.trim_end_matches(".toml");
                assert!(md.contains(&format!("### {stem}\n")), "{stem}");
                assert!(out.join(format!("img/{stem}.svg")).is_file(), "{stem}");
                assert!(out.join(format!("{name}/{stem}/results.json")).is_file());
            }
        }
        assert!(md.contains("| 2 | vm5 | 150 (ANCS Fig. 5) |"), "{md}");
        // The controlled fairness files once more under the policer, sim included.
        for stem in ["fairness-static", "fairness-fluctuating"] {
            assert!(
                md.contains(&format!("### {stem} under engine `policer`\n")),
                "{stem}"
            );
            assert!(out.join(format!("img/{stem}-policer.svg")).is_file());
            let json = out.join(format!("{stem}/{stem}-policer/results.json"));
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
            assert_eq!(v["engine"], "policer", "{stem}");
        }
        assert!(
            md.contains("| phase | | paper | simulator (`policer`) |"),
            "{md}"
        );
        assert!(
            !md.contains("fairness-static-uncontrolled under engine"),
            "{md}"
        );
        assert_eq!(std::fs::read_to_string(out.join("summary.md")).unwrap(), md);
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn a_bad_scale_is_refused() {
        let opts = AllOptions {
            baselines: vec![],
            out_dir: PathBuf::from("/nonexistent"),
            duration_scale: 0.0,
            vqosd_bin: None,
            progress: false,
            scenarios_dir: None,
            repeats: 1,
            resume: false,
            sim_only: true,
            only: vec![],
            command: String::new(),
        };
        assert!(run_all(&opts).unwrap_err().to_string().contains("scale"));
        let opts = AllOptions {
            duration_scale: 1.0,
            only: vec!["ancs-fig99".into()],
            ..opts
        };
        assert!(run_all(&opts)
            .unwrap_err()
            .to_string()
            .contains("ancs-fig99"));
    }

    fn run(stem: &str, baseline: Baseline, engine: Option<EngineKind>) -> PaperRun {
        PaperRun {
            stem: stem.into(),
            baseline,
            engine,
            algorithms: vqos_sched::Variant::Vqos,
            repeat: 1,
            dir: PathBuf::from("/nonexistent"),
            result: Err("not run".into()),
            kept: false,
        }
    }

    #[test]
    fn runs_are_grouped_into_a_table_per_variant() {
        let dir = scenarios_dir();
        let sc = parse_scaled(&dir.join("fairness-static.toml"), 1.0).unwrap();
        let paper = PaperRun {
            algorithms: vqos_sched::Variant::Paper,
            ..run("fairness-static", Baseline::Vqos, None)
        };
        let runs = vec![
            run("fairness-static-uncontrolled", Baseline::Vqos, None),
            run("fairness-static", Baseline::Vqos, None),
            run("fairness-static", Baseline::Vqos, Some(EngineKind::Policer)),
            paper,
            run("fairness-static", Baseline::Htb, None),
        ];
        let g = by_variant("fairness-static.toml", &sc, &runs);
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].0, Variant::plain(Baseline::Vqos));
        assert_eq!(g[0].1.engine, EngineKind::Vqos);
        let b: Vec<Baseline> = g[0].2.iter().map(|r| r.baseline).collect();
        assert_eq!(b, [Baseline::Vqos, Baseline::Htb]);
        assert_eq!(g[1].0.engine, Some(EngineKind::Policer));
        assert_eq!(g[1].1.engine, EngineKind::Policer);
        assert_eq!(g[1].2.len(), 1);
        // The papers' algorithms: the file's engine, its variant paper, in the simulator too.
        assert_eq!(g[2].0.suffix(), "-paper");
        assert_eq!(g[2].1.engine, EngineKind::Vqos);
        assert_eq!(g[2].1.variant, vqos_sched::Variant::Paper);
        assert_eq!(g[2].2.len(), 1);
        // Only a kernel baseline ran: no variant tables.
        let only_htb = vec![run("fairness-static", Baseline::Htb, None)];
        let g = by_variant("fairness-static.toml", &sc, &only_htb);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].0, Variant::plain(Baseline::Vqos));
    }
}
