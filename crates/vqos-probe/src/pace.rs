//! The flood's send schedule and its greed judgment ([`crate::flood`] module docs, "Pacing",
//! "Falling behind" and "Greedy floods yield"), driven by a time since the start that the
//! caller passes in: the flood reads the monotonic clock, the tests step a virtual one, so the
//! logic is tested exactly and no test depends on how busy the machine is.

use std::time::Duration;

/// At most this much of the schedule is made up after the generator fell behind.
pub const MAX_CATCH_UP: Duration = Duration::from_millis(5);

/// Window over which a paced flood's greed is judged.
pub const GREEDY_WINDOW: Duration = Duration::from_millis(100);

/// A window in which more than 1/10 of the scheduled frames were skipped makes a flood greedy.
const GREEDY_SKIPPED_DIV: u64 = 10;

/// A greedy flood is well-behaved again after this many windows in a row that were not greedy
/// (1 s: a flood just over the line does not flip back and forth every window).
pub(crate) const KEPT_WINDOWS: u32 = 10;

/// What a paced flood does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send this many frames now (already counted as scheduled).
    Send(u64),
    /// Nothing is due: the next frame is due this long from now.
    Wait(Duration),
}

/// The absolute schedule of a paced flood: frame `i` is due at `i / pps` after the start.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// Frames per second.
    pps: f64,
    /// Most frames made up at once after falling behind ([`MAX_CATCH_UP`] of frames).
    catch_up: u64,
    /// Frames scheduled so far: handed out by [`Pacer::step`] and skipped.
    pub scheduled: u64,
    /// Frames skipped because they were more than `catch_up` behind.
    pub skipped: u64,
}

impl Pacer {
    /// A schedule of `pps` frames per second (`pps` > 0).
    pub fn new(pps: f64) -> Pacer {
        Pacer {
            pps,
            catch_up: (pps * MAX_CATCH_UP.as_secs_f64()).ceil() as u64,
            scheduled: 0,
            skipped: 0,
        }
    }

    /// At `elapsed` since the start: the frames due, at most `batch`, or how long until the
    /// next one. Frames more than `catch_up` behind are skipped.
    pub fn step(&mut self, elapsed: Duration, batch: u64) -> Step {
        let owed = (elapsed.as_secs_f64() * self.pps) as u64;
        let mut due = owed.saturating_sub(self.scheduled);
        if due > self.catch_up {
            self.skipped += due - self.catch_up;
            self.scheduled += due - self.catch_up;
            due = self.catch_up;
        }
        if due == 0 {
            let next = Duration::from_secs_f64((self.scheduled + 1) as f64 / self.pps);
            return Step::Wait(next.saturating_sub(elapsed));
        }
        let n = due.min(batch);
        self.scheduled += n;
        Step::Send(n)
    }
}

/// Whether the flood asks for more than it gets, and the thread priority that goes with it.
pub(crate) struct Greedy {
    /// Nice value while greedy; `None` leaves the priority alone.
    nice: Option<i32>,
    /// The thread's nice value before the flood, restored when it is not greedy.
    original: i32,
    /// Greedy now.
    on: bool,
    /// Start of the current window, since the start of the flood.
    since: Duration,
    /// Frames scheduled when the current window began.
    scheduled0: u64,
    /// Frames skipped when the current window began.
    skipped0: u64,
    /// Windows judged greedy so far.
    pub windows: u64,
    /// Windows in a row kept up with.
    kept: u32,
}

impl Greedy {
    /// Not greedy yet, at the calling thread's current nice value.
    pub fn new(nice: Option<i32>) -> Greedy {
        // SAFETY: getpriority on this thread's own id has no memory effects (-1 is a valid
        // value; an error leaves 0, the default).
        let original = unsafe {
            *libc::__errno_location() = 0;
            let n = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
            if *libc::__errno_location() != 0 {
                0
            } else {
                n
            }
        };
        Greedy {
            nice,
            original,
            on: false,
            since: Duration::ZERO,
            scheduled0: 0,
            skipped0: 0,
            windows: 0,
            kept: 0,
        }
    }

    /// Greedy now.
    #[cfg(test)]
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Judges the window that ends at `elapsed`, if it is over.
    pub fn window(&mut self, elapsed: Duration, scheduled: u64, skipped: u64) {
        if elapsed.saturating_sub(self.since) < GREEDY_WINDOW {
            return;
        }
        let asked = scheduled - self.scheduled0;
        let missed = skipped - self.skipped0;
        if asked > 0 && missed * GREEDY_SKIPPED_DIV > asked {
            self.kept = 0;
            self.set(true);
        } else {
            self.kept += 1;
            if self.kept >= KEPT_WINDOWS {
                self.set(false);
            }
        }
        self.windows += u64::from(self.on);
        self.since = elapsed;
        self.scheduled0 = scheduled;
        self.skipped0 = skipped;
    }

    /// Turns greed on or off, and the thread's nice value with it.
    pub fn set(&mut self, on: bool) {
        if on == self.on {
            return;
        }
        self.on = on;
        if let Some(n) = self.nice {
            let n = if on { n } else { self.original };
            // SAFETY: setpriority on this thread's own id (gettid) has no memory effects;
            // failure (no permission to lower the value again) only leaves the priority.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, n);
            }
        }
    }
}

impl Drop for Greedy {
    /// Every way out of the flood, errors included, gives the thread its priority back.
    fn drop(&mut self) {
        self.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paced flood of `pps` frames/s on a virtual clock that advances by `tick` per round
    /// (plus `stall` once, at `stall_at`), sending at most `batch` frames per round, for
    /// `duration`; as `run_flood` does. Returns the pacer, the greed and its state per window.
    fn simulate(
        pps: f64,
        batch: u64,
        tick: Duration,
        stall: Option<(Duration, Duration)>,
        duration: Duration,
    ) -> (Pacer, Greedy, Vec<bool>) {
        let mut p = Pacer::new(pps);
        let mut g = Greedy::new(None);
        g.set(true);
        let mut per_window = Vec::new();
        let mut t = Duration::ZERO;
        let mut stalled = false;
        while t < duration {
            let before = g.since;
            g.window(t, p.scheduled, p.skipped);
            if g.since != before {
                per_window.push(g.is_on());
            }
            match p.step(t, batch) {
                Step::Send(_) => t += tick,
                Step::Wait(w) => t += w.max(Duration::from_nanos(1)),
            }
            if let Some((at, len)) = stall {
                if !stalled && t >= at {
                    t += len;
                    stalled = true;
                }
            }
        }
        (p, g, per_window)
    }

    #[test]
    fn the_schedule_is_absolute_and_sends_every_due_frame() {
        let mut p = Pacer::new(1000.0);
        assert_eq!(
            p.step(Duration::ZERO, 32),
            Step::Wait(Duration::from_millis(1))
        );
        assert_eq!(p.step(Duration::from_micros(2500), 32), Step::Send(2));
        assert_eq!(
            p.step(Duration::from_micros(2500), 32),
            Step::Wait(Duration::from_micros(500))
        );
        // 4 ms behind (under the 5 ms catch-up): all made up, in batches.
        assert_eq!(p.step(Duration::from_micros(6000), 3), Step::Send(3));
        assert_eq!(p.step(Duration::from_micros(6000), 3), Step::Send(1));
        assert_eq!((p.scheduled, p.skipped), (6, 0));
        // 1 s behind: 5 frames made up, the rest skipped.
        assert_eq!(p.step(Duration::from_millis(1006), 100), Step::Send(5));
        assert_eq!((p.scheduled, p.skipped), (1006, 995));
    }

    #[test]
    fn greedy_floods_yield_and_kept_schedules_do_not() {
        let secs = Duration::from_millis(1500);
        // 1000 frames/s, a round every 100 µs: kept; greedy only until 1 s of windows showed
        // it (windows 1–9 greedy, the 10th turns it off).
        let (p, g, w) = simulate(1000.0, 32, Duration::from_micros(100), None, secs);
        assert_eq!(p.skipped, 0);
        // Frames 1..=1499 are due before 1.5 s.
        assert_eq!(p.scheduled, 1499);
        assert_eq!(g.windows, u64::from(KEPT_WINDOWS) - 1);
        assert_eq!(w.len(), 14);
        assert!(!g.is_on());
        // 100 M frames/s, 32 frames per 1 ms round: no machine keeps that; greedy in every
        // window.
        let (p, g, w) = simulate(1e8, 32, Duration::from_millis(1), None, secs);
        assert!(p.skipped * 10 > p.scheduled * 9, "{p:?}");
        assert_eq!(g.windows, w.len() as u64);
        assert!(w.len() >= 14 && w.iter().all(|&on| on), "{w:?}");
    }

    #[test]
    fn a_kept_flood_that_falls_behind_once_is_greedy_for_a_second() {
        // Kept, then a 50 ms stall at 1.2 s (before frame 1200 went out) leaves 51 frames due:
        // 5 are made up, 46 skipped of the window's ~100 frames. Greedy from
        // that window for the 1 s of kept windows that follow, then well-behaved again.
        let (p, _, w) = simulate(
            1000.0,
            32,
            Duration::from_micros(100),
            Some((Duration::from_millis(1200), Duration::from_millis(50))),
            Duration::from_millis(3000),
        );
        assert_eq!(p.skipped, 46);
        let first_on = w.iter().skip(9).position(|&on| on).unwrap() + 9;
        assert_eq!(first_on, 12, "{w:?}");
        let run = w[first_on..].iter().take_while(|&&on| on).count();
        assert_eq!(run, KEPT_WINDOWS as usize, "{w:?}");
        assert!(!w.last().unwrap());
    }

    #[test]
    fn a_window_is_judged_only_once_it_is_over() {
        let mut g = Greedy::new(None);
        g.window(Duration::from_millis(99), 100, 90);
        assert!(!g.is_on() && g.windows == 0);
        g.window(Duration::from_millis(100), 100, 90);
        assert!(g.is_on() && g.windows == 1);
        // Exactly 1/10 skipped is not greedy.
        g.window(Duration::from_millis(200), 200, 100);
        assert_eq!(g.kept, 1);
    }
}
