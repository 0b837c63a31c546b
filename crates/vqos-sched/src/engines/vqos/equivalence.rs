//! The index against the scan it replaced: the same random sequence of calls (policy changes,
//! vifs joining and leaving, readiness, decisions, admits, charges, ticks, idle time) into the
//! engine and into the reference scan (`scan.rs`), and after every call the same decision,
//! system virtual time, tags, stats and wake-up time. Fixed seed (`proptest_config`).

use proptest::prelude::*;

use super::scan::ScanVqos;
use super::Vqos;
use crate::engine::{Engine, ReadySet, Usage};
use crate::policy::{CostModel, PolicySet, VifPolicy};

const MBIT: u64 = 1_000_000;

/// Link of the policy sets, bits/s.
const CAPACITY_BPS: u64 = 1_000 * MBIT;

/// One step of a poll loop, or of the control plane, applied to both engines.
#[derive(Debug, Clone)]
enum Op {
    /// `select` `dt_ns` later; if granted, `admit` `frames` frames of `len` bytes and `charge`
    /// the batch when its bytes have left at 1 Gbit/s (a poll loop's turn).
    Serve {
        dt_ns: u64,
        frames: u32,
        len: u32,
        cycles_per_frame: u64,
    },
    /// `select` alone (the loop read nothing).
    Select { dt_ns: u64 },
    /// A charge of any vif, granted or not, maybe past the end.
    Charge { vif: usize, bytes: u64, cycles: u64 },
    /// One vif's readiness (ids past the configured vifs included).
    Ready { vif: usize, on: bool },
    /// Every vif's readiness.
    AllReady(bool),
    /// A new policy for one vif.
    Policy { vif: usize, policy: VifPolicy },
    /// A vif leaves (the others' states follow their names to new ids).
    Remove(usize),
    /// A new vif joins at the end.
    Add(VifPolicy),
    /// Time passes.
    Idle { dt_ns: u64 },
    /// `tick` (the engine has no accounting to run).
    Tick,
}

/// Few distinct values, so that tags, owed times and priorities tie often.
fn policy() -> impl Strategy<Value = VifPolicy> {
    (
        prop::sample::select(vec![1u32, 1, 2, 3, 1000]),
        // 4 bit/s is a floor of 0 bytes/s: a floor bucket that never refills.
        prop::sample::select(vec![0, 0, 0, 0, 0, 0, 4, MBIT, 20 * MBIT, 150 * MBIT]),
        prop::option::of(prop::sample::select(vec![
            0,
            8 * MBIT,
            80 * MBIT,
            400 * MBIT,
        ])),
        prop::sample::select(vec![0u8, 3, 7, 7]),
        prop::option::of(prop::sample::select(vec![1u64, 1500, 100_000])),
    )
        .prop_map(|(weight, min, max, priority, burst)| VifPolicy {
            weight,
            min_bps: min.min(max.unwrap_or(u64::MAX)),
            max_bps: max,
            priority,
            burst_bytes: burst,
            ..Default::default()
        })
}

fn dt() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![0, 1, 700, 38_400, 38_400, 1_000_000, 30_000_000])
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (dt(), 0u32..=32, prop::sample::select(vec![64u32, 1500, 65_536]),
               prop::sample::select(vec![0u64, 300, 2_000]))
            .prop_map(|(dt_ns, frames, len, cycles_per_frame)| Op::Serve {
                dt_ns, frames, len, cycles_per_frame
            }),
        2 => dt().prop_map(|dt_ns| Op::Select { dt_ns }),
        2 => (0usize..80, prop::sample::select(vec![0u64, 1, 1500, 48_000, 2_000_000]),
              prop::sample::select(vec![0u64, 1, 60_000, 5_000_000]))
            .prop_map(|(vif, bytes, cycles)| Op::Charge { vif, bytes, cycles }),
        5 => (0usize..80, any::<bool>()).prop_map(|(vif, on)| Op::Ready { vif, on }),
        1 => any::<bool>().prop_map(Op::AllReady),
        1 => (0usize..80, policy()).prop_map(|(vif, policy)| Op::Policy { vif, policy }),
        1 => (0usize..80).prop_map(Op::Remove),
        1 => policy().prop_map(Op::Add),
        2 => prop::sample::select(vec![1_000_000u64, 200_000_000, 3_000_000_000])
            .prop_map(|dt_ns| Op::Idle { dt_ns }),
        1 => Just(Op::Tick),
    ]
}

/// A valid starting set: floors dropped once they would exceed the link.
fn policy_set() -> impl Strategy<Value = PolicySet> {
    (
        prop_oneof![
            prop::collection::vec(policy(), 1..=4),
            prop::collection::vec(policy(), 1..=70),
        ],
        any::<bool>(),
    )
        .prop_map(|(policies, cycles)| {
            let mut floors = 0;
            let mut set = PolicySet::new(Some(CAPACITY_BPS));
            for (i, mut p) in policies.into_iter().enumerate() {
                if floors + p.min_bps > CAPACITY_BPS {
                    p.min_bps = 0;
                }
                floors += p.min_bps;
                set = set.with_vif(&format!("v{i}"), p);
            }
            if cycles {
                set.cost = CostModel::Cycles;
            }
            set
        })
}

/// The two engines, the loop's view of readiness and time.
struct Pair {
    fast: Vqos,
    scan: ScanVqos,
    set: PolicySet,
    /// Readiness by vif id; three ids past the configured vifs, which both must ignore.
    ready: Vec<bool>,
    now_ns: u64,
    /// Next new vif's name number.
    next_name: usize,
}

impl Pair {
    /// Both engines configured with `set`; `ready` by vif id, plus three ids past the end.
    fn new(set: PolicySet, ready: &[bool]) -> Result<Pair, TestCaseError> {
        let mut pair = Pair {
            fast: Vqos::new(),
            scan: ScanVqos::new(),
            ready: ready[..set.len() + 3].to_vec(),
            next_name: set.len(),
            set: PolicySet::new(Some(CAPACITY_BPS)),
            now_ns: 0,
        };
        pair.configure(set)?;
        Ok(pair)
    }

    fn ready_set(&self) -> ReadySet {
        let mut r = ReadySet::new(self.ready.len());
        for (id, &on) in self.ready.iter().enumerate() {
            r.set(id, on);
        }
        r
    }

    fn select(&mut self) -> Result<Option<usize>, TestCaseError> {
        let ready = self.ready_set();
        let a = self.fast.select(&ready, self.now_ns);
        let b = self.scan.select(&ready, self.now_ns);
        prop_assert_eq!(a, b, "select at {} ns", self.now_ns);
        Ok(a.map(|g| g.vif))
    }

    fn charge(&mut self, vif: usize, usage: Usage) {
        self.fast.charge(vif, usage, self.now_ns);
        self.scan.charge(vif, usage, self.now_ns);
    }

    fn configure(&mut self, set: PolicySet) -> Result<(), TestCaseError> {
        let a = self.fast.configure(&set, self.now_ns);
        let b = self.scan.configure(&set, self.now_ns);
        prop_assert_eq!(&a, &b);
        if a.is_ok() {
            self.set = set;
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Serve {
                dt_ns,
                frames,
                len,
                cycles_per_frame,
            } => {
                self.now_ns += dt_ns;
                if let Some(vif) = self.select()? {
                    let mut usage = Usage::default();
                    for _ in 0..frames {
                        let a = self.fast.admit(vif, len, self.now_ns);
                        prop_assert_eq!(a, self.scan.admit(vif, len, self.now_ns));
                        usage.packets += 1;
                        usage.bytes += u64::from(len);
                        usage.cycles += cycles_per_frame;
                    }
                    self.now_ns += usage.bytes * 8 + 1;
                    self.charge(vif, usage);
                }
            }
            Op::Select { dt_ns } => {
                self.now_ns += dt_ns;
                self.select()?;
            }
            Op::Charge { vif, bytes, cycles } => {
                let usage = Usage {
                    packets: 1,
                    bytes,
                    cycles,
                };
                self.charge(vif, usage);
            }
            Op::Ready { vif, on } => {
                let n = self.ready.len();
                self.ready[vif % n] = on;
            }
            Op::AllReady(on) => self.ready.fill(on),
            Op::Policy { vif, ref policy } => {
                if !self.set.is_empty() {
                    let mut set = self.set.clone();
                    let n = set.len();
                    set.vifs[vif % n].policy = policy.clone();
                    self.configure(set)?;
                }
            }
            Op::Remove(vif) => {
                if !self.set.is_empty() {
                    let mut set = self.set.clone();
                    let id = vif % set.len();
                    set.vifs.remove(id);
                    self.configure(set)?;
                    if self.set.len() < self.ready.len() - 3 {
                        self.ready.remove(id);
                    }
                }
            }
            Op::Add(ref policy) => {
                let set = self
                    .set
                    .clone()
                    .with_vif(&format!("v{}", self.next_name), policy.clone());
                self.next_name += 1;
                self.configure(set)?;
                if self.set.len() + 3 > self.ready.len() {
                    self.ready.insert(self.set.len() - 1, true);
                }
            }
            Op::Idle { dt_ns } => self.now_ns += dt_ns,
            Op::Tick => {
                let ready = self.ready_set();
                self.fast.tick(&ready, self.now_ns);
                self.scan.tick(&ready, self.now_ns);
            }
        }
        self.compare()
    }

    /// Everything a caller (or the next decision) can see is the same.
    fn compare(&self) -> Result<(), TestCaseError> {
        let (a, b) = (&self.fast.core, &self.scan.core);
        prop_assert_eq!(a.vtime, b.vtime);
        prop_assert_eq!(a.max_batch_cost, b.max_batch_cost);
        for (id, (x, y)) in a.vifs.iter().zip(&b.vifs).enumerate() {
            prop_assert_eq!(&x.name, &y.name);
            prop_assert_eq!(x.tag, y.tag, "tag of vif {}", id);
            prop_assert_eq!(x.active, y.active, "active flag of vif {}", id);
            prop_assert_eq!(x.served_cost, y.served_cost);
        }
        for id in 0..self.ready.len() {
            prop_assert_eq!(
                self.fast.vif_state(id),
                self.scan.vif_state(id),
                "stats of vif {}",
                id
            );
        }
        prop_assert_eq!(
            self.fast.eligible_at(self.now_ns),
            self.scan.eligible_at(self.now_ns)
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(crate::proptest_config::config(256))]

    #[test]
    fn index_decides_as_the_scan(
        set in policy_set(),
        initially_ready in prop::collection::vec(any::<bool>(), 73),
        ops in prop::collection::vec(op(), 1..500),
    ) {
        let mut pair = Pair::new(set, &initially_ready)?;
        for op in &ops {
            pair.apply(op)?;
        }
    }
}

/// Charging a vif that is never chosen pushes a fair entry per charge that never surfaces:
/// the heap is compacted, so it stays within twice its live entries plus the margin, and the
/// decisions stay the scan's.
#[test]
fn charging_a_vif_never_chosen_keeps_its_heap_bounded() {
    let set = PolicySet::new(Some(CAPACITY_BPS))
        .with_vif("a", VifPolicy::default())
        .with_vif("b", VifPolicy::default());
    let mut pair = Pair::new(set, &[true; 5]).unwrap();
    assert_eq!(pair.select().unwrap(), Some(0));
    let one = Usage {
        packets: 1,
        bytes: 1,
        cycles: 1,
    };
    for _ in 0..1_000 {
        pair.charge(1, one);
        assert!(pair.fast.index.fair_entries() <= 2 * 2 + super::index::COMPACT_MARGIN);
    }
    pair.compare().unwrap();
    for _ in 0..10 {
        let vif = pair.select().unwrap().unwrap();
        pair.charge(vif, one);
        pair.compare().unwrap();
    }
}

/// The engines benchmark's decision case (`benches/engines.rs`, 64 backlogged vifs: weights
/// 1–5, a 1 Mbit/s floor on every 4th, a cap on every 3rd, priorities 0–7, 48 KB batches every
/// 38.4 µs): the scan's decisions, and after the first round the floor tier is empty (every
/// share is above its floor), so a decision costs heap tops, not a scan.
#[test]
fn benchmark_mix_decides_as_the_scan_with_an_empty_floor_tier() {
    let n = 64;
    let set = (0..n).fold(PolicySet::new(Some(10_000_000_000)), |s, i| {
        s.with_vif(
            &format!("v{i}"),
            VifPolicy {
                weight: 1 + (i % 5) as u32,
                min_bps: if i % 4 == 0 { MBIT } else { 0 },
                max_bps: (i % 3 == 0).then_some(5_000_000_000),
                priority: (i % 8) as u8,
                ..Default::default()
            },
        )
    });
    let mut pair = Pair::new(set, &[true; 64 + 3]).unwrap();
    let batch = Usage {
        packets: 32,
        bytes: 48_000,
        cycles: 60_000,
    };
    for decision in 0..20_000 {
        pair.now_ns += 38_400;
        let vif = pair.select().unwrap().expect("all backlogged");
        pair.charge(vif, batch);
        if decision >= n {
            assert_eq!(pair.fast.index.floor_tier_len(), 0, "decision {decision}");
        }
        assert!(pair.fast.index.fair_entries() <= 2 * n + super::index::COMPACT_MARGIN);
    }
    pair.compare().unwrap();
}
