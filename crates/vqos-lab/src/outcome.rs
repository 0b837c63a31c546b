//! What a lab run takes ([`LabOptions`]) and gives ([`LabOutcome`]), and its time bins: the
//! types the runner ([`crate::run`]) fills and the files ([`crate::output`]) are written from,
//! so neither module needs the other's.

use std::path::PathBuf;

use crate::app::AppResult;
use crate::probe::ProbeResult;
use crate::topo::Baseline;
use vqos_sched::EngineKind;
use vqos_sim::Report;

/// Width of the lab's time bins, ns (the sampling period).
pub const LAB_BIN_NS: u64 = 100_000_000;

/// What to run and how.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// The scenario file.
    pub scenario: PathBuf,
    /// Which switch carries the traffic.
    pub baseline: Baseline,
    /// Where to write the results (default `lab-out/NAME-TIMESTAMP`).
    pub out_dir: Option<PathBuf>,
    /// Multiplies every time of the scenario (0.5 = twice as fast).
    pub duration_scale: f64,
    /// The vqosd binary (default: found or built, see [`crate::topo::find_vqosd`]).
    pub vqosd_bin: Option<PathBuf>,
    /// Print a progress line on stderr.
    pub progress: bool,
    /// vqosd's engine instead of the scenario's (`None`: the scenario's); the simulator's
    /// prediction uses the same one. Ignored by the kernel baselines.
    pub engine: Option<EngineKind>,
    /// The papers' algorithms as written or vqos's departures, instead of the scenario's
    /// `variant` (`None`: the scenario's); the simulator's prediction follows it too.
    pub algorithms: Option<vqos_sched::Variant>,
    /// vqosd's forwarding threads instead of the scenario's `threads` (`None`: the
    /// scenario's).
    pub threads: Option<usize>,
}

impl LabOptions {
    /// Options with defaults for `scenario`.
    pub fn new(scenario: impl Into<PathBuf>) -> LabOptions {
        LabOptions {
            scenario: scenario.into(),
            baseline: Baseline::Vqos,
            out_dir: None,
            duration_scale: 1.0,
            vqosd_bin: None,
            progress: false,
            engine: None,
            algorithms: None,
            threads: None,
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct LabOutcome {
    /// Where the files are.
    pub out_dir: PathBuf,
    /// The contents of `results.json`.
    pub results: serde_json::Value,
    /// The measured report.
    pub report: Report,
    /// The simulator's report of the same scenario.
    pub simulated: Report,
    /// vqosd's CPU over the run, % of one core (0 for the baselines).
    pub vqosd_percent: f64,
    /// The kernel's softirq time over the run, % of one core (all cores summed).
    pub softirq_percent: f64,
    /// The latency probes' per-phase results (`[[probe]]`; empty without probes).
    pub latency: Vec<ProbeResult>,
    /// The apps' clients' results (`[[app]]`; empty without apps).
    pub apps: Vec<AppResult>,
}
