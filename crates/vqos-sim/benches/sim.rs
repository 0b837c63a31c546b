//! Simulator speed: simulated seconds per wall second for 5 and 1 000 vifs of greedy TCP.
//!
//! Run: `cargo bench -p vqos-sim --bench sim`. Numbers: docs/benchmarks.md.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vqos_sim::{simulate, Scenario};

fn scenario(n: usize, engine: &str, secs: u32) -> Scenario {
    let mut text = format!(
        "name = \"bench\"\nduration = \"{secs}s\"\ncapacity = \"940Mbit\"\nengine = \"{engine}\"\n"
    );
    for i in 0..n {
        text.push_str(&format!(
            "[[vm]]\nname = \"vm{i}\"\nweight = {}\n",
            1 + i % 5
        ));
    }
    Scenario::parse(&text).expect("valid scenario")
}

fn speed(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim");
    g.sample_size(10);
    for (n, secs) in [(5usize, 5u32), (1_000, 1)] {
        for engine in ["vqos", "ancs"] {
            let sc = scenario(n, engine, secs);
            g.bench_with_input(
                BenchmarkId::new(format!("{engine}-{secs}s-simulated"), n),
                &n,
                |b, _| b.iter(|| simulate(&sc, 1).expect("runs")),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, speed);
criterion_main!(benches);
