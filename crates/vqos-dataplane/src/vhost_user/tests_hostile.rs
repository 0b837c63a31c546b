//! A hostile guest: each malformed chain moves its own counter, the chain is given back where
//! its head allows, and the frames behind it still flow; a broken ring quarantines the session
//! until the guest reconnects.

use super::features::OFFERED_FEATURES as ALL;
use super::test_frontend::*;
use super::*;
use crate::frame::{build_frame, VnetHdr, MAX_FRAME_BYTES};

/// Descriptor flags.
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;
/// First descriptor index the bad chains use (the good frames use the low ones).
const BAD: u16 = 200;

fn frame(tag: u8) -> Vec<u8> {
    build_frame(
        VnetHdr::default(),
        0x02_00_00_00_00_0b,
        0x02_00_00_00_00_0a,
        0x0800,
        &[tag; 60],
    )
}

fn connected_with(
    cfg: impl FnOnce(&mut VhostUserConfig),
) -> (tempfile::TempDir, VhostUserPort, TestFrontend) {
    let (dir, path) = socket_path();
    let mut c = VhostUserConfig::server(&path);
    cfg(&mut c);
    let port = VhostUserPort::with_config("vm1", c).unwrap();
    let fe = TestFrontend::connect(&path, ALL);
    wait_ready(&port.handle());
    (dir, port, fe)
}

/// The guest transmits the bad chain written by `bad` (head [`BAD`] unless it publishes
/// itself), then a good frame: the good frame arrives, `counter` moved by one, nothing else
/// malformed, and the bad head is back in the used ring (when in range).
fn guest_tx_case(
    bad: impl FnOnce(&mut TestFrontend),
    counter: fn(&VhostUserCounters) -> u64,
    head_in_range: bool,
) {
    let (_d, mut port, mut fe) = connected_with(|_| {});
    bad(&mut fe);
    let good = frame(42);
    fe.send(&good);
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);
    assert_eq!(b.frame(0), &good[..]);
    let c = port.vhost_counters();
    assert_eq!(counter(&c), 1, "{c:?}");
    assert_eq!(c.malformed(), 1, "only that kind: {c:?}");
    assert!(!port.handle().is_quarantined());
    let used = fe.tx.take_used(&fe.mem);
    if head_in_range {
        assert_eq!(used, vec![(BAD, 0), (1, 0)]);
    } else {
        assert_eq!(used, vec![(1, 0)]);
    }
}

/// Writes descriptor `BAD` with `addr`, `len`, `flags`, `next` and publishes it.
fn one_desc(addr: u64, len: u32, flags: u16, next: u16) -> impl FnOnce(&mut TestFrontend) {
    move |fe: &mut TestFrontend| {
        fe.tx.set_desc(&fe.mem, BAD, addr, len, flags, next);
        fe.tx.publish(&fe.mem, BAD);
    }
}

fn buf() -> u64 {
    buf_addr(1, BAD)
}

#[test]
fn head_out_of_range() {
    guest_tx_case(
        |fe| fe.tx.publish(&fe.mem, RING + 3),
        |c| c.head_out_of_range,
        false,
    );
}

#[test]
fn next_out_of_range() {
    guest_tx_case(
        one_desc(buf(), 60, NEXT, 999),
        |c| c.next_out_of_range,
        true,
    );
}

#[test]
fn descriptor_loop() {
    guest_tx_case(
        |fe| {
            fe.tx.set_desc(&fe.mem, BAD, buf(), 30, NEXT, BAD + 1);
            fe.tx.set_desc(&fe.mem, BAD + 1, buf(), 30, NEXT, BAD);
            fe.tx.publish(&fe.mem, BAD);
        },
        |c| c.chain_loop,
        true,
    );
}

#[test]
fn zero_length_descriptor() {
    guest_tx_case(one_desc(buf(), 0, 0, 0), |c| c.zero_length_desc, true);
}

#[test]
fn address_outside_guest_memory() {
    guest_tx_case(
        one_desc(MEM_BYTES as u64 + 4096, 60, 0, 0),
        |c| c.bad_desc_address,
        true,
    );
}

#[test]
fn address_that_overflows() {
    guest_tx_case(
        one_desc(u64::MAX - 10, 60, 0, 0),
        |c| c.bad_desc_address,
        true,
    );
}

#[test]
fn length_beyond_guest_memory() {
    guest_tx_case(
        one_desc(buf(), u32::MAX, 0, 0),
        |c| c.bad_desc_address,
        true,
    );
}

#[test]
fn write_only_descriptor_where_a_readable_one_is_expected() {
    guest_tx_case(
        one_desc(buf(), 60, WRITE, 0),
        |c| c.wrong_direction_desc,
        true,
    );
}

#[test]
fn indirect_descriptor_not_negotiated() {
    guest_tx_case(one_desc(buf(), 64, INDIRECT, 0), |c| c.indirect_desc, true);
}

#[test]
fn chain_longer_than_any_frame() {
    let half = (MAX_FRAME_BYTES / 2 + 8) as u32;
    guest_tx_case(
        |fe| {
            fe.tx.set_desc(&fe.mem, BAD, buf(), half, NEXT, BAD + 1);
            fe.tx.set_desc(&fe.mem, BAD + 1, buf(), half, 0, 0);
            fe.tx.publish(&fe.mem, BAD);
        },
        |c| c.oversized_chain,
        true,
    );
}

#[test]
fn chain_shorter_than_the_header() {
    guest_tx_case(one_desc(buf(), 4, 0, 0), |c| c.short_chain, true);
}

#[test]
fn readable_receive_buffer_is_given_back_and_the_next_one_used() {
    let (_d, mut port, mut fe) = connected_with(|_| {});
    fe.rx.set_desc(&fe.mem, 0, buf_addr(0, 0), 2048, 0, 0); // no WRITE flag
    fe.rx.publish(&fe.mem, 0);
    fe.post_rx(1, 2048);
    let f = frame(1);
    let mut b = Batch::new();
    b.push(&f);
    assert_eq!(port.send_batch(&b, &[0]).unwrap(), 1);
    let mut want = f.clone();
    want[10] = 1; // num_buffers
    assert_eq!(fe.received(), vec![vec![], want]);
    assert_eq!(port.vhost_counters().wrong_direction_desc, 1);
}

#[test]
fn a_bad_chain_amid_a_mergeable_frame_restarts_the_gathering() {
    let (_d, mut port, mut fe) = connected_with(|_| {});
    fe.post_rx(1, 256);
    let idx = fe.rx.avail_idx;
    fe.rx
        .set_desc(&fe.mem, idx, MEM_BYTES as u64, 256, WRITE, 0);
    fe.rx.publish(&fe.mem, idx);
    fe.post_rx(5, 256);
    let f = build_frame(
        VnetHdr::default(),
        0x02_00_00_00_00_0b,
        0x02_00_00_00_00_0a,
        0x0800,
        &[7; 1000],
    );
    let mut b = Batch::new();
    b.push(&f);
    assert_eq!(port.send_batch(&b, &[0]).unwrap(), 1);
    let mut want = f.clone();
    want[10] = 5;
    assert_eq!(fe.received(), vec![vec![], vec![], want]);
    assert_eq!(port.vhost_counters().bad_desc_address, 1);
}

#[test]
fn avail_index_far_ahead_quarantines_until_reconnect() {
    let (d, mut port, mut fe) = connected_with(|_| {});
    let h = port.handle();
    fe.mem.put_u16(fe.tx.avail + 2, RING + 1);
    fe.kick[1].write(1).unwrap();
    let mut b = Batch::new();
    wait_until("quarantine", || {
        port.recv_batch(&mut b, 8).unwrap();
        h.is_quarantined()
    });
    assert_eq!(b.len(), 0);
    let c = h.counters();
    assert_eq!((c.bad_avail_index, c.quarantines), (1, 1));
    fe.post_rx(4, 2048);
    b.push(&frame(1));
    assert_eq!(port.send_batch(&b, &[0]).unwrap(), 0);
    assert_eq!(h.counters().disconnected_frames, 1);

    // A reconnecting guest gets a fresh, healthy session.
    drop(fe);
    wait_until("disconnect", || !h.is_connected());
    let mut fe = TestFrontend::connect(&d.path().join("vhu.sock"), ALL);
    wait_ready(&h);
    assert!(!h.is_quarantined());
    fe.send(&frame(2));
    b.clear();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);
}

#[test]
fn too_many_malformed_chains_quarantine_the_session() {
    let (_d, mut port, mut fe) = connected_with(|c| c.quarantine_after_bad_chains = 3);
    for i in 0..3 {
        fe.tx.set_desc(&fe.mem, BAD + i, buf(), 0, 0, 0);
        fe.tx.publish(&fe.mem, BAD + i);
    }
    fe.send(&frame(1));
    let mut b = Batch::new();
    wait_until("quarantine", || {
        port.recv_batch(&mut b, 8).unwrap();
        port.handle().is_quarantined()
    });
    assert_eq!(b.len(), 0, "nothing read after the third bad chain");
    let c = port.vhost_counters();
    assert_eq!((c.zero_length_desc, c.quarantines), (3, 1));
}

#[test]
fn avail_ring_outside_guest_memory_quarantines() {
    let (_d, path) = socket_path();
    let mut port = VhostUserPort::server("vm1", &path).unwrap();
    let mut tx = Ring::new(1);
    tx.avail = MEM_BYTES as u64 - 4; // flags and idx inside, the ring entries outside
    let fe = TestFrontend::connect_with_rings(&path, ALL, [Ring::new(0), tx]);
    let h = port.handle();
    wait_ready(&h);
    fe.mem.put_u16(fe.tx.avail + 2, 1);
    let mut b = Batch::new();
    wait_until("quarantine", || {
        port.recv_batch(&mut b, 8).unwrap();
        h.is_quarantined()
    });
    let c = h.counters();
    assert_eq!((c.bad_ring_address, c.quarantines, b.len()), (1, 1, 0));
}

#[test]
fn a_frame_may_not_take_more_than_1024_guest_buffers() {
    let (_d, mut port, mut fe) = connected_with(|_| {});
    // One chain of 200 one-byte buffers, offered 8 times: 1600 buffers for 1600 bytes.
    for i in 0..200u16 {
        let flags = if i < 199 { WRITE | NEXT } else { WRITE };
        fe.rx.set_desc(&fe.mem, i, buf_addr(0, i), 1, flags, i + 1);
    }
    for _ in 0..8 {
        fe.rx.publish(&fe.mem, 0);
    }
    let f = build_frame(
        VnetHdr::default(),
        0x02_00_00_00_00_0b,
        0x02_00_00_00_00_0a,
        0x0800,
        &[7; 1500],
    );
    let mut b = Batch::new();
    b.push(&f);
    assert_eq!(port.send_batch(&b, &[0]).unwrap(), 0);
    assert_eq!(port.vhost_counters().guest_rx_buffer_too_small_frames, 1);
    assert!(fe.received().is_empty(), "the chains were put back");
    // A frame that fits in 1024 buffers goes through.
    let small = frame(3);
    b.clear();
    b.push(&small);
    assert_eq!(port.send_batch(&b, &[0]).unwrap(), 1);
    assert_eq!(fe.rx.take_used(&fe.mem), vec![(0, small.len() as u32)]);
}
