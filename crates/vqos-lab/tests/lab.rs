//! End to end through the lab's library entry point: a 16 s scenario (2 VMs, weights 1:3 at
//! 200 Mbit/s, vm1 given a 100 Mbit/s minimum at 8 s) under vqosd, a 12 s download through the
//! router's bottleneck whose rate changes at 6 s (with PID-ECN in vqosd), a 10 s download whose
//! rates the inbound maximums decide, against the simulator's (the agreement test), a run whose vqosd
//! cannot start, an interrupted run, and a 12 s run under the `ovs` baseline (an OpenFlow meter
//! caps one VM, raised live at 6 s), and two 4 s runs showing `[topology] tso = false` hands the
//! switch MTU frames. Each checks that no namespace, link or process of the run is left. Needs root and iperf3 (the ovs test also Open vSwitch); skips with a message
//! otherwise.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use vqos_lab::{request_interrupt, run_lab, Baseline, LabError, LabOptions};

/// The runs share the interrupt flag and the machine's two cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

mod common;
use common::{can_run, leftovers};

fn scenario() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/two-vms.toml")
}

#[test]
fn short_scenario_end_to_end_under_vqosd() {
    if !can_run("short_scenario_end_to_end_under_vqosd") {
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let mut opts = LabOptions::new(scenario());
    opts.out_dir = Some(out.path().to_path_buf());
    let outcome = run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");

    let text = std::fs::read_to_string(out.path().join("results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "scenario",
        "mode",
        "engine",
        "phases",
        "checks",
        "cpu",
        "baseline",
        "simulated",
    ] {
        assert!(v.get(key).is_some(), "results.json lacks '{key}': {text}");
    }
    assert_eq!(v["scenario"], "lab-two-vms");
    assert_eq!(v["mode"], "lab");
    assert_eq!(v["baseline"], "vqos");
    assert!(
        v["cpu"]["vqosd_percent"].as_f64().unwrap() > 0.0,
        "vqosd's CPU is measured"
    );
    assert!(v["cpu"]["softirq_percent"].as_f64().is_some());
    let phases = v["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    for (k, ph) in phases.iter().enumerate() {
        for vm in ["vm1", "vm2"] {
            let got = ph["vifs"][vm]["mean_bps"].as_f64().unwrap();
            let want = ph["vifs"][vm]["expected_bps"].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 0.10 * want,
                "phase {}: {vm} {:.1} Mbit/s vs reference {:.1}",
                k + 1,
                got / 1e6,
                want / 1e6
            );
        }
    }
    // The live change took effect: vm1 doubles (50 -> 100 Mbit/s).
    let p1 = phases[0]["vifs"]["vm1"]["mean_bps"].as_f64().unwrap();
    let p2 = phases[1]["vifs"]["vm1"]["mean_bps"].as_f64().unwrap();
    assert!(p2 > 1.6 * p1, "vm1 {p1} -> {p2}");
    assert!(outcome.report.passed());
    for f in ["timeseries.csv", "report.md", "rates.svg"] {
        let meta = std::fs::metadata(out.path().join(f)).unwrap();
        assert!(meta.len() > 100, "{f} is written");
    }
    // The probe measured each phase separately.
    let lat = v["latency"].as_array().expect("latency in results.json");
    assert_eq!(lat.len(), 1);
    assert_eq!(lat[0]["vm"], "vm1");
    let lp = lat[0]["phases"].as_array().unwrap();
    assert_eq!(lp.len(), 2);
    for ph in lp {
        assert!(ph["samples"].as_u64().unwrap() > 1000, "{ph}");
        assert!(ph["p99_us"].as_f64().unwrap() >= ph["p50_us"].as_f64().unwrap());
    }
    // iperf3's own per-second series beside the switch's 100 ms samples: one point per second
    // of each TCP client, inside the run, at rates near what the switch measured.
    for vm in ["vm1", "vm2"] {
        let series = v["iperf3_intervals"][vm]
            .as_array()
            .expect("iperf3_intervals");
        assert!(series.len() >= 12, "{vm}: {series:?}");
        for p in series {
            let (t, bps) = (p[0].as_f64().unwrap(), p[1].as_f64().unwrap());
            assert!((0.0..17.5).contains(&t), "{vm}: {p}");
            assert!(bps < 210e6, "{vm}: no more than the 200 Mbit/s link: {p}");
        }
        let mean = series.iter().map(|p| p[1].as_f64().unwrap()).sum::<f64>() / series.len() as f64;
        assert!(mean > 20e6, "{vm} moved traffic: {mean}");
    }
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("## Latency"), "report.md has the latency table");
    let csv = std::fs::read_to_string(out.path().join("timeseries.csv")).unwrap();
    assert_eq!(
        csv.lines().count(),
        1 + 2 * 160,
        "16 s of 100 ms bins for 2 VMs"
    );
}

/// The router path: download (iperf3 -R) through the router's tbf, whose rate a bottleneck
/// event changes in place at 6 s; vqosd runs PID-ECN (the scenario's controllers).
#[test]
fn download_through_the_router_bottleneck_follows_its_changes() {
    if !can_run("download_through_the_router_bottleneck_follows_its_changes") {
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let mut opts =
        LabOptions::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/router-download.toml"));
    opts.out_dir = Some(out.path().to_path_buf());
    let outcome = run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
    let phases = outcome.results["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    for (k, want) in [(0, 300e6), (1, 150e6)] {
        let got: f64 = ["vm1", "vm2"]
            .iter()
            .map(|vm| phases[k]["vifs"][vm]["mean_bps"].as_f64().unwrap())
            .sum();
        assert!(
            got > 0.8 * want && got < 1.1 * want,
            "phase {}: aggregate {:.1} Mbit/s through a {:.0} Mbit/s bottleneck",
            k + 1,
            got / 1e6,
            want / 1e6
        );
    }
    let log = std::fs::read_to_string(out.path().join("logs/vqosd.log")).unwrap();
    assert!(log.contains("controllers: pid-ecn"), "{log}");
}

/// What VMs receive is scheduled (issue 23): two VMs receiving two TCP flows each under a
/// 400 Mbit/s capacity, weights 1:3, then a 250 Mbit/s min for vm1. The simulator gives the
/// reference allocation (100 / 300, then 250 / 150) within 2 %. The lab is checked on what a
/// busy machine cannot bend: the capacity holds and the weights and the min decide the order.
/// vm2 gets at least twice vm1's rate in phase 1 (1.0 without weights), and vm1 more than
/// vm2 in phase 2 (a third of it without the min). Exact shares are the benchmark's job: on a
/// quiet machine the lab is within 0.5 % of the reference (docs/benchmarks.md). With two busy
/// loops beside it the generators fall behind: vm1 measured 105.4 and vm2 260.9 Mbit/s, the
/// switch giving the room a starved sender left to the other. Before the scheduled downlink the
/// lab gave 9.3 / 11.4 Gbit/s.
#[test]
fn download_weights_and_a_min_hold_on_real_traffic_as_simulated() {
    if !can_run("download_weights_and_a_min_hold_on_real_traffic_as_simulated") {
        return;
    }
    download_weights(None);
}

/// The same on two forwarding threads: the uplink TAP has a queue per thread and each thread
/// reads one (`[uplink] queues`), each thread queues what it read on its own downlink, and
/// the capacity and each VM's share are divided among them (docs/dataplane.md, "Shards"). The
/// switch's own counters show the second thread read the uplink. Measured (one run, 2026-11-27,
/// another build at `nice 19` beside it): 99.8 / 299.2 then 250.7 / 149.8 Mbit/s against the
/// reference 100 / 300 then 250 / 150.
#[test]
fn download_weights_and_a_min_hold_on_two_threads() {
    if !can_run("download_weights_and_a_min_hold_on_two_threads") {
        return;
    }
    let out = download_weights(Some(2));
    let stats: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("logs/vqosd-stats.json")).expect("vqosd's last stats"),
    )
    .unwrap();
    let up = stats["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "uplink")
        .expect("the uplink's stats");
    // Queue 0 is thread 0's, queue 1 is lent to thread 1; the stats add the threads' counts
    // up by queue.
    let per_queue: Vec<u64> = up["tap"]["queue_rx_frames"]
        .as_array()
        .expect("a multiqueue uplink TAP")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let all = up["rx_frames"].as_u64().unwrap();
    assert!(
        per_queue.len() == 2 && per_queue.iter().all(|&n| n > 0),
        "both threads read the uplink, a queue each: {per_queue:?}"
    );
    assert_eq!(per_queue.iter().sum::<u64>(), all, "{per_queue:?}");
}

/// Runs `tests/download-weights.toml` (on `threads` forwarding threads, `None`: the
/// scenario's one) and checks its shares; the run's output directory.
fn download_weights(threads: Option<usize>) -> tempfile::TempDir {
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let mut opts =
        LabOptions::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/download-weights.toml"));
    opts.out_dir = Some(out.path().to_path_buf());
    opts.threads = threads;
    let outcome = run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
    for (k, want) in [(0, [100e6, 300e6]), (1, [250e6, 150e6])] {
        let mut lab = [0.0; 2];
        for (i, (vm, want)) in ["vm1", "vm2"].iter().zip(want).enumerate() {
            lab[i] = outcome.report.phases[k].vifs[*vm].mean_bps;
            let sim = outcome.simulated.phases[k].vifs[*vm].mean_bps;
            let reference = outcome.report.phases[k].vifs[*vm].expected_bps;
            assert_eq!(reference, want, "phase {}: {vm}'s reference", k + 1);
            assert!(
                (sim - want).abs() <= 0.02 * want,
                "phase {}: {vm}: simulator {:.1} Mbit/s against {:.1}",
                k + 1,
                sim / 1e6,
                want / 1e6
            );
        }
        let [vm1, vm2] = lab;
        let what = format!(
            "phase {}: lab {:.1} / {:.1} Mbit/s",
            k + 1,
            vm1 / 1e6,
            vm2 / 1e6
        );
        assert!(vm1 + vm2 <= 1.05 * 400e6, "{what}: above the capacity");
        if k == 0 {
            assert!(vm2 >= 2.0 * vm1, "{what}: weights 1:3 did not act");
        } else {
            assert!(vm1 > vm2, "{what}: vm1's min did not act");
        }
    }
    out
}

/// The simulator and the switch model the download direction alike: two download VMs whose
/// UDP sources outside send 1.5x their inbound maximums (4 and 6 Mbit/s) through a
/// 940 Mbit/s router. The downlink engine's cap on each VM's inbound max decides both rates
/// (the same engine and policy in both), so each VM's lab mean must not exceed the
/// simulator's by more than 3 % (a switch or a simulator without the inbound max gives 6 and
/// 9: +50 %), and must reach it within 3 % whenever the generator kept its schedule (measured:
/// within 0.2 %). The margin covers the lab's 100 ms sampling. Whether the generator kept its
/// schedule is read from its own summary (`logs/flood-VM-1.json`, `sent_bps` at least 97 % of
/// the rate asked): on a machine whose cores are taken by other work the flood thread can be
/// starved for longer than the bucket is deep (a loaded run measured 3.5 of 4.0 Mbit/s), and
/// the tokens of that gap are lost whatever the switch does; the test then says so and checks
/// the upper bound only. Why not faster: see the scenario file.
#[test]
fn download_agrees_with_the_simulator() {
    if !can_run("download_agrees_with_the_simulator") {
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let mut opts = LabOptions::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/download-agreement.toml"),
    );
    opts.out_dir = Some(out.path().to_path_buf());
    let outcome = run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
    for (vm, want, asked) in [("vm1", 4e6, 6e6), ("vm2", 6e6, 9e6)] {
        let sim = outcome.simulated.phases[0].vifs[vm].mean_bps;
        let lab = outcome.report.phases[0].vifs[vm].mean_bps;
        assert!(
            (sim - want).abs() <= 0.01 * want,
            "{vm}: simulator {:.1} Mbit/s, its inbound max {:.0}",
            sim / 1e6,
            want / 1e6
        );
        assert!(
            lab <= 1.03 * sim,
            "{vm}: lab {:.1} Mbit/s above the simulator's {:.1}",
            lab / 1e6,
            sim / 1e6
        );
        let summary = out.path().join(format!("logs/flood-{vm}-1.json"));
        let text = std::fs::read_to_string(&summary)
            .unwrap_or_else(|e| panic!("{}: {e}", summary.display()));
        let flood: serde_json::Value = serde_json::from_str(&text).unwrap();
        let sent = flood["sent_bps"]
            .as_f64()
            .unwrap_or_else(|| panic!("no sent_bps in {text}"));
        if sent >= 0.97 * asked {
            assert!(
                lab >= 0.97 * sim,
                "{vm}: lab {:.1} Mbit/s below the simulator's {:.1} (the generator sent {:.1})",
                lab / 1e6,
                sim / 1e6,
                sent / 1e6
            );
        } else {
            println!(
                "{vm}: the generator sent {:.1} of {:.1} Mbit/s (starved by other work): the \
                 lower bound is not checked",
                sent / 1e6,
                asked / 1e6
            );
        }
        println!(
            "{vm}: lab {:.1} Mbit/s, simulator {:.1}, generator {:.1}",
            lab / 1e6,
            sim / 1e6,
            sent / 1e6
        );
    }
}

#[test]
fn a_run_whose_switch_cannot_start_leaves_nothing() {
    if !can_run("a_run_whose_switch_cannot_start_leaves_nothing") {
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let mut opts = LabOptions::new(scenario());
    opts.out_dir = Some(out.path().to_path_buf());
    // A "vqosd" that exits at once: the namespaces exist by then.
    opts.vqosd_bin = Some(PathBuf::from("/bin/false"));
    let err = run_lab(&opts).expect_err("the switch cannot start");
    assert!(matches!(err, LabError::Vqosd(_)), "{err:?}");
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "nothing survives a failed run"
    );
}

#[test]
fn an_interrupted_run_leaves_nothing() {
    if !can_run("an_interrupted_run_leaves_nothing") {
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let mut opts = LabOptions::new(scenario());
    opts.out_dir = Some(out.path().to_path_buf());
    let stopper = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(4));
        request_interrupt();
    });
    let err = run_lab(&opts).expect_err("interrupted");
    stopper.join().unwrap();
    assert!(matches!(err, LabError::Interrupted), "{err:?}");
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "nothing survives an interrupt"
    );
    assert!(!out.path().join("results.json").exists());
}

/// The `ovs` baseline: a private Open vSwitch (userspace datapath) whose OpenFlow meter caps vm1
/// at 100 Mbit/s, raised to 150 Mbit/s at 6 s (mod-meter); vm2 is uncapped and sends 200 Mbit/s,
/// so the 400 Mbit/s uplink is not the limit and only the meter decides vm1's rate.
#[test]
fn ovs_baseline_meters_cap_a_vm() {
    if !can_run("ovs_baseline_meters_cap_a_vm") {
        return;
    }
    if let Err(e) = vqos_lab::ovs::OvsTools::find() {
        println!("SKIP ovs_baseline_meters_cap_a_vm: {e}");
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("ovs-cap.toml");
    std::fs::write(
        &file,
        "name = \"lab-ovs-cap\"\nduration = \"12s\"\ncapacity = \"400Mbit\"\nsettle = \"2s\"\n\
         [[vm]]\nname = \"vm1\"\nmax = \"100Mbit\"\n\
         [[vm]]\nname = \"vm2\"\nrate = \"200Mbit\"\n\
         [[event]]\nat = \"6s\"\nvm = \"vm1\"\nmax = \"150Mbit\"\n",
    )
    .unwrap();
    let mut opts = LabOptions::new(&file);
    opts.baseline = Baseline::Ovs;
    opts.out_dir = Some(out.path().join("out"));
    let started = std::time::Instant::now();
    let outcome = run_lab(&opts).expect("lab run under ovs");
    println!("ovs run took {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");

    let text = std::fs::read_to_string(out.path().join("out/results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["baseline"], "ovs");
    assert!(v["capabilities"].as_str().unwrap().contains("meter"));
    assert!(
        v["cpu"]["vqosd_percent"].as_f64().unwrap() > 0.0,
        "ovs-vswitchd's CPU is measured"
    );
    let phases = v["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    let mut prev = 0.0;
    for (k, cap) in [(0, 100e6), (1, 150e6)] {
        let vm1 = phases[k]["vifs"]["vm1"]["mean_bps"].as_f64().unwrap();
        let vm2 = phases[k]["vifs"]["vm2"]["mean_bps"].as_f64().unwrap();
        println!(
            "phase {}: vm1 {:.1} Mbit/s (cap {:.0}), vm2 {:.1} Mbit/s",
            k + 1,
            vm1 / 1e6,
            cap / 1e6,
            vm2 / 1e6
        );
        assert!(
            (vm1 - cap).abs() <= 0.10 * cap,
            "phase {}: capped vm1 {:.1} Mbit/s vs its cap {:.0}",
            k + 1,
            vm1 / 1e6,
            cap / 1e6
        );
        assert!(
            vm2 > vm1,
            "phase {}: uncapped vm2 {vm2} <= vm1 {vm1}",
            k + 1
        );
        assert!(vm1 > prev);
        prev = vm1;
    }
    let flows = std::fs::read_to_string(out.path().join("out/logs/ovs-flows.txt")).unwrap();
    assert!(flows.contains("meter:1"), "{flows}");
    assert!(outcome.results["phases"].is_array());
}

/// `[topology] tso = false` (issue 25: ANCS Fig. 8 and Tables 1–2 in MTU frames, as the paper's
/// netback saw them): the switch reads frames of at most one segment, where with the default
/// it reads TCP's TSO super-frames. Read from vqosd's own counters (`logs/vqosd-stats.json`),
/// one 4 s run each way.
#[test]
fn tso_false_makes_the_switch_read_mtu_frames() {
    if !can_run("tso_false_makes_the_switch_read_mtu_frames") {
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mtu-frames.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let mean_frame = |tso: bool| -> f64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mtu-frames.toml");
        std::fs::write(&path, text.replace("tso = false", &format!("tso = {tso}"))).unwrap();
        let mut opts = LabOptions::new(&path);
        opts.out_dir = Some(dir.path().join("out"));
        run_lab(&opts).expect("lab run");
        assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
        let stats = std::fs::read_to_string(dir.path().join("out/logs/vqosd-stats.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        let port = v["ports"]
            .as_array()
            .unwrap()
            .iter()
            // The lab names vm1's port `<prefix>v0`, the uplink `<prefix>u`.
            .find(|p| p["name"].as_str().is_some_and(|n| n.ends_with("v0")))
            .unwrap_or_else(|| panic!("no vif read frames: {stats}"))
            .clone();
        let frames = port["rx_frames"].as_f64().unwrap();
        assert!(frames > 1000.0, "vm1 sent: {port}");
        port["rx_bytes"].as_f64().unwrap() / frames
    };
    let mtu = mean_frame(false);
    assert!(mtu <= 1600.0, "tso = false: mean frame {mtu:.0} bytes");
    let tso = mean_frame(true);
    assert!(tso > 3000.0, "tso = true: mean frame {tso:.0} bytes");
}

/// `[[app]]`: a real vsftpd and nginx in the VMs' namespaces, a curl download and a wrk
/// pressure test from the sink; the clients' results reach `results.json` and the report, the
/// VMs' rates are their servers', and nothing survives the run (nginx's workers included).
#[test]
fn ftp_and_http_servers_in_the_vms_carry_their_traffic() {
    let test = "ftp_and_http_servers_in_the_vms_carry_their_traffic";
    if !can_run(test) {
        return;
    }
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let sc = vqos_sim::Scenario::parse(&text).unwrap();
    let specs = vqos_lab::app::parse_apps(&text, &sc).unwrap();
    if let Err(e) = vqos_lab::app::check_tools(&specs) {
        println!("SKIP {test}: {e}");
        return;
    }
    let _g = (
        SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        vqos_testkit::machine_lock(),
    );
    // nginx's workers and vsftpd's sessions are not this process's children: count the
    // servers' processes by name, before and after (another nginx on the host stays as it was).
    let servers = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                (cmd.starts_with("nginx") || cmd.contains("vsftpd"))
                    .then(|| format!("{} {cmd}", e.file_name().to_string_lossy()))
            })
            .collect();
        v.sort();
        v
    };
    let before = servers();
    // A relative output directory, as the docs' commands give it: the servers are given
    // absolute paths all the same (nginx reads relative ones against its own prefix).
    let out = tempfile::tempdir_in(".").unwrap();
    let cwd = std::env::current_dir().unwrap();
    let rel = out.path().strip_prefix(&cwd).unwrap_or(out.path());
    assert!(rel.is_relative(), "{rel:?}");
    let mut opts = LabOptions::new(&file);
    opts.out_dir = Some(rel.to_path_buf());
    let outcome = run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
    assert_eq!(servers(), before, "a server's process survived the run");

    let ftp = outcome.apps.iter().find(|a| a.vm == "ftp").expect("ftp");
    assert!(ftp.error.is_none(), "{ftp:?}");
    assert!(ftp.bytes.unwrap() > 1_000_000, "{ftp:?}");
    let web = outcome.apps.iter().find(|a| a.vm == "web").expect("web");
    let h = web.http.as_ref().unwrap_or_else(|| panic!("{web:?}"));
    assert_eq!(web.from_s, 2.0);
    assert!(h.requests > 100 && h.errors == 0, "{h:?}");
    assert_eq!(h.percentiles_us.len(), 4, "{h:?}");
    // Paced: 4 connections, each waiting 1 ms after an answer.
    assert!(h.requests_per_s < 4_000.0, "{h:?}");
    // The rates are the servers' own traffic: the FTP server sends through the whole run,
    // the nginx server only while wrk runs (phase 2 of 3).
    let rate = |p: usize, vm: &str| outcome.report.phases[p].vifs.get(vm).map(|v| v.mean_bps);
    assert!(
        rate(0, "ftp").unwrap() > 10e6,
        "{:?}",
        outcome.report.phases[0]
    );
    assert!(
        rate(1, "web").unwrap() > 0.1e6,
        "{:?}",
        outcome.report.phases[1]
    );
    assert_eq!(outcome.results["apps"].as_array().map(Vec::len), Some(2));
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(
        md.contains("## Applications") && md.contains("| web | http | 2.0 |"),
        "{md}"
    );
}
