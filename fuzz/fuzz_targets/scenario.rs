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
    // Keep each run short: a few VMs for at most 50 ms of simulated time, and at most about
    // 10^6 datagrams. The simulator models every packet, so its work grows with the rates: a
    // download UDP source outside sends at `capacity` (or its `rate`), and a fuzzed capacity
    // of 16666666 Gbit/s made 10^11 datagrams in 8 ms (a timeout, not a fault).
    if sc.duration_ns > 50_000_000 || sc.vms.len() > 8 {
        return;
    }
    let fastest = sc
        .vms
        .iter()
        .map(|v| (v.initial.rate_bps.unwrap_or(0), v.initial.packet_size))
        .chain(
            sc.events
                .iter()
                .map(|e| (e.settings.rate_bps.unwrap_or(0), e.settings.packet_size)),
        )
        .map(|(rate, size)| u128::from(rate.max(sc.capacity_bps)) / (8 * u128::from(size.max(1))))
        .max()
        .unwrap_or(0);
    let datagrams = fastest * u128::from(sc.duration_ns) / 1_000_000_000 * sc.vms.len() as u128;
    if datagrams > 1_000_000 {
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
