//! The TAP port's two ways of moving frames (`TapIo::Syscall`, `TapIo::Uring`) on real TAPs:
//! the same frames, in the same order, with the same bytes and counters, both ways. The far
//! side is an `AF_PACKET` socket on the TAP inside a namespace the test makes (root only;
//! SKIP otherwise).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use vqos_dataplane::frame::{build_frame, VnetHdr, VNET_HDR_LEN};
use vqos_dataplane::{Batch, Port, TapIo, TapMode, TapPort, BATCH_FRAMES};
use vqos_testkit::Netns;

/// Local experimental EtherType: nothing in the namespace answers these frames.
const ETHERTYPE: u16 = 0x88b5;
const SRC: u64 = 0x02_00_00_00_33_33;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("SKIP: needs root");
    }
    root
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

/// A raw socket on `link` (call inside the link's namespace).
fn packet_socket(link: &str) -> (OwnedFd, i32) {
    // SAFETY: socket() has no memory arguments; checked below.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            i32::from((ETHERTYPE).to_be()),
        )
    };
    assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(link).unwrap();
    // SAFETY: name is NUL-terminated.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    assert!(ifindex > 0, "no link {link} here");
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = ETHERTYPE.to_be();
    addr.sll_ifindex = ifindex;
    // SAFETY: addr is live and sized for the call.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    (fd, ifindex)
}

/// Sends `frame` out of the link the socket is bound to (into the TAP's queue).
fn send(fd: &OwnedFd, ifindex: i32, frame: &[u8]) {
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: frame and addr are live for the call; sizes are theirs.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        frame.len() as isize,
        "sendto: {}",
        std::io::Error::last_os_error()
    );
}

/// The frames the socket receives, in order (incoming ones only), until `want` came or no
/// more come for a second (the kernel hands written frames on in softirq context).
fn receive(fd: &OwnedFd, want: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut last = std::time::Instant::now();
    while out.len() < want && last.elapsed() < std::time::Duration::from_secs(1) {
        let more = drain(fd);
        if more.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        } else {
            last = std::time::Instant::now();
        }
        out.extend(more);
    }
    // Anything beyond `want` is a failure the caller sees.
    out.extend(drain(fd));
    out
}

/// Every frame waiting on the socket now, in order (incoming ones only).
fn drain(fd: &OwnedFd) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    loop {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: buf and from are live and sized for the call.
        let r = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut from_len,
            )
        };
        if r < 0 {
            return out;
        }
        if from.sll_pkttype != libc::PACKET_OUTGOING {
            out.push(buf[..r as usize].to_vec());
        }
    }
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
            let (fd, ifindex) = packet_socket(&link);
            for f in &sent {
                send(&fd, ifindex, f);
            }
        });
        let (got, _) = read_all(&mut tap);
        assert_eq!(got.len(), sent.len(), "{io:?}: frames lost or invented");
        for (k, (g, s)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(g, s, "{io:?}: frame {k} differs (order or bytes)");
        }
        let c = tap.counters();
        let bytes: u64 = sent.iter().map(|f| (f.len() + VNET_HDR_LEN) as u64).sum();
        assert_eq!(
            (c.rx_frames, c.rx_bytes, c.rx_errors),
            (300, bytes, 0),
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
        let (sock, _) = ns.run(|| packet_socket(&link));
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
        let got = receive(&sock, expected.len());
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
        let (sock, _) = ns.run(|| packet_socket(&link));
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
        let got = receive(&sock, 4);
        assert_eq!(
            got,
            vec![eth(1), eth(2)],
            "{io:?}: frames after the refused one went out"
        );
    }
}
