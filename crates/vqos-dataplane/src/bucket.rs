//! A byte token bucket for the loop's own limits (uplink capacity, per-vif maximum on the
//! uplink→vif direction). Time is a parameter.
//!
//! ## Behavior
//! Tokens accrue at `rate_bytes_per_sec` up to `depth_bytes`. A batch is served while tokens
//! are positive and its real size is charged afterwards, so tokens may go negative (a 64 KiB
//! super-frame is never split): the debt delays the next batch and the average rate is exact.

/// Nanoseconds per second.
const NS_PER_SEC: u128 = 1_000_000_000;

/// A byte token bucket.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Refill rate, bytes per second (> 0).
    rate_bytes_per_sec: u64,
    /// Most tokens held, bytes.
    depth_bytes: i64,
    /// Tokens now, bytes; negative after a batch larger than what was left.
    tokens_bytes: i64,
    /// Refill not yet worth a whole byte, in byte·ns per second units (`< NS_PER_SEC`): carried
    /// forward so that frequent refills lose nothing.
    frac: u128,
    /// Time of the last refill, ns; only moves forward.
    last_ns: u64,
}

impl TokenBucket {
    /// A full bucket of `rate_bps` bits per second holding `window_ns` worth of bytes, and at
    /// least `min_depth_bytes`.
    pub fn new(rate_bps: u64, window_ns: u64, min_depth_bytes: u64, now_ns: u64) -> Self {
        let rate = (rate_bps / 8).max(1);
        // rate < 2^61 and window < 2^64: the product fits in u128.
        let depth = (u128::from(rate) * u128::from(window_ns) / NS_PER_SEC)
            .max(u128::from(min_depth_bytes))
            .min(i64::MAX as u128) as i64;
        TokenBucket {
            rate_bytes_per_sec: rate,
            depth_bytes: depth,
            tokens_bytes: depth,
            frac: 0,
            last_ns: now_ns,
        }
    }

    /// Refill rate, bits per second.
    pub fn rate_bps(&self) -> u64 {
        self.rate_bytes_per_sec.saturating_mul(8)
    }

    /// Tokens now (after the last refill), bytes.
    pub fn tokens_bytes(&self) -> i64 {
        self.tokens_bytes
    }

    /// Adds what accrued since the last refill.
    #[inline]
    pub fn refill(&mut self, now_ns: u64) {
        if now_ns <= self.last_ns {
            return;
        }
        let dt = u128::from(now_ns - self.last_ns);
        self.last_ns = now_ns;
        // rate < 2^64 and dt < 2^64: the product fits in u128 with room for frac.
        let num = u128::from(self.rate_bytes_per_sec) * dt + self.frac;
        let add = num / NS_PER_SEC;
        self.frac = num % NS_PER_SEC;
        let room = (self.depth_bytes - self.tokens_bytes) as u128;
        if add >= room {
            // Full: accrual beyond the depth is lost, fractions included.
            self.tokens_bytes = self.depth_bytes;
            self.frac = 0;
        } else {
            self.tokens_bytes += add as i64;
        }
    }

    /// True when a batch may be served (tokens positive).
    #[inline]
    pub fn allows(&self) -> bool {
        self.tokens_bytes > 0
    }

    /// Charges `bytes` (tokens may go negative).
    #[inline]
    pub fn consume(&mut self, bytes: u64) {
        self.tokens_bytes = self
            .tokens_bytes
            .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// When tokens will next be positive, ns (now if they are).
    pub fn ready_at(&self) -> u64 {
        if self.tokens_bytes > 0 {
            return self.last_ns;
        }
        // Need (1 - tokens) bytes: (need·1e9 - frac) / rate ns, rounded up.
        let need = (1 - i128::from(self.tokens_bytes)) as u128 * NS_PER_SEC;
        let need = need.saturating_sub(self.frac);
        let dt = need.div_ceil(u128::from(self.rate_bytes_per_sec));
        self.last_ns
            .saturating_add(u64::try_from(dt).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_rate_is_exact_with_debt_and_fractions() {
        // 1 Mbit/s = 125 000 B/s; depth 10 ms = 1 250 B.
        let mut b = TokenBucket::new(1_000_000, 10_000_000, 0, 0);
        assert_eq!(b.tokens_bytes(), 1_250);
        b.consume(3_000);
        assert!(!b.allows());
        let at = b.ready_at();
        // Need 1 751 bytes at 125 B/ms = 14.008 ms.
        assert_eq!(at, 14_008_000);
        b.refill(at - 1);
        assert!(!b.allows());
        b.refill(at);
        assert!(b.allows());
        // Refilling in 1 ns steps loses no fraction: 8 µs = 1 byte.
        let mut c = TokenBucket::new(1_000_000, 0, 10, 0);
        c.consume(c.tokens_bytes() as u64);
        for t in 1..=8_000 {
            c.refill(t);
        }
        assert_eq!(c.tokens_bytes(), 1);
    }

    #[test]
    fn depth_caps_idle_accrual() {
        let mut b = TokenBucket::new(8_000_000, 1_000_000, 5_000, 0);
        assert_eq!(b.tokens_bytes(), 5_000, "min depth applies");
        b.consume(5_000);
        b.refill(10_000_000_000);
        assert_eq!(b.tokens_bytes(), 5_000);
    }
}
