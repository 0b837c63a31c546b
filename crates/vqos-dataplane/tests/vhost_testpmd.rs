//! A real virtio driver on vhost-user ports: DPDK's `dpdk-testpmd` with two `virtio_user`
//! devices (DPDK's virtio PMD, the standard stand-in for a VM) pushes more than 10^6 frames
//! through two vhost-user ports of a switch, and every frame is accounted for: what testpmd
//! transmitted is what the ports read, what the switch read is what it wrote plus its named
//! drops, what the ports lost is their named drops.
//!
//! Needs root and `dpdk-testpmd` (Debian's `dpdk-dev`); prints `SKIP` and passes otherwise.
//! Takes the machine-wide real-traffic lock. No hugepages (`--no-huge -m 512`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vqos_dataplane::{
    MemPort, PortSpec, SwitchConfig, SwitchHandle, SwitchStats, VhostUserHandle, VhostUserPort,
};
use vqos_sched::VifPolicy;
use vqos_testkit::{machine_lock, poll, Proc};

/// Frames the test moves at least.
const MIN_FRAMES: u64 = 1_000_000;
/// testpmd's ring size (and the most frames one guest RX ring can hold).
const QUEUE_SIZE: u64 = 1024;

fn skip_reason() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root");
    }
    let found = Command::new("sh")
        .args(["-c", "command -v dpdk-testpmd"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!found).then_some("dpdk-testpmd not installed (apt-get install -y dpdk dpdk-dev)")
}

/// `RX-packets` and `TX-packets` of testpmd's "Accumulated forward statistics" block.
fn accumulated(out: &str) -> Option<(u64, u64)> {
    let block = &out[out.rfind("Accumulated forward statistics")?..];
    let value = |key: &str| -> Option<u64> {
        let at = block.find(key)? + key.len();
        block[at..].split_whitespace().next()?.parse().ok()
    };
    Some((value("RX-packets:")?, value("TX-packets:")?))
}

/// Frames the switch read from the two guests.
fn switch_rx(h: &[VhostUserHandle; 2]) -> u64 {
    h.iter().map(|h| h.status().rx_frames).sum()
}

#[test]
fn testpmd_pushes_a_million_frames_through_two_vhost_user_ports() {
    if let Some(why) = skip_reason() {
        println!("SKIP testpmd_pushes_a_million_frames_through_two_vhost_user_ports: {why}");
        return;
    }
    let _machine = machine_lock();
    let dir = tempfile::tempdir().unwrap();
    let sock = |n: u32| dir.path().join(format!("vm{n}.sock"));
    let (up, uplink) = MemPort::pair("up", 1_000);
    let sw = SwitchHandle::start(SwitchConfig::new(PortSpec::custom(Box::new(up)))).unwrap();
    let vm1 = VhostUserPort::server("vm1", sock(1)).unwrap();
    let vm2 = VhostUserPort::server("vm2", sock(2)).unwrap();
    let h = [vm1.handle(), vm2.handle()];
    sw.add_port(PortSpec::custom(Box::new(vm1)), VifPolicy::default())
        .unwrap();
    sw.add_port(PortSpec::custom(Box::new(vm2)), VifPolicy::default())
        .unwrap();

    // One testpmd, two virtio-user ports in `mac` forwarding: what port 0 receives it sends on
    // port 1 towards port 0's MAC and vice versa, so the frames `start tx_first` injects
    // circulate through the switch, learnt and unicast after the first ones. (flowgen would
    // be the generator of choice, but DPDK 22.11's writes fixed MAC addresses: every frame
    // would be flooded.)
    let prefix = format!("vqos-tp-{}", std::process::id());
    let vdev = |i: u32, path: &std::path::Path| {
        format!(
            "net_virtio_user{i},path={},queues=1,queue_size={QUEUE_SIZE},mac=02:00:00:00:00:a{}",
            path.display(),
            i + 1
        )
    };
    // Removes DPDK's runtime directory of this instance, also when the test fails.
    struct RuntimeDir(String);
    impl Drop for RuntimeDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _runtime = RuntimeDir(format!("/var/run/dpdk/{prefix}"));
    // Line-buffered stdout (stdbuf): the statistics printed by `stop` must arrive while
    // testpmd still runs.
    let mut child = Command::new("stdbuf")
        .args(["-oL", "dpdk-testpmd"])
        .args(["--lcores", "0@0,1@0", "--no-pci", "--no-huge", "-m", "512"])
        .args(["--file-prefix", &prefix, "--log-level", "lib.eal:error"])
        .args(["--vdev", &vdev(0, &sock(1)), "--vdev", &vdev(1, &sock(2))])
        .args(["--", "-i", "--forward-mode=mac", "--txpkts=64"])
        .args(["--total-num-mbufs=32768", "--nb-cores=1"])
        .args([
            "--eth-peer=0,02:00:00:00:00:a2",
            "--eth-peer=1,02:00:00:00:00:a1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dpdk-testpmd");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let testpmd = Proc::new(child);
    let out = Arc::new(Mutex::new(String::new()));
    let reader = {
        let out = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut o = out.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        })
    };
    let text = || out.lock().unwrap().clone();

    let up_both = poll(Duration::from_secs(60), || {
        h.iter()
            .all(|h| h.is_connected() && h.negotiated_features() != 0)
            .then_some(())
    });
    assert!(up_both.is_some(), "testpmd did not connect: {}", text());
    let t0 = Instant::now();
    // 16 bursts of 32 frames per port in flight: fewer than a ring holds.
    writeln!(stdin, "start tx_first 16").unwrap();
    let moved = poll(Duration::from_secs(180), || {
        (switch_rx(&h) >= MIN_FRAMES + MIN_FRAMES / 10).then_some(())
    });
    writeln!(stdin, "stop").unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert!(moved.is_some(), "too slow: {} frames", switch_rx(&h));
    let stats = poll(Duration::from_secs(30), || accumulated(&text()));
    let (tp_rx, tp_tx) = stats.unwrap_or_else(|| panic!("no stats from testpmd: {}", text()));

    // What testpmd put in its TX rings, the ports read (the switch drains the rings after
    // testpmd stopped forwarding; the sessions stay up until `quit`).
    let drained = poll(Duration::from_secs(30), || {
        (switch_rx(&h) == tp_tx).then_some(())
    });
    assert!(
        drained.is_some(),
        "testpmd sent {tp_tx}, the ports read {}",
        switch_rx(&h)
    );
    let s: Arc<SwitchStats> = poll(Duration::from_secs(5), || {
        let s = sw.stats();
        let rx: u64 = ["vm1", "vm2"]
            .iter()
            .map(|n| s.port(n).unwrap().rx_frames)
            .sum();
        (rx == tp_tx).then_some(s)
    })
    .expect("the switch's stats catch up");
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    testpmd.output_within(Duration::from_secs(30));
    let _ = reader.join();

    let ports = ["vm1", "vm2"].map(|n| s.port(n).unwrap().clone());
    let rx: u64 = ports.iter().map(|p| p.rx_frames).sum();
    let tx: u64 = ports.iter().map(|p| p.tx_frames).sum();
    let drops: u64 = ports.iter().map(|p| p.drops.total()).sum();
    let tx_error: u64 = ports
        .iter()
        .map(|p| p.drops[vqos_dataplane::DropReason::TxError])
        .sum();
    let c = h.clone().map(|h| h.counters());
    let named: u64 = c
        .iter()
        .map(|c| {
            c.guest_rx_no_buffers_frames
                + c.disconnected_frames
                + c.guest_offload_unsupported_frames
                + c.guest_rx_buffer_too_small_frames
        })
        .sum();
    let flooded = uplink.take_sent();
    println!(
        "testpmd tx {tp_tx} rx {tp_rx}; switch rx {rx} tx {tx} drops {drops} (port-level \
         {named}: {c:?}); {:.2} Mpps over {secs:.1} s; {} flooded to the uplink",
        rx as f64 / secs / 1e6,
        flooded.len()
    );

    assert!(rx >= MIN_FRAMES);
    // Every frame read went to the other guest's port, or (sent before the switch had learnt
    // the other guest's address: unknown unicast from a vif goes to the uplink only) to the
    // uplink, or was dropped by name.
    assert_eq!(rx, tx + flooded.len() as u64 + drops);
    // What the ports could not deliver, they counted by reason.
    assert_eq!(tx_error, named);
    // What the switch delivered, testpmd received, but for what sat in the two RX rings
    // when it stopped polling.
    assert!(
        tp_rx <= tx && tx - tp_rx <= 2 * QUEUE_SIZE,
        "{tp_rx} vs {tx}"
    );
    assert_eq!(
        c.iter().map(|c| c.malformed() + c.quarantines).sum::<u64>(),
        0
    );
}
