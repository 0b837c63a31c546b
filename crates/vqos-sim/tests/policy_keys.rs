//! The policy keys `burst`, `max_in` and `max_out` in scenario files: parsed, refused with the
//! key named, and in force (upload: `max_out` and the burst; download: `max_in`).

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
    // Download: the engine enforces the inbound max, with the default burst.
    let s = Scenario::parse(&scenario(
        "download",
        "max = \"200Mbit\"\nmax_in = \"100Mbit\"\nburst = \"64KiB\"",
    ))
    .unwrap();
    let p = &s.policies_at(0).vifs[0].policy;
    assert_eq!(
        (p.max_bps, p.max_in_bps, p.burst_bytes),
        (Some(100_000_000), None, None)
    );
    // Without max_in, download follows max, as the data plane does.
    let s = Scenario::parse(&scenario("download", "max = \"200Mbit\"")).unwrap();
    assert_eq!(s.policies_at(0).vifs[0].policy.max_bps, Some(200_000_000));
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
