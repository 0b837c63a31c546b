//! The AF_PACKET uplink ([`AfPacketPort`]) on a veth pair inside a namespace the test makes:
//! one port on each end, frames both ways with their order, bytes and counters, TCP
//! super-frames, the host's own frames left alone, refused frames ending a batch, promiscuous
//! mode for the socket's lifetime. Both header sizes: the 12-byte one (Linux ≥ 6.2) and the
//! legacy 10-byte one with split iovecs. Root only; SKIP otherwise.

use std::time::Duration;

use vqos_dataplane::frame::{
    build_frame, validate, VnetHdr, VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4, VNET_HDR_LEN,
};
use vqos_dataplane::{AfPacketOptions, AfPacketPort, Batch, Port, PortError, BATCH_FRAMES};
use vqos_testkit::{machine_lock, poll, Netns};

/// The two ends' own addresses.
const MAC_A: u64 = 0x02_00_00_aa_00_01;
const MAC_B: u64 = 0x02_00_00_bb_00_01;
/// A VM behind the switch (not an end's address: frames to it are `PACKET_OTHERHOST`).
const MAC_VM: u64 = 0x02_00_00_00_77_01;
/// Local experimental EtherType: nothing in the namespace answers these frames.
const ETHERTYPE: u16 = 0x88b5;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("SKIP: needs root");
    }
    root
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

fn send(port: &mut AfPacketPort, frames: &[Vec<u8>]) -> usize {
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
fn one_way(from: &mut AfPacketPort, to: &mut AfPacketPort, rounds: u32) {
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

fn both_ways(opts: AfPacketOptions, tag: &str, hdr_bytes: usize) {
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
