//! Read budgets of a multiqueue TAP's receive queues ([`RxBudgets`]): what the network sends
//! toward a capped vif is read about as fast as the vif may receive it, not as fast as the
//! network sends it.
//!
//! ## Why
//! A TAP uplink's arrivals are steered into the queue of the vif they are for
//! ([`crate::tap_steer`]). A flood toward a vif capped at 10 Mbit/s then fills that vif's queue
//! only, but the switch still read whatever it held: 50,000–87,000 64-byte frames a second,
//! of which the vif's max passed 19,500, on a core its neighbours' traffic had saturated
//! (measured 2026-11-28, `tests/capped_floods.rs`). A vif's own frames are read at its cap
//! (issue 27: every frame read is charged to its sender); this is the same rule for what it
//! receives: reads of its queue are charged to a budget at [`READ_HEADROOM_PERCENT`] of its
//! inbound max, and an empty budget holds the queue.
//!
//! ## Behavior
//! - A queue with a budget is read while the budget is not in debt; every frame read from it
//!   is charged its length (reads go into debt by at most one batch).
//! - A budget earns its rate and holds at most [`BURST_NS`] of it, and never less than
//!   [`MIN_BURST_BYTES`] (a TCP super-frame and its neighbours).
//! - A queue in debt is held: taken out of the port's epoll set (so it wakes no one) and
//!   skipped by reads; the kernel keeps its arrivals and drops what no longer fits, before the
//!   switch spends anything on them. [`RxBudgets::refill`] (the switch calls it every poll of
//!   a budgeted uplink) puts it back once its budget is out of debt and says when that will
//!   be, for the loop's next wake-up.
//! - A queue without a budget (queue 0, where group and unknown destinations go; a queue
//!   whose vifs include one without an inbound max) is always read.
//!
//! ## Limits
//! What the kernel drops from a held queue is not counted by the switch (the TAP's own
//! `tx_dropped` counts it); the vif's flows there meet a FIFO's drops, not its flow queues'.
//! A queue lent to another shard is budgeted by its reader alike: it reads the queue through
//! an epoll set of its own, which the queue leaves while held (`crate::uplink_queues`).

/// The read budget of a vif's uplink queue, in percent of its inbound max: headroom for
/// bursts, so a budget never holds what the vif's max would pass.
pub const READ_HEADROOM_PERCENT: u64 = 150;

/// A budget holds at most this much time of its rate, ns.
pub const BURST_NS: u64 = 100_000_000;

/// A budget holds at least this many bytes.
pub const MIN_BURST_BYTES: u64 = 256 * 1024;

/// One queue's budget (bytes; negative: in debt).
#[derive(Debug, Clone, PartialEq)]
struct Budget {
    bytes_per_sec: u64,
    burst: i64,
    tokens: i64,
    last_ns: u64,
}

impl Budget {
    /// A full budget for a queue whose vifs may receive `max_bps` bits/s in all.
    fn new(max_bps: u64, now_ns: u64) -> Budget {
        let bytes_per_sec = max_bps.saturating_mul(READ_HEADROOM_PERCENT) / 100 / 8;
        let burst = (u128::from(bytes_per_sec) * u128::from(BURST_NS) / 1_000_000_000) as u64;
        let burst = burst.max(MIN_BURST_BYTES).min(i64::MAX as u64) as i64;
        Budget {
            bytes_per_sec: bytes_per_sec.max(1),
            burst,
            tokens: burst,
            last_ns: now_ns,
        }
    }

    fn refill(&mut self, now_ns: u64) {
        let rate = u128::from(self.bytes_per_sec);
        let earned = u128::from(now_ns.saturating_sub(self.last_ns)) * rate / 1_000_000_000;
        if i128::from(self.tokens) + earned as i128 >= i128::from(self.burst) {
            self.tokens = self.burst;
            self.last_ns = now_ns;
            return;
        }
        self.tokens += earned as i64;
        // Only the time the whole bytes took is spent: the rest counts at the next refill.
        self.last_ns += (earned * 1_000_000_000 / rate) as u64;
    }

    /// When the budget is out of debt, ns.
    fn ready_at(&self) -> u64 {
        let debt = (-self.tokens).max(0) as u128;
        let ns = (debt * 1_000_000_000).div_ceil(u128::from(self.bytes_per_sec));
        self.last_ns
            .saturating_add(ns.min(u128::from(u64::MAX)) as u64)
    }
}

/// What [`RxBudgets::refill`] changed: queues to take out of the epoll set and to put back.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// Queues now held.
    pub hold: Vec<usize>,
    /// Queues read again.
    pub release: Vec<usize>,
    /// When the first held queue will be read again, ns.
    pub wake_at: Option<u64>,
}

/// The budgets of a port's queues, by queue index.
#[derive(Debug, Default)]
pub struct RxBudgets {
    budgets: Vec<Option<Budget>>,
    held: Vec<bool>,
    /// Times a queue was held so far.
    pub holds: u64,
    /// Holds and releases the port could not apply (its budget was dropped, or the queue
    /// is read only when another wakes the port).
    pub failures: u64,
}

impl RxBudgets {
    /// Budgets for queues of `max_bps` (bits/s the queue's vifs may receive; `None`: no
    /// budget). A queue whose limit is unchanged keeps its budget's state.
    pub fn set(&mut self, max_bps: &[Option<u64>], now_ns: u64) {
        self.budgets.resize(max_bps.len(), None);
        self.held.resize(max_bps.len(), false);
        for (b, &m) in self.budgets.iter_mut().zip(max_bps) {
            let rate = m.map(|m| Budget::new(m, now_ns).bytes_per_sec);
            if b.as_ref().map(|b| b.bytes_per_sec) != rate {
                *b = m.map(|m| Budget::new(m, now_ns));
            }
        }
    }

    /// True when any queue has a budget.
    pub fn any(&self) -> bool {
        self.budgets.iter().any(Option::is_some)
    }

    /// True when queue `q` has a budget.
    #[inline]
    pub fn budgeted(&self, q: usize) -> bool {
        matches!(self.budgets.get(q), Some(Some(_)))
    }

    /// True when queue `q` is held (out of the port's epoll set).
    pub fn is_held(&self, q: usize) -> bool {
        self.held.get(q).copied().unwrap_or(false)
    }

    /// Drops queue `q`'s budget and its hold (the port could not take it out of its set).
    pub fn forget(&mut self, q: usize) {
        if let Some(b) = self.budgets.get_mut(q) {
            *b = None;
        }
        if let Some(h) = self.held.get_mut(q) {
            *h = false;
        }
        self.failures += 1;
    }

    /// Keeps the budgets of the first `n` queues only (the others were lent to other
    /// shards, whose readers budget them).
    pub fn truncate(&mut self, n: usize) {
        self.budgets.truncate(n);
        self.held.truncate(n);
    }

    /// True when queue `q` may be read now.
    #[inline]
    pub fn readable(&self, q: usize) -> bool {
        self.budgets
            .get(q)
            .and_then(Option::as_ref)
            .map_or(true, |b| b.tokens >= 0)
    }

    /// Charges `bytes` read from queue `q`.
    #[inline]
    pub fn charge(&mut self, q: usize, bytes: u64) {
        if let Some(Some(b)) = self.budgets.get_mut(q) {
            b.tokens = b.tokens.saturating_sub(bytes.min(i64::MAX as u64) as i64);
        }
    }

    /// Refills every budget at `now_ns`: the queues to hold and to read again.
    pub fn refill(&mut self, now_ns: u64) -> Holds {
        let mut out = Holds::default();
        for (q, (b, held)) in self.budgets.iter_mut().zip(&mut self.held).enumerate() {
            let Some(b) = b else {
                if std::mem::take(held) {
                    out.release.push(q);
                }
                continue;
            };
            b.refill(now_ns);
            let debt = b.tokens < 0;
            if debt != *held {
                *held = debt;
                if debt {
                    self.holds += 1;
                    out.hold.push(q);
                } else {
                    out.release.push(q);
                }
            }
            if debt {
                let at = b.ready_at();
                out.wake_at = Some(out.wake_at.map_or(at, |w: u64| w.min(at)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_queue_is_read_at_its_budget_then_held_until_it_is_earned_back() {
        let mut b = RxBudgets::default();
        // 10 Mbit/s: 1.875 MB/s at 150 %, a 256 KiB burst.
        b.set(&[None, Some(10_000_000), None], 0);
        assert!(b.any());
        assert_eq!(b.refill(0), Holds::default());
        b.charge(1, 256 * 1024);
        assert!(b.readable(1), "the burst is spent, not overdrawn");
        b.charge(1, 1875);
        assert!(!b.readable(1));
        b.charge(0, 1 << 30);
        b.charge(2, 1 << 30);
        assert!(b.readable(0) && b.readable(2), "no budget: always read");
        let h = b.refill(0);
        assert_eq!((h.hold, h.release), (vec![1], vec![]));
        // 1,875 bytes of debt at 1.875 MB/s: a millisecond.
        assert_eq!(h.wake_at, Some(MS));
        assert_eq!(b.refill(MS / 2).hold, Vec::<usize>::new(), "still held");
        assert!(!b.readable(1));
        let h = b.refill(MS);
        assert_eq!((h.hold, h.release, h.wake_at), (vec![], vec![1], None));
        assert!(b.readable(1));
        assert_eq!(b.holds, 1);
    }

    #[test]
    fn over_a_second_a_budget_passes_its_rate_and_burst_and_no_more() {
        let mut b = RxBudgets::default();
        b.set(&[None, Some(8_000_000)], 0);
        // Read 1,500-byte frames whenever readable, refilling every 100 µs, for a second.
        let mut read = 0u64;
        for t in 0..=10_000u64 {
            let now = t * 100_000;
            b.refill(now);
            while b.readable(1) {
                b.charge(1, 1500);
                read += 1500;
            }
        }
        // 8 Mbit/s at 150 %: 1.5 MB/s, plus the 256 KiB burst, plus one frame of debt.
        let most = 1_500_000 + 256 * 1024 + 1500;
        assert!(read <= most && read + 3000 >= most, "{read} against {most}");
    }

    #[test]
    fn a_new_limit_resets_only_the_budgets_it_changes_and_none_releases() {
        let mut b = RxBudgets::default();
        b.set(&[None, Some(10_000_000), Some(20_000_000)], 0);
        b.charge(1, 1 << 20);
        b.charge(2, 1 << 20);
        assert_eq!(b.refill(0).hold, vec![1, 2]);
        // Queue 1's limit unchanged: still in debt; queue 2's lifted: read again.
        b.set(&[None, Some(10_000_000), None], 0);
        let h = b.refill(0);
        assert_eq!((h.hold, h.release), (vec![], vec![2]));
        assert!(!b.readable(1) && b.readable(2));
        assert!(h.wake_at.is_some());
    }
}
