//! Wall-clock tests of the thread wrapper ([`SwitchHandle`]): the loop thread forwards in both
//! readiness modes, control calls are answered even by a slow loop and never undo each other,
//! ports are closed off the loop thread, readiness is collected while the loop stays busy, and
//! the loop's health is visible. The switch's behaviour itself is tested in virtual time
//! (tests/mem.rs); these tests only wait for what a thread must do, with generous deadlines.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vqos_dataplane::frame::{build_frame, VnetHdr};
use vqos_dataplane::{
    Batch, MemPort, MemPortPeer, Port, PortError, PortIoCounters, PortSpec, Readiness,
    SwitchConfig, SwitchError, SwitchHandle, SwitchStats,
};
use vqos_sched::{EngineKind, VifPolicy};

/// Polls `cond` for up to 3 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("timed out waiting for: {what}");
}

/// Waits until `n` frames were sent to `peer` and returns them.
fn collect(peer: &MemPortPeer, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    eventually(&format!("{n} frames"), || {
        got.extend(peer.take_sent());
        got.len() >= n
    });
    got
}

/// Waits for a stats snapshot satisfying `cond`.
fn stats_where(sw: &SwitchHandle, mut cond: impl FnMut(&SwitchStats) -> bool) -> Arc<SwitchStats> {
    let mut last = sw.stats();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !cond(&last) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for stats; loops {:?}; last: {:?}",
            last.loops
                .iter()
                .map(|l| l.burst_frames)
                .collect::<Vec<_>>(),
            last.ports
                .iter()
                .map(|p| (&p.name, p.counters.rx_frames, p.counters.tx_frames))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(2));
        last = sw.stats();
    }
    last
}

struct Rig {
    sw: SwitchHandle,
    u: MemPortPeer,
    a: MemPortPeer,
    b: MemPortPeer,
}

fn rig_with(config: impl FnOnce(&mut SwitchConfig)) -> Rig {
    let (up, u) = MemPort::pair("up", 10_000);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    config(&mut cfg);
    let sw = SwitchHandle::start(cfg).unwrap();
    let (pa, a) = MemPort::pair("a", 10_000);
    sw.add_port(PortSpec::custom(Box::new(pa)), VifPolicy::default())
        .unwrap();
    let (pb, b) = MemPort::pair("b", 10_000);
    sw.add_port(PortSpec::custom(Box::new(pb)), VifPolicy::default())
        .unwrap();
    Rig { sw, u, a, b }
}

fn rig() -> Rig {
    rig_with(|_| {})
}

#[test]
fn the_loop_thread_forwards_in_both_readiness_modes_and_counts_its_cycles() {
    for readiness in [Readiness::Epoll, Readiness::BusyPoll] {
        let r = rig_with(|c| c.readiness = readiness);
        r.a.inject(frame(BCAST, MAC_A, 1));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), 1);
        assert_eq!(tag_of(&collect(&r.b, 1)[0]), 1);
        r.u.inject(frame(MAC_A, MAC_U, 2));
        assert_eq!(tag_of(&collect(&r.a, 1)[0]), 2);
        let s = stats_where(&r.sw, |s| {
            s.port("a").is_some_and(|p| p.counters.tx_frames == 1)
                && s.loops_total().busy_cycles > 0
                && s.loops_total().idle_cycles > 0
        });
        assert_eq!(s.port("a").unwrap().counters.rx_frames, 1);
        assert!(
            s.loops[0].commands >= 2,
            "the two ports' additions, at least"
        );
        r.sw.stop().unwrap();
        assert!(matches!(
            r.sw.add_port(
                PortSpec::custom(Box::new(MemPort::pair("x", 1).0)),
                VifPolicy::default()
            ),
            Err(SwitchError::Stopped)
        ));
    }
}

#[test]
fn removed_and_refused_ports_are_closed_off_the_loop_thread() {
    let (engine, _log) = Refuser::new(&[]);
    let r = rig_with(|c| c.custom_engine = Some(Box::new(engine)));
    let (p, _peer, log) = spy("s");
    r.sw.add_port(PortSpec::custom(Box::new(p)), VifPolicy::default())
        .unwrap();
    r.sw.remove_port("s").unwrap();
    let on = log.dropped_on.lock().unwrap().clone();
    assert!(on.is_some(), "dropped");
    assert!(
        !on.as_deref().unwrap_or("").starts_with("vqos-loop"),
        "dropped on {on:?}"
    );
    // Refused by the engine (weight 99) once the loop holds it.
    let (p, _peer, log) = spy("s2");
    let w99 = VifPolicy {
        weight: 99,
        ..Default::default()
    };
    assert!(r.sw.add_port(PortSpec::custom(Box::new(p)), w99).is_err());
    let on = log.dropped_on.lock().unwrap().clone();
    assert!(on.is_some(), "dropped");
    assert!(
        !on.as_deref().unwrap_or("").starts_with("vqos-loop"),
        "dropped on {on:?}"
    );
    assert!(r.sw.stats().port("s2").is_none());
    assert_eq!(r.sw.policies().len(), 2);
}

#[test]
fn a_slow_loop_delays_a_control_call_but_never_loses_its_answer() {
    let r = rig();
    let (p, peer, log) = spy("slow");
    r.sw.add_port(PortSpec::custom(Box::new(p)), VifPolicy::default())
        .unwrap();
    // The loop stalls 5.5 s in a read (longer than the old 5 s reply timeout).
    log.stall_ms.store(5_500, Ordering::SeqCst);
    peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, 1));
    eventually("the loop stalls", || log.stalled.load(Ordering::SeqCst));
    let w3 = VifPolicy {
        weight: 3,
        ..Default::default()
    };
    let commands = r.sw.stats().loops[0].commands;
    r.sw.set_policy("a", w3.clone()).unwrap();
    assert_eq!(r.sw.policies().vifs[0].policy, w3);
    // Published right after the change, once the stall is over.
    let s = stats_where(&r.sw, |s| s.loops[0].commands > commands);
    assert_eq!(s.ports.len(), 4);
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 1);
}

#[test]
fn a_port_without_readiness_fd_keeps_being_read_in_epoll_mode() {
    let r = rig();
    let (inner, peer) = MemPort::pair("nofd", 100);
    r.sw.add_port(
        PortSpec::custom(Box::new(NoFd(inner))),
        VifPolicy::default(),
    )
    .unwrap();
    for tag in 1..=3 {
        // Each frame arrives after the loop found the port drained and went idle.
        std::thread::sleep(Duration::from_millis(40));
        peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, tag));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), tag);
    }
}

#[test]
fn concurrent_set_policy_calls_never_undo_each_other() {
    let r = Arc::new(rig());
    let lost = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = ["a", "b"]
        .into_iter()
        .enumerate()
        .map(|(id, name)| {
            let (r, lost) = (r.clone(), lost.clone());
            std::thread::spawn(move || {
                for w in 1..=1000 {
                    let p = VifPolicy {
                        weight: w,
                        ..Default::default()
                    };
                    r.sw.set_policy(name, p).unwrap();
                    // Only this thread raises this vif's weight: lower means another call
                    // wrote back a stale copy of it.
                    if r.sw.policies().vifs[id].policy.weight < w {
                        lost.store(true, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!lost.load(Ordering::SeqCst), "an update was lost");
    let p = r.sw.policies();
    assert_eq!(
        (p.vifs[0].policy.weight, p.vifs[1].policy.weight),
        (1000, 1000)
    );
}

/// An uplink whose writes take 5 µs per frame, as a TAP write that delivers the frame to the
/// sink's socket does in the lab: it makes the loop slower than the vifs' senders.
struct SlowSink(MemPort);

impl Port for SlowSink {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        self.0.recv_batch(batch, max_frames)
    }
    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        std::thread::sleep(Duration::from_micros(5 * indices.len() as u64));
        self.0.send_batch(batch, indices)
    }
    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.0.readiness_fd()
    }
    fn counters(&self) -> PortIoCounters {
        self.0.counters()
    }
}

/// C2QoS Fig. 6(e) under `tcm` (docs/experiments.md): three vifs with a standing backlog of
/// 64-byte frames kept the loop busy without a pause, and a vif whose short read had cleared
/// its ready flag was not marked ready again (readiness was only collected when the loop went
/// idle): VM1 starved for seconds at a time although the engine reads every ready vif.
#[test]
fn a_drained_vif_is_served_again_while_others_stay_backlogged() {
    const MAC_1: u64 = 0x02_00_00_00_00_21;
    let floods = [
        0x02_00_00_00_00_22u64,
        0x02_00_00_00_00_23,
        0x02_00_00_00_00_24,
    ];
    for readiness in [Readiness::Epoll, Readiness::BusyPoll] {
        let (up, u) = MemPort::pair("up", 1_000);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(SlowSink(up))));
        cfg.engine = EngineKind::Tcm;
        cfg.capacity_bps = Some(1_000_000_000);
        cfg.readiness = readiness;
        let sw = SwitchHandle::start(cfg).unwrap();
        let mut peers = Vec::new();
        for (name, max) in [("vm1", 400), ("vm2", 400), ("vm3", 100), ("vm4", 100)] {
            let (p, peer) = MemPort::pair(name, 1_000);
            let policy = VifPolicy {
                max_bps: Some(max * 1_000_000),
                ..Default::default()
            };
            sw.add_port(PortSpec::custom(Box::new(p)), policy).unwrap();
            peers.push(peer);
        }
        // The sink's address is learnt on the uplink, so nothing is flooded to the vifs.
        u.inject(frame(BCAST, MAC_U, 0));
        stats_where(&sw, |s| s.mac_entries == 1);
        // The neighbours: 64-byte frames, topped up so that every read of them is a full one.
        let stop = Arc::new(AtomicBool::new(false));
        let small: Vec<Vec<u8>> = floods
            .iter()
            .map(|&m| build_frame(VnetHdr::default(), MAC_U, m, 0x0800, &[0; 50]))
            .collect();
        let feeder = {
            let (stop, peers) = (stop.clone(), peers[1..].to_vec());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (p, f) in peers.iter().zip(&small) {
                        while p.pending() < 4_096 {
                            p.inject(f.clone());
                        }
                    }
                    std::thread::yield_now();
                }
            })
        };
        eventually("backlogged neighbours", || {
            peers[1..].iter().all(|p| p.pending() >= 1_024)
        });
        // VM1: steady 1500-byte frames, 4 every millisecond (~49 Mbit/s), for 0.5 s.
        let big = build_frame(VnetHdr::default(), MAC_U, MAC_1, 0x0800, &[0; 1_486]);
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_millis(500) {
            for _ in 0..4 {
                peers[0].inject(big.clone());
            }
            sent += 4;
            std::thread::sleep(Duration::from_millis(1));
            u.take_sent();
        }
        std::thread::sleep(Duration::from_millis(50));
        let backlogged = peers[1..].iter().all(|p| p.pending() > 0);
        let s = sw.stats();
        stop.store(true, Ordering::Relaxed);
        feeder.join().unwrap();
        let vm1 = s.port("vm1").unwrap();
        assert!(backlogged, "{readiness:?}: the neighbours' backlog ran out");
        assert!(
            vm1.counters.rx_frames * 10 >= sent * 9,
            "{readiness:?}: vm1 read {} of {sent} frames, {} still waiting",
            vm1.counters.rx_frames,
            peers[0].pending()
        );
        assert_eq!(vm1.counters.drops.total(), 0, "{readiness:?}");
        sw.stop().unwrap();
    }
}

/// The thread wrapper's liveness: a live loop reports itself running and publishes within a
/// few stats intervals; a stopped one reports not running.
#[test]
fn ecn_probabilities_are_checked_and_applied_by_vif_name() {
    let r = rig();
    let named = |p: &[(&str, f64)]| p.iter().map(|&(n, p)| (n.to_string(), p)).collect();
    let e =
        r.sw.set_ecn_probabilities(named(&[("b", 1.0), ("zz", 0.5)]));
    assert!(matches!(e, Err(SwitchError::UnknownPort(n)) if n == "zz"));
    let e = r.sw.set_ecn_probabilities(named(&[("b", f64::NAN)]));
    assert!(
        matches!(e, Err(SwitchError::BadEcnProbability { .. })),
        "{e:?}"
    );
    r.sw.set_ecn_probabilities(named(&[("b", 1.0)])).unwrap();
    // Applied by the loop: ECN-capable frames to b are marked, those to a (not named) not.
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.b.inject(frame(MAC_U, MAC_B, 1));
    collect(&r.u, 2);
    for _ in 0..5 {
        r.u.inject(ect_frame(MAC_A, MAC_U));
        r.u.inject(ect_frame(MAC_B, MAC_U));
    }
    collect(&r.a, 5);
    collect(&r.b, 5);
    let s = stats_where(&r.sw, |s| {
        s.port("b").is_some_and(|p| p.counters.ecn_marked == 5)
    });
    assert_eq!(s.port("a").unwrap().counters.ecn_marked, 0, "not named");
}

#[test]
fn loop_health_follows_the_thread() {
    let r = rig();
    eventually("a fresh stats snapshot", || {
        let h = r.sw.loop_health();
        h.running && h.stats_age_ns < 1_000_000_000
    });
    r.sw.stop().unwrap();
    assert!(!r.sw.loop_health().running);
}

#[test]
fn two_loop_threads_forward_across_each_other_and_show_in_the_stats() {
    let r = rig_with(|c| c.threads = 2);
    // a is read by loop 0, b by loop 1.
    let s = r.sw.stats();
    assert_eq!(
        (s.port("a").unwrap().shard, s.port("b").unwrap().shard),
        (0, 1)
    );
    r.a.inject(frame(BCAST, MAC_A, 1));
    assert_eq!(tag_of(&collect(&r.b, 1)[0]), 1);
    // b's address learnt (its reply reaches a) before the uplink sends to it: from then on
    // nothing is flooded, so a and b get exactly what is sent to them.
    r.b.inject(frame(MAC_A, MAC_B, 2));
    assert_eq!(tag_of(&collect(&r.a, 1)[0]), 2);
    for i in 0..200u8 {
        r.b.inject(frame(MAC_A, MAC_B, i));
        r.u.inject(frame(MAC_B, MAC_U, i));
    }
    assert_eq!(collect(&r.a, 200).len(), 200);
    assert_eq!(collect(&r.b, 200).len(), 200);
    let s = stats_where(&r.sw, |s| {
        s.loops.len() == 2
            && s.loops.iter().all(|l| l.burst_frames > 0)
            && s.port("a").is_some_and(|p| p.counters.tx_frames == 201)
    });
    // b: 201 read (its reply and 200), 201 written (a's broadcast and the uplink's 200).
    let b = stats_where(&r.sw, |s| {
        s.port("b").is_some_and(|p| p.counters.tx_frames == 201)
    });
    assert_eq!(b.port("b").unwrap().counters.rx_frames, 201);
    assert_eq!(s.port("a").unwrap().counters.rx_frames, 1);
    // Calibration sees every shard's batches: a's 1 frame (loop 0) and b's 201 (loop 1).
    eventually("every vif batch sampled", || {
        let frames: u32 =
            r.sw.cost_samples()
                .snapshot()
                .iter()
                .map(|s| s.frames)
                .sum();
        frames == 202
    });
    // A port added and removed while both loops run.
    let (pc, c) = MemPort::pair("c", 1000);
    r.sw.add_port(PortSpec::custom(Box::new(pc)), VifPolicy::default())
        .unwrap();
    r.u.inject(frame(BCAST, MAC_U, 9));
    assert_eq!(tag_of(&collect(&c, 1)[0]), 9);
    r.sw.remove_port("c").unwrap();
    assert_eq!(r.sw.policies().len(), 2);
    stats_where(&r.sw, |s| s.port("c").is_none());
    assert!(r.sw.loop_health().running);
    r.sw.stop().unwrap();
    assert!(!r.sw.loop_health().running);
}

#[test]
fn a_port_pinned_to_a_thread_is_read_there_and_a_missing_thread_is_refused() {
    let r = rig_with(|c| c.threads = 2);
    // a on loop 0, b on loop 1; the least loaded would take c to loop 0: pinned to 1.
    let (pc, c) = MemPort::pair("c", 1000);
    r.sw.add_port(
        PortSpec::custom(Box::new(pc)).with_thread(Some(1)),
        VifPolicy::default(),
    )
    .unwrap();
    let s = r.sw.stats();
    let shard = |n: &str| s.port(n).unwrap().shard;
    assert_eq!((shard("a"), shard("b"), shard("c")), (0, 1, 1));
    // It is read there: its frame reaches the uplink, counted by loop 1.
    c.inject(frame(BCAST, MAC_A, 7));
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 7);
    stats_where(&r.sw, |s| {
        s.port("c").is_some_and(|p| p.counters.rx_frames == 1) && s.loops[1].burst_frames > 0
    });
    // A thread the switch does not have: refused, nothing added.
    let (pd, _d) = MemPort::pair("d", 1000);
    let e =
        r.sw.add_port(
            PortSpec::custom(Box::new(pd)).with_thread(Some(2)),
            VifPolicy::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("thread 2 does not exist"), "{e}");
    assert_eq!(r.sw.policies().len(), 3);
    r.sw.stop().unwrap();
}

#[test]
fn a_port_moves_to_the_thread_its_neighbour_left_and_is_read_there() {
    for readiness in [Readiness::Epoll, Readiness::BusyPoll] {
        let r = rig_with(|c| {
            c.threads = 2;
            c.readiness = readiness;
        });
        // a on loop 0, b on loop 1, c on loop 0 (the least loaded, the lower index).
        let (pc, c) = MemPort::pair("c", 1000);
        r.sw.add_port(PortSpec::custom(Box::new(pc)), VifPolicy::default())
            .unwrap();
        // Frames wait in c's queue while b goes and c moves to loop 1.
        for i in 0..20u8 {
            c.inject(frame(MAC_U, MAC_B, i));
        }
        r.sw.remove_port("b").unwrap();
        let s = r.sw.stats();
        assert_eq!(
            (s.port("a").unwrap().shard, s.port("c").unwrap().shard),
            (0, 1)
        );
        // Read there, by its readiness on loop 1 (or its busy polling): every frame once.
        assert_eq!(collect(&r.u, 20).len(), 20, "{readiness:?}");
        c.inject(frame(MAC_U, MAC_B, 99));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), 99);
        stats_where(&r.sw, |s| {
            s.port("c").is_some_and(|p| p.counters.rx_frames == 21) && s.loops[1].burst_frames > 0
        });
        r.sw.stop().unwrap();
    }
}

#[test]
fn threads_and_cpus_that_cannot_be_had_are_refused_before_anything_starts() {
    let start = |f: &dyn Fn(&mut SwitchConfig)| {
        let (up, _u) = MemPort::pair("up", 1);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
        f(&mut cfg);
        match SwitchHandle::start(cfg) {
            Err(SwitchError::Threads(m)) => m,
            other => panic!("expected a threads error, got {:?}", other.map(|_| ())),
        }
    };
    let cpus = vqos_dataplane::sys::allowed_cpus().unwrap();
    assert!(start(&|c| c.threads = 0).contains("at least 1"));
    assert!(start(&|c| c.threads = cpus.len() + 1).contains("may use"));
    assert!(start(&|c| {
        c.threads = 1;
        c.cpus = vec![cpus[0], cpus[0]];
    })
    .contains("one CPU per thread"));
    assert!(start(&|c| {
        c.threads = 1;
        c.cpus = vec![4096];
    })
    .contains("CPU 4096 does not exist"));
    if cpus.len() >= 2 {
        let (engine, _log) = Refuser::new(&[]);
        let engine = std::sync::Mutex::new(Some(engine));
        assert!(start(&|c| {
            c.threads = 2;
            c.custom_engine = engine.lock().unwrap().take().map(|e| Box::new(e) as _);
        })
        .contains("custom engine"));
    }
}
