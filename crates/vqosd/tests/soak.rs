//! Soak: the real switch under load and churn, and nothing is lost. vqosd with 8 TAP ports in
//! namespace VMs and a sink on the uplink: four VMs send TCP (iperf3), two send UDP of 64-byte
//! datagrams (iperf3 -u), while a client changes a random vif's policy and adds and removes a
//! spare port every 100 ms through the API, for `VQOS_SOAK_SECS` seconds (default 20;
//! `scripts/soak.sh MINUTES` runs it longer, `.ci/run` for 60 s). At the end, with the traffic
//! stopped:
//! - frames are conserved exactly: everything read was written or dropped under a named
//!   reason (Σ rx = Σ tx + Σ drops over the ports; static ARP entries and IPv6 off leave no
//!   flooded frame, the one case where a frame read is written more than once);
//! - vqosd's memory (RSS) and its open file descriptors are flat (measured after the warm-up
//!   and at the end; a leak per churned port would add thousands of descriptors);
//! - every policy the client last set is in force, in the API and in the data plane.
//!
//! Needs root and iperf3 (the real-traffic lock); skips with a message otherwise.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use vqos_testkit::{can_run, poll, sh, Proc};

/// (RSS in KiB, open descriptors) of process `pid`.
fn footprint(pid: i32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (rss, fds)
}

/// Σ rx, Σ tx and Σ drops over every port of a `/v1/stats` answer.
fn totals(stats: &Value) -> (u64, u64, u64) {
    let ports = stats["ports"].as_array().unwrap();
    let sum = |k: &str| ports.iter().map(|p| p[k].as_u64().unwrap()).sum::<u64>();
    let drops = ports
        .iter()
        .flat_map(|p| p["drops"].as_object().unwrap().values())
        .map(|v| v.as_u64().unwrap())
        .sum();
    (sum("rx_frames"), sum("tx_frames"), drops)
}

/// A deterministic xorshift, so that a failing churn sequence can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn eight_ports_under_load_and_churn_lose_nothing() {
    let Some(_serial) = can_run("eight_ports_under_load_and_churn_lose_nothing") else {
        return;
    };
    let secs: u64 = std::env::var("VQOS_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let lab = lab(7, &[1, 2, 3, 4, 5, 6, 7, 8]);
    // No ARP and no neighbour discovery: every MAC is known before traffic starts, by static
    // entries, so nothing is ever flooded (conservation is then exact).
    let sink = lab.sink_addr();
    let mac_of = |ns: &str, dev: &str| {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "cat",
                &format!("/sys/class/net/{dev}/address"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let sink_mac = mac_of(lab.sink.name(), &lab.uplink);
    for (i, (tap, ns)) in lab.vms.iter().enumerate() {
        let vm_mac = mac_of(ns.name(), tap);
        let addr = format!("{}.{}", lab.net, i + 1);
        sh(&[
            "ip",
            "-n",
            ns.name(),
            "neigh",
            "replace",
            &sink,
            "lladdr",
            &sink_mac,
            "dev",
            tap,
            "nud",
            "permanent",
        ]);
        sh(&[
            "ip",
            "-n",
            lab.sink.name(),
            "neigh",
            "replace",
            &addr,
            "lladdr",
            &vm_mac,
            "dev",
            &lab.uplink,
            "nud",
            "permanent",
        ]);
    }

    // What the setup itself sent (interfaces coming up) is not part of the balance.
    std::thread::sleep(Duration::from_millis(500));
    let before = totals(&lab.stats());
    // Load: TCP from VMs 1-4, 64-byte UDP from VMs 5-6 (50 Mbit/s each), for the whole run.
    let run = u32::try_from(secs + 4).unwrap();
    let mut servers: Vec<Proc> = (0..6).map(|i| lab.server(5301 + i)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut clients: Vec<Proc> = (0..4)
        .map(|vm| lab.client(vm, 5301 + vm as u16, run))
        .collect();
    for vm in 4..6 {
        let port = (5301 + vm as u16).to_string();
        clients.push(lab.vms[vm].1.spawn(&[
            "iperf3",
            "-c",
            &sink,
            "-p",
            &port,
            "-u",
            "-b",
            "50M",
            "-l",
            "22",
            "-t",
            &run.to_string(),
            "-J",
        ]));
    }
    std::thread::sleep(Duration::from_secs(2));
    let pid = lab.daemon.pid();
    let start = footprint(pid);

    // Churn every 100 ms: a random vif's policy, and a spare port added or removed.
    let mut rng = Rng(0x5eed_50a6);
    let mut wanted: BTreeMap<String, Value> = BTreeMap::new();
    let spare = format!("{}x", lab.tap(0).trim_end_matches("v1"));
    let mut spare_up = false;
    let (mut changes, mut port_churn) = (0u32, 0u32);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        let vm = rng.next(8) as usize;
        let tap = lab.tap(vm).to_string();
        let policy = json!({
            "weight": 1 + rng.next(9),
            "max": if rng.next(2) == 0 { json!(null) } else { json!(format!("{}Mbit", 100 + rng.next(900))) },
            "priority": rng.next(8),
        });
        lab.daemon
            .call("PUT", &format!("/v1/policies/{tap}"), policy.clone());
        wanted.insert(tap, policy);
        if spare_up {
            lab.daemon
                .client()
                .call::<Value>("DELETE", &format!("/v1/ports/{spare}"), None)
                .unwrap();
        } else {
            // The spare TAP stays in vqosd's namespace, whose kernel may send from it (IPv6
            // neighbour discovery): its configured MAC is one the kernel does not use, so all
            // of that is dropped at ingress (`spoofed`) rather than flooded.
            lab.daemon.call(
                "POST",
                "/v1/ports",
                json!({"name": spare, "macs": ["02:00:00:00:99:99"], "policy": {"weight": 2}}),
            );
        }
        spare_up = !spare_up;
        changes += 1;
        port_churn += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let end = footprint(pid);
    if spare_up {
        lab.daemon
            .client()
            .call::<Value>("DELETE", &format!("/v1/ports/{spare}"), None)
            .unwrap();
    }

    // Stop the traffic, then wait until the counters stand still.
    drop(clients);
    for s in servers.drain(..) {
        drop(s);
    }
    let mut last = (0, 0, 0);
    let settled = poll(Duration::from_secs(20), || {
        std::thread::sleep(Duration::from_millis(300));
        let t = totals(&lab.stats());
        let same = t == last;
        last = t;
        same.then_some(t)
    });
    let after = settled.expect("counters never settled");
    let (rx, tx, drops) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    println!(
        "soak {secs} s: {changes} policy changes, {port_churn} port adds/removes; rx {rx} = tx {tx} + \
         drops {drops}; vqosd RSS {} → {} KiB, fds {} → {}",
        start.0, end.0, start.1, end.1
    );
    assert!(
        rx > 10_000,
        "too little traffic to mean anything: {rx} frames"
    );
    let per_port: Vec<String> = lab.stats()["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} rx {} tx {} drops {}",
                p["name"], p["rx_frames"], p["tx_frames"], p["drops"]
            )
        })
        .collect();
    assert_eq!(
        rx,
        tx + drops,
        "frames lost without a counter: {per_port:#?}"
    );
    assert!(
        end.0 <= start.0 + 16 * 1024,
        "RSS grew from {} to {} KiB",
        start.0,
        end.0
    );
    assert!(
        end.1 <= start.1 + 8,
        "fds grew from {} to {}",
        start.1,
        end.1
    );
    let stats = lab.stats();
    for (tap, p) in &wanted {
        let got = lab.daemon.get(&format!("/v1/policies/{tap}"));
        assert_eq!(got["weight"], p["weight"], "{tap}");
        assert_eq!(got["priority"], p["priority"], "{tap}");
        let max = p["max"].as_str().unwrap_or("unlimited");
        assert_eq!(got["max"], max, "{tap}");
        assert_eq!(port(&stats, tap)["policy"], got, "{tap}: data plane vs API");
    }
}
