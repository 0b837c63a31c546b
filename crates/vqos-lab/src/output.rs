//! The lab's files: `results.json`, `timeseries.csv`, `report.md` and `rates.svg` (measured
//! rates solid, the simulator's prediction dotted, the reference allocation dashed, phases
//! marked; drawn by [`crate::plot`]).

use std::fmt::Write as _;
use std::path::Path;

use vqos_sim::{Report, Scenario, BIN_NS};

use crate::outcome::{LabOptions, LabOutcome, LAB_BIN_NS};
use crate::plot::{Line, Plot, Style};
use crate::LabError;

/// `results.json`: the report's keys (as `vqos sim --json`) plus `baseline`, `cpu`,
/// `duration_scale`, `capabilities`, the simulator's phases as `simulated` (its whole run, when
/// the scenario asks for one, as `simulated_whole_run`) and its expectations' outcomes as
/// `simulated_checks`.
pub fn results_json(
    report: &Report,
    simulated: &Report,
    opts: &LabOptions,
    vqosd_percent: f64,
    softirq_percent: f64,
) -> serde_json::Value {
    let mut v = serde_json::to_value(report).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("baseline".into(), opts.baseline.name().into());
        o.insert(
            "cpu".into(),
            serde_json::json!({
                "vqosd_percent": round2(vqosd_percent),
                "softirq_percent": round2(softirq_percent),
            }),
        );
        o.insert("duration_scale".into(), opts.duration_scale.into());
        o.insert("bin_s".into(), (LAB_BIN_NS as f64 / 1e9).into());
        o.insert("capabilities".into(), opts.baseline.capabilities().into());
        insert_simulated(o, simulated);
        o.insert(
            "simulated_checks".into(),
            serde_json::to_value(&simulated.checks).unwrap_or_default(),
        );
    }
    v
}

/// Puts the simulator's phases into a `results.json` as `simulated`, and its whole run (when
/// the report has one) as `simulated_whole_run`.
pub fn insert_simulated(o: &mut serde_json::Map<String, serde_json::Value>, simulated: &Report) {
    o.insert(
        "simulated".into(),
        serde_json::to_value(&simulated.phases).unwrap_or_default(),
    );
    if let Some(w) = &simulated.whole_run {
        o.insert(
            "simulated_whole_run".into(),
            serde_json::to_value(w).unwrap_or_default(),
        );
    }
}

/// The whole run as one phase (what a whole-run expectation or paper figure is set beside):
/// each VM's mean, measured and simulated, the aggregate and the unfairness index.
fn whole_run_md(w: &vqos_sim::report::Phase, sim: Option<&vqos_sim::report::Phase>) -> String {
    let mut s = format!(
        "### The whole run ({:.1}–{:.1} s: from the first settle to the end)\n\n\
         | VM | measured | simulated |\n|---|---:|---:|\n",
        w.start_s, w.end_s
    );
    let sim_of = |f: &dyn Fn(&vqos_sim::report::Phase) -> Option<f64>| {
        sim.and_then(f).map_or("–".into(), mbit)
    };
    for (name, v) in &w.vifs {
        let simv = sim_of(&|p| p.vifs.get(name).map(|x| x.mean_bps));
        let _ = writeln!(s, "| {name} | {} | {simv} |", mbit(v.mean_bps));
    }
    let _ = writeln!(
        s,
        "| **aggregate** | {} | {} |\n\nUnfairness index: measured {:.1} %, simulated {}.\n",
        mbit(w.aggregate_bps),
        sim_of(&|p| Some(p.aggregate_bps)),
        w.unfairness * 100.0,
        sim.map_or("–".into(), |p| format!("{:.1} %", p.unfairness * 100.0))
    );
    s
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn write(path: &Path, text: &str) -> Result<(), LabError> {
    std::fs::write(path, text).map_err(|source| LabError::Io {
        what: path.display().to_string(),
        source,
    })
}

/// Writes every file of a run into `outcome.out_dir`.
pub fn write_all(
    sc: &Scenario,
    opts: &LabOptions,
    outcome: &LabOutcome,
    bins: &[Vec<u64>],
    sim_bins: &[Vec<u64>],
) -> Result<(), LabError> {
    let dir = &outcome.out_dir;
    write(&dir.join("timeseries.csv"), &timeseries_csv(sc, bins))?;
    write(&dir.join("report.md"), &report_md(sc, opts, outcome))?;
    write(&dir.join("rates.svg"), &rates_svg(sc, bins, sim_bins))?;
    // Last: its presence says the run finished (`--resume` keeps such runs, crate::resume).
    let json = serde_json::to_string_pretty(&outcome.results).unwrap_or_default();
    write(&dir.join("results.json"), &(json + "\n"))
}

/// `t_s,vm,rate_bps`, one row per VM per 100 ms bin (t_s = the bin's end).
pub fn timeseries_csv(sc: &Scenario, bins: &[Vec<u64>]) -> String {
    let mut s = String::from("t_s,vm,rate_bps\n");
    let nbins = bins.first().map_or(0, Vec::len);
    let bin_s = LAB_BIN_NS as f64 / 1e9;
    for b in 0..nbins {
        for (vm, vm_bins) in sc.vms.iter().zip(bins) {
            let rate = vm_bins[b] as f64 * 8.0 / bin_s;
            let _ = writeln!(s, "{:.1},{},{:.0}", (b + 1) as f64 * bin_s, vm.name, rate);
        }
    }
    s
}

fn mbit(bps: f64) -> String {
    format!("{:.1}", bps / 1e6)
}

/// The Markdown report: phase by phase measured vs reference vs simulated, the expectations,
/// CPU, and what the baseline could express.
pub fn report_md(sc: &Scenario, opts: &LabOptions, o: &LabOutcome) -> String {
    let r = &o.report;
    let mut s = String::new();
    let _ = writeln!(s, "# {} — lab run under `{}`\n", sc.name, opts.baseline);
    if !sc.description.is_empty() {
        let _ = writeln!(s, "{}\n", sc.description);
    }
    let mut cmd = format!("vqos lab run {}", opts.scenario.display());
    if opts.baseline.name() != "vqos" {
        let _ = write!(cmd, " --baseline {}", opts.baseline);
    }
    if opts.duration_scale != 1.0 {
        let _ = write!(cmd, " --duration-scale {}", opts.duration_scale);
    }
    let _ = writeln!(s, "Command: `{cmd}`  ");
    let _ = writeln!(
        s,
        "Switch: {} (engine `{}` for vqos), capacity {} Mbit/s, {} VMs, {:.1} s, samples every {} ms.\n",
        opts.baseline,
        r.engine,
        mbit(sc.capacity_bps as f64),
        sc.vms.len(),
        sc.duration_ns as f64 / 1e9,
        LAB_BIN_NS / 1_000_000
    );
    let _ = writeln!(
        s,
        "**What this switch can express.** {}\n",
        opts.baseline.capabilities()
    );
    let mut ctl = Vec::new();
    if sc.fairness {
        ctl.push("fairness adjuster");
    }
    if sc.pid_ecn {
        ctl.push("PID-ECN");
    }
    if !ctl.is_empty() {
        let how = if opts.baseline.name() == "vqos" {
            "run in vqosd; TCP endpoints run Reno with ECN"
        } else {
            "not available under this baseline (the run has none)"
        };
        let _ = writeln!(s, "**Controllers.** {} ({how}).\n", ctl.join(", "));
    }
    let _ = writeln!(s, "## Phases (Mbit/s; means leave out the settle time)\n");
    for (k, ph) in r.phases.iter().enumerate() {
        let sim = o.simulated.phases.get(k);
        let _ = writeln!(
            s,
            "### Phase {} ({:.1}–{:.1} s)\n",
            k + 1,
            ph.start_s,
            ph.end_s
        );
        let _ = writeln!(
            s,
            "| VM | measured | reference | simulated | measured vs reference |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|");
        for (name, v) in &ph.vifs {
            let simv = sim
                .and_then(|p| p.vifs.get(name))
                .map_or("–".into(), |x| mbit(x.mean_bps));
            let err = if v.expected_bps > 0.0 {
                format!("{:+.1} %", (v.mean_bps / v.expected_bps - 1.0) * 100.0)
            } else {
                "–".into()
            };
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {simv} | {err} |",
                mbit(v.mean_bps),
                mbit(v.expected_bps)
            );
        }
        let exp_sum: f64 = ph.vifs.values().map(|v| v.expected_bps).sum();
        let _ = writeln!(
            s,
            "| **aggregate** | {} | {} | {} | |",
            mbit(ph.aggregate_bps),
            mbit(exp_sum),
            sim.map_or("–".into(), |p| mbit(p.aggregate_bps))
        );
        let _ = writeln!(
            s,
            "\nUnfairness index: measured {:.1} %, simulated {}.\n",
            ph.unfairness * 100.0,
            sim.map_or("–".into(), |p| format!("{:.1} %", p.unfairness * 100.0))
        );
    }
    if let Some(w) = &r.whole_run {
        s.push_str(&whole_run_md(w, o.simulated.whole_run.as_ref()));
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(s, "## Warnings\n");
        for w in &r.warnings {
            let _ = writeln!(s, "- {w}");
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Expectations of the scenario\n");
    if r.checks.is_empty() {
        let _ = writeln!(s, "The scenario states none.\n");
    } else {
        let _ = writeln!(s, "| expectation | measured | lab | simulator |");
        let _ = writeln!(s, "|---|---|---|---|");
        for c in &r.checks {
            // Matched by their statement: the simulator leaves out the lab-only ones.
            let sim = o
                .simulated
                .checks
                .iter()
                .find(|s| s.expectation == c.expectation);
            let simc = sim.map_or("–", |c| pf(c.pass));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {simc} |",
                c.expectation,
                c.measured,
                pf(c.pass)
            );
        }
        let passed = r.checks.iter().filter(|c| c.pass).count();
        let _ = writeln!(s, "\n{passed} of {} passed in the lab.\n", r.checks.len());
    }
    if !o.latency.is_empty() {
        s.push_str(&latency_md(&o.latency));
    }
    s.push_str(&crate::app::report_table(&o.apps));
    let _ = writeln!(s, "## CPU\n");
    let _ = writeln!(
        s,
        "vqosd: {:.1} % of one core; kernel softirq (all cores summed): {:.1} % of one core, over \
         the whole run. The machine has {} cores shared by iperf3, the kernel's TCP stacks and the \
         switch, so these numbers are indicative, not a benchmark.\n",
        o.vqosd_percent,
        o.softirq_percent,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let _ = writeln!(
        s,
        "## Files\n\n`results.json`, `timeseries.csv` (t_s, vm, rate_bps per 100 ms), `rates.svg` \
         (measured solid, reference dashed, simulator dotted), `logs/` (vqosd and iperf3 JSON).\n\n\
         ![rates](rates.svg)"
    );
    s
}

fn us(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.0}"))
}

/// The report's latency section: one table per probe, a row per phase.
pub fn latency_md(latency: &[crate::probe::ProbeResult]) -> String {
    let mut s = String::from("## Latency (RTT of the probes, µs)\n\n");
    s.push_str(
        "One probe client per phase, over the phase minus its settle time; nearest-rank \
         percentiles of that phase's samples.\n\n",
    );
    for p in latency {
        let _ = writeln!(
            s,
            "### {} → sink, {} {} bytes at {}/s\n",
            p.vm, p.protocol, p.size, p.rate_per_s
        );
        let _ = writeln!(
            s,
            "| phase | window (s) | samples | lost | p50 | p99 | p99.9 | mean | max |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
        for ph in &p.phases {
            let _ = write!(
                s,
                "| {} | {:.1}–{:.1} | {} | {} | {} | {} | {} | {} | {} |",
                ph.phase,
                ph.from_s,
                ph.to_s,
                ph.samples,
                ph.lost,
                us(ph.p50_us),
                us(ph.p99_us),
                us(ph.p999_us),
                us(ph.mean_us),
                us(ph.max_us)
            );
            if let Some(e) = &ph.error {
                let _ = write!(s, " {e}");
            }
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

fn pf(pass: bool) -> &'static str {
    if pass {
        "pass"
    } else {
        "**FAIL**"
    }
}

/// Rates (bits/s) per VM from byte bins, averaged over windows of `window` bins.
fn smoothed(bins: &[u64], bin_ns: u64, window: usize) -> Vec<(f64, f64)> {
    bins.chunks(window)
        .enumerate()
        .map(|(k, c)| {
            let t = (k * window + c.len()) as f64 * bin_ns as f64 / 1e9;
            let bytes: u64 = c.iter().sum();
            (
                t,
                bytes as f64 * 8.0 / (c.len() as f64 * bin_ns as f64 / 1e9),
            )
        })
        .collect()
}

/// Per-VM rate over time in Mbit/s: measured (solid), simulated (dotted), the reference
/// allocation per phase (dashed), phases marked. Without measured bins (`bins` empty: a
/// simulator-only plot) the legend has no "measured".
pub fn rates_svg(sc: &Scenario, bins: &[Vec<u64>], sim_bins: &[Vec<u64>]) -> String {
    let mbit = |series: Vec<(f64, f64)>| series.into_iter().map(|(t, r)| (t, r / 1e6)).collect();
    let sim_window = (500_000_000 / BIN_NS).max(1) as usize;
    // The reference needs no rates: empty bins give the same phases and allocations.
    let no_bins = vec![Vec::new(); sc.vms.len()];
    let measured = !bins.is_empty();
    let ref_bins = if measured { bins } else { &no_bins };
    let report = vqos_sim::build_report(sc, "ref", ref_bins, LAB_BIN_NS, 0.0);
    let mut lines = Vec::new();
    for (i, vm) in sc.vms.iter().enumerate() {
        if let Some(b) = bins.get(i) {
            lines.push(Line {
                series: i,
                style: Style::Solid,
                points: mbit(smoothed(b, LAB_BIN_NS, 5)),
                markers: false,
            });
        }
        if let Some(b) = sim_bins.get(i) {
            lines.push(Line {
                series: i,
                style: Style::Dotted,
                points: mbit(smoothed(b, BIN_NS, sim_window)),
                markers: false,
            });
        }
        for ph in &report.phases {
            if let Some(v) = ph.vifs.get(&vm.name) {
                let y = v.expected_bps / 1e6;
                lines.push(Line {
                    series: i,
                    style: Style::Dashed,
                    points: vec![(ph.start_s, y), (ph.end_s, y)],
                    markers: false,
                });
            }
        }
    }
    Plot {
        title: format!("{}: per-VM rate", sc.name),
        xlabel: "time (s)".into(),
        ylabel: "Mbit/s".into(),
        series: sc.vms.iter().map(|v| v.name.clone()).collect(),
        lines,
        phases: report
            .phases
            .iter()
            .enumerate()
            .map(|(k, p)| (p.start_s, format!("phase {}", k + 1)))
            .collect(),
        styles: [
            (Style::Solid, "measured"),
            (Style::Dotted, "simulated"),
            (Style::Dashed, "reference"),
        ]
        .into_iter()
        .filter(|(s, _)| measured || *s != Style::Solid)
        .map(|(s, l)| (s, l.to_string()))
        .collect(),
        x_max: Some(sc.duration_ns as f64 / 1e9),
    }
    .svg()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc() -> Scenario {
        Scenario::parse(
            "name = \"t<1>\"\nduration = \"1s\"\ncapacity = \"200Mbit\"\n\
             [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nweight = 3\n",
        )
        .unwrap()
    }

    #[test]
    fn the_whole_run_section_sets_the_measured_means_beside_the_simulated() {
        let sc = Scenario::parse(
            "name = \"w\"\nduration = \"4s\"\nsettle = \"1s\"\ncapacity = \"200Mbit\"\n\
             [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\n\
             [[paper]]\nfigure = \"F\"\nwhole_run = true\nunfairness = true\nvalue = 0.5\n",
        )
        .unwrap();
        // 1 s bins: vm1 12.5 MB/s (100 Mbit/s), vm2 6.25 (50).
        let lab = vqos_sim::build_report(
            &sc,
            "lab",
            &[vec![12_500_000; 4], vec![6_250_000; 4]],
            1_000_000_000,
            0.0,
        );
        let sim = vqos_sim::build_report(
            &sc,
            "sim",
            &vec![vec![12_500_000; 4]; 2],
            1_000_000_000,
            0.0,
        );
        let md = whole_run_md(lab.whole_run.as_ref().unwrap(), sim.whole_run.as_ref());
        assert!(md.contains("### The whole run (1.0–4.0 s"), "{md}");
        assert!(
            md.contains("| vm1 | 100.0 | 100.0 |\n| vm2 | 50.0 | 100.0 |"),
            "{md}"
        );
        assert!(md.contains("| **aggregate** | 150.0 | 200.0 |"), "{md}");
        assert!(
            md.contains("Unfairness index: measured 33.3 %, simulated 0.0 %."),
            "{md}"
        );
        let md = whole_run_md(lab.whole_run.as_ref().unwrap(), None);
        assert!(md.contains("| vm2 | 50.0 | – |"), "{md}");
    }

    #[test]
    fn csv_has_a_row_per_vm_per_bin() {
        let bins = vec![vec![1_250_000; 10], vec![3_750_000; 10]];
        let csv = timeseries_csv(&sc(), &bins);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "t_s,vm,rate_bps");
        assert_eq!(lines.len(), 21);
        assert_eq!(lines[1], "0.1,vm1,100000000");
        assert_eq!(lines[2], "0.1,vm2,300000000");
    }

    #[test]
    fn svg_is_well_formed_and_escapes_names() {
        let bins = vec![vec![1_250_000; 10], vec![3_750_000; 10]];
        let sim = vec![vec![125_000; 100], vec![375_000; 100]];
        let svg = rates_svg(&sc(), &bins, &sim);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t&lt;1&gt;"));
        // Measured and simulated per VM, and one reference step per VM and phase.
        assert_eq!(svg.matches("<polyline").count(), 6);
        assert!(
            svg.contains("stroke-dasharray=\"6 4\""),
            "reference drawn dashed"
        );
    }

    #[test]
    fn a_simulator_only_plot_has_no_measured_lines() {
        let sim = vec![vec![125_000; 100], vec![375_000; 100]];
        let svg = rates_svg(&sc(), &[], &sim);
        // Simulated and one reference step per VM.
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(
            !svg.contains(">measured<") && svg.contains(">simulated<"),
            "{svg}"
        );
    }
}
