//! `tcm`: three-colour markers that drop red frames — the single-rate (RFC 2697 srTCM) and
//! two-rate (RFC 2698 trTCM) markers OVS-DPDK uses as ingress policers, and the baseline C2QoS
//! measures itself against.
//!
//! ## Behavior
//! - **Reading.** `select` is plain round-robin over the ready vifs: every vif is read, whatever
//!   its tokens, because a policer only judges frames once it has them — reading costs the
//!   switch its cycles either way.
//! - **Marking.** `admit` colours each frame, colour-blind, and returns [`Verdict::Drop`] for
//!   red (OVS drops red), [`Verdict::Forward`] for green and yellow.
//! - **Rates from the policy** (in [`TcmMode::Auto`], the default): a vif with a minimum and a
//!   maximum gets a trTCM with CIR = `min_bps` and PIR = `max_bps`; a vif with only a maximum
//!   gets an srTCM with CIR = `max_bps`; a vif without a maximum is not policed.
//!   [`TcmMode::SingleRate`] and [`TcmMode::TwoRate`] force one kind (trTCM with CIR =
//!   `min_bps`, possibly 0).
//! - **Buckets** (CBS, EBS, PBS) default to `max(64 KiB, rate × 10 ms)` at their own rate (CIR
//!   for CBS and EBS, PIR for PBS); [`Tcm::with_burst_ns`], [`Tcm::with_min_burst_bytes`] and
//!   [`Tcm::with_bucket_bytes`] change that. Buckets start full (RFC 2697/2698). A policy's
//!   `burst_bytes` is what passes above the max after idling: the PBS of a trTCM, the CBS of
//!   an srTCM (whose EBS is then 0, as yellow is forwarded and would add to the burst).
//! - **Tokens** are bytes, added from the time elapsed since the frame before (`now` is a
//!   parameter), with fractions of a byte carried. srTCM: tokens fill C up to CBS, then
//!   overflow into E up to EBS. trTCM: P fills at PIR up to PBS, C at CIR up to CBS.
//! - **Live changes:** a vif that persists with the same kind of marker keeps its tokens (cut to
//!   the new bucket sizes); others start with full buckets.
//!
//! ## Limitations
//! - Policing is in bits, not in the switch's cycles: a vif sending 64-byte frames passes ~23×
//!   more frames per second than one sending 1500-byte frames at the same rate, and each costs
//!   the switch about as many cycles (the C2QoS weakness this baseline exists to show).
//! - Dropping is not back-pressure: a greedy TCP sender sees loss; frames read and dropped have
//!   cost cycles. Weights are ignored and nothing is work-conserving beyond the rates.
//! - Colour-aware mode (pre-coloured frames) is not implemented: frames arrive uncoloured.

use crate::engine::{
    Engine, EngineKind, Grant, ReadySet, Usage, Verdict, VifEngineState, MAX_BURST,
};
use crate::engines::by_name;
use crate::policy::{PolicyError, PolicySet, VifId, VifPolicy};
use crate::units::NS_PER_SEC;

/// Default bucket depth in time at the bucket's rate: 10 ms.
pub const DEFAULT_BURST_NS: u64 = 10_000_000;

/// Default smallest bucket: one 64 KiB frame (a TSO super-frame must fit).
pub const DEFAULT_MIN_BURST_BYTES: u64 = 64 * 1024;

/// Denominator of a token accrual: bits/s × ns / (8 × 10⁹) = bytes.
const BYTE_NS_DENOM: u128 = 8 * NS_PER_SEC as u128;

/// The colour of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Colour {
    /// Within the committed rate and burst.
    Green,
    /// Beyond the committed, within the excess (srTCM) or peak (trTCM) profile.
    Yellow,
    /// Out of profile: dropped.
    Red,
}

/// Token accrual at a rate, with the fraction of a byte carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Accrual {
    /// Rate, bits/s.
    rate_bps: u64,
    /// Fraction of a byte accrued (numerator over [`BYTE_NS_DENOM`]).
    frac: u64,
}

impl Accrual {
    /// Whole bytes accrued over `dt_ns`.
    fn bytes(&mut self, dt_ns: u64) -> u64 {
        // rate × dt < 2^128 for u64 operands; frac < 2^36, and the product of two u64 is at
        // most 2^128 − 2^65 + 1, so the sum cannot overflow.
        let num = u128::from(self.rate_bps) * u128::from(dt_ns) + u128::from(self.frac);
        self.frac = (num % BYTE_NS_DENOM) as u64;
        u64::try_from(num / BYTE_NS_DENOM).unwrap_or(u64::MAX)
    }
}

/// RFC 2697 single-rate three-colour marker, colour-blind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrTcm {
    /// Committed information rate and its carried fraction.
    cir: Accrual,
    /// Committed burst size, bytes.
    cbs_bytes: u64,
    /// Excess burst size, bytes.
    ebs_bytes: u64,
    /// Tc: committed tokens, bytes.
    tc_bytes: u64,
    /// Te: excess tokens, bytes.
    te_bytes: u64,
    /// Time of the last update, ns.
    last_ns: u64,
}

impl SrTcm {
    /// A marker at `cir_bps` with buckets `cbs_bytes` and `ebs_bytes`, both full at `now_ns`.
    pub fn new(cir_bps: u64, cbs_bytes: u64, ebs_bytes: u64, now_ns: u64) -> Self {
        SrTcm {
            cir: Accrual {
                rate_bps: cir_bps,
                frac: 0,
            },
            cbs_bytes,
            ebs_bytes,
            tc_bytes: cbs_bytes,
            te_bytes: ebs_bytes,
            last_ns: now_ns,
        }
    }

    fn update(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let mut add = self.cir.bytes(dt);
        // Each token goes to C if C is not full, else to E if E is not full (RFC 2697 §3).
        let to_c = add.min(self.cbs_bytes - self.tc_bytes);
        self.tc_bytes += to_c;
        add -= to_c;
        self.te_bytes += add.min(self.ebs_bytes - self.te_bytes);
    }

    /// Colours a frame of `len_bytes` arriving at `now_ns` and takes its tokens.
    pub fn mark(&mut self, len_bytes: u32, now_ns: u64) -> Colour {
        self.update(now_ns);
        let b = u64::from(len_bytes);
        if self.tc_bytes >= b {
            self.tc_bytes -= b;
            Colour::Green
        } else if self.te_bytes >= b {
            self.te_bytes -= b;
            Colour::Yellow
        } else {
            Colour::Red
        }
    }

    /// Tokens (Tc, Te), bytes, as of the last frame.
    pub fn tokens(&self) -> (u64, u64) {
        (self.tc_bytes, self.te_bytes)
    }

    /// New rate and buckets from `now_ns`, keeping the tokens (cut to the new sizes).
    fn retune(&mut self, cir_bps: u64, cbs_bytes: u64, ebs_bytes: u64, now_ns: u64) {
        self.update(now_ns);
        if self.cir.rate_bps != cir_bps {
            self.cir = Accrual {
                rate_bps: cir_bps,
                frac: 0,
            };
        }
        self.cbs_bytes = cbs_bytes;
        self.ebs_bytes = ebs_bytes;
        self.tc_bytes = self.tc_bytes.min(cbs_bytes);
        self.te_bytes = self.te_bytes.min(ebs_bytes);
    }
}

/// RFC 2698 two-rate three-colour marker, colour-blind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrTcm {
    /// Committed information rate and its carried fraction.
    cir: Accrual,
    /// Peak information rate and its carried fraction.
    pir: Accrual,
    /// Committed burst size, bytes.
    cbs_bytes: u64,
    /// Peak burst size, bytes.
    pbs_bytes: u64,
    /// Tc: committed tokens, bytes.
    tc_bytes: u64,
    /// Tp: peak tokens, bytes.
    tp_bytes: u64,
    /// Time of the last update, ns.
    last_ns: u64,
}

impl TrTcm {
    /// A marker at `cir_bps`/`pir_bps` with buckets `cbs_bytes`/`pbs_bytes`, full at `now_ns`.
    pub fn new(cir_bps: u64, pir_bps: u64, cbs_bytes: u64, pbs_bytes: u64, now_ns: u64) -> Self {
        TrTcm {
            cir: Accrual {
                rate_bps: cir_bps,
                frac: 0,
            },
            pir: Accrual {
                rate_bps: pir_bps,
                frac: 0,
            },
            cbs_bytes,
            pbs_bytes,
            tc_bytes: cbs_bytes,
            tp_bytes: pbs_bytes,
            last_ns: now_ns,
        }
    }

    fn update(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        self.tc_bytes = self
            .tc_bytes
            .saturating_add(self.cir.bytes(dt))
            .min(self.cbs_bytes);
        self.tp_bytes = self
            .tp_bytes
            .saturating_add(self.pir.bytes(dt))
            .min(self.pbs_bytes);
    }

    /// Colours a frame of `len_bytes` arriving at `now_ns` and takes its tokens.
    pub fn mark(&mut self, len_bytes: u32, now_ns: u64) -> Colour {
        self.update(now_ns);
        let b = u64::from(len_bytes);
        if self.tp_bytes < b {
            Colour::Red
        } else if self.tc_bytes < b {
            self.tp_bytes -= b;
            Colour::Yellow
        } else {
            self.tp_bytes -= b;
            self.tc_bytes -= b;
            Colour::Green
        }
    }

    /// Tokens (Tc, Tp), bytes, as of the last frame.
    pub fn tokens(&self) -> (u64, u64) {
        (self.tc_bytes, self.tp_bytes)
    }

    /// New rates and buckets from `now_ns`, keeping the tokens (cut to the new sizes).
    fn retune(&mut self, cir: u64, pir: u64, cbs_bytes: u64, pbs_bytes: u64, now_ns: u64) {
        self.update(now_ns);
        if self.cir.rate_bps != cir {
            self.cir = Accrual {
                rate_bps: cir,
                frac: 0,
            };
        }
        if self.pir.rate_bps != pir {
            self.pir = Accrual {
                rate_bps: pir,
                frac: 0,
            };
        }
        self.cbs_bytes = cbs_bytes;
        self.pbs_bytes = pbs_bytes;
        self.tc_bytes = self.tc_bytes.min(cbs_bytes);
        self.tp_bytes = self.tp_bytes.min(pbs_bytes);
    }
}

/// Which marker a policed vif gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TcmMode {
    /// trTCM (CIR = min, PIR = max) when the vif has a minimum, srTCM (CIR = max) otherwise.
    #[default]
    Auto,
    /// Always srTCM with CIR = max.
    SingleRate,
    /// Always trTCM with CIR = min (possibly 0) and PIR = max.
    TwoRate,
}

/// One vif's marker (`None` = not policed).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    /// No maximum: everything is green.
    None,
    /// RFC 2697.
    Single(SrTcm),
    /// RFC 2698.
    Two(TrTcm),
}

/// Frames coloured so far, per colour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColourCounts {
    /// Frames marked green.
    pub green: u64,
    /// Frames marked yellow (forwarded).
    pub yellow: u64,
    /// Frames marked red (dropped).
    pub red: u64,
}

/// One vif's policer.
#[derive(Debug, Clone)]
struct VifTcm {
    /// The vif's name, to carry tokens across live policy changes.
    name: String,
    /// Its marker.
    marker: Marker,
    /// Frames per colour (unpoliced vifs count green).
    counts: ColourCounts,
}

/// The three-colour-marker engine. See the module docs.
#[derive(Debug)]
pub struct Tcm {
    /// Which marker policed vifs get.
    mode: TcmMode,
    /// Default bucket depth as time at the bucket's rate, ns.
    burst_ns: u64,
    /// Smallest default bucket, bytes.
    min_burst_bytes: u64,
    /// Fixed (committed, excess-or-peak) bucket sizes in bytes overriding the defaults.
    bucket_bytes: Option<(u64, u64)>,
    /// Per-vif markers, indexed by [`VifId`].
    vifs: Vec<VifTcm>,
    /// Round-robin cursor: one past the vif served last.
    cursor: VifId,
}

impl Default for Tcm {
    fn default() -> Self {
        Self::new()
    }
}

impl Tcm {
    /// Auto mode, buckets of `max(64 KiB, rate × 10 ms)`.
    pub fn new() -> Self {
        Tcm {
            mode: TcmMode::Auto,
            burst_ns: DEFAULT_BURST_NS,
            min_burst_bytes: DEFAULT_MIN_BURST_BYTES,
            bucket_bytes: None,
            vifs: Vec::new(),
            cursor: 0,
        }
    }

    /// Chooses the marker kind (builder style).
    pub fn with_mode(mut self, mode: TcmMode) -> Self {
        self.mode = mode;
        self
    }

    /// Default buckets hold this much time at their rate (builder style).
    pub fn with_burst_ns(mut self, burst_ns: u64) -> Self {
        self.burst_ns = burst_ns;
        self
    }

    /// Default buckets are at least this big, bytes (builder style).
    pub fn with_min_burst_bytes(mut self, bytes: u64) -> Self {
        self.min_burst_bytes = bytes;
        self
    }

    /// Fixed bucket sizes for every policed vif: CBS, and EBS (srTCM) or PBS (trTCM), bytes
    /// (builder style).
    pub fn with_bucket_bytes(mut self, committed_bytes: u64, excess_or_peak_bytes: u64) -> Self {
        self.bucket_bytes = Some((committed_bytes, excess_or_peak_bytes));
        self
    }

    /// Frames coloured so far for `vif` (zeros for an unknown vif).
    pub fn colours(&self, vif: VifId) -> ColourCounts {
        self.vifs.get(vif).map(|v| v.counts).unwrap_or_default()
    }

    /// The srTCM of `vif`, if it has one.
    pub fn sr_tcm(&self, vif: VifId) -> Option<&SrTcm> {
        match &self.vifs.get(vif)?.marker {
            Marker::Single(m) => Some(m),
            _ => None,
        }
    }

    /// The trTCM of `vif`, if it has one.
    pub fn tr_tcm(&self, vif: VifId) -> Option<&TrTcm> {
        match &self.vifs.get(vif)?.marker {
            Marker::Two(m) => Some(m),
            _ => None,
        }
    }

    /// Default bucket at `rate_bps`: `max(min_burst_bytes, rate × burst_ns)`.
    fn bucket(&self, rate_bps: u64) -> u64 {
        // rate and burst < 2^64: the product fits in u128.
        let b = u128::from(rate_bps) * u128::from(self.burst_ns) / BYTE_NS_DENOM;
        u64::try_from(b)
            .unwrap_or(u64::MAX)
            .max(self.min_burst_bytes)
    }

    /// The marker a policy asks for, reusing `old`'s tokens when it is of the same kind.
    fn marker_for(&self, p: &VifPolicy, old: Option<Marker>, now_ns: u64) -> Marker {
        let Some(max) = p.max_bps else {
            return Marker::None;
        };
        let two_rate = match self.mode {
            TcmMode::Auto => p.min_bps > 0,
            TcmMode::SingleRate => false,
            TcmMode::TwoRate => true,
        };
        if two_rate {
            let (cbs, pbs) = self
                .bucket_bytes
                .unwrap_or((self.bucket(p.min_bps), self.bucket(max)));
            // The burst above the max is the peak bucket.
            let pbs = p.burst_bytes.unwrap_or(pbs);
            match old {
                Some(Marker::Two(mut m)) => {
                    m.retune(p.min_bps, max, cbs, pbs, now_ns);
                    Marker::Two(m)
                }
                _ => Marker::Two(TrTcm::new(p.min_bps, max, cbs, pbs, now_ns)),
            }
        } else {
            let (cbs, ebs) = self
                .bucket_bytes
                .unwrap_or((self.bucket(max), self.bucket(max)));
            // CIR is the max here, and yellow is forwarded, so what passes above the max after
            // idling is CBS + EBS: a stated burst is all committed (CBS), with no excess bucket.
            let (cbs, ebs) = p.burst_bytes.map_or((cbs, ebs), |b| (b, 0));
            match old {
                Some(Marker::Single(mut m)) => {
                    m.retune(max, cbs, ebs, now_ns);
                    Marker::Single(m)
                }
                _ => Marker::Single(SrTcm::new(max, cbs, ebs, now_ns)),
            }
        }
    }
}

impl Engine for Tcm {
    fn kind(&self) -> EngineKind {
        EngineKind::Tcm
    }

    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        policies.validate()?;
        let mut old = by_name(std::mem::take(&mut self.vifs), |v| &v.name);
        let mut vifs = Vec::with_capacity(policies.len());
        for spec in &policies.vifs {
            let kept = old.remove(&spec.name).map(|(_, v)| v);
            let counts = kept.as_ref().map(|k| k.counts).unwrap_or_default();
            let marker = self.marker_for(&spec.policy, kept.map(|k| k.marker), now_ns);
            vifs.push(VifTcm {
                name: spec.name.clone(),
                marker,
                counts,
            });
        }
        self.vifs = vifs;
        if self.cursor >= self.vifs.len() {
            self.cursor = 0;
        }
        Ok(())
    }

    fn select(&mut self, ready: &ReadySet, _now_ns: u64) -> Option<Grant> {
        let vif = ready.next_from(self.cursor)?;
        self.cursor = (vif + 1) % self.vifs.len().max(1);
        Some(Grant {
            vif,
            max_packets: MAX_BURST,
        })
    }

    fn polices(&self) -> bool {
        true
    }

    fn admit(&mut self, vif: VifId, len_bytes: u32, now_ns: u64) -> Verdict {
        let Some(v) = self.vifs.get_mut(vif) else {
            return Verdict::Forward;
        };
        let colour = match &mut v.marker {
            Marker::None => Colour::Green,
            Marker::Single(m) => m.mark(len_bytes, now_ns),
            Marker::Two(m) => m.mark(len_bytes, now_ns),
        };
        match colour {
            Colour::Green => v.counts.green += 1,
            Colour::Yellow => v.counts.yellow += 1,
            Colour::Red => v.counts.red += 1,
        }
        if colour == Colour::Red {
            Verdict::Drop
        } else {
            Verdict::Forward
        }
    }

    fn charge(&mut self, _vif: VifId, _usage: Usage, _now_ns: u64) {}

    fn vif_state(&self, vif: VifId) -> VifEngineState {
        // The tokens that stand between a frame and red: Tc + Te (srTCM), Tp (trTCM).
        let credit = match self.vifs.get(vif).map(|v| &v.marker) {
            Some(Marker::Single(m)) => m.tc_bytes.saturating_add(m.te_bytes),
            Some(Marker::Two(m)) => m.tp_bytes,
            _ => 0,
        };
        VifEngineState {
            credit: i64::try_from(credit).unwrap_or(i64::MAX),
            credit_per_period: 0,
            throttled: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::testkit::{rates, Demand, Harness, Source};
    use Colour::{Green as G, Red as R, Yellow as Y};

    const SEC: u64 = NS_PER_SEC;
    const MBIT: u64 = 1_000_000;

    #[test]
    fn srtcm_rfc2697_sequence() {
        // CIR 8 000 bit/s = 1 000 bytes/s, CBS 1 500, EBS 1 000; both full at t = 0.
        let mut m = SrTcm::new(8_000, 1_500, 1_000, 0);
        let marks: Vec<Colour> = [1_000, 1_000, 1_000].map(|b| m.mark(b, 0)).to_vec();
        assert_eq!(marks, vec![G, Y, R]);
        assert_eq!(m.tokens(), (500, 0));
        // 0.5 s later: +500 into C.
        assert_eq!(m.mark(1_000, SEC / 2), G);
        assert_eq!(m.tokens(), (0, 0));
        // 2.0 s: +1 500 fills C exactly; 3.0 s: C is full, the next 1 000 go to E.
        assert_eq!(m.mark(0, 2 * SEC), G);
        assert_eq!(m.tokens(), (1_500, 0));
        let marks: Vec<Colour> = [1_200, 1_200, 900, 300]
            .map(|b| m.mark(b, 3 * SEC))
            .to_vec();
        assert_eq!(marks, vec![G, R, Y, G]);
        assert_eq!(m.tokens(), (0, 100));
        // Fractions carry: 1 000 bytes/s over 1.5 ms steps is 1.5 bytes each.
        let mut m = SrTcm::new(8_000, 10, 0, 0);
        m.mark(10, 0);
        for k in 1..=4 {
            m.mark(0, k * 1_500_000);
        }
        assert_eq!(m.tokens(), (6, 0));
    }

    #[test]
    fn trtcm_rfc2698_sequence() {
        // CIR 1 000 bytes/s, PIR 2 000 bytes/s, CBS 1 000, PBS 2 000; full at t = 0.
        let mut m = TrTcm::new(8_000, 16_000, 1_000, 2_000, 0);
        let marks: Vec<Colour> = [800, 800, 800].map(|b| m.mark(b, 0)).to_vec();
        assert_eq!(marks, vec![G, Y, R]);
        assert_eq!(m.tokens(), (200, 400));
        // 0.5 s: +500 to C, +1 000 to P.
        let marks: Vec<Colour> = [600, 900, 800].map(|b| m.mark(b, SEC / 2)).to_vec();
        assert_eq!(marks, vec![G, R, Y]);
        assert_eq!(m.tokens(), (100, 0));
        // Long idle: both buckets cap at their size.
        assert_eq!(m.mark(0, 100 * SEC), G);
        assert_eq!(m.tokens(), (1_000, 2_000));
    }

    fn policed(min: u64, max: Option<u64>) -> PolicySet {
        PolicySet::new(Some(1_000 * MBIT))
            .with_vif(
                "vm1",
                VifPolicy {
                    min_bps: min,
                    max_bps: max,
                    ..Default::default()
                },
            )
            .with_vif("vm2", VifPolicy::default())
    }

    #[test]
    fn markers_follow_the_policy() {
        let mut t = Tcm::new();
        t.configure(&policed(50 * MBIT, Some(100 * MBIT)), 0)
            .unwrap();
        // Buckets max(64 KiB, rate × 10 ms): CBS 65 536 (50 Mbit/s × 10 ms = 62 500), PBS 125 000.
        assert_eq!(t.tr_tcm(0).unwrap().tokens(), (65_536, 125_000));
        assert!(t.sr_tcm(1).is_none() && t.tr_tcm(1).is_none());
        t.configure(&policed(0, Some(100 * MBIT)), 0).unwrap();
        assert_eq!(t.sr_tcm(0).unwrap().tokens(), (125_000, 125_000));
        let mut t = Tcm::new()
            .with_mode(TcmMode::TwoRate)
            .with_bucket_bytes(3_000, 9_000);
        t.configure(&policed(0, Some(100 * MBIT)), 0).unwrap();
        assert_eq!(t.tr_tcm(0).unwrap().tokens(), (3_000, 9_000));
        let mut t = Tcm::new()
            .with_mode(TcmMode::SingleRate)
            .with_burst_ns(20_000_000)
            .with_min_burst_bytes(0);
        t.configure(&policed(50 * MBIT, Some(100 * MBIT)), 0)
            .unwrap();
        assert_eq!(t.sr_tcm(0).unwrap().tokens(), (250_000, 250_000));
        assert_eq!(t.vif_state(0).credit, 500_000);
    }

    /// A stated burst is exactly what passes above the max after idling, in both kinds of
    /// marker, and then the max holds.
    #[test]
    fn burst_is_what_passes_above_the_max_after_idling() {
        for min in [0, 4 * MBIT] {
            let set = PolicySet::new(Some(1_000 * MBIT)).with_vif(
                "vm1",
                VifPolicy {
                    min_bps: min,
                    max_bps: Some(8 * MBIT), // 1 MB/s
                    burst_bytes: Some(200_000),
                    ..Default::default()
                },
            );
            let mut t = Tcm::new();
            t.configure(&set, 0).unwrap();
            let passed = |t: &mut Tcm, now| {
                (0..1_000)
                    .filter(|_| t.admit(0, 1_000, now) == Verdict::Forward)
                    .count()
            };
            // Full at the start and after 10 s idle: 200 frames of 1 000 bytes, then red.
            assert_eq!(passed(&mut t, 0), 200, "min {min}");
            assert_eq!(passed(&mut t, 10 * SEC), 200, "min {min}");
            // Then 1 MB/s: 100 frames every 100 ms.
            for step in 1..=5 {
                assert_eq!(passed(&mut t, 10 * SEC + step * SEC / 10), 100, "min {min}");
            }
        }
    }

    #[test]
    fn everyone_is_read_round_robin_and_red_is_dropped() {
        let mut t = Tcm::new().with_bucket_bytes(1_500, 1_500);
        t.configure(&policed(0, Some(8_000)), 0).unwrap();
        let mut ready = ReadySet::new(2);
        ready.set(0, true);
        ready.set(1, true);
        assert_eq!(t.select(&ready, 0).unwrap().vif, 0);
        assert_eq!(t.admit(0, 1_500, 0), Verdict::Forward);
        assert_eq!(t.admit(0, 1_500, 0), Verdict::Forward);
        assert_eq!(t.admit(0, 1_500, 0), Verdict::Drop);
        assert_eq!(
            t.colours(0),
            ColourCounts {
                green: 1,
                yellow: 1,
                red: 1
            }
        );
        // Out of tokens, still read: policers drop, they do not back-pressure.
        assert_eq!(t.select(&ready, 1).unwrap().vif, 1);
        assert_eq!(t.select(&ready, 2).unwrap().vif, 0);
        assert!(!t.vif_state(0).throttled);
        assert_eq!(t.admit(1, 1_500, 3), Verdict::Forward);
    }

    fn run_rates(t: &mut Tcm, h: &mut Harness, secs: u64) -> Vec<f64> {
        let before = h.forwarded();
        let start = h.now_ns;
        h.run(t, start + secs * SEC);
        rates(&before, &h.forwarded(), h.now_ns - start)
    }

    #[test]
    fn greedy_vif_is_policed_to_its_peak_rate_with_a_live_change() {
        let mut t = Tcm::new();
        t.configure(&policed(50 * MBIT, Some(100 * MBIT)), 0)
            .unwrap();
        let mut h = Harness::new(1_000 * MBIT, vec![Source::greedy(), Source::greedy()]);
        h.read_ns = 100;
        let r = run_rates(&mut t, &mut h, 10);
        assert!((r[0] - 100e6).abs() <= 0.01 * 100e6, "{r:?}");
        let c = t.colours(0);
        assert!(c.green > 0 && c.yellow > 0 && c.red > 0, "{c:?}");
        // Green is the committed half of what passes.
        let g = c.green as f64 / (c.green + c.yellow) as f64;
        assert!((g - 0.5).abs() < 0.01, "{c:?}");

        // Live: PIR 100 → 300 Mbit/s, min dropped (srTCM at 300).
        t.configure(&policed(0, Some(300 * MBIT)), h.now_ns)
            .unwrap();
        let r = run_rates(&mut t, &mut h, 10);
        assert!((r[0] - 300e6).abs() <= 0.01 * 300e6, "{r:?}");
        assert!(t.sr_tcm(0).is_some());
        // And unlimited again: nothing is dropped any more.
        t.configure(&policed(0, None), h.now_ns).unwrap();
        let red = t.colours(0).red;
        run_rates(&mut t, &mut h, 1);
        assert_eq!(t.colours(0).red, red);
    }

    #[test]
    fn small_frames_are_policed_by_bits_so_many_more_pass() {
        let set = PolicySet::new(Some(1_000 * MBIT))
            .with_vif(
                "big",
                VifPolicy {
                    max_bps: Some(10 * MBIT),
                    ..Default::default()
                },
            )
            .with_vif(
                "small",
                VifPolicy {
                    max_bps: Some(10 * MBIT),
                    ..Default::default()
                },
            );
        let mut t = Tcm::new();
        t.configure(&set, 0).unwrap();
        let mut h = Harness::new(
            1_000 * MBIT,
            vec![Source::greedy(), Source::new(Demand::Greedy, 64)],
        );
        h.read_ns = 100;
        // After the initial full buckets (2 × 64 KiB each) are spent.
        run_rates(&mut t, &mut h, 1);
        let frames: Vec<u64> = h.sources.iter().map(|s| s.forwarded_frames).collect();
        let r = run_rates(&mut t, &mut h, 5);
        for rate in &r {
            assert!((rate - 10e6).abs() <= 0.01 * 10e6, "{r:?}");
        }
        let big = (h.sources[0].forwarded_frames - frames[0]) as f64;
        let small = (h.sources[1].forwarded_frames - frames[1]) as f64;
        // Same bits, 1500/64 ≈ 23× the frames (and about as many times the switch's cycles).
        assert!(small / big > 20.0, "{small} vs {big}");
    }

    #[test]
    fn configure_keeps_state_on_error() {
        let mut t = Tcm::new();
        t.configure(&policed(0, Some(8_000_000)), 0).unwrap();
        for _ in 0..10 {
            t.admit(0, 1_500, 0);
        }
        let tokens = t.sr_tcm(0).unwrap().tokens();
        let mut bad = policed(0, Some(8_000_000));
        bad.vifs[1].policy.priority = 9;
        assert!(t.configure(&bad, 1).is_err());
        assert_eq!(t.sr_tcm(0).unwrap().tokens(), tokens);
        assert_eq!(t.colours(0).green, 10);
        // A persisting srTCM keeps its tokens across a rate change.
        t.configure(&policed(0, Some(16_000_000)), 0).unwrap();
        assert_eq!(t.sr_tcm(0).unwrap().tokens(), tokens);
        assert_eq!(t.colours(0).green, 10);
    }
}
