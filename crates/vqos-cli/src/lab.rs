//! `vqos lab run`: a scenario file on real traffic in network namespaces.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use vqos_lab::{install_interrupt_handler, run_lab, Baseline, LabOptions};

/// Arguments of `vqos lab`.
#[derive(Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Subcommand, Debug)]
enum LabCommand {
    /// Run a scenario on real traffic (root; iperf3) and write results, report and plot.
    #[command(
        after_help = "Examples:\n  sudo vqos lab run scenarios/ancs-fig5.toml\n  \
        sudo vqos lab run scenarios/ancs-fig5.toml --baseline htb --out lab-out/fig5-htb\n\n\
        Writes DIR/results.json, timeseries.csv, report.md, rates.svg and logs/.\n\
        Ctrl-C stops the run and removes every namespace, link and process it created."
    )]
    Run(RunArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The scenario file (TOML), the same one `vqos sim` runs.
    file: std::path::PathBuf,
    /// The switch: vqos (vqosd), bridge (Linux bridge, no QoS), htb (HTB class per VM), tbf
    /// (tbf per VM at its max).
    #[arg(long, default_value = "vqos")]
    baseline: String,
    /// Output directory (default lab-out/NAME-TIMESTAMP).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Print results.json to stdout.
    #[arg(long)]
    json: bool,
    /// Multiply every time of the scenario by F (0.5 = twice as fast).
    #[arg(long, default_value_t = 1.0, value_name = "F")]
    duration_scale: f64,
    /// Exit with status 2 when an expectation of the scenario fails.
    #[arg(long)]
    check: bool,
}

/// Runs `vqos lab`.
pub fn run(args: LabArgs) -> Result<()> {
    let LabCommand::Run(a) = args.command;
    let baseline: Baseline = a.baseline.parse()?;
    let mut opts = LabOptions::new(&a.file);
    opts.baseline = baseline;
    opts.out_dir = a.out;
    opts.duration_scale = a.duration_scale;
    opts.progress = true;
    install_interrupt_handler();
    let outcome = run_lab(&opts).with_context(|| format!("Lab run of {}", a.file.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&outcome.results)?);
    } else {
        print!("{}", vqos_sim::render_text(&outcome.report));
        println!(
            "cpu: vqosd {:.1} % of a core, softirq {:.1} % of a core",
            outcome.vqosd_percent, outcome.softirq_percent
        );
        println!("results in {}", outcome.out_dir.display());
    }
    if a.check && !outcome.report.passed() {
        std::process::exit(2);
    }
    Ok(())
}
