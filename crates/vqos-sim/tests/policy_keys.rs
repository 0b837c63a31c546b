//! The policy keys `burst`, `max_in` and `max_out` in scenario files: parsed, refused with the
//! key named, and in force (upload: `max_out` and the burst; download: `max_in`); the keys that
//! act on a download VM only under the scheduled downlink (with `downlink = "bucket"` they are
//! accepted with a warning); per-VM directions.

use vqos_sched::policy::UNLIMITED_IN_BPS;
use vqos_sim::{run_text, Scenario};

fn scenario(direction: &str, vm1: &str) -> String {
    format!(
        r#"
name = "keys"
duration = "2s"
settle = "500ms"
capacity = "1Gbit"
engine = "vqos"
[topology]
direction = "{direction}"
[[vm]]
name = "vm1"
traffic = "udp"
{vm1}
[[vm]]
name = "vm2"
traffic = "udp"
"#
    )
}

#[test]
fn keys_parse_into_the_policy() {
    let s = Scenario::parse(&scenario(
        "upload",
        "max_out = \"200Mbit\"\nmax_in = \"100Mbit\"\nburst = \"64KiB\"",
    ))
    .unwrap();
    let p = &s.policies_at(0).vifs[0].policy;
    assert_eq!(
        (p.max_bps, p.max_in_bps, p.burst_bytes),
        (Some(200_000_000), Some(100_000_000), Some(65_536))
    );
    let s = Scenario::parse(&scenario("upload", "max_in = \"unlimited\"")).unwrap();
    assert_eq!(
        s.policies_at(0).vifs[0].policy.max_in_bps,
        Some(UNLIMITED_IN_BPS)
    );
    // Download: the engine gets the policy as written (as vqosd does); the reference takes
    // the inbound policy, which the downlink engine enforces: max_in as its max.
    let s = Scenario::parse(&scenario(
        "download",
        "max = \"200Mbit\"\nmax_in = \"100Mbit\"\nburst = \"64KiB\"",
    ))
    .unwrap();
    let p = &s.policies_at(0).vifs[0].policy;
    assert_eq!(
        (p.max_bps, p.max_in_bps, p.burst_bytes),
        (Some(200_000_000), Some(100_000_000), Some(65_536))
    );
    let r = s.reference_policy(0, p);
    assert_eq!(
        (r.max_bps, r.max_in_bps, r.burst_bytes),
        (Some(100_000_000), None, Some(65_536))
    );
    // Without max_in, download follows max, as the data plane does.
    let s = Scenario::parse(&scenario("download", "max = \"200Mbit\"")).unwrap();
    let p = &s.policies_at(0).vifs[0].policy;
    assert_eq!(s.reference_policy(0, p).max_bps, Some(200_000_000));
}

#[test]
fn bad_values_name_the_key() {
    for (keys, needle) in [
        ("burst = \"0\"", "burst 0B is out of range 1B..=1GiB"),
        ("burst = \"2GiB\"", "burst 2GiB is out of range"),
        (
            "burst = \"64Kbit\"",
            "vm 'vm1'.burst: Invalid size '64Kbit'",
        ),
        ("max_in = \"fast\"", "vm 'vm1'.max_in: Invalid rate 'fast'"),
        (
            "max = \"1Mbit\"\nmax_out = \"2Mbit\"",
            "duplicate field `max`",
        ),
    ] {
        // The message with its sources, as the CLI prints it.
        let e = Scenario::parse(&scenario("upload", keys)).unwrap_err();
        let mut err = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            err = format!("{err}: {s}");
            source = s.source();
        }
        assert!(err.contains(needle), "{keys}: {err}");
        assert_eq!(err.matches(needle).count(), 1, "repeated: {err}");
    }
}

#[test]
fn max_out_holds_upload_and_max_in_holds_download() {
    let keys = "max_out = \"200Mbit\"\nmax_in = \"100Mbit\"\nburst = \"64KiB\"";
    for (direction, want) in [("upload", 200e6), ("download", 100e6)] {
        let (report, _) = run_text(&scenario(direction, keys), 1).unwrap();
        let vm1 = report.phases[0].vifs["vm1"].mean_bps;
        assert!(
            (vm1 - want).abs() <= 0.02 * want,
            "{direction}: vm1 {:.1} Mbit/s, want {:.0}",
            vm1 / 1e6,
            want / 1e6
        );
    }
}

/// The message with its sources, as the CLI prints it.
fn full_error(text: &str) -> String {
    let e = Scenario::parse(text).unwrap_err();
    let mut err = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        err = format!("{err}: {s}");
        source = s.source();
    }
    err
}

#[test]
fn scheduling_keys_act_on_a_download_vm_under_the_scheduled_downlink() {
    // vm1 and vm2 receive 1 Gbit/s each of UDP on a 1 Gbit/s downlink: weight 3 gives vm1
    // three quarters, with no warning.
    let text = scenario("download", "weight = 3");
    assert!(Scenario::parse(&text).unwrap().warnings.is_empty());
    let (report, out) = run_text(&text, 1).unwrap();
    let p = &report.phases[0];
    assert_eq!(p.vifs["vm1"].expected_bps, 750e6);
    let (vm1, vm2) = (p.vifs["vm1"].mean_bps, p.vifs["vm2"].mean_bps);
    assert!((vm1 - 750e6).abs() <= 0.02 * 750e6, "vm1 {vm1}");
    assert!((vm2 - 250e6).abs() <= 0.02 * 250e6, "vm2 {vm2}");
    // The excess waited in the queues and was dropped there (UDP is not ECN-capable).
    assert!(out.counters[1].queue_full + out.counters[1].aqm_drops > 0);
}

#[test]
fn scheduling_keys_on_a_download_vm_are_accepted_with_a_warning_without_the_scheduled_downlink() {
    for (keys, needle) in [
        (
            "weight = 3",
            "vm 'vm1': weight cannot act on a download VM and is ignored",
        ),
        (
            "min = \"10Mbit\"",
            "vm 'vm1': min cannot act on a download VM",
        ),
        (
            "weight = 2\npriority = 1",
            "vm 'vm1': weight, priority cannot act on a download VM",
        ),
        (
            "[[event]]\nat = \"1s\"\nvm = \"vm1\"\nweight = 2",
            "event at 1s for 'vm1': weight cannot act on a download VM",
        ),
    ] {
        let text = if keys.starts_with("[[event]]") {
            format!("{}{keys}\n", scenario("download", ""))
        } else {
            scenario("download", keys)
        }
        .replace(
            "engine = \"vqos\"",
            "engine = \"vqos\"\ndownlink = \"bucket\"",
        );
        let s = Scenario::parse(&text).unwrap();
        assert_eq!(s.warnings.len(), 1, "{keys}: {:?}", s.warnings);
        assert!(s.warnings[0].contains(needle), "{keys}: {}", s.warnings[0]);
        // The report repeats it, in the text and in the JSON.
        let (report, _) = run_text(&text, 1).unwrap();
        assert!(vqos_sim::render_text(&report).contains(&format!("warning: {needle}")));
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["warnings"][0].as_str().unwrap().contains(needle));
        // And the key acts on nothing: vm1 and vm2 (no keys) share the link equally.
        let p = &report.phases[0];
        assert_eq!(p.vifs["vm1"].expected_bps, p.vifs["vm2"].expected_bps);
    }
    // No warning without such keys, and none in the JSON.
    let (report, _) = run_text(&scenario("download", ""), 1).unwrap();
    assert!(report.warnings.is_empty());
    assert!(serde_json::to_value(&report)
        .unwrap()
        .get("warnings")
        .is_none());
    // The same keys on an upload VM of a download scenario are the engine's.
    let text = scenario(
        "download",
        "direction = \"upload\"\nweight = 3\nmin = \"10Mbit\"",
    );
    let s = Scenario::parse(&text).unwrap();
    assert!(s.warnings.is_empty());
    assert!(!s.is_download(0) && s.is_download(1) && s.mixed_directions());
    assert!(full_error(&scenario("upload", "direction = \"sideways\""))
        .contains("vm 'vm1'.direction: 'sideways' (expected \"upload\" or \"download\")"));
    // Direction is not a key an event may change.
    let text = format!(
        "{}[[event]]\nat = \"1s\"\nvm = \"vm1\"\ndirection = \"upload\"\n",
        scenario("download", "")
    );
    assert!(full_error(&text).contains("unknown field `direction`"));
}

#[test]
fn a_download_vm_gets_its_inbound_max_an_upload_vm_its_share_in_one_scenario() {
    // vm1 uploads (engine, 1 Gbit/s host link out), vm2 downloads (max_in 100 Mbit/s, host
    // link in): no bottleneck, so the two directions do not compete.
    let text = scenario(
        "download",
        "direction = \"upload\"\nmax_out = \"600Mbit\"\nmax_in = \"50Mbit\"",
    )
    .replace(
        "[[vm]]\nname = \"vm2\"\ntraffic = \"udp\"",
        "[[vm]]\nname = \"vm2\"\ntraffic = \"udp\"\nmax_in = \"100Mbit\"\nrate = \"300Mbit\"",
    );
    for (downlink, dropped_by) in [("scheduled", "the downlink's queue"), ("bucket", "bucket")] {
        let text = text.replace(
            "engine = \"vqos\"",
            &format!("engine = \"vqos\"\ndownlink = \"{downlink}\""),
        );
        let (report, out) = run_text(&text, 1).unwrap();
        let p = &report.phases[0];
        let (vm1, vm2) = (p.vifs["vm1"].mean_bps, p.vifs["vm2"].mean_bps);
        assert!((vm1 - 600e6).abs() <= 0.02 * 600e6, "{downlink}: vm1 {vm1}");
        assert!((vm2 - 100e6).abs() <= 0.02 * 100e6, "{downlink}: vm2 {vm2}");
        assert_eq!(p.vifs["vm2"].expected_bps, 100e6);
        assert_eq!(p.vifs["vm1"].expected_bps, 600e6);
        // What the source sent above the max was dropped (queue or bucket); the upload engine
        // never saw vm2.
        let c = &out.counters[1];
        let dropped = match downlink {
            "bucket" => c.rate_limited,
            _ => c.queue_full + c.aqm_drops,
        };
        assert!(dropped > 0, "{downlink}: nothing dropped by {dropped_by}");
        assert_eq!(c.policed, 0);
    }
}

/// `downlink_flows`: the lab's flow queues per VM (the simulator's flows are fluid within a
/// VM); the scheduled downlink's only, in 1..=1024.
#[test]
fn downlink_flows_is_read_and_checked() {
    let base = scenario("download", "");
    let with = |extra: &str| format!("{extra}\n{base}");
    assert_eq!(Scenario::parse(&base).unwrap().downlink_flows, 64);
    let s = Scenario::parse(&with("downlink_flows = 1")).unwrap();
    assert_eq!(s.downlink_flows, 1);
    for (extra, says) in [
        (
            "downlink_flows = 0",
            "downlink_flows: 0 is outside 1..=1024",
        ),
        ("downlink_flows = 2000", "outside 1..=1024"),
        (
            "downlink = \"bucket\"\ndownlink_flows = 8",
            "the flow queues are the scheduled downlink's",
        ),
    ] {
        let e = full_error(&with(extra));
        assert!(e.contains(says), "{extra}: {e}");
    }
}

#[test]
fn a_cpu_limit_is_parsed_warned_about_and_refused_where_it_cannot_act() {
    let tcp = |vm1: &str| scenario("download", vm1).replace("traffic = \"udp\"\n", "");
    let s = Scenario::parse(&tcp("cpu = \"12.5%\"")).unwrap();
    assert_eq!(
        s.vms.iter().map(|v| v.cpu_limit).collect::<Vec<_>>(),
        [Some(0.125), None]
    );
    // The simulator predicts the VM without it, and says so.
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    assert!(
        s.warnings[0].contains("vm 'vm1': the simulator does not model a VM's CPU"),
        "{}",
        s.warnings[0]
    );
    let (report, _) = run_text(&tcp("cpu = \"12.5%\""), 1).unwrap();
    let p = &report.phases[0];
    assert_eq!(p.vifs["vm1"].expected_bps, p.vifs["vm2"].expected_bps);
    // A lab-only expectation (about the CPU limit) is left out of the simulator's checks, with
    // a warning; the others are checked.
    let text = format!(
        "{}[[expect]]\nphase = 1\nratio_at_least = 1.2\nlab_only = true\n\
         [[expect]]\nphase = 1\nratio_at_most = 1.1\n",
        tcp("cpu = \"12.5%\"")
    );
    let (report, _) = run_text(&text, 1).unwrap();
    assert_eq!(report.checks.len(), 1, "{:?}", report.checks);
    assert!(report.checks[0].expectation.contains("at most 1.1"));
    assert!(report
        .warnings
        .iter()
        .any(|w| w.contains("expect (phase 1): lab only")));
    // The lab's report checks both.
    let sc = Scenario::parse(&text).unwrap();
    let bins = vec![vec![1_000_000u64, 1_000_000]; 2];
    assert_eq!(
        vqos_sim::build_report(&sc, "lab", &bins, 1_000_000_000, 0.0)
            .checks
            .len(),
        2
    );
    // Not a percentage, or out of range: named.
    for (cpu, needle) in [
        ("0.25", "vm 'vm1'.cpu: '0.25' is not a share of a core"),
        ("3%", "vm 'vm1'.cpu: 3 % is outside 3.4 % to 6400 %"),
        ("7000%", "vm 'vm1'.cpu: 7000 % is outside"),
    ] {
        let e = full_error(&tcp(&format!("cpu = \"{cpu}\"")));
        assert!(e.contains(needle), "{cpu}: {e}");
    }
    // A UDP flood cannot be limited: refused, also when an event makes it one.
    let e = full_error(&scenario("download", "cpu = \"50%\""));
    assert!(
        e.contains("vm 'vm1': cpu limits the VM's TCP endpoint"),
        "{e}"
    );
    let text = format!(
        "{}[[event]]\nat = \"1s\"\nvm = \"vm1\"\ntraffic = \"udp\"\n",
        tcp("cpu = \"50%\"")
    );
    assert!(full_error(&text).contains("cpu limits the VM's TCP endpoint"));
}

#[test]
fn a_limit_named_by_its_effect_is_parsed_and_refused_where_it_cannot_act() {
    let tcp = |vm1: &str| scenario("download", vm1).replace("traffic = \"udp\"\n", "");
    let s = Scenario::parse(&tcp("cpu_alone = \"60%\"")).unwrap();
    let vm1 = &s.vms[0];
    assert_eq!((vm1.cpu_alone, vm1.cpu_limit), (Some(0.6), None));
    assert_eq!(s.vms[1].cpu_alone, None);
    // The simulator predicts the VM without it, and says so.
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("the simulator does not model a VM's CPU") && w.contains("60%")),
        "{:?}",
        s.warnings
    );
    for (keys, needle) in [
        (
            "cpu_alone = \"0%\"",
            "vm 'vm1'.cpu_alone: '0%' is not a share of the link",
        ),
        ("cpu_alone = \"120%\"", "'120%' is not a share of the link"),
        ("cpu_alone = \"0.6\"", "'0.6' is not a share of the link"),
        (
            "cpu = \"5%\"\ncpu_alone = \"60%\"",
            "give cpu (a share of a core) or cpu_alone (the lab finds the share), not both",
        ),
    ] {
        let e = full_error(&tcp(keys));
        assert!(e.contains(needle), "{keys}: {e}");
    }
    // A UDP flood cannot be limited, calibrated or not.
    let e = full_error(&scenario("download", "cpu_alone = \"60%\""));
    assert!(e.contains("cpu limits the VM's TCP endpoint"), "{e}");
}
