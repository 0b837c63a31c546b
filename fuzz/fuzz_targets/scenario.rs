//! The scenario parser (vqos-sim) on arbitrary text; short scenarios that parse are simulated
//! and reported too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vqos_sim::{build_report, simulate, Scenario, BIN_NS};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(sc) = Scenario::parse(text) else {
        return;
    };
    // Keep each run short: a few VMs for at most 50 ms of simulated time.
    if sc.duration_ns > 50_000_000 || sc.vms.len() > 8 {
        return;
    }
    if let Ok(out) = simulate(&sc, 1) {
        let report = build_report(&sc, "sim", &out.bins, BIN_NS, out.cpu_busy);
        assert_eq!(report.phases.len(), sc.phases().len());
        for p in &report.phases {
            assert!(p.aggregate_bps.is_finite() && p.aggregate_bps >= 0.0);
        }
    }
});
