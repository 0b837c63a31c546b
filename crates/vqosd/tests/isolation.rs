//! Tenant isolation on the real switch: vqosd with its default config (port security on), two
//! namespace VMs on its TAP ports and a sink on the uplink, talking with the kernel's own
//! stack. A VM that takes its neighbour's MAC address takes none of its traffic, and a VM's
//! frames to an address the switch does not know reach the uplink, not the other VM. Both
//! failed before port security and the flooding rules (the MAC entry moved with one frame;
//! unknown unicast was flooded to every port). Needs root and iperf3 (the real-traffic lock);
//! skips with a message otherwise.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use vqos_testkit::{can_run, Netns};

/// Runs `args` inside `ns`; the output, whatever the exit status.
fn in_ns(ns: &Netns, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {} {args:?}: {e}", ns.name()))
}

/// Echo replies `ping` reports receiving.
fn received(out: &Output) -> u32 {
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(',')
        .find_map(|part| part.trim().strip_suffix(" received"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in {text:?}"))
}

fn mac_of(ns: &Netns, link: &str) -> String {
    let out = in_ns(ns, &["cat", &format!("/sys/class/net/{link}/address")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_spoofing_tenant_takes_nothing_and_unknown_unicast_stays_private() {
    let Some(_serial) =
        can_run("a_spoofing_tenant_takes_nothing_and_unknown_unicast_stays_private")
    else {
        return;
    };
    if Command::new("ping").arg("-V").output().is_err() {
        println!("SKIP: ping not installed (apt-get install -y iputils-ping)");
        return;
    }
    let lab = lab(6, &[1, 1]);
    let (vm1, vm2) = (&lab.vms[0].1, &lab.vms[1].1);
    let (tap1, tap2) = (lab.tap(0).to_string(), lab.tap(1).to_string());
    let vm1_addr = format!("{}.1", lab.net);
    let sink = lab.sink_addr();
    // Everyone speaks once: the switch learns (and locks) each VM's address.
    for vm in [vm1, vm2] {
        assert_eq!(
            received(&in_ns(vm, &["ping", "-c", "2", "-W", "2", &sink])),
            2
        );
    }
    // VM2 takes VM1's address and keeps sending with it while the sink pings VM1.
    let own2 = mac_of(vm2, &tap2);
    let mac1 = mac_of(vm1, &tap1);
    in_ns(vm2, &["ip", "link", "set", "dev", &tap2, "address", &mac1]);
    let spoofer = vm2.spawn(&["ping", "-i", "0.01", "-c", "300", &sink]);
    std::thread::sleep(Duration::from_millis(300));
    let to_vm1 = in_ns(
        &lab.sink,
        &["ping", "-c", "20", "-i", "0.05", "-W", "1", &vm1_addr],
    );
    drop(spoofer);
    assert_eq!(received(&to_vm1), 20, "VM1 lost traffic to the spoofer");
    let stats = lab.stats();
    assert!(
        drop_count(&stats, &tap2, "spoofed") > 0,
        "the spoofed frames were not counted: {}",
        port(&stats, &tap2)
    );
    // VM2, itself again, sends 200 frames to an address nobody has.
    in_ns(vm2, &["ip", "link", "set", "dev", &tap2, "address", &own2]);
    let ghost = format!("{}.77", lab.net);
    in_ns(
        vm2,
        &[
            "ip",
            "neigh",
            "replace",
            &ghost,
            "lladdr",
            "02:00:de:ad:be:ef",
            "dev",
            &tap2,
        ],
    );
    let before = lab.stats();
    in_ns(
        vm2,
        &["ping", "-c", "200", "-i", "0.005", "-W", "1", &ghost],
    );
    std::thread::sleep(Duration::from_millis(100));
    let after = lab.stats();
    let delta =
        |name: &str| counter(&after, name, "tx_frames") - counter(&before, name, "tx_frames");
    let (to_uplink, to_vm1) = (delta(&lab.uplink), delta(&tap1));
    println!("unknown unicast from VM2: {to_uplink} frames to the uplink, {to_vm1} to VM1");
    assert!(to_uplink >= 200, "{to_uplink} frames reached the uplink");
    assert!(to_vm1 < 20, "{to_vm1} of VM2's frames reached VM1");
}
