//! Several queue pairs (`MQ`): what the port offers, how transmit queues are handed to shards,
//! every guest TX queue read without one waiting behind another, each shard's frames on its
//! own guest RX queue (pair 0 when the guest turned that pair off), and no wake-up lost
//! across queues.

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use vhost_user_backend::VringT;

use super::features::{F_MQ, F_VERSION_1, OFFERED_FEATURES};
use super::test_frontend::socket_path;
use super::tests::readable;
use super::tests_regions::{frame, ring, Guest, WRITE};
use super::{VhostUserConfig, VhostUserError, VhostUserPort, VhostUserRxQueue, VhostUserTxQueue};
use crate::port::Batch;

/// A guest with two queue pairs (queues 0..4).
fn two_pairs() -> Guest {
    Guest::with_rings(F_VERSION_1, &[ring(0), ring(1), ring(2), ring(3)])
}

/// Puts `count` 60-byte frames tagged `tag` on guest TX queue `q`.
fn transmit(g: &mut Guest, q: u64, tag: u8, count: u16) {
    for i in 0..count {
        let f = frame(tag, 60);
        let at = 0x8000 + (q * 8 + u64::from(i)) * 0x100;
        g.write(at, &f);
        g.set_desc(q, i, at, f.len() as u32, 0, 0);
        g.publish(q, i);
    }
}

/// The tags (last payload byte) of the frames in `b`.
fn tags(b: &Batch) -> Vec<u8> {
    (0..b.len()).map(|i| *b.frame(i).last().unwrap()).collect()
}

/// Whether the port's readiness eventfd is set.
fn ready(g: &Guest) -> bool {
    readable(g.shared.ready.raw())
}

#[test]
fn every_tx_queue_is_read_and_none_waits_behind_a_busy_one() {
    let mut g = two_pairs();
    transmit(&mut g, 1, 1, 6);
    transmit(&mut g, 3, 3, 6);
    let mut b = Batch::new();
    let mut read = |g: &mut Guest, max| {
        b.clear();
        assert_eq!(g.recv_max(&mut b, max), max);
        tags(&b)
    };
    // Each call starts one pair further: pair 1 is not starved by a full pair 0.
    assert_eq!(read(&mut g, 4), [1; 4]);
    assert_eq!(read(&mut g, 4), [3; 4]);
    assert_eq!(read(&mut g, 4), [1, 1, 3, 3]);
    assert_eq!((g.used_idx(1), g.used_idx(3)), (6, 6));
    let per_pair: Vec<[u64; 2]> = g
        .shared
        .pair_frames
        .iter()
        .map(|p| {
            p.each_ref()
                .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        })
        .collect();
    assert_eq!(per_pair, [[6, 0], [6, 0]]);
}

#[test]
fn a_shard_writes_its_own_rx_queue_and_pair_0_when_the_guest_turned_its_pair_off() {
    let mut g = two_pairs();
    for q in [0u64, 2] {
        for i in 0..4u16 {
            g.set_desc(
                q,
                i,
                0xC000 + (q * 4 + u64::from(i)) * 0x400,
                0x400,
                WRITE,
                0,
            );
            g.publish(q, i);
        }
    }
    let mut out = Batch::new();
    let f = frame(5, 100);
    out.push(&f);
    out.push(&frame(6, 100));
    assert_eq!(g.send_on(1, &out, &[0, 1]), 2);
    assert_eq!((g.used_idx(0), g.used_idx(2)), (0, 2));
    // What the guest finds in pair 1's first buffer: the frame after its header, which says
    // one buffer (`num_buffers`).
    let (head, len) = g.used(2, 0);
    assert_eq!((head, len as usize), (0, f.len()));
    let got = g.read(0xC000 + 8 * 0x400, f.len());
    assert_eq!((&got[12..], &got[10..12]), (&f[12..], &[1u8, 0][..]));
    // The guest turns pair 1 off (QEMU disables its vrings when a Linux guest runs
    // `ethtool -L combined 1`): the shard's frames go to pair 0 and are not lost.
    g.vrings[2].set_enabled(false);
    assert_eq!(g.send_on(1, &out, &[0]), 1);
    assert_eq!((g.used_idx(0), g.used_idx(2)), (1, 2));
    let written: Vec<u64> = g
        .shared
        .pair_frames
        .iter()
        .map(|p| p[1].load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    assert_eq!(written, [1, 2]);
}

#[test]
fn no_wake_up_is_lost_across_queues() {
    // Pair 0 drains (its kicks are re-enabled and the readiness cleared); pair 1 still has
    // frames after a full batch: the port must signal itself, or the loop would sleep on them.
    let mut g = two_pairs();
    transmit(&mut g, 1, 1, 2);
    transmit(&mut g, 3, 3, 6);
    g.shared.ready.signal();
    let mut b = Batch::new();
    assert_eq!(g.recv_max(&mut b, 4), 4);
    assert_eq!(tags(&b), [1, 1, 3, 3]);
    assert!(ready(&g), "frames left on pair 1 must wake the loop");
    // Everything read: the readiness is cleared and stays so until a kick.
    b.clear();
    assert_eq!(g.recv_max(&mut b, 32), 4);
    assert!(!ready(&g));
}

#[test]
fn a_port_with_two_pairs_offers_mq_and_says_how_many() {
    for (queues, features) in [(1u16, OFFERED_FEATURES), (2, OFFERED_FEATURES | F_MQ)] {
        let (_dir, path) = socket_path();
        let cfg = VhostUserConfig {
            queues,
            ..VhostUserConfig::server(&path)
        };
        let _port = VhostUserPort::with_config("mq", cfg).unwrap();
        let mut fe = Frontend::connect(&path, 4).unwrap();
        fe.set_owner().unwrap();
        assert_eq!(fe.get_features().unwrap(), features);
        fe.set_features(features).unwrap();
        let p = fe.get_protocol_features().unwrap();
        assert!(p.contains(VhostUserProtocolFeatures::MQ));
        fe.set_protocol_features(p).unwrap();
        assert_eq!(fe.get_queue_num().unwrap(), u64::from(queues));
    }
}

#[test]
fn queue_counts_outside_1_to_16_are_refused() {
    for queues in [0u16, 17] {
        let (_dir, path) = socket_path();
        let cfg = VhostUserConfig {
            queues,
            ..VhostUserConfig::server(&path)
        };
        let err = VhostUserPort::with_config("mq", cfg).unwrap_err();
        assert!(matches!(err, VhostUserError::Queues(_)), "{err}");
        assert_eq!(err.to_string(), "Port 'mq': queues must be 1 to 16");
    }
}

#[test]
fn transmit_queues_are_handed_out_over_pairs_1_and_up() {
    let (_dir, path) = socket_path();
    let one = VhostUserPort::server("one", &path).unwrap();
    assert!(crate::Port::tx_queue(&one).unwrap().is_none());
    drop(one);
    let cfg = VhostUserConfig {
        queues: 3,
        ..VhostUserConfig::server(&path)
    };
    let three = VhostUserPort::with_config("three", cfg).unwrap();
    let pairs: Vec<usize> = (0..4)
        .map(|_| VhostUserTxQueue::next(&three.shared).unwrap().pair())
        .collect();
    assert_eq!(pairs, [1, 2, 1, 2]);
}

#[test]
fn a_lent_pair_is_read_by_its_borrower_alone_and_wakes_its_own_eventfd() {
    use std::sync::atomic::Ordering;
    let mut g = two_pairs();
    // What `VhostUserRxQueue::lend` does for pair 1.
    g.shared.lent.fetch_or(1 << 1, Ordering::AcqRel);
    transmit(&mut g, 1, 1, 3);
    transmit(&mut g, 3, 3, 3);
    let mut b = Batch::new();
    assert_eq!(g.recv_max(&mut b, 32), 3, "the port reads pair 0 only");
    assert_eq!(tags(&b), [1; 3]);
    b.clear();
    assert_eq!(
        g.recv_from(&mut b, 32, 1 << 1, Some(1)),
        3,
        "the borrower, pair 1"
    );
    assert_eq!(tags(&b), [3; 3]);
    assert_eq!((g.used_idx(1), g.used_idx(3)), (3, 3));
    // Each side's readiness is its own: pair 1's kicks wake the borrower, not the port.
    let (port, borrower) = (g.shared.ready.raw(), g.shared.ready_of(1).raw());
    assert_ne!(port, borrower);
    assert_eq!(g.shared.ready_of(0).raw(), port);
    // The borrower finds its queue drained (kicks back on): its readiness is cleared, the
    // port's is left as it was.
    g.shared.ready.signal();
    g.shared.ready_of(1).signal();
    b.clear();
    assert_eq!(g.recv_from(&mut b, 32, 1 << 1, Some(1)), 0);
    assert!(!readable(borrower), "drained: its own readiness cleared");
    assert!(
        readable(port),
        "the port's readiness is not the borrower's to clear"
    );
}

#[test]
fn receive_queues_are_lent_from_the_highest_pair_and_pair_0_stays() {
    let (_dir, path) = socket_path();
    let one = VhostUserPort::server("one", &path).unwrap();
    assert!(crate::Port::rx_queue(&one).unwrap().is_none());
    drop(one);
    let cfg = VhostUserConfig {
        queues: 3,
        ..VhostUserConfig::server(&path)
    };
    let three = VhostUserPort::with_config("three", cfg).unwrap();
    let lent: Vec<usize> = std::iter::from_fn(|| VhostUserRxQueue::lend(&three.shared))
        .map(|q| q.pair())
        .collect();
    assert_eq!(lent, [2, 1]);
    assert_eq!(
        three.shared.lent.load(std::sync::atomic::Ordering::Relaxed),
        0b110
    );
    assert!(
        VhostUserRxQueue::lend(&three.shared).is_none(),
        "pair 0 stays the port's"
    );
}

/// A guest that sets up a queue pair the port did not offer (a vring index at or past 2 ×
/// `queues`) is refused and counted, its session ends with the reason in the port's status,
/// and the port is left as it was: a guest that keeps to the offer connects and forwards next.
#[test]
fn a_guest_asking_for_more_pairs_than_offered_is_refused_and_the_port_serves_the_next() {
    use super::test_frontend::{wait_until, TestFrontend};
    use crate::Port;
    let (_dir, path) = socket_path();
    let mut port = VhostUserPort::server("one", &path).unwrap();
    let mut fe = Frontend::connect(&path, 4).unwrap();
    fe.set_owner().unwrap();
    assert_eq!(fe.get_features().unwrap() & F_MQ, 0, "one pair: no MQ");
    fe.set_features(OFFERED_FEATURES).unwrap();
    let p = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(p).unwrap();
    // Not asked (GET_QUEUE_NUM would make the `vhost` crate's frontend refuse the messages
    // below itself): the guest believes in 2 pairs.
    // Pair 1's vrings (2 and 3) do not exist on a one-pair port: the message naming one is
    // refused and counted, and (sent without asking for a reply, as a guest that ignores the
    // offer would) ends the session, with the reason in the port's status.
    let h = port.handle();
    fe.set_vring_num(0, 256).unwrap();
    fe.set_vring_num(2, 256).unwrap();
    wait_until("the session ended", || !h.is_connected());
    assert_eq!(h.counters().refused_messages, 1);
    let why = h.status().last_error.expect("why the session ended");
    assert!(
        why.contains("the guest named vring 2, but the port offers 2 (queues = 1)"),
        "{why}"
    );
    assert_eq!(h.status().queues, 1);
    drop(fe);
    // A guest that keeps to the offer is served.
    let mut good = TestFrontend::connect(&path, OFFERED_FEATURES);
    wait_until("the next session", || h.is_connected());
    good.send(&frame(7, 60));
    let mut b = Batch::new();
    wait_until("its frame", || {
        port.recv_batch(&mut b, 32).unwrap();
        !b.is_empty()
    });
    assert_eq!(tags(&b), vec![7]);
}
