//! A capped tenant's junk floods on real traffic (issue 27): vqosd with its default config
//! (`capacity = "unlimited"`, engine `vqos`, `cpu_fair`, port security), three namespace VMs
//! A, B, C on its TAP ports and a sink on the uplink. B and C each send one greedy TCP stream
//! to the sink; A is capped at `max = 10Mbit` and floods 64-byte UDP frames (unpaced
//! `sendmmsg`) to its own MAC (hairpin) or to a MAC nobody has (storm), which the switch reads
//! and drops (`hairpin`, `storm`).
//!
//! Every frame read is charged to its sender, the dropped ones too, so the switch reads A at
//! its cap: a few tens of thousands of frames per second, where it read 126,000–144,000 per
//! second of them when dropped frames were free (measured 2026-11-27, this test with the charge
//! reverted; both tests then fail on that check).
//!
//! The third test floods from the network instead: from the sink's namespace toward A's
//! address. The uplink's default 4 queues are steered by destination (`tap_steer`), so the
//! flood fills A's queue only, which is read within A's budget (`tap_budget`); with one queue
//! the neighbours kept 33–35 % (the test fails on both checks).
//!
//! B's and C's rates under the flood (each one's median second of five) are compared with
//! theirs, in the same run, while the flood goes to a dead end of its own (a veth pair inside
//! the flooding namespace): the flood's sender costs the machine's CPUs the same in both
//! windows, so what differs is the switch's part. The margin is wide (a 2-core machine shared
//! by the switch, five iperf3s and the flood): it catches a switch that gives the core to the
//! flood, not a few percent.
//!
//! Needs root and iperf3 (the real-traffic lock); skips with a message otherwise.

mod common;

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use vqos_probe::flood::{run_flood, FloodConfig, FloodSummary};
use vqos_testkit::{can_run, Netns};

/// A's cap, bits per second.
const A_MAX_BPS: f64 = 10e6;

/// Most frames per second the switch may read from the uplink queue a network flood toward A
/// fills, in units of A's read budget (150 % of its cap) in 64-byte frames (31,250 a second;
/// each is charged 72 bytes with its virtio-net header, so the budget reads about 26,000):
/// 1.25, for the budget's burst and the windows' edges (read unbudgeted: 50,000–87,000 a
/// second, 1.6–2.8).
const READ_AT_BUDGET: f64 = 1.25;

/// Least part of B's and C's rates with the dead-end flood that they keep under A's flood.
const KEPT: f64 = 0.6;

/// Most frames per second the switch may read from A, in units of its cap in 64-byte frames
/// (60 bytes charged each: no FCS): 1.5, for the burst and the windows' edges.
const READ_AT_CAP: f64 = 1.5;

/// A 64-byte UDP flood, unpaced, from a thread inside a namespace; stopped on drop.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<FloodSummary>>,
}

impl Flood {
    fn start(ns: &Netns, to: SocketAddr) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let path = format!("/run/netns/{}", ns.name());
        let thread = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on a namespace file we hold open; it affects this thread only.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            let cfg = FloodConfig {
                duration: Duration::from_secs(60),
                ..FloodConfig::new(to)
            };
            run_flood(&cfg, Some(&flag)).unwrap_or_else(|e| panic!("flood to {to}: {e}"))
        });
        Flood {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> FloodSummary {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `args` in `ns`; its stdout. Panics with its stderr when it fails.
fn in_ns(ns: &Netns, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} in {}: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Gives `ns` a dead end: 192.0.2.9 behind a veth pair of its own whose far side drops what
/// it gets (a MAC nobody has). A flood to it costs its sender what a flood through the switch
/// does, without the switch. The pair goes with the namespace.
fn dead_end(ns: &Netns) -> SocketAddr {
    for cmd in [
        "ip link add qd0 type veth peer name qd1",
        "ip addr add 192.0.2.1/24 dev qd0",
        "ip link set qd0 up",
        "ip link set qd1 up",
        "ip neigh add 192.0.2.9 lladdr 02:00:00:00:00:99 dev qd0",
    ] {
        in_ns(ns, &cmd.split(' ').collect::<Vec<_>>());
    }
    "192.0.2.9:9".parse().unwrap()
}

/// What one window of a run measured.
struct Window {
    /// B's and C's rates, Mbit/s (what the switch read from them).
    neighbours: [f64; 2],
    /// Frames per second the switch read from A.
    a_read_fps: f64,
    /// Frames the switch read from each of the uplink's queues.
    uplink_queues: Vec<u64>,
    /// The part of the window the switch's loop was busy.
    busy: f64,
    /// The window's length, s.
    secs: f64,
    /// Times an uplink queue was held for its read budget, after the window.
    uplink_holds: u64,
}

/// Floods from A to `dst_mac` (A's own, or nobody's) after a window with the same flood to a
/// dead end; returns (dead end, flood) and A's drop counters after the flood.
fn run(test_id: u8, own_mac: bool) -> (Window, Window, serde_json::Value) {
    run_from(test_id, Some(own_mac))
}

/// [`run`]; `own_mac = None`: the flood comes from the network (the sink's namespace, to A's
/// address) instead of from A.
fn run_from(test_id: u8, own_mac: Option<bool>) -> (Window, Window, serde_json::Value) {
    let lab = lab_spec(
        test_id,
        &[1, 1, 1],
        LabSpec {
            unlimited: true,
            ..LabSpec::default()
        },
    );
    let a = lab.tap(0).to_string();
    lab.daemon.call(
        "PUT",
        &format!("/v1/policies/{a}"),
        serde_json::json!({"max": "10Mbit"}),
    );
    let vm_a = &lab.vms[0].1;
    let dst_mac = if own_mac == Some(true) {
        in_ns(vm_a, &["cat", &format!("/sys/class/net/{a}/address")])
    } else {
        "02:00:de:ad:be:ef".to_string()
    };
    let ghost = format!("{}.77", lab.net);
    in_ns(
        vm_a,
        &[
            "ip", "neigh", "replace", &ghost, "lladdr", &dst_mac, "dev", &a,
        ],
    );
    let (flooder, targets): (&Netns, [SocketAddr; 2]) = match own_mac {
        Some(_) => (
            vm_a,
            [dead_end(vm_a), format!("{ghost}:9").parse().unwrap()],
        ),
        None => (
            &lab.sink,
            [
                dead_end(&lab.sink),
                format!("{}.1:9", lab.net).parse().unwrap(),
            ],
        ),
    };
    let servers: Vec<_> = [5301, 5302].iter().map(|&p| lab.server(p)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let clients: Vec<_> = [(1, 5301), (2, 5302)]
        .iter()
        .map(|&(vm, p)| lab.client(vm, p, 20))
        .collect();
    let names = [lab.tap(1), lab.tap(2)];
    std::thread::sleep(Duration::from_secs(2));
    let mut windows = Vec::new();
    let mut stats = serde_json::Value::Null;
    for to in targets {
        let flood = Flood::start(flooder, to);
        std::thread::sleep(Duration::from_secs(1));
        let (before, t) = (lab.stats(), Instant::now());
        // Each vif's median second: a TCP stall in one second is not the switch's doing.
        let rates = rx_rates_median(&lab.daemon, &names, 5.0);
        stats = lab.stats();
        let secs = t.elapsed().as_secs_f64();
        let sent = flood.stop();
        let read = counter(&stats, &a, "rx_frames") - counter(&before, &a, "rx_frames");
        let queues = |s: &serde_json::Value| -> Vec<u64> {
            let q = &port(s, &lab.uplink)["tap"]["queue_rx_frames"];
            q.as_array()
                .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
                .unwrap_or_default()
        };
        let per_queue: Vec<u64> = queues(&stats)
            .iter()
            .zip(queues(&before).iter().chain(std::iter::repeat(&0)))
            .map(|(a, b)| a - b)
            .collect();
        let cycles = |s: &serde_json::Value, k: &str| s["loops"][0][k].as_u64().unwrap_or(0);
        let (busy, idle) = (
            cycles(&stats, "busy_cycles") - cycles(&before, "busy_cycles"),
            cycles(&stats, "idle_cycles") - cycles(&before, "idle_cycles"),
        );
        let w = Window {
            busy: busy as f64 / (busy + idle).max(1) as f64,
            secs,
            uplink_holds: port(&stats, &lab.uplink)["tap"]["budget_holds"]
                .as_u64()
                .unwrap_or(0),
            neighbours: [rates[0] / 1e6, rates[1] / 1e6],
            a_read_fps: read as f64 / secs,
            uplink_queues: per_queue,
        };
        println!(
            "{} floods {to}: {:.0} kframes/s sent, {:.1} kframes/s read from A, the uplink's \
             queues {:?}; B, C {:.0?} Mbit/s; the switch's loop busy {:.0} %",
            if own_mac.is_some() {
                "A"
            } else {
                "the network"
            },
            sent.sent_frames as f64 / sent.elapsed_s.max(1e-9) / 1e3,
            w.a_read_fps / 1e3,
            w.uplink_queues,
            w.neighbours,
            w.busy * 100.0
        );
        windows.push(w);
    }
    drop(clients);
    drop(servers);
    let flood = windows.pop().unwrap();
    let drops = port(&stats, &a)["drops"].clone();
    (windows.pop().unwrap(), flood, drops)
}

/// The checks of both tests: A's junk counted under `reason` (in A's `drops`), A read at its
/// cap, B and C keep [`KEPT`] of their rates.
fn check(what: &str, dead_end: Window, flood: Window, drops: &serde_json::Value, reason: &str) {
    assert!(
        drops[reason].as_u64().unwrap() > 0,
        "{what}: nothing counted as {reason}: {drops}"
    );
    let cap_fps = A_MAX_BPS / (60.0 * 8.0);
    assert!(
        flood.a_read_fps <= READ_AT_CAP * cap_fps,
        "{what}: the switch read {:.0} frames/s from A, capped at {cap_fps:.0}",
        flood.a_read_fps
    );
    neighbours_keep(what, &dead_end, &flood);
}

/// B and C keep [`KEPT`] of their rates beside the dead end under the flood.
fn neighbours_keep(what: &str, dead_end: &Window, flood: &Window) {
    let (before, under): (f64, f64) = (
        dead_end.neighbours.iter().sum(),
        flood.neighbours.iter().sum(),
    );
    println!("{what}: B + C {under:.0} Mbit/s under the flood, {before:.0} beside a dead end");
    assert!(
        under >= KEPT * before,
        "{what}: B and C fell from {:.0?} to {:.0?} Mbit/s",
        dead_end.neighbours,
        flood.neighbours
    );
}

#[test]
fn a_capped_tenants_hairpin_flood_is_read_at_its_cap_and_leaves_its_neighbours_their_rates() {
    let Some(_serial) = can_run("a_capped_tenants_hairpin_flood_is_read_at_its_cap") else {
        return;
    };
    let (dead_end, flood, drops) = run(20, true);
    check("hairpin", dead_end, flood, &drops, "hairpin");
}

#[test]
fn a_capped_tenants_storm_to_unknown_macs_is_read_at_its_cap_and_leaves_its_neighbours_their_rates()
{
    let Some(_serial) = can_run("a_capped_tenants_storm_to_unknown_macs_is_read_at_its_cap") else {
        return;
    };
    let (dead_end, flood, drops) = run(21, false);
    check("storm", dead_end, flood, &drops, "storm");
}

#[test]
fn a_network_flood_toward_a_capped_vif_fills_its_own_uplink_queue_and_leaves_its_neighbours_their_rates(
) {
    let Some(_serial) = can_run("a_network_flood_toward_a_capped_vif_fills_its_own_uplink_queue")
    else {
        return;
    };
    let (dead_end, flood, _) = run_from(22, None);
    // The neighbours' acknowledgements come back in their queues beside the dead end; the
    // flood toward A fills another, which carried none of theirs.
    let (q, before_q) = (&flood.uplink_queues, &dead_end.uplink_queues);
    assert_eq!(q.len(), 4, "the default TAP uplink has 4 queues: {q:?}");
    let flooded = (0..4).max_by_key(|&i| q[i]).unwrap();
    assert!(
        before_q[flooded] * 100 <= before_q.iter().sum::<u64>(),
        "the flood toward A shares queue {flooded} with its neighbours' frames: {before_q:?} \
         beside the dead end, {q:?} under the flood"
    );
    // Read within A's budget (150 % of its max), not as fast as the network sends.
    let read_fps = q[flooded] as f64 / flood.secs;
    let budget_fps = 1.5 * A_MAX_BPS / (60.0 * 8.0);
    assert!(
        read_fps <= READ_AT_BUDGET * budget_fps,
        "A's queue was read at {read_fps:.0} frames/s, its budget {budget_fps:.0}"
    );
    assert!(flood.uplink_holds > 0, "no budget hold counted");
    neighbours_keep("network", &dead_end, &flood);
}
