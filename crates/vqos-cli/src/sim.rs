//! `vqos sim`: run a scenario file in the simulator.

use anyhow::{Context, Result};
use clap::Args;
use vqos_sim::{build_report, render_text, simulate, timeseries_csv, Scenario, BIN_NS};

use crate::exit::UsageError;
use crate::out::{out, outln};

/// Arguments of `vqos sim`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  vqos sim scenarios/ancs-fig5.toml\n  \
    vqos sim scenarios/ancs-fig5.toml --engine vqos --json\n  \
    vqos sim scenarios/fairness-static.toml --variant paper\n\n\
    The scenario format is described in docs/scenarios.md.")]
pub struct SimArgs {
    /// The scenario file (TOML).
    file: std::path::PathBuf,
    /// Print the result as JSON (scenario, mode, phases with per-vif mean and expected rates,
    /// aggregate, unfairness, and the expectations' outcomes).
    #[arg(long)]
    json: bool,
    /// Seed of the simulation's random choices (same seed, same result).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run with this engine instead of the scenario's (rr, ancs, policer, tcm, c2qos, vqos).
    #[arg(long)]
    engine: Option<String>,
    /// Run the papers' algorithms as written (`paper`) or with vqos's departures (`vqos`),
    /// instead of the scenario's `variant`: ANCS's CreditLeft, the fairness paper's
    /// Algorithm 1, PID-ECN marking only what a VM receives (docs/experiments.md).
    #[arg(long)]
    variant: Option<String>,
    /// Exit with status 5 when an expectation of the scenario fails.
    #[arg(long)]
    check: bool,
    /// Also write the time series (t_s,vm,rate_bps,control) to this CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
    /// Window of the CSV time series, e.g. 100ms or 1s.
    #[arg(long, default_value = "100ms")]
    csv_window: String,
}

/// Runs `vqos sim`.
pub fn run(args: SimArgs) -> Result<()> {
    // The command line first: its mistakes are usage errors (exit 2), found before the run.
    let engine = match &args.engine {
        Some(e) => Some(
            e.parse()
                .map_err(|m| UsageError(format!("--engine: {m}")))?,
        ),
        None => None,
    };
    let variant: Option<vqos_sched::Variant> = match &args.variant {
        Some(v) => Some(
            v.parse()
                .map_err(|m| UsageError(format!("--variant: {m}")))?,
        ),
        None => None,
    };
    let window = vqos_sched::units::parse_duration_ns(&args.csv_window)
        .map_err(|e| UsageError(format!("--csv-window: {e}")))?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("Cannot read {}", args.file.display()))?;
    let mut sc = Scenario::parse(&text).with_context(|| format!("{}", args.file.display()))?;
    if let Some(e) = engine {
        sc.engine = e;
    }
    if let Some(v) = variant {
        sc.variant = v;
    }
    let out = simulate(&sc, args.seed)?;
    let report = build_report(&sc, "sim", &out.bins, BIN_NS, out.cpu_busy);
    if let Some(path) = &args.csv {
        let csv = timeseries_csv(&sc, &out.bins, BIN_NS, &out.control_trace, window);
        std::fs::write(path, csv).with_context(|| format!("Cannot write {}", path.display()))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", render_text(&report))?;
    }
    if args.check && !report.passed() {
        std::process::exit(crate::exit::CHECK_FAILED);
    }
    Ok(())
}
