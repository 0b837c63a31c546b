//! Real traffic through the `vqosd` binary: vqosd creates the TAP ports, the test moves them into
//! network namespaces ("VMs", and a sink on the uplink), runs iperf3 and talks to the daemon only
//! through its API, as an operator would. Needs root and iperf3; skips with a message otherwise.
//!
//! What each test shows (issue 3):
//! - `weights_then_live_policies`: five VMs, 940 Mbit/s, weights 1:2:3:4:5, one greedy TCP stream
//!   each: every VM within 5 % of the reference allocation and ≥ 97 % aggregate; then VM5 max
//!   150 Mbit/s and VM1 min 200 Mbit/s through the API: the new allocation holds, and the stats
//!   show each change within 100 ms of the call.
//! - `idle_share_goes_to_the_others_and_comes_back`: work conservation.
//! - `removing_a_port_under_load_affects_only_that_port`.
//! - `malformed_frames_are_dropped_and_counted_per_reason`.
//! - `sigkill_under_load_keeps_the_guests_interfaces_and_every_policy`: vqosd killed under
//!   iperf3 load and started again: the guests' (persistent) TAPs stay, the same TCP streams
//!   carry on, every policy is restored through the API and in the data plane.
//! - `a_max_set_before_traffic_holds`: a cap configured before traffic holds with TSO batches.
//! - `weights_hold_on_two_threads`: `threads = 2` (issue 21), multiqueue TAPs (`queues = 2`),
//!   weights 1:2:3 under the capacity: the VMs' ports are read by both loops, and every VM is
//!   within 5 % of the reference allocation, as with one thread; each port reports its two
//!   queues.
//!
//! Rates are what iperf3's *server* received, per 1 s interval, summed over a window of the run
//! (one long stream per VM, so a policy change is measured without restarting the traffic),
//! or, where windows of several streams must line up exactly, the switch's own `rx_bytes`.
//!
//! The tests share two cores with iperf3, so they run one at a time (`vqos_testkit::can_run`).
//! Names are `q<pid><test>…` (IFNAMSIZ-safe); every process (by PID), namespace and temporary
//! file is removed by Drop guards, also when a test fails.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use std::path::Path;
use vqos_dataplane::frame::{FRAME_BUF_BYTES, VNET_HDR_LEN};
use vqos_sched::VifPolicy;
use vqos_testkit::{can_run, poll, sleep_until, Proc};

mod common;

use common::*;

/// bit/s to Mbit/s.
fn mbit(bps: Vec<f64>) -> Vec<f64> {
    bps.into_iter().map(|b| b / 1e6).collect()
}

#[test]
fn weights_then_live_policies() {
    let Some(_serial) = can_run("weights_then_live_policies") else {
        return;
    };
    let ws = [1, 2, 3, 4, 5];
    let lab = lab(0, &ws);
    // One 25 s stream per VM. Phase 1 is measured on the switch's own counters over 3..11.5 s
    // of the test's clock, the policies change at 12.2 s, phase 2 is measured over 15..24 s (a
    // few seconds for TCP to settle on the new rates). The switch's counters give every VM the
    // same window: each iperf3 server counts from its own start, and on a busy machine a
    // stream that started half a second late had a piece of phase 2 in its "phase 1" (seen in
    // CI: VM1 at +11 %, the others short in proportion).
    let names: Vec<&str> = (0..5).map(|i| lab.tap(i)).collect();
    let servers: Vec<Proc> = (0..5).map(|i| lab.server(5201 + i as u16)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let clients: Vec<Proc> = (0..5).map(|i| lab.client(i, 5201 + i as u16, 25)).collect();
    let t0 = Instant::now();
    sleep_until(t0, 3.0);
    let phase1 = mbit(rx_rates_median(&lab.daemon, &names, 8.0));

    sleep_until(t0, 12.2);
    let vm5 = set_and_watch(
        &lab,
        lab.tap(4),
        json!({"max": "150Mbit"}),
        "max_bps",
        json!(150_000_000),
    );
    let vm1 = set_and_watch(
        &lab,
        lab.tap(0),
        json!({"min": "200Mbit"}),
        "min_bps",
        json!(200_000_000),
    );
    sleep_until(t0, 15.0);
    let phase2 = mbit(rx_rates_median(&lab.daemon, &names, 9.0));
    // Every stream ran to its end (an iperf3 failure is not a policy result).
    for s in servers {
        Report::of(s, Duration::from_secs(40));
    }
    drop(clients);
    check_l2(
        "phase 1, weights 1:2:3:4:5",
        &phase1,
        &weights(&ws),
        CAPACITY_BPS,
        0.05,
        0.97,
    );
    let mut policies = weights(&ws);
    policies[4].max_bps = Some(150_000_000);
    policies[0].min_bps = 200_000_000;
    check_l2(
        "phase 2, + VM5 max 150Mbit, VM1 min 200Mbit",
        &phase2,
        &policies,
        CAPACITY_BPS,
        0.05,
        0.97,
    );
    // The stats show a new policy at once (the switch publishes right after a change), but a
    // busy machine may hold the API thread for a while: the bound is "not lost and not left
    // to a periodic refresh of seconds", not a latency figure.
    for (what, d) in [("VM5 max", vm5), ("VM1 min", vm1)] {
        println!("{what}: shown after {d:?}");
        assert!(
            d <= Duration::from_secs(2),
            "{what}: the stats showed the new policy only after {d:?}"
        );
    }
    let s = lab.stats();
    for (tap, _) in &lab.vms {
        let drops = &port(&s, tap)["drops"];
        for r in [
            "truncated",
            "oversized",
            "bad_vnet_hdr",
            "spoofed",
            "policed",
        ] {
            assert_eq!(drops[r], 0, "{tap}: {drops}");
        }
    }
}

#[test]
fn idle_share_goes_to_the_others_and_comes_back() {
    let Some(_serial) = can_run("idle_share_goes_to_the_others_and_comes_back") else {
        return;
    };
    let ws = [1, 2, 3];
    let lab = lab(1, &ws);
    // VM1 and VM2 send for 24 s; VM3 for 0..8 s, is idle for 8..16 s, and sends again 16..24 s.
    // Each phase is measured on the switch's counters over one window of the test's clock
    // that every stream covers (iperf3 servers count from their own starts).
    let names: Vec<&str> = (0..3).map(|i| lab.tap(i)).collect();
    let long: Vec<Proc> = (0..2).map(|i| lab.server(5201 + i as u16)).collect();
    let vm3_first = lab.server(5203);
    let vm3_again = lab.server(5213);
    std::thread::sleep(Duration::from_millis(500));
    let mut clients: Vec<Proc> = (0..2).map(|i| lab.client(i, 5201 + i as u16, 24)).collect();
    clients.push(lab.client(2, 5203, 8));
    let t0 = Instant::now();
    sleep_until(t0, 2.5);
    let busy = mbit(rx_rates(&lab.daemon, &names, 5.0));
    sleep_until(t0, 10.5);
    let idle = mbit(rx_rates(&lab.daemon, &names, 5.0));
    sleep_until(t0, 16.0);
    clients.push(lab.client(2, 5213, 8));
    sleep_until(t0, 19.0);
    let back = mbit(rx_rates(&lab.daemon, &names, 4.0));

    let long: Vec<Report> = long
        .into_iter()
        .map(|s| Report::of(s, Duration::from_secs(40)))
        .collect();
    Report::of(vm3_first, Duration::from_secs(10));
    Report::of(vm3_again, Duration::from_secs(20));
    drop(clients);

    for r in &long {
        let per_s: Vec<u64> = r
            .interval_bytes_from(0.0)
            .iter()
            .map(|b| b * 8 / 1_000_000)
            .collect();
        println!("Mbit/s per second: {per_s:?}");
    }
    let all = weights(&ws);
    let l2 = |what: &str, rates: &[f64], policies: &[VifPolicy]| {
        check_l2(
            what,
            rates,
            policies,
            CAPACITY_BPS,
            LOOSE_TOL,
            LOOSE_AGGREGATE,
        )
    };
    l2("all three busy", &busy, &all);
    assert!(idle[2] < 1.0, "VM3 stopped but sent {:.1} Mbit/s", idle[2]);
    l2(
        "VM3 idle: VM1 and VM2 share by weight",
        &idle[..2],
        &weights(&ws[..2]),
    );
    l2("VM3 back: it gets its share again", &back, &all);
}

#[test]
fn removing_a_port_under_load_affects_only_that_port() {
    let Some(_serial) = can_run("removing_a_port_under_load_affects_only_that_port") else {
        return;
    };
    let lab = lab(2, &[1, 1, 1]);
    let servers: Vec<Proc> = (0..3).map(|i| lab.server(5201 + i as u16)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let clients: Vec<Proc> = (0..3).map(|i| lab.client(i, 5201 + i as u16, 10)).collect();
    let t0 = Instant::now();
    sleep_until(t0, 4.0);
    let (gone, kept) = (lab.tap(2).to_string(), [lab.tap(0), lab.tap(1)]);
    let before = lab.stats();
    assert!(
        counter(&before, &gone, "rx_bytes") > 10_000_000,
        "VM3 was sending"
    );
    let removed = lab
        .daemon
        .call("DELETE", &format!("/v1/ports/{gone}"), json!(null));
    assert_eq!(removed["removed"], gone.as_str());
    assert!(!lab.vms[2].1.has_link(&gone), "the created TAP must vanish");
    let ports = lab.daemon.get("/v1/ports");
    assert!(
        ports
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["name"] != gone.as_str()),
        "{ports}"
    );

    // The others keep forwarding: their counters (and the uplink's) keep increasing.
    let uplink = lab.uplink.clone();
    let mut last = lab.stats();
    assert!(last["ports"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["name"] != gone.as_str()));
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        let now = lab.stats();
        for name in kept.iter().copied().chain([uplink.as_str()]) {
            for key in ["rx_bytes", "tx_bytes"] {
                assert!(
                    counter(&now, name, key) > counter(&last, name, key),
                    "{name} {key} stopped after removing {gone}"
                );
            }
        }
        last = now;
    }
    let mut servers = servers;
    drop(servers.pop()); // VM3's stream died with its port
    let reports: Vec<Report> = servers
        .into_iter()
        .map(|s| Report::of(s, Duration::from_secs(20)))
        .collect();
    drop(clients);
    for (r, name) in reports.iter().zip(kept) {
        let per_s = r.interval_bytes_from(0.0);
        assert!(per_s.len() >= 9, "{name}: {per_s:?}");
        assert!(
            per_s.iter().all(|&b| b > 5_000_000),
            "{name} stalled: bytes per second {per_s:?}"
        );
    }
    let after: Vec<f64> = reports.iter().map(|r| r.mbit(6.0, 10.0)).collect();
    check(
        "after removing VM3, VM1 and VM2 share the link",
        &after,
        &weights(&[1, 1]),
        LOOSE_TOL,
        LOOSE_AGGREGATE,
    );
    // Nothing of theirs was lost with the port. (A frame written while a TAP was being moved
    // into its namespace may have failed before: compare with the counts before the removal.)
    for name in kept {
        assert_eq!(
            port(&last, name)["drops"],
            port(&before, name)["drops"],
            "{name}: drops"
        );
    }
}

// ---- malformed frames ----------------------------------------------------------------------

const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;
/// The offloads vqosd's TAP ports enable (crates/vqos-dataplane/src/tap.rs).
const VQOSD_OFFLOADS: libc::c_uint =
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;

/// A duplicate of vqosd's file descriptor of TAP `tap` (pidfd_getfd), to change the device's
/// settings under it: the header size and the offloads are per device, not per descriptor.
fn tap_fd_of(pid: i32, tap: &str) -> OwnedFd {
    let want = format!("iff:\t{tap}\n");
    let fd: i32 = fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let info = fs::read_to_string(e.path()).ok()?;
            if !info.contains(&want) {
                return None;
            }
            e.file_name().to_str()?.parse().ok()
        })
        .next()
        .unwrap_or_else(|| panic!("vqosd has no descriptor of TAP {tap}"));
    // SAFETY: plain system calls with integer arguments; results checked.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let pidfd = OwnedFd::from_raw_fd(pidfd);
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) as i32;
        assert!(dup >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(dup)
    }
}

fn set_vnet_hdr_len(tap: &OwnedFd, len: usize) {
    let len = len as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer, which is live.
    let r = unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNSETVNETHDRSZ, &len) };
    assert_eq!(r, 0, "TUNSETVNETHDRSZ: {}", std::io::Error::last_os_error());
}

fn set_offloads(tap: &OwnedFd, offloads: libc::c_uint) {
    // SAFETY: TUNSETOFFLOAD takes the feature bits as the integer argument itself.
    let r = unsafe {
        libc::ioctl(
            tap.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(offloads),
        )
    };
    assert_eq!(r, 0, "TUNSETOFFLOAD: {}", std::io::Error::last_os_error());
}

/// Sends `count` raw Ethernet frames of `len` bytes out of `link` (call inside its namespace):
/// broadcast, from a locally administered address, EtherType 0x88b5 (local experimental).
fn send_raw(link: &str, len: usize, count: usize) {
    // Protocol 0: a socket that only sends.
    let sock = vqos_testkit::PacketSocket::bind(link, 0);
    let mut frame = vec![0u8; len];
    frame[..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0x33, 0x33]);
    frame[12..14].copy_from_slice(&[0x88, 0xb5]);
    for _ in 0..count {
        sock.send(&frame);
    }
}

/// Sends `count` UDP datagrams of 3 × 1000 bytes with UDP segmentation offload (UDP_SEGMENT), so
/// each leaves as one GSO frame when the device offers USO (call inside the namespace).
fn send_udp_gso(dst: &str, count: usize) {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let gso_size: libc::c_int = 1000;
    // SAFETY: setsockopt reads an int through the live pointer. SOL_UDP = 17, UDP_SEGMENT = 103.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            103,
            (&gso_size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
    for _ in 0..count {
        sock.send_to(&[0x5a; 3000], (dst, 9)).unwrap();
    }
}

/// Polls the stats until `vif`'s drop counter `reason` reaches `want`.
fn wait_drops(lab: &Lab, vif: &str, reason: &str, want: u64) -> u64 {
    poll(Duration::from_secs(5), || {
        let n = drop_count(&lab.stats(), vif, reason);
        (n >= want).then_some(n)
    })
    .unwrap_or_else(|| {
        panic!(
            "{vif}: {reason} stayed below {want}: {}",
            port(&lab.stats(), vif)
        )
    })
}

#[test]
fn malformed_frames_are_dropped_and_counted_per_reason() {
    let Some(_serial) = can_run("malformed_frames_are_dropped_and_counted_per_reason") else {
        return;
    };
    // VM1 and VM2 carry TCP to the sink while VM3's frames reach the switch malformed. The
    // kernel only ever hands a TAP reader well-formed frames, so the test changes VM3's TAP
    // device under vqosd (through a duplicate of vqosd's own descriptor) to make them so:
    // - truncated: header size 10 instead of 12, and a 14-byte frame → 24 bytes read;
    // - oversized: header size FRAME_BUF_BYTES − 64 and a 64-byte frame → the read fills the
    //   whole buffer;
    // - bad virtio-net header: UDP segmentation offload on (vqosd never enables it) and UDP
    //   sent with UDP_SEGMENT → frames with gso_type UDP_L4, which the switch does not accept.
    // Each setting is put back at once; VM3's port must still forward afterwards.
    let lab = lab(3, &[1, 1, 1]);
    let (bad, bad_ns) = (lab.tap(2).to_string(), &lab.vms[2].1);
    let servers: Vec<Proc> = (0..2).map(|i| lab.server(5201 + i as u16)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let clients: Vec<Proc> = (0..2).map(|i| lab.client(i, 5201 + i as u16, 8)).collect();
    let t0 = Instant::now();
    sleep_until(t0, 2.0);
    let before = lab.stats();
    let tap = tap_fd_of(lab.daemon.pid(), &bad);
    const N: u64 = 5;

    set_vnet_hdr_len(&tap, 10);
    bad_ns.run(|| send_raw(&bad, 14, N as usize));
    let truncated = wait_drops(&lab, &bad, "truncated", N);
    set_vnet_hdr_len(&tap, VNET_HDR_LEN);

    set_vnet_hdr_len(&tap, FRAME_BUF_BYTES - 64);
    bad_ns.run(|| send_raw(&bad, 64, N as usize));
    let oversized = wait_drops(&lab, &bad, "oversized", N);
    set_vnet_hdr_len(&tap, VNET_HDR_LEN);

    set_offloads(&tap, VQOSD_OFFLOADS | TUN_F_USO4 | TUN_F_USO6);
    let sink = lab.sink_addr();
    bad_ns.run(|| send_udp_gso(&sink, N as usize));
    let bad_hdr = wait_drops(&lab, &bad, "bad_vnet_hdr", N);
    set_offloads(&tap, VQOSD_OFFLOADS);
    drop(tap);
    println!("{bad}: truncated {truncated}, oversized {oversized}, bad_vnet_hdr {bad_hdr}");

    // VM3's port still forwards: well-formed frames are counted and not dropped.
    let s = lab.stats();
    let rx = counter(&s, &bad, "rx_frames");
    bad_ns.run(|| send_raw(&bad, 60, 3));
    let after = poll(Duration::from_secs(5), || {
        let s = lab.stats();
        (counter(&s, &bad, "rx_frames") >= rx + 3).then_some(s)
    })
    .expect("VM3's port stopped reading after the malformed frames");
    for reason in ["truncated", "oversized", "bad_vnet_hdr"] {
        assert_eq!(
            drop_count(&after, &bad, reason),
            drop_count(&s, &bad, reason),
            "a well-formed frame was dropped as {reason}"
        );
    }

    // The others kept forwarding, dropped nothing, and their streams never stalled.
    sleep_until(t0, 6.0);
    let late = lab.stats();
    for name in [lab.tap(0), lab.tap(1)] {
        let (b, l) = (
            counter(&before, name, "rx_bytes"),
            counter(&late, name, "rx_bytes"),
        );
        assert!(
            l > b + 100_000_000,
            "{name}: rx_bytes {b} → {l} from 2 s to 6 s"
        );
        let drops = &port(&late, name)["drops"];
        for r in ["truncated", "oversized", "bad_vnet_hdr"] {
            assert_eq!(drops[r], 0, "{name}: {drops}");
        }
        assert_eq!(drops["tx_error"], port(&before, name)["drops"]["tx_error"]);
    }
    let reports: Vec<Report> = servers
        .into_iter()
        .map(|s| Report::of(s, Duration::from_secs(20)))
        .collect();
    drop(clients);
    for r in &reports {
        let per_s = r.interval_bytes_from(0.0);
        assert!(
            per_s.iter().all(|&b| b > 5_000_000),
            "a stream stalled: bytes per second {per_s:?}"
        );
    }
    let rates: Vec<f64> = reports.iter().map(|r| r.mbit(1.0, 8.0)).collect();
    check(
        "VM1 and VM2 while VM3 sends malformed frames",
        &rates,
        &weights(&[1, 1]),
        LOOSE_TOL,
        LOOSE_AGGREGATE,
    );
}

#[test]
fn sigkill_under_load_keeps_the_guests_interfaces_and_every_policy() {
    let Some(_serial) = can_run("sigkill_under_load_keeps_the_guests_interfaces_and_every_policy")
    else {
        return;
    };
    let mut lab = lab(4, &[1, 1, 1]);
    let (vm1, vm2, vm3) = (
        lab.tap(0).to_string(),
        lab.tap(1).to_string(),
        lab.tap(2).to_string(),
    );
    let added = format!("{}v9", vm1.trim_end_matches("v1"));
    let d = &lab.daemon;
    d.call(
        "PUT",
        &format!("/v1/policies/{vm1}"),
        json!({"weight": 4, "min": "100Mbit"}),
    );
    d.call(
        "PUT",
        &format!("/v1/policies/{vm2}"),
        json!({"max": "300Mbit", "priority": 2}),
    );
    d.call("PUT", &format!("/v1/policies/{vm3}"), json!({"weight": 7}));
    d.call(
        "POST",
        "/v1/ports",
        json!({"name": added, "policy": {"weight": 3, "min": "50Mbit", "max": "200Mbit"}}),
    );
    let policies = d.get("/v1/policies");
    let ports = d.get("/v1/ports");

    // Under load: VM1 and VM3 send for 12 s; vqosd dies 3 s in and is started again.
    let servers = [lab.server(5201), lab.server(5203)];
    std::thread::sleep(Duration::from_millis(500));
    let clients = [lab.client(0, 5201, 12), lab.client(2, 5203, 12)];
    let t0 = std::time::Instant::now();
    sleep_until(t0, 3.0);
    lab.daemon.kill9();
    // Its TAPs are persistent: the guests' interfaces (with their addresses) stay where they
    // are, and so does the port added through the API.
    for (tap, ns) in &lab.vms {
        assert!(ns.has_link(tap), "{tap} vanished with vqosd");
    }
    assert!(
        lab.sink.has_link(&lab.uplink),
        "the uplink vanished with vqosd"
    );
    assert!(Path::new("/sys/class/net").join(&added).exists());
    let socket = lab.dir.path().join("vqosd.sock");
    lab.daemon = Daemon::start(&lab.config, &socket);
    let restarted_s = t0.elapsed().as_secs_f64();
    assert_eq!(lab.daemon.get("/v1/policies"), policies);
    // The ports as configured; the addresses port security locked meanwhile (persisted every
    // second, tests/guards.rs) may have grown since they were read.
    let unlocked = |mut v: Value| {
        v.as_array_mut().into_iter().flatten().for_each(|p| {
            p.as_object_mut().map(|o| o.remove("locked"));
        });
        v
    };
    assert_eq!(unlocked(lab.daemon.get("/v1/ports")), unlocked(ports));
    let s = lab.stats();
    for (name, p) in policies.as_object().unwrap() {
        assert_eq!(&port(&s, name)["policy"], p, "{name}");
    }
    // The same TCP connections carry on, on the restored policies: VM1 and VM3 split the link
    // 4:7 with VM1's 100 Mbit/s floor (the config says 1:1), from two seconds after the restart.
    let reports: Vec<Report> = servers
        .into_iter()
        .map(|s| Report::of(s, Duration::from_secs(30)))
        .collect();
    drop(clients);
    let from = (restarted_s + 2.0).ceil();
    let rates: Vec<f64> = reports.iter().map(|r| r.mbit(from, 12.0)).collect();
    println!("restarted at {restarted_s:.2} s; from {from} s: {rates:?} Mbit/s");
    let mut restored = weights(&[4, 7]);
    restored[0].min_bps = 100_000_000;
    check(
        "VM1 and VM3 after the restart",
        &rates,
        &restored,
        LOOSE_TOL,
        LOOSE_AGGREGATE,
    );
}

/// A maximum set before the vif sends must hold once it does (as after a restart, when every
/// policy is configured before traffic). This failed once: the `vqos` engine bounded a cap
/// bucket's debt by the largest batch cost seen when the policy was configured (2 × 64 KiB
/// before any traffic), so later batches of TSO super-frames (up to 32 × 64 KiB) were mostly
/// forgiven and the vif ran at line rate.
#[test]
fn a_max_set_before_traffic_holds() {
    let Some(_serial) = can_run("a_max_set_before_traffic_holds") else {
        return;
    };
    let lab = lab(5, &[1]);
    lab.daemon.call(
        "PUT",
        &format!("/v1/policies/{}", lab.tap(0)),
        json!({"max": "300Mbit"}),
    );
    let server = lab.server(5201);
    std::thread::sleep(Duration::from_millis(500));
    let client = lab.client(0, 5201, 5);
    let got = Report::of(server, Duration::from_secs(20)).mbit(1.0, 5.0);
    drop(client);
    // The max is on-wire bytes; iperf3 reports TCP payload (about 287 Mbit/s at 300 on the
    // wire). Held means not above it; a starved switch may forward less (see `check`), but at
    // least half.
    let wire = got * WIRE_PER_PAYLOAD;
    println!("a lone VM with max 300Mbit: {got:.1} Mbit/s of payload, {wire:.1} on the wire");
    assert!(
        wire <= 300.0 * 1.05,
        "above its max: {wire:.1} Mbit/s on the wire"
    );
    assert!(
        wire >= 300.0 * MIN_FORWARDED,
        "forwarded only {wire:.1} Mbit/s"
    );
    if wire < 0.97 * 300.0 {
        println!("below 97 % of the max: the machine is busy");
    }
}

#[test]
fn weights_hold_on_two_threads() {
    let Some(_serial) = can_run("weights_hold_on_two_threads") else {
        return;
    };
    if vqos_dataplane::sys::allowed_cpus().map_or(0, |c| c.len()) < 2 {
        println!("SKIP weights_hold_on_two_threads: needs 2 CPUs");
        return;
    }
    let ws = [1, 2, 3];
    // Multiqueue TAPs: each VM's kernel spreads its flows over two queues, its shard reads
    // both, and the other shard writes to it on a queue of its own.
    let lab = lab_spec(
        7,
        &ws,
        LabSpec {
            threads: Some(2),
            port_extra: "queues = 2",
            ..LabSpec::default()
        },
    );
    let s = lab.stats();
    assert_eq!(s["loops"].as_array().map(Vec::len), Some(2), "{s}");
    let shards: Vec<u64> = lab
        .vms
        .iter()
        .map(|(tap, _)| port(&s, tap)["shard"].as_u64().unwrap())
        .collect();
    assert_eq!(shards, vec![0, 1, 0], "placed round-robin");
    let names: Vec<&str> = (0..3).map(|i| lab.tap(i)).collect();
    let servers: Vec<Proc> = (0..3).map(|i| lab.server(5201 + i as u16)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let clients: Vec<Proc> = (0..3).map(|i| lab.client(i, 5201 + i as u16, 14)).collect();
    let t0 = Instant::now();
    sleep_until(t0, 3.0);
    let rates = mbit(rx_rates_median(&lab.daemon, &names, 9.0));
    for s in servers {
        Report::of(s, Duration::from_secs(30));
    }
    drop(clients);
    check_l2(
        "two threads, weights 1:2:3",
        &rates,
        &weights(&ws),
        CAPACITY_BPS,
        0.05,
        0.97,
    );
    let s = lab.stats();
    for l in s["loops"].as_array().unwrap() {
        assert!(
            l["burst_frames"].as_u64().unwrap() > 0,
            "every loop forwarded: {l}"
        );
    }
    for tap in &names {
        let p = port(&s, tap);
        let per_queue: Vec<u64> = p["tap"]["queue_rx_frames"]
            .as_array()
            .unwrap_or_else(|| panic!("{tap}: no queues in {p}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        println!("{tap}: frames read per queue {per_queue:?}");
        assert_eq!(per_queue.len(), 2, "{tap}");
        assert!(per_queue.iter().sum::<u64>() > 0, "{tap}: {p}");
    }
}
