//! A token bucket in integer arithmetic, refilled lazily from `now`.
//!
//! Tokens are in the engine's cost unit (bytes or cycles). Refill is `rate × elapsed / 1 s`,
//! computed in `u128` so that no rate (≤ 2^64 per second) and no gap (≤ 2^64 ns) overflows; the
//! remainder of the division is carried to the next refill, so a slow rate refilled often loses
//! nothing (1 byte/s refilled every microsecond still yields exactly 1 byte per second).
//!
//! Tokens may go negative: the poll loop charges a batch after it ran, when its real cost is
//! known, so a vif can overdraw by at most one batch and pays it back before it is served again.

use crate::units::NS_PER_SEC;

/// Burst a link bucket absorbs, in time at its rate (4 ms): the data plane's uplink capacity
/// and per-vif inbound maximum, and the simulator's model of the latter.
pub const LINK_BUCKET_WINDOW_NS: u64 = 4_000_000;
/// Smallest link bucket depth: two 64 KiB super-frames.
pub const LINK_BUCKET_MIN_DEPTH_BYTES: u64 = 2 * 65_536;

/// Bytes per second of a rate in bits per second (at least 1).
#[inline]
pub fn bytes_per_sec(rate_bps: u64) -> u64 {
    (rate_bps / 8).max(1)
}

/// A full byte bucket for `rate_bps`, [`LINK_BUCKET_WINDOW_NS`] deep (at least
/// [`LINK_BUCKET_MIN_DEPTH_BYTES`]), with unbounded debt: a frame is let through while the
/// tokens are positive and its real size is charged, so the average is exact. The data plane's
/// uplink capacity and per-vif inbound maximum are such buckets; the simulator models the
/// inbound maximum with the same function, so both drop the same frames.
pub fn link_bucket(rate_bps: u64, now_ns: u64) -> TokenBucket {
    let rate = bytes_per_sec(rate_bps);
    // rate < 2^61 and the window < 2^64: the product fits in u128.
    let depth = (u128::from(rate) * u128::from(LINK_BUCKET_WINDOW_NS) / u128::from(NS_PER_SEC))
        .max(u128::from(LINK_BUCKET_MIN_DEPTH_BYTES))
        .min(i64::MAX as u128) as u64;
    TokenBucket::new(rate, depth, u64::MAX, now_ns)
}

/// A lazily refilled token bucket allowing bounded debt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    /// Refill rate, cost units per second.
    rate_per_sec: u64,
    /// Most tokens the bucket holds (burst), cost units.
    depth: i64,
    /// Most debt allowed (tokens never go below `-debt_limit`), cost units.
    debt_limit: i64,
    /// Current tokens; negative = debt from a batch charged after it ran.
    tokens: i64,
    /// `rate × ns` not yet turned into whole tokens (always `< NS_PER_SEC`).
    carry: u64,
    /// When the bucket was last refilled.
    last_ns: u64,
}

impl TokenBucket {
    /// A full bucket refilling at `rate_per_sec` up to `depth`, with debt bounded by `debt_limit`.
    pub fn new(rate_per_sec: u64, depth: u64, debt_limit: u64, now_ns: u64) -> Self {
        let depth = i64::try_from(depth).unwrap_or(i64::MAX);
        TokenBucket {
            rate_per_sec,
            depth,
            debt_limit: i64::try_from(debt_limit).unwrap_or(i64::MAX),
            tokens: depth,
            carry: 0,
            last_ns: now_ns,
        }
    }

    /// Changes rate and depth, keeping current tokens (clipped to the new depth).
    pub fn reconfigure(&mut self, rate_per_sec: u64, depth: u64, debt_limit: u64, now_ns: u64) {
        self.refill(now_ns);
        self.rate_per_sec = rate_per_sec;
        self.depth = i64::try_from(depth).unwrap_or(i64::MAX);
        self.debt_limit = i64::try_from(debt_limit).unwrap_or(i64::MAX);
        self.tokens = self.tokens.clamp(-self.debt_limit, self.depth);
    }

    /// Adds the tokens earned since the last refill. Time going backwards is ignored.
    #[inline]
    pub fn refill(&mut self, now_ns: u64) {
        if now_ns <= self.last_ns {
            return;
        }
        let elapsed = now_ns - self.last_ns;
        self.last_ns = now_ns;
        if self.tokens >= self.depth {
            self.carry = 0;
            return;
        }
        // rate < 2^64 and elapsed < 2^64: the product fits in u128. On the hot path it fits in
        // u64 (10 Gbit/s in bytes × 1 ms is 1.25e15), and a u64 division by the constant
        // 10^9 is a multiply, where the u128 one is a call (`__udivti3`): the `vqos` engine
        // refills a bucket per ready vif per decision, so this is most of its cost at 64 vifs.
        let earned = u128::from(self.rate_per_sec) * u128::from(elapsed) + u128::from(self.carry);
        let (whole, carry) = match u64::try_from(earned) {
            Ok(e) => (u128::from(e / NS_PER_SEC), e % NS_PER_SEC),
            Err(_) => (
                earned / u128::from(NS_PER_SEC),
                (earned % u128::from(NS_PER_SEC)) as u64,
            ),
        };
        self.carry = carry;
        let room = (self.depth - self.tokens) as u128;
        if whole >= room {
            self.tokens = self.depth;
            self.carry = 0;
        } else {
            self.tokens += whole as i64;
        }
    }

    /// Raises the debt the bucket tolerates to at least `debt` (a batch bigger than any seen
    /// before must be charged in full, or the rate it stands for would not hold).
    #[inline]
    pub fn allow_debt(&mut self, debt: u64) {
        self.debt_limit = self.debt_limit.max(i64::try_from(debt).unwrap_or(i64::MAX));
    }

    /// Takes `cost` tokens (may leave the bucket in debt, down to the debt limit).
    #[inline]
    pub fn consume(&mut self, cost: u64) {
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        self.tokens = self.tokens.saturating_sub(cost).max(-self.debt_limit);
    }

    /// Lowers the balance to at most `max` tokens (an idle period must not bank a burst).
    #[inline]
    pub fn limit(&mut self, max: u64) {
        self.tokens = self.tokens.min(i64::try_from(max).unwrap_or(i64::MAX));
    }

    /// Current tokens (call [`TokenBucket::refill`] first for an up-to-date value).
    #[inline]
    pub fn tokens(&self) -> i64 {
        self.tokens
    }

    /// True when the bucket holds at least one token.
    #[inline]
    pub fn positive(&self) -> bool {
        self.tokens > 0
    }

    /// The refill rate, cost units per second.
    pub fn rate_per_sec(&self) -> u64 {
        self.rate_per_sec
    }

    /// When the bucket will next hold a positive balance (`u64::MAX` if the rate is 0).
    pub fn positive_at(&self) -> u64 {
        if self.tokens > 0 {
            return self.last_ns;
        }
        if self.rate_per_sec == 0 {
            return u64::MAX;
        }
        // Tokens needed to reach +1, minus the carry already earned, over the rate; rounded up.
        let need =
            u128::from((1 - self.tokens) as u64) * u128::from(NS_PER_SEC) - u128::from(self.carry);
        let wait = need.div_ceil(u128::from(self.rate_per_sec));
        self.last_ns
            .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_exactly_with_carry() {
        // 1 token per second, refilled every microsecond for 10 s: exactly 10 tokens.
        let mut b = TokenBucket::new(1, 100, 100, 0);
        b.consume(100);
        assert_eq!(b.tokens(), 0);
        for t in 1..=10_000_000u64 {
            b.refill(t * 1_000);
        }
        assert_eq!(b.tokens(), 10);
    }

    #[test]
    fn depth_and_debt_are_bounded() {
        let mut b = TokenBucket::new(1_000, 500, 200, 0);
        b.refill(10 * NS_PER_SEC);
        assert_eq!(b.tokens(), 500);
        b.consume(10_000);
        assert_eq!(b.tokens(), -200);
        assert!(!b.positive());
        // 201 tokens at 1000/s: positive after 201 ms.
        assert_eq!(b.positive_at(), 10 * NS_PER_SEC + 201_000_000);
        b.refill(10 * NS_PER_SEC + 201_000_000);
        assert_eq!(b.tokens(), 1);
    }

    #[test]
    fn reconfigure_keeps_tokens_within_new_depth() {
        let mut b = TokenBucket::new(1_000, 500, 500, 0);
        b.reconfigure(2_000, 100, 100, 0);
        assert_eq!(b.tokens(), 100);
        b.consume(150);
        b.refill(25_000_000); // 25 ms at 2000/s = 50 tokens
        assert_eq!(b.tokens(), 0);
    }
}
