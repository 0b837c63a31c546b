//! Active queue management on sojourn time, for the per-vif queues of the downlink: CoDel
//! (Nichols and Jacobson, "Controlling Queue Delay", ACM Queue 2012; RFC 8289).
//!
//! ## Behavior
//! [`Codel::on_dequeue`] is told, for every frame leaving a queue, how long it waited and
//! what stays behind it, and answers whether that frame carries a congestion signal: the
//! caller sets CE on an ECN-capable frame and drops any other (counted apart). A queue whose
//! frames have waited at least `target` for a whole `interval` enters the signalling state:
//! one frame is signalled, the next `interval` later, then `interval / √2`, ... (the
//! control law), until a frame leaves having waited less than `target` or the queue holds at
//! most that frame's size behind it. Re-entering soon after leaving resumes near the old
//! signalling rate (RFC 8289 §5.4).
//!
//! ## Choices (documented in docs/design.md, "The scheduled downlink")
//! - One signal per dequeued frame: a drop does not make the same call drop the next frame
//!   too (RFC 8289's `while` loop); the next frame's own call decides. With marks, which keep
//!   the frame, the two are the same.
//! - "At most one frame behind it" is the frame's own size, not a fixed MTU: a queue of TSO
//!   super-frames holding one is not a standing queue.
//! - Defaults (`target` 1 ms, `interval` 10 ms) are the data centre's, not the internet's
//!   5/100 ms: a host's tenants mostly talk over sub-millisecond round trips.
//!
//! Pure: no clock; the caller passes `now_ns`.

use serde::{Deserialize, Serialize};

/// CoDel's two parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AqmParams {
    /// Acceptable standing delay, ns.
    pub target_ns: u64,
    /// How long the delay must stay above `target` before signalling; also the control
    /// law's base, ns. Must be ≥ `target_ns`.
    pub interval_ns: u64,
}

impl Default for AqmParams {
    fn default() -> Self {
        AqmParams {
            target_ns: 1_000_000,
            interval_ns: 10_000_000,
        }
    }
}

impl AqmParams {
    /// Checks the parameters: both positive, `interval ≥ target`.
    pub fn validate(&self) -> Result<(), String> {
        if self.target_ns == 0 || self.interval_ns == 0 {
            return Err("AQM target and interval must be positive".into());
        }
        if self.interval_ns < self.target_ns {
            return Err(format!(
                "AQM interval ({} µs) is shorter than its target ({} µs)",
                self.interval_ns / 1000,
                self.target_ns / 1000
            ));
        }
        Ok(())
    }
}

/// Buffer of a queued frame that fits in it (most frames at the MTU): a frame up to this
/// (virtio-net header included) is copied into one and holds this much of its queue's
/// `queue_bytes`; a larger one holds a whole 64 KiB frame buffer.
pub const SMALL_BUF_BYTES: usize = 2048;

/// Least `queue_bytes` of a [`DownlinkConfig`]: one largest frame (64 KiB and headers) and
/// more.
pub const MIN_QUEUE_BYTES: u64 = 128 << 10;

/// The downlink's queues: their bounds and AQM (one definition for the data plane, the
/// simulator and vqosd's `[downlink]` table; docs/design.md, "The scheduled downlink").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownlinkConfig {
    /// Most frames one vif's queue holds.
    pub queue_frames: usize,
    /// Most buffer bytes one vif's queue holds.
    pub queue_bytes: u64,
    /// Most buffer bytes all of one forwarding thread's queues hold.
    pub memory_bytes: u64,
    /// The AQM's target and interval.
    pub aqm: AqmParams,
    /// Flow queues in each vif's queue ([`crate::fq`]; 1: one FIFO per vif).
    #[serde(default = "default_flows")]
    pub flows: usize,
    /// The flow hash's seed (`None`, the default: drawn at random by each downlink when it
    /// is made, so that a sender cannot aim at a victim's flow queue). A fixed one makes the
    /// flow queues' choices repeatable, for tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_seed: Option<u64>,
}

fn default_flows() -> usize {
    crate::fq::DEFAULT_FLOWS
}

impl Default for DownlinkConfig {
    fn default() -> Self {
        DownlinkConfig {
            queue_frames: 1024,
            queue_bytes: 4 << 20,
            memory_bytes: 256 << 20,
            aqm: AqmParams::default(),
            flows: crate::fq::DEFAULT_FLOWS,
            flow_seed: None,
        }
    }
}

impl DownlinkConfig {
    /// Checks the bounds (a queue holds at least [`MIN_QUEUE_BYTES`], the memory at least
    /// one queue) and the AQM.
    pub fn validate(&self) -> Result<(), String> {
        if self.queue_frames == 0 {
            return Err("downlink queue_frames must be at least 1".into());
        }
        if self.queue_bytes < MIN_QUEUE_BYTES {
            return Err(format!(
                "downlink queue_bytes must be at least {MIN_QUEUE_BYTES} (one largest frame and more)"
            ));
        }
        if self.memory_bytes < self.queue_bytes {
            return Err("downlink memory must be at least queue_bytes".into());
        }
        if !(1..=crate::fq::MAX_FLOWS).contains(&self.flows) {
            return Err(format!(
                "downlink flows must be in 1..={} (1: one queue per vif, no flow queues)",
                crate::fq::MAX_FLOWS
            ));
        }
        self.aqm.validate()
    }
}

/// One queue's CoDel state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Codel {
    /// When the delay, above target since, will have been so for an interval; `None` while
    /// below target.
    first_above_ns: Option<u64>,
    /// In the signalling state.
    signalling: bool,
    /// Signals in the current signalling state.
    count: u32,
    /// `count` when the last signalling state began.
    last_count: u32,
    /// When the next signal is due while signalling, ns.
    next_ns: u64,
}

impl Codel {
    /// A frame leaves the queue at `now_ns` after waiting `sojourn_ns`; `frame_bytes` is its
    /// size and `backlog_bytes` what stays queued behind it. True: signal this frame (CE if
    /// ECN-capable, else drop it).
    pub fn on_dequeue(
        &mut self,
        p: &AqmParams,
        sojourn_ns: u64,
        frame_bytes: u64,
        backlog_bytes: u64,
        now_ns: u64,
    ) -> bool {
        let persistent = self.persistently_above(p, sojourn_ns, frame_bytes, backlog_bytes, now_ns);
        if self.signalling {
            if !persistent {
                self.signalling = false;
                return false;
            }
            if now_ns < self.next_ns {
                return false;
            }
            self.count = self.count.saturating_add(1);
            self.next_ns = control_law(self.next_ns, p.interval_ns, self.count);
            return true;
        }
        if !persistent {
            return false;
        }
        self.signalling = true;
        // Re-entering soon after leaving: resume near the rate that was last needed.
        let delta = self.count.saturating_sub(self.last_count);
        let recent = now_ns.saturating_sub(self.next_ns) < 16 * p.interval_ns;
        self.count = if delta > 1 && recent { delta } else { 1 };
        self.last_count = self.count;
        self.next_ns = control_law(now_ns, p.interval_ns, self.count);
        true
    }

    /// True while signalling (for stats and tests).
    pub fn signalling(&self) -> bool {
        self.signalling
    }

    /// Has the delay been at or above target for a whole interval, with more than this
    /// frame's worth queued behind it?
    fn persistently_above(
        &mut self,
        p: &AqmParams,
        sojourn_ns: u64,
        frame_bytes: u64,
        backlog_bytes: u64,
        now_ns: u64,
    ) -> bool {
        if sojourn_ns < p.target_ns || backlog_bytes <= frame_bytes {
            self.first_above_ns = None;
            return false;
        }
        match self.first_above_ns {
            None => {
                self.first_above_ns = Some(now_ns.saturating_add(p.interval_ns));
                false
            }
            Some(t) => now_ns >= t,
        }
    }
}

/// `t + interval / √count`.
fn control_law(t: u64, interval_ns: u64, count: u32) -> u64 {
    t.saturating_add((interval_ns as f64 / f64::from(count.max(1)).sqrt()) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Dequeues one frame every `step` ns from `from` to `to`, each having waited `sojourn`
    /// with plenty behind it; returns the times of the signals.
    fn run(c: &mut Codel, from: u64, to: u64, step: u64, sojourn: u64) -> Vec<u64> {
        let p = AqmParams::default();
        (from..to)
            .step_by(step as usize)
            .filter(|&t| c.on_dequeue(&p, sojourn, 1500, 100_000, t))
            .collect()
    }

    #[test]
    fn below_target_never_signals() {
        let mut c = Codel::default();
        assert!(run(&mut c, 0, 1000 * MS, 100_000, MS - 1).is_empty());
        assert!(!c.signalling());
    }

    #[test]
    fn a_standing_queue_is_signalled_after_an_interval_then_at_the_control_law() {
        let mut c = Codel::default();
        let s = run(&mut c, MS, 60 * MS, 10_000, 2 * MS);
        // First above at 1 ms: persistent from 11 ms; then 10/√1, 10/√2, 10/√3, ... ms apart.
        assert_eq!(s[0], 11 * MS);
        let gaps: Vec<u64> = s.windows(2).map(|w| w[1] - w[0]).collect();
        for (k, g) in gaps.iter().enumerate() {
            let want = (10.0 * MS as f64 / ((k + 1) as f64).sqrt()) as u64;
            assert!(g.abs_diff(want) <= 10_000, "gap {k}: {g} vs {want}");
        }
        assert!(gaps.windows(2).all(|w| w[1] <= w[0]));
        assert!(c.signalling());
    }

    #[test]
    fn the_delay_falling_below_target_ends_signalling_and_a_quick_return_resumes_the_rate() {
        let mut c = Codel::default();
        let first = run(&mut c, MS, 100 * MS, 10_000, 2 * MS).len();
        assert!(first > 5);
        assert!(run(&mut c, 100 * MS, 110 * MS, 10_000, MS / 2).is_empty());
        assert!(!c.signalling());
        // Back above within 16 intervals: the first gap is shorter than a fresh start's.
        let again = run(&mut c, 110 * MS, 160 * MS, 10_000, 2 * MS);
        assert!(again.len() >= 2);
        assert!(again[1] - again[0] < 7 * MS, "{again:?}");
    }

    #[test]
    fn one_frame_queued_is_not_a_standing_queue() {
        let p = AqmParams::default();
        let mut c = Codel::default();
        for t in (0..100 * MS).step_by(100_000) {
            // A 64 KiB super-frame behind a 64 KiB one: at most the frame's own size.
            assert!(!c.on_dequeue(&p, 5 * MS, 65_000, 65_000, t));
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        for (t, i) in [(0, 1), (1, 0), (2, 1)] {
            let p = AqmParams {
                target_ns: t,
                interval_ns: i,
            };
            assert!(p.validate().is_err(), "{t} {i}");
        }
        assert!(AqmParams::default().validate().is_ok());
    }
}
