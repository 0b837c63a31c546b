//! `vqos lab paper NAME`: the papers' experiments, each as one or more lab runs under `--out`.
//!
//! ## Behavior
//! - Scenario-file experiments ([`PAPERS`]) run their files from `scenarios/` (the current
//!   directory's, else the workspace's) under each requested baseline, into
//!   and, under `vqos`, each engine the paper enforced with ([`crate::variant`]: the fairness
//!   files also under `policer`), into `OUT/<file stem>[-<baseline>|-<engine>]/`, and write
//!   `OUT/summary.md` with one line per run.
//! - `ancs-fig8` sweeps 1..=8 VMs (greedy TCP, weight 1, 940 Mbit/s) under `bridge`, `htb` and
//!   `vqos` (or the `--baseline`s given), one short run each (8 s × the duration scale), and
//!   writes `OUT/cpu.csv`, a table in `summary.md` and `cpu.svg`: the switch's CPU = vqosd's
//!   process time plus the kernel's softirq time for `vqos`, the softirq time for the kernel
//!   baselines (% of one core).
//! - `ancs-table1-2` sweeps 1..=5 loading VMs (greedy TCP) beside a probe VM `vm0` that sends
//!   nothing but a UDP (ping-like) and a TCP (TCP_RR-like) 64-byte probe, 500/s each, under
//!   `vqos` and `bridge` (or the given baselines), 10 s × the scale each; `OUT/latency.csv`, a
//!   table in `summary.md` and `latency.svg` (p99 vs number of VMs).
//! - The generated scenarios are kept in `OUT/scenarios/` so every run can be repeated alone.
//!
//! ## Limitations
//! - Runs are sequential and each builds and tears down its own topology; a failed run is
//!   recorded in the summary and the sweep goes on.
//! - On a 2-core machine the CPU numbers include the generators' contention; they compare
//!   switches on the same machine, not with the paper's Xen driver domain.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::plot::{Line, Plot, Style};
use crate::real_load::{self, lab_baselines, PaperSwitch, REAL_LOAD_PAPER};
use crate::run::{run_lab, LabOptions, LabOutcome};
use crate::topo::Baseline;
use crate::variant::{variants, Variant};
use crate::LabError;
use vqos_sched::EngineKind;

mod sweeps;
use sweeps::{sweep_cpu, sweep_latency};

/// The experiments `vqos lab paper` knows, with their scenario files (empty: a sweep).
pub const PAPERS: &[(&str, &[&str])] = &[
    ("ancs-fig4", &["ancs-fig4.toml"]),
    ("ancs-fig5", &["ancs-fig5.toml"]),
    ("ancs-fig6", &["ancs-fig6.toml"]),
    ("ancs-fig8", &[]),
    ("ancs-table1-2", &[]),
    (
        "fairness-static",
        &["fairness-static-uncontrolled.toml", "fairness-static.toml"],
    ),
    (
        "fairness-fluctuating",
        &[
            "fairness-fluctuating-uncontrolled.toml",
            "fairness-fluctuating.toml",
        ],
    ),
    (
        "fairness-path",
        &["fairness-path-uncontrolled.toml", "fairness-path.toml"],
    ),
    (
        "c2qos-fig1",
        &[
            "c2qos-fig1-lab-tcm.toml",
            "c2qos-fig1-lab-c2qos.toml",
            "c2qos-fig1c-tcm.toml",
        ],
    ),
    (
        "c2qos-fig6",
        &[
            "c2qos-fig6-lab-tcm.toml",
            "c2qos-fig6-lab-c2qos.toml",
            "c2qos-fig6-latency-tcm.toml",
            "c2qos-fig6-latency-c2qos-hbs.toml",
        ],
    ),
    (
        "c2qos-fig6fg",
        &[
            "c2qos-fig6fg-native.toml",
            "c2qos-fig6fg-tcm.toml",
            "c2qos-fig6fg-c2qos.toml",
            "c2qos-fig6fg-c2qos-hbs.toml",
        ],
    ),
    (
        "pid-ecn-unequal",
        &["pid-ecn-unequal-uncontrolled.toml", "pid-ecn-unequal.toml"],
    ),
    (
        "pid-ecn-receiver-cpu",
        &[
            "pid-ecn-receiver-cpu-uncontrolled.toml",
            "pid-ecn-receiver-cpu.toml",
        ],
    ),
    (
        "pid-ecn-start-stop",
        &["pid-ecn-start-stop.toml", "pid-ecn-upload-download.toml"],
    ),
    (
        "pid-ecn-mixed",
        &["pid-ecn-mixed-uncontrolled.toml", "pid-ecn-mixed.toml"],
    ),
];

/// Scenario files `vqos lab paper all` only simulates, beside an experiment's lab files: the
/// paper's own scale, which this lab cannot generate (C2QoS at 10 Gbit/s).
pub const SIM_ONLY_FILES: &[(&str, &[&str])] = &[
    (
        "c2qos-fig1",
        &["c2qos-fig1-tcm.toml", "c2qos-fig1-c2qos.toml"],
    ),
    (
        "c2qos-fig6",
        &["c2qos-fig6-tcm.toml", "c2qos-fig6-c2qos.toml"],
    ),
];

/// The switches an experiment runs under when none are given: `vqos`, and the kernel
/// baselines docs/experiments.md compares it with (ANCS Fig. 4: the bridge as native Xen;
/// Fig. 5: HTB and the bridge; Fig. 6: HTB; the sweeps: see [`run_paper`]); C2QoS Fig. 6
/// also on a real load ([`crate::real_load`], with OVS-DPDK: the paper's own baseline).
pub fn default_switches(name: &str) -> Vec<PaperSwitch> {
    let lab = match name {
        "ancs-fig4" => vec![Baseline::Vqos, Baseline::Bridge],
        "ancs-fig5" => vec![Baseline::Vqos, Baseline::Htb, Baseline::Bridge],
        "ancs-fig6" => vec![Baseline::Vqos, Baseline::Htb],
        _ => vec![Baseline::Vqos],
    };
    let mut out: Vec<PaperSwitch> = lab.into_iter().map(PaperSwitch::Lab).collect();
    if name == REAL_LOAD_PAPER {
        out.push(PaperSwitch::RealLoad);
    }
    out
}

/// What the papers report for the sweeps, which have no scenario file to carry `[[paper]]`.
pub const SWEEP_PAPER: &[(&str, &str)] = &[
    (
        "ancs-fig8",
        "ANCS Fig. 8 (driver-domain CPU for 1..8 VMs; a plot, no numbers in the text): \
         ANCS's CPU is comparable to native Xen's, the Linux traffic controller's is \
         non-negligible.",
    ),
    (
        "ancs-table1-2",
        "ANCS Table 1 (ping, 64-byte UDP): 0.23–0.34 ms for 1..5 VMs under native Xen, the \
         traffic controller and ANCS alike; Table 2 (netperf TCP_RR): 0.12–0.13 ms; flat in N.",
    ),
];

/// What `vqos lab paper` runs.
#[derive(Debug, Clone)]
pub struct PaperOptions {
    /// One of [`PAPERS`].
    pub name: String,
    /// Switches (empty: the experiment's defaults, [`default_switches`]).
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
    /// Lab runs of each scenario file and switch (at least 1): the summary shows their mean
    /// and range. The sweeps and the real load run once.
    pub repeats: u32,
    /// Keep the runs a previous invocation finished in `out_dir` ([`crate::resume`]).
    pub resume: bool,
}

/// `rel` (a path in the repository) under the current directory when `probe` (a file under
/// it) is there, else in the workspace this crate was built from.
pub(crate) fn repo_path(rel: &str, probe: &str) -> PathBuf {
    let here = PathBuf::from(rel);
    if here.join(probe).is_file() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// Where the scenario files are.
pub fn scenarios_dir() -> PathBuf {
    repo_path("scenarios", "ancs-fig5.toml")
}

/// A scenario of `n` greedy TCP VMs with weight 1 for `secs` seconds (ANCS Fig. 8), sending
/// MTU frames as the paper's VMs did through netback (`tso = false`).
pub fn cpu_scenario(n: usize, secs: u32) -> String {
    let mut s = format!(
        "name = \"ancs-fig8-{n}vms\"\ndescription = \"ANCS Fig. 8: {n} VMs, greedy TCP, \
         weight 1, switch CPU\"\nduration = \"{secs}s\"\ncapacity = \"940Mbit\"\n\
         engine = \"ancs\"\nsettle = \"2s\"\n\n[topology]\ntso = false\n"
    );
    for i in 1..=n {
        let _ = write!(s, "\n[[vm]]\nname = \"vm{i}\"\nweight = 1\n");
    }
    s
}

/// A scenario of a probe VM `vm0` (no traffic of its own) beside `n` greedy TCP VMs
/// (ANCS Tables 1–2), with a UDP and a TCP probe from `vm0`; the VMs send MTU frames as the
/// paper's did (`tso = false`).
pub fn latency_scenario(n: usize, secs: u32) -> String {
    // vm0 "sends" 64 kbit/s of UDP only so that it is a VM of the scenario; the probes are
    // its real traffic.
    let mut s = format!(
        "name = \"ancs-table1-2-{n}vms\"\ndescription = \"ANCS Tables 1-2: RTT from a probe VM \
         while {n} VMs load the link (weight 1 each)\"\nduration = \"{secs}s\"\n\
         capacity = \"940Mbit\"\nengine = \"ancs\"\nsettle = \"2s\"\n\n\
         [topology]\ntso = false\n\n\
         [[vm]]\nname = \"vm0\"\nweight = 1\ntraffic = \"udp\"\npacket_size = 128\n\
         rate = \"64kbit\"\n"
    );
    for i in 1..=n {
        let _ = write!(s, "\n[[vm]]\nname = \"vm{i}\"\nweight = 1\n");
    }
    s.push_str(
        "\n[[probe]]\nvm = \"vm0\"\nprotocol = \"udp\"\nsize = 64\nrate = \"500/s\"\n\
         \n[[probe]]\nvm = \"vm0\"\nprotocol = \"tcp\"\nsize = 64\nrate = \"500/s\"\n",
    );
    s
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), LabError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|source| LabError::Io {
            what: d.display().to_string(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| LabError::Io {
        what: path.display().to_string(),
        source,
    })
}

/// One line series of a plot.
pub type Series = (String, Vec<(f64, f64)>);

/// A sweep's plot: one line with markers per series, x = the number of VMs.
pub fn line_svg(title: &str, xlabel: &str, ylabel: &str, series: &[Series]) -> String {
    Plot {
        title: title.into(),
        xlabel: xlabel.into(),
        ylabel: ylabel.into(),
        series: series.iter().map(|s| s.0.clone()).collect(),
        lines: series
            .iter()
            .enumerate()
            .map(|(i, s)| Line {
                series: i,
                style: Style::Solid,
                points: s.1.clone(),
                markers: true,
            })
            .collect(),
        ..Plot::default()
    }
    .svg()
}

/// The switch's CPU of a run, % of one core: vqosd + softirq under vqos, softirq otherwise.
pub fn switch_cpu(baseline: Baseline, o: &LabOutcome) -> f64 {
    match baseline {
        Baseline::Vqos => o.vqosd_percent + o.softirq_percent,
        _ => o.softirq_percent,
    }
}

fn one_run(
    opts: &PaperOptions,
    file: &Path,
    baseline: Baseline,
    out: PathBuf,
) -> Result<LabOutcome, LabError> {
    one_variant(opts, file, Variant::plain(baseline), out)
}

fn one_variant(
    opts: &PaperOptions,
    file: &Path,
    v: Variant,
    out: PathBuf,
) -> Result<LabOutcome, LabError> {
    let mut lo = LabOptions::new(file);
    lo.baseline = v.baseline;
    lo.engine = v.engine;
    lo.algorithms = v.algorithms.is_paper().then_some(v.algorithms);
    lo.out_dir = Some(out);
    lo.duration_scale = opts.duration_scale;
    lo.vqosd_bin = opts.vqosd_bin.clone();
    lo.progress = opts.progress;
    let r = run_lab(&lo);
    if opts.progress {
        eprintln!();
    }
    r
}

/// One run of an experiment's scenario file.
#[derive(Debug)]
pub struct PaperRun {
    /// The file's stem.
    pub stem: String,
    /// The switch.
    pub baseline: Baseline,
    /// vqosd's engine instead of the scenario's (`None`: the scenario's).
    pub engine: Option<EngineKind>,
    /// The papers' algorithms as written, or the scenario's own choice.
    pub algorithms: vqos_sched::Variant,
    /// Which repeat of the file and switch this is, from 1 ([`PaperOptions::repeats`]).
    pub repeat: u32,
    /// Its directory.
    pub dir: PathBuf,
    /// Its `results.json`, or why it failed.
    pub result: Result<serde_json::Value, String>,
    /// Finished by an earlier invocation and kept (`--resume`).
    pub kept: bool,
}

/// Runs the experiment; returns the text of `summary.md` (also written under `out_dir`).
/// Records the run in `run-info.json`, or checks it on `--resume` ([`crate::resume::begin`]).
pub fn run_paper(opts: &PaperOptions) -> Result<String, LabError> {
    let now = crate::resume::RunInfo {
        commit: crate::paper_all::git_commit(),
        duration_scale: opts.duration_scale,
        repeats: opts.repeats.max(1),
        started: crate::paper_all::utc_now(),
    };
    // An unknown name is refused by run_paper_runs, before anything is written.
    if PAPERS.iter().any(|(n, _)| *n == opts.name) {
        crate::resume::begin(&opts.out_dir, now, opts.resume)?;
    }
    run_paper_runs(opts).map(|o| o.md)
}

/// What an experiment produced.
#[derive(Debug)]
pub struct PaperOutput {
    /// The text of its `summary.md`.
    pub md: String,
    /// For scenario-file experiments, every run.
    pub runs: Vec<PaperRun>,
    /// The real-load run's section of the summary ([`crate::real_load::section_md`]), or why
    /// it failed; `None` when it was not asked for.
    pub real_load_md: Option<String>,
}

/// Runs the experiment. Stops at an interrupt ([`LabError::Interrupted`]); a run that fails
/// otherwise is recorded and the others go on.
pub fn run_paper_runs(opts: &PaperOptions) -> Result<PaperOutput, LabError> {
    let Some((_, files)) = PAPERS.iter().find(|(n, _)| *n == opts.name) else {
        let names: Vec<&str> = PAPERS.iter().map(|p| p.0).collect();
        return Err(LabError::Invalid(format!(
            "Unknown experiment '{}': expected one of {}",
            opts.name,
            names.join(", ")
        )));
    };
    let given = !opts.baselines.is_empty();
    let switches = if given {
        opts.baselines.clone()
    } else {
        default_switches(&opts.name)
    };
    let (baselines, real) = lab_baselines(&opts.name, &switches)?;
    let out = &opts.out_dir;
    let mut md = format!("# {} — lab runs\n\n", opts.name);
    let mut runs = Vec::new();
    let mut real_load_md = None;
    let kept_sweep = match sweep_csv(&opts.name) {
        Some(csv) if opts.resume => crate::resume::kept_sweep(out, csv),
        _ => None,
    };
    match (opts.name.as_str(), kept_sweep) {
        (_, Some(kept)) => md = kept,
        ("ancs-fig8", None) => {
            let b = if given {
                baselines
            } else {
                vec![Baseline::Bridge, Baseline::Htb, Baseline::Vqos]
            };
            sweep_cpu(opts, &b, &mut md)?
        }
        ("ancs-table1-2", None) => {
            let b = if given {
                baselines
            } else {
                // HTB: the traffic controller the paper compares with.
                vec![Baseline::Vqos, Baseline::Bridge, Baseline::Htb]
            };
            sweep_latency(opts, &b, &mut md)?
        }
        _ => {
            let dir = opts.scenarios_dir.clone().unwrap_or_else(scenarios_dir);
            md.push_str(RUNS_TABLE_HEAD);
            for f in *files {
                let stem = f.trim_end_matches(".toml");
                for v in variants(f, &baselines) {
                    for repeat in 1..=opts.repeats.max(1) {
                        let run = one_file_run(opts, &dir.join(f), stem, v, repeat, &mut md)?;
                        runs.push(run);
                    }
                }
            }
            if opts.name == crate::paper_apps::APPS_PAPER {
                md.push_str(&crate::paper_apps::section_md(&runs));
            }
            if real {
                let section = real_load::paper_run(opts, &mut md)?;
                let _ = write!(md, "\n{section}");
                real_load_md = Some(section);
            }
        }
    }
    write(&out.join("summary.md"), &md)?;
    Ok(PaperOutput {
        md,
        runs,
        real_load_md,
    })
}

/// The CSV a sweep writes (ANCS Fig. 8, Tables 1–2); `None` for the other experiments.
fn sweep_csv(name: &str) -> Option<&'static str> {
    match name {
        "ancs-fig8" => Some("cpu.csv"),
        "ancs-table1-2" => Some("latency.csv"),
        _ => None,
    }
}

/// The head of an experiment's table of runs.
const RUNS_TABLE_HEAD: &str =
    "| run | baseline | expectations passed | vqosd CPU % | softirq CPU % \
                               | directory |\n|---|---|---|---:|---:|---|\n";

/// The directory of run `k` (of `repeats`) of `stem` under a variant (`suffix`,
/// [`Variant::suffix`]): `<stem><suffix>`, with `-run<k>` when there are several runs. The
/// verdict tables find the runs by it ([`crate::verdict`]).
pub fn run_name(stem: &str, suffix: &str, k: u32, repeats: u32) -> String {
    match repeats > 1 {
        true => format!("{stem}{suffix}-run{k}"),
        false => format!("{stem}{suffix}"),
    }
}

/// Runs repeat `repeat` of scenario file `file` under variant `v`, adds its row to `md`.
/// Only an interrupt is an error; a failed run is recorded in the returned run.
fn one_file_run(
    opts: &PaperOptions,
    file: &Path,
    stem: &str,
    v: Variant,
    repeat: u32,
    md: &mut String,
) -> Result<PaperRun, LabError> {
    let name = run_name(stem, &v.suffix(), repeat, opts.repeats);
    let mut run = stem.to_string();
    if opts.repeats > 1 {
        let _ = write!(run, " #{repeat}");
    }
    let label = v.label();
    let dir = opts.out_dir.join(&name);
    let kept = opts
        .resume
        .then(|| crate::resume::kept_result(&dir, opts.duration_scale))
        .flatten();
    let was_kept = kept.is_some();
    let result = match kept {
        Some(results) => Ok(results),
        None => match one_variant(opts, file, v, dir.clone()) {
            Ok(o) => Ok(o.results),
            Err(LabError::Interrupted) => return Err(LabError::Interrupted),
            Err(e) => {
                let _ = writeln!(md, "| {run} | {label} | failed: {e} | | | |");
                Err(error_chain(&e))
            }
        },
    };
    if let Ok(results) = &result {
        // The row from its results.json, whether this invocation made it or an earlier one.
        let checks = results["checks"]
            .as_array()
            .map_or(&[][..], |c| c.as_slice());
        let pass = checks.iter().filter(|c| c["pass"] == true).count();
        let cpu = |k: &str| results["cpu"][k].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            md,
            "| {run} | {label} | {pass} / {} | {:.1} | {:.1} | `{name}/`{} |",
            checks.len(),
            cpu("vqosd_percent"),
            cpu("softirq_percent"),
            if was_kept { " (kept)" } else { "" }
        );
    }
    Ok(PaperRun {
        stem: stem.to_string(),
        baseline: v.baseline,
        engine: v.engine,
        algorithms: v.algorithms,
        repeat,
        dir,
        result,
        kept: was_kept,
    })
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let _ = write!(s, ": {x}");
        src = x.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use vqos_sim::Scenario;

    #[test]
    fn every_named_file_exists_and_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        for (name, files) in PAPERS.iter().chain(SIM_ONLY_FILES) {
            for f in *files {
                let text = std::fs::read_to_string(dir.join(f))
                    .unwrap_or_else(|e| panic!("{name}: {f}: {e}"));
                let sc = Scenario::parse(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
                crate::probe::parse_probes(&text, &sc).unwrap();
            }
        }
    }

    #[test]
    fn generated_sweeps_parse_with_their_probes() {
        for n in 1..=8 {
            let sc = Scenario::parse(&cpu_scenario(n, 8)).unwrap();
            assert_eq!(sc.vms.len(), n);
            assert!(!sc.tso, "MTU frames, as the paper's");
        }
        for n in 0..=5 {
            let text = latency_scenario(n, 10);
            let sc = Scenario::parse(&text).unwrap();
            assert_eq!(sc.vms.len(), n + 1);
            assert!(!sc.tso, "MTU frames, as the paper's");
            let p = crate::probe::parse_probes(&text, &sc).unwrap();
            assert_eq!(p.len(), 2);
            assert!(p.iter().all(|p| p.vm_index == 0));
        }
    }

    #[test]
    fn unknown_experiments_are_refused() {
        let o = PaperOptions {
            name: "ancs-fig99".into(),
            baselines: vec![],
            out_dir: PathBuf::from("/nonexistent"),
            duration_scale: 1.0,
            vqosd_bin: None,
            progress: false,
            scenarios_dir: None,
            repeats: 1,
            resume: false,
        };
        let e = run_paper(&o).unwrap_err().to_string();
        assert!(e.contains("ancs-table1-2"), "{e}");
    }

    #[test]
    fn a_resumed_experiment_keeps_the_runs_it_finished_and_reruns_the_others() {
        let out = std::env::temp_dir().join(format!("vqos-paper-resume-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut o = PaperOptions {
            name: "ancs-fig5".into(),
            baselines: vec![
                PaperSwitch::Lab(Baseline::Vqos),
                PaperSwitch::Lab(Baseline::Htb),
            ],
            out_dir: out.clone(),
            duration_scale: 0.5,
            vqosd_bin: None,
            progress: false,
            // A lab run that is started fails at once, on the scenario, before any traffic.
            scenarios_dir: Some(out.join("scenarios")),
            repeats: 2,
            resume: true,
        };
        std::fs::create_dir_all(out.join("scenarios")).unwrap();
        std::fs::write(out.join("scenarios/ancs-fig5.toml"), "not a scenario").unwrap();
        let finished = |dir: &str, scale: f64| {
            let d = out.join(dir);
            std::fs::create_dir_all(&d).unwrap();
            let v = serde_json::json!({
                "duration_scale": scale,
                "checks": [{"pass": true}, {"pass": false}],
                "cpu": {"vqosd_percent": 12.5, "softirq_percent": 3.0},
            });
            std::fs::write(d.join("results.json"), v.to_string()).unwrap();
        };
        for dir in ["ancs-fig5-run1", "ancs-fig5-run2", "ancs-fig5-htb-run1"] {
            finished(dir, 0.5);
        }
        // Made at another length: run again.
        finished("ancs-fig5-htb-run2", 1.0);
        let r = run_paper_runs(&o).unwrap();
        let kept: Vec<(String, u32)> = r
            .runs
            .iter()
            .filter(|r| r.kept)
            .map(|r| (r.baseline.to_string(), r.repeat))
            .collect();
        let vq = Baseline::Vqos.to_string();
        let htb = Baseline::Htb.to_string();
        assert_eq!(kept, [(vq.clone(), 1), (vq, 2), (htb, 1)]);
        assert!(r.runs.iter().filter(|r| r.kept).all(|r| r.result.is_ok()));
        let rerun = r.runs.iter().find(|r| !r.kept).unwrap();
        assert!(rerun.result.is_err(), "the lab was started for it");
        assert!(
            r.md.contains("| 1 / 2 | 12.5 | 3.0 | `ancs-fig5-run2/` (kept) |"),
            "{}",
            r.md
        );
        // Without --resume every run starts again.
        o.resume = false;
        let r = run_paper_runs(&o).unwrap();
        assert!(r.runs.iter().all(|r| !r.kept && r.result.is_err()));
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_plot_has_a_line_per_series() {
        let svg = line_svg(
            "t",
            "x",
            "y",
            &[
                ("a".into(), vec![(1.0, 2.0), (2.0, 3.0)]),
                ("b<".into(), vec![(1.0, 1.0)]),
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("b&lt;") && svg.trim_end().ends_with("</svg>"));
    }
}
