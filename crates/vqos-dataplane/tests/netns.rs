//! Real traffic: TAP ports created by the switch, moved into network namespaces ("VMs" and a
//! sink on the uplink), iperf3 TCP through the switch. Needs root and iperf3; skips otherwise.
//!
//! Names are `vq<pid><tag>` (IFNAMSIZ-safe), addresses 10.(100 + pid % 100).<test>.0/24. Every
//! namespace, link and process is cleaned up by Drop guards (`vqos_testkit`), also when a test
//! fails; the tests run one at a time (`vqos_testkit::can_run`).

use std::time::{Duration, Instant};

use vqos_dataplane::{DropReason, PortSpec, PortStatus, SwitchConfig, SwitchHandle, TapIo};
use vqos_sched::{allocate, Claim, EngineKind, VifPolicy};
use vqos_testkit::{can_run, sh, sleep_until, Links, Netns, Proc};

/// A switch with `n` VMs and a sink; the switch is stopped before the namespaces go.
struct Lab {
    sw: Option<SwitchHandle>,
    vms: Vec<(String, Netns)>,
    sink: Netns,
    net: String,
    /// Links left in this namespace (the AF_PACKET uplink's veth), deleted after the switch.
    _links: Links,
}

/// The uplink of a [`Lab`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Uplink {
    /// A TAP the switch creates, moved into the sink.
    Tap,
    /// One end of a veth pair, attached through AF_PACKET; the other end is in the sink.
    AfPacket,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(sw) = self.sw.take() {
            let _ = sw.stop();
        }
    }
}

fn lab(test_id: u8, engine: EngineKind, capacity_bps: Option<u64>, weights: &[u32]) -> Lab {
    lab_io(
        test_id,
        engine,
        capacity_bps,
        weights,
        TapIo::Syscall,
        Uplink::Tap,
    )
}

/// [`lab`] with every TAP (uplink and vifs) moving frames by `io`, and the uplink `uplink`.
fn lab_io(
    test_id: u8,
    engine: EngineKind,
    capacity_bps: Option<u64>,
    weights: &[u32],
    io: TapIo,
    uplink_kind: Uplink,
) -> Lab {
    let pid = std::process::id() % 100_000;
    let net = format!("10.{}.{}", 100 + pid % 100, test_id);
    let prefix = format!("vq{pid}t{test_id}");
    let uplink = format!("{prefix}u");
    // The sink's end of the uplink: the TAP itself, or the veth's far end.
    let (spec, sink_dev, links) = match uplink_kind {
        Uplink::Tap => (
            PortSpec::tap(&uplink).with_tap_io(io),
            uplink.clone(),
            Links(Vec::new()),
        ),
        Uplink::AfPacket => {
            let far = format!("{prefix}p");
            let links = Links(vec![uplink.clone()]);
            sh(&[
                "ip", "link", "add", "name", &uplink, "type", "veth", "peer", "name", &far,
            ]);
            // No IPv6 on the switch's end: the host's stack sends nothing on it.
            sh(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{uplink}.disable_ipv6=1"),
            ]);
            (PortSpec::af_packet(&uplink), far, links)
        }
    };
    let mut cfg = SwitchConfig::new(spec);
    cfg.engine = engine;
    cfg.capacity_bps = capacity_bps;
    let sw = SwitchHandle::start(cfg).unwrap();
    let sink = Netns::new(format!("{prefix}-sink"));
    sink.take_link(&sink_dev, &format!("{net}.254/24"));
    let mut vms = Vec::new();
    for (i, &w) in weights.iter().enumerate() {
        let tap = format!("{prefix}v{i}");
        sw.add_port(
            PortSpec::tap(&tap).with_tap_io(io),
            VifPolicy {
                weight: w,
                ..Default::default()
            },
        )
        .unwrap();
        let ns = Netns::new(format!("{prefix}-vm{i}"));
        ns.take_link(&tap, &format!("{net}.{}/24", i + 1));
        vms.push((tap, ns));
    }
    Lab {
        sw: Some(sw),
        vms,
        sink,
        net,
        _links: links,
    }
}

impl Lab {
    fn sw(&self) -> &SwitchHandle {
        self.sw.as_ref().unwrap()
    }

    /// One greedy TCP stream per VM to the sink for `secs` (+`omit` warm-up); Mbit/s of payload
    /// each iperf3 client reports as received.
    fn iperf(&self, secs: u32, omit: u32) -> Vec<f64> {
        self.start_iperf(secs, omit)
            .goodputs(u64::from(secs + omit) + 20)
    }

    /// Starts one greedy TCP stream per VM to the sink, running for `secs` after `omit` seconds
    /// of warm-up that iperf3 leaves out of its sums.
    fn start_iperf(&self, secs: u32, omit: u32) -> IperfRun {
        let base_port = 5201 + (std::process::id() % 1000) as u16 * 10;
        let servers: Vec<Proc> = (0..self.vms.len())
            .map(|i| {
                let port = (base_port + i as u16).to_string();
                let bind = format!("{}.254", self.net);
                self.sink
                    .spawn(&["iperf3", "-s", "-1", "-p", &port, "-B", &bind])
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let clients = self
            .vms
            .iter()
            .enumerate()
            .map(|(i, (_, ns))| {
                let port = (base_port + i as u16).to_string();
                let dst = format!("{}.254", self.net);
                ns.spawn(&[
                    "iperf3",
                    "-c",
                    &dst,
                    "-p",
                    &port,
                    "-t",
                    &secs.to_string(),
                    "-O",
                    &omit.to_string(),
                    "-J",
                ])
            })
            .collect();
        IperfRun {
            started: Instant::now(),
            clients,
            _servers: servers,
        }
    }

    /// Every VM's on-wire rate (Mbit/s) through the switch over the common window
    /// [`from_s`, `to_s`] after `run` started, from the switch's own per-port counters.
    ///
    /// One window for all VMs: iperf3's per-client sums cover windows that start and end a few
    /// tens of milliseconds apart, and the client that runs last has the link to itself for
    /// that long, which is noise of the measurement, not of the scheduler.
    fn window_rates(&self, run: &mut IperfRun, from_s: f64, to_s: f64) -> Vec<f64> {
        let rx = |lab: &Lab| -> (Instant, Vec<u64>) {
            let s = lab.sw().stats();
            let at = Instant::now();
            let bytes = lab
                .vms
                .iter()
                .map(|(tap, _)| s.port(tap).expect("port in the stats").counters.rx_bytes)
                .collect();
            (at, bytes)
        };
        sleep_until(run.started, from_s);
        let (t0, b0) = rx(self);
        sleep_until(run.started, to_s);
        let (t1, b1) = rx(self);
        for (i, c) in run.clients.iter_mut().enumerate() {
            assert!(c.running(), "VM {i}'s iperf3 ended before {to_s} s");
        }
        let secs = (t1 - t0).as_secs_f64();
        b0.iter()
            .zip(&b1)
            .map(|(a, b)| (b - a) as f64 * 8.0 / secs / 1e6)
            .collect()
    }
}

/// iperf3 clients and servers of one run, stopped (by PID) on drop.
struct IperfRun {
    started: Instant,
    clients: Vec<Proc>,
    _servers: Vec<Proc>,
}

impl IperfRun {
    /// Waits (at most `limit_s` from now) for every client's report; Mbit/s of payload each
    /// received, the `-O` warm-up left out.
    fn goodputs(self, limit_s: u64) -> Vec<f64> {
        let deadline = Instant::now() + Duration::from_secs(limit_s);
        self.clients
            .into_iter()
            .map(|c| {
                let left = deadline.saturating_duration_since(Instant::now());
                let out = c.output_within(left);
                let v: serde_json::Value = serde_json::from_str(&out)
                    .unwrap_or_else(|e| panic!("iperf3 output ({e}): {out}"));
                v["end"]["sum_received"]["bits_per_second"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("iperf3 failed: {out}"))
                    / 1e6
            })
            .collect()
    }
}

#[test]
fn tcp_flows_through_the_switch_and_counters_move() {
    let Some(_serial) = can_run("tcp_flows_through_the_switch_and_counters_move") else {
        return;
    };
    let lab = lab(1, EngineKind::Rr, None, &[1, 1]);
    let t = Instant::now();
    let rates = lab.iperf(2, 0);
    println!(
        "rr, unlimited, 2 VMs: {rates:?} Mbit/s in {:?}",
        t.elapsed()
    );
    for r in &rates {
        assert!(*r > 100.0, "each VM moves real traffic: {rates:?}");
    }
    let s = lab.sw().stats();
    for (tap, _) in &lab.vms {
        let p = s.port(tap).unwrap();
        assert!(p.counters.rx_bytes > 10_000_000, "{tap}: {p:?}");
        assert!(p.counters.tx_frames > 100, "ACKs and ARP reach the VM");
        assert_eq!(
            p.counters.drops[DropReason::Truncated]
                + p.counters.drops[DropReason::Oversized]
                + p.counters.drops[DropReason::BadVnetHdr],
            0
        );
        // TSO: frames are super-frames, far above 1514 bytes on average.
        assert!(
            p.counters.rx_bytes / p.counters.rx_frames > 3000,
            "offloads on: {p:?}"
        );
    }
    let up = s.port(lab.sw().uplink_name()).unwrap();
    assert!(up.counters.tx_bytes > 20_000_000);
    assert!(s.loops_total().bursts > 100 && s.loops_total().busy_cycles > 0);
}

/// TCP payload per byte the switch counts: it charges every segment's Ethernet, IPv4 and TCP
/// headers (14 + 20 + 32 with timestamps, MTU 1500), iperf3 reports payload.
const GOODPUT_PER_WIRE_BYTE: f64 = 1448.0 / 1514.0;

/// The part of the link a VM's rate may be off by however small its share (see
/// [`check_split`]).
const LINK_SLACK: f64 = 0.01;

/// Checks `rates` (Mbit/s; on-wire for the switch's counters, goodput for iperf3's) against
/// the reference split by `weights` of what the switch forwarded: each within `tol` of its
/// share or within [`LINK_SLACK`] of the link, whichever is larger. The sum must not exceed
/// `capacity_bps` (by more than [`OVER_CAPACITY`]) and must reach `expected_aggregate` of it
/// — or, on a busy machine, at least [`MIN_FORWARDED`] of it, with the split then checked
/// on what was forwarded.
///
/// Why the split of what was forwarded: with the cores busy, the one switch thread does not
/// get the CPU to forward the whole link (seen: 858 of 940 Mbit/s, split 1:2:3:4:5 to within
/// 1 %). How much a switch forwards on a starved core is a benchmark's question; how it
/// divides it is this test's.
///
/// Why an absolute part: when the machine is busy, the switch thread and the VMs' senders are
/// descheduled for milliseconds at a time. A sender that was not running has an empty queue
/// when the switch next polls, and the link time it leaves goes to whoever is ready (the switch
/// is work-conserving). What moves between VMs that way is an amount of *link time*, the same
/// for a small share as for a large one; as a fraction of a weight-1 VM's 63 Mbit/s it is
/// several percent (seen: +7.7 % with two busy loops on both cores), of the weight-5 VM's
/// 313 Mbit/s it is not. So a small share is held to a fraction of the link, a large one to a
/// fraction of itself.
fn check_split(
    rates: &[f64],
    weights: &[u32],
    capacity_bps: u64,
    tol: f64,
    expected_aggregate: f64,
) {
    let cap = capacity_bps as f64 / 1e6;
    let total: f64 = rates.iter().sum();
    assert!(
        total <= cap * (1.0 + OVER_CAPACITY),
        "aggregate {total:.1} Mbit/s above the capacity {cap}"
    );
    assert!(
        total >= MIN_FORWARDED * cap,
        "aggregate {total:.1} < {:.0} % of {cap}",
        MIN_FORWARDED * 100.0
    );
    if total < expected_aggregate * cap {
        println!(
            "aggregate {total:.1} Mbit/s < {:.0} % of {cap}: a busy machine; the split is checked on what was forwarded",
            expected_aggregate * 100.0
        );
    }
    let forwarded_bps = ((total * 1e6) as u64).min(capacity_bps);
    let claims: Vec<Claim> = weights
        .iter()
        .map(|&w| {
            Claim::new(
                &VifPolicy {
                    weight: w,
                    ..Default::default()
                },
                None,
            )
        })
        .collect();
    let want: Vec<f64> = allocate(forwarded_bps, &claims)
        .unwrap()
        .into_iter()
        .map(|r| r as f64 / 1e6)
        .collect();
    println!("measured {rates:.1?} Mbit/s, reference {want:.1?}");
    for (got, want) in rates.iter().zip(&want) {
        assert!(
            (got - want).abs() <= (tol * want).max(LINK_SLACK * cap),
            "measured {rates:.1?} vs reference {want:.1?} (±{:.0} % or ±{:.1} Mbit/s)",
            tol * 100.0,
            LINK_SLACK * cap
        );
    }
}

/// The least part of the capacity the switch must forward, however busy the machine.
const MIN_FORWARDED: f64 = 0.5;

/// How far above the capacity the measured sum may be: the two counter snapshots are taken a
/// few microseconds apart from the window's ends, and iperf3's goodput sums cover windows
/// that differ by tens of milliseconds.
const OVER_CAPACITY: f64 = 0.02;

#[test]
fn vqos_weights_1_to_3_split_200_mbit() {
    let Some(_serial) = can_run("vqos_weights_1_to_3_split_200_mbit") else {
        return;
    };
    let lab = lab(2, EngineKind::Vqos, Some(200_000_000), &[1, 3]);
    let rates = lab.iperf(4, 1);
    check_split(&rates, &[1, 3], goodput(200_000_000), 0.15, 0.90);
}

/// The same split with every TAP on io_uring ([`TapIo::Uring`]): batched reads and writes move
/// the same traffic, every frame read is accounted for, and weights hold.
#[test]
fn vqos_weights_1_to_3_split_200_mbit_on_io_uring_taps() {
    let Some(_serial) = can_run("vqos_weights_1_to_3_split_200_mbit_on_io_uring_taps") else {
        return;
    };
    let lab = lab_io(
        4,
        EngineKind::Vqos,
        Some(200_000_000),
        &[1, 3],
        TapIo::Uring,
        Uplink::Tap,
    );
    let rates = lab.iperf(4, 1);
    check_split(&rates, &[1, 3], goodput(200_000_000), 0.15, 0.90);
    let s = lab.sw().stats();
    for p in &s.ports {
        assert_eq!(p.counters.rx_errors, 0, "{}: {p:?}", p.name);
        assert_eq!(p.uring_failures, 0, "{}: fell back to system calls", p.name);
        // Both ways, in TSO super-frames (a weight-1 VM sent 915 of them in one run).
        assert!(
            p.counters.rx_frames > 100 && p.counters.tx_frames > 100,
            "{}: {p:?}",
            p.name
        );
    }
}

/// The same split with the uplink on an existing interface ([`PortSpec::af_packet`]): one end
/// of a veth pair attached through AF_PACKET, the other end in the sink. TCP super-frames go
/// out whole, the ACKs come back, nothing is refused or read back.
#[test]
fn vqos_weights_1_to_3_split_200_mbit_on_an_af_packet_uplink() {
    let Some(_serial) = can_run("vqos_weights_1_to_3_split_200_mbit_on_an_af_packet_uplink") else {
        return;
    };
    let lab = lab_io(
        5,
        EngineKind::Vqos,
        Some(200_000_000),
        &[1, 3],
        TapIo::Syscall,
        Uplink::AfPacket,
    );
    let rates = lab.iperf(4, 1);
    check_split(&rates, &[1, 3], goodput(200_000_000), 0.15, 0.90);
    let s = lab.sw().stats();
    // Traffic both ways on every port (few frames: TSO super-frames of tens of kB; the split
    // itself is checked above).
    for p in &s.ports {
        assert_eq!(p.counters.rx_errors, 0, "{}: {p:?}", p.name);
        assert!(
            p.counters.rx_frames > 100 && p.counters.tx_frames > 100,
            "{}: {p:?}",
            p.name
        );
    }
    let up = s.port(lab.sw().uplink_name()).unwrap();
    println!("uplink: {up:?}");
    // Only the uplink's: a vif's TAP may refuse a frame flooded to it while the lab is still
    // bringing it up in its namespace (seen once: the sink's first multicast frames).
    assert_eq!(up.counters.drops[DropReason::TxError], 0, "{up:?}");
    assert!(
        up.counters.tx_bytes / up.counters.tx_frames > 3000,
        "super-frames out: {up:?}"
    );
    let Some(PortStatus::AfPacket(status)) = &up.status else {
        panic!("no AF_PACKET status: {up:?}");
    };
    assert_eq!(status.vnet_hdr_bytes, 12);
    assert_eq!(status.kernel_drops, 0, "{status:?}");
}

#[test]
fn vqos_five_vms_weights_1_to_5_share_940_mbit() {
    let Some(_serial) = can_run("vqos_five_vms_weights_1_to_5_share_940_mbit") else {
        return;
    };
    let weights = [1, 2, 3, 4, 5];
    let lab = lab(3, EngineKind::Vqos, Some(940_000_000), &weights);
    // One stream per VM for 2 + 10 + 2 s; the 10 s window in the middle is measured on the
    // switch's counters, the same window for every VM.
    let mut run = lab.start_iperf(14, 0);
    let rates = lab.window_rates(&mut run, 2.0, 12.0);
    check_split(&rates, &weights, 940_000_000, 0.05, 0.97);
    // And the receivers got it: each iperf3 client's whole-run goodput is near its share too
    // (looser: its 14 s include the ramp and the ends of the others' runs).
    let goodputs = run.goodputs(30);
    check_split(&goodputs, &weights, goodput(940_000_000), 0.10, 0.93);
}

/// The goodput of TCP at an on-wire rate of `wire_bps`.
fn goodput(wire_bps: u64) -> u64 {
    (wire_bps as f64 * GOODPUT_PER_WIRE_BYTE) as u64
}
