//! Real traffic: TAP ports created by the switch, moved into network namespaces ("VMs" and a
//! sink on the uplink), iperf3 TCP through the switch. Needs root and iperf3; skips otherwise.
//!
//! Names are `vq<pid><tag>` (IFNAMSIZ-safe), addresses 10.(100 + pid % 100).<test>.0/24. Every
//! namespace, link and process is cleaned up by Drop guards, also when a test fails.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vqos_dataplane::{PortSpec, SwitchConfig, SwitchHandle};
use vqos_sched::{allocate, Claim, EngineKind, VifPolicy};

fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP {test}: needs root");
        return false;
    }
    let iperf = Command::new("iperf3")
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    if !iperf.is_ok_and(|s| s.success()) {
        println!("SKIP {test}: iperf3 not installed (apt-get install -y iperf3)");
        return false;
    }
    true
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Self {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name]);
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        Netns(name)
    }

    /// Moves `link` in, gives it `addr` and brings it up.
    fn take_link(&self, link: &str, addr: &str) {
        sh(&["ip", "link", "set", link, "netns", &self.0]);
        sh(&["ip", "-n", &self.0, "addr", "add", addr, "dev", link]);
        sh(&["ip", "-n", &self.0, "link", "set", link, "up"]);
    }

    fn spawn(&self, args: &[&str]) -> Proc {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Proc(Some(child))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A process we started; killed by PID and reaped on drop.
struct Proc(Option<Child>);

impl Proc {
    /// Its stdout once it exits; killed (by PID) if it runs past `limit`, so a broken switch
    /// fails the test instead of hanging it.
    fn output_within(mut self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let child = self.0.as_mut().unwrap();
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self.0.take().unwrap().wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A switch with `n` VMs and a sink; the switch is stopped before the namespaces go.
struct Lab {
    sw: Option<SwitchHandle>,
    vms: Vec<(String, Netns)>,
    sink: Netns,
    net: String,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(sw) = self.sw.take() {
            let _ = sw.stop();
        }
    }
}

fn lab(test_id: u8, engine: EngineKind, capacity_bps: Option<u64>, weights: &[u32]) -> Lab {
    let pid = std::process::id() % 100_000;
    let net = format!("10.{}.{}", 100 + pid % 100, test_id);
    let prefix = format!("vq{pid}t{test_id}");
    let uplink = format!("{prefix}u");
    let mut cfg = SwitchConfig::new(PortSpec::tap(&uplink));
    cfg.engine = engine;
    cfg.capacity_bps = capacity_bps;
    let sw = SwitchHandle::start(cfg).unwrap();
    let sink = Netns::new(format!("{prefix}-sink"));
    sink.take_link(&uplink, &format!("{net}.254/24"));
    let mut vms = Vec::new();
    for (i, &w) in weights.iter().enumerate() {
        let tap = format!("{prefix}v{i}");
        sw.add_port(
            PortSpec::tap(&tap),
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
    }
}

impl Lab {
    fn sw(&self) -> &SwitchHandle {
        self.sw.as_ref().unwrap()
    }

    /// One greedy TCP stream per VM to the sink for `secs` (+`omit` warm-up); Mbit/s received.
    fn iperf(&self, secs: u32, omit: u32) -> Vec<f64> {
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
        let clients: Vec<Proc> = self
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
        let rates = clients
            .into_iter()
            .map(|c| {
                let out = c.output_within(Duration::from_secs(u64::from(secs + omit) + 20));
                let v: serde_json::Value = serde_json::from_str(&out)
                    .unwrap_or_else(|e| panic!("iperf3 output ({e}): {out}"));
                v["end"]["sum_received"]["bits_per_second"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("iperf3 failed: {out}"))
                    / 1e6
            })
            .collect();
        drop(servers);
        rates
    }
}

#[test]
fn tcp_flows_through_the_switch_and_counters_move() {
    if !can_run("tcp_flows_through_the_switch_and_counters_move") {
        return;
    }
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
        assert!(p.rx_bytes > 10_000_000, "{tap}: {p:?}");
        assert!(p.tx_frames > 100, "ACKs and ARP reach the VM");
        assert_eq!(
            p.drops.truncated + p.drops.oversized + p.drops.bad_vnet_hdr,
            0
        );
        // TSO: frames are super-frames, far above 1514 bytes on average.
        assert!(p.rx_bytes / p.rx_frames > 3000, "offloads on: {p:?}");
    }
    let up = s.port(lab.sw().uplink_name()).unwrap();
    assert!(up.tx_bytes > 20_000_000);
    assert!(s.loop_stats.bursts > 100 && s.loop_stats.busy_cycles > 0);
}

/// TCP payload per byte the switch counts: it charges every segment's Ethernet, IPv4 and TCP
/// headers (14 + 20 + 32 with timestamps, MTU 1500), iperf3 reports payload.
const GOODPUT_PER_WIRE_BYTE: f64 = 1448.0 / 1514.0;

/// Checks `rates` (iperf3 goodput) against the reference allocation of `capacity` (on-wire
/// bytes) among greedy vifs.
fn check_split(rates: &[f64], weights: &[u32], capacity_bps: u64, tol: f64, min_aggregate: f64) {
    let capacity_bps = (capacity_bps as f64 * GOODPUT_PER_WIRE_BYTE) as u64;
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
    let want: Vec<f64> = allocate(capacity_bps, &claims)
        .unwrap()
        .into_iter()
        .map(|r| r as f64 / 1e6)
        .collect();
    println!("measured {rates:.1?} Mbit/s, reference {want:.1?}");
    for (got, want) in rates.iter().zip(&want) {
        assert!(
            (got - want).abs() <= tol * want,
            "measured {rates:.1?} vs reference {want:.1?} (±{:.0} %)",
            tol * 100.0
        );
    }
    let total: f64 = rates.iter().sum();
    let cap = capacity_bps as f64 / 1e6;
    assert!(
        total >= min_aggregate * cap,
        "aggregate {total:.1} < {:.0} % of {cap}",
        min_aggregate * 100.0
    );
}

#[test]
fn vqos_weights_1_to_3_split_200_mbit() {
    if !can_run("vqos_weights_1_to_3_split_200_mbit") {
        return;
    }
    let lab = lab(2, EngineKind::Vqos, Some(200_000_000), &[1, 3]);
    let rates = lab.iperf(4, 1);
    check_split(&rates, &[1, 3], 200_000_000, 0.15, 0.90);
}

#[test]
fn vqos_five_vms_weights_1_to_5_at_940_mbit_within_5_percent() {
    if !can_run("vqos_five_vms_weights_1_to_5_at_940_mbit_within_5_percent") {
        return;
    }
    let weights = [1, 2, 3, 4, 5];
    let lab = lab(3, EngineKind::Vqos, Some(940_000_000), &weights);
    let rates = lab.iperf(10, 2);
    check_split(&rates, &weights, 940_000_000, 0.05, 0.97);
}
