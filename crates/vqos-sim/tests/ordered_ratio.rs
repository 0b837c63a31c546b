//! Directional ratios (`ordered = true`): the first VM's rate over the second's, so a check
//! that one VM gets more fails when the other does; the largest-over-smallest ratio passes
//! either way.

use vqos_sim::{build_report, Scenario};

const FILE: &str = r#"
name = "ordered"
duration = "10s"
settle = "2s"
capacity = "100Mbit"
[[vm]]
name = "vm1"
[[vm]]
name = "vm2"
[[expect]]
phase = 1
ratio_at_least = 2.0
vms = ["vm2", "vm1"]
[[expect]]
phase = 1
ratio_at_least = 2.0
vms = ["vm2", "vm1"]
ordered = true
"#;

/// 1 s bins: `a` bytes a second for vm1, `b` for vm2.
fn report(a: u64, b: u64) -> Vec<(String, String, bool)> {
    let sc = Scenario::parse(FILE).unwrap();
    let r = build_report(&sc, "lab", &[vec![a; 10], vec![b; 10]], 1_000_000_000, 0.0);
    r.checks
        .iter()
        .map(|c| (c.expectation.clone(), c.measured.clone(), c.pass))
        .collect()
}

#[test]
fn an_ordered_ratio_fails_when_the_other_vm_is_ahead() {
    // vm1 ahead, five times vm2: the unordered check passes, the ordered one fails.
    let c = report(10_000_000, 2_000_000);
    assert_eq!(c[0].0, "phase 1: largest/smallest rate at least 2");
    assert!(c[0].2 && c[0].1 == "5.00", "{c:?}");
    assert_eq!(c[1].0, "phase 1: vm2/vm1 rate at least 2");
    assert!(!c[1].2 && c[1].1 == "0.20", "{c:?}");
    // vm2 ahead: both pass, with the same number.
    let c = report(2_000_000, 10_000_000);
    assert!(c[0].2 && c[1].2 && c[1].1 == "5.00", "{c:?}");
}

#[test]
fn an_ordered_ratio_over_a_silent_pair_passes_neither_way() {
    let c = report(0, 0);
    assert!(!c[1].2, "{c:?}");
    let most = FILE.replace(
        "ratio_at_least = 2.0\nvms = [\"vm2\", \"vm1\"]\nordered",
        "ratio_at_most = 2.0\nvms = [\"vm2\", \"vm1\"]\nordered",
    );
    let sc = Scenario::parse(&most).unwrap();
    let r = build_report(&sc, "lab", &[vec![0; 10], vec![0; 10]], 1_000_000_000, 0.0);
    assert!(!r.checks[1].pass, "{:?}", r.checks[1]);
}

#[test]
fn ordered_takes_a_ratio_and_two_vms() {
    let with = |from: &str, to: &str| {
        let text = FILE.replacen(from, to, 2);
        Scenario::parse(&text).unwrap_err().to_string()
    };
    let e = with(
        "vms = [\"vm2\", \"vm1\"]\nordered",
        "vms = [\"vm2\"]\nordered",
    );
    assert!(
        e.contains("ordered = true takes two vms, the first over the second (got 1)"),
        "{e}"
    );
    let e = with(
        "ratio_at_least = 2.0\nvms = [\"vm2\", \"vm1\"]\nordered",
        "aggregate_at_least = 0.9\nordered",
    );
    assert!(
        e.contains("ordered = true goes with ratio_at_most or ratio_at_least"),
        "{e}"
    );
}
