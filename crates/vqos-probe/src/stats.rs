//! Exact percentiles of recorded round-trip times, and the run's [`Summary`].
//!
//! Percentiles use the **nearest-rank** definition on the sorted samples: the p-th percentile of
//! N samples is the sample of 1-based rank ⌈p/100 · N⌉ (at least 1) — the smallest recorded value
//! such that at least p % of the samples are less than or equal to it. It is always a value that
//! was actually measured, never an interpolation. Ranks are computed in integer arithmetic
//! (p in thousandths of a percent), so 1..=1000 gives p50 = 500, p99 = 990, p99.9 = 999 exactly.

use serde::Serialize;

use crate::Protocol;

/// The nearest-rank percentile of `sorted` (ascending), with `p_milli` the percentile in
/// thousandths of a percent (`50_000` = p50, `99_900` = p99.9, values above `100_000` are
/// clamped). `None` when there are no samples.
pub fn nearest_rank(sorted: &[u64], p_milli: u32) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len() as u128;
    let p = u128::from(p_milli.min(100_000));
    let rank = (p * n).div_ceil(100_000).max(1) as usize;
    Some(sorted[rank - 1])
}

/// Statistics of a set of round-trip times, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RttStats {
    /// Smallest sample.
    pub min_ns: u64,
    /// Median (nearest rank).
    pub p50_ns: u64,
    /// 99th percentile (nearest rank).
    pub p99_ns: u64,
    /// 99.9th percentile (nearest rank).
    pub p999_ns: u64,
    /// Largest sample.
    pub max_ns: u64,
    /// Arithmetic mean.
    pub mean_ns: f64,
}

impl RttStats {
    /// Sorts `samples` in place and computes the statistics; `None` when empty.
    pub fn from_samples(samples: &mut [u64]) -> Option<RttStats> {
        samples.sort_unstable();
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Some(RttStats {
            min_ns: *samples.first()?,
            p50_ns: nearest_rank(samples, 50_000)?,
            p99_ns: nearest_rank(samples, 99_000)?,
            p999_ns: nearest_rank(samples, 99_900)?,
            max_ns: *samples.last()?,
            mean_ns: sum as f64 / samples.len() as f64,
        })
    }
}

/// The result of one client run. Serialises (JSON) with the keys `samples`, `lost`, `min_us`,
/// `p50_us`, `p99_us`, `p999_us`, `max_us`, `mean_us` first, then the detail counters; the
/// latency fields are `null` when no response came back.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Responses received within the timeout (one RTT sample each).
    pub samples: u64,
    /// Requests without a response within the timeout (`sent - samples`; includes `late`).
    pub lost: u64,
    /// Smallest RTT, µs.
    pub min_us: Option<f64>,
    /// Median RTT, µs (nearest rank).
    pub p50_us: Option<f64>,
    /// 99th percentile RTT, µs (nearest rank).
    pub p99_us: Option<f64>,
    /// 99.9th percentile RTT, µs (nearest rank).
    pub p999_us: Option<f64>,
    /// Largest RTT, µs.
    pub max_us: Option<f64>,
    /// Mean RTT, µs.
    pub mean_us: Option<f64>,
    /// Requests sent.
    pub sent: u64,
    /// Responses that came back after the timeout (counted as lost, not sampled).
    pub late: u64,
    /// Responses that arrived after a response with a higher sequence number.
    pub reordered: u64,
    /// Second and later copies of a response (ignored).
    pub duplicates: u64,
    /// Messages received that were not a valid response of this run (ignored).
    pub foreign: u64,
    /// UDP requests the local socket refused to send (counted as lost), e.g. `ENOBUFS`.
    pub send_failures: u64,
    /// `udp` or `tcp`.
    pub protocol: Protocol,
    /// Message size in bytes (payload, without the TCP length prefix).
    pub size: usize,
    /// Interval between requests, µs.
    pub interval_us: f64,
    /// Time from the first request to the end of the run (last response or timeout), s.
    pub elapsed_s: f64,
    /// The RTT samples in ns, sorted ascending (not serialised), e.g. to merge runs or plot a CDF.
    #[serde(skip)]
    pub rtts_ns: Vec<u64>,
}

/// Counters of a run, besides the samples, from which a [`Summary`] is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub sent: u64,
    pub late: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub foreign: u64,
    pub send_failures: u64,
}

impl Summary {
    pub(crate) fn build(
        mut rtts_ns: Vec<u64>,
        c: Counters,
        protocol: Protocol,
        size: usize,
        interval_us: f64,
        elapsed_s: f64,
    ) -> Summary {
        let stats = RttStats::from_samples(&mut rtts_ns);
        let us = |f: fn(&RttStats) -> f64| stats.as_ref().map(|s| f(s) / 1000.0);
        let samples = rtts_ns.len() as u64;
        Summary {
            samples,
            lost: c.sent.saturating_sub(samples),
            min_us: us(|s| s.min_ns as f64),
            p50_us: us(|s| s.p50_ns as f64),
            p99_us: us(|s| s.p99_ns as f64),
            p999_us: us(|s| s.p999_ns as f64),
            max_us: us(|s| s.max_ns as f64),
            mean_us: us(|s| s.mean_ns),
            sent: c.sent,
            late: c.late,
            reordered: c.reordered,
            duplicates: c.duplicates,
            foreign: c.foreign,
            send_failures: c.send_failures,
            protocol,
            size,
            interval_us,
            elapsed_s,
            rtts_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_on_1_to_1000() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(nearest_rank(&v, 50_000), Some(500));
        assert_eq!(nearest_rank(&v, 99_000), Some(990));
        assert_eq!(nearest_rank(&v, 99_900), Some(999));
        assert_eq!(nearest_rank(&v, 100_000), Some(1000));
        assert_eq!(nearest_rank(&v, 200_000), Some(1000));
        assert_eq!(nearest_rank(&v, 0), Some(1));
        assert_eq!(nearest_rank(&v, 1), Some(1)); // p0.001: rank ⌈0.01⌉ = 1
        assert_eq!(nearest_rank(&v, 50_001), Some(501)); // just above p50 moves up a rank
    }

    #[test]
    fn nearest_rank_small_sets() {
        assert_eq!(nearest_rank(&[], 50_000), None);
        assert_eq!(nearest_rank(&[7], 50_000), Some(7));
        assert_eq!(nearest_rank(&[7], 99_900), Some(7));
        // Classic example: 15, 20, 35, 40, 50 → p30 = 20, p40 = 20, p50 = 35, p100 = 50.
        let v = [15, 20, 35, 40, 50];
        assert_eq!(nearest_rank(&v, 30_000), Some(20));
        assert_eq!(nearest_rank(&v, 40_000), Some(20));
        assert_eq!(nearest_rank(&v, 50_000), Some(35));
        assert_eq!(nearest_rank(&v, 100_000), Some(50));
        // Ten samples: p99 and p99.9 are both the maximum.
        let t: Vec<u64> = (1..=10).collect();
        assert_eq!(nearest_rank(&t, 99_000), Some(10));
        assert_eq!(nearest_rank(&t, 90_000), Some(9));
    }

    #[test]
    fn stats_sort_unsorted_input() {
        // 1..=1000 shuffled deterministically (multiplication by a unit mod 1000).
        let mut v: Vec<u64> = (0..1000u64).map(|i| (i * 373) % 1000 + 1).collect();
        let s = RttStats::from_samples(&mut v).unwrap();
        assert_eq!(
            (s.min_ns, s.p50_ns, s.p99_ns, s.p999_ns, s.max_ns),
            (1, 500, 990, 999, 1000)
        );
        assert!((s.mean_ns - 500.5).abs() < 1e-9);
        assert!(RttStats::from_samples(&mut []).is_none());
    }

    #[test]
    fn summary_in_microseconds_and_json_keys() {
        let rtts: Vec<u64> = (1..=1000u64).rev().map(|i| i * 1000).collect();
        let c = Counters {
            sent: 1003,
            late: 1,
            reordered: 2,
            duplicates: 3,
            foreign: 4,
            send_failures: 0,
        };
        let s = Summary::build(rtts, c, Protocol::Udp, 64, 1000.0, 1.0);
        assert_eq!((s.samples, s.lost), (1000, 3));
        assert_eq!(s.p50_us, Some(500.0));
        assert_eq!(s.p99_us, Some(990.0));
        assert_eq!(s.p999_us, Some(999.0));
        assert_eq!(
            (s.min_us, s.max_us, s.mean_us),
            (Some(1.0), Some(1000.0), Some(500.5))
        );
        assert_eq!(s.rtts_ns.first(), Some(&1000));
        let j = serde_json::to_value(&s).unwrap();
        for k in [
            "samples", "lost", "min_us", "p50_us", "p99_us", "p999_us", "max_us", "mean_us",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        assert_eq!(j["protocol"], "udp");
        assert!(j.get("rtts_ns").is_none());

        let e = Summary::build(
            Vec::new(),
            Counters { sent: 5, ..c },
            Protocol::Tcp,
            64,
            1.0,
            1.0,
        );
        assert_eq!((e.samples, e.lost), (0, 5));
        let j = serde_json::to_value(&e).unwrap();
        assert!(j["p50_us"].is_null());
    }
}
