//! The switch's own byte limits, on the one [`TokenBucket`] of `vqos-sched`: the uplink
//! capacity (vif→uplink bytes) and each vif's inbound maximum on the uplink→vif direction
//! (its policy's `max_in_bps`, else its `max_bps`). A policy's `burst_bytes` is for what the
//! vif sends (the engine's cap bucket); the downlink bucket keeps the depth below.
//!
//! ## Behavior
//! A bucket holds [`BUCKET_WINDOW_NS`] worth of its rate, at least [`BUCKET_MIN_DEPTH_BYTES`]
//! (two 64 KiB super-frames). A batch is served while tokens are positive and its real size is
//! charged afterwards, so tokens may go negative (a 64 KiB super-frame is never split): the
//! debt delays the next batch and the average rate is exact. Debt is unbounded here because
//! the charge is what was really sent; the vif batches are sized from the tokens left
//! ([`UplinkShaper::frames_within`]) so it stays within about one frame.

use vqos_sched::TokenBucket;

pub use vqos_sched::bucket::{
    bytes_per_sec, link_bucket as rate_bucket,
    LINK_BUCKET_MIN_DEPTH_BYTES as BUCKET_MIN_DEPTH_BYTES,
    LINK_BUCKET_WINDOW_NS as BUCKET_WINDOW_NS,
};

/// Keeps `bucket` if it already runs at `rate_bps` (tokens and debt carry over a policy change
/// that does not touch it), else a fresh one; `None` without a rate.
pub fn rebucket(
    bucket: Option<TokenBucket>,
    rate_bps: Option<u64>,
    now_ns: u64,
) -> Option<TokenBucket> {
    let rate_bps = rate_bps?;
    match bucket {
        Some(b) if b.rate_per_sec() == bytes_per_sec(rate_bps) => Some(b),
        _ => Some(rate_bucket(rate_bps, now_ns)),
    }
}

/// The uplink capacity: gates every vif batch while its bucket is in debt.
#[derive(Debug, Default)]
pub struct UplinkShaper {
    /// `None` = unlimited.
    bucket: Option<TokenBucket>,
}

impl UplinkShaper {
    /// Applies a (new) capacity; an unchanged one keeps its tokens.
    pub fn configure(&mut self, capacity_bps: Option<u64>, now_ns: u64) {
        self.bucket = rebucket(self.bucket.take(), capacity_bps, now_ns);
    }

    /// Changes the capacity keeping the tokens (and debt) the bucket holds: a shard's share
    /// moves every balance period ([`crate::balance`]) and a fresh, full bucket each time would
    /// let it burst above its share.
    pub fn retarget(&mut self, capacity_bps: Option<u64>, now_ns: u64) {
        match (&mut self.bucket, capacity_bps) {
            (Some(b), Some(rate)) => {
                let fresh = rate_bucket(rate, now_ns);
                b.reconfigure(
                    fresh.rate_per_sec(),
                    fresh.tokens() as u64,
                    u64::MAX,
                    now_ns,
                );
            }
            _ => self.configure(capacity_bps, now_ns),
        }
    }

    /// True when a vif batch may be served now.
    #[inline]
    pub fn allows(&mut self, now_ns: u64) -> bool {
        match &mut self.bucket {
            Some(b) => {
                b.refill(now_ns);
                b.positive()
            }
            None => true,
        }
    }

    /// The most frames of about `avg_frame_bytes` the tokens cover, plus one (a full batch of
    /// 64 KiB super-frames would otherwise run the bucket 2 MiB into debt); `usize::MAX` when
    /// unlimited.
    #[inline]
    pub fn frames_within(&self, avg_frame_bytes: u64) -> usize {
        match &self.bucket {
            Some(b) => (b.tokens().max(0) as u64 / avg_frame_bytes.max(64)) as usize + 1,
            None => usize::MAX,
        }
    }

    /// Charges `bytes` sent to the uplink.
    #[inline]
    pub fn charge(&mut self, bytes: u64, now_ns: u64) {
        if let Some(b) = &mut self.bucket {
            b.refill(now_ns);
            b.consume(bytes);
        }
    }

    /// When a blocked uplink lets batches through again; `None` when it does now.
    pub fn blocked_until(&self) -> Option<u64> {
        self.bucket
            .as_ref()
            .filter(|b| !b.positive())
            .map(TokenBucket::positive_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_the_window_or_two_super_frames() {
        // 8 Gbit/s = 1 GB/s: 4 ms hold 4 MB.
        let b = rate_bucket(8_000_000_000, 0);
        assert_eq!(b.tokens(), 4_000_000);
        // 1 Mbit/s: the window holds 500 bytes, the floor wins.
        assert_eq!(rate_bucket(1_000_000, 0).tokens(), 131_072);
    }

    #[test]
    fn debt_delays_the_next_batch_and_the_average_is_exact() {
        let mut s = UplinkShaper::default();
        s.configure(Some(8_000_000), 0); // 1 MB/s
        assert!(s.allows(0));
        s.charge(131_072 + 1_000_000, 0); // one second of debt
        assert!(!s.allows(999_000_000));
        // Positive again once a whole byte more than the debt has accrued.
        assert_eq!(s.blocked_until(), Some(1_000_001_000));
        assert!(!s.allows(1_000_000_999));
        assert!(s.allows(1_000_001_000));
        // Unchanged capacity keeps the bucket, a new one starts full.
        let t = 1_000_001_000;
        s.charge(131_072, t);
        s.configure(Some(8_000_000), t);
        assert!(!s.allows(t));
        s.configure(Some(16_000_000), t);
        assert!(s.allows(t));
        s.configure(None, t);
        assert_eq!(s.frames_within(1500), usize::MAX);
    }
}
