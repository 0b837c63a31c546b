//! A vif whose receive queues are read on several shards (`crate::spread`), stepped in
//! virtual time on in-memory ports: its frames are read on both shards and counted once, its
//! first-come lock is the whole port's, and its cap and its weight hold across the shards
//! that read it.

mod common;

use common::*;
use vqos_dataplane::frame::{build_frame, VnetHdr};
use vqos_dataplane::{DropReason, MacPolicy, MemPort, MemPortPeer, PortSpec, Shards, SwitchConfig};
use vqos_sched::{EngineKind, VifPolicy};

const MAC_X: u64 = 0x02_00_00_00_00_0e;

/// Two shards; vif a with two queues read by shard 0 (queue 0) and shard 1 (queue 1), under
/// `a`; vif b (one queue, shard 1) under `b`. Returns the shards, the uplink's peer, a's
/// queues' peers and b's.
fn rig(
    config: impl FnOnce(&mut SwitchConfig),
    a: VifPolicy,
    a_macs: MacPolicy,
    b: VifPolicy,
) -> (Shards, MemPortPeer, Vec<MemPortPeer>, MemPortPeer) {
    let (up, u) = MemPort::pair("up", 1 << 20);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 2;
    config(&mut cfg);
    let mut sh = Shards::new(cfg, 0).unwrap();
    let (pa, qa) = MemPort::multi("a", 2, 1 << 20);
    let spec = PortSpec::custom(Box::new(pa)).with_mac_policy(a_macs);
    sh.add_port(spec, a, Some(0), 0).unwrap();
    let (pb, qb) = MemPort::pair("b", 1 << 20);
    sh.add_port(PortSpec::custom(Box::new(pb)), b, Some(1), 0)
        .unwrap();
    // The uplink's station is known (frames to it are unicast).
    u.inject(frame(BCAST, MAC_U, 0));
    run_switch(&mut sh, 0);
    let flooded: usize = qa.iter().chain([&qb]).map(|q| q.take_sent().len()).sum();
    assert_eq!(flooded, 2, "the broadcast reached a once and b once");
    (sh, u, qa, qb)
}

#[test]
fn both_shards_read_the_vif_and_count_its_frames_once() {
    let d = VifPolicy::default;
    let (mut sh, u, qa, _qb) = rig(|_| {}, d(), MacPolicy::default(), d());
    for i in 0..300u32 {
        qa[0].inject(frame(MAC_U, MAC_A, i as u8));
        qa[1].inject(frame(MAC_U, MAC_A, i as u8));
    }
    run_switch(&mut sh, 1);
    assert_eq!(u.take_sent().len(), 600);
    let s = sh.stats(2);
    let a = s.port("a").unwrap();
    assert_eq!(a.shard, 0, "its home");
    assert_eq!(
        a.readers,
        [0, 1],
        "its home, then the shard its second queue is lent to"
    );
    assert_eq!(
        s.port("b").unwrap().readers,
        [1],
        "one queue: its home alone"
    );
    assert_eq!(
        a.counters.rx_frames, 600,
        "read on both shards, summed once"
    );
    assert_eq!(s.port("up").unwrap().counters.tx_frames, 600);
    assert!(
        s.loops.iter().all(|l| l.burst_frames >= 300),
        "each shard read its queue: {:?}",
        s.loops.iter().map(|l| l.burst_frames).collect::<Vec<_>>()
    );
    // Frames to a reach it whichever shard sends them.
    u.inject(frame(MAC_A, MAC_U, 7));
    run_switch(&mut sh, 3);
    let got: usize = qa.iter().map(|q| q.take_sent().len()).sum();
    assert_eq!(got, 1);
}

#[test]
fn a_first_come_lock_is_the_whole_ports_whichever_shard_reads_the_frame() {
    let d = VifPolicy::default;
    let (mut sh, u, qa, _qb) = rig(|_| {}, d(), MacPolicy::Learn { max: 1 }, d());
    // One address locked first come, from queue 0 (shard 0)...
    qa[0].inject(frame(MAC_U, MAC_A, 1));
    run_switch(&mut sh, 1);
    // ...so a second, from queue 1 (shard 1, whose own list is empty), is refused.
    qa[1].inject(frame(MAC_U, MAC_X, 2));
    qa[1].inject(frame(MAC_U, MAC_A, 3));
    run_switch(&mut sh, 2);
    assert_eq!(tags(&u.take_sent()), vec![1, 3]);
    let s = sh.stats(3);
    let a = s.port("a").unwrap();
    assert_eq!(a.counters.drops[DropReason::Spoofed], 1);
    let mac_a = MAC_A.to_be_bytes();
    let want = vqos_api::wire::MacAddr(mac_a[2..].try_into().unwrap());
    assert_eq!(a.locked.macs, vec![want], "one lock, the whole port's");
}

/// A 1500-byte frame.
fn big(dst: u64, src: u64) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, src, 0x88b5, &[0; 1486])
}

/// Keeps every sender's queue full for 3 virtual seconds from `from_ns`; returns what each
/// source MAC of `macs` delivered to the uplink in the last second, bits.
fn drive(
    from_ns: u64,
    sh: &mut Shards,
    u: &MemPortPeer,
    senders: &[(&MemPortPeer, u64)],
    macs: &[u64],
) -> Vec<u64> {
    let mut got = vec![0u64; macs.len()];
    let step = 100_000u64;
    for k in 1..=30_000u64 {
        let now = from_ns + k * step;
        for (peer, mac) in senders {
            while peer.pending() < 32 {
                peer.inject(big(MAC_U, *mac));
            }
        }
        run_switch(sh, now);
        let sent = u.take_sent();
        if now > from_ns + 2_000_000_000 {
            count_by_source(sent, macs, &mut got, 1500 * 8);
        }
    }
    got
}

#[test]
fn a_vifs_max_holds_across_the_shards_that_read_it() {
    let capped = VifPolicy {
        max_bps: Some(20_000_000),
        ..VifPolicy::default()
    };
    let (mut sh, u, qa, _qb) = rig(
        |c| c.engine = EngineKind::Vqos,
        capped,
        MacPolicy::default(),
        VifPolicy::default(),
    );
    let got = drive(
        0,
        &mut sh,
        &u,
        &[(&qa[0], MAC_A), (&qa[1], MAC_A)],
        &[MAC_A],
    );
    // Each shard alone would let 20 through: 40 in all.
    let err = (got[0] as f64 - 20e6).abs() / 20e6;
    assert!(err <= 0.01, "a got {} bit/s, max 20 Mbit/s", got[0]);
}

#[test]
fn weights_hold_when_a_vif_is_read_on_two_shards() {
    let w = |weight| VifPolicy {
        weight,
        ..VifPolicy::default()
    };
    let (mut sh, u, qa, qb) = rig(
        |c| {
            c.engine = EngineKind::Vqos;
            c.capacity_bps = Some(60_000_000);
        },
        w(1),
        MacPolicy::default(),
        w(2),
    );
    let senders = [(&qa[0], MAC_A), (&qa[1], MAC_A), (&qb, MAC_B)];
    let got = drive(0, &mut sh, &u, &senders, &[MAC_A, MAC_B]);
    for (g, want) in got.iter().zip([20e6, 40e6]) {
        let err = (*g as f64 - want).abs() / want;
        assert!(err <= 0.01, "got {got:?}, reference [20, 40] Mbit/s");
    }
}

#[test]
fn a_vif_read_on_two_shards_floods_no_more_than_its_storm_budget() {
    let d = VifPolicy::default;
    let (mut sh, u, qa, _qb) = rig(|c| c.storm_pps = 100, d(), MacPolicy::default(), d());
    drop(u.take_sent());
    // A burst of broadcasts on both queues at once: the port's budget is 100 frames (a
    // second's worth), split between the two shards that read it.
    for i in 0..300u32 {
        qa[0].inject(frame(BCAST, MAC_A, i as u8));
        qa[1].inject(frame(BCAST, MAC_A, i as u8));
    }
    run_switch(&mut sh, 1);
    let s = sh.stats(2);
    let a = s.port("a").unwrap();
    assert_eq!(
        u.take_sent().len(),
        100,
        "one port's budget, not one per shard"
    );
    assert_eq!(a.counters.drops[DropReason::Storm], 500);
}

/// The uplink read on two shards (the scheduled downlink, an uplink with two receive
/// queues): broadcasts from the network arriving on both queues pass no more than one
/// `storm_pps` budget in all, each reader holding its half.
#[test]
fn the_uplink_read_on_two_shards_floods_no_more_than_its_storm_budget() {
    let (up, uq) = MemPort::multi("up", 2, 1 << 20);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 2;
    cfg.storm_pps = 100;
    cfg.downlink = Some(vqos_dataplane::DownlinkConfig::default());
    let mut sh = Shards::new(cfg, 0).unwrap();
    let (pa, qa) = MemPort::pair("a", 1 << 20);
    sh.add_port(
        PortSpec::custom(Box::new(pa)),
        VifPolicy::default(),
        Some(0),
        0,
    )
    .unwrap();
    for i in 0..300u32 {
        uq[0].inject(frame(BCAST, MAC_U, i as u8));
        uq[1].inject(frame(BCAST, MAC_U, i as u8));
    }
    run_switch(&mut sh, 1);
    let s = sh.stats(2);
    let up = s.port("up").unwrap();
    assert_eq!(up.counters.rx_frames, 600, "both queues read");
    assert_eq!(
        qa.take_sent().len(),
        100,
        "one uplink's budget, not one per reader"
    );
    assert_eq!(up.counters.drops[DropReason::Storm], 500);
}

/// Three shards: a, b and c with one queue each (shards 0, 1 and 2, as they came), then z
/// with two queues under `z` (home 0, the least loaded, its second queue lent to shard 1),
/// a first-come lock of one address; its address locked and the uplink's station learnt.
fn three(
    config: impl FnOnce(&mut SwitchConfig),
    z: VifPolicy,
) -> (Shards, MemPortPeer, Vec<MemPortPeer>) {
    let (up, u) = MemPort::pair("up", 1 << 20);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 3;
    config(&mut cfg);
    let mut sh = Shards::new(cfg, 0).unwrap();
    for name in ["a", "b", "c"] {
        let (p, _peer) = MemPort::pair(name, 1 << 20);
        sh.add_port(PortSpec::custom(Box::new(p)), VifPolicy::default(), None, 0)
            .unwrap();
    }
    let (pz, qz) = MemPort::multi("z", 2, 1 << 20);
    let spec = PortSpec::custom(Box::new(pz)).with_mac_policy(MacPolicy::Learn { max: 1 });
    sh.add_port(spec, z, None, 0).unwrap();
    let s = sh.stats(0);
    let where_ = |n: &str| s.port(n).map(|p| (p.shard, p.readers.clone()));
    assert_eq!(where_("c"), Some((2, vec![2])));
    assert_eq!(where_("z"), Some((0, vec![0, 1])));
    u.inject(frame(BCAST, MAC_U, 0));
    qz[0].inject(frame(MAC_U, MAC_A, 0));
    run_switch(&mut sh, 1);
    assert_eq!(u.take_sent().len(), 1);
    (sh, u, qz)
}

/// A vif read on several shards counts on each when ports are placed and re-placed: with
/// a, b, c on shards 0, 1, 2 and z's queues on 0 and 1, a new port goes to shard 2 (counting
/// homes alone, shard 1 would look as loaded as 2, and win as the lower), and removing b
/// leaves 2, 1 and 2 queues: nothing moves.
#[test]
fn a_vif_read_on_two_shards_counts_on_both_when_ports_are_placed() {
    let (mut sh, u, qz) = three(|_| {}, VifPolicy::default());
    let (pw, _w) = MemPort::pair("w", 1 << 20);
    sh.add_port(
        PortSpec::custom(Box::new(pw)),
        VifPolicy::default(),
        None,
        2,
    )
    .unwrap();
    assert_eq!(sh.stats(3).port("w").unwrap().shard, 2);
    sh.remove_port("b", 4).unwrap();
    let s = sh.stats(5);
    let at = |n: &str| s.port(n).map(|p| (p.shard, p.readers.clone()));
    assert_eq!(at("a"), Some((0, vec![0])), "2, 1 and 2 queues: a stays");
    assert_eq!(at("z"), Some((0, vec![0, 1])));
    for i in 0..10u8 {
        qz[0].inject(frame(MAC_U, MAC_A, i));
        qz[1].inject(frame(MAC_U, MAC_A, i));
    }
    run_switch(&mut sh, 6);
    assert_eq!(u.take_sent().len(), 20);
}

/// When its neighbours go, a spread vif's queues move like any port's: its home (the port
/// itself) to the shard c left, then the queue lent to shard 1 to the shard a left; the
/// frames that waited in both queues are read once, its lock stays the whole port's, and
/// its max holds over its new readers.
#[test]
fn a_spread_vifs_queues_move_to_the_shards_its_neighbours_left() {
    let capped = VifPolicy {
        max_bps: Some(20_000_000),
        ..VifPolicy::default()
    };
    let (mut sh, u, qz) = three(|c| c.engine = EngineKind::Vqos, capped);
    for i in 0..30u8 {
        qz[0].inject(frame(MAC_U, MAC_A, i));
    }
    for i in 0..40u8 {
        qz[1].inject(frame(MAC_U, MAC_A, i));
    }
    sh.remove_port("c", 2).unwrap();
    let s = sh.stats(2);
    let z = s.port("z").unwrap();
    assert_eq!(
        (z.shard, z.readers.clone()),
        (2, vec![2, 1]),
        "its home moved"
    );
    sh.remove_port("a", 3).unwrap();
    let s = sh.stats(3);
    let z = s.port("z").unwrap();
    assert_eq!(
        (z.shard, z.readers.clone()),
        (2, vec![2, 0]),
        "its lent queue moved"
    );
    assert_eq!(s.port("b").unwrap().shard, 1);
    // (20 Mbit/s divided between the readers every 10 ms: 70 frames take a few ms.)
    const T: u64 = 100_000_000;
    for t in (4..=T).step_by(1_000_000) {
        run_switch(&mut sh, t);
    }
    assert_eq!(u.take_sent().len(), 70, "every frame that waited, once");
    let s = sh.stats(T);
    assert_eq!(s.port("z").unwrap().counters.rx_frames, 71);
    assert!(s.loops[0].burst_frames >= 40 && s.loops[2].burst_frames >= 30);
    // A second address is refused whichever new reader sees it.
    qz[0].inject(frame(MAC_U, MAC_X, 1));
    qz[1].inject(frame(MAC_U, MAC_X, 2));
    run_switch(&mut sh, T + 1);
    let s = sh.stats(T + 1);
    assert_eq!(s.port("z").unwrap().counters.drops[DropReason::Spoofed], 2);
    // The max is divided between the readers the vif has now.
    let got = drive(
        2 * T,
        &mut sh,
        &u,
        &[(&qz[0], MAC_A), (&qz[1], MAC_A)],
        &[MAC_A],
    );
    let err = (got[0] as f64 - 20e6).abs() / 20e6;
    assert!(err <= 0.01, "z got {} bit/s, max 20 Mbit/s", got[0]);
}

/// After the same moves, each of the vif's new readers floods at most its part of the port's
/// storm budget: one budget in all, not one per reader.
#[test]
fn a_spread_vif_moved_floods_no_more_than_its_storm_budget() {
    let (mut sh, u, qz) = three(|c| c.storm_pps = 100, VifPolicy::default());
    sh.remove_port("c", 2).unwrap();
    sh.remove_port("a", 3).unwrap();
    assert_eq!(sh.stats(3).port("z").unwrap().readers, [2, 0]);
    for i in 0..300u32 {
        qz[0].inject(frame(BCAST, MAC_A, i as u8));
        qz[1].inject(frame(BCAST, MAC_A, i as u8));
    }
    run_switch(&mut sh, 4);
    assert_eq!(
        u.take_sent().len(),
        100,
        "one port's budget, not one per reader"
    );
    let s = sh.stats(4);
    assert_eq!(s.port("z").unwrap().counters.drops[DropReason::Storm], 500);
}

/// A vif's further queues go to the least loaded shards, not simply the next ones: with a
/// on shard 1 of three, z's home is shard 0 and its second queue goes to shard 2 (in turn
/// after the home it would have gone to shard 1, which reads a already).
#[test]
fn a_vifs_queues_are_lent_to_the_least_loaded_shards() {
    let (up, _u) = MemPort::pair("up", 1 << 20);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 3;
    let mut sh = Shards::new(cfg, 0).unwrap();
    let (pa, _a) = MemPort::pair("a", 1 << 20);
    sh.add_port(
        PortSpec::custom(Box::new(pa)),
        VifPolicy::default(),
        Some(1),
        0,
    )
    .unwrap();
    let (pz, _qz) = MemPort::multi("z", 2, 1 << 20);
    sh.add_port(
        PortSpec::custom(Box::new(pz)),
        VifPolicy::default(),
        None,
        0,
    )
    .unwrap();
    assert_eq!(sh.stats(1).port("z").unwrap().readers, [0, 2]);
    // Every shard reads one queue now, and shard 2 is home to none: a vif of three queues
    // gets its home there, then shard 0 and shard 1 in turn.
    let (py, _qy) = MemPort::multi("y", 3, 1 << 20);
    sh.add_port(
        PortSpec::custom(Box::new(py)),
        VifPolicy::default(),
        None,
        0,
    )
    .unwrap();
    assert_eq!(sh.stats(2).port("y").unwrap().shard, 2);
    assert_eq!(sh.stats(2).port("y").unwrap().readers, [2, 0, 1]);
}
