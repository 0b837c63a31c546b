//! What a vif's measured rate says it wants: the demand it publishes ([`estimate`]), over the
//! peak of a short window of rates ([`RateWindow`]).
//!
//! ## Why a window
//! A rate measured over one period is quantized by the frames a vif sends: a vif held to the
//! 1 Mbit/s probe sends a 64 KiB TSO/GSO frame about every half second, so with a 250 ms
//! period it reads 2 Mbit/s one period and 0 the next. Read one period at a time, it flipped
//! between greedy and idle: each flip moved the other hosts' shares, and a riser whose
//! holder had just raised back never got its grant (the three-host test found it: the shares
//! chased each other for the whole settling time). The estimate reads the **peak of the last
//! [`window_periods`] periods**, long enough to see two of the largest frames at the probe
//! rate (and at least two periods), so a vif that sends anything at all within its share is
//! seen as it is. The cost: a vif whose demand falls is seen lower a window later (the others
//! take the freed share `window` periods after, not one); BwE likewise estimates demand over
//! a window of its usage rather than one sample.

use std::collections::VecDeque;

use crate::split::Share;

/// Share of measured use at or above which a vif counts as greedy, in percent.
///
/// It must be above 100 / 110 (90.9 %): a light vif given exactly its estimate (rate plus
/// 10 %) uses 90.9 % of it, and with a mark at 90 % it would count as greedy, take a greedy
/// share it does not use, count as light again, and so on, the tenant's other vifs losing
/// that share every other period (found by the scale simulation, vqos-sim's `cluster`).
pub const GREEDY_PERCENT: u64 = 95;

/// The demand a vif publishes: `None` (greedy) when its measured `rate_bps` is at least
/// [`GREEDY_PERCENT`] of the share max in force, else its rate plus 10 %, at least `probe_bps`.
pub fn estimate_demand(rate_bps: u64, share_max_bps: Option<u64>, probe_bps: u64) -> Option<u64> {
    if let Some(s) = share_max_bps {
        if u128::from(rate_bps) * 100 >= u128::from(s) * u128::from(GREEDY_PERCENT) {
            return None;
        }
    }
    Some(rate_bps.saturating_add(rate_bps / 10).max(probe_bps))
}

/// Whether a vif is idle: it is not greedy (`demand_bps` is `Some`) and its measured rate plus
/// 10 % is below the probe, so the demand it publishes is the probe, not what it sends.
pub fn is_idle(rate_bps: u64, demand_bps: Option<u64>, probe_bps: u64) -> bool {
    demand_bps.is_some() && rate_bps.saturating_add(rate_bps / 10) < probe_bps
}

/// Whether a vif fills its floor share: its measured `rate_bps` is at least [`GREEDY_PERCENT`]
/// of a non-zero floor share in force.
///
/// Such a vif may be held there by the switch (another tenant's heavier vif on its host's
/// link), so the floor split counts it greedy. At a steady rate it does not flap: a vif that
/// wants `r` and is given its estimate `1.1 r` uses 1/1.1 = 90.9 % of it, below the mark; one
/// whose weighted floor `w` is below `r / 0.95` fills `w` whether it is counted greedy or not
/// (docs/cluster.md, "Filling the floor", for a moving rate and mixed agent versions).
pub fn fills_floor(rate_bps: u64, share_min_bps: Option<u64>) -> bool {
    share_min_bps.is_some_and(|s| {
        s > 0 && u128::from(rate_bps) * 100 >= u128::from(s) * u128::from(GREEDY_PERCENT)
    })
}

/// The largest frame a vif sends in one piece (a TSO/GSO frame), bytes.
pub const LARGEST_FRAME_BYTES: u64 = 64 * 1024;

/// The most periods a window spans (bounds the memory: 8 bytes a period a vif).
pub const MAX_WINDOW_PERIODS: usize = 32;

/// The periods a vif's estimate looks back over: long enough to hold two of the largest frames
/// at `probe_bps`, at least 2, at most [`MAX_WINDOW_PERIODS`] (1 s at the default 1 Mbit/s
/// probe: 2 periods of the default 500 ms, 4 of 250 ms).
pub fn window_periods(period_ms: u64, probe_bps: u64) -> usize {
    let bits = 2 * LARGEST_FRAME_BYTES * 8;
    // Two frames at the probe, in ms, rounded up; then periods, rounded up.
    let ms = (u128::from(bits) * 1000).div_ceil(u128::from(probe_bps.max(1)));
    let periods = ms.div_ceil(u128::from(period_ms.max(1)));
    usize::try_from(periods)
        .unwrap_or(MAX_WINDOW_PERIODS)
        .clamp(2, MAX_WINDOW_PERIODS)
}

/// A vif's last rates, one a period, and their peak.
///
/// Kept as a decreasing run of (period, rate) (a sliding-window maximum): a rate is dropped
/// once a later one is at least as high, so the peak is the front, read in O(1), and a push
/// costs O(1) amortized whatever the window's length (the asynchronous simulation pushes one
/// rate a phase, a window of 300 samples).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateWindow {
    /// (period number, rate), periods increasing, rates decreasing.
    run: VecDeque<(u64, u64)>,
    /// Periods pushed so far.
    pushed: u64,
    /// The periods the window spans.
    periods: u64,
}

impl RateWindow {
    /// An empty window over `periods` periods (at least 1).
    pub fn new(periods: usize) -> RateWindow {
        RateWindow {
            run: VecDeque::new(),
            pushed: 0,
            periods: periods.max(1) as u64,
        }
    }

    /// The rate of the period just ended, bit/s; the oldest beyond the window is forgotten.
    pub fn push(&mut self, rate_bps: u64) {
        while self.run.back().is_some_and(|&(_, r)| r <= rate_bps) {
            self.run.pop_back();
        }
        self.run.push_back((self.pushed, rate_bps));
        self.pushed += 1;
        while self
            .run
            .front()
            .is_some_and(|&(p, _)| p + self.periods < self.pushed)
        {
            self.run.pop_front();
        }
    }

    /// The highest rate in the window (0 when empty).
    pub fn peak(&self) -> u64 {
        self.run.front().map_or(0, |&(_, r)| r)
    }
}

/// What a vif publishes of its demand ([`estimate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Its demand, bit/s (`None`: greedy).
    pub demand_bps: Option<u64>,
    /// It fills its floor share ([`fills_floor`]).
    pub floor_greedy: bool,
    /// It sent (nearly) nothing ([`is_idle`]).
    pub idle: bool,
}

/// The estimate of a vif whose window peaked at `peak_bps`, under the `share` in force (a share
/// max of 0, a host waiting for a grant, shows no demand: the vif's own cap `own_max_bps`
/// counts instead) — what the agent publishes and the simulation models.
pub fn estimate(
    peak_bps: u64,
    share: Option<&Share>,
    own_max_bps: Option<u64>,
    probe_bps: u64,
) -> Estimate {
    let held = share.and_then(|s| s.max_bps).filter(|&s| s > 0);
    let demand_bps = estimate_demand(peak_bps, held.or(own_max_bps), probe_bps);
    Estimate {
        demand_bps,
        floor_greedy: fills_floor(peak_bps, share.map(|s| s.min_bps)),
        idle: is_idle(peak_bps, demand_bps, probe_bps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1_000_000;

    #[test]
    fn idleness_is_a_rate_below_the_probe() {
        assert!(is_idle(0, Some(M), M));
        assert!(is_idle(900_000, Some(M), M));
        assert!(!is_idle(910_000, Some(M + 1000), M));
        // A vif that fills even a tiny share is greedy, not idle.
        assert!(!is_idle(48_000, None, M));
    }

    #[test]
    fn demand_estimate() {
        // At or above 95 % of the share: greedy.
        assert_eq!(estimate_demand(95 * M, Some(100 * M), M), None);
        // A light vif given its estimate uses 1 / 1.1 of it: still light (no flapping).
        assert_eq!(estimate_demand(20 * M, Some(22 * M), M), Some(22 * M));
        assert_eq!(estimate_demand(120 * M, Some(100 * M), M), None);
        // Below: the rate plus 10 %, never below the probe.
        assert_eq!(estimate_demand(50 * M, Some(100 * M), M), Some(55 * M));
        assert_eq!(estimate_demand(0, Some(100 * M), M), Some(M));
        assert_eq!(estimate_demand(70 * M, None, M), Some(77 * M));
        assert_eq!(estimate_demand(u64::MAX, None, M), Some(u64::MAX));
    }

    #[test]
    fn filling_the_floor() {
        // No floor share, or a zero one: never.
        assert!(!fills_floor(50 * M, None));
        assert!(!fills_floor(0, Some(0)));
        // At or above 95 % of the floor share.
        assert!(fills_floor(95 * M, Some(100 * M)));
        assert!(fills_floor(300 * M, Some(100 * M)));
        // A light vif given its estimate (rate + 10 %) as its floor does not fill it.
        assert!(!fills_floor(20 * M, Some(22 * M)));
        assert!(fills_floor(u64::MAX, Some(u64::MAX)));
    }

    #[test]
    fn the_window_holds_two_largest_frames_at_the_probe() {
        // 2 × 64 KiB at 1 Mbit/s is 1.05 s.
        assert_eq!(window_periods(500, M), 3);
        assert_eq!(window_periods(250, M), 5);
        assert_eq!(window_periods(2000, M), 2);
        assert_eq!(window_periods(10, M / 10), MAX_WINDOW_PERIODS);
        assert_eq!(window_periods(0, 0), MAX_WINDOW_PERIODS);
        assert_eq!(window_periods(100, u64::MAX), 2);
    }

    #[test]
    fn the_peak_is_of_the_last_periods_only() {
        let mut w = RateWindow::new(3);
        assert_eq!(w.peak(), 0);
        for (rate, peak) in [(5, 5), (0, 5), (2, 5), (0, 2), (0, 2), (0, 0), (7, 7)] {
            w.push(rate);
            assert_eq!(w.peak(), peak, "after {rate}");
        }
        let mut one = RateWindow::new(0);
        one.push(9);
        one.push(1);
        assert_eq!(one.peak(), 1);
    }

    #[test]
    fn the_peak_is_the_naive_maximum_of_the_window() {
        // Fixed-seed xorshift rates, small values so that ties happen; windows 1 to 9.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for periods in 1..10 {
            let mut w = RateWindow::new(periods);
            let mut all = Vec::new();
            for _ in 0..500 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let rate = x % 8;
                w.push(rate);
                all.push(rate);
                let naive = all.iter().rev().take(periods).max().copied().unwrap();
                assert_eq!(w.peak(), naive, "window {periods}, after {all:?}");
                assert!(w.run.len() <= periods);
            }
        }
    }

    #[test]
    fn a_vif_at_the_probe_sending_a_frame_every_other_period_stays_greedy() {
        // Held to the 1 Mbit/s probe, a 64 KiB frame every 0.52 s: 2.1 Mbit/s one 250 ms
        // period, 0 the next. One period at a time it flips greedy ↔ idle; over the window it
        // is greedy every period.
        let share = Share {
            min_bps: M,
            max_bps: Some(M),
        };
        let frame = 65_536 * 8 * 4;
        let mut w = RateWindow::new(window_periods(250, M));
        let mut flips = 0;
        for p in 0..40 {
            let rate = if p % 2 == 0 { frame } else { 0 };
            let alone = estimate(rate, Some(&share), None, M);
            w.push(rate);
            let over = estimate(w.peak(), Some(&share), None, M);
            flips += usize::from(alone.idle);
            assert_eq!(over.demand_bps, None, "period {p}");
            assert!(!over.idle && over.floor_greedy, "period {p}");
        }
        assert_eq!(flips, 20, "the single-period estimate does flip");
    }

    #[test]
    fn a_share_held_at_zero_counts_the_own_cap() {
        let zero = Share {
            min_bps: 0,
            max_bps: Some(0),
        };
        // Waiting for a grant at 0: not greedy on a rate of 0, its own cap reads.
        let e = estimate(0, Some(&zero), Some(100 * M), M);
        assert_eq!(e.demand_bps, Some(M));
        assert!(e.idle && !e.floor_greedy);
        assert_eq!(
            estimate(96 * M, Some(&zero), Some(100 * M), M).demand_bps,
            None
        );
        assert_eq!(estimate(50 * M, None, None, M).demand_bps, Some(55 * M));
    }
}
