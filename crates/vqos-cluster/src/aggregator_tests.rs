//! Tests of the shard leader: its decisions alone, then hosts that report and apply grants at
//! their own times through a network that delays and loses messages, a partition and a
//! leader's crash (time stepped, no sleeps, no threads).

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::holder::Holder;
use crate::model::VifStatus;
use crate::shares::Declared;
use crate::split::proptest_config;

const M: u64 = 1_000_000;
const MS: u64 = 1_000_000;
const LEASE: u64 = 300 * MS;
const DRIFT: u64 = 20 * MS;

fn limits(max: u64, min: u64) -> TenantLimits {
    TenantLimits {
        min_bps: min * M,
        max_bps: Some(max * M),
    }
}

/// `hosts[i]` has one vif `vm` of tenant `t` with weight `weights[i]`.
fn declared(weights: &[u32]) -> Declarations {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let d = Declared {
                tenant: "t".into(),
                weight: w,
                max_bps: None,
            };
            (format!("h{i}"), BTreeMap::from([("vm".to_string(), d)]))
        })
        .collect()
}

/// A report of host `i` whose vif wants `demand` Mbit/s (`None`: greedy) and which enforces
/// `enforcing` of tenant `t`.
fn report(i: usize, demand: Option<u64>, enforcing: Enforcing) -> Report {
    let vif = VifStatus {
        demand_bps: demand.map(|d| d * M),
        ..Default::default()
    };
    Report {
        host: format!("h{i}"),
        status: HostStatus {
            vifs: BTreeMap::from([("vm".to_string(), vif)]),
            ..Default::default()
        },
        enforcing: BTreeMap::from([("t".to_string(), enforcing)]),
    }
}

/// What a host holds before any grant: nothing of the tenant.
fn nothing() -> Enforcing {
    Enforcing {
        epoch: 0,
        max_bps: Some(0),
        min_bps: 0,
    }
}

fn holds(g: &HostGrant) -> Enforcing {
    Enforcing {
        epoch: g.grant.epoch,
        max_bps: g.grant.max_bps,
        min_bps: g.grant.min_bps,
    }
}

fn mbit(e: Enforcing) -> u64 {
    e.max_bps.unwrap_or(u64::MAX) / M
}

/// A leader past its hold, with hosts h0 (holding `a`) and h1 (holding `b`) acknowledged.
fn settled(
    a: u64,
    b: u64,
    tenants: &BTreeMap<String, TenantLimits>,
) -> (Leader, [Enforcing; 2], u64) {
    let decl = declared(&[1, 1]);
    let mut l = Leader::new(1, 0, LEASE, DRIFT);
    let mut now = LEASE + DRIFT;
    let mut held = [nothing(); 2];
    // Demands that split as a:b, answered and acknowledged twice.
    for _ in 0..3 {
        for (i, d) in [(0, a), (1, b)] {
            l.reports
                .insert(format!("h{i}"), report(i, Some(d), held[i]).status);
        }
        l.plan(&decl, tenants);
        for (i, d) in [(0, a), (1, b)] {
            let g = l.report(report(i, Some(d), held[i]), now);
            held[i] = holds(&g["t"]);
        }
        now += 100 * MS;
    }
    (l, held, now)
}

#[test]
fn a_rise_waits_until_the_holder_has_confirmed_its_release() {
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 0))]);
    let decl = declared(&[1, 1]);
    let (mut l, mut held, mut now) = settled(110, 890, &tenants);
    assert_eq!((mbit(held[0]), mbit(held[1])), (110, 890));
    // h0 rises to 500 (greedy): the split says 500 each.
    l.reports
        .insert("h0".into(), report(0, None, held[0]).status);
    l.plan(&decl, &tenants);
    // h0 asks first: h1 still holds 890, so h0 keeps 110.
    let g0 = l.report(report(0, None, held[0]), now);
    assert_eq!(mbit(holds(&g0["t"])), 110);
    // h1 is told 500 but has not confirmed: h0 still gets 110.
    let g1 = l.report(report(1, Some(890), held[1]), now);
    assert_eq!(mbit(holds(&g1["t"])), 500);
    let g0 = l.report(report(0, None, held[0]), now + MS);
    assert_eq!(mbit(holds(&g0["t"])), 110);
    // h1 applies 500 and says so: now h0 may take the 500 released.
    held[1] = holds(&g1["t"]);
    now += 100 * MS;
    l.report(report(1, Some(890), held[1]), now);
    let g0 = l.report(report(0, None, held[0]), now);
    assert_eq!(mbit(holds(&g0["t"])), 500);
    assert_eq!(g0["t"].shares["vm"].max_bps, Some(500 * M));
    assert_eq!(g0["t"].grant.fallback_max_bps, Some(500 * M));
}

#[test]
fn a_silent_host_counts_its_grant_for_a_lease_then_its_fallback() {
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 0))]);
    let decl = declared(&[1, 1]);
    let (mut l, held, now) = settled(100, 900, &tenants);
    // h1 falls silent holding 900 (fallback 500); h0 turns greedy.
    l.reports
        .insert("h0".into(), report(0, None, held[0]).status);
    l.plan(&decl, &tenants);
    let sent = now - 100 * MS; // h1's last grant
    let at = |l: &mut Leader, t: u64| mbit(holds(&l.report(report(0, None, held[0]), t)["t"]));
    assert_eq!(at(&mut l, sent + LEASE + DRIFT - 1), 100);
    // Lapsed: h1 holds at most min(900, 1000 / 2). The others' sum is counted again at each
    // plan (once a period), so until then h1 still counts its grant in full.
    assert_eq!(at(&mut l, sent + LEASE + DRIFT), 100);
    l.plan(&decl, &tenants);
    assert_eq!(at(&mut l, sent + LEASE + DRIFT), 500);
}

#[test]
fn a_new_leader_grants_nobody_more_than_they_hold_until_its_hold_ends() {
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 0))]);
    let decl = declared(&[1, 1, 1]);
    let mut l = Leader::new(7, 1_000 * MS, LEASE, DRIFT);
    let start = 1_000 * MS;
    // h0 and h1 report what an earlier leader granted; h2 has not reported.
    let old = |mbit: u64| Enforcing {
        epoch: (6 << 32) | 9,
        max_bps: Some(mbit * M),
        min_bps: 0,
    };
    l.reports
        .insert("h0".into(), report(0, None, old(600)).status);
    l.reports
        .insert("h1".into(), report(1, Some(10), old(300)).status);
    l.plan(&decl, &tenants);
    assert!(l.holding(start));
    let g0 = l.report(report(0, None, old(600)), start);
    let g1 = l.report(report(1, Some(10), old(300)), start);
    // The split says h0 990, h1 10: h0 stays at 600 during the hold; h1 falls at once.
    assert_eq!((mbit(holds(&g0["t"])), mbit(holds(&g1["t"]))), (600, 10));
    assert_eq!(g0["t"].grant.epoch >> 32, 7, "epochs carry the term");
    // After the hold: h1 confirmed 10, h2 never reported (counted 1000 / 3), h0 gets the rest.
    let end = start + LEASE + DRIFT;
    assert!(!l.holding(end));
    l.report(report(1, Some(10), holds(&g1["t"])), end);
    let g0 = l.report(report(0, None, holds(&g0["t"])), end);
    assert_eq!(
        holds(&g0["t"]).max_bps,
        Some(1000 * M - 10 * M - 1000 * M / 3)
    );
}

#[test]
fn weights_and_tenants_come_from_the_declarations_not_the_reports() {
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 0))]);
    let decl = declared(&[1, 1]);
    let mut l = Leader::new(1, 0, LEASE, DRIFT);
    let now = LEASE + DRIFT;
    let mut liar = report(0, None, nothing());
    let v = liar.status.vifs.get_mut("vm").unwrap();
    v.weight = u32::MAX;
    v.tenant = Some("other".into());
    v.max_bps = None;
    // A vif etcd does not declare for h0 is no member.
    liar.status
        .vifs
        .insert("stolen".into(), VifStatus::default());
    l.reports.insert("h0".into(), liar.status.clone());
    l.reports
        .insert("h1".into(), report(1, None, nothing()).status);
    l.plan(&decl, &tenants);
    l.report(report(1, None, nothing()), now);
    let g = l.report(liar, now);
    assert_eq!(g["t"].shares.keys().collect::<Vec<_>>(), ["vm"]);
    assert_eq!(g["t"].shares["vm"].max_bps, Some(500 * M));
}

/// A message in flight, delivered at its time.
enum Msg {
    /// A host's report, sent at `sent`.
    Report(usize, Report, u64),
    /// The leader's answer to the report the host sent at `sent`.
    Answer(usize, BTreeMap<String, HostGrant>, u64),
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Runs `hosts` hosts for 12 s of 10 ms steps against one leader: reports every 100 ms at
/// each host's own phase, delays up to 40 ms (one message in ten, before the quiet end, up to
/// 500 ms: past the next report and past the lease), `loss` % of messages lost, demands changing at
/// random, host 0 cut off from 3 s to 5 s, the leader replaced at `crash_ms`. The last 4 s
/// lose nothing. With `push`, the leader's pushed answers go out after each plan and report
/// (through the same network), leased from the host's latest report. Returns the largest Σ max
/// and Σ min in force, and the hosts' totals in force against the last plan's targets at the
/// end.
fn run(
    seed: u64,
    hosts: usize,
    loss: u64,
    crash_ms: Option<u64>,
    push: bool,
) -> (u64, u64, Vec<(u64, u64)>) {
    let mut rng = Rng(seed | 1);
    let weights: Vec<u32> = (0..hosts).map(|_| 1 + rng.below(4) as u32).collect();
    let decl = declared(&weights);
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 200))]);
    let mut leader = Leader::new(1, 0, LEASE, DRIFT);
    let mut term = 1;
    // Each host starts holding the tenant's fallback, `limits / N`, as the agent does.
    let cap = (Some(1000 * M / hosts as u64), 200 * M / hosts as u64);
    let vm = BTreeMap::from([(
        "vm".to_string(),
        Share {
            min_bps: 0,
            max_bps: None,
        },
    )]);
    let mut host = vec![Holder::default(); hosts];
    for h in host.iter_mut() {
        h.start("t", cap, &vm);
    }
    let held = |h: &Holder| h.enforcing()["t"];
    let mut demand: Vec<Option<u64>> = (0..hosts).map(|_| None).collect();
    let phase: Vec<u64> = (0..hosts).map(|_| rng.below(10) * 10).collect();
    let mut queue: Vec<(u64, Msg)> = Vec::new();
    let mut last_sent: Vec<Option<u64>> = vec![None; hosts];
    let (mut worst_max, mut worst_min) = (0u64, 0u64);
    for step in 0..1200u64 {
        let now = step * 10 * MS;
        let quiet = step >= 800;
        if crash_ms.is_some_and(|c| step * 10 == c) {
            term += 1;
            leader = Leader::new(term, now, LEASE, DRIFT);
        }
        if step % 10 == 0 {
            if !quiet && rng.below(5) == 0 {
                let i = rng.below(hosts as u64) as usize;
                demand[i] = match rng.below(3) {
                    0 => None,
                    _ => Some(rng.below(900)),
                };
            }
            leader.plan(&decl, &tenants);
        }
        let mut pushed = Vec::new();
        if push {
            pushed.extend(leader.push(now));
        }
        let delay = |rng: &mut Rng, quiet: bool| match !quiet && rng.below(10) == 0 {
            true => (100 + rng.below(41) * 10) * MS,
            false => rng.below(5) * 10 * MS,
        };
        let lost = |rng: &mut Rng, i: usize| {
            (!quiet && rng.below(100) < loss) || (i == 0 && (300..500).contains(&step))
        };
        for (i, ph) in phase.iter().enumerate() {
            if step % 10 == ph / 10 && !lost(&mut rng, i) {
                last_sent[i] = Some(now);
                let r = report(i, demand[i], held(&host[i]));
                let at = now + delay(&mut rng, quiet);
                queue.push((at, Msg::Report(i, r, now)));
            }
        }
        // Deliver what is due, in order of sending.
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut queue)
            .into_iter()
            .partition(|(t, _)| *t <= now);
        queue = later;
        for (_, m) in due {
            match m {
                Msg::Report(i, r, sent) => {
                    let answer = leader.report(r, now);
                    if !lost(&mut rng, i) {
                        let at = now + delay(&mut rng, quiet);
                        queue.push((at, Msg::Answer(i, answer, sent)));
                    }
                    if push {
                        pushed.extend(leader.push(now));
                    }
                }
                Msg::Answer(i, grants, sent) => {
                    host[i].apply(&grants, sent, now);
                }
            }
        }
        for (name, answer) in pushed {
            let i: usize = name[1..].parse().expect("hosts are h0, h1, …");
            if let Some(sent) = last_sent[i].filter(|_| !lost(&mut rng, i)) {
                let at = now + delay(&mut rng, quiet);
                queue.push((at, Msg::Answer(i, answer, sent)));
            }
        }
        for h in host.iter_mut() {
            h.lapse(now);
        }
        let sum = |f: fn(Enforcing) -> u64| {
            host.iter()
                .map(|h| f(held(h)))
                .fold(0u64, u64::saturating_add)
        };
        let sum_max = sum(|e| e.max_bps.unwrap_or(u64::MAX));
        let sum_min = sum(|e| e.min_bps);
        worst_max = worst_max.max(sum_max);
        worst_min = worst_min.max(sum_min);
    }
    // Only the targets are read: they do not depend on the time.
    let view = leader.tenant_view("t", 0);
    let end = host
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let want = view
                .iter()
                .find(|v| v.host == format!("h{i}"))
                .map_or((Some(0), 0), |v| v.target);
            let e = held(h);
            let held = (e.max_bps, e.min_bps);
            (
                want.0.unwrap_or(0).abs_diff(held.0.unwrap_or(0)),
                want.1.abs_diff(held.1),
            )
        })
        .collect();
    (worst_max, worst_min, end)
}

#[test]
fn tenants_hash_to_shards_evenly_and_a_new_shard_takes_only_its_own() {
    let tenants: Vec<String> = (0..4000).map(|t| format!("tenant-{t}")).collect();
    let mut per = [0u32; 8];
    for t in &tenants {
        per[shard_of(t, 8) as usize] += 1;
    }
    // 500 each on average; a fair hash stays within ±20 %.
    assert!(per.iter().all(|&n| (400..=600).contains(&n)), "{per:?}");
    // From 8 to 9 shards a tenant either stays or moves to the new shard, and about 1/9 move.
    let moved = tenants
        .iter()
        .filter(|t| shard_of(t, 9) != shard_of(t, 8))
        .count();
    assert!(tenants
        .iter()
        .all(|t| shard_of(t, 9) == shard_of(t, 8) || shard_of(t, 9) == 8));
    assert!((300..=600).contains(&moved), "{moved}");
    // Stable: the same answer on every host and in every version (values pinned once: a
    // change here moves tenants between shards on a rolling upgrade).
    assert_eq!(
        [shard_of("acme", 8), shard_of("t1", 8), shard_of("t2", 8)],
        [7, 7, 4]
    );
    assert_eq!(shard_of("acme", 1), 0);
    assert_eq!(shard_of("acme", 0), 0);
}

#[test]
fn without_losses_every_host_settles_on_its_target() {
    for push in [false, true] {
        let (max, min, end) = run(42, 4, 0, None, push);
        assert!(max <= 1000 * M && min <= 200 * M, "{max} {min}");
        assert!(end.iter().all(|&d| d == (0, 0)), "{end:?}");
    }
}

proptest! {
    #![proptest_config(proptest_config::config(48))]

    /// The bound: never above the tenant's max (nor its min), whatever the delays,
    /// losses, partition and failover, with pushed answers or without; and once the network is quiet, every host settles on
    /// the split's target.
    #[test]
    fn never_above_the_max_in_transit(
        seed in any::<u64>(),
        hosts in 2usize..7,
        loss in 0u64..40,
        crash in proptest::option::of(100u64..700),
        push in any::<bool>(),
    ) {
        let (max, min, end) = run(seed, hosts, loss, crash.map(|c| c * 10), push);
        prop_assert!(max <= 1000 * M, "Σ max in force {max}");
        prop_assert!(min <= 200 * M, "Σ min in force {min}");
        prop_assert!(end.iter().all(|&d| d == (0, 0)), "not settled: {end:?}");
    }
}

#[test]
fn a_hosts_targets_are_refilled_in_place_only_when_its_vifs_are_the_same() {
    let share = |m: u64| Share {
        min_bps: m,
        max_bps: Some(10 * m),
    };
    let fresh = |run: &[(&str, Share)]| -> BTreeMap<String, Share> {
        run.iter().map(|&(p, s)| (p.to_string(), s)).collect()
    };
    let old = fresh(&[("a", share(1)), ("b", share(2))]);
    // The same vifs: the new targets, in the old map.
    let mut run = vec![("a", share(5)), ("b", share(6))];
    let want = fresh(&run);
    assert_eq!(refill(Some(old.clone()), &mut run), want);
    assert!(run.is_empty());
    // A vif more, a vif less, another name, no old map: made anew, the same result.
    for new in [
        vec![("a", share(5)), ("b", share(6)), ("c", share(7))],
        vec![("b", share(6))],
        vec![("a", share(5)), ("c", share(6))],
    ] {
        let want = fresh(&new);
        assert_eq!(refill(Some(old.clone()), &mut new.clone()), want);
        assert_eq!(refill(None, &mut new.clone()), want);
    }
}

#[path = "aggregator_push_tests.rs"]
mod push;
