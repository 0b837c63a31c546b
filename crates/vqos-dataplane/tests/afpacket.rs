//! The AF_PACKET uplink ([`AfPacketPort`]) on a veth pair inside a namespace the test makes:
//! one port on each end, frames both ways with their order, bytes and counters, TCP
//! super-frames, the host's own frames left alone, refused frames ending a batch, promiscuous
//! mode for the socket's lifetime. Both header sizes: the 12-byte one (Linux ≥ 6.2) and the
//! legacy 10-byte one with split iovecs. Root only; SKIP otherwise.

use std::time::Duration;

use vqos_dataplane::frame::{
    build_frame, validate, VnetHdr, VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4, VNET_HDR_LEN,
};
use vqos_dataplane::{
    AfPacketOptions, AfPacketPort, Batch, DownlinkConfig, MemPort, Port, PortError, PortSpec,
    PortStatus, Shards, SwitchConfig, BATCH_FRAMES,
};
use vqos_sched::VifPolicy;
use vqos_testkit::{machine_lock, poll, Netns};

/// The two ends' own addresses.
const MAC_A: u64 = 0x02_00_00_aa_00_01;
const MAC_B: u64 = 0x02_00_00_bb_00_01;
/// A VM behind the switch (not an end's address: frames to it are `PACKET_OTHERHOST`).
const MAC_VM: u64 = 0x02_00_00_00_77_01;
/// Local experimental EtherType: nothing in the namespace answers these frames.
const ETHERTYPE: u16 = 0x88b5;

fn root() -> bool {
    vqos_testkit::root_or_skip(module_path!())
}

fn mac_str(m: u64) -> String {
    let o = m.to_be_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        o[2], o[3], o[4], o[5], o[6], o[7]
    )
}

/// A namespace with a veth pair `ea` (MAC_A) – `eb` (MAC_B), IPv6 off (no solicitations), and
/// an [`AfPacketPort`] on each end.
struct Pair {
    a: AfPacketPort,
    b: AfPacketPort,
    ns: Netns,
}

fn pair(tag: &str, opts: AfPacketOptions) -> Pair {
    let ns = Netns::new(format!("vqa{}{tag}", std::process::id() % 100_000)).without_ipv6();
    let ip = |args: &[&str]| {
        let mut all = vec!["ip", "-n", ns.name()];
        all.extend_from_slice(args);
        vqos_testkit::sh(&all);
    };
    ip(&[
        "link", "add", "name", "ea", "type", "veth", "peer", "name", "eb",
    ]);
    ip(&["link", "set", "dev", "ea", "address", &mac_str(MAC_A)]);
    ip(&["link", "set", "dev", "eb", "address", &mac_str(MAC_B)]);
    let (a, b) = ns.run(|| {
        (
            AfPacketPort::open_with("ea", opts).unwrap(),
            AfPacketPort::open_with("eb", opts).unwrap(),
        )
    });
    Pair { a, b, ns }
}

/// Frame `seq`: to `dst`, a length that varies with `seq` (60..1514 Ethernet bytes), the
/// sequence number in the first payload bytes.
fn frame(dst: u64, seq: u32) -> Vec<u8> {
    let len = 60 + (seq as usize * 97) % (1514 - 60);
    let mut payload = vec![(seq % 251) as u8; len - 14];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    build_frame(VnetHdr::default(), dst, MAC_VM, ETHERTYPE, &payload)
}

/// Reads from `port` until `n` frames came (5 s at most); their bytes.
fn read_n(port: &mut AfPacketPort, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut batch = Batch::new();
    poll(Duration::from_secs(5), || {
        batch.clear();
        port.recv_batch(&mut batch, BATCH_FRAMES).unwrap();
        got.extend((0..batch.len()).map(|i| batch.frame(i).to_vec()));
        (got.len() >= n).then_some(())
    });
    got
}

fn send(port: &mut dyn Port, frames: &[Vec<u8>]) -> usize {
    let mut batch = Batch::new();
    for f in frames {
        assert!(batch.push(f));
    }
    let idx: Vec<u8> = (0..frames.len() as u8).collect();
    port.send_batch(&batch, &idx).unwrap()
}

/// `rounds` batches of 32 from `from` to `to`: every frame arrives once, in order, byte for
/// byte (header: the kernel reports no offload for these frames, all zero), the counters
/// match, and the sender never reads its own frames back.
fn one_way(from: &mut dyn Port, to: &mut AfPacketPort, rounds: u32) {
    let mut want = Vec::new();
    for r in 0..rounds {
        let frames: Vec<Vec<u8>> = (0..BATCH_FRAMES as u32)
            .map(|i| {
                frame(
                    if i % 5 == 0 { u64::MAX >> 16 } else { MAC_VM },
                    r * 100 + i,
                )
            })
            .collect();
        assert_eq!(send(from, &frames), frames.len());
        want.extend(frames);
    }
    let got = read_n(to, want.len());
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "frame {i} differs");
        assert!(validate(g).is_ok());
    }
    let bytes: u64 = want.iter().map(|f| f.len() as u64).sum();
    let (tc, rc) = (from.counters(), to.counters());
    assert_eq!(
        (tc.tx_frames, tc.tx_bytes, tc.tx_errors),
        (want.len() as u64, bytes, 0)
    );
    assert_eq!(
        (rc.rx_frames, rc.rx_bytes, rc.rx_errors),
        (want.len() as u64, bytes, 0)
    );
    let mut batch = Batch::new();
    assert_eq!(
        from.recv_batch(&mut batch, BATCH_FRAMES).unwrap(),
        0,
        "read back"
    );
}

fn both_ways(opts: AfPacketOptions, tag: &str, hdr_bytes: u64) {
    let _lock = machine_lock();
    let Pair {
        mut a,
        mut b,
        ns: _ns,
    } = pair(tag, opts);
    assert_eq!(a.af_status().vnet_hdr_bytes, hdr_bytes);
    one_way(&mut a, &mut b, 4);
    one_way(&mut b, &mut a, 4);
}

#[test]
fn frames_cross_a_veth_pair_both_ways_in_order_byte_for_byte() {
    if !root() {
        return;
    }
    both_ways(AfPacketOptions::default(), "x", 12);
}

#[test]
fn the_legacy_10_byte_header_gives_the_same_frames() {
    if !root() {
        return;
    }
    both_ways(
        AfPacketOptions {
            legacy_vnet_hdr: true,
            ..Default::default()
        },
        "l",
        10,
    );
}

/// A shard's transmit queue ([`Port::tx_queue`]), made from a thread outside the port's
/// namespace: it sends there (frames and super-frames, both header sizes), has no readiness,
/// reads nothing, and its reader reads none of what it sent.
#[test]
fn a_transmit_queue_made_outside_the_namespace_sends_there_and_reads_nothing() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let legacy = AfPacketOptions {
        legacy_vnet_hdr: true,
        ..Default::default()
    };
    for (opts, tag, hdr_bytes) in [(AfPacketOptions::default(), "q", 12), (legacy, "r", 10)] {
        let Pair {
            mut a,
            mut b,
            ns: _ns,
        } = pair(tag, opts);
        let mut q = a.tx_queue().unwrap().expect("a transmit queue");
        assert_eq!(q.readiness_fd(), None);
        let Some(PortStatus::AfPacket(status)) = q.status() else {
            panic!("no AF_PACKET status");
        };
        assert_eq!(status.vnet_hdr_bytes, hdr_bytes);
        one_way(&mut *q, &mut b, 4);
        super_frame(&mut *q, &mut b);
        let mut batch = Batch::new();
        assert_eq!(a.recv_batch(&mut batch, BATCH_FRAMES).unwrap(), 0);
    }
}

/// A TCP/IPv4 super-frame to MAC_VM: 20-byte IPv4 and TCP headers, `data` payload bytes, cut
/// into segments of `gso_size` (partial checksum: the pseudo-header sum in the TCP header).
fn tso_frame(gso_size: u16, data: usize) -> Vec<u8> {
    let total = (20 + 20 + data) as u16;
    let mut p = vec![0u8; 40 + data];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[10, 9, 0, 1]);
    p[16..20].copy_from_slice(&[10, 9, 0, 2]);
    let sum16 = |b: &[u8]| -> u32 {
        b.chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum()
    };
    let fold = |mut s: u32| -> u16 {
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    };
    let c = !fold(sum16(&p[..20]));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p[20..22].copy_from_slice(&40000u16.to_be_bytes());
    p[22..24].copy_from_slice(&5201u16.to_be_bytes());
    p[24..28].copy_from_slice(&1u32.to_be_bytes());
    p[32] = 5 << 4;
    p[33] = 0x10; // ACK
    p[34..36].copy_from_slice(&0xffffu16.to_be_bytes());
    for (i, b) in p[40..].iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    // Pseudo-header: addresses, protocol, TCP length.
    let pseudo = sum16(&p[12..20]) + 6 + u32::from(total - 20);
    p[36..38].copy_from_slice(&fold(pseudo).to_be_bytes());
    let hdr = VnetHdr {
        flags: VNET_F_NEEDS_CSUM,
        gso_type: VNET_GSO_TCPV4,
        hdr_len: 54,
        gso_size,
        csum_start: 34,
        csum_offset: 16,
    };
    build_frame(hdr, MAC_VM, MAC_A, 0x0800, &p)
}

/// A TCP super-frame (GSO) crosses the veth whole: one frame of 20 kB with its header (the
/// kernel's `hdr_len` is its own: the linear part of the buffer it built).
#[test]
fn tcp_super_frames_cross_whole_with_their_header() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let Pair {
        mut a,
        mut b,
        ns: _ns,
    } = pair("g", AfPacketOptions::default());
    super_frame(&mut a, &mut b);
    super_frame(&mut b, &mut a);
}

/// One TCP super-frame from `from` arrives whole at `to`.
fn super_frame(from: &mut dyn Port, to: &mut AfPacketPort) {
    let f = tso_frame(1448, 20_000);
    let sent = VnetHdr::parse(&f);
    assert_eq!(send(from, std::slice::from_ref(&f)), 1);
    let got = read_n(to, 1);
    assert_eq!(got.len(), 1, "one super-frame, not segments");
    let (g, h) = (&got[0], VnetHdr::parse(&got[0]));
    println!("sent {sent:?}, received {h:?}");
    assert_eq!(g[VNET_HDR_LEN..], f[VNET_HDR_LEN..]);
    assert_eq!(
        (h.flags, h.gso_type, h.gso_size, h.csum_start, h.csum_offset),
        (
            sent.flags,
            sent.gso_type,
            sent.gso_size,
            sent.csum_start,
            sent.csum_offset
        )
    );
    assert!(validate(g).is_ok());
}

/// Frames to the interface's own address are the host's: not read (counted); frames the
/// interface sends for the host are not read either.
#[test]
fn the_hosts_own_frames_are_left_to_the_host() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let Pair { mut a, mut b, ns } = pair("h", AfPacketOptions::default());
    // To eb's own MAC (the host's on that end), then one to a VM behind it.
    assert_eq!(send(&mut a, &[frame(MAC_B, 1), frame(MAC_VM, 2)]), 2);
    let got = read_n(&mut b, 1);
    assert_eq!(got, vec![frame(MAC_VM, 2)]);
    assert_eq!(b.af_status().skipped_host, 1);
    // The host's own transmissions on eb (an ARP request from its stack) are not read by eb's
    // port; they reach ea's.
    ns.run(|| {
        let _ = std::process::Command::new("ip")
            .args(["addr", "add", "10.9.0.1/24", "dev", "eb"])
            .status();
        let _ = std::process::Command::new("ping")
            .args(["-c", "1", "-W", "1", "10.9.0.2"])
            .output();
    });
    let seen_by_a = read_n(&mut a, 1);
    assert!(!seen_by_a.is_empty(), "the host's ARP request reached ea");
    let mut batch = Batch::new();
    assert_eq!(b.recv_batch(&mut batch, BATCH_FRAMES).unwrap(), 0);
    assert_eq!(b.counters().rx_frames, 1);
}

/// A frame the kernel refuses (longer than the MTU without GSO; an unknown GSO type) ends the
/// batch: the frames before it went out, it and the rest are `tx_errors`.
#[test]
fn a_refused_frame_ends_the_batch() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let Pair {
        mut a,
        mut b,
        ns: _ns,
    } = pair("r", AfPacketOptions::default());
    let too_long = build_frame(VnetHdr::default(), MAC_VM, MAC_A, ETHERTYPE, &[7; 1600]);
    let bad_gso = {
        let mut f = frame(MAC_VM, 9);
        f[1] = 3; // unknown GSO type
        f
    };
    let frames = [frame(MAC_VM, 1), too_long, frame(MAC_VM, 2), bad_gso];
    assert_eq!(send(&mut a, &frames[..3]), 1);
    let c = a.counters();
    assert_eq!(
        (c.tx_frames, c.tx_bytes, c.tx_errors),
        (1, frames[0].len() as u64, 2)
    );
    assert_eq!(send(&mut a, &[frames[2].clone(), frames[3].clone()]), 1);
    assert_eq!(a.counters().tx_errors, 3);
    assert_eq!(
        read_n(&mut b, 2),
        vec![frames[0].clone(), frames[2].clone()]
    );
}

/// The interface is promiscuous while a port holds it, and not after.
#[test]
fn promiscuous_while_attached() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let Pair { a, b, ns } = pair("p", AfPacketOptions::default());
    let promiscuity = |dev: &str| -> String {
        let out = std::process::Command::new("ip")
            .args(["-d", "-n", ns.name(), "link", "show", dev])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = text.find("promiscuity ").expect("ip -d shows promiscuity");
        text[at..].split_whitespace().nth(1).unwrap().to_string()
    };
    assert_eq!(promiscuity("ea"), "1");
    drop(a);
    assert_eq!(promiscuity("ea"), "0");
    assert_eq!(promiscuity("eb"), "1");
    drop(b);
}

#[test]
fn a_missing_or_bad_interface_is_a_clear_error() {
    assert!(matches!(
        AfPacketPort::open("vqa-no-such0"),
        Err(PortError::Missing(_))
    ));
    for bad in ["", "sixteen-bytes-xx", "nul\0byte"] {
        assert!(
            matches!(AfPacketPort::open(bad), Err(PortError::BadName(_))),
            "{bad:?}"
        );
    }
}

/// A UDP/IPv4 frame of flow `flow` (its source port) to MAC_VM, `seq` in the payload.
fn udp_frame(flow: u16, seq: u32) -> Vec<u8> {
    udp_frame_to(MAC_VM, flow, seq)
}

/// A UDP/IPv4 frame of flow `flow` (its source port) to `dst`, `seq` in the payload.
fn udp_frame_to(dst: u64, flow: u16, seq: u32) -> Vec<u8> {
    let mut p = vec![0u8; 28 + 8];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&36u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[10, 9, 0, 1]);
    p[16..20].copy_from_slice(&[10, 9, 0, 2]);
    p[20..22].copy_from_slice(&(10_000 + flow).to_be_bytes());
    p[22..24].copy_from_slice(&5_001u16.to_be_bytes());
    p[24..26].copy_from_slice(&16u16.to_be_bytes());
    p[28..32].copy_from_slice(&u32::from(flow).to_be_bytes());
    p[32..36].copy_from_slice(&seq.to_be_bytes());
    build_frame(VnetHdr::default(), dst, MAC_B, 0x0800, &p)
}

/// Receive queues ([`Port::rx_queue`], `PACKET_FANOUT`), the second made from a thread
/// outside the port's namespace: 64 UDP flows of 8 frames each from the other end are each
/// read once, every flow by one reader and in order, both readers read some, and the status
/// counts one reader per socket.
#[test]
fn receive_queues_spread_flows_over_readers_each_frame_once_in_order() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let Pair {
        mut a,
        mut b,
        ns: _ns,
    } = pair("f", AfPacketOptions::default());
    let mut q = a.rx_queue().unwrap().expect("a receive queue");
    assert!(q.readiness_fd().is_some(), "a reader has readiness");
    let Some(PortStatus::AfPacket(st)) = q.status() else {
        panic!("no AF_PACKET status");
    };
    assert_eq!(st.readers, 1);
    let (flows, per_flow) = (64u16, 8u32);
    for seq in 0..per_flow {
        let frames: Vec<Vec<u8>> = (0..flows).map(|f| udp_frame(f, seq)).collect();
        for chunk in frames.chunks(BATCH_FRAMES) {
            assert_eq!(send(&mut b, chunk), chunk.len());
        }
    }
    let want = usize::from(flows) * per_flow as usize;
    // (reader, flow, seq) of every frame read, in the order each reader read them.
    let mut got: Vec<(usize, u16, u32)> = Vec::new();
    let mut batch = Batch::new();
    poll(Duration::from_secs(5), || {
        for (r, port) in [&mut a as &mut dyn Port, &mut *q].into_iter().enumerate() {
            batch.clear();
            port.recv_batch(&mut batch, BATCH_FRAMES).unwrap();
            for i in 0..batch.len() {
                let f = &batch.frame(i)[VNET_HDR_LEN + 14 + 28..];
                let flow = u32::from_be_bytes(f[..4].try_into().unwrap()) as u16;
                got.push((r, flow, u32::from_be_bytes(f[4..8].try_into().unwrap())));
            }
        }
        (got.len() >= want).then_some(())
    });
    assert_eq!(got.len(), want, "each frame read once");
    for flow in 0..flows {
        let mine: Vec<&(usize, u16, u32)> = got.iter().filter(|g| g.1 == flow).collect();
        let seqs: Vec<u32> = mine.iter().map(|g| g.2).collect();
        assert_eq!(
            seqs,
            (0..per_flow).collect::<Vec<_>>(),
            "flow {flow}: in order, once"
        );
        assert!(
            mine.iter().all(|g| g.0 == mine[0].0),
            "flow {flow}: one reader"
        );
    }
    let by_q = got.iter().filter(|g| g.0 == 1).count();
    assert!(
        by_q > 0 && by_q < want,
        "both readers read: {by_q} of {want}"
    );
}

/// The uplink read by two shards ([`Shards`], `threads = 2`, the scheduled downlink): vif
/// `va` read by shard 0 and `vc` by shard 1, 64 UDP flows of 8 frames each from the other
/// end of the veth to each vif. Both shards read the uplink (one socket each, joined by
/// fanout), every frame reaches its vif once and every flow in order, and the merged status
/// counts two readers.
#[test]
fn the_uplink_is_read_by_every_shard_and_each_frame_arrives_once() {
    if !root() {
        return;
    }
    let _lock = machine_lock();
    let Pair { a, mut b, ns: _ns } = pair("s", AfPacketOptions::default());
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(a)));
    cfg.threads = 2;
    cfg.storm_pps = 0;
    cfg.downlink = Some(DownlinkConfig::default());
    let mut sh = Shards::new(cfg, 0).unwrap();
    let vms = [0x02_00_00_00_77_0a_u64, 0x02_00_00_00_77_0c];
    let mut peers = Vec::new();
    for (home, (name, mac)) in ["va", "vc"].iter().zip(vms).enumerate() {
        let (p, peer) = MemPort::pair(name, 1 << 16);
        sh.add_port(
            PortSpec::custom(Box::new(p)),
            VifPolicy::default(),
            Some(home),
            0,
        )
        .unwrap();
        // Its MAC is learnt (frames to it are unicast).
        peer.inject(build_frame(
            VnetHdr::default(),
            MAC_B,
            mac,
            ETHERTYPE,
            &[0; 46],
        ));
        peers.push(peer);
    }
    let t0 = std::time::Instant::now();
    let now = || t0.elapsed().as_nanos() as u64;
    run_all(&mut sh, now());
    peers.iter().for_each(|p| drop(p.take_sent()));
    let (flows, per_flow) = (64u16, 8u32);
    for seq in 0..per_flow {
        for &vm in &vms {
            let frames: Vec<Vec<u8>> = (0..flows).map(|f| udp_frame_to(vm, f, seq)).collect();
            for chunk in frames.chunks(BATCH_FRAMES) {
                assert_eq!(send(&mut b, chunk), chunk.len());
            }
        }
    }
    let want = usize::from(flows) * per_flow as usize;
    let mut got: Vec<Vec<(u16, u32)>> = vec![Vec::new(); 2];
    poll(Duration::from_secs(5), || {
        run_all(&mut sh, now());
        for (g, peer) in got.iter_mut().zip(&peers) {
            for f in peer.take_sent() {
                let p = &f[VNET_HDR_LEN + 14 + 28..];
                let flow = u32::from_be_bytes(p[..4].try_into().unwrap()) as u16;
                g.push((flow, u32::from_be_bytes(p[4..8].try_into().unwrap())));
            }
        }
        (got.iter().all(|g| g.len() >= want)).then_some(())
    });
    for (vm, g) in got.iter().enumerate() {
        assert_eq!(g.len(), want, "vif {vm}: each frame once");
        for flow in 0..flows {
            let seqs: Vec<u32> = g.iter().filter(|x| x.0 == flow).map(|x| x.1).collect();
            assert_eq!(
                seqs,
                (0..per_flow).collect::<Vec<_>>(),
                "vif {vm} flow {flow}"
            );
        }
    }
    let t = now();
    let read: Vec<u64> = sh
        .iter_mut()
        .map(|sw| sw.stats(t).port("ea").unwrap().counters.rx_frames)
        .collect();
    assert!(
        read.iter().all(|&n| n > 0),
        "both shards read the uplink: {read:?}"
    );
    let s = sh.stats(t);
    let Some(PortStatus::AfPacket(st)) = &s.port("ea").unwrap().status else {
        panic!("no AF_PACKET status");
    };
    assert_eq!(st.readers, 2);
}

/// Polls every shard until none has work left (real time `now`).
fn run_all(sh: &mut Shards, now: u64) {
    for _ in 0..1000 {
        let mut work = false;
        for sw in sh.iter_mut() {
            sw.mark_all_ready(false);
            work |= sw.poll(now).did_work;
        }
        if !work {
            return;
        }
    }
}
