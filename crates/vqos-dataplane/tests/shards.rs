//! Shards stepped in virtual time on in-memory ports ([`Shards`]): what `threads = N` runs,
//! without threads. Frames cross shards (unicast, floods), addresses learnt or locked on one
//! shard bind the others, nothing is lost (read = forwarded + named drops), ports come and go
//! while frames flow, and N shards divide a capacity as one shard does.

mod common;

use common::*;
use vqos_dataplane::frame::{build_frame, VnetHdr};
use vqos_dataplane::{
    DropReason, MemPort, MemPortPeer, PortSpec, Shards, SwitchConfig, SwitchStats,
};
use vqos_sched::alloc::allocate_set;
use vqos_sched::{EngineKind, PolicySet, VifPolicy, VifSpec};

const MAC_C: u64 = 0x02_00_00_00_00_0c;
const MAC_D: u64 = 0x02_00_00_00_00_0d;

/// Polls every shard at `now` until a whole round reads nothing ([`run_switch`]).
fn run(shards: &mut Shards, now: u64) {
    run_switch(shards, now);
}

/// Shards of `config` with vifs `names` (MemPorts), each read by the shard given beside it.
fn rig(
    config: impl FnOnce(&mut SwitchConfig),
    vifs: &[(&str, usize, VifPolicy)],
) -> (Shards, MemPortPeer, Vec<MemPortPeer>) {
    let (up, u) = MemPort::pair("up", 1 << 20);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 2;
    config(&mut cfg);
    let mut shards = Shards::new(cfg, 0).unwrap();
    let mut peers = Vec::new();
    for (name, home, policy) in vifs {
        let (p, peer) = MemPort::pair(name, 1 << 20);
        shards
            .add_port(
                PortSpec::custom(Box::new(p)),
                policy.clone(),
                Some(*home),
                0,
            )
            .unwrap();
        peers.push(peer);
    }
    (shards, u, peers)
}

fn port<'a>(s: &'a SwitchStats, name: &str) -> &'a vqos_dataplane::PortStats {
    s.port(name).unwrap()
}

/// Every frame sent to a port is in its counters once, whichever shard sent it.
fn assert_delivered(s: &SwitchStats, delivered: &[(&str, usize)]) {
    for (name, n) in delivered {
        assert_eq!(port(s, name).counters.tx_frames, *n as u64, "{name}");
    }
}

#[test]
fn frames_cross_shards_and_addresses_bind_every_shard() {
    let d = VifPolicy::default;
    // a and c on shard 0, b and e on shard 1.
    let (mut sh, u, p) = rig(
        |_| {},
        &[("a", 0, d()), ("b", 1, d()), ("c", 0, d()), ("e", 1, d())],
    );
    let (a, b, c, e) = (&p[0], &p[1], &p[2], &p[3]);
    let stats = sh.stats(0);
    assert_eq!(
        ["up", "a", "b", "c", "e"].map(|n| port(&stats, n).shard),
        [0, 0, 1, 0, 1]
    );
    // a broadcasts from shard 0: every other port, on both shards, gets it.
    a.inject(frame(BCAST, MAC_A, 1));
    run(&mut sh, 1);
    for (name, peer) in [("up", &u), ("b", b), ("c", c), ("e", e)] {
        assert_eq!(tags(&peer.take_sent()), vec![1], "{name}");
    }
    // b (shard 1) answers a by unicast: learnt on shard 0, found on shard 1.
    b.inject(frame(MAC_A, MAC_B, 2));
    run(&mut sh, 2);
    assert_eq!(tags(&a.take_sent()), vec![2]);
    assert!(u.take_sent().is_empty() && c.take_sent().is_empty() && e.take_sent().is_empty());
    // c (shard 0) claims b's address (locked on shard 1): spoofed; e (shard 1) claims a's.
    c.inject(frame(MAC_A, MAC_B, 3));
    e.inject(frame(MAC_B, MAC_A, 4));
    run(&mut sh, 3);
    assert!(a.take_sent().is_empty() && b.take_sent().is_empty());
    let s = sh.stats(3);
    assert_eq!(port(&s, "c").counters.drops[DropReason::Spoofed], 1);
    assert_eq!(port(&s, "e").counters.drops[DropReason::Spoofed], 1);
    // Many frames both ways across the shards: every one delivered and counted once.
    for i in 0..500u32 {
        a.inject(frame(MAC_B, MAC_A, i as u8));
        b.inject(frame(MAC_A, MAC_B, i as u8));
        c.inject(frame(MAC_D, MAC_C, i as u8)); // unknown: to the uplink only
    }
    run(&mut sh, 4);
    assert_eq!(b.take_sent().len(), 500);
    assert_eq!(a.take_sent().len(), 500);
    assert_eq!(u.take_sent().len(), 500);
    let s = sh.stats(4);
    // a: the broadcast and 500; b: the reply and 500; the uplink: the broadcast and c's 500.
    assert_delivered(&s, &[("a", 501), ("b", 501), ("up", 501)]);
    // Read = forwarded + named drops, per sender.
    for (name, forwarded) in [("a", 501), ("b", 501), ("c", 500), ("e", 0)] {
        let c = &port(&s, name).counters;
        assert_eq!(c.rx_frames, forwarded + c.drops.total(), "{name}");
    }
    assert_eq!(s.loops.len(), 2);
    assert_eq!(
        s.loops_total().burst_frames,
        s.loops.iter().map(|l| l.burst_frames).sum::<u64>()
    );
}

#[test]
fn ports_come_and_go_while_frames_flow() {
    let d = VifPolicy::default;
    let (mut sh, u, p) = rig(|_| {}, &[("a", 0, d()), ("b", 1, d())]);
    let (a, b) = (&p[0], &p[1]);
    b.inject(frame(BCAST, MAC_B, 0));
    run(&mut sh, 1);
    u.take_sent();
    a.take_sent();
    for i in 0..100u8 {
        a.inject(frame(MAC_B, MAC_A, i));
    }
    // Removed while a's frames to it wait: they go nowhere (b's address is forgotten, so
    // they are unknown unicast: to the uplink), nothing is lost or delivered to b after.
    sh.remove_port("b", 2).unwrap();
    run(&mut sh, 2);
    assert!(b.take_sent().is_empty());
    assert_eq!(u.take_sent().len(), 100);
    // A new port takes b's slot and is read by the least loaded shard (shard 1 now).
    let (pc, c) = MemPort::pair("c", 1 << 20);
    sh.add_port(PortSpec::custom(Box::new(pc)), d(), None, 3)
        .unwrap();
    let s = sh.stats(3);
    assert_eq!(port(&s, "c").shard, 1);
    assert!(sh.iter_mut().all(|s| s.policy_epoch() >= 1));
    c.inject(frame(MAC_A, MAC_C, 7));
    run(&mut sh, 4);
    assert_eq!(tags(&a.take_sent()), vec![7]);
    // Refused ports change nothing on any shard.
    let (dup, _) = MemPort::pair("a", 16);
    assert!(sh
        .add_port(PortSpec::custom(Box::new(dup)), d(), None, 5)
        .is_err());
    assert!(sh.remove_port("zz", 5).is_err());
    assert_eq!(sh.policies().len(), 2);
}

/// A 1500-byte frame.
fn big(dst: u64, src: u64) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, src, 0x88b5, &[0; 1486])
}

/// Runs vifs a, b, c (weights 1, 2, 3; b sending at most `b_bps`) under a 60 Mbit/s capacity
/// for 3 virtual seconds on `threads` shards (a and c on shard 0, b on shard 1); returns what
/// each delivered to the uplink in the last second, bits.
fn three_vifs(threads: usize, b_bps: Option<u64>) -> [u64; 3] {
    three_vifs_then(threads, b_bps, None)
}

/// [`three_vifs`], the capacity set to `then_bps` (if any) at 1.5 s.
fn three_vifs_then(threads: usize, b_bps: Option<u64>, then_bps: Option<u64>) -> [u64; 3] {
    let w = |weight| VifPolicy {
        weight,
        ..VifPolicy::default()
    };
    let homes = if threads == 1 { [0, 0, 0] } else { [0, 1, 0] };
    let (mut sh, u, p) = rig(
        |c| {
            c.threads = threads;
            c.engine = EngineKind::Vqos;
            c.capacity_bps = Some(60_000_000);
        },
        &[
            ("a", homes[0], w(1)),
            ("b", homes[1], w(2)),
            ("c", homes[2], w(3)),
        ],
    );
    // The uplink's station is known (frames to it are unicast, not storm-controlled floods).
    u.inject(frame(BCAST, MAC_U, 0));
    run(&mut sh, 0);
    p.iter().for_each(|peer| drop(peer.take_sent()));
    let macs = [MAC_A, MAC_B, MAC_C];
    let step = 100_000u64;
    let mut b_credit = 0u64;
    let mut got = [0u64; 3];
    for k in 1..=30_000u64 {
        let now = k * step;
        if let (Some(c), 15_000) = (then_bps, k) {
            let mut set = (**sh.policies()).clone();
            set.capacity_bps = Some(c);
            sh.set_policies(set, now).unwrap();
        }
        for (i, peer) in p.iter().enumerate() {
            if i == 1 {
                if let Some(rate) = b_bps {
                    b_credit += rate * step / 1_000_000_000;
                    while b_credit >= 1500 * 8 {
                        b_credit -= 1500 * 8;
                        peer.inject(big(MAC_U, macs[i]));
                    }
                    continue;
                }
            }
            while peer.pending() < 32 {
                peer.inject(big(MAC_U, macs[i]));
            }
        }
        run(&mut sh, now);
        let sent = u.take_sent();
        if now > 2_000_000_000 {
            count_by_source(sent, &macs, &mut got, 1500 * 8);
        }
    }
    got
}

/// The reference allocation of 60 Mbit/s to weights 1, 2, 3 with b wanting `b_bps`.
fn reference(b_bps: Option<u64>) -> Vec<u64> {
    reference_at(60_000_000, b_bps)
}

/// The reference allocation of `capacity` to weights 1, 2, 3 with b wanting `b_bps`.
fn reference_at(capacity: u64, b_bps: Option<u64>) -> Vec<u64> {
    let mut set = PolicySet::new(Some(capacity));
    for (name, weight) in [("a", 1), ("b", 2), ("c", 3)] {
        set.vifs.push(VifSpec {
            name: name.into(),
            policy: VifPolicy {
                weight,
                ..VifPolicy::default()
            },
        });
    }
    allocate_set(&set, &[None, b_bps, None]).unwrap()
}

fn assert_within(got: &[u64; 3], want: &[u64], tol: f64, what: &str) {
    for i in 0..3 {
        let err = (got[i] as f64 - want[i] as f64).abs() / want[i] as f64;
        assert!(
            err <= tol,
            "{what}: vif {i} got {got:?}, reference {want:?}"
        );
    }
}

#[test]
fn two_shards_divide_the_capacity_as_the_reference_allocator() {
    for b_bps in [None, Some(5_000_000)] {
        let want = reference(b_bps);
        let two = three_vifs(2, b_bps);
        assert_within(&two, &want, 0.01, &format!("2 shards, b at {b_bps:?}"));
        let one = three_vifs(1, b_bps);
        assert_within(&one, &want, 0.01, &format!("1 shard, b at {b_bps:?}"));
    }
}

#[test]
fn a_port_with_queues_of_its_own_is_sent_to_from_every_shard_and_counted_once() {
    use vqos_dataplane::null::NULL_UPLINK_MAC;
    use vqos_dataplane::{MacPolicy, NullPort};
    let up = NullPort::sink("up").unwrap();
    let mut cfg = SwitchConfig::new(
        PortSpec::custom(Box::new(up)).with_mac_policy(MacPolicy::Fixed(vec![NULL_UPLINK_MAC])),
    );
    cfg.threads = 2;
    cfg.storm_pps = 0;
    let mut sh = Shards::new(cfg, 0).unwrap();
    for name in ["a", "b"] {
        let p = NullPort::vif(name, 64).unwrap();
        sh.add_port(PortSpec::custom(Box::new(p)), VifPolicy::default(), None, 0)
            .unwrap();
    }
    // Null vifs always have frames: a fixed number of polls per shard.
    for now in 1..=200u64 {
        for sw in sh.iter_mut() {
            sw.mark_all_ready(false);
            sw.poll(now);
        }
    }
    let s = sh.stats(201);
    let (a, b, up) = (port(&s, "a"), port(&s, "b"), port(&s, "up"));
    assert_eq!((a.shard, b.shard), (0, 1));
    assert!(a.counters.rx_frames > 0 && b.counters.rx_frames > 0);
    let read = a.counters.rx_frames + b.counters.rx_frames;
    assert_eq!(
        up.counters.tx_frames, read,
        "every frame read reached the uplink"
    );
    assert_eq!(a.counters.drops.total() + b.counters.drops.total(), 0);
}

#[test]
fn a_new_capacity_is_divided_anew_and_never_run_at_an_old_part() {
    // 60 → 20 Mbit/s at 1.5 s: the last second is the reference of 20 on two shards.
    let want = reference_at(20_000_000, Some(5_000_000));
    let got = three_vifs_then(2, Some(5_000_000), Some(20_000_000));
    assert_within(
        &got,
        &want,
        0.01,
        "2 shards after the capacity fell to 20 Mbit/s",
    );
}

/// The scheduled downlink on two shards: what the uplink sends to a (shard 0) and b (shard
/// 1), weights 1 and 3, is divided by shard 0's downlink at `capacity_in` (60 Mbit/s: 15 and
/// 45), and a vif-to-vif frame from b to a crosses to shard 1's downlink and arrives.
#[test]
fn the_downlink_on_two_shards_gives_the_weights_shares_and_carries_vif_to_vif() {
    let w = |weight| VifPolicy {
        weight,
        ..VifPolicy::default()
    };
    let (mut sh, u, p) = rig(
        |c| {
            c.engine = EngineKind::Vqos;
            c.capacity_in_bps = Some(60_000_000);
            c.downlink = Some(vqos_dataplane::DownlinkConfig::default());
        },
        &[("a", 0, w(1)), ("b", 1, w(3))],
    );
    for (peer, mac) in p.iter().zip([MAC_A, MAC_B]) {
        peer.inject(frame(MAC_U, mac, 0));
    }
    run(&mut sh, 0);
    u.take_sent();
    // b → a: read on shard 1, queued on its downlink, delivered to a.
    p[1].inject(frame(MAC_A, MAC_B, 9));
    run(&mut sh, 1);
    assert_eq!(tags(&p[0].take_sent()), vec![9]);
    let step = 100_000u64;
    let mut got = [0u64; 2];
    for k in 1..=20_000u64 {
        let now = k * step;
        // 1.8 frames per step each (216 Mbit/s): both over their share.
        for mac in [MAC_A, MAC_B] {
            if k % 5 != 0 {
                u.inject(big(mac, MAC_U));
            }
            u.inject(big(mac, MAC_U));
        }
        run(&mut sh, now);
        for (g, peer) in got.iter_mut().zip(&p) {
            let n = peer.take_sent().len() as u64;
            if now > 1_000_000_000 {
                *g += n * 1500 * 8;
            }
        }
    }
    // Over the last second: 15 and 45 Mbit/s within 3 %.
    for (g, want) in got.iter().zip([15_000_000u64, 45_000_000]) {
        assert!(g.abs_diff(want) <= want * 3 / 100, "{got:?}");
    }
    let s = sh.stats(20_000 * step);
    assert!(port(&s, "b").counters.drops[DropReason::QueueFull] > 0);
}

/// Two senders to vif c for 2 virtual seconds on two shards, every frame 1500 bytes: the
/// uplink (read by shard 0, so queued on shard 0's downlink) at 240 Mbit/s, and vif b (read
/// by shard 1, so queued on shard 1's downlink) as fast as the switch takes it; the uplink
/// also sends to a (shard 0) at 240 Mbit/s. Returns what a received from the uplink, and what
/// c received from the uplink and from b, over the last second, bits.
fn into_c_from_both_shards(
    config: impl FnOnce(&mut SwitchConfig),
    a: VifPolicy,
    c: VifPolicy,
) -> [u64; 3] {
    let (mut sh, u, p) = rig(
        |cfg| {
            cfg.engine = EngineKind::Vqos;
            cfg.downlink = Some(vqos_dataplane::DownlinkConfig::default());
            config(cfg);
        },
        &[("a", 0, a), ("b", 1, VifPolicy::default()), ("c", 1, c)],
    );
    for (peer, mac) in p.iter().zip([MAC_A, MAC_B, MAC_C]) {
        peer.inject(frame(MAC_U, mac, 0));
    }
    u.inject(frame(BCAST, MAC_U, 0));
    run(&mut sh, 0);
    p.iter().for_each(|peer| drop(peer.take_sent()));
    u.take_sent();
    let step = 100_000u64;
    let mut got = [0u64; 3];
    for k in 1..=20_000u64 {
        let now = k * step;
        for _ in 0..2 {
            u.inject(big(MAC_A, MAC_U));
            u.inject(big(MAC_C, MAC_U));
        }
        while p[1].pending() < 32 {
            p[1].inject(big(MAC_C, MAC_B));
        }
        run(&mut sh, now);
        let from_a = p[0].take_sent().len() as u64;
        let into_c = p[2].take_sent();
        let from_b = into_c
            .iter()
            .filter(|f| f[18..24] == MAC_B.to_be_bytes()[2..])
            .count() as u64;
        if now > 1_000_000_000 {
            got[0] += from_a * 1500 * 8;
            got[1] += (into_c.len() as u64 - from_b) * 1500 * 8;
            got[2] += from_b * 1500 * 8;
        }
    }
    let s = sh.stats(20_000 * step);
    let c_rx = port(&s, "c").counters.tx_frames;
    assert!(c_rx > 0, "c received nothing");
    got
}

/// A vif's inbound max is one limit whichever shards its frames cross: c (`max_in` 20
/// Mbit/s) receives from the uplink on shard 0 and from b on shard 1 at once, and gets 20
/// Mbit/s in all (not 20 per shard), divided between its two senders as the reference
/// allocator divides it between two greedy demands (10 and 10).
#[test]
fn a_vifs_inbound_max_holds_across_the_shards_that_carry_its_frames() {
    let c = VifPolicy {
        max_in_bps: Some(20_000_000),
        ..VifPolicy::default()
    };
    let got = into_c_from_both_shards(|_| {}, VifPolicy::default(), c);
    let total = got[1] + got[2];
    assert!(
        (19_000_000..=20_200_000).contains(&total),
        "c received {total} bit/s in all (uplink {}, b {}), max 20 Mbit/s",
        got[1],
        got[2]
    );
    for from in [got[1], got[2]] {
        assert!(from.abs_diff(10_000_000) <= 1_000_000, "{got:?}");
    }
}

/// The downlink capacity is one capacity over the shards: `capacity_in` 60 Mbit/s, a
/// (weight 1) fed by the uplink on shard 0 and c (weight 3) fed by the uplink on shard 0 and
/// by b on shard 1: a 15, c 45 Mbit/s, as one shard would give.
#[test]
fn the_downlink_capacity_is_divided_across_shards_by_the_weights() {
    let w = |weight| VifPolicy {
        weight,
        ..VifPolicy::default()
    };
    let got = into_c_from_both_shards(|c| c.capacity_in_bps = Some(60_000_000), w(1), w(3));
    let c = got[1] + got[2];
    assert!(got[0].abs_diff(15_000_000) <= 15_000_000 / 50, "a: {got:?}");
    assert!(c.abs_diff(45_000_000) <= 45_000_000 / 50, "c: {got:?}");
}

/// A vif whose frames wait without a new readiness event (a vhost-user guest kicks once,
/// then waits for the switch to drain its ring) is served to the end while its shard's part
/// of the capacity moves: configuring the engine for a new part must not forget that the vif
/// is ready. (Without it a QEMU guest's TCP stalled on two threads after the first division.)
#[test]
fn a_ready_vif_stays_ready_when_its_shards_part_moves() {
    let d = VifPolicy::default;
    let (mut sh, u, p) = rig(
        |c| {
            c.engine = EngineKind::Vqos;
            c.capacity_bps = Some(60_000_000);
        },
        &[("a", 0, d()), ("b", 1, d())],
    );
    u.inject(frame(BCAST, MAC_U, 0));
    run(&mut sh, 0);
    p.iter().for_each(|peer| drop(peer.take_sent()));
    for _ in 0..2_000 {
        p[0].inject(big(MAC_U, MAC_A));
    }
    // One readiness event, as one kick.
    for sw in sh.iter_mut() {
        sw.mark_all_ready(false);
    }
    let mut got = 0;
    for k in 1..=20_000u64 {
        let now = k * 100_000;
        for sw in sh.iter_mut() {
            while sw.poll(now).did_work {}
        }
        got += u.take_sent().len();
    }
    // 2,000 frames of 1,500 bytes at up to 60 Mbit/s take 0.4 s of the 2 s run.
    assert_eq!(got, 2_000, "a's frames all read ({} left)", p[0].pending());
}

/// A port's readers are a bit each of a 64-bit set: 64 shards build, 65 are refused by name.
#[test]
fn more_than_sixty_four_shards_are_refused() {
    let make = |threads| {
        let (up, _u) = MemPort::pair("up", 1);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
        cfg.threads = threads;
        Shards::new(cfg, 0).map(|s| s.len())
    };
    assert_eq!(make(64).unwrap(), 64);
    let e = make(65).unwrap_err().to_string();
    assert!(e.contains("65 threads: at most 64"), "{e}");
}
