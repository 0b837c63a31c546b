//! Multiqueue TAPs (`TapPort::open_queues`, issue 21) on real TAPs, both ways of moving frames:
//! the port reads every queue the kernel spreads flows over, its readiness descriptor fires
//! for any of them, transmit queues of their own write to the guest's side, and what cannot be
//! opened is refused with a clear error. The far side is an `AF_PACKET` socket on the TAP
//! inside a namespace the test makes (root only; SKIP otherwise).

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use vqos_dataplane::frame::VNET_HDR_LEN;
use vqos_dataplane::{
    Batch, Port, PortError, PortStatus, TapIo, TapMode, TapPort, BATCH_FRAMES, MAX_TAP_QUEUES,
};
use vqos_testkit::frames::udp4;
use vqos_testkit::{Netns, PacketSocket};

const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x44, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x44, 0x02];

fn root() -> bool {
    vqos_testkit::root_or_skip(module_path!())
}

/// Flow `k`'s one frame: IPv4/UDP from source port 10000 + k (the kernel picks a TAP queue
/// by the flow's hash).
fn flow(k: u16) -> Vec<u8> {
    udp4(
        DST_MAC,
        SRC_MAC,
        Ipv4Addr::new(10, 44, 0, 1),
        Ipv4Addr::new(10, 44, 0, 2),
        (10_000 + k, 9),
        &k.to_be_bytes(),
    )
}

/// A TAP of `queues` queues moving frames by `io`, in a fresh namespace.
fn setup(io: TapIo, queues: u16, tag: &str) -> (TapPort, Netns, String) {
    let pid = std::process::id() % 100_000;
    let link = format!("vqmq{pid}{tag}");
    let ns = Netns::new(format!("vqmq{pid}{tag}")).without_ipv6();
    let tap = TapPort::open_queues(&link, TapMode::Create, io, queues).unwrap();
    vqos_testkit::sh(&["ip", "link", "set", &link, "netns", ns.name()]);
    vqos_testkit::sh(&["ip", "-n", ns.name(), "link", "set", &link, "up"]);
    assert_eq!((tap.io(), tap.queue_count()), (io, usize::from(queues)));
    (tap, ns, link)
}

/// Whether `fd` is readable now.
fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: p is live for the call; a zero timeout does not block.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
}

/// Every frame the TAP holds, read in calls of at most `per_call` frames; a call that comes
/// back short must have found every queue empty.
fn read_all(tap: &mut TapPort, per_call: usize) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut empty = 0;
    let mut batch = Batch::new();
    while empty < 3 {
        batch.clear();
        let n = tap.recv_batch(&mut batch, per_call).unwrap();
        if n < per_call {
            empty += 1;
            std::thread::yield_now();
        } else {
            empty = 0;
        }
        for i in 0..batch.len() {
            frames.push(batch.frame(i)[VNET_HDR_LEN..].to_vec());
        }
    }
    frames
}

#[test]
fn every_queue_is_read_and_the_readiness_descriptor_fires_for_any() {
    if !root() {
        return;
    }
    const FLOWS: u16 = 64;
    for (io, tag) in [(TapIo::Syscall, "r"), (TapIo::Uring, "R")] {
        let (mut tap, ns, link) = setup(io, 2, tag);
        let ready = tap.readiness_fd().unwrap();
        // Whatever the kernel put on the link as it came up.
        let early = read_all(&mut tap, BATCH_FRAMES);
        assert!(
            !readable(ready),
            "{io:?}: readable when drained ({} early)",
            early.len()
        );
        let sent: Vec<Vec<u8>> = (0..FLOWS).map(flow).collect();
        ns.run(|| {
            let sock = PacketSocket::bind(&link, 0);
            for f in &sent {
                sock.send(f);
            }
        });
        assert!(readable(ready), "{io:?}: frames wait, yet not readable");
        // Calls of 5 frames: most of them stop inside a queue, and the next starts elsewhere.
        let got = read_all(&mut tap, 5);
        assert!(!readable(ready), "{io:?}: drained, yet still readable");
        let mut ours: Vec<Vec<u8>> = got
            .into_iter()
            .filter(|f| f[6..12] == SRC_MAC && f[12..14] == [0x08, 0x00])
            .collect();
        ours.sort();
        let mut want = sent.clone();
        want.sort();
        assert_eq!(ours, want, "{io:?}: frames lost or invented");
        let Some(PortStatus::Tap(status)) = tap.status() else {
            panic!("{io:?}: a multiqueue TAP reports its queues");
        };
        println!("{io:?}: frames per queue {:?}", status.queue_rx_frames);
        // 64 flows all on one queue of two: 2^-63 (the kernel hashes each flow).
        assert!(
            status.queue_rx_frames.iter().all(|&n| n > 0),
            "{io:?}: a queue was never read: {:?}",
            status.queue_rx_frames
        );
        let c = tap.counters();
        assert_eq!(
            c.rx_frames,
            status.queue_rx_frames.iter().sum::<u64>(),
            "{io:?}"
        );
        assert_eq!(c.rx_errors, 0, "{io:?}");
    }
}

#[test]
fn transmit_queues_of_their_own_reach_the_guest_side() {
    if !root() {
        return;
    }
    for (io, queues, tag) in [
        (TapIo::Syscall, 3, "t"),
        (TapIo::Uring, 3, "T"),
        (TapIo::Syscall, 1, "s"),
    ] {
        let (tap, ns, link) = setup(io, queues, tag);
        let sock = ns.run(|| PacketSocket::bind(&link, libc::ETH_P_IP as u16));
        // Two transmit queues (on queues 1 and 2 of three; on the one queue of one) and the
        // port itself all write.
        let mut a = tap
            .tx_queue()
            .unwrap()
            .expect("a TAP hands out transmit queues");
        let mut b = tap.tx_queue().unwrap().unwrap();
        assert_eq!((a.name(), a.readiness_fd()), (link.as_str(), None));
        let mut tap = tap;
        let mut batch = Batch::new();
        for k in 0..BATCH_FRAMES as u16 {
            let mut f = vec![0u8; VNET_HDR_LEN];
            f.extend_from_slice(&flow(k));
            assert!(batch.push(&f));
        }
        let all: Vec<u8> = (0..BATCH_FRAMES as u8).collect();
        let (first, rest) = all.split_at(10);
        let (second, third) = rest.split_at(10);
        assert_eq!(a.send_batch(&batch, first).unwrap(), first.len());
        assert_eq!(b.send_batch(&batch, second).unwrap(), second.len());
        assert_eq!(tap.send_batch(&batch, third).unwrap(), third.len());
        let mut got = sock.receive(BATCH_FRAMES);
        got.sort();
        let mut want: Vec<Vec<u8>> = (0..BATCH_FRAMES as u16).map(flow).collect();
        want.sort();
        assert_eq!(
            got, want,
            "{io:?}, {queues} queues: frames lost or invented"
        );
        let tx = |p: &dyn Port| (p.counters().tx_frames, p.counters().tx_errors);
        assert_eq!(tx(a.as_ref()), (10, 0), "{io:?}");
        assert_eq!(tx(b.as_ref()), (10, 0), "{io:?}");
        assert_eq!(tx(&tap), (third.len() as u64, 0), "{io:?}");
        // A transmit queue is never read.
        let mut batch = Batch::new();
        assert_eq!(a.recv_batch(&mut batch, BATCH_FRAMES).unwrap(), 0);
    }
}

#[test]
fn what_cannot_be_opened_is_refused_clearly() {
    if !root() {
        return;
    }
    let pid = std::process::id() % 100_000;
    for q in [0, MAX_TAP_QUEUES + 1] {
        let name = format!("vqmq{pid}b");
        let e = TapPort::open_queues(&name, TapMode::Create, TapIo::Syscall, q).unwrap_err();
        assert!(
            matches!(&e, PortError::BadSetting { message, .. } if message.contains("1..=16")),
            "{e}"
        );
    }
    // A persistent single-queue TAP cannot be attached with several queues, nor the other
    // way round; the error says why, and the TAP is left as it was.
    /// Deletes the persistent TAP even if the test fails.
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", &self.0])
                .output();
        }
    }
    for (made, asked, says) in [(1, 2, "with one queue"), (2, 1, "multiqueue")] {
        let name = format!("vqmq{pid}p{made}");
        let _gone = Gone(name.clone());
        let first = TapPort::open_queues(&name, TapMode::Own, TapIo::Syscall, made).unwrap();
        drop(first);
        let e = TapPort::open_queues(&name, TapMode::Attach, TapIo::Syscall, asked).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, PortError::BadSetting { .. }) && text.contains(says),
            "{made} then {asked}: {text}"
        );
        // A process another test forks meanwhile may hold the closed descriptors for a
        // moment (until its exec): the interface is busy until then.
        let mut again = (0..200)
            .find_map(
                |_| match TapPort::open_queues(&name, TapMode::Own, TapIo::Syscall, made) {
                    Err(PortError::Io { source, .. })
                        if source.raw_os_error() == Some(libc::EBUSY) =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        None
                    }
                    other => Some(other.unwrap()),
                },
            )
            .expect("the TAP is free again within 2 s");
        again.release();
    }
}

/// A queue lent to another shard ([`Port::rx_queue`], the uplink read on every shard): the
/// borrower reads it and the port no longer does, 64 flows arrive once in all, both read
/// some, and queue 0 is never lent.
#[test]
fn a_lent_queue_is_read_by_its_borrower_alone() {
    if !root() {
        return;
    }
    let (mut tap, ns, link) = setup(TapIo::Syscall, 2, "l");
    let mut lent = tap.rx_queue().unwrap().expect("queue 1 lent");
    assert!(
        tap.rx_queue().unwrap().is_none(),
        "queue 0 stays the port's"
    );
    assert!(lent.readiness_fd().is_some());
    read_all(&mut tap, BATCH_FRAMES);
    let mut batch = Batch::new();
    while lent.recv_batch(&mut batch, BATCH_FRAMES).unwrap() > 0 {
        batch.clear();
    }
    let sent: Vec<Vec<u8>> = (0..64).map(flow).collect();
    ns.run(|| {
        let sock = PacketSocket::bind(&link, 0);
        for f in &sent {
            sock.send(f);
        }
    });
    let ours = |frames: Vec<Vec<u8>>| -> Vec<Vec<u8>> {
        frames
            .into_iter()
            .filter(|f| f[6..12] == SRC_MAC && f[12..14] == [0x08, 0x00])
            .collect()
    };
    let by_port = ours(read_all(&mut tap, BATCH_FRAMES));
    let mut by_lent = Vec::new();
    loop {
        batch.clear();
        if lent.recv_batch(&mut batch, BATCH_FRAMES).unwrap() == 0 {
            break;
        }
        by_lent.extend((0..batch.len()).map(|i| batch.frame(i)[VNET_HDR_LEN..].to_vec()));
    }
    let by_lent = ours(by_lent);
    assert!(
        !by_port.is_empty() && !by_lent.is_empty(),
        "{} / {}",
        by_port.len(),
        by_lent.len()
    );
    let mut all: Vec<Vec<u8>> = by_port.into_iter().chain(by_lent).collect();
    all.sort();
    let mut want = sent;
    want.sort();
    assert_eq!(all, want, "each frame once, by one reader");
}

/// Steps every shard at virtual times `from`, `from + 1`, … (`before(now)` first) until the
/// uplink's peer `u` has sent `want` frames or 50 rounds passed; the frames without their
/// virtio-net header, sorted. The kernel queues a TAP's frames at once; the short pauses
/// between rounds only let whatever arrives late be read, and never decide the outcome.
fn step_until_uplink_has(
    sh: &mut vqos_dataplane::Shards,
    u: &vqos_dataplane::MemPortPeer,
    from: u64,
    want: usize,
    mut before: impl FnMut(u64),
) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for now in from..from + 50 {
        before(now);
        for sw in sh.iter_mut() {
            sw.mark_all_ready(false);
            while sw.poll(now).did_work {}
        }
        got.extend(u.take_sent());
        if got.len() >= want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut got: Vec<Vec<u8>> = got
        .into_iter()
        .map(|f| f[VNET_HDR_LEN..].to_vec())
        .collect();
    got.sort();
    got
}

/// A multiqueue TAP vif on two shards (`threads = 2`, stepped in virtual time): its second
/// queue is lent to shard 1, so both shards read the 64 flows the guest's side sends; each
/// reaches the uplink once, and the port's counters and per-queue counts add up over both.
#[test]
fn a_multiqueue_vif_is_read_on_two_shards() {
    use vqos_dataplane::frame::mac_key;
    use vqos_dataplane::{MacPolicy, MemPort, PortSpec, Shards, SwitchConfig};
    if !root() {
        return;
    }
    let (tap, ns, link) = setup(TapIo::Syscall, 2, "s");
    let (up, u) = MemPort::pair("up", 1 << 16);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 2;
    cfg.storm_pps = 0;
    let mut sh = Shards::new(cfg, 0).unwrap();
    let spec =
        PortSpec::custom(Box::new(tap)).with_mac_policy(MacPolicy::Fixed(vec![mac_key(&SRC_MAC)]));
    sh.add_port(spec, vqos_sched::VifPolicy::default(), Some(0), 0)
        .unwrap();
    let sent: Vec<Vec<u8>> = (0..64).map(flow).collect();
    ns.run(|| {
        let sock = PacketSocket::bind(&link, 0);
        for f in &sent {
            sock.send(f);
        }
    });
    let got = step_until_uplink_has(&mut sh, &u, 1, 64, |_| {});
    let mut want = sent;
    want.sort();
    assert_eq!(got, want, "each flow's frame reached the uplink once");
    let s = sh.stats(100);
    let p = s.port(&link).unwrap();
    // The guest side's own frames (its kernel's) are refused as spoofed, and counted.
    let c = &p.counters;
    assert_eq!(
        (p.shard, c.rx_frames - c.drops.total()),
        (0, 64),
        "home 0, counted once"
    );
    let Some(PortStatus::Tap(t)) = &p.status else {
        panic!("no queue counts: {p:?}");
    };
    assert_eq!(t.queue_rx_frames.iter().sum::<u64>(), c.rx_frames, "{t:?}");
    assert!(
        t.queue_rx_frames.iter().all(|&n| n > 0),
        "both queues read, one per shard: {t:?}"
    );
    assert!(s.loops.iter().all(|l| l.burst_frames > 0), "{:?}", s.loops);
}

/// A TAP vif re-placed when its neighbour goes (`crate::rehome`, `threads = 2`, stepped in
/// virtual time), by both ways of moving frames: after the move shard 1 reads what the guest's
/// side sends, and shard 0, which read it, sends the uplink's frames to it through a transmit
/// handle of its own; every frame once.
#[test]
fn a_tap_vif_moved_to_another_shard_is_read_and_written_there() {
    use vqos_dataplane::frame::{build_frame, mac_key, VnetHdr};
    use vqos_dataplane::{MacPolicy, MemPort, PortSpec, Shards, SwitchConfig};
    if !root() {
        return;
    }
    for (io, tag) in [(TapIo::Syscall, "m"), (TapIo::Uring, "M")] {
        let (tap, ns, link) = setup(io, 1, tag);
        let sock = ns.run(|| PacketSocket::bind(&link, libc::ETH_P_IP as u16));
        let (up, u) = MemPort::pair("up", 1 << 16);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
        cfg.threads = 2;
        cfg.storm_pps = 0;
        let mut sh = Shards::new(cfg, 0).unwrap();
        let d = vqos_sched::VifPolicy::default;
        let mut mem = Vec::new();
        for name in ["a", "b"] {
            let (p, peer) = MemPort::pair(name, 1 << 16);
            sh.add_port(PortSpec::custom(Box::new(p)), d(), None, 0)
                .unwrap();
            mem.push(peer);
        }
        let spec = PortSpec::custom(Box::new(tap))
            .with_mac_policy(MacPolicy::Fixed(vec![mac_key(&SRC_MAC)]));
        sh.add_port(spec, d(), None, 0).unwrap();
        assert_eq!(sh.stats(0).port(&link).unwrap().shard, 0);
        sh.remove_port("b", 1).unwrap();
        assert_eq!(sh.stats(1).port(&link).unwrap().shard, 1, "{io:?}: moved");
        // The guest's side sends 64 flows; the uplink sends 32 frames to the guest.
        let sent: Vec<Vec<u8>> = (0..64).map(flow).collect();
        ns.run(|| {
            let out = PacketSocket::bind(&link, 0);
            for f in &sent {
                out.send(f);
            }
        });
        let to_guest: Vec<Vec<u8>> = (0..32u16)
            .map(|k| {
                let payload = [vec![0x45; 1], vec![0; 27], k.to_be_bytes().to_vec()].concat();
                build_frame(
                    VnetHdr::default(),
                    mac_key(&SRC_MAC),
                    0x02_00_00_00_44_09,
                    0x0800,
                    &payload,
                )
            })
            .collect();
        let got = step_until_uplink_has(&mut sh, &u, 2, 64, |now| {
            if now == 2 {
                to_guest.iter().for_each(|f| u.inject(f.clone()));
            }
        });
        let mut want = sent;
        want.sort();
        assert_eq!(
            got, want,
            "{io:?}: each flow's frame reached the uplink once"
        );
        let received = sock.receive(32);
        assert_eq!(
            received.len(),
            32,
            "{io:?}: the uplink's frames reached the guest's side"
        );
        let s = sh.stats(100);
        let p = s.port(&link).unwrap();
        assert_eq!(
            (p.counters.tx_frames, p.readers.clone()),
            (32, vec![1]),
            "{io:?}"
        );
        assert!(
            s.loops[1].burst_frames >= 64,
            "{io:?}: read by shard 1: {:?}",
            s.loops
        );
    }
}
