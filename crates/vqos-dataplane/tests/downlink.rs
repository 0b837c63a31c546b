//! The scheduled downlink in virtual time ([`common::VRig`]): what the vifs receive from the
//! uplink follows their weights, mins and maxes under the downlink capacity; the AQM marks
//! ECN-capable frames and drops the others; a vif whose guest stops reading does not slow
//! another; queues never pass their bounds and every frame is accounted for.

mod common;

use common::*;
use vqos_dataplane::frame::{build_frame, VnetHdr};
use vqos_dataplane::{DownlinkConfig, DropReason, MacPolicy, SwitchError};
use vqos_sched::{EngineKind, PolicyError, PolicySet, VifPolicy};

const MS: u64 = 1_000_000;
const MBIT: u64 = 1_000_000;

/// A 1500-byte (on the wire) frame that is not IP: the AQM can only drop it.
fn big(dst: u64) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, MAC_U, 0x88b5, &[7; 1486])
}

/// A 1500-byte ECT(0) IPv4 frame.
fn big_ect(dst: u64) -> Vec<u8> {
    let mut p = station_ipv4(MAC_U, 0x02, 1486);
    p.extend_from_slice(&[0; 1466]);
    build_frame(VnetHdr::default(), dst, MAC_U, 0x0800, &p)
}

/// A rig with the scheduled downlink, engine `vqos`, downlink capacity `cap_mbit`, and the
/// vifs' MACs learnt (each sent one frame to the uplink).
fn rig(cap_mbit: u64, dl: DownlinkConfig) -> VRig {
    let mut r = VRig::with(
        |c| {
            c.engine = EngineKind::Vqos;
            c.capacity_in_bps = Some(cap_mbit * MBIT);
            c.downlink = Some(dl);
        },
        MacPolicy::default(),
    );
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.b.inject(frame(MAC_U, MAC_B, 1));
    r.run();
    r.u.take_sent();
    r
}

fn set(r: &mut VRig, a: VifPolicy, b: VifPolicy) {
    let mut s = (**r.sw.policies()).clone();
    s.vifs[0].policy = a;
    s.vifs[1].policy = b;
    r.sw.set_policies(s, r.now).unwrap();
}

fn weight(w: u32) -> VifPolicy {
    VifPolicy {
        weight: w,
        ..Default::default()
    }
}

/// What each of a and b received, Mbit/s, over the last half of `ms` milliseconds during
/// which the uplink offers each `per_ms` frames (made by `make`) every millisecond. Checks
/// after every step that no queue holds more than its bound.
fn offer(r: &mut VRig, ms: u64, per_ms: [usize; 2], make: fn(u64) -> Vec<u8>) -> [f64; 2] {
    offer_every(r, ms, MS, per_ms, make)
}

/// [`offer`] in steps of `step_ns` (`steps` of them, `per_step` frames each).
fn offer_every(
    r: &mut VRig,
    steps: u64,
    step_ns: u64,
    per_step: [usize; 2],
    make: fn(u64) -> Vec<u8>,
) -> [f64; 2] {
    let (ms, per_ms) = (steps, per_step);
    let mut got = [0u64; 2];
    for step in 0..ms {
        for _ in 0..per_ms[0] {
            r.u.inject(make(MAC_A));
        }
        for _ in 0..per_ms[1] {
            r.u.inject(make(MAC_B));
        }
        r.advance(step_ns);
        let s = r.stats();
        for p in ["a", "b"] {
            let queued = s.port(p).unwrap().queued_frames;
            assert!(queued <= 1024, "{p}: {queued} queued");
        }
        let sent = [r.a.take_sent(), r.b.take_sent()];
        if step >= ms / 2 {
            for (g, f) in got.iter_mut().zip(&sent) {
                *g += f.iter().map(|f| f.len() as u64 - 12).sum::<u64>();
            }
        }
    }
    let secs = (ms / 2 * step_ns) as f64 / 1e9;
    got.map(|b| (b * 8) as f64 / secs / MBIT as f64)
}

fn within(got: f64, want: f64, pct: f64) -> bool {
    (got - want).abs() <= want * pct / 100.0
}

#[test]
fn weights_share_the_downlink_capacity() {
    let mut r = rig(400, DownlinkConfig::default());
    set(&mut r, weight(1), weight(3));
    // 40 frames/ms each is 480 Mbit/s: both over their share.
    let [a, b] = offer(&mut r, 400, [40, 40], big);
    assert!(within(a, 100.0, 5.0) && within(b, 300.0, 5.0), "{a} {b}");
}

#[test]
fn a_min_and_a_max_hold_on_the_downlink() {
    let mut r = rig(400, DownlinkConfig::default());
    let a = VifPolicy {
        min_bps: 250 * MBIT,
        ..weight(1)
    };
    set(&mut r, a, weight(3));
    let [a, b] = offer(&mut r, 400, [40, 40], big);
    assert!(within(a, 250.0, 5.0) && within(b, 150.0, 5.0), "{a} {b}");
    // An inbound max on b: a takes the rest (work-conserving).
    let b = VifPolicy {
        max_in_bps: Some(50 * MBIT),
        ..weight(3)
    };
    set(&mut r, weight(1), b);
    let [a, b] = offer(&mut r, 400, [40, 40], big);
    assert!(within(a, 350.0, 5.0) && within(b, 50.0, 5.0), "{a} {b}");
}

#[test]
fn a_vif_whose_guest_stops_reading_does_not_slow_another() {
    let mut r = rig(400, DownlinkConfig::default());
    set(&mut r, weight(1), weight(1));
    // a's guest takes nothing: its frames are lost at its port, b gets the capacity.
    r.sw.remove_port("a", r.now).unwrap();
    let (pa, a) = vqos_dataplane::MemPort::pair("a", 0);
    r.sw.add_port(
        vqos_dataplane::PortSpec::custom(Box::new(pa)),
        VifPolicy::default(),
        r.now,
    )
    .unwrap();
    r.a = a;
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.run();
    let [_, b] = offer(&mut r, 200, [40, 40], big);
    assert!(within(b, 400.0, 5.0), "{b}");
    let s = r.stats();
    assert!(s.port("a").unwrap().counters.drops[DropReason::TxError] > 0);
}

#[test]
fn the_aqm_marks_ecn_capable_frames_and_drops_the_others() {
    for (make, ect) in [(big_ect as fn(u64) -> Vec<u8>, true), (big, false)] {
        let mut r = rig(100, DownlinkConfig::default());
        // 12 frames/ms is 144 Mbit/s into 100: a standing queue.
        offer(&mut r, 200, [12, 0], make);
        let c = r.stats().port("a").unwrap().counters;
        if ect {
            assert!(c.ecn_marked > 0, "{c:?}");
            assert_eq!(c.drops[DropReason::Aqm], 0);
        } else {
            assert!(c.drops[DropReason::Aqm] > 0, "{c:?}");
            assert_eq!(c.ecn_marked, 0);
        }
    }
}

#[test]
fn queues_keep_their_bounds_and_every_frame_is_accounted_for() {
    let dl = DownlinkConfig {
        queue_frames: 16,
        ..Default::default()
    };
    let mut r = rig(100, dl);
    let offered = 300 * 40;
    let mut delivered = 0;
    for _ in 0..300 {
        for _ in 0..40 {
            r.u.inject(big(MAC_A));
        }
        r.advance(MS);
        delivered += r.a.take_sent().len() as u64;
        let queued = r.stats().port("a").unwrap().queued_frames;
        assert!(queued <= 16, "{queued}");
    }
    let s = r.stats();
    let (c, queued) = s.port("a").map(|p| (p.counters, p.queued_frames)).unwrap();
    assert!(c.drops[DropReason::QueueFull] > 0);
    let lost = c.drops[DropReason::QueueFull]
        + c.drops[DropReason::Aqm]
        + c.drops[DropReason::RateLimited]
        + c.drops[DropReason::TxError];
    assert_eq!(delivered, c.tx_frames);
    assert_eq!(offered, delivered + lost + queued, "{c:?}");
}

#[test]
fn bad_downlink_settings_are_refused_and_change_nothing() {
    let mut r = rig(400, DownlinkConfig::default());
    let before = r.sw.policies().clone();
    let mut s: PolicySet = (*before).clone();
    s.vifs[0].policy.min_bps = 300 * MBIT;
    s.vifs[1].policy.min_bps = 200 * MBIT;
    s.capacity_in_bps = Some(400 * MBIT);
    assert!(matches!(
        r.sw.set_policies(s, r.now),
        Err(SwitchError::Policy(PolicyError::MinsOverDownlink { .. }))
    ));
    assert_eq!(r.sw.policies(), &before);
    let small = DownlinkConfig {
        queue_bytes: 1000,
        ..Default::default()
    };
    let (up, _u) = vqos_dataplane::MemPort::pair("up", 1);
    let mut cfg = vqos_dataplane::SwitchConfig::new(vqos_dataplane::PortSpec::custom(Box::new(up)));
    cfg.downlink = Some(small);
    assert!(matches!(
        vqos_dataplane::Switch::new(cfg, 0),
        Err(SwitchError::Setting(_))
    ));
}

/// Every engine schedules the downlink: none lets the vifs receive more than `capacity_in`
/// together, each gives both greedy vifs some, and each but `rr` (no policy in either
/// direction) holds b to its inbound max. Steps of 100 µs, as a loop that sleeps until the
/// capacity's next token would poll: `rr` counts batches, not bytes, so with 1 ms steps the
/// first vif after a refill took a whole batch and the second the few frames left.
#[test]
fn every_engine_holds_the_downlink_capacity_and_all_but_rr_an_inbound_max() {
    for kind in EngineKind::ALL {
        let mut r = VRig::with(
            |c| {
                c.engine = kind;
                // ANCS hands out credit per period of a finite capacity (both directions).
                c.capacity_bps = Some(1000 * MBIT);
                c.capacity_in_bps = Some(400 * MBIT);
                c.downlink = Some(DownlinkConfig::default());
            },
            MacPolicy::default(),
        );
        r.a.inject(frame(MAC_U, MAC_A, 1));
        r.b.inject(frame(MAC_U, MAC_B, 1));
        r.run();
        r.u.take_sent();
        let b = VifPolicy {
            max_in_bps: Some(50 * MBIT),
            ..weight(1)
        };
        set(&mut r, weight(1), b);
        let [a, b] = offer_every(&mut r, 4000, 100_000, [4, 4], big);
        assert!(a + b <= 400.0 * 1.05, "{kind}: {a} + {b}");
        assert!(a > 100.0, "{kind}: a {a}");
        if kind != EngineKind::Rr {
            assert!(b <= 50.0 * 1.05 && b > 40.0, "{kind}: b {b}");
        } else {
            let s = r.stats();
            assert!(
                b > 100.0,
                "rr: a {a} b {b} {:?} {:?}",
                s.port("a").unwrap().counters,
                s.port("b").unwrap().counters
            );
        }
    }
}

/// Mean delay, µs, of the frames the uplink sends a in bursts of 4 every 2 ms (24 Mbit/s, under
/// its 30 Mbit/s share) while b is sent 120 Mbit/s, under a 60 Mbit/s downlink capacity,
/// weights equal, a at priority `a_priority`, b at the default (7); measured in steps of
/// 100 µs over the second half of 2 s.
fn bursty_delay(a_priority: u8) -> f64 {
    let mut r = rig(60, DownlinkConfig::default());
    let a = VifPolicy {
        priority: a_priority,
        ..weight(1)
    };
    set(&mut r, a, weight(1));
    let step = MS / 10;
    let mut sent_at = std::collections::VecDeque::new();
    let (mut total, mut n) = (0u64, 0u64);
    for k in 0..20_000u64 {
        if k % 20 == 0 {
            for _ in 0..4 {
                r.u.inject(big(MAC_A));
                sent_at.push_back(r.now);
            }
        }
        r.u.inject(big(MAC_B));
        r.advance(step);
        r.b.take_sent();
        for _ in r.a.take_sent() {
            let at = sent_at.pop_front().expect("a frame a was sent");
            if k >= 10_000 {
                total += r.now - at;
                n += 1;
            }
        }
    }
    assert!(n > 0);
    total as f64 / n as f64 / 1_000.0
}

/// Priority acts on the downlink: a's bursts (within its share, b backlogged) wait less when
/// a is more urgent than b than when both have the same priority: 400 against 550 µs. (Pairs of
/// frames wait 200 µs either way: fair queueing already serves a sparse vif at once; bursts of
/// 8 wait 1,100 against 1,325 µs: priority orders vifs only within a slack of the fair order,
/// so that it cannot be turned into bandwidth, docs/design.md.)
#[test]
fn priority_shortens_the_wait_of_a_vif_within_its_share() {
    let urgent = bursty_delay(0);
    let same = bursty_delay(VifPolicy::default().priority);
    println!("a's mean delay: {urgent:.0} µs at priority 0, {same:.0} µs at b's priority");
    assert!(urgent < 0.8 * same, "{urgent:.0} µs against {same:.0} µs");
}

/// A 1500-byte (on the wire) frame to `dst` carrying `seq` in its first payload bytes.
fn numbered(dst: u64, seq: u32) -> Vec<u8> {
    let mut p = [7u8; 1486];
    p[..4].copy_from_slice(&seq.to_le_bytes());
    build_frame(VnetHdr::default(), dst, MAC_U, 0x88b5, &p)
}

/// The sequence number of a frame made by [`numbered`] (virtio-net header, Ethernet header).
fn seq_of(f: &[u8]) -> u32 {
    u32::from_le_bytes(f[12 + 14..12 + 18].try_into().unwrap())
}

/// Cut-through (docs/dataplane.md, "The scheduled downlink"): while no queue holds a frame,
/// what the uplink has for a vif leaves at once, counted `tx_cut_through`; past the capacity a
/// queue forms, arrivals wait behind it, and every frame leaves in the order it came.
#[test]
fn an_idle_downlink_cuts_through_and_a_queue_keeps_the_order() {
    let mut r = rig(100, DownlinkConfig::default());
    let before = r.stats().port("a").unwrap().counters;
    // Four frames (6 KB, within the shaper's burst): sent as they are read, none queued.
    for seq in 0..4 {
        r.u.inject(numbered(MAC_A, seq));
    }
    r.run();
    let c = r.stats().port("a").unwrap().counters;
    assert_eq!(c.tx_frames - before.tx_frames, 4);
    assert_eq!(c.tx_cut_through - before.tx_cut_through, 4);
    let mut seen: Vec<u32> = r.a.take_sent().iter().map(|f| seq_of(f)).collect();
    // 600 frames (900 KB) at once, then 10 a millisecond (120 Mbit/s) over a 100 Mbit/s
    // downlink: the first go through, then a queue forms and the rest wait in it.
    let mut next = 4;
    for _ in 0..600 {
        r.u.inject(numbered(MAC_A, next));
        next += 1;
    }
    for _ in 0..200 {
        for _ in 0..10 {
            r.u.inject(numbered(MAC_A, next));
            next += 1;
        }
        r.advance(MS);
        seen.extend(r.a.take_sent().iter().map(|f| seq_of(f)));
    }
    let s = r.stats();
    let p = s.port("a").unwrap();
    let c = p.counters;
    assert!(p.queued_frames > 0, "a queue formed");
    assert!(c.tx_cut_through - before.tx_cut_through < c.tx_frames - before.tx_frames);
    assert_eq!(seen.len() as u64, c.tx_frames - before.tx_frames);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order: {:?}",
        seen.windows(2).find(|w| w[0] >= w[1])
    );
    let lost = c.drops[DropReason::QueueFull] + c.drops[DropReason::Aqm];
    assert_eq!(u64::from(next), seen.len() as u64 + lost + p.queued_frames);
}

/// A small IPv4 frame to `dst` (its own flow: not the non-IP bulk of [`numbered`]).
fn probe(dst: u64) -> Vec<u8> {
    let mut p = station_ipv4(MAC_U, 0, 46);
    p.extend_from_slice(&[9; 26]);
    build_frame(VnetHdr::default(), dst, MAC_U, 0x0800, &p)
}

fn is_probe(f: &[u8]) -> bool {
    f[12 + 12..12 + 14] == [0x08, 0x00]
}

/// How many bulk frames vif a receives between the arrival of a probe and the probe, when
/// the probe arrives behind a standing queue of about 200 bulk frames, with `flows` flow
/// queues per vif.
fn bulk_frames_before_the_probe(flows: usize) -> usize {
    let mut r = rig(
        100,
        DownlinkConfig {
            flows,
            // Repeatable: the probe's and the bulk flow's queues are the same every run.
            flow_seed: Some(1),
            ..Default::default()
        },
    );
    for seq in 0..300 {
        r.u.inject(numbered(MAC_A, seq));
    }
    r.advance(MS);
    r.a.take_sent();
    assert!(r.stats().port("a").unwrap().queued_frames > 150);
    let mut before = 0;
    r.u.inject(probe(MAC_A));
    for _ in 0..100 {
        r.advance(MS);
        let sent = r.a.take_sent();
        if let Some(i) = sent.iter().position(|f| is_probe(f)) {
            return before + i;
        }
        before += sent.len();
    }
    panic!("the probe never arrived");
}

/// Flow queues (docs/dataplane.md, "The scheduled downlink"): a frame of a new flow does not
/// wait behind another flow's standing queue to the same vif; with one flow queue per vif
/// (`flows = 1`, the FIFO of before) it does.
#[test]
fn a_sparse_flow_does_not_wait_behind_a_bulk_flow_to_the_same_vif() {
    let fifo = bulk_frames_before_the_probe(1);
    let fq = bulk_frames_before_the_probe(64);
    assert!(
        fifo >= 150,
        "{fifo} bulk frames before the probe in one FIFO"
    );
    // At most what a batch granted before the probe came takes.
    assert!(fq <= 32, "{fq} bulk frames before the probe in flow queues");
}

/// A vif's queue full of one flow takes another flow's frame by dropping the bulk flow's
/// oldest frame (counted `queue_full`), as Linux's fq_codel: with flow queues the newcomer
/// leaves before the bulk flow's backlog; with one FIFO (a drop at its head) after it.
#[test]
fn a_full_queue_makes_room_for_a_new_flow_at_the_fattest_ones_expense() {
    for flows in [1, 64] {
        let mut r = rig(
            100,
            DownlinkConfig {
                queue_frames: 16,
                flows,
                flow_seed: Some(1),
                ..Default::default()
            },
        );
        for seq in 0..200 {
            r.u.inject(numbered(MAC_A, seq));
        }
        r.run();
        let sent_before: Vec<u32> = r.a.take_sent().iter().map(|f| seq_of(f)).collect();
        let before = r.stats().port("a").unwrap().clone();
        assert_eq!(before.queued_frames, 16);
        r.u.inject(probe(MAC_A));
        r.run();
        let after = r.stats().port("a").unwrap().clone();
        let full = |p: &vqos_dataplane::PortStats| p.counters.drops[DropReason::QueueFull];
        assert_eq!(full(&after), full(&before) + 1, "one frame dropped");
        assert_eq!(after.queued_frames, 16);
        let mut order = Vec::new();
        for _ in 0..50 {
            r.advance(MS);
            order.extend(r.a.take_sent());
        }
        let at = order
            .iter()
            .position(|f| is_probe(f))
            .expect("the probe left");
        let bulk: Vec<u32> = order
            .iter()
            .filter(|f| !is_probe(f))
            .map(|f| seq_of(f))
            .collect();
        // 15 bulk frames were left: the oldest queued one made room.
        assert_eq!(bulk.len(), 15, "flows = {flows}");
        let oldest_queued = sent_before.iter().max().map_or(0, |s| s + 1);
        assert!(bulk.iter().all(|&s| s > oldest_queued), "{bulk:?}");
        if flows > 1 {
            // Behind at most what was served while the probe was being read.
            assert!(at <= 2, "flows = {flows}: the probe left {at}th");
        } else {
            assert_eq!(at, 15, "one FIFO: the probe leaves last");
        }
    }
}

/// Every frame is accounted for when large frames of one flow meet a queue of small frames
/// of another at its byte bound: each arrival is queued, and what it pushes out is counted
/// (`queue_full`).
#[test]
fn evictions_across_flows_lose_no_frame_uncounted() {
    let mut r = rig(
        20,
        DownlinkConfig {
            queue_bytes: 128 << 10,
            flow_seed: Some(3),
            ..Default::default()
        },
    );
    let mut offered = 0u64;
    let mut delivered = 0u64;
    for step in 0..12u8 {
        for seq in 0..40 {
            r.u.inject(numbered(MAC_A, u32::from(step) * 40 + seq));
        }
        // A TSO super-frame of a second flow each step: it holds more bytes than the first
        // once a few are queued, so the first flow's frames go first, then its own.
        let mut p = station_ipv4(MAC_U, 0, 20 + 20 + 8000);
        p.extend_from_slice(&[step; 8020]);
        r.u.inject(build_frame(VnetHdr::default(), MAC_A, MAC_U, 0x0800, &p));
        offered += 41;
        r.advance(MS);
        delivered += r.a.take_sent().len() as u64;
        let q = r.stats().port("a").unwrap().queued_bytes;
        assert!(q <= 128 << 10, "{q} bytes queued");
    }
    let s = r.stats();
    let p = s.port("a").unwrap();
    let c = p.counters;
    assert!(c.drops[DropReason::QueueFull] > 0, "{c:?}");
    let lost: u64 = [DropReason::QueueFull, DropReason::Aqm, DropReason::TxError]
        .iter()
        .map(|&d| c.drops[d])
        .sum();
    assert_eq!(offered, delivered + lost + p.queued_frames, "{c:?}");
}

/// An idle downlink does not keep the loop awake: once the frames it queued are sent, the
/// switch's next deadline is in the future at every later time, engine ticks included
/// (before, the downlink's engine ticked only while it had frames, so its next tick fell
/// into the past and the loop polled without sleeping until the next frame came:
/// a forwarding thread at 100 % of a core in the lab under `ancs` on two threads).
#[test]
fn an_idle_downlink_lets_the_loop_sleep() {
    for engine in [EngineKind::Ancs, EngineKind::Vqos, EngineKind::C2qos] {
        let mut r = VRig::with(
            |c| {
                c.engine = engine;
                c.capacity_bps = Some(100 * MBIT);
                c.capacity_in_bps = Some(100 * MBIT);
                c.downlink = Some(DownlinkConfig::default());
            },
            MacPolicy::default(),
        );
        r.a.inject(frame(MAC_U, MAC_A, 1));
        r.run();
        r.u.inject(big(MAC_A));
        r.run();
        assert_eq!(r.a.take_sent().len(), 1, "{engine:?}");
        for step in 1..=200u64 {
            let now = r.now + step * MS;
            let p = r.sw.poll(now);
            if r.sw.stats_due(now) {
                r.sw.stats(now);
                continue;
            }
            assert!(
                p.did_work || p.next_deadline_ns > now,
                "{engine:?} at +{step} ms: nothing to do, yet woken for {}",
                p.next_deadline_ns
            );
        }
    }
}
