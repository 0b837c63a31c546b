//! A VM's CPU limit (`cpu` on a `[[vm]]`) on real traffic: the limited VM's iperf3 runs in a
//! cgroup with that CFS quota (the kernel counts its periods), every endpoint reads a segment
//! at a time, the run's log lists the limit, and no cgroup, namespace or process survives the
//! run. What the limit does to the rates is an experiment (docs/experiments.md, "The
//! receiver's CPU"), not asserted here. Needs root and iperf3; skips with a message otherwise.

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
