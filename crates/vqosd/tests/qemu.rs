//! Real VMs on vqosd's vhost-user ports: two QEMU guests (TCG, a Debian kernel and a busybox
//! initramfs built by `scripts/guest-image.sh` into `target/guest-image`, cached) attach to two
//! `kind = "vhost-user"` ports of the config, vm1 with vqosd in the server role (QEMU connects,
//! with `reconnect=1`), vm2 in the client role (QEMU listens, vqosd connects); the uplink is a
//! TAP in a sink namespace; the switch runs two threads (`threads = 2`). Checked: both guests ping the sink and each other; iperf3 from both
//! guests to the sink at once under weights and a maximum set through the API, the shares
//! measured on the switch's counters within 5 % of the reference allocation; vqosd killed with
//! SIGKILL under those running transfers and started again: vm2's port reconnects to its QEMU,
//! vm1's QEMU to the new socket, the policies are restored and the same TCP streams resume
//! with the same shares. No guest is restarted.
//!
//! Needs root, `qemu-system-x86_64`, iperf3 and what the image script needs (it installs
//! busybox-static and iperf3 with apt-get, downloads a kernel package the first time); prints
//! SKIP otherwise. Takes the machine-wide real-traffic lock. The capacity, 40 Mbit/s, is far
//! below what a TCG guest sends here (about 1.5 Gbit/s of TCP with TSO, unlimited), so every
//! guest always has more to send than its share and the guests cost little CPU.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::qemu::{guest_image, missing, poll_gently, Guest, Role};
use common::*;
use serde_json::{json, Value};
use vqos_sched::{allocate, Claim, VifPolicy};
use vqos_testkit::{machine_lock, poll, Netns, Proc};

/// The link the vifs share (config `capacity`): far below what a TCG guest sends.
const CAPACITY_BPS: u64 = 40_000_000;
/// Shares measured on the switch's counters must be within this of the reference allocation
/// (issue 8's bound; measured within 1 %: a TCG guest sends 1.5 Gbit/s here, the 4 s windows
/// read counters published every 25 ms).
const TOL: f64 = 0.05;

/// The counters of a vhost-user port that only a broken or hostile guest moves.
const MISBEHAVIOUR: [&str; 14] = [
    "bad_avail_index",
    "bad_ring_address",
    "head_out_of_range",
    "next_out_of_range",
    "chain_loop",
    "zero_length_desc",
    "bad_desc_address",
    "wrong_direction_desc",
    "indirect_desc",
    "oversized_chain",
    "short_chain",
    "quarantines",
    "guest_offload_unsupported_frames",
    "guest_rx_buffer_too_small_frames",
];

/// Each guest pings its targets (3 echoes each), the guests at the same time.
fn pings(jobs: &mut [(&mut Guest, &[&str])]) {
    let markers: Vec<Vec<String>> = jobs
        .iter_mut()
        .map(|(vm, to)| {
            to.iter()
                .map(|to| vm.send(&format!("ping -c 3 -W 5 {to}")))
                .collect()
        })
        .collect();
    for ((vm, to), markers) in jobs.iter().zip(markers) {
        for (to, marker) in to.iter().zip(markers) {
            let (out, rc) = vm.finish(&marker, Duration::from_secs(60));
            assert!(
                rc == 0 && out.contains("3 packets received"),
                "{} ping {to}: {out}",
                vm.name
            );
        }
    }
}

/// The lines of iperf3's summary (sender and receiver).
fn iperf_summary(out: &str) -> String {
    out.lines()
        .filter(|l| l.contains("sender") || l.contains("receiver"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn qemu_guests_on_vhost_user_ports_ping_share_and_survive_a_sigkill() {
    if let Some(why) = missing() {
        println!("SKIP qemu_guests_on_vhost_user_ports: {why}");
        return;
    }
    let _machine = machine_lock();
    let t0 = Instant::now();
    let image = match guest_image() {
        Ok(dir) => dir,
        Err(why) => {
            println!("SKIP qemu_guests_on_vhost_user_ports: {why}");
            return;
        }
    };
    let pid = std::process::id() % 100_000;
    let prefix = format!("q{pid}q");
    let net = format!("10.{}.77", 200 + pid % 50);
    let sink_ip = format!("{net}.254");
    let dir = tempfile::tempdir().unwrap();
    let (s1, s2) = (dir.path().join("vm1.sock"), dir.path().join("vm2.sock"));
    let socket = dir.path().join("vqosd.sock");
    let uplink = format!("{prefix}u");
    let config = dir.path().join("vqosd.toml");
    fs::write(
        &config,
        format!(
            "threads = 2\ncapacity = \"{}Mbit\"\nengine = \"vqos\"\nremove_taps_on_exit = true\n\
             state_file = \"{}\"\n[api]\nsocket = \"{}\"\n[uplink]\nname = \"{uplink}\"\n\
             [[port]]\nname = \"vm1\"\nkind = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n\
             [[port]]\nname = \"vm2\"\nkind = \"vhost-user\"\nsocket = \"{}\"\nmode = \"client\"\n\
             queues = 2\n",
            CAPACITY_BPS / 1_000_000,
            dir.path().join("state.json").display(),
            socket.display(),
            s1.display(),
            s2.display()
        ),
    )
    .unwrap();
    let mut d = Daemon::start(&config, &socket);
    let sink = Netns::new(format!("{prefix}-sink")).without_ipv6();
    sink.take_link(&uplink, &format!("{sink_ip}/24"));
    let mut vm1 = Guest::start(
        &image,
        "vm1",
        (&s1, Role::Server, 1),
        "52:54:00:77:00:01",
        &format!("{net}.1/24"),
    );
    let mut vm2 = Guest::start(
        &image,
        "vm2",
        (&s2, Role::Client, 2),
        "52:54:00:77:00:02",
        &format!("{net}.2/24"),
    );
    for vm in [&vm1, &vm2] {
        assert!(
            vm.wait_for("VQOS-GUEST-UP", Duration::from_secs(90)),
            "{} did not boot:\n{}",
            vm.name,
            vm.console()
        );
    }
    let both_up = |d: &Daemon| {
        poll_gently(Duration::from_secs(30), || {
            let s = d.get("/v1/stats");
            (connected(&s, "vm1") && connected(&s, "vm2")).then_some(())
        })
    };
    assert!(
        both_up(&d).is_some(),
        "not connected: {}",
        d.get("/v1/stats")
    );
    let stats = d.get("/v1/stats");
    println!(
        "both guests up and attached {:.1} s into the test; vm1 features {}; vm2 features {}",
        t0.elapsed().as_secs_f64(),
        port(&stats, "vm1")["vhost_user"]["feature_names"],
        port(&stats, "vm2")["vhost_user"]["feature_names"]
    );
    // vm2's QEMU asked for two queue pairs: the port offered MQ and QEMU's guest took it.
    // The switch runs two threads: each guest is read by its home and written by both, and
    // vm2's pair 1 is lent to the thread that is not its home (a one-vCPU guest sends on
    // pair 0 only). The guests' TCP must flow while the threads' parts of the capacity move
    // (it stalled once: a part's move made the engine forget a guest was ready).
    let vm2_status = &port(&stats, "vm2")["vhost_user"];
    assert_eq!(vm2_status["queues"], 2, "{vm2_status}");
    let mq = vm2_status["feature_names"].as_array().unwrap();
    assert!(mq.iter().any(|f| f == "MQ"), "{vm2_status}");
    println!(
        "vm2: {} queue pairs offered, frames per pair [from guest, to guest] {}",
        vm2_status["queues"], vm2_status["pair_frames"]
    );

    // Ping: each guest the sink and the other guest (both guests at once).
    let vm2_ip = format!("{net}.2");
    let vm1_ip = format!("{net}.1");
    pings(&mut [
        (&mut vm1, &[&sink_ip, &vm2_ip]),
        (&mut vm2, &[&sink_ip, &vm1_ip]),
    ]);
    println!("pings ok {:.1} s into the test", t0.elapsed().as_secs_f64());

    // Both guests send to the sink at once, for long enough to span the restart below;
    // weights and a max set through the API.
    let policies = [
        VifPolicy {
            weight: 1,
            ..Default::default()
        },
        VifPolicy {
            weight: 3,
            max_bps: Some(24_000_000),
            ..Default::default()
        },
    ];
    d.call("PUT", "/v1/policies/vm1", json!({"weight": 1}));
    d.call(
        "PUT",
        "/v1/policies/vm2",
        json!({"weight": 3, "max": "24Mbit"}),
    );
    let claims: Vec<Claim> = policies.iter().map(|p| Claim::new(p, None)).collect();
    let want: Vec<f64> = allocate(CAPACITY_BPS, &claims)
        .unwrap()
        .into_iter()
        .map(|r| r as f64 / 1e6)
        .collect();
    let servers: Vec<Proc> = [5201, 5202]
        .iter()
        .map(|p| sink.spawn(&["iperf3", "-s", "-1", "-p", &p.to_string(), "-B", &sink_ip]))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let secs = 26;
    let t_start = Instant::now();
    let m1 = vm1.send(&format!("iperf3 -c {sink_ip} -p 5201 -t {secs} -i 0 -f m"));
    let m2 = vm2.send(&format!("iperf3 -c {sink_ip} -p 5202 -t {secs} -i 0 -f m"));
    std::thread::sleep(Duration::from_secs(3));
    let check = |what: &str, got: &[f64]| {
        println!(
            "{what}: weights 1:3, vm2 max 24 Mbit/s, capacity {} Mbit/s: measured {got:.1?} \
             Mbit/s, reference {want:.1?}",
            CAPACITY_BPS / 1_000_000
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= TOL * w,
                "{what}: measured {got:.1?} vs reference {want:.1?} Mbit/s (±{:.0} %)",
                TOL * 100.0
            );
        }
    };
    let mbit = |d: &Daemon| -> Vec<f64> {
        rx_rates(d, &["vm1", "vm2"], 4.0)
            .into_iter()
            .map(|r| r / 1e6)
            .collect()
    };
    check("before the restart", &mbit(&d));

    // SIGKILL under the running transfers; the guests keep running; vqosd comes back: vm2's
    // port reconnects to its QEMU, vm1's QEMU to the port (reconnect=1); policies restored.
    d.kill9();
    let t = Instant::now();
    d = Daemon::start(&config, &socket);
    let back = |name: &str| {
        poll_gently(Duration::from_secs(20), || {
            connected(&d.get("/v1/stats"), name).then(|| t.elapsed().as_secs_f64())
        })
        .unwrap_or_else(|| panic!("{name} did not reconnect: {}", d.get("/v1/stats")))
    };
    let (b2, b1) = (back("vm2"), back("vm1"));
    println!(
        "after the SIGKILL and restart: vm2 (client role) reconnected in {b2:.2} s, vm1 (server \
         role, QEMU reconnects) in {b1:.2} s"
    );
    for (vm, want) in [
        ("vm1", json!({"weight": 1})),
        ("vm2", json!({"weight": 3, "max": "24Mbit"})),
    ] {
        let got = d.get(&format!("/v1/policies/{vm}"));
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&got[k], v, "{vm}'s policy after the restart: {got}");
        }
    }
    // The same TCP streams resume (segments lost at the kill retransmitted, after the
    // retransmission timer's backoff) under the restored policies.
    let flowing = poll(Duration::from_secs(20), || {
        let r = rx_rates(&d, &["vm1", "vm2"], 0.5);
        (r.iter().zip(&want).all(|(r, w)| *r > 0.5 * w * 1e6)).then(|| t.elapsed())
    });
    let flowing =
        flowing.unwrap_or_else(|| panic!("traffic did not resume: {}", d.get("/v1/stats")));
    println!(
        "both streams flowing again {:.2} s after the restart",
        flowing.as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));
    let resumed = mbit(&d);
    let (o1, rc1) = vm1.finish(&m1, Duration::from_secs(60));
    let (o2, rc2) = vm2.finish(&m2, Duration::from_secs(60));
    println!(
        "{secs} s transfers spanning the restart ({:.1} s):\nvm1 iperf3:\n{}\nvm2 iperf3:\n{}",
        t_start.elapsed().as_secs_f64(),
        iperf_summary(&o1),
        iperf_summary(&o2)
    );
    drop(servers);
    assert!(rc1 == 0 && rc2 == 0, "iperf3 failed:\n{o1}\n{o2}");
    check("after the restart, the same streams", &resumed);
    pings(&mut [(&mut vm1, &[&sink_ip]), (&mut vm2, &[&vm1_ip])]);
    // Real guests are well-behaved: none of the port's misbehaviour counters moved.
    let stats = d.get("/v1/stats");
    for vm in ["vm1", "vm2"] {
        let v = &port(&stats, vm)["vhost_user"];
        println!(
            "{vm}: vhost-user counters after the restart {}",
            v["counters"]
        );
        assert_eq!(v["last_error"], Value::Null, "{vm}: {v}");
        for c in MISBEHAVIOUR {
            assert_eq!(v["counters"][c], 0, "{vm}: {c} in {v}");
        }
    }
    println!("done {:.1} s into the test", t0.elapsed().as_secs_f64());
    drop(vm1);
    drop(vm2);
    drop(d);
}
