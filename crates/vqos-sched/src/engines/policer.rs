//! `policer`: a per-vif token bucket with a rate and a window — Xen netback's vif credit limiter
//! (`vif = [ 'rate=10Mb/s@50ms' ]`) and, in spirit, OVS's ingress policing.
//!
//! ## Behavior
//! - A vif with a maximum (`max_bps`) gets `credit_bytes = max_bps / 8 × window` (10 Mbit/s over
//!   the default 50 ms window = 62 500 bytes). That is both the size of its bucket and what is
//!   added at every window boundary; the bucket never holds more than one window's credit, so
//!   the longest burst is one window's worth. Fractions of a byte are carried to the next window.
//! - A policy's `burst_bytes` deepens the bucket (not the credit per window): an idle vif saves
//!   up to the burst and sends it above its max, then one window's credit per window. A burst
//!   below one window's credit is raised to it (the rate needs a window's credit to fit).
//! - A vif without a maximum is unlimited: always eligible.
//! - Back-pressure, never drops: a vif whose credit is used up is not selected (its frames wait
//!   in its own queue); the others are served round-robin. The frames of a batch are only known
//!   once read, so the batch is charged after it is served and credit may dip below zero by at
//!   most one batch; that debt is repaid from the next window's credit, so the long-run rate is
//!   the configured one.
//! - Windows are aligned on a grid that starts at the first `configure`: the replenishment runs
//!   in `tick` (every window) and lazily in `select`; `eligible_at` is the next window boundary.
//!   Xen restarts a vif's window whenever it replenishes lazily, so an idle vif's window drifts;
//!   we keep the grid, which makes the long-run rate exact.
//! - Live changes: vifs that persist (same name) keep their credit, cut to the new bucket if it
//!   is smaller; new vifs start with a full bucket (as Xen's credit starts full); a new rate
//!   applies to the next replenishment.
//!
//! ## Limitations
//! - Weights and minimums are ignored: this is a limiter, not a sharer (the Xen baseline).
//! - Not work-conserving: a limited vif stays limited when the link is idle.
//! - If `tick`/`select` run late by several windows, the credit of the missed windows is added
//!   at once, still capped to one window's worth.

use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, VifEngineState, MAX_BURST};
use crate::engines::{by_name, rate_bytes};
use crate::policy::{PolicyError, PolicySet, VifId};

/// Xen's default credit window: 50 ms.
pub const DEFAULT_WINDOW_NS: u64 = 50_000_000;

/// One vif's bucket.
#[derive(Debug, Clone)]
struct VifBucket {
    /// The vif's name, to carry its credit across live policy changes.
    name: String,
    /// Rate, bits/s (`None` = unlimited).
    rate_bps: Option<u64>,
    /// Credit per window, bytes (rate × window, rounded down).
    credit_bytes: i64,
    /// Most credit the bucket holds, bytes: the policy's burst, at least one window's credit.
    bucket_bytes: i64,
    /// Fraction of a byte of credit carried to the next window (over 8 × 10⁹).
    credit_frac: u64,
    /// Credit left, bytes; negative by at most one batch (charged after).
    remaining_credit: i64,
}

impl VifBucket {
    #[inline]
    fn eligible(&self) -> bool {
        self.rate_bps.is_none() || self.remaining_credit > 0
    }
}

/// The token-bucket policer engine. See the module docs.
#[derive(Debug)]
pub struct Policer {
    /// Replenishment window, ns.
    window_ns: u64,
    /// Per-vif buckets, indexed by [`VifId`].
    vifs: Vec<VifBucket>,
    /// Vifs that may be served (unlimited, or credit left).
    eligible: ReadySet,
    /// Round-robin cursor: one past the vif served last.
    cursor: VifId,
    /// Next window boundary, ns; `u64::MAX` before `configure`.
    next_replenish_ns: u64,
    /// At least one vif has a rate (otherwise no ticks are needed).
    any_limited: bool,
}

impl Default for Policer {
    fn default() -> Self {
        Self::new()
    }
}

impl Policer {
    /// A policer with Xen's 50 ms window.
    pub fn new() -> Self {
        Self::with_window_ns(DEFAULT_WINDOW_NS)
    }

    /// A policer with another window (at least 1 µs).
    pub fn with_window_ns(window_ns: u64) -> Self {
        Policer {
            window_ns: window_ns.max(1_000),
            vifs: Vec::new(),
            eligible: ReadySet::new(0),
            cursor: 0,
            next_replenish_ns: u64::MAX,
            any_limited: false,
        }
    }

    /// The replenishment window, ns.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Credit per window of `vif` in bytes (`None` = unlimited or unknown vif).
    pub fn credit_bytes(&self, vif: VifId) -> Option<i64> {
        let v = self.vifs.get(vif)?;
        v.rate_bps.map(|_| v.credit_bytes)
    }

    /// Adds the credit of every window boundary passed by `now_ns`.
    fn replenish(&mut self, now_ns: u64) {
        if now_ns < self.next_replenish_ns {
            return;
        }
        let windows = (now_ns - self.next_replenish_ns) / self.window_ns + 1;
        self.next_replenish_ns = self
            .next_replenish_ns
            .saturating_add(windows.saturating_mul(self.window_ns));
        let span_ns = windows.saturating_mul(self.window_ns);
        for (id, v) in self.vifs.iter_mut().enumerate() {
            if let Some(rate) = v.rate_bps {
                let add = rate_bytes(rate, span_ns, &mut v.credit_frac);
                // A single window whose carried fraction tipped over adds one byte more than
                // the bucket size; let it in, or a greedy vif would lose that byte.
                let bucket = if windows == 1 {
                    v.bucket_bytes.max(add)
                } else {
                    v.bucket_bytes
                };
                v.remaining_credit = v.remaining_credit.saturating_add(add).min(bucket);
                self.eligible.set(id, v.eligible());
            }
        }
    }
}

impl Engine for Policer {
    fn kind(&self) -> EngineKind {
        EngineKind::Policer
    }

    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        policies.validate()?;
        if self.next_replenish_ns == u64::MAX {
            self.next_replenish_ns = now_ns.saturating_add(self.window_ns);
        } else {
            // Credit of the windows that ended under the old rates.
            self.replenish(now_ns);
        }
        let mut old = by_name(std::mem::take(&mut self.vifs), |v| &v.name);
        let mut vifs = Vec::with_capacity(policies.len());
        for spec in &policies.vifs {
            let rate_bps = spec.policy.max_bps;
            let mut frac = 0;
            let credit_bytes = rate_bps.map_or(0, |r| rate_bytes(r, self.window_ns, &mut frac));
            let burst = spec.policy.burst_bytes.map_or(0, |b| b as i64);
            let bucket_bytes = credit_bytes.max(burst);
            let (remaining_credit, credit_frac) = match old.remove(&spec.name) {
                Some((_, o)) if o.rate_bps.is_some() => {
                    let frac = if o.rate_bps == rate_bps {
                        o.credit_frac
                    } else {
                        0
                    };
                    (o.remaining_credit.min(bucket_bytes), frac)
                }
                _ => (bucket_bytes, 0),
            };
            vifs.push(VifBucket {
                name: spec.name.clone(),
                rate_bps,
                credit_bytes,
                bucket_bytes,
                credit_frac,
                remaining_credit,
            });
        }
        self.vifs = vifs;
        self.any_limited = self.vifs.iter().any(|v| v.rate_bps.is_some());
        self.eligible = ReadySet::new(self.vifs.len());
        for (id, v) in self.vifs.iter().enumerate() {
            self.eligible.set(id, v.eligible());
        }
        if self.cursor >= self.vifs.len() {
            self.cursor = 0;
        }
        Ok(())
    }

    fn select(&mut self, ready: &ReadySet, now_ns: u64) -> Option<Grant> {
        self.replenish(now_ns);
        let vif = self.eligible.next_common_from(ready, self.cursor)?;
        self.cursor = (vif + 1) % self.vifs.len().max(1);
        Some(Grant {
            vif,
            max_packets: MAX_BURST,
        })
    }

    fn charge(&mut self, vif: VifId, usage: Usage, _now_ns: u64) {
        let Some(v) = self.vifs.get_mut(vif) else {
            return;
        };
        if v.rate_bps.is_some() {
            let bytes = i64::try_from(usage.bytes).unwrap_or(i64::MAX);
            v.remaining_credit = v.remaining_credit.saturating_sub(bytes);
            self.eligible.set(vif, v.eligible());
        }
    }

    fn next_tick(&self) -> u64 {
        if self.any_limited {
            self.next_replenish_ns
        } else {
            u64::MAX
        }
    }

    fn tick(&mut self, _ready: &ReadySet, now_ns: u64) {
        self.replenish(now_ns);
    }

    fn eligible_at(&self, _now_ns: u64) -> u64 {
        self.next_tick()
    }

    fn vif_state(&self, vif: VifId) -> VifEngineState {
        self.vifs
            .get(vif)
            .map(|v| VifEngineState {
                credit: if v.rate_bps.is_some() {
                    v.remaining_credit
                } else {
                    0
                },
                credit_per_period: if v.rate_bps.is_some() {
                    v.credit_bytes
                } else {
                    0
                },
                throttled: !v.eligible(),
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::testkit::{rates, Harness, Source};
    use crate::policy::VifPolicy;
    use crate::units::NS_PER_SEC;

    const SEC: u64 = NS_PER_SEC;
    const MBIT: u64 = 1_000_000;

    fn set(limit_bps: Option<u64>) -> PolicySet {
        PolicySet::new(Some(100 * MBIT))
            .with_vif(
                "limited",
                VifPolicy {
                    max_bps: limit_bps,
                    ..Default::default()
                },
            )
            .with_vif("free", VifPolicy::default())
    }

    #[test]
    fn credit_is_rate_times_window() {
        let mut p = Policer::new();
        p.configure(&set(Some(10 * MBIT)), 0).unwrap();
        assert_eq!(p.credit_bytes(0), Some(62_500));
        assert_eq!(p.credit_bytes(1), None);
        let s = p.vif_state(0);
        assert_eq!(
            (s.credit, s.credit_per_period, s.throttled),
            (62_500, 62_500, false)
        );
        assert_eq!(p.next_tick(), DEFAULT_WINDOW_NS);
        assert_eq!(Policer::with_window_ns(10_000_000).window_ns(), 10_000_000);
        let mut q = Policer::with_window_ns(10_000_000);
        q.configure(&set(Some(10 * MBIT)), 0).unwrap();
        assert_eq!(q.credit_bytes(0), Some(12_500));
    }

    #[test]
    fn a_vif_without_credit_is_not_selected_until_the_next_window() {
        let mut p = Policer::new();
        p.configure(&set(Some(10 * MBIT)), 0).unwrap();
        let mut ready = ReadySet::new(2);
        ready.set(0, true);
        ready.set(1, true);
        assert_eq!(p.select(&ready, 0).unwrap().vif, 0);
        let batch = Usage {
            packets: 32,
            bytes: 70_000,
            cycles: 0,
        };
        p.charge(0, batch, 1);
        assert_eq!(p.vif_state(0).credit, -7_500);
        assert!(p.vif_state(0).throttled);
        for t in 2..5 {
            assert_eq!(p.select(&ready, t).unwrap().vif, 1);
        }
        ready.set(1, false);
        assert_eq!(p.select(&ready, 10), None);
        assert_eq!(p.eligible_at(10), DEFAULT_WINDOW_NS);
        // The next window repays the debt and the vif is served again.
        assert_eq!(p.select(&ready, DEFAULT_WINDOW_NS).unwrap().vif, 0);
        assert_eq!(p.vif_state(0).credit, 55_000);
        assert_eq!(p.next_tick(), 2 * DEFAULT_WINDOW_NS);
        // An idle vif fills up to one window's credit, no more.
        p.tick(&ready, 10 * DEFAULT_WINDOW_NS + 3);
        assert_eq!(p.vif_state(0).credit, 62_500);
        assert_eq!(p.next_tick(), 11 * DEFAULT_WINDOW_NS);
    }

    #[test]
    fn limited_vif_gets_its_rate_and_the_free_one_the_rest_with_a_live_change() {
        let cap = 100 * MBIT;
        let mut p = Policer::new();
        p.configure(&set(Some(10 * MBIT)), 0).unwrap();
        let mut h = Harness::new(cap, vec![Source::greedy(), Source::greedy()]);
        h.run(&mut p, 10 * SEC);
        let r = rates(&[0, 0], &h.forwarded(), 10 * SEC);
        assert!((r[0] - 10e6).abs() <= 0.01 * 10e6, "{r:?}");
        assert!(r[0] + r[1] >= 0.99 * cap as f64, "{r:?}");

        // Live: 10 → 25 Mbit/s, then unlimited (the link splits round-robin).
        p.configure(&set(Some(25 * MBIT)), h.now_ns).unwrap();
        assert_eq!(p.credit_bytes(0), Some(156_250));
        let before = h.forwarded();
        h.run(&mut p, 20 * SEC);
        let r = rates(&before, &h.forwarded(), 10 * SEC);
        assert!((r[0] - 25e6).abs() <= 0.01 * 25e6, "{r:?}");
        assert!((r[1] - 75e6).abs() <= 0.01 * 75e6, "{r:?}");

        p.configure(&set(None), h.now_ns).unwrap();
        assert_eq!(p.next_tick(), u64::MAX);
        let before = h.forwarded();
        h.run(&mut p, 30 * SEC);
        let r = rates(&before, &h.forwarded(), 10 * SEC);
        assert!((r[0] - 50e6).abs() <= 0.01 * 50e6, "{r:?}");
    }

    /// A burst deepens the bucket: after idling the vif sends the burst at once, then one
    /// window's credit per window.
    #[test]
    fn burst_deepens_the_bucket_not_the_rate() {
        let with_burst = |burst| {
            PolicySet::new(Some(100 * MBIT)).with_vif(
                "limited",
                VifPolicy {
                    max_bps: Some(10 * MBIT), // 62 500 bytes per 50 ms window
                    burst_bytes: Some(burst),
                    ..Default::default()
                },
            )
        };
        let mut ready = ReadySet::new(1);
        ready.set(0, true);
        let batch = Usage {
            packets: 1,
            bytes: 500,
            cycles: 0,
        };
        let drain = |p: &mut Policer, now| {
            let mut sent = 0;
            while p.select(&ready, now).is_some() {
                p.charge(0, batch, now);
                sent += batch.bytes;
            }
            sent
        };
        let mut p = Policer::new();
        p.configure(&with_burst(200_000), 0).unwrap();
        // A new vif starts with its full bucket; idling 1 s refills it, no more.
        assert_eq!(drain(&mut p, 0), 200_000);
        assert_eq!(drain(&mut p, SEC), 200_000);
        // Then the rate: one window's credit per window.
        for w in 1..=10 {
            assert_eq!(drain(&mut p, SEC + w * DEFAULT_WINDOW_NS), 62_500);
        }
        // A burst below one window's credit is raised to it.
        p.configure(&with_burst(1_000), 2 * SEC).unwrap();
        assert_eq!(drain(&mut p, 3 * SEC), 62_500);
    }

    #[test]
    fn fractional_credit_is_carried() {
        // 1 bit/s over 50 ms is 1/160 byte per window: 160 windows make one byte.
        let mut p = Policer::new();
        let s = set(Some(1));
        p.configure(&s, 0).unwrap();
        let mut ready = ReadySet::new(2);
        ready.set(0, true);
        p.select(&ready, 0);
        let one = Usage {
            packets: 1,
            bytes: 1,
            cycles: 0,
        };
        p.charge(0, one, 0);
        assert_eq!(p.vif_state(0).credit, -1);
        p.tick(&ready, 159 * DEFAULT_WINDOW_NS);
        assert_eq!(p.vif_state(0).credit, -1);
        p.tick(&ready, 160 * DEFAULT_WINDOW_NS);
        assert_eq!(p.vif_state(0).credit, 0);
    }

    #[test]
    fn configure_keeps_state_on_error() {
        let mut p = Policer::new();
        p.configure(&set(Some(10 * MBIT)), 0).unwrap();
        p.charge(
            0,
            Usage {
                packets: 1,
                bytes: 500,
                cycles: 0,
            },
            1,
        );
        let mut bad = set(Some(20 * MBIT));
        bad.vifs[1].policy.weight = 0;
        assert!(p.configure(&bad, 2).is_err());
        assert_eq!(p.vif_state(0).credit, 62_000);
        assert_eq!(p.credit_bytes(0), Some(62_500));
        // A persisting vif keeps its credit, cut to a smaller bucket.
        p.configure(&set(Some(MBIT)), 3).unwrap();
        assert_eq!(p.vif_state(0).credit, 6_250);
    }
}
