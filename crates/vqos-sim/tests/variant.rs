//! `variant = "paper"` in scenario files: parsed (and refused with a clear error), carried into
//! the policy set, and in force where the simulator acts on it: PID-ECN marks what an upload VM
//! sends only under vqos's variant (the paper marks only what a VM receives).

use vqos_sched::Variant;
use vqos_sim::{simulate, Scenario};

fn scenario(variant: &str) -> String {
    format!(
        r#"
name = "variant"
duration = "3s"
settle = "1s"
capacity = "10Gbit"
engine = "rr"
{variant}
[topology]
bottleneck = "200Mbit"
bottleneck_queue = 100
controllers = ["pid-ecn"]
[[vm]]
name = "vm1"
rtt = "1ms"
[[vm]]
name = "vm2"
flows = 4
rtt = "1ms"
"#
    )
}

#[test]
fn the_key_parses_and_reaches_the_policy_set() {
    let s = Scenario::parse(&scenario("")).unwrap();
    assert_eq!(
        (s.variant, s.policies_at(0).variant),
        (Variant::Vqos, Variant::Vqos)
    );
    let s = Scenario::parse(&scenario("variant = \"paper\"")).unwrap();
    assert_eq!(
        (s.variant, s.policies_at(0).variant),
        (Variant::Paper, Variant::Paper)
    );
    let e = format!(
        "{:#}",
        Scenario::parse(&scenario("variant = \"as-written\"")).unwrap_err()
    );
    assert!(e.contains("as-written") && e.contains("paper"), "{e}");
}

#[test]
fn pid_ecn_marks_what_an_upload_vm_sends_only_under_vqos() {
    let marks = |variant: &str| -> Vec<u64> {
        let s = Scenario::parse(&scenario(variant)).unwrap();
        let out = simulate(&s, 1).unwrap();
        out.counters.iter().map(|c| c.ce_marks).collect()
    };
    let ours = marks("");
    assert!(
        ours.iter().sum::<u64>() > 0,
        "vqos marks upload data: {ours:?}"
    );
    assert_eq!(marks("variant = \"paper\""), vec![0, 0]);
}
