//! `vqos lab paper ancs-fig8` and `ancs-table1-2`: sweeps over the number of VMs, generated
//! scenarios rather than files, each point one lab run per switch.

use std::fmt::Write as _;

use super::*;

pub(super) fn sweep_cpu(
    opts: &PaperOptions,
    baselines: &[Baseline],
    md: &mut String,
) -> Result<(), LabError> {
    let out = &opts.out_dir;
    let mut csv = String::from(
        "vms,baseline,switch_cpu_percent,vqosd_percent,softirq_percent,aggregate_mbps\n",
    );
    let mut series: Vec<Series> = baselines
        .iter()
        .map(|b| (b.to_string(), Vec::new()))
        .collect();
    md.push_str("Switch CPU (% of one core; vqos = vqosd + softirq, kernel baselines = softirq) and aggregate Mbit/s, one run each.\n\n| VMs |");
    for b in baselines {
        let _ = write!(md, " {b} CPU | {b} Mbit/s |");
    }
    md.push_str("\n|---|");
    for _ in baselines {
        md.push_str("---:|---:|");
    }
    md.push('\n');
    for n in 1..=8usize {
        let file = out.join(format!("scenarios/ancs-fig8-{n}vms.toml"));
        write(&file, &cpu_scenario(n, 8))?;
        let _ = write!(md, "| {n} |");
        for (k, &b) in baselines.iter().enumerate() {
            match one_run(opts, &file, b, out.join(format!("{n}vms-{b}"))) {
                Ok(o) => {
                    let cpu = switch_cpu(b, &o);
                    let agg = o.report.phases.first().map_or(0.0, |p| p.aggregate_bps) / 1e6;
                    series[k].1.push((n as f64, cpu));
                    let _ = writeln!(
                        csv,
                        "{n},{b},{cpu:.2},{:.2},{:.2},{agg:.1}",
                        o.vqosd_percent, o.softirq_percent
                    );
                    let _ = write!(md, " {cpu:.1} | {agg:.0} |");
                }
                Err(LabError::Interrupted) => return Err(LabError::Interrupted),
                Err(e) => {
                    let _ = write!(md, " failed: {e} | |");
                }
            }
        }
        md.push('\n');
    }
    write(&out.join("cpu.csv"), &csv)?;
    write(
        &out.join("cpu.svg"),
        &line_svg(
            "ANCS Fig. 8: switch CPU vs number of VMs",
            "VMs",
            "% of one core",
            &series,
        ),
    )?;
    md.push_str("\n![cpu](cpu.svg)\n");
    Ok(())
}

pub(super) fn sweep_latency(
    opts: &PaperOptions,
    baselines: &[Baseline],
    md: &mut String,
) -> Result<(), LabError> {
    let out = &opts.out_dir;
    let mut csv =
        String::from("vms,baseline,protocol,samples,lost,p50_us,p99_us,p999_us,aggregate_mbps\n");
    let mut series: Vec<Series> = Vec::new();
    for b in baselines {
        for p in ["udp", "tcp"] {
            series.push((format!("{b} {p} p99"), Vec::new()));
        }
    }
    md.push_str(
        "RTT in µs from a probe VM (64-byte UDP and TCP request/response, 500/s each) while N \
         VMs send greedy TCP in MTU frames (weight 1, 940 Mbit/s, `tso = false`), one run each; p50 / p99 over the run \
         minus its 2 s settle.\n\n| VMs | baseline | UDP p50 | UDP p99 | TCP p50 | TCP p99 | lost | aggregate Mbit/s |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let f = |v: Option<f64>| v.map_or("–".into(), |x| format!("{x:.0}"));
    // N = 0: the probe alone, the paper's idle baseline.
    for n in 0..=5usize {
        let file = out.join(format!("scenarios/ancs-table1-2-{n}vms.toml"));
        write(&file, &latency_scenario(n, 10))?;
        for (k, &b) in baselines.iter().enumerate() {
            match one_run(opts, &file, b, out.join(format!("{n}vms-{b}"))) {
                Ok(o) => {
                    let agg = o.report.phases.first().map_or(0.0, |p| p.aggregate_bps) / 1e6;
                    let mut cells = Vec::new();
                    let mut lost = 0;
                    for (j, pr) in o.latency.iter().enumerate() {
                        let ph = pr.phases.first();
                        let p50 = ph.and_then(|p| p.p50_us);
                        let p99 = ph.and_then(|p| p.p99_us);
                        lost += ph.map_or(0, |p| p.lost);
                        cells.push(f(p50));
                        cells.push(f(p99));
                        if let (Some(v), Some(s)) = (p99, series.get_mut(2 * k + j)) {
                            s.1.push((n as f64, v));
                        }
                        let _ = writeln!(
                            csv,
                            "{n},{b},{},{},{},{},{},{},{agg:.1}",
                            pr.protocol,
                            ph.map_or(0, |p| p.samples),
                            ph.map_or(0, |p| p.lost),
                            f(p50),
                            f(p99),
                            f(ph.and_then(|p| p.p999_us))
                        );
                    }
                    let _ = writeln!(
                        md,
                        "| {n} | {b} | {} | {lost} | {agg:.0} |",
                        cells.join(" | ")
                    );
                }
                Err(LabError::Interrupted) => return Err(LabError::Interrupted),
                Err(e) => {
                    let _ = writeln!(md, "| {n} | {b} | failed: {e} | | | | | |");
                }
            }
        }
    }
    write(&out.join("latency.csv"), &csv)?;
    write(
        &out.join("latency.svg"),
        &line_svg(
            "ANCS Tables 1-2: probe p99 RTT vs number of loading VMs",
            "VMs loading the link",
            "p99 RTT (µs)",
            &series,
        ),
    )?;
    md.push_str("\n![latency](latency.svg)\n");
    Ok(())
}
