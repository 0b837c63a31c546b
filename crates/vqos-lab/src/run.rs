//! The runner: builds the topology, drives iperf3 and the events on the scenario's clock,
//! samples the per-VM counters every 100 ms, measures CPU, tears down, writes the results
//! (with iperf3's own 1 s intervals as `iperf3_intervals`).

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vqos_sched::VifPolicy;
use vqos_sim::scenario::{Scenario, Traffic};
use vqos_sim::{build_report, simulate, BIN_NS};

use crate::app::{self, AppLog, AppSpec};
pub use crate::outcome::{LabOptions, LabOutcome, LAB_BIN_NS};
use crate::output;
use crate::probe::{self, ProbeResult, ProbeSpec, Probes};
use crate::sys::{self, spawn, Cleanup};
use crate::topo::{self, Baseline, Topology};
use crate::LabError;

mod calibrate;
mod generators;

use generators::{
    discard_socket, flood_failed, iperf_args, start_app, start_flood, Client, Generator, Load,
};

/// First iperf3 server port; VM `i` uses `BASE + 2i` and `BASE + 2i + 1` (alternately, so a
/// restarted client never meets a server still busy with the previous test).
const IPERF_BASE_PORT: u16 = 5201;

/// UDP port of VM `i`'s flood at its receiver: `FLOOD_BASE_PORT + i`.
const FLOOD_BASE_PORT: u16 = 9100;

/// Multiplies every time of `sc` by `f`.
pub fn scale_scenario(sc: &mut Scenario, f: f64) {
    let s = |t: u64| (t as f64 * f).round() as u64;
    sc.duration_ns = s(sc.duration_ns);
    sc.settle_ns = s(sc.settle_ns);
    for v in &mut sc.vms {
        v.start_ns = s(v.start_ns);
        v.stop_ns = s(v.stop_ns);
    }
    for e in &mut sc.events {
        e.at_ns = s(e.at_ns);
        e.start_ns = e.start_ns.map(s);
        e.stop_ns = e.stop_ns.map(s);
    }
}

/// Turns timestamped cumulative counters into uniform bins of `bin_ns` by linear
/// interpolation of each counter at the bin edges.
pub fn resample(
    samples: &[(u64, Vec<u64>)],
    nvm: usize,
    bin_ns: u64,
    nbins: usize,
) -> Vec<Vec<u64>> {
    let at = |t: u64, i: usize| -> f64 {
        let k = samples.partition_point(|(ts, _)| *ts <= t);
        if k == 0 {
            return samples.first().map_or(0.0, |s| s.1[i] as f64);
        }
        let (t0, v0) = &samples[k - 1];
        match samples.get(k) {
            None => v0[i] as f64,
            Some((t1, v1)) => {
                let f = (t - t0) as f64 / (t1 - t0).max(1) as f64;
                v0[i] as f64 + f * (v1[i] as f64 - v0[i] as f64)
            }
        }
    };
    (0..nvm)
        .map(|i| {
            (0..nbins)
                .map(|b| {
                    let a = at(b as u64 * bin_ns, i);
                    let z = at((b as u64 + 1) * bin_ns, i);
                    (z - a).max(0.0).round() as u64
                })
                .collect()
        })
        .collect()
}

fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // UTC date-time from the Unix time (civil-from-days).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn io_err(what: &Path) -> impl FnOnce(std::io::Error) -> LabError + '_ {
    move |source| LabError::Io {
        what: what.display().to_string(),
        source,
    }
}

/// Runs a scenario on real traffic and writes `results.json`, `timeseries.csv`, `report.md`
/// and `rates.svg` into the output directory. Everything it created is gone when it returns,
/// whether it succeeded, failed or was interrupted ([`crate::install_interrupt_handler`]).
pub fn run_lab(opts: &LabOptions) -> Result<LabOutcome, LabError> {
    sys::clear_interrupt();
    let text = std::fs::read_to_string(&opts.scenario).map_err(io_err(&opts.scenario))?;
    let mut sc = Scenario::parse(&text).map_err(|e| LabError::Scenario {
        file: opts.scenario.display().to_string(),
        source: e,
    })?;
    if !(opts.duration_scale > 0.0 && opts.duration_scale.is_finite()) {
        return Err(LabError::Invalid(format!(
            "Invalid duration scale {}: expected a positive number",
            opts.duration_scale
        )));
    }
    scale_scenario(&mut sc, opts.duration_scale);
    if let Some(e) = opts.engine {
        sc.engine = e;
    }
    if let Some(v) = opts.algorithms {
        sc.variant = v;
    }
    if let Some(n) = opts.threads {
        sc.threads = n;
    }
    let probe_specs = probe::parse_probes(&text, &sc)
        .map_err(|e| LabError::Invalid(format!("{}: {e}", opts.scenario.display())))?;
    let app_specs = app::parse_apps(&text, &sc)
        .map_err(|e| LabError::Invalid(format!("{}: {e}", opts.scenario.display())))?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LabError::NotRoot);
    }
    if sys::run(&["iperf3", "--version"]).is_err() {
        return Err(LabError::MissingTool(
            "iperf3 (apt-get install -y iperf3)".into(),
        ));
    }
    app::check_tools(&app_specs)?;
    let out_dir = opts
        .out_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("lab-out/{}-{}", sc.name, timestamp())));
    let logs = out_dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(io_err(&logs))?;

    // The prediction first: it needs no root and no traffic.
    let sim_out = simulate(&sc, 1).map_err(|e| LabError::Invalid(format!("Simulator: {e}")))?;
    let simulated = build_report(&sc, "sim", &sim_out.bins, BIN_NS, sim_out.cpu_busy);

    let mut cleanup = Cleanup::default();
    let measured = drive(&sc, opts, (&probe_specs, &app_specs), &logs, &mut cleanup);
    cleanup.teardown();
    let (samples, vqosd_cpu_s, softirq_s, wall_s, latency, iperf_logs, app_logs) = measured?;
    let apps = app::results(&app_logs);
    if opts.progress {
        eprintln!();
    }

    let nbins = sc.duration_ns.div_ceil(LAB_BIN_NS) as usize;
    let bins = resample(&samples, sc.vms.len(), LAB_BIN_NS, nbins);
    let vqosd_percent = vqosd_cpu_s / wall_s * 100.0;
    let softirq_percent = softirq_s / wall_s * 100.0;
    let busy = if opts.baseline == Baseline::Vqos {
        vqosd_percent / 100.0
    } else {
        softirq_percent / 100.0
    };
    let mut report = build_report(&sc, "lab", &bins, LAB_BIN_NS, busy);
    if opts.baseline != Baseline::Vqos {
        report.engine = format!("none: baseline {}", opts.baseline);
    } else if sc.threads > 1 {
        report.engine = format!("{} on {} threads", report.engine, sc.threads);
    }
    report.checks.extend(probe::checks(&probe_specs, &latency));
    let mut results =
        output::results_json(&report, &simulated, opts, vqosd_percent, softirq_percent);
    if let Some(o) = results.as_object_mut() {
        o.insert(
            "latency".into(),
            serde_json::to_value(&latency).unwrap_or_default(),
        );
        o.insert("iperf3_intervals".into(), iperf_series(&iperf_logs));
        if !apps.is_empty() {
            o.insert(
                "apps".into(),
                serde_json::to_value(&apps).unwrap_or_default(),
            );
        }
    }
    let outcome = LabOutcome {
        out_dir: out_dir.clone(),
        results,
        report,
        simulated,
        vqosd_percent,
        softirq_percent,
        latency,
        apps,
    };
    output::write_all(&sc, opts, &outcome, &bins, &sim_out.bins)?;
    Ok(outcome)
}

type Samples = Vec<(u64, Vec<u64>)>;

/// An iperf3 client of the run: its VM, when it started (s into the run) and its JSON log.
type IperfLog = (String, f64, PathBuf);

/// What [`drive`] measured: samples, vqosd CPU s, softirq s, wall s, latency, iperf3 logs,
/// the apps' clients' logs.
type Measured = (
    Samples,
    f64,
    f64,
    f64,
    Vec<ProbeResult>,
    Vec<IperfLog>,
    Vec<AppLog>,
);

/// iperf3's own 1 s intervals, per VM: `{"vm1": [[t_s, bits_per_second], ...]}` with `t_s` the
/// middle of the interval in the run's time, from each client's JSON (`intervals[].sum`). A
/// log that cannot be read or parsed (a client killed at a restart) contributes what it has.
fn iperf_series(logs: &[IperfLog]) -> serde_json::Value {
    let mut per: std::collections::BTreeMap<String, Vec<[f64; 2]>> = Default::default();
    for (vm, start_s, path) in logs {
        let series = per.entry(vm.clone()).or_default();
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        for iv in v["intervals"].as_array().into_iter().flatten() {
            let s = &iv["sum"];
            if let (Some(a), Some(secs), Some(bps)) = (
                s["start"].as_f64(),
                s["seconds"].as_f64(),
                s["bits_per_second"].as_f64(),
            ) {
                let t = start_s + a + secs / 2.0;
                series.push([(t * 1000.0).round() / 1000.0, bps.round()]);
            }
        }
    }
    serde_json::to_value(per).unwrap_or_default()
}

/// Builds, runs and samples; returns (samples, vqosd CPU s, softirq s, wall s, latency, the
/// iperf3 clients' logs).
fn drive(
    sc: &Scenario,
    opts: &LabOptions,
    (probe_specs, app_specs): (&[ProbeSpec], &[AppSpec]),
    logs: &Path,
    cleanup: &mut Cleanup,
) -> Result<Measured, LabError> {
    // The lab's threads and children off the switch's CPU, when it has one of its own; vqosd
    // is pinned to it as it starts.
    let cpus = topo::dedicated_cpus(sc, opts.baseline);
    let _pin = match &cpus {
        Some((_, others)) => Some(sys::ThreadPin::new(others)?),
        None => None,
    };
    let topo = Topology::build(
        sc,
        cpus.map(|(c, _)| c),
        opts.baseline,
        opts.vqosd_bin.as_deref(),
        logs,
        cleanup,
    )?;
    let nvm = sc.vms.len();
    // Before the clients, so it outlives them: the VMs' CPU limits (`cpu`).
    let limits = crate::cpu_limit::for_vms(sc, &topo.prefix)?;

    // Two servers per VM in the sink.
    for i in 0..nvm {
        for k in 0..2u16 {
            let port = (IPERF_BASE_PORT + 2 * i as u16 + k).to_string();
            let pidfile = logs.join(format!("{}-srv{i}{k}.pid", topo.prefix));
            let pidfile = pidfile.display().to_string();
            let p = spawn(
                &format!("iperf3 server {port}"),
                Some(&topo.sink_ns),
                &[
                    "iperf3",
                    "-s",
                    "-p",
                    &port,
                    "-B",
                    &topo.sink_ip,
                    "-I",
                    &pidfile,
                ],
                None,
            )?;
            cleanup.services.push(p);
        }
    }
    // The apps' servers in their VMs (`[[app]]`).
    let app_scratch = std::env::temp_dir().join(format!("vqos-lab-apps-{}", topo.prefix));
    if !app_specs.is_empty() {
        cleanup.dirs.push(app_scratch.clone());
    }
    app::start_servers(
        app_specs,
        (&topo.vm_ns, &topo.vm_ip),
        &app_scratch,
        &logs.join("apps"),
        cleanup,
    )?;
    let mut app_logs: Vec<AppLog> = Vec::new();
    // Where UDP floods end: a socket per VM that never reads (held until the run ends).
    let _discard: Vec<UdpSocket> = (0..nvm)
        .map(|i| {
            let port = FLOOD_BASE_PORT + i as u16;
            if sc.is_download(i) {
                discard_socket(&topo.vm_ns[i], &topo.vm_ip[i], port)
            } else {
                discard_socket(&topo.sink_ns, &topo.sink_ip, port)
            }
        })
        .collect::<Result<_, _>>()?;
    // The latency probes' servers (threads of this process inside the sink).
    let mut probes = if probe_specs.is_empty() {
        None
    } else {
        Some(Probes::start(
            probe_specs.to_vec(),
            sc,
            &topo.sink_ns,
            &topo.sink_ip,
        )?)
    };
    std::thread::sleep(Duration::from_millis(300));
    // Before the clock, no VM sending yet: the limits named by their effect (`cpu_alone`).
    let calibrations = calibrate::vms(sc, &topo, &limits, logs)?;

    // Every time something changes: reconcile traffic, apply policies and the bottleneck.
    let mut cuts: Vec<u64> = sc.phases().iter().map(|p| p.0).collect();
    cuts.extend(sc.events.iter().map(|e| e.at_ns));
    cuts.sort_unstable();
    cuts.dedup();
    let mut next_cut = 0;
    let mut clients: Vec<Option<Client>> = (0..nvm).map(|_| None).collect();
    let mut restarts = vec![0u32; nvm];
    let mut iperf_logs: Vec<IperfLog> = Vec::new();
    let mut policies: Vec<VifPolicy> = sc.state_at(0).into_iter().map(|s| s.0.policy).collect();
    let mut bottleneck = sc.bottleneck_at(0);

    let vqosd_cpu0 = topo.vqosd_pid.and_then(sys::process_cpu_s).unwrap_or(0.0);
    let soft0 = sys::softirq_s().unwrap_or(0.0);
    let t0 = Instant::now();
    let mut samples: Samples = vec![(0, topo.vm_bytes()?)];
    let base = samples[0].1.clone();
    samples[0].1 = vec![0; nvm];
    let mut tick: u64 = 0;
    let mut last_progress = Instant::now();
    loop {
        let now_ns = t0.elapsed().as_nanos() as u64;
        // Changes due by now.
        while next_cut < cuts.len() && cuts[next_cut] <= now_ns {
            let t = cuts[next_cut];
            next_cut += 1;
            if t >= sc.duration_ns {
                continue;
            }
            let state = sc.state_at(t);
            for (i, (s, _, stop)) in state.iter().enumerate() {
                if s.policy != policies[i] {
                    topo.set_policy(i, &sc.vms[i].name, &s.policy)?;
                    policies[i] = s.policy.clone();
                }
                let app = app_specs.iter().find(|a| a.vm_index == i);
                // An app's client runs on through its VM's events (they change its policy).
                let load = |s| Load::of(if app.is_some() { &sc.vms[i].initial } else { s });
                let want = sc.active_at(i, t).then(|| load(s));
                let same = match (&clients[i], &want) {
                    (Some(c), Some(w)) => c.load == *w,
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    if let Some(mut c) = clients[i].take() {
                        c.generator
                            .stop()
                            .map_err(|e| flood_failed(&sc.vms[i].name, e))?;
                    }
                    if let Some(load) = want {
                        let k = restarts[i] % 2;
                        restarts[i] += 1;
                        let secs = (*stop.min(&sc.duration_ns) - t) as f64 / 1e9 + 1.0;
                        let generator = if let Some(a) = app {
                            let log = logs.join(format!("app-{}-{}.log", a.vm, restarts[i]));
                            app_logs.push((a.vm.clone(), a.kind, t as f64 / 1e9, log.clone()));
                            // For exactly the VM's active time.
                            let to = (topo.sink_ns.as_str(), topo.vm_ip[i].as_str());
                            start_app(a, to, secs - 1.0, &app_scratch, &log)?
                        } else if load.traffic == Traffic::Udp {
                            let (from_ns, to_ip) = if sc.is_download(i) {
                                (&topo.sink_ns, &topo.vm_ip[i])
                            } else {
                                (&topo.vm_ns[i], &topo.sink_ip)
                            };
                            let to = SocketAddr::new(
                                to_ip.parse().map_err(|e| {
                                    LabError::Invalid(format!("address {to_ip}: {e}"))
                                })?,
                                FLOOD_BASE_PORT + i as u16,
                            );
                            let log =
                                logs.join(format!("flood-{}-{}.json", sc.vms[i].name, restarts[i]));
                            start_flood(from_ns, to, secs, &load, log)?
                        } else {
                            let port = IPERF_BASE_PORT + 2 * i as u16 + k as u16;
                            let title = format!("{}-{}", topo.prefix, sc.vms[i].name);
                            let mut args = iperf_args(
                                &title,
                                &topo.sink_ip,
                                port,
                                secs,
                                &load,
                                sc.is_download(i),
                            );
                            args.extend(crate::cpu_limit::iperf_args(sc, load.packet_size));
                            let args: Vec<&str> = args.iter().map(String::as_str).collect();
                            let log =
                                logs.join(format!("iperf-{}-{}.json", sc.vms[i].name, restarts[i]));
                            iperf_logs.push((sc.vms[i].name.clone(), t as f64 / 1e9, log.clone()));
                            let p = spawn(
                                &format!("iperf3 client {}", sc.vms[i].name),
                                Some(&topo.vm_ns[i]),
                                &args,
                                Some(&log),
                            )?;
                            if let (Some(l), Some(pid)) = (&limits[i], p.pid()) {
                                l.add(pid)?;
                            }
                            Generator::Iperf(p)
                        };
                        clients[i] = Some(Client { load, generator });
                    }
                }
            }
            let b = sc.bottleneck_at(t);
            if b != bottleneck {
                topo.set_bottleneck(bottleneck, b, sc.bottleneck_queue)?;
                bottleneck = b;
            }
        }
        if let Some(p) = &mut probes {
            p.poll(now_ns, &topo.vm_ns)?;
        }
        if now_ns >= sc.duration_ns + LAB_BIN_NS / 2 {
            break;
        }
        if sys::interrupted() {
            return Err(LabError::Interrupted);
        }
        if let Some(p) = cleanup.services.iter_mut().find(|p| p.label == "vqosd") {
            if p.exited() {
                return Err(LabError::Vqosd("vqosd exited during the run".into()));
            }
        }
        tick += 1;
        let due = t0 + Duration::from_nanos(tick * LAB_BIN_NS);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let t = t0.elapsed().as_nanos() as u64;
        let cum: Vec<u64> = topo
            .vm_bytes()?
            .iter()
            .zip(&base)
            .map(|(c, b)| c.saturating_sub(*b))
            .collect();
        if opts.progress && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let prev = samples.last().cloned().unwrap_or_default();
            let dt = (t - prev.0).max(1) as f64 / 1e9;
            let rates: Vec<String> = sc
                .vms
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let r = (cum[i].saturating_sub(prev.1[i])) as f64 * 8.0 / dt / 1e6;
                    format!("{} {:.0}", v.name, r)
                })
                .collect();
            let phase = sc.phases().iter().take_while(|p| p.0 <= t).count();
            eprint!(
                "\r[{} {}] {:5.1}/{:.0} s phase {} | {} Mbit/s   ",
                sc.name,
                opts.baseline,
                t as f64 / 1e9,
                sc.duration_ns as f64 / 1e9,
                phase,
                rates.join(", ")
            );
            let _ = std::io::stderr().flush();
        }
        samples.push((t, cum));
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let vqosd_cpu_s = topo
        .vqosd_pid
        .and_then(sys::process_cpu_s)
        .map_or(0.0, |c| c - vqosd_cpu0);
    let softirq_s = sys::softirq_s().unwrap_or(soft0) - soft0;
    // The last phase's probe clients end within their timeout (1 s) after the run.
    let latency = probes.map(Probes::finish).unwrap_or_default();
    for (i, c) in clients.iter_mut().enumerate() {
        if let Some(c) = c {
            c.generator
                .stop()
                .map_err(|e| flood_failed(&sc.vms[i].name, e))?;
        }
    }
    crate::cpu_limit::write_log(&limits, &calibrations, sc, logs);
    // vqosd's final counters (ECN marks, drops, controller limits) beside its log.
    if let Some(client) = &topo.client {
        if let Ok(v) = client.call::<serde_json::Value>("GET", "/v1/stats", None) {
            let text = serde_json::to_string_pretty(&v).unwrap_or_default();
            let _ = std::fs::write(logs.join("vqosd-stats.json"), text);
        }
    }
    Ok((
        samples,
        vqosd_cpu_s,
        softirq_s,
        wall_s,
        latency,
        iperf_logs,
        app_logs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf_intervals_are_placed_in_the_run_time() {
        let dir = std::env::temp_dir().join(format!("vqos-lab-iperf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("iperf-vm1-1.json");
        std::fs::write(
            &log,
            r#"{"intervals": [
                {"sum": {"start": 0, "end": 1, "seconds": 1, "bits_per_second": 1e8}},
                {"sum": {"start": 1, "end": 2, "seconds": 1, "bits_per_second": 2e8}}]}"#,
        )
        .unwrap();
        let v = iperf_series(&[
            ("vm1".into(), 6.0, log),
            ("vm2".into(), 0.0, dir.join("missing.json")),
        ]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(v["vm1"], serde_json::json!([[6.5, 1e8], [7.5, 2e8]]));
        assert_eq!(v["vm2"], serde_json::json!([]));
    }

    #[test]
    fn resample_interpolates_cumulative_counters() {
        // 1000 bytes per 100 ms, sampled at irregular times.
        let s = vec![
            (0, vec![0]),
            (150_000_000, vec![1500]),
            (200_000_000, vec![2000]),
            (400_000_000, vec![4000]),
        ];
        let b = resample(&s, 1, 100_000_000, 4);
        assert_eq!(b, vec![vec![1000, 1000, 1000, 1000]]);
    }

    #[test]
    fn scaling_scales_every_time() {
        let mut sc = Scenario::parse(
            "name = \"t\"\nduration = \"20s\"\ncapacity = \"200Mbit\"\n\
             [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"4s\"\n\
             [[event]]\nat = \"10s\"\nvm = \"vm1\"\nweight = 3\n",
        )
        .unwrap();
        scale_scenario(&mut sc, 0.5);
        assert_eq!(sc.duration_ns, 10_000_000_000);
        assert_eq!(sc.vms[1].start_ns, 2_000_000_000);
        assert_eq!(sc.events[0].at_ns, 5_000_000_000);
        assert_eq!(sc.phases().len(), 3);
    }

    #[test]
    fn timestamps_are_sortable() {
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert!(t.starts_with("20"), "{t}");
    }
}
