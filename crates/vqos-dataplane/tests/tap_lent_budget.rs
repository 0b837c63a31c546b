//! A multiqueue TAP uplink read by two shards (issue 21): the queue lent to shard 1 is read
//! within the read budget of the vif its arrivals are steered to, as the queues shard 0 keeps
//! are (`crate::tap_budget`). Real TAP, steering program and namespace; the switch stepped in
//! virtual time (root only; SKIP otherwise).

use vqos_dataplane::frame::{build_frame, VnetHdr, VNET_HDR_LEN};
use vqos_dataplane::{
    DownlinkConfig, MacPolicy, MemPort, MemPortPeer, PortSpec, PortStatus, Shards, SwitchConfig,
    TapIo, TapMode, TapPort,
};
use vqos_sched::VifPolicy;
use vqos_testkit::{Netns, PacketSocket};

const SEC: u64 = 1_000_000_000;

fn root() -> bool {
    vqos_testkit::root_or_skip(module_path!())
}

/// Polls every shard at virtual time `now` until none has work left.
fn step(sh: &mut Shards, now: u64) {
    for sw in sh.iter_mut() {
        sw.mark_all_ready(false);
        while sw.poll(now).did_work {}
    }
}

/// Frames read from each of the uplink's queues, over both shards, and its budget holds.
fn uplink_reads(sh: &mut Shards, link: &str, now: u64) -> (Vec<u64>, u64) {
    let s = sh.stats(now);
    match &s.port(link).expect("the uplink's stats").status {
        Some(PortStatus::Tap(t)) => (t.queue_rx_frames.clone(), t.budget_holds),
        other => panic!("no queue counts: {other:?}"),
    }
}

/// Steps until queue `q` of the uplink has read `want` frames or 100 rounds passed at `now`
/// (the kernel queues the frames at once; the pauses only let late ones arrive).
fn read_until(sh: &mut Shards, link: &str, now: u64, q: usize, want: u64) -> u64 {
    for _ in 0..100 {
        step(sh, now);
        let got = uplink_reads(sh, link, now).0[q];
        if got >= want {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    uplink_reads(sh, link, now).0[q]
}

/// Vif `c` in slot 3, capped at 10 Mbit/s inbound: its arrivals are steered to queue 3, the
/// queue lent to shard 1. 300 frames of 1514 bytes for it: shard 1 reads its budget (a
/// 256 KiB burst) and one frame past it, holds the queue, reads on once the budget is earned
/// back, and everything by the end. Without a budget on the lent queue it read all 300 at
/// once and never held it.
#[test]
fn a_lent_uplink_queue_is_read_within_its_vifs_budget_by_its_borrower() {
    if !root() {
        return;
    }
    let pid = std::process::id() % 100_000;
    let link = format!("vqlb{pid}");
    let ns = Netns::new(format!("vqlb{pid}")).without_ipv6();
    let tap = TapPort::open_queues(&link, TapMode::Create, TapIo::Syscall, 4).unwrap();
    vqos_testkit::sh(&["ip", "link", "set", &link, "netns", ns.name()]);
    vqos_testkit::sh(&["ip", "-n", ns.name(), "link", "set", &link, "up"]);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(tap)));
    cfg.threads = 2;
    cfg.storm_pps = 0;
    cfg.downlink = Some(DownlinkConfig::default());
    let mut sh = Shards::new(cfg, 0).unwrap();
    assert_eq!(sh.iter_mut().count(), 2);
    let macs = [
        0x02_00_00_00_45_01u64,
        0x02_00_00_00_45_02,
        0x02_00_00_00_45_03,
    ];
    let mut peers: Vec<MemPortPeer> = Vec::new();
    for (i, (name, mac)) in ["a", "b", "c"].iter().zip(macs).enumerate() {
        let (p, peer) = MemPort::pair(name, 1 << 16);
        let policy = VifPolicy {
            max_in_bps: (i == 2).then_some(10_000_000),
            ..VifPolicy::default()
        };
        let spec = PortSpec::custom(Box::new(p)).with_mac_policy(MacPolicy::Fixed(vec![mac]));
        sh.add_port(spec, policy, None, 0).unwrap();
        peers.push(peer);
    }
    // Shard 0 steers the uplink by the MAC table once a second.
    step(&mut sh, SEC);
    let frame = build_frame(
        VnetHdr::default(),
        macs[2],
        0x02_00_00_00_45_99,
        0x0800,
        &[7; 1500],
    );
    ns.run(|| {
        let sock = PacketSocket::bind(&link, 0);
        for _ in 0..300 {
            sock.send(&frame[VNET_HDR_LEN..]);
        }
    });
    let burst = (256 * 1024 / (1514 + VNET_HDR_LEN)) as u64;
    let got = read_until(&mut sh, &link, SEC, 3, burst + 1);
    // A few more rounds at the same time: nothing more is read, the queue is held.
    for _ in 0..5 {
        step(&mut sh, SEC);
    }
    let (queues, holds) = uplink_reads(&mut sh, &link, SEC);
    assert_eq!(
        (got, queues[3], holds),
        (burst + 1, burst + 1, 1),
        "read to the budget and one frame past it, then held: {queues:?}"
    );
    assert_eq!(queues[..3], [0, 0, 0], "steered to the lent queue alone");
    // A second later the budget is whole again: the rest is read.
    let got = read_until(&mut sh, &link, 2 * SEC, 3, 300);
    assert_eq!(got, 300, "everything read once the budget was earned back");
    let delivered: usize = peers.iter().map(|p| p.take_sent().len()).sum();
    assert!(delivered > 0, "the frames go on to the vif");
}
