//! Per-decision cost of each engine (select + charge of one served batch) and the cost of one
//! accounting pass (`tick`) for 10, 1 000 and 10 000 vifs.
//!
//! Run: `cargo bench -p vqos-sched --bench engines`. Numbers: docs/benchmarks.md.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use vqos_sched::{build, CostModel, EngineKind, PolicySet, ReadySet, Usage, VifPolicy};

fn policies(n: usize, cost: CostModel, kind: EngineKind) -> PolicySet {
    let mut set = (0..n).fold(PolicySet::new(Some(10_000_000_000)), |s, i| {
        s.with_vif(
            &format!("v{i}"),
            VifPolicy {
                weight: 1 + (i % 5) as u32,
                min_bps: if i % 4 == 0 { 1_000_000 } else { 0 },
                // C2TB sells each cap (of the core's cycles, or of the link): for c2qos the
                // caps add up to less than the capacity (it refuses an oversold set).
                max_bps: match (i % 3 == 0, kind) {
                    (false, _) => None,
                    (true, EngineKind::C2qos) => Some(10_000_000_000 / n as u64),
                    (true, _) => Some(5_000_000_000),
                },
                priority: (i % 8) as u8,
                ..Default::default()
            },
        )
    });
    set.cost = cost;
    set
}

/// One served batch: select, then charge 32 frames of 1500 bytes.
fn decision(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision");
    for kind in EngineKind::ALL {
        for n in [8usize, 64] {
            let cost = if kind == EngineKind::C2qos {
                CostModel::Cycles
            } else {
                CostModel::Bytes
            };
            let set = policies(n, cost, kind);
            let mut e = build(kind, &set, 0).expect("valid policies");
            let mut ready = ReadySet::new(n);
            for i in 0..n {
                ready.set(i, true);
            }
            let mut now = 0u64;
            g.bench_with_input(BenchmarkId::new(kind.name(), n), &n, |b, _| {
                b.iter(|| {
                    // 38.4 µs: one 48 KB batch at 10 Gbit/s.
                    now += 38_400;
                    if e.next_tick() <= now {
                        e.tick(&ready, now);
                    }
                    if let Some(grant) = e.select(black_box(&ready), now) {
                        for _ in 0..32 {
                            black_box(e.admit(grant.vif, 1500, now));
                        }
                        e.charge(
                            grant.vif,
                            Usage {
                                packets: 32,
                                bytes: 48_000,
                                cycles: 60_000,
                            },
                            now,
                        );
                    }
                })
            });
        }
    }
    g.finish();
}

/// One accounting pass of the engines that have one.
fn accounting(c: &mut Criterion) {
    let mut g = c.benchmark_group("accounting");
    for kind in [EngineKind::Ancs, EngineKind::C2qos] {
        for n in [10usize, 1_000, 10_000] {
            let set = policies(n, CostModel::Bytes, kind);
            let mut e = build(kind, &set, 0).expect("valid policies");
            let mut ready = ReadySet::new(n);
            for i in (0..n).step_by(2) {
                ready.set(i, true);
            }
            let mut now = 0u64;
            g.bench_with_input(BenchmarkId::new(kind.name(), n), &n, |b, _| {
                b.iter(|| {
                    now = e.next_tick().max(now + 1);
                    e.tick(black_box(&ready), now);
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, decision, accounting);
criterion_main!(benches);
