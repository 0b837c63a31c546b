use super::*;
use crate::engines::rr::RoundRobin;
use crate::policy::VifPolicy;

/// Core speed of the test harness.
const CORE_HZ: u64 = 2_000_000_000;
/// Fixed cycles per frame (descriptor handling, classification hit, egress).
const CYCLES_PER_PACKET: u64 = 1_200;
/// Extra cycles per frame when a frame misses the exact-match cache (many flows).
const CYCLES_PER_MISS: u64 = 1_500;

/// Cycles to forward one frame: per packet, plus copying (0.8 cycle per byte), plus a
/// classifier miss for senders spreading their frames over many flows (C2QoS §III-B).
/// 64-byte frames cost 1251 cycles = 19.5 cycles/byte; 1518-byte ones 2414 = 1.6/byte:
/// about 12× more cycles per bit.
fn frame_cycles(len_bytes: u64, many_flows: bool) -> u64 {
    CYCLES_PER_PACKET + len_bytes * 4 / 5 + if many_flows { CYCLES_PER_MISS } else { 0 }
}

/// One sender of the harness.
#[derive(Clone, Copy)]
struct Source {
    /// Offered load in bit/s; `None` = greedy (always backlogged).
    offered_bps: Option<u64>,
    /// Frame length in bytes.
    len_bytes: u64,
    /// Frames spread over many flows (classifier misses).
    many_flows: bool,
}

#[derive(Default, Clone, Copy, Debug)]
struct Served {
    cycles: u64,
    bytes: u64,
}

/// A single forwarding core in virtual time: sources fill per-vif queues (bounded at 256
/// frames, the rest is lost at the source), the engine picks a vif, the core spends the
/// batch's cycles. Returns what each vif got between `from_ns` and `to_ns`.
struct Core {
    engine: Box<dyn Engine>,
    ready: ReadySet,
    /// Frames waiting per vif, in millionths of a frame (fluid arrivals).
    backlog_ufr: Vec<u64>,
    now_ns: u64,
}

impl Core {
    fn new(engine: Box<dyn Engine>, n: usize) -> Self {
        Core {
            engine,
            ready: ReadySet::new(n),
            backlog_ufr: vec![0; n],
            now_ns: 0,
        }
    }

    fn arrive(&mut self, sources: &[Source], dt_ns: u64) {
        for (v, s) in sources.iter().enumerate() {
            let add = match s.offered_bps {
                None => 256_000_000,
                // frames = bps·dt/(8·len·1e9); in µframes: ·1e6.
                Some(bps) => {
                    (u128::from(bps) * u128::from(dt_ns) * 1_000_000
                        / (8 * u128::from(s.len_bytes) * u128::from(NS_PER_SEC)))
                        as u64
                }
            };
            self.backlog_ufr[v] = (self.backlog_ufr[v] + add).min(256_000_000);
            self.ready.set(v, self.backlog_ufr[v] >= 1_000_000);
        }
    }

    fn run(&mut self, sources: &[Source], until_ns: u64, count_from_ns: u64) -> Vec<Served> {
        let mut served = vec![Served::default(); sources.len()];
        while self.now_ns < until_ns {
            if self.now_ns >= self.engine.next_tick() {
                self.engine.tick(&self.ready, self.now_ns);
            }
            let dt_ns = match self.engine.select(&self.ready, self.now_ns) {
                Some(g) => {
                    let s = sources[g.vif];
                    let frames =
                        (self.backlog_ufr[g.vif] / 1_000_000).min(u64::from(g.max_packets));
                    self.backlog_ufr[g.vif] -= frames * 1_000_000;
                    let cycles = frames * frame_cycles(s.len_bytes, s.many_flows);
                    let usage = Usage {
                        packets: frames as u32,
                        bytes: frames * s.len_bytes,
                        cycles,
                    };
                    self.engine.charge(g.vif, usage, self.now_ns);
                    if self.now_ns >= count_from_ns {
                        served[g.vif].cycles += cycles;
                        served[g.vif].bytes += usage.bytes;
                    }
                    (cycles * NS_PER_SEC / CORE_HZ).max(1)
                }
                // Idle: poll again a little later (or at the next refill).
                None => 1_000u64.min(self.engine.next_tick().saturating_sub(self.now_ns).max(1)),
            };
            self.now_ns += dt_ns;
            self.arrive(sources, dt_ns);
        }
        served
    }
}

/// 4 vifs bought 4/4/1/1 Gbit/s of a core sold as 10 Gbit/s (at 1518-byte frames the core
/// forwards about 10 Gbit/s).
fn purchased_set() -> PolicySet {
    let mut set = PolicySet::new(Some(10_000_000_000));
    set.cost = CostModel::Cycles;
    set.cycles_per_sec = CORE_HZ;
    for (name, gbit) in [("vm1", 4), ("vm2", 4), ("vm3", 1), ("vm4", 1)] {
        set = set.with_vif(
            name,
            VifPolicy {
                max_bps: Some(gbit * 1_000_000_000),
                ..Default::default()
            },
        );
    }
    set
}

/// VM1 sends 4 Gbit/s of 1518-byte frames all along; VM2–4 send their purchased rates in
/// 1518-byte frames, then switch to greedy 64-byte floods. Returns VM1's share of served
/// cycles and bytes after the switch relative to before.
fn noisy_neighbours(engine: Box<dyn Engine>, many_flows: bool) -> (f64, f64, Vec<Served>) {
    let big = |gbit: u64| Source {
        offered_bps: Some(gbit * 1_000_000_000),
        len_bytes: 1518,
        many_flows: false,
    };
    let before = [big(4), big(4), big(1), big(1)];
    let small = Source {
        offered_bps: None,
        len_bytes: 64,
        many_flows,
    };
    let after = [big(4), small, small, small];
    let mut core = Core::new(engine, 4);
    let ms = 1_000_000;
    let b = core.run(&before, 100 * ms, 20 * ms);
    let a = core.run(&after, 200 * ms, 120 * ms);
    (
        a[0].cycles as f64 / b[0].cycles as f64,
        a[0].bytes as f64 / b[0].bytes as f64,
        a,
    )
}

#[test]
fn c2tb_protects_vm1_from_small_packet_neighbours() {
    for many_flows in [false, true] {
        let engine = build(&purchased_set());
        let (cycles, bytes, after) = noisy_neighbours(engine, many_flows);
        assert!(
            cycles >= 0.97 && bytes >= 0.97,
            "many_flows={many_flows}: VM1 kept {cycles:.3} of its cycles, {bytes:.3} of its bytes"
        );
        // The neighbours are held to their allotments: 40 % / 10 % / 10 % of the core.
        let total: u64 = after.iter().map(|s| s.cycles).sum();
        let share = |v: usize| after[v].cycles as f64 / total as f64;
        assert!((share(1) - 0.40).abs() < 0.02, "vm2 {:.3}", share(1));
        assert!((share(2) - 0.10).abs() < 0.01, "vm3 {:.3}", share(2));
        assert!((share(3) - 0.10).abs() < 0.01, "vm4 {:.3}", share(3));
    }
}

#[test]
fn round_robin_lets_small_packet_neighbours_take_vm1s_cycles() {
    let mut rr = RoundRobin::new();
    rr.configure(&purchased_set(), 0).unwrap();
    let (cycles, bytes, _) = noisy_neighbours(Box::new(rr), true);
    assert!(
        cycles < 0.85 && bytes < 0.85,
        "rr: VM1 kept {cycles:.3} of its cycles, {bytes:.3} of its bytes"
    );
    let engine = build(&purchased_set());
    let (c2_cycles, _, _) = noisy_neighbours(engine, true);
    assert!(
        c2_cycles - cycles > 0.12,
        "c2qos {c2_cycles:.3} vs rr {cycles:.3}"
    );
}

fn build(set: &PolicySet) -> Box<dyn Engine> {
    let mut e = C2qos::new();
    e.configure(set, 0).unwrap();
    Box::new(e)
}

#[test]
fn tokens_go_negative_and_gate_batches_until_the_manager_refills() {
    let set = purchased_set();
    let mut e = C2qos::new();
    e.configure(&set, 0).unwrap();
    let mut ready = ReadySet::new(4);
    ready.set(2, true);
    // vm3 bought 10 % of 2 GHz = 200 M cycles/s = 10 000 cycles per 50 µs.
    assert_eq!(e.vif_state(2).credit, 10_000);
    let g = e.select(&ready, 0).unwrap();
    assert_eq!(g.vif, 2);
    e.charge(
        2,
        Usage {
            packets: 32,
            bytes: 32 * 1518,
            cycles: 25_000,
        },
        1,
    );
    let st = e.vif_state(2);
    assert_eq!(st.credit, -15_000);
    assert!(st.throttled);
    assert_eq!(e.waiting_queue(), vec![2]);
    assert_eq!(e.select(&ready, 2), None);
    assert_eq!(e.eligible_at(2), 50_000);
    // One period refills 10 000: still -5 000, still waiting.
    e.tick(&ready, 50_000);
    assert_eq!(e.vif_state(2).credit, -5_000);
    assert_eq!(e.select(&ready, 50_001), None);
    // A call before the tick is due changes nothing.
    e.tick(&ready, 60_000);
    assert_eq!(e.vif_state(2).credit, -5_000);
    e.tick(&ready, 100_000);
    assert_eq!(e.vif_state(2).credit, 5_000);
    assert!(!e.vif_state(2).throttled);
    assert_eq!(e.select(&ready, 100_001).map(|g| g.vif), Some(2));
    // The depth is now one period (10 000) plus the largest batch (25 000).
    e.tick(&ready, 1_000_000);
    assert_eq!(e.vif_state(2).credit, 35_000);
}

#[test]
fn fractional_refills_are_carried_over() {
    // 1 bit/s with bytes: 1/8 byte per second, a whole byte every 8 s.
    let mut set = PolicySet::new(Some(1_000_000)).with_vif(
        "slow",
        VifPolicy {
            max_bps: Some(8),
            ..Default::default()
        },
    );
    set.cost = CostModel::Bytes;
    let mut e = C2qos::with_manager_period(NS_PER_SEC / 2);
    e.configure(&set, 0).unwrap();
    let ready = ReadySet::new(1);
    e.charge(
        0,
        Usage {
            packets: 1,
            bytes: 10,
            cycles: 0,
        },
        0,
    );
    assert_eq!(e.vif_state(0).credit, -10);
    // Twenty half-second ticks at 1 byte/s: exactly 10 bytes back, none lost to rounding.
    for k in 1..=20 {
        e.tick(&ready, k * NS_PER_SEC / 2);
    }
    assert_eq!(e.vif_state(0).credit, 0);
    assert!(e.vif_state(0).throttled, "tokens must be > 0 to run");
    e.tick(&ready, 21 * NS_PER_SEC / 2);
    assert_eq!(e.vif_state(0).credit, 0);
    e.tick(&ready, 22 * NS_PER_SEC / 2);
    assert_eq!(e.vif_state(0).credit, 1);
    assert!(!e.vif_state(0).throttled);
}

#[test]
fn unlimited_vif_is_never_throttled() {
    let set = PolicySet::new(Some(1_000_000_000)).with_vif("free", VifPolicy::default());
    let mut e = C2qos::new();
    e.configure(&set, 0).unwrap();
    let mut ready = ReadySet::new(1);
    ready.set(0, true);
    for t in 0..100 {
        assert_eq!(e.select(&ready, t).map(|g| g.vif), Some(0));
        e.charge(
            0,
            Usage {
                packets: 32,
                bytes: 48_576,
                cycles: 1_000_000,
            },
            t,
        );
    }
    assert!(!e.vif_state(0).throttled);
    assert_eq!(e.eligible_at(0), u64::MAX);
}

#[test]
fn strict_priority_with_fifo_rotation_inside_a_level() {
    // Unlimited vifs: only the queues matter here.
    let prio = |p: u8| VifPolicy {
        priority: p,
        ..Default::default()
    };
    let set = PolicySet::new(None)
        .with_vif("a", prio(3))
        .with_vif("b", prio(1))
        .with_vif("c", prio(3))
        .with_vif("d", prio(1));
    let mut e = C2qos::new();
    e.configure(&set, 0).unwrap();
    let mut ready = ReadySet::new(4);
    for v in 0..4 {
        ready.set(v, true);
    }
    let order: Vec<VifId> = (0..4).map(|t| e.select(&ready, t).unwrap().vif).collect();
    assert_eq!(order, vec![1, 3, 1, 3]);
    ready.set(1, false);
    ready.set(3, false);
    let order: Vec<VifId> = (0..4).map(|t| e.select(&ready, t).unwrap().vif).collect();
    assert_eq!(order, vec![0, 2, 0, 2]);
    // b becomes backlogged again: served next, ahead of level 3.
    ready.set(1, true);
    assert_eq!(e.select(&ready, 9).unwrap().vif, 1);
}

/// A priority-0 vif sending one frame now and then waits for at most the batch in progress
/// under c2qos, and for every backlogged neighbour's batch under round-robin.
fn batches_waited(engine: &mut dyn Engine) -> (usize, usize) {
    let n = 6;
    let mut ready = ReadySet::new(n);
    for v in 1..n {
        ready.set(v, true);
    }
    let mut worst = 0;
    let mut total = 0;
    let mut now_ns = 0u64;
    let mut waiting_since: Option<usize> = None;
    let mut batch = 0usize;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    while batch < 20_000 {
        if now_ns >= engine.next_tick() {
            engine.tick(&ready, now_ns);
        }
        // The urgent vif gets a frame at pseudo-random batch boundaries.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        if waiting_since.is_none() && seed.is_multiple_of(7) {
            ready.set(0, true);
            waiting_since = Some(batch);
        }
        let Some(g) = engine.select(&ready, now_ns) else {
            // Every bulk vif is out of tokens: idle until the manager refills them.
            assert!(!ready.contains(0), "the urgent vif is never refused");
            now_ns = engine.eligible_at(now_ns).max(now_ns + 1);
            continue;
        };
        if g.vif == 0 {
            let waited = batch - waiting_since.take().unwrap();
            worst = worst.max(waited);
            total += 1;
            ready.set(0, false);
            engine.charge(
                0,
                Usage {
                    packets: 1,
                    bytes: 100,
                    cycles: 1_300,
                },
                now_ns,
            );
            now_ns += 650;
        } else {
            engine.charge(
                g.vif,
                Usage {
                    packets: 32,
                    bytes: 32 * 1518,
                    cycles: 32 * 2_414,
                },
                now_ns,
            );
            now_ns += 32 * 2_414 / 2;
        }
        batch += 1;
    }
    (worst, total)
}

#[test]
fn priority_zero_small_request_is_served_within_one_batch() {
    let mut set = PolicySet::new(Some(10_000_000_000));
    set.cost = CostModel::Cycles;
    set.cycles_per_sec = CORE_HZ;
    set = set.with_vif(
        "urgent",
        VifPolicy {
            max_bps: Some(1_000_000_000),
            priority: 0,
            ..Default::default()
        },
    );
    for i in 1..6 {
        set = set.with_vif(
            &format!("bulk{i}"),
            VifPolicy {
                max_bps: Some(1_800_000_000),
                ..Default::default()
            },
        );
    }
    let mut c2 = C2qos::new();
    c2.configure(&set, 0).unwrap();
    let (worst, served) = batches_waited(&mut c2);
    assert!(served > 1_000, "urgent vif served {served} times");
    assert_eq!(worst, 0, "served at the very next decision");
    let mut rr = RoundRobin::new();
    rr.configure(&set, 0).unwrap();
    let (rr_worst, _) = batches_waited(&mut rr);
    assert!(
        rr_worst >= 4,
        "round-robin makes it wait behind the others: {rr_worst}"
    );
}

#[test]
fn live_change_of_purchased_rate() {
    let greedy = Source {
        offered_bps: None,
        len_bytes: 1518,
        many_flows: false,
    };
    let sources = [greedy; 4];
    let set = purchased_set();
    let mut core = Core::new(build(&set), 4);
    let ms = 1_000_000;
    let shares = |s: &[Served]| -> Vec<f64> {
        let t: u64 = s.iter().map(|x| x.cycles).sum();
        s.iter().map(|x| x.cycles as f64 / t as f64).collect()
    };
    let s1 = shares(&core.run(&sources, 50 * ms, 10 * ms));
    assert!((s1[2] - 0.10).abs() < 0.01, "{s1:?}");
    // vm3 upgrades to 2 Gbit/s and vm1 downgrades to 3 Gbit/s, mid-run.
    let up = VifPolicy {
        max_bps: Some(2_000_000_000),
        ..Default::default()
    };
    let down = VifPolicy {
        max_bps: Some(3_000_000_000),
        ..Default::default()
    };
    let set2 = set
        .with_policy("vm3", up)
        .unwrap()
        .with_policy("vm1", down)
        .unwrap();
    core.engine.configure(&set2, core.now_ns).unwrap();
    let s2 = shares(&core.run(&sources, 100 * ms, 60 * ms));
    assert!((s2[0] - 0.30).abs() < 0.01, "{s2:?}");
    assert!((s2[2] - 0.20).abs() < 0.01, "{s2:?}");
    // vm4 becomes unlimited: never throttled, it gets a batch every round, so it takes what
    // round-robin among the runnable vifs gives it: vm3 is held to 20 %, the other three
    // split the remaining 80 % (neither vm1's 30 % nor vm2's 40 % binds).
    let free = VifPolicy::default();
    let set3 = set2.with_policy("vm4", free).unwrap();
    core.engine.configure(&set3, core.now_ns).unwrap();
    let s3 = shares(&core.run(&sources, 150 * ms, 110 * ms));
    assert!((s3[2] - 0.20).abs() < 0.01, "{s3:?}");
    assert!((s3[3] - 0.267).abs() < 0.02, "{s3:?}");
    assert!(!core.engine.vif_state(3).throttled);
    let t: u64 = core
        .run(&sources, 160 * ms, 150 * ms)
        .iter()
        .map(|s| s.cycles)
        .sum();
    // The core is always busy: about 10 ms of cycles in 10 ms.
    assert!(t as f64 > 0.98 * (CORE_HZ / 100) as f64, "{t}");
}

/// Removing a vif keeps the others' tokens with their names, not their indices.
#[test]
fn tokens_follow_the_name_when_a_vif_is_removed() {
    let set = PolicySet::new(Some(10_000_000_000))
        .with_vif(
            "gone",
            VifPolicy {
                max_bps: Some(1_000_000_000),
                ..Default::default()
            },
        )
        .with_vif(
            "kept",
            VifPolicy {
                max_bps: Some(1_000_000_000),
                ..Default::default()
            },
        );
    let mut e = C2qos::new();
    e.configure(&set, 0).unwrap();
    e.charge(
        0,
        Usage {
            packets: 32,
            bytes: 48_000,
            cycles: 10_000_000,
        },
        0,
    );
    assert!(e.vif_state(0).throttled);
    let kept = e.vif_state(1);
    assert!(!kept.throttled);
    let mut smaller = set.clone();
    smaller.vifs.remove(0);
    e.configure(&smaller, 0).unwrap();
    assert_eq!(e.vif_state(0), kept, "kept inherited gone's tokens");
}

/// The paper's purchases priced by a frame cost model: at 1518-byte reference frames on the
/// fig. 6 core (1.54 GHz, 1300 + 0.25·bytes cycles per frame) the token rates are what the
/// purchases need, 36/36/9/9 % of the core, where linear pricing gave 40/40/10/10 %.
#[test]
fn a_cost_model_prices_purchases_at_the_reference_frame() {
    let model = crate::cost::FrameCost::new(1300.0, 0.25).unwrap();
    let mut set = purchased_set();
    set.cycles_per_sec = 1_540_000_000;
    let mut linear = C2qos::with_manager_period(NS_PER_SEC);
    linear.configure(&set, 0).unwrap();
    assert_eq!(linear.vif_state(0).credit_per_period, 616_000_000);
    set.pricing.model = Some(model);
    set.pricing.frame_bytes = 1518;
    let mut e = C2qos::with_manager_period(NS_PER_SEC);
    e.configure(&set, 0).unwrap();
    let per_sec: Vec<i64> = (0..4).map(|v| e.vif_state(v).credit_per_period).collect();
    let core = 1_540_000_000.0;
    let shares: Vec<f64> = per_sec.iter().map(|&c| c as f64 / core).collect();
    for (got, want) in shares.iter().zip([0.359, 0.359, 0.0898, 0.0898]) {
        assert!((got - want).abs() < 0.001, "{shares:?}");
    }
}

#[test]
fn configure_refuses_purchases_that_oversell_the_core_and_keeps_the_old_set() {
    let model = crate::cost::FrameCost::new(1300.0, 0.25).unwrap();
    let mut set = purchased_set();
    set.cycles_per_sec = 1_540_000_000;
    set.pricing.model = Some(model);
    set.pricing.frame_bytes = 1518;
    let mut e = C2qos::new();
    e.configure(&set, 0).unwrap();
    let before = e.vif_state(0);
    // One more 2 Gbit/s tenant: 12 Gbit/s of 1518-byte frames need 108 % of the core.
    let more = set.clone().with_vif(
        "vm5",
        VifPolicy {
            max_bps: Some(2_000_000_000),
            ..Default::default()
        },
    );
    let err = e.configure(&more, 10).unwrap_err();
    assert!(matches!(err, PolicyError::Oversold { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "Purchases need 1.660G cycles/s, more than the 1.540G cycles/s the switch may sell \
         (c2qos)"
    );
    assert_eq!(e.vif_state(0), before);
    assert_eq!(e.ready_queue(PRIORITY_LEVELS - 1).len(), 4);
}
