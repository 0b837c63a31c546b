//! The TAP port's two ways of moving frames (`TapIo::Syscall`, `TapIo::Uring`) on real TAPs:
//! the same frames, in the same order, with the same bytes and counters, both ways. The far
//! side is an `AF_PACKET` socket on the TAP inside a namespace the test makes (root only;
//! SKIP otherwise).

use vqos_dataplane::frame::{build_frame, VnetHdr, VNET_HDR_LEN};
use vqos_dataplane::{Batch, Port, TapIo, TapMode, TapPort, BATCH_FRAMES};
use vqos_testkit::{Netns, PacketSocket};

/// Local experimental EtherType: nothing in the namespace answers these frames.
const ETHERTYPE: u16 = 0x88b5;
const SRC: u64 = 0x02_00_00_00_33_33;

fn root() -> bool {
    vqos_testkit::root_or_skip(module_path!())
}

/// Frame `seq`'s Ethernet bytes: broadcast, a length that varies with `seq` (60..1514), the
/// sequence number in the first payload bytes.
fn eth(seq: u32) -> Vec<u8> {
    let len = 60 + (seq as usize * 97) % (1514 - 60);
    let mut payload = vec![(seq % 251) as u8; len - 14];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    build_frame(
        VnetHdr::default(),
        0xff_ff_ff_ff_ff_ff,
        SRC,
        ETHERTYPE,
        &payload,
    )[VNET_HDR_LEN..]
        .to_vec()
}

/// A TAP moving frames by `io`, in a fresh namespace.
fn setup(io: TapIo, tag: &str) -> (TapPort, Netns, String) {
    let pid = std::process::id() % 100_000;
    let link = format!("vqio{pid}{tag}");
    let ns = Netns::new(format!("vqio{pid}{tag}")).without_ipv6();
    let tap = TapPort::open_with(&link, TapMode::Create, io).unwrap();
    vqos_testkit::sh(&["ip", "link", "set", &link, "netns", ns.name()]);
    vqos_testkit::sh(&["ip", "-n", ns.name(), "link", "set", &link, "up"]);
    assert_eq!(tap.io(), io);
    (tap, ns, link)
}

/// Reads everything the TAP holds (stops after a few empty calls).
fn read_all(tap: &mut TapPort) -> (Vec<Vec<u8>>, usize) {
    let mut frames = Vec::new();
    let mut calls = 0;
    let mut empty = 0;
    let mut batch = Batch::new();
    while empty < 3 {
        batch.clear();
        let n = tap.recv_batch(&mut batch, BATCH_FRAMES).unwrap();
        calls += 1;
        if n == 0 {
            empty += 1;
            std::thread::yield_now();
        }
        for i in 0..batch.len() {
            frames.push(batch.frame(i)[VNET_HDR_LEN..].to_vec());
        }
    }
    (frames, calls)
}

#[test]
fn both_ways_receive_the_same_frames_in_order() {
    if !root() {
        return;
    }
    let sent: Vec<Vec<u8>> = (0..300).map(eth).collect();
    for (io, tag) in [(TapIo::Syscall, "r"), (TapIo::Uring, "R")] {
        let (mut tap, ns, link) = setup(io, tag);
        // 300 frames wait in the TAP's queue (500 deep) before the first read.
        ns.run(|| {
            let sock = PacketSocket::bind(&link, ETHERTYPE);
            for f in &sent {
                sock.send(f);
            }
        });
        let (all, _) = read_all(&mut tap);
        // The kernel may put a frame of its own on the link while the test runs (seen once on
        // a loaded machine: 301 frames); ours are told by source and EtherType.
        let (got, other): (Vec<_>, Vec<_>) = all.iter().partition(|f| {
            f[6..12] == SRC.to_be_bytes()[2..] && f[12..14] == ETHERTYPE.to_be_bytes()
        });
        if !other.is_empty() {
            println!(
                "{io:?}: {} frame(s) not the test's: {:02x?}",
                other.len(),
                &other[0][..other[0].len().min(40)]
            );
        }
        assert_eq!(got.len(), sent.len(), "{io:?}: frames lost or invented");
        for (k, (g, s)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(*g, s, "{io:?}: frame {k} differs (order or bytes)");
        }
        let c = tap.counters();
        let bytes: u64 = all.iter().map(|f| (f.len() + VNET_HDR_LEN) as u64).sum();
        assert_eq!(
            (c.rx_frames, c.rx_bytes, c.rx_errors),
            (all.len() as u64, bytes, 0),
            "{io:?}"
        );
    }
}

#[test]
fn both_ways_send_the_same_frames_in_order() {
    if !root() {
        return;
    }
    for (io, tag) in [(TapIo::Syscall, "t"), (TapIo::Uring, "T")] {
        let (mut tap, ns, link) = setup(io, tag);
        let sock = ns.run(|| PacketSocket::bind(&link, ETHERTYPE));
        let mut expected = Vec::new();
        for round in 0..4u32 {
            let mut batch = Batch::new();
            for k in 0..BATCH_FRAMES as u32 {
                let f = eth(round * 100 + k);
                let mut with_hdr = vec![0u8; VNET_HDR_LEN];
                with_hdr.extend_from_slice(&f);
                assert!(batch.push(&with_hdr));
                expected.push(f);
            }
            // Every frame, in an order that is not the batch's.
            let order: Vec<u8> = (0..BATCH_FRAMES as u8).rev().collect();
            let reordered: Vec<Vec<u8>> = order
                .iter()
                .map(|&i| batch.frame(usize::from(i))[VNET_HDR_LEN..].to_vec())
                .collect();
            let base = expected.len() - BATCH_FRAMES;
            expected.truncate(base);
            expected.extend(reordered);
            assert_eq!(tap.send_batch(&batch, &order).unwrap(), BATCH_FRAMES);
        }
        let got = sock.receive(expected.len());
        assert_eq!(got.len(), expected.len(), "{io:?}: frames lost or invented");
        for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{io:?}: frame {k} differs (order or bytes)");
        }
        let c = tap.counters();
        assert_eq!((c.tx_frames, c.tx_errors), (4 * BATCH_FRAMES as u64, 0));
    }
}

#[test]
fn both_ways_stop_at_the_first_refused_frame() {
    if !root() {
        return;
    }
    for (io, tag) in [(TapIo::Syscall, "x"), (TapIo::Uring, "X")] {
        let (mut tap, ns, link) = setup(io, tag);
        let sock = ns.run(|| PacketSocket::bind(&link, ETHERTYPE));
        let good = |seq| {
            let mut f = vec![0u8; VNET_HDR_LEN];
            f.extend_from_slice(&eth(seq));
            f
        };
        let mut bad = good(9);
        bad[1] = 3; // unknown GSO type: the kernel refuses the write
        let mut batch = Batch::new();
        assert!(batch.push(&good(1)) && batch.push(&good(2)) && batch.push(&bad));
        assert!(batch.push(&good(3)) && batch.push(&good(4)));
        assert_eq!(
            tap.send_batch(&batch, &[0, 1, 2, 3, 4]).unwrap(),
            2,
            "{io:?}"
        );
        let c = tap.counters();
        assert_eq!((c.tx_frames, c.tx_errors), (2, 3), "{io:?}");
        let got = sock.receive(4);
        assert_eq!(
            got,
            vec![eth(1), eth(2)],
            "{io:?}: frames after the refused one went out"
        );
    }
}
