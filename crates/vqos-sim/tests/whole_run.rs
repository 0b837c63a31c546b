//! Whole-run expectations (`whole_run = true`): the means over the whole run after the first
//! settle, as the fairness paper gives its 600 s figures; what they may check; that they read
//! the bins they are given (the lab's as well as the simulator's).

use vqos_sim::{build_report, Scenario};

const FILE: &str = r#"
name = "whole"
duration = "20s"
settle = "2s"
capacity = "100Mbit"
[[vm]]
name = "vm1"
[[vm]]
name = "vm2"
[[event]]
at = "10s"
vm = "vm1"
weight = 2
[[expect]]
whole_run = true
unfairness_at_most = 0.3
[[expect]]
phase = 1
ratio_at_most = 1.1
"#;

#[test]
fn a_whole_run_expectation_reads_the_means_of_the_whole_run() {
    let sc = Scenario::parse(FILE).unwrap();
    // 1 s bins: vm1 sends 10 MB/s for 10 s then 2 MB/s; vm2 the reverse. Over 2..20 s:
    // vm1 (8·10 + 10·2) / 18 = 5.56 MB/s, vm2 (8·2 + 10·10) / 18 = 6.44 MB/s, so the
    // unfairness (equal weights at the start) is 0.074 although each phase alone is 0.67.
    let mut vm1 = vec![10_000_000u64; 10];
    vm1.extend([2_000_000; 10]);
    let mut vm2 = vec![2_000_000u64; 10];
    vm2.extend([10_000_000; 10]);
    let r = build_report(&sc, "lab", &[vm1, vm2], 1_000_000_000, 0.0);
    let whole = &r.checks[0];
    assert_eq!(whole.expectation, "whole run: unfairness at most 30%");
    assert!(whole.pass, "{whole:?}");
    assert!(whole.measured.starts_with("7.4%"), "{whole:?}");
    // The per-phase one beside it is unchanged: phase 1 is 10 vs 2.
    assert!(!r.checks[1].pass && r.checks[1].expectation.starts_with("phase 1:"));
}

#[test]
fn a_whole_run_expectation_takes_only_checks_over_the_vms() {
    let with = |x: &str| FILE.replace("unfairness_at_most = 0.3", x);
    for (x, needle) in [
        (
            "aggregate_at_least = 0.9",
            "expect (whole run): a whole-run expectation takes unfairness_at_most",
        ),
        (
            "unfairness_at_most = 0.3\nphase = 1",
            "expect (whole run): give either phase or whole_run = true",
        ),
    ] {
        let e = Scenario::parse(&with(x)).unwrap_err().to_string();
        assert!(e.contains(needle), "{x}: {e}");
    }
    // Without whole_run a phase is still required.
    let e = Scenario::parse(&FILE.replace("whole_run = true\n", ""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("expect (phase 0): phase must be 1..=2"), "{e}");
}

#[test]
fn the_report_carries_the_whole_run_when_a_paper_number_is_about_it() {
    // No whole-run expectation: only a `[[paper]]` figure over the whole run asks for it.
    let base = FILE.replace(
        "whole_run = true\nunfairness_at_most = 0.3",
        "phase = 2\nratio_at_most = 9",
    );
    let paper = "[[paper]]\nfigure = \"F\"\nwhole_run = true\nunfairness = true\nvalue = 0.64\n";
    let bins = || {
        let mut vm1 = vec![10_000_000u64; 10];
        vm1.extend([2_000_000; 10]);
        let mut vm2 = vec![2_000_000u64; 10];
        vm2.extend([10_000_000; 10]);
        vec![vm1, vm2]
    };
    let without = build_report(
        &Scenario::parse(&base).unwrap(),
        "sim",
        &bins(),
        1_000_000_000,
        0.0,
    );
    assert_eq!(without.whole_run, None);
    let json = serde_json::to_value(&without).unwrap();
    assert!(json.get("whole_run").is_none(), "{json}");

    let sc = Scenario::parse(&format!("{base}{paper}")).unwrap();
    let r = build_report(&sc, "sim", &bins(), 1_000_000_000, 0.0);
    let whole = r.whole_run.as_ref().expect("the whole run");
    assert_eq!((whole.start_s, whole.end_s), (2.0, 20.0));
    // vm1 (8·10 + 10·2) / 18 MB/s over 2..20 s, as in the first test.
    let vm1 = whole.vifs["vm1"].mean_bps;
    assert!((vm1 - 100e6 / 18.0 * 8.0).abs() < 1.0, "{vm1}");
    assert!(
        (whole.unfairness - 0.074).abs() < 0.001,
        "{}",
        whole.unfairness
    );
    // The checks and phases are those of the file without the paper's number.
    assert_eq!((&r.phases, &r.checks), (&without.phases, &without.checks));
    let text = vqos_sim::render_text(&r);
    assert!(
        text.contains("\nwhole run [2.0s, 20.0s)  aggregate 96.0 Mbit/s  unfairness 7.4%\n  vm1 "),
        "{text}"
    );
    assert!(!vqos_sim::render_text(&without).contains("whole run"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        json["whole_run"]["vifs"]["vm2"]["mean_bps"].as_f64(),
        Some(whole.vifs["vm2"].mean_bps)
    );
}
