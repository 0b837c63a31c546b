//! The switch's behaviour on in-memory ports, stepped in virtual time ([`common::VRig`]):
//! learning, flooding, drops by reason, engine refusal as back-pressure, live policy changes,
//! port removal, the capacity and downlink buckets (faults: tests/mem_faults.rs; ECN marking: tests/ecn.rs). No thread, no clock,
//! nothing waits: each test is a function of its inputs. The thread wrapper has its own wall-clock
//! tests in tests/thread.rs.

mod common;

use common::*;
use vqos_dataplane::frame::{
    build_frame, VnetHdr, MAX_FRAME_BYTES, VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4,
};
use vqos_dataplane::{
    DropReason, EmulatedWork, MacPolicy, MemPort, PortSpec, Switch, SwitchConfig, SwitchError,
    VNET_HDR_LEN,
};
use vqos_sched::{PolicyError, VifPolicy};

#[test]
fn learns_sends_unknown_unicast_to_the_uplink_floods_broadcast_then_unicasts() {
    let mut r = VRig::new();
    // Unknown destination from a vif: to the uplink only, never to another tenant.
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![1]);
    assert!(r.b.take_sent().is_empty(), "a's unknown unicast reached b");
    // The uplink answers a: a was learnt, so only a gets it.
    r.u.inject(frame(MAC_A, MAC_U, 2));
    r.run();
    assert_eq!(tags(&r.a.take_sent()), vec![2]);
    // Now the uplink's MAC is learnt too: a → uplink is unicast.
    r.a.inject(frame(MAC_U, MAC_A, 3));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![3]);
    // Broadcast from b reaches everyone else.
    r.b.inject(frame(BCAST, MAC_B, 4));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![4]);
    assert_eq!(tags(&r.a.take_sent()), vec![4]);
    assert!(
        r.b.take_sent().is_empty(),
        "no frame went back to its sender"
    );
    let s = r.stats();
    let a = s.port("a").unwrap();
    assert_eq!(a.counters.rx_frames, 2);
    assert_eq!(a.counters.rx_bytes, 2 * 74);
    assert_eq!(a.counters.tx_frames, 2);
    assert_eq!(s.mac_entries, 3);
    assert_eq!(a.counters.drops.total(), 0);
    assert!(s.loops_total().bursts >= 4);
}

#[test]
fn allow_list_drops_spoofed_sources() {
    let mut r = VRig::with(|_| {}, MacPolicy::Fixed(vec![MAC_A]));
    r.a.inject(frame(MAC_U, MAC_B, 1)); // pretends to be b
    r.a.inject(frame(MAC_U, 0x03_00_00_00_00_01, 2)); // group address as source
    r.a.inject(frame(MAC_U, MAC_A, 3));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![3]);
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.drops[DropReason::Spoofed], 2);
    assert_eq!(s.port("a").unwrap().counters.drops.total(), 2);
}

#[test]
fn malformed_frames_dropped_per_reason_and_others_still_forwarded() {
    let mut r = VRig::new();
    let good = frame(MAC_U, MAC_A, 9);
    r.a.inject(good[..VNET_HDR_LEN + 10].to_vec());
    let mut big = vec![0u8; MAX_FRAME_BYTES + 100];
    big[VNET_HDR_LEN..VNET_HDR_LEN + 14].copy_from_slice(&good[VNET_HDR_LEN..VNET_HDR_LEN + 14]);
    r.a.inject(big);
    let bad_gso = VnetHdr {
        flags: VNET_F_NEEDS_CSUM,
        gso_type: VNET_GSO_TCPV4,
        gso_size: 0,
        ..Default::default()
    };
    r.a.inject(build_frame(bad_gso, MAC_U, MAC_A, 0x0800, &[0; 60]));
    let bad_csum = VnetHdr {
        flags: VNET_F_NEEDS_CSUM,
        csum_start: 60,
        csum_offset: 16,
        ..Default::default()
    };
    r.a.inject(build_frame(bad_csum, MAC_U, MAC_A, 0x0800, &[0; 60]));
    r.b.inject(frame(MAC_U, MAC_B, 7));
    r.a.inject(good);
    r.run();
    let mut got = tags(&r.u.take_sent());
    got.sort();
    assert_eq!(got, vec![7, 9]);
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.rx_frames, 5);
    let d = s.port("a").unwrap().counters.drops;
    assert_eq!(
        (
            d[DropReason::Truncated],
            d[DropReason::Oversized],
            d[DropReason::BadVnetHdr],
            d.total()
        ),
        (1, 1, 2, 4)
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["ports"][1]["drops"]["bad_vnet_hdr"], 2);
    assert!(json["loops"][0]["busy_cycles"].as_u64().is_some());
}

fn refuser_rig(refused: &[&str]) -> (VRig, std::sync::Arc<std::sync::Mutex<Log>>) {
    refuser_rig_with(refused, |_| {})
}

fn refuser_rig_with(
    refused: &[&str],
    config: impl FnOnce(&mut SwitchConfig),
) -> (VRig, std::sync::Arc<std::sync::Mutex<Log>>) {
    let (engine, log) = Refuser::new(refused);
    let rig = VRig::with(
        |c| {
            c.custom_engine = Some(Box::new(engine));
            config(c);
        },
        MacPolicy::default(),
    );
    (rig, log)
}

#[test]
fn emulated_work_is_spent_per_frame_and_charged_as_cycles() {
    // 2 M counter cycles per frame (about 1 ms): far above the real cost of a frame on an
    // in-memory port, so the charge shows whether the work was done.
    let per_frame = 2_000_000;
    let (mut r, log) = refuser_rig_with(&[], |c| {
        c.emulated_work = Some(EmulatedWork {
            per_frame_cycles: per_frame,
            per_byte_cycles: 1000.0,
            batch_frames: 0,
        })
    });
    for i in 0..10 {
        r.b.inject(frame(MAC_U, MAC_B, i));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 10);
    let log = log.lock().unwrap();
    assert_eq!(log.charged_packets, 10);
    assert_eq!(log.charged_bytes, 10 * 74);
    assert!(
        log.charged_cycles >= 10 * per_frame + 10 * 74 * 1000,
        "charged {} cycles for 10 frames",
        log.charged_cycles
    );
    assert_eq!(
        EmulatedWork {
            per_frame_cycles: 5,
            per_byte_cycles: 0.5,
            batch_frames: 0
        }
        .cycles(3, 10),
        20
    );
}

#[test]
fn emulated_batches_are_at_most_batch_frames() {
    for (limit, most) in [(2usize, 2u64), (0, 10)] {
        let (engine, log) = Refuser::new(&[]);
        let (up, u) = MemPort::pair("up", 10_000);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
        cfg.custom_engine = Some(Box::new(engine));
        cfg.emulated_work = Some(EmulatedWork {
            per_frame_cycles: 0,
            per_byte_cycles: 0.0,
            batch_frames: limit,
        });
        let mut sw = Switch::new(cfg, 0).unwrap();
        // All ten frames wait in the port before the switch sees it, so without a limit they
        // are read in one batch.
        let (pb, b) = MemPort::pair("b", 10_000);
        for i in 0..10 {
            b.inject(frame(MAC_U, MAC_B, i));
        }
        sw.add_port(PortSpec::custom(Box::new(pb)), VifPolicy::default(), 0)
            .unwrap();
        run_switch(&mut sw, 0);
        assert_eq!(u.take_sent().len(), 10);
        let l = log.lock().unwrap();
        assert_eq!(l.charged_packets, 10);
        assert_eq!(
            l.largest_batch, most,
            "batch_frames {limit}: largest batch {}",
            l.largest_batch
        );
    }
}

#[test]
fn refused_vif_is_not_read_its_frames_stay_in_its_port() {
    let (mut r, log) = refuser_rig(&["a"]);
    for i in 0..50 {
        r.a.inject(frame(MAC_U, MAC_A, i));
    }
    for i in 0..40 {
        r.b.inject(frame(MAC_U, MAC_B, i));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 40);
    assert_eq!(
        r.a.pending(),
        50,
        "refused vif's frames wait in its own queue"
    );
    assert_eq!(r.b.pending(), 0);
    let s = r.stats();
    assert_eq!(s.port("b").unwrap().counters.rx_frames, 40);
    assert_eq!(s.port("a").unwrap().counters.rx_frames, 0);
    assert!(s.loops_total().engine_refusals > 0);
    assert_eq!(log.lock().unwrap().charged_bytes, 40 * 74);
}

#[test]
fn policy_change_reaches_engine_between_batches_and_bad_ones_change_nothing() {
    let (mut r, log) = refuser_rig(&[]);
    let epoch0 = r.sw.policy_epoch();
    r.stats();
    assert!(!r.sw.stats_due(r.now));
    let w3 = VifPolicy {
        weight: 3,
        ..Default::default()
    };
    r.sw.set_policy("b", w3, r.now).unwrap();
    assert!(r.sw.stats_due(r.now), "the change is published at once");
    assert_eq!(r.sw.policy_epoch(), epoch0 + 1);
    assert_eq!(r.sw.policies().vifs[1].policy.weight, 3);
    assert_eq!(
        log.lock().unwrap().configures.last().unwrap(),
        &vec![("a".to_string(), 1), ("b".to_string(), 3)]
    );
    // Invalid: min above max (refused by validation), weight 99 (refused by the engine),
    // unknown vif, the uplink, a set missing a port.
    let bad = VifPolicy {
        min_bps: 10,
        max_bps: Some(5),
        ..Default::default()
    };
    assert!(matches!(
        r.sw.set_policy("a", bad, r.now),
        Err(SwitchError::Policy(PolicyError::MinAboveMax { .. }))
    ));
    let w99 = VifPolicy {
        weight: 99,
        ..Default::default()
    };
    assert!(r.sw.set_policy("a", w99, r.now).is_err());
    assert!(r.sw.set_policy("zz", VifPolicy::default(), r.now).is_err());
    assert!(matches!(
        r.sw.set_policy("up", VifPolicy::default(), r.now),
        Err(SwitchError::Uplink(_))
    ));
    let mut missing = (**r.sw.policies()).clone();
    missing.vifs.pop();
    assert!(matches!(
        r.sw.set_policies(missing, r.now),
        Err(SwitchError::MissingVif(_))
    ));
    assert_eq!(r.sw.policies().vifs[0].policy, VifPolicy::default());
    assert_eq!(r.sw.policy_epoch(), epoch0 + 1);
    // Traffic still flows after the refused changes.
    r.a.inject(frame(MAC_U, MAC_A, 5));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![5]);
}

#[test]
fn gso_frames_are_charged_as_their_segments_and_tiny_gso_size_is_refused() {
    let (mut r, log) = refuser_rig(&[]);
    // gso_size 1 would be 14 480 segments on the wire for one charged frame.
    r.a.inject(tso_frame(MAC_U, MAC_A, 1, 14_480));
    // 10 segments of 54 + 1448 bytes.
    r.a.inject(tso_frame(MAC_U, MAC_A, 1448, 14_480));
    r.run();
    let got = r.u.take_sent();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].len(), VNET_HDR_LEN + 54 + 14_480, "sent unchanged");
    let wire = 10 * (54 + 1448);
    let s = r.stats();
    let a = s.port("a").unwrap();
    assert_eq!(a.counters.drops[DropReason::BadVnetHdr], 1);
    assert_eq!(
        a.counters.rx_bytes,
        (54 + 14_480) + wire,
        "the refused frame as read"
    );
    assert_eq!(s.port("up").unwrap().counters.tx_bytes, wire);
    // Its sender pays for both: the good frame as its segments, the refused one as read.
    assert_eq!(log.lock().unwrap().charged_bytes, wire + 54 + 14_480);
}

#[test]
fn removing_a_port_affects_only_that_port() {
    let mut r = VRig::new();
    r.a.inject(frame(BCAST, MAC_A, 1));
    r.b.inject(frame(BCAST, MAC_B, 2));
    r.run();
    assert_eq!(r.u.take_sent().len(), 2);
    r.b.take_sent();
    assert!(r.sw.remove_port("a", r.now).unwrap().is_some());
    assert!(matches!(
        r.sw.remove_port("a", r.now),
        Err(SwitchError::UnknownPort(_))
    ));
    assert!(matches!(
        r.sw.remove_port("up", r.now),
        Err(SwitchError::Uplink(_))
    ));
    // a's MAC is forgotten: a frame for it is flooded (to b only), b keeps forwarding.
    r.u.inject(frame(MAC_A, MAC_U, 3));
    r.b.inject(frame(MAC_U, MAC_B, 4));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![4]);
    assert_eq!(tags(&r.b.take_sent()), vec![3]);
    assert!(r.stats().port("a").is_none());
    assert_eq!(r.sw.policies().len(), 1);
    // The name can be reused.
    let (pa, _a2) = MemPort::pair("a", 10);
    r.sw.add_port(PortSpec::custom(Box::new(pa)), VifPolicy::default(), r.now)
        .unwrap();
    assert!(matches!(
        r.sw.add_port(
            PortSpec::custom(Box::new(MemPort::pair("a", 1).0)),
            VifPolicy::default(),
            r.now
        ),
        Err(SwitchError::DuplicatePort(_))
    ));
}

#[test]
fn allow_list_of_several_unsorted_addresses() {
    let allowed = vec![0x02_00_00_00_00_99, MAC_A, 0x02_00_00_00_00_03, MAC_A];
    let mut r = VRig::with(|_| {}, MacPolicy::Fixed(allowed));
    r.a.inject(frame(MAC_U, 0x02_00_00_00_00_03, 1));
    r.a.inject(frame(MAC_U, 0x02_00_00_00_00_04, 2));
    r.a.inject(frame(MAC_U, 0x02_00_00_00_00_99, 3));
    r.a.inject(frame(MAC_U, MAC_A, 4));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![1, 3, 4]);
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.rx_frames, 4);
    assert_eq!(s.port("a").unwrap().counters.drops[DropReason::Spoofed], 1);
}

#[test]
fn downlink_max_drops_excess_as_rate_limited() {
    let mut r = VRig::new();
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.run();
    r.u.take_sent();
    let slow = VifPolicy {
        max_bps: Some(1_000_000), // 125 kB/s, depth 2 × 64 KiB
        ..Default::default()
    };
    r.sw.set_policy("a", slow, r.now).unwrap();
    let big = build_frame(VnetHdr::default(), MAC_A, MAC_U, 0x0800, &[0; 9000]);
    for _ in 0..40 {
        r.u.inject(big.clone());
    }
    r.run();
    // At one instant the full bucket (131 072 bytes) passes frames while it is positive:
    // 14 frames of 9014 bytes leave 4 876, the 15th takes it into debt, the rest drop.
    let a = r.stats().port("a").cloned().unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (15, 25)
    );
    // 100 ms later 12 500 bytes have accrued: the debt (−4 138) is repaid and one more passes.
    for _ in 0..40 {
        r.u.inject(big.clone());
    }
    r.advance(100_000_000);
    let a = r.stats().port("a").cloned().unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (16, 64)
    );
}

/// `max_in` limits the download direction on its own: with no `max`, or a different one, the
/// uplink→vif frames pass the `max_in` bucket, and the vif's sending is not held to it.
#[test]
fn max_in_limits_the_download_direction_only() {
    let mut r = VRig::new();
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.run();
    r.u.take_sent();
    let policy = VifPolicy {
        max_in_bps: Some(1_000_000), // 125 kB/s in, depth 2 × 64 KiB
        max_bps: None,               // unlimited out
        ..Default::default()
    };
    r.sw.set_policy("a", policy, r.now).unwrap();
    let big = |src, dst| build_frame(VnetHdr::default(), dst, src, 0x0800, &[0; 9000]);
    for _ in 0..40 {
        r.u.inject(big(MAC_U, MAC_A));
    }
    r.run();
    // As with the downlink max: 15 frames of 9014 bytes pass the full bucket, 25 drop.
    let a = r.stats().port("a").cloned().unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (15, 25)
    );
    // 100 ms later 12 500 bytes have accrued: the debt is repaid and one more passes.
    for _ in 0..40 {
        r.u.inject(big(MAC_U, MAC_A));
    }
    r.advance(100_000_000);
    let a = r.stats().port("a").cloned().unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (16, 64)
    );
    // The vif's own sending is not limited by max_in: 40 frames at one instant all leave.
    for _ in 0..40 {
        r.a.inject(big(MAC_A, MAC_U));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 40);
    // A max_in above the max: the download follows max_in, not max.
    let policy = VifPolicy {
        max_in_bps: Some(1_000_000_000),
        max_bps: Some(1_000_000),
        ..Default::default()
    };
    r.sw.set_policy("a", policy, r.now).unwrap();
    for _ in 0..40 {
        r.u.inject(big(MAC_U, MAC_A));
    }
    r.run();
    let a = r.stats().port("a").cloned().unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (56, 64)
    );
    // "Unlimited in" with a max out: no download bucket at all.
    let policy = VifPolicy {
        max_in_bps: Some(vqos_sched::policy::UNLIMITED_IN_BPS),
        max_bps: Some(1_000_000),
        ..Default::default()
    };
    r.sw.set_policy("a", policy, r.now).unwrap();
    for _ in 0..400 {
        r.u.inject(big(MAC_U, MAC_A));
    }
    r.run();
    let a = r.stats().port("a").cloned().unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (456, 64)
    );
}

#[test]
fn capacity_holds_vif_frames_back_without_dropping() {
    let mut r = VRig::with(|c| c.capacity_bps = Some(8_000_000), MacPolicy::default()); // 1 MB/s, depth 128 KiB
    let big = build_frame(VnetHdr::default(), MAC_U, MAC_A, 0x0800, &[0; 16_000]);
    let wire = 16_014u64;
    for _ in 0..100 {
        r.a.inject(big.clone());
    }
    let mut sent = 0u64;
    for step in 0..=10u64 {
        if step > 0 {
            r.advance(10_000_000);
        } else {
            r.run();
        }
        sent += r.u.take_sent().len() as u64;
        // Served while tokens were positive: at least the budget, at most one batch beyond
        // it (a batch is sized to the tokens left, plus one frame).
        let budget = 131_072 + 1_000_000 * r.now / 1_000_000_000;
        assert!(sent * wire >= budget, "step {step}: sent {sent}");
        assert!(sent * wire <= budget + 2 * wire, "step {step}: sent {sent}");
    }
    assert_eq!(
        r.a.pending() as u64,
        100 - sent,
        "the rest waits in the port"
    );
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.drops.total(), 0);
    assert!(s.loops_total().capacity_waits > 0);
}

#[test]
fn one_vif_cannot_fill_the_mac_table_for_the_others() {
    let mut r = VRig::with(
        |c| {
            c.mac_capacity = 32;
            c.mac_capacity_per_vif = 8;
        },
        MacPolicy::Any,
    );
    // a (port security off: a router) sends from 100 addresses.
    for m in 0..100u64 {
        r.a.inject(frame(MAC_U, 0x02_00_00_00_10_00 + m, 1));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 100);
    assert!(
        r.b.take_sent().is_empty(),
        "unknown unicast stays off the other vifs"
    );
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.mac_learn_refused, 92);
    assert_eq!(s.mac_entries, 8);
    // b is still learnt, so the uplink's reply to b is not flooded to a.
    r.b.inject(frame(MAC_U, MAC_B, 2));
    r.run();
    r.u.take_sent();
    r.a.take_sent();
    r.u.inject(frame(MAC_B, MAC_U, 3));
    r.run();
    assert_eq!(tags(&r.b.take_sent()), vec![3]);
    assert!(r.a.take_sent().is_empty(), "b's unicast did not leak to a");
    assert_eq!(r.stats().port("b").unwrap().counters.mac_learn_refused, 0);
}
