//! `vqos lab run`: a scenario file on real traffic in network namespaces.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use vqos_lab::{
    install_interrupt_handler, publish, run_all, run_lab, run_paper, AllOptions, Baseline,
    LabOptions, PaperOptions, PaperSwitch, PAPERS,
};

use crate::out::{out, outln};

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
        sudo vqos lab run scenarios/ancs-fig5.toml --baseline htb --out lab-out/fig5-htb\n  \
        sudo vqos lab run scenarios/fairness-static.toml --engine policer\n\n\
        Writes DIR/results.json, timeseries.csv, report.md, rates.svg and logs/.\n\
        Ctrl-C stops the run and removes every namespace, link and process it created."
    )]
    Run(RunArgs),
    /// Run one of the papers' experiments (scenario files or a sweep over the number of VMs).
    #[command(
        after_help = "Experiments: ancs-fig4, ancs-fig5, ancs-fig6, ancs-fig8 (switch CPU for \
        1..8 VMs under bridge, htb, vqos), ancs-table1-2 (probe RTT while 1..5 VMs load the \
        link, vqos vs bridge), fairness-static, fairness-fluctuating, fairness-path (600 s: a path \
        that appears and disappears), c2qos-fig1 (a small-packet VM against its \
        neighbour on an emulated core), c2qos-fig6 (also on a real \
        load: --baseline ovs-dpdk, testpmd and OVS-DPDK), c2qos-fig6fg (FTP and nginx servers in the \
        VMs, wrk's pressure test: needs vsftpd, nginx, wrk, curl), \
        pid-ecn-unequal, pid-ecn-receiver-cpu (the paper's cause: a receiving VM short of CPU, \
        a cgroup quota), pid-ecn-start-stop, pid-ecn-mixed; `all` runs every one of them in \
        order into DIR/<name>/ and writes DIR/summary.md (paper | simulator | lab | baselines \
        per figure) with the plots in DIR/img/.\n\nExamples:\n  sudo vqos lab paper ancs-table1-2 \
        --out lab-out/ancs-table1-2\n  sudo vqos lab paper ancs-fig5 --baseline vqos --baseline htb\n  \
        sudo vqos lab paper all --out lab-out/paper-all\n  \
        sudo vqos lab paper all --runs 3 --out lab-out/paper-all-3 --resume   # after an interrupt\n  \
        vqos lab publish lab-out/paper-all                      # then: docs/paper-lab.md\n  \
        vqos lab paper all --sim-only --out lab-out/paper-sim --docs docs   # no root, a minute\n\n\
        The controlled fairness files also run under the `policer` engine (the paper's vif \
        credit), in the lab and the simulator.\n\
        Writes DIR/summary.md and, per run, a directory with results.json, report.md, plots."
    )]
    Paper(PaperArgs),
    /// Publish a `vqos lab paper all` run into the docs: DOCS/paper-lab.md (paper-sim.md for a
    /// --sim-only run), generated from DIR/summary.md, with its plots in DOCS/img/lab/ (img/sim/),
    /// and a lab run's verdict tables (each paper's claims: runs met under vqos, the papers'
    /// algorithms and other engines) into DOCS/experiments.md's generated block.
    #[command(after_help = "Examples:\n  vqos lab publish lab-out/paper-all\n  \
        vqos lab publish lab-out/paper-sim --docs docs\n\n\
        Refuses an interrupted run, a summary whose plots are missing, or results that do not \
        line up with this checkout's scenario files, writing nothing. Plots in the target img \
        directory that the new page does not link are removed.")]
    Publish(PublishArgs),
}

#[derive(Args, Debug)]
struct PublishArgs {
    /// The run's output directory (the `--out` of `vqos lab paper all`).
    dir: std::path::PathBuf,
    /// The docs directory.
    #[arg(long, default_value = "docs")]
    docs: std::path::PathBuf,
    /// Print `{"page", "plots", "removed"}` instead of a line.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct PaperArgs {
    /// The experiment, or `all`.
    name: String,
    /// Baselines to run (repeatable; default: the experiment's own choice): those of `vqos lab
    /// run`, and for c2qos-fig6 `ovs-dpdk`, the real load (testpmd's 64-byte floods over
    /// vhost-user against vqosd and OVS-DPDK: scripts/lab-c2qos-real.sh; run by default).
    #[arg(long)]
    baseline: Vec<String>,
    /// Output directory (default lab-out/paper-NAME).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Multiply every time of the scenarios by F.
    #[arg(long, default_value_t = 1.0, value_name = "F")]
    duration_scale: f64,
    /// Print `{"experiment", "out_dir", "summary_md"}` instead of the summary (each run's
    /// results.json is under out_dir).
    #[arg(long)]
    json: bool,
    /// With `all`: run only the simulator (no root, no lab; the summary's simulator column).
    #[arg(long)]
    sim_only: bool,
    /// With `all`: only this experiment (repeatable), e.g. to check the lab path or refresh
    /// one section.
    #[arg(long, value_name = "NAME")]
    only: Vec<String>,
    /// With `all`: when the run completes, publish it into this docs directory as
    /// `vqos lab publish OUT --docs DOCS` does.
    #[arg(long, value_name = "DOCS")]
    docs: Option<std::path::PathBuf>,
    /// Run each scenario file under each switch N times; the summary gives each rate's mean
    /// and range (`mean [min–max]`) and each run's checks. The sweeps (ancs-fig8,
    /// ancs-table1-2) and the real load run once.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
    /// Continue an interrupted run in the same --out directory: keep the runs it finished,
    /// run the rest. Refused unless the directory was started at the same commit, duration
    /// scale and --runs (its run-info.json); the real load runs again.
    #[arg(long)]
    resume: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The scenario file (TOML), the same one `vqos sim` runs.
    file: std::path::PathBuf,
    /// The switch: vqos (vqosd), bridge (Linux bridge, no QoS), htb (HTB class per VM), tbf
    /// (tbf per VM at its max), ovs (Open vSwitch userspace datapath, OpenFlow meter per VM at
    /// its max; needs openvswitch-switch). See docs/baselines.md.
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
    /// Exit with status 5 when an expectation of the scenario fails.
    #[arg(long)]
    check: bool,
    /// Run vqosd (and the simulator's prediction) with this engine instead of the scenario's
    /// (rr, ancs, policer, tcm, c2qos, vqos); only with `--baseline vqos`.
    #[arg(long)]
    engine: Option<String>,
    /// Run vqosd on N forwarding threads (shards) instead of the scenario's `threads`
    /// (default 1); only with `--baseline vqos`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    threads: Option<u64>,
}

/// Runs `vqos lab`.
pub fn run(args: LabArgs) -> Result<()> {
    let a = match args.command {
        LabCommand::Run(a) => a,
        LabCommand::Paper(p) => return paper(p),
        LabCommand::Publish(p) => return publish_run(&p.dir, &p.docs, p.json),
    };
    let baseline: Baseline = a.baseline.parse()?;
    let engine = match &a.engine {
        Some(e) if baseline != Baseline::Vqos => {
            let msg = format!(
                "--engine {e} needs --baseline vqos (the {baseline} baseline has no engine)"
            );
            return Err(crate::exit::UsageError(msg).into());
        }
        Some(e) => Some(e.parse().map_err(|m: String| crate::exit::UsageError(m))?),
        None => None,
    };
    if let (Some(n), false) = (a.threads, baseline == Baseline::Vqos) {
        let msg = format!("--threads {n} needs --baseline vqos (the {baseline} baseline has none)");
        return Err(crate::exit::UsageError(msg).into());
    }
    let mut opts = LabOptions::new(&a.file);
    opts.engine = engine;
    opts.threads = a.threads.map(|n| n as usize);
    opts.baseline = baseline;
    opts.out_dir = a.out;
    opts.duration_scale = a.duration_scale;
    opts.progress = true;
    install_interrupt_handler();
    let outcome = run_lab(&opts).with_context(|| format!("Lab run of {}", a.file.display()))?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&outcome.results)?)?;
    } else {
        out!("{}", vqos_sim::render_text(&outcome.report))?;
        outln!(
            "cpu: vqosd {:.1} % of a core, softirq {:.1} % of a core",
            outcome.vqosd_percent,
            outcome.softirq_percent
        )?;
        outln!("results in {}", outcome.out_dir.display())?;
    }
    if a.check && !outcome.report.passed() {
        std::process::exit(crate::exit::CHECK_FAILED);
    }
    Ok(())
}

fn paper(p: PaperArgs) -> Result<()> {
    if p.name == "all" {
        return paper_all(p);
    }
    if p.sim_only || !p.only.is_empty() || p.docs.is_some() {
        let msg = "--sim-only, --only and --docs go with `vqos lab paper all`".to_string();
        return Err(crate::exit::UsageError(msg).into());
    }
    if !PAPERS.iter().any(|(n, _)| *n == p.name) {
        let names: Vec<&str> = PAPERS.iter().map(|x| x.0).collect();
        let msg = format!(
            "Unknown experiment '{}': expected one of {}",
            p.name,
            names.join(", ")
        );
        return Err(crate::exit::UsageError(msg).into());
    }
    let baselines = p
        .baseline
        .iter()
        .map(|b| b.parse::<PaperSwitch>())
        .collect::<Result<Vec<_>, _>>()?;
    let out = p
        .out
        .unwrap_or_else(|| std::path::PathBuf::from(format!("lab-out/paper-{}", p.name)));
    let opts = PaperOptions {
        name: p.name.clone(),
        baselines,
        out_dir: out.clone(),
        duration_scale: p.duration_scale,
        vqosd_bin: None,
        progress: true,
        scenarios_dir: None,
        repeats: p.runs,
        resume: p.resume,
    };
    install_interrupt_handler();
    let md = match run_paper(&opts) {
        Err(vqos_lab::LabError::Interrupted) => {
            let mut cmd = format!("vqos lab paper {} --out {}", p.name, out.display());
            if p.runs > 1 {
                cmd.push_str(&format!(" --runs {}", p.runs));
            }
            if p.duration_scale != 1.0 {
                cmd.push_str(&format!(" --duration-scale {}", p.duration_scale));
            }
            for b in &p.baseline {
                cmd.push_str(&format!(" --baseline {b}"));
            }
            return Err(interrupted(&out, &cmd));
        }
        r => r.with_context(|| format!("Experiment {}", p.name))?,
    };
    print_summary(&p.name, &out, &md, p.json)
}

fn paper_all(p: PaperArgs) -> Result<()> {
    if p.sim_only && p.resume {
        let msg = "--resume keeps lab runs; with --sim-only there are none (the simulator \
                   takes a minute)"
            .to_string();
        return Err(crate::exit::UsageError(msg).into());
    }
    if p.sim_only && p.runs > 1 {
        let msg = "--runs repeats lab runs; with --sim-only there are none (the simulator gives \
                   the same numbers every time)"
            .to_string();
        return Err(crate::exit::UsageError(msg).into());
    }
    let baselines = p
        .baseline
        .iter()
        .map(|b| b.parse::<PaperSwitch>())
        .collect::<Result<Vec<_>, _>>()?;
    let out = p
        .out
        .unwrap_or_else(|| std::path::PathBuf::from("lab-out/paper-all"));
    let mut command = format!("vqos lab paper all --out {}", out.display());
    if p.duration_scale != 1.0 {
        command.push_str(&format!(" --duration-scale {}", p.duration_scale));
    }
    for b in &p.baseline {
        command.push_str(&format!(" --baseline {b}"));
    }
    for n in &p.only {
        command.push_str(&format!(" --only {n}"));
    }
    if p.sim_only {
        command.push_str(" --sim-only");
    }
    if p.runs > 1 {
        command.push_str(&format!(" --runs {}", p.runs));
    }
    if p.resume {
        command.push_str(" --resume");
    }
    let opts = AllOptions {
        baselines,
        out_dir: out.clone(),
        duration_scale: p.duration_scale,
        vqosd_bin: None,
        progress: !p.sim_only,
        scenarios_dir: None,
        sim_only: p.sim_only,
        only: p.only.clone(),
        command,
        repeats: p.runs,
        resume: p.resume,
    };
    install_interrupt_handler();
    let md = match run_all(&opts) {
        Err(vqos_lab::LabError::Interrupted) => return Err(interrupted(&out, &opts.command)),
        r => r.context("vqos lab paper all")?,
    };
    print_summary("all", &out, &md, p.json)?;
    match &p.docs {
        Some(docs) => publish_run(&out, docs, false),
        None => Ok(()),
    }
}

/// An interrupted paper run: what was kept and the command that continues it.
fn interrupted(out: &std::path::Path, command: &str) -> anyhow::Error {
    let resume = match command.ends_with(" --resume") {
        true => command.to_string(),
        false => format!("{command} --resume"),
    };
    anyhow::anyhow!(
        "Interrupted; everything the run created was removed, and the runs that finished are \
         kept in {}: continue with `sudo {resume}`",
        out.display()
    )
}

/// `vqos lab publish`: the run's summary and plots into the docs.
fn publish_run(dir: &std::path::Path, docs: &std::path::Path, json: bool) -> Result<()> {
    let p = publish(dir, docs).with_context(|| format!("Publishing {}", dir.display()))?;
    if json {
        let v = serde_json::json!({
            "page": p.page.display().to_string(),
            "plots": p.plots,
            "removed": p.removed,
            "verdicts": p.verdicts.as_ref().map(|v| v.display().to_string()),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    // On stderr after `paper all`: its `--json` keeps stdout for the summary.
    eprintln!(
        "wrote {} and {} plots ({} stale plots removed)",
        p.page.display(),
        p.plots,
        p.removed
    );
    if let Some(v) = &p.verdicts {
        eprintln!("wrote the verdict tables into {}", v.display());
    }
    Ok(())
}

/// Prints an experiment's summary (or, with `json`, the summary and where the results are).
fn print_summary(experiment: &str, out: &std::path::Path, md: &str, json: bool) -> Result<()> {
    if json {
        let v = serde_json::json!({
            "experiment": experiment,
            "out_dir": out.display().to_string(),
            "summary_md": md,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        out!("{md}")?;
        outln!("results in {}", out.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_run_says_how_to_continue_it() {
        let out = std::path::Path::new("lab-out/x");
        let e = interrupted(out, "vqos lab paper all --out lab-out/x --runs 3").to_string();
        assert!(
            e.contains("kept in lab-out/x")
                && e.ends_with("`sudo vqos lab paper all --out lab-out/x --runs 3 --resume`"),
            "{e}"
        );
        // A resumed run interrupted again: the same command, not a second --resume.
        let e = interrupted(out, "vqos lab paper all --out lab-out/x --resume").to_string();
        assert!(e.ends_with("--out lab-out/x --resume`"), "{e}");
    }
}
