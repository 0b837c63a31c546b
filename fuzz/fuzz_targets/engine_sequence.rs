//! Any engine driven through vqos-sched's `Engine` trait by an arbitrary sequence of policy
//! changes (`configure`), readiness changes, `select`/`admit`/`charge` batches, ticks and idle
//! time, as a poll loop would: the loop's clock advances by each batch's time on the link.
//!
//! Checked: no panic, no overflow (run with debug assertions); a grant names a configured vif
//! and at most `MAX_BURST` frames; for the engines that enforce a maximum in bytes (`vqos`,
//! `ancs`, `tcm`, `policer`), a vif never forwards more than its maximum over any window from
//! `SETTLE_NS` after the last policy change, plus `SETTLE_NS` of its maximum, its burst (the
//! stated one or the engine's default, which for `vqos` is at least two batches) and one batch;
//! the link never carries more than its capacity plus one batch over such a window.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use vqos_sched::engine::MAX_BURST;
use vqos_sched::testing::harness_cycles;
use vqos_sched::{build, EngineKind, PolicySet, ReadySet, Usage, Verdict, VifPolicy};

/// Allowance for state carried over a policy change (arrears, full buckets, a period's credit).
const SETTLE_NS: u64 = 100_000_000;
/// Largest frame the switch forwards (a GSO super-frame with its headers).
const MAX_FRAME_BYTES: u32 = 65_550;
/// One batch of the largest frames.
const BATCH_BYTES: u64 = MAX_BURST as u64 * MAX_FRAME_BYTES as u64;
/// The longest default burst of the engines checked (`tcm`'s 10 ms; `vqos`'s is 5 ms).
const DEFAULT_BURST_NS: u64 = 10_000_000;

#[derive(Arbitrary, Debug, Clone)]
struct Vif {
    /// Name index: vifs with the same name keep their state across a change.
    name: u8,
    weight: u8,
    min_mbit: Option<u16>,
    max_mbit: Option<u16>,
    priority: u8,
    /// Burst above the max, KiB (0 is invalid: the engine must refuse the set).
    burst_kib: Option<u16>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A live policy change (may be invalid: the engine must keep its configuration).
    Configure(Vec<Vif>),
    /// A vif's queue fills or empties.
    Ready(u8, bool),
    /// The loop asks for a grant and serves up to `frames` frames of `len` bytes.
    Serve { frames: u8, len: u16 },
    /// Idle time, µs.
    Idle(u16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    capacity_mbit: u16,
    vifs: Vec<Vif>,
    ops: Vec<Op>,
}

fn policy_set(capacity_bps: u64, vifs: &[Vif]) -> PolicySet {
    let mut seen = Vec::new();
    let mut set = PolicySet::new(Some(capacity_bps));
    for v in vifs.iter().take(64) {
        if seen.contains(&v.name) {
            continue;
        }
        seen.push(v.name);
        set = set.with_vif(
            &format!("v{}", v.name),
            VifPolicy {
                weight: u32::from(v.weight),
                min_bps: v.min_mbit.map_or(0, |m| u64::from(m) * 1_000_000),
                max_bps: v.max_mbit.map(|m| u64::from(m) * 1_000_000),
                priority: v.priority,
                max_in_bps: None,
                burst_bytes: v.burst_kib.map(|k| u64::from(k) * 1024),
            },
        );
    }
    set
}

/// What has been forwarded since the window began.
struct Window {
    start_ns: u64,
    per_vif: Vec<u64>,
    total: u64,
    max_bps: Vec<Option<u64>>,
    /// Each vif's burst, bytes: the stated one, else the engines' documented default
    /// (docs/design.md: `vqos` 5 ms at the max but at least two batches, `tcm` 10 ms).
    burst_bytes: Vec<u64>,
}

impl Window {
    fn new(set: &PolicySet, now_ns: u64) -> Window {
        Window {
            start_ns: now_ns + SETTLE_NS,
            per_vif: vec![0; set.vifs.len()],
            total: 0,
            max_bps: set.vifs.iter().map(|v| v.policy.max_bps).collect(),
            burst_bytes: set
                .vifs
                .iter()
                .map(|v| match (v.policy.burst_bytes, v.policy.max_bps) {
                    (Some(b), _) => b,
                    // A cap of 0 earns nothing, so its bucket never fills to the two batches.
                    (None, Some(0)) => 0,
                    (None, max) => bytes(max.unwrap_or(0), DEFAULT_BURST_NS) + 2 * BATCH_BYTES,
                })
                .collect(),
        }
    }
}

/// `rate_bps` over `ns` in bytes.
fn bytes(rate_bps: u64, ns: u64) -> u64 {
    (u128::from(rate_bps) * u128::from(ns) / 8_000_000_000) as u64
}

fuzz_target!(|input: Input| {
    let kind = EngineKind::ALL[usize::from(input.kind) % EngineKind::ALL.len()];
    let capacity_bps = u64::from(input.capacity_mbit.max(1)) * 1_000_000;
    let set = policy_set(capacity_bps, &input.vifs);
    let Ok(mut engine) = build(kind, &set, 0) else {
        return;
    };
    let enforces_max = matches!(
        kind,
        EngineKind::Vqos | EngineKind::Ancs | EngineKind::Tcm | EngineKind::Policer
    );
    let mut n = set.vifs.len();
    let mut ready = ReadySet::new(n);
    let mut now: u64 = 0;
    let mut win = Window::new(&set, now);
    for op in input.ops.iter().take(2000) {
        if engine.next_tick() <= now {
            engine.tick(&ready, now);
        }
        match op {
            Op::Configure(vifs) => {
                let set = policy_set(capacity_bps, vifs);
                if engine.configure(&set, now).is_ok() {
                    n = set.vifs.len();
                    ready.resize(n);
                    win = Window::new(&set, now);
                }
            }
            Op::Ready(v, on) => {
                if n > 0 {
                    ready.set(usize::from(*v) % n, *on);
                }
            }
            Op::Idle(us) => now += u64::from(*us) * 1_000,
            Op::Serve { frames, len } => {
                let Some(g) = engine.select(&ready, now) else {
                    // Nothing may go: the loop sleeps until a vif may (at most 10 ms).
                    let wake = engine.eligible_at(now).min(engine.next_tick());
                    now = wake.clamp(now + 1, now + 10_000_000);
                    continue;
                };
                assert!(g.vif < n, "{kind}: grant for vif {} of {n}", g.vif);
                assert!(
                    ready.contains(g.vif),
                    "{kind}: grant for a vif that is not ready"
                );
                assert!(
                    g.max_packets <= MAX_BURST,
                    "{kind}: {} frames",
                    g.max_packets
                );
                let len = u32::from(*len).clamp(60, MAX_FRAME_BYTES);
                let read = u16::from(*frames).min(g.max_packets);
                let (mut packets, mut fwd) = (0u32, 0u64);
                for _ in 0..read {
                    if engine.admit(g.vif, len, now) != Verdict::Drop {
                        packets += 1;
                        fwd += u64::from(len);
                    }
                }
                // The batch's time on the link.
                now += (u128::from(fwd) * 8_000_000_000 / u128::from(capacity_bps)) as u64 + 1;
                let usage = Usage {
                    packets,
                    bytes: fwd,
                    cycles: harness_cycles(u64::from(read), u64::from(read) * u64::from(len)),
                };
                engine.charge(g.vif, usage, now);
                if read < u16::from(*frames) || read == 0 {
                    ready.set(g.vif, false);
                }
                if now < win.start_ns {
                    continue;
                }
                win.per_vif[g.vif] += fwd;
                win.total += fwd;
                let span = now - win.start_ns;
                assert!(
                    win.total <= bytes(capacity_bps, span + 1) + BATCH_BYTES,
                    "{kind}: {} bytes on a {capacity_bps} bit/s link in {span} ns",
                    win.total
                );
                if let (true, Some(max)) = (enforces_max, win.max_bps[g.vif]) {
                    let allowed =
                        bytes(max, span + SETTLE_NS) + BATCH_BYTES + win.burst_bytes[g.vif];
                    assert!(
                        win.per_vif[g.vif] <= allowed,
                        "{kind}: vif {} forwarded {} bytes in {span} ns, max {max} bit/s \
                         allows {allowed}",
                        g.vif,
                        win.per_vif[g.vif]
                    );
                }
            }
        }
    }
});
