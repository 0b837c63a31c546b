//! Tests of [`super::TapPort`] on real TAP devices (root; skipped otherwise).

use super::*;
use crate::frame::{build_frame, VnetHdr};

#[test]
fn send_batch_stops_at_the_first_refused_frame() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: needs root");
        return;
    }
    let name = format!("vqt{}s", std::process::id() % 100_000);
    let mut tap = TapPort::open(&name, TapMode::Create).unwrap();
    let mut batch = Batch::new();
    let good = build_frame(
        VnetHdr::default(),
        0x02_00_00_00_00_01,
        0x02_00_00_00_00_02,
        0x0800,
        &[0; 46],
    );
    let bad = {
        let mut f = good.clone();
        f[1] = 3; // unknown GSO type: the kernel refuses the write
        f
    };
    assert!(batch.push(&good) && batch.push(&bad) && batch.push(&good));
    assert_eq!(tap.send_batch(&batch, &[0, 1, 2]).unwrap(), 1);
    let c = tap.counters();
    assert_eq!(
        (c.tx_frames, c.tx_bytes, c.tx_errors),
        (1, good.len() as u64, 2)
    );
}

#[test]
fn an_owned_tap_outlives_its_port_is_found_again_in_a_namespace_and_goes_on_release() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: needs root");
        return;
    }
    let pid = std::process::id() % 100_000;
    let name = format!("vqt{pid}o");
    let ns = format!("vqt{pid}ns");
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    /// Deletes the namespace (and the TAP, if it is in it) even if the test fails.
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.1])
                .output();
            let _ = std::process::Command::new("ip")
                .args(["link", "del", &self.0])
                .output();
        }
    }
    let _cleanup = Cleanup(name.clone(), ns.clone());
    assert!(ip(&["netns", "add", &ns]));
    let first = TapPort::open(&name, TapMode::Own).unwrap();
    assert_eq!(first.origin(), &TapOrigin::Created);
    drop(first);
    assert!(
        exists_here(&name).unwrap(),
        "an owned TAP outlives its port"
    );
    let here = TapPort::open(&name, TapMode::Own).unwrap();
    assert_eq!(here.origin(), &TapOrigin::Reattached { netns: None });
    drop(here);
    // Moved into a guest's namespace, it is found there and attached again.
    assert!(ip(&["link", "set", &name, "netns", &ns]));
    assert!(!exists_here(&name).unwrap());
    let mut again = TapPort::open(&name, TapMode::Own).unwrap();
    assert!(!exists_here(&name).unwrap(), "a second TAP was made here");
    assert_eq!(
        again.origin(),
        &TapOrigin::Reattached {
            netns: Some(ns.clone())
        }
    );
    assert!(ip(&["-n", &ns, "link", "show", &name]));
    again.release();
    drop(again);
    assert!(
        !ip(&["-n", &ns, "link", "show", &name]),
        "released, yet it stayed"
    );
}
