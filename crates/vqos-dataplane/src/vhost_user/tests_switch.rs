//! Two vhost-user ports and an in-memory uplink in a real switch (epoll readiness): learning,
//! flooding, unicast between the guests, and a bulk transfer with the guests' rings reused;
//! and a busy-polling switch, which keeps its guest's kicks off.

use vqos_sched::VifPolicy;

use super::features::OFFERED_FEATURES as ALL;
use super::test_frontend::*;
use super::*;
use crate::frame::{build_frame, VnetHdr, VNET_HDR_LEN};
use crate::{MemPort, PortSpec, SwitchConfig, SwitchHandle};

const MAC_U: u64 = 0x02_00_00_00_00_01;
const MAC_A: u64 = 0x02_00_00_00_00_0a;
const MAC_B: u64 = 0x02_00_00_00_00_0b;

fn frame(dst: u64, src: u64, tag: u8) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, src, 0x88b5, &[tag; 60])
}

fn tag_of(f: &[u8]) -> u8 {
    f[VNET_HDR_LEN + 14]
}

/// Waits until `fe` received `n` frames and returns them.
fn collect(fe: &mut TestFrontend, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    wait_until(&format!("{n} frames at the guest"), || {
        got.extend(fe.received());
        got.len() >= n
    });
    got
}

#[test]
fn two_guests_and_an_uplink_through_a_real_switch() {
    let (up, u) = MemPort::pair("up", 10_000);
    let sw = SwitchHandle::start(SwitchConfig::new(PortSpec::custom(Box::new(up)))).unwrap();
    let (_d1, p1) = socket_path();
    let (_d2, p2) = socket_path();
    let vm1 = VhostUserPort::server("vm1", &p1).unwrap();
    let vm2 = VhostUserPort::server("vm2", &p2).unwrap();
    let (h1, h2) = (vm1.handle(), vm2.handle());
    sw.add_port(PortSpec::custom(Box::new(vm1)), VifPolicy::default())
        .unwrap();
    sw.add_port(PortSpec::custom(Box::new(vm2)), VifPolicy::default())
        .unwrap();
    let mut fe1 = TestFrontend::connect(&p1, ALL);
    let mut fe2 = TestFrontend::connect(&p2, ALL);
    wait_ready(&h1);
    wait_ready(&h2);
    fe1.post_rx(128, 2048);
    fe2.post_rx(128, 2048);

    // vm1 → broadcast: flooded to the uplink and vm2.
    fe1.send(&frame(0xff_ff_ff_ff_ff_ff, MAC_A, 1));
    wait_until("the flood at the uplink", || u.take_sent().len() == 1);
    assert_eq!(tag_of(&collect(&mut fe2, 1)[0]), 1);
    // The uplink answers vm1 (learnt): only vm1 gets it.
    u.inject(frame(MAC_A, MAC_U, 2));
    let got = collect(&mut fe1, 1);
    assert_eq!(tag_of(&got[0]), 2);
    assert_eq!(
        u16::from_le_bytes([got[0][10], got[0][11]]),
        1,
        "num_buffers"
    );
    // vm2 → vm1, unicast.
    fe2.send(&frame(MAC_A, MAC_B, 3));
    assert_eq!(tag_of(&collect(&mut fe1, 1)[0]), 3);

    // Bulk vm1 → vm2 (learnt): 2000 frames, the guests reusing their rings.
    let total = 2000usize;
    let mut received = 0usize;
    let mut next_tag = 0u8;
    for chunk in 0..total / 100 {
        for _ in 0..100 {
            fe1.send(&frame(MAC_B, MAC_A, next_tag));
            next_tag = next_tag.wrapping_add(1);
        }
        let got = collect(&mut fe2, 100);
        assert_eq!(got.len(), 100, "chunk {chunk}");
        received += got.len();
        fe2.post_rx(100, 2048);
        wait_until("vm1's chains used", || {
            fe1.tx.take_used(&fe1.mem);
            fe1.tx.last_used == fe1.tx.avail_idx
        });
    }
    assert_eq!(received, total);
    assert!(u.take_sent().is_empty(), "unicast stays off the uplink");
    // Stats are published every 25 ms.
    wait_until("the switch's stats", || {
        sw.stats()
            .port("vm1")
            .is_some_and(|p| p.counters.rx_frames == total as u64 + 1)
    });
    let c1 = h1.counters();
    let c2 = h2.counters();
    assert_eq!(c1.malformed() + c2.malformed(), 0);
    assert!(
        c1.kicks > 0,
        "the loop (epoll) was woken by the guest's kicks"
    );
    assert_eq!(c2.guest_rx_no_buffers_frames, 0);
    assert_eq!(h2.status().tx_frames, total as u64 + 1);
    sw.stop().unwrap();
}

#[test]
fn under_busy_polling_the_guest_is_never_asked_to_kick() {
    let (up, u) = MemPort::pair("up", 10_000);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.readiness = crate::Readiness::BusyPoll;
    let sw = SwitchHandle::start(cfg).unwrap();
    let (_d, p) = socket_path();
    let vm1 = VhostUserPort::server("vm1", &p).unwrap();
    let h1 = vm1.handle();
    sw.add_port(PortSpec::custom(Box::new(vm1)), VifPolicy::default())
        .unwrap();
    let mut fe = TestFrontend::connect(&p, ALL & !features::F_EVENT_IDX);
    wait_ready(&h1);
    // The loop polls the empty ring and turns the guest's kicks off, for good.
    wait_until("kicks off", || fe.tx.used_flags(&fe.mem) == 1);
    let kicks = h1.counters().kicks;
    for tag in 0..40u8 {
        // Published without a kick: the guest was told not to.
        let idx = fe.tx.avail_idx % RING;
        let f = frame(MAC_U, MAC_A, tag);
        fe.mem.write(buf_addr(1, idx), &f);
        fe.tx
            .set_desc(&fe.mem, idx, buf_addr(1, idx), f.len() as u32, 0, 0);
        fe.tx.publish(&fe.mem, idx);
    }
    let mut sent = Vec::new();
    wait_until("40 frames at the uplink", || {
        sent.extend(u.take_sent());
        sent.len() >= 40
    });
    let tags: Vec<u8> = sent.iter().map(|f| tag_of(f)).collect();
    assert_eq!(tags, (0..40).collect::<Vec<u8>>());
    assert_eq!(fe.tx.used_flags(&fe.mem), 1, "drained, kicks still off");
    assert_eq!(h1.counters().kicks, kicks);
    sw.stop().unwrap();
}
