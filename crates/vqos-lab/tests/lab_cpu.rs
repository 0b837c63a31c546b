//! A VM's CPU limit (`cpu` on a `[[vm]]`) on real traffic: the limited VM's iperf3 runs in a
//! cgroup with that CFS quota (the kernel counts its periods), every endpoint reads a segment
//! at a time, the run's log lists the limit, and no cgroup, namespace or process survives the
//! run. A limit named by its effect (`cpu_alone`) is calibrated before the run, with the VM
//! alone, and the run uses the share found. What the limit does to the rates is an experiment
//! (docs/experiments.md, "The receiver's CPU"), not asserted here, nor whether this machine
//! reaches the calibration's target. Needs root and iperf3; skips with a message otherwise.

use std::path::Path;

use vqos_lab::{run_lab, LabOptions};

mod common;
use common::{can_run, leftovers};

#[test]
fn a_vms_cpu_limit_holds_its_endpoint_and_leaves_nothing() {
    if !can_run("a_vms_cpu_limit_holds_its_endpoint_and_leaves_nothing") {
        return;
    }
    let _g = vqos_testkit::machine_lock();
    let out = tempfile::tempdir().unwrap();
    let mut opts =
        LabOptions::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpu-limit.toml"));
    opts.out_dir = Some(out.path().to_path_buf());
    let outcome = run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
    let logs = out.path().join("logs");
    let limits: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("cpu-limits.json")).unwrap())
            .unwrap();
    // Only vm1 is limited: 4 % of a core, in 30 ms periods, which its iperf3 ran in.
    let l = limits.as_object().unwrap();
    assert_eq!(l.keys().collect::<Vec<_>>(), ["vm1"], "{limits}");
    assert_eq!(l["vm1"]["cpu"], 0.04);
    assert_eq!(l["vm1"]["period_us"], 30_000);
    let periods = l["vm1"]["throttling"]["periods"].as_u64().unwrap();
    assert!(
        periods > 0,
        "vm1's endpoint never ran in its group: {limits}"
    );
    // Both endpoints read a segment (1500 − 52 bytes) at a time.
    for vm in ["vm1", "vm2"] {
        let log = std::fs::read_to_string(logs.join(format!("iperf-{vm}-1.json"))).unwrap();
        let v: serde_json::Value = serde_json::from_str(&log).unwrap();
        assert_eq!(v["start"]["test_start"]["blksize"], 1448, "{vm}");
        assert_eq!(v["start"]["test_start"]["reverse"], 1, "{vm}");
    }
    // The simulator's report says it does not model the limit.
    let warnings = outcome.simulated.warnings.join("\n");
    assert!(
        warnings.contains("the simulator does not model a VM's CPU"),
        "{warnings}"
    );
}

#[test]
fn a_limit_named_by_its_effect_is_calibrated_alone_and_then_used() {
    if !can_run("a_limit_named_by_its_effect_is_calibrated_alone_and_then_used") {
        return;
    }
    let _g = vqos_testkit::machine_lock();
    let out = tempfile::tempdir().unwrap();
    let mut opts =
        LabOptions::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpu-alone.toml"));
    opts.out_dir = Some(out.path().to_path_buf());
    run_lab(&opts).expect("lab run");
    assert_eq!(leftovers(), Vec::<String>::new(), "nothing survives a run");
    let logs = out.path().join("logs");
    let limits: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("cpu-limits.json")).unwrap())
            .unwrap();
    let l = &limits["vm1"];
    let c = &l["calibration"];
    // 60 % of the 300 Mbit/s bottleneck, sought in at most 6 measurements of vm1 alone.
    assert_eq!(c["target_bps"], 180e6, "{limits}");
    let steps = c["steps"].as_array().unwrap();
    assert!((1..=6).contains(&steps.len()), "{limits}");
    let mut n = 0;
    for s in steps {
        n += 1;
        let f = s["fraction"].as_f64().unwrap();
        assert!((0.034..=1.0).contains(&f), "{limits}");
        // Each measurement is iperf3's own, with vm1 the receiver.
        let log = std::fs::read_to_string(logs.join(format!("calibrate-vm1-{n}.json"))).unwrap();
        let v: serde_json::Value = serde_json::from_str(&log).unwrap();
        assert_eq!(v["start"]["test_start"]["reverse"], 1);
        let got = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap();
        assert_eq!(s["rate_bps"].as_f64().unwrap(), got);
    }
    // The run used the share kept, the step closest to the target, and vm1's endpoint ran in
    // its group.
    assert_eq!(l["cpu"], c["fraction"], "{limits}");
    let off = |s: &serde_json::Value| (s["rate_bps"].as_f64().unwrap() - 180e6).abs();
    let best = steps.iter().map(off).fold(f64::INFINITY, f64::min);
    assert_eq!(off(c), best, "{limits}");
    assert!(l["throttling"]["periods"].as_u64().unwrap() > 0, "{limits}");
    assert!(!l.as_object().unwrap().contains_key("vm2") && limits.get("vm2").is_none());
}
