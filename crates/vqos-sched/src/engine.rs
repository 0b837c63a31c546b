//! The [`Engine`] trait: the one interface between a poll loop (the switch's or the simulator's)
//! and a scheduling algorithm.
//!
//! A poll loop does, forever:
//! 1. `tick(now)` when `next_tick()` is due (periodic accounting: ANCS's 30 ms, C2QoS's 50 µs);
//! 2. `select(ready, now)`: which vif may be served now, among those with frames waiting;
//!    `None` means nobody may be served before `eligible_at()` — the loop sleeps or polls;
//! 3. reads at most [`Grant::max_packets`] frames from that vif, asks `admit()` per frame
//!    (policers that drop instead of back-pressure decide here);
//! 4. `charge(vif, usage, now)` with what the batch really cost (bytes, packets, cycles).
//!
//! A vif the engine refuses is simply not read: its frames wait in its own queue (the TAP queue,
//! the guest's ring) and the guest feels back-pressure. Engines never queue packets.
//!
//! Time is always a parameter (`now_ns`, nanoseconds on any monotonic clock).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::policy::{CostModel, PolicyError, PolicySet, VifId};

/// Most frames a poll loop serves from one vif in one batch (as OVS's `NETDEV_MAX_BURST`).
pub const MAX_BURST: u16 = 32;

/// The set of vifs that have frames waiting, as a bitset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadySet {
    words: Vec<u64>,
    len: usize,
}

impl ReadySet {
    /// An empty set able to hold vifs `0..len`.
    pub fn new(len: usize) -> Self {
        ReadySet {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// Capacity in vifs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the set can hold no vif.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Grows or shrinks to hold `len` vifs, keeping the bits that remain.
    pub fn resize(&mut self, len: usize) {
        self.words.resize(len.div_ceil(64), 0);
        if !len.is_multiple_of(64) {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u64 << (len % 64)) - 1;
            }
        }
        self.len = len;
    }

    /// Marks `vif` as having (`true`) or not having frames waiting.
    #[inline]
    pub fn set(&mut self, vif: VifId, ready: bool) {
        debug_assert!(vif < self.len);
        let (w, b) = (vif / 64, vif % 64);
        if ready {
            self.words[w] |= 1 << b;
        } else {
            self.words[w] &= !(1 << b);
        }
    }

    /// True when `vif` has frames waiting.
    #[inline]
    pub fn contains(&self, vif: VifId) -> bool {
        vif < self.len && self.words[vif / 64] & (1 << (vif % 64)) != 0
    }

    /// True when no vif has frames waiting.
    pub fn none(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The first ready vif at or after `from`, wrapping around (round-robin scans).
    #[inline]
    pub fn next_from(&self, from: VifId) -> Option<VifId> {
        if self.len == 0 {
            return None;
        }
        let from = from % self.len;
        self.scan(from, self.len).or_else(|| self.scan(0, from))
    }

    fn scan(&self, start: usize, end: usize) -> Option<VifId> {
        let mut i = start;
        while i < end {
            let w = self.words[i / 64] >> (i % 64);
            if w != 0 {
                let hit = i + w.trailing_zeros() as usize;
                return (hit < end).then_some(hit);
            }
            i = (i / 64 + 1) * 64;
        }
        None
    }

    /// The first vif at or after `from` (wrapping) that is in both `self` and `other`: a
    /// round-robin choice among ready vifs that also hold credit. Leapfrogs between the two
    /// sets, so long runs of vifs in only one of them are skipped a word at a time.
    #[inline]
    pub fn next_common_from(&self, other: &ReadySet, from: VifId) -> Option<VifId> {
        let n = self.len.min(other.len);
        if n == 0 {
            return None;
        }
        let from = from % n;
        self.leapfrog(other, from, n)
            .or_else(|| self.leapfrog(other, 0, from))
    }

    fn leapfrog(&self, other: &ReadySet, start: usize, end: usize) -> Option<VifId> {
        let mut i = start;
        while i < end {
            let e = self.scan(i, end)?;
            let r = other.scan(e, end)?;
            if r == e {
                return Some(e);
            }
            i = r;
        }
        None
    }

    /// Word `i` of the bitset (vifs `64·i .. 64·i + 64`, bit `v % 64` for vif `v`); 0 past the
    /// end.
    #[inline]
    pub(crate) fn word(&self, i: usize) -> u64 {
        self.words.get(i).copied().unwrap_or(0)
    }

    /// Iterates over the ready vifs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = VifId> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut bits = w;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(wi * 64 + b)
            })
        })
    }
}

/// Permission to serve one batch of a vif.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The vif to serve.
    pub vif: VifId,
    /// Frames the loop may take, 1..=[`MAX_BURST`].
    pub max_packets: u16,
}

/// What one served batch cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Frames the batch costs its vif: those admitted, and those the switch itself dropped
    /// (malformed, spoofed, refused by a guard, hairpin, storm), never those the engine's own
    /// `admit` refused (a policer's drop is already its decision).
    pub packets: u32,
    /// Bytes on the wire of those frames.
    pub bytes: u64,
    /// CPU cycles the batch took (all frames read, including those dropped).
    pub cycles: u64,
}

impl Usage {
    /// The cost of this usage under `model`.
    #[inline]
    pub fn cost(&self, model: CostModel) -> u64 {
        match model {
            CostModel::Bytes => self.bytes,
            CostModel::Cycles => self.cycles,
        }
    }
}

/// What to do with one frame of a granted batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Forward,
    /// Forward it with ECN Congestion Experienced set (if the frame is ECN-capable).
    MarkCe,
    /// Drop it: the policer found it out of profile (counted as `policed`).
    Drop,
}

/// Per-vif state an engine exposes for stats and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VifEngineState {
    /// Credit or tokens left, in the engine's cost unit (may be negative where debt is allowed).
    pub credit: i64,
    /// Credit granted at the last accounting (per period), where the engine has periods.
    pub credit_per_period: i64,
    /// True when the engine currently refuses to serve the vif.
    pub throttled: bool,
}

/// Which algorithm; `FromStr`/`Display` use the names of the CLI and the scenario files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// Round-robin, no policy (native Xen netback).
    Rr,
    /// ANCS credit scheduler (30 ms accounting).
    Ancs,
    /// Per-vif token bucket that back-pressures (Xen vif credit limiter).
    Policer,
    /// Three-colour markers that drop red frames (RFC 2697/2698, OVS-DPDK policers).
    Tcm,
    /// C2QoS: cycle token buckets with hierarchical batch scheduling.
    C2qos,
    /// Ours: weighted max-min with floors, caps, priorities; bytes or cycles.
    Vqos,
}

impl EngineKind {
    /// Every engine, in the order the docs list them.
    pub const ALL: [EngineKind; 6] = [
        EngineKind::Rr,
        EngineKind::Ancs,
        EngineKind::Policer,
        EngineKind::Tcm,
        EngineKind::C2qos,
        EngineKind::Vqos,
    ];

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Rr => "rr",
            EngineKind::Ancs => "ancs",
            EngineKind::Policer => "policer",
            EngineKind::Tcm => "tcm",
            EngineKind::C2qos => "c2qos",
            EngineKind::Vqos => "vqos",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = EngineKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "Unknown engine '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// A scheduling algorithm driven by a poll loop. See the module docs for the calling protocol.
pub trait Engine: Send {
    /// Which algorithm this is.
    fn kind(&self) -> EngineKind;

    /// Installs a (new) policy snapshot. Called once before the first `select` and again for
    /// every live change; vif ids are the indices of `policies.vifs`. On error the engine keeps
    /// its previous configuration.
    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError>;

    /// Chooses the vif to serve next among `ready`, or `None` if none may be served now.
    fn select(&mut self, ready: &ReadySet, now_ns: u64) -> Option<Grant>;

    /// True when [`Engine::admit`] can rule anything but [`Verdict::Forward`]. Engines that
    /// only back-pressure say false (the default), and the [`crate::Scheduler`] then does not
    /// call `admit` at all: a virtual call per frame measured about 3 % of a 64-byte frame's
    /// cycles (docs/benchmarks.md). An engine that overrides `admit` must say true.
    fn polices(&self) -> bool {
        false
    }

    /// Per-frame verdict inside a granted batch. Engines that only back-pressure forward all.
    #[inline]
    fn admit(&mut self, _vif: VifId, _len_bytes: u32, _now_ns: u64) -> Verdict {
        Verdict::Forward
    }

    /// Charges the vif for a batch it was granted.
    fn charge(&mut self, vif: VifId, usage: Usage, now_ns: u64);

    /// When `tick` must next run (absolute ns); `u64::MAX` if never.
    fn next_tick(&self) -> u64 {
        u64::MAX
    }

    /// Periodic accounting; a call before `next_tick()` is harmless.
    fn tick(&mut self, _ready: &ReadySet, _now_ns: u64) {}

    /// Earliest time at which a vif refused now could become eligible (token refill), so an
    /// idle loop knows how long it may sleep; `u64::MAX` if only a tick or new frames can help.
    fn eligible_at(&self, _now_ns: u64) -> u64 {
        u64::MAX
    }

    /// State of one vif for stats.
    fn vif_state(&self, _vif: VifId) -> VifEngineState {
        VifEngineState::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_set_round_robin_scan() {
        let mut r = ReadySet::new(130);
        assert_eq!(r.next_from(0), None);
        r.set(3, true);
        r.set(70, true);
        r.set(129, true);
        assert_eq!(r.next_from(0), Some(3));
        assert_eq!(r.next_from(4), Some(70));
        assert_eq!(r.next_from(71), Some(129));
        assert_eq!(r.next_from(130), Some(3));
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![3, 70, 129]);
        r.set(70, false);
        assert_eq!(r.next_from(4), Some(129));
        r.resize(100);
        assert!(!r.contains(129));
        assert_eq!(r.next_from(4), Some(3));
    }

    #[test]
    fn common_members_round_robin() {
        let mut a = ReadySet::new(200);
        let mut b = ReadySet::new(200);
        for v in [3, 70, 130, 199] {
            a.set(v, true);
        }
        for v in [5, 70, 131, 199] {
            b.set(v, true);
        }
        assert_eq!(a.next_common_from(&b, 0), Some(70));
        assert_eq!(a.next_common_from(&b, 71), Some(199));
        assert_eq!(a.next_common_from(&b, 200), Some(70));
        b.set(70, false);
        b.set(199, false);
        assert_eq!(a.next_common_from(&b, 0), None);
        assert_eq!(a.next_common_from(&ReadySet::new(0), 0), None);
    }

    #[test]
    fn engine_names_roundtrip() {
        for k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>(), Ok(k));
        }
        assert!("wfq"
            .parse::<EngineKind>()
            .unwrap_err()
            .contains("rr, ancs"));
    }
}
