//! Simulator bugs found by mutation (issue 11), one test each: every test failed before its fix.

use vqos_sim::run_text;

/// Two VMs of unlimited UDP on 1 Gbit/s under `engine`.
fn unlimited_udp(engine: &str) -> String {
    format!(
        r#"
name = "udp"
duration = "2s"
settle = "500ms"
capacity = "1Gbit"
engine = "{engine}"
[[vm]]
name = "vm1"
traffic = "udp"
[[vm]]
name = "vm2"
traffic = "udp"
weight = 3
"#
    )
}

/// Before: an unlimited UDP source filled its queue only once simulated time had moved past
/// its last fill, and nothing woke the loop for it, so under the engines without a periodic
/// tick (`vqos`, `rr`, `tcm`, `policer`) the run jumped straight to its end and reported
/// 0 Mbit/s.
#[test]
fn unlimited_udp_fills_the_link_under_every_engine() {
    for engine in ["vqos", "rr", "tcm", "policer", "ancs", "c2qos"] {
        let (report, _) = run_text(&unlimited_udp(engine), 1).unwrap();
        let p = &report.phases[0];
        assert!(
            p.aggregate_bps > 0.95e9,
            "{engine}: aggregate {:.1} Mbit/s",
            p.aggregate_bps / 1e6
        );
        // Weighted engines split 1 : 3; the others at least give both VMs something.
        let vm1 = p.vifs["vm1"].mean_bps;
        assert!(vm1 > 0.0, "{engine}: vm1 got nothing");
    }
}

/// Before: `settle` ≥ `duration` was accepted and the report was silently 0 (or measured on a
/// sliver of the run).
#[test]
fn a_settle_time_that_leaves_nothing_to_measure_is_refused() {
    let text = unlimited_udp("vqos").replace("settle = \"500ms\"", "settle = \"2s\"");
    let err = run_text(&text, 1).unwrap_err();
    assert!(err.contains("settle: 2s"), "{err}");
}

/// Before: any duration was accepted; a typo of a few zeros asked the simulator for bins of
/// years of traffic (and aborted on the allocation).
#[test]
fn durations_are_bounded() {
    let text = unlimited_udp("vqos").replace("duration = \"2s\"", "duration = \"100000000s\"");
    let err = run_text(&text, 1).unwrap_err();
    assert!(err.contains("longer than the 3600 s"), "{err}");
}
