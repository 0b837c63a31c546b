//! The watchdog: checks the forwarding loop's health ([`Backend::loop_health`]) every period and
//! reports the first problem, so the daemon can exit non-zero and its supervisor (systemd's
//! `Restart=on-failure`) starts a fresh switch instead of a daemon that answers the API but
//! forwards nothing.
//!
//! A loop is dead when its thread has exited, or when it has not published its stats for
//! [`STALE_AFTER_INTERVALS`](crate::backend::STALE_AFTER_INTERVALS) of its stats intervals
//! (5 s with the data plane's 25 ms); see [`LoopHealth::problem`](crate::backend::LoopHealth::problem).

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::Backend;

/// How often the daemon's watchdog checks the loop.
pub const CHECK_PERIOD: Duration = Duration::from_secs(1);

/// A running watchdog thread; dropping it stops the thread.
pub struct Watchdog {
    /// Set to true to stop the thread; the condvar wakes it.
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// The watchdog thread (None once joined).
    thread: Option<JoinHandle<()>>,
}

/// Starts a thread that checks `backend`'s loop every `period` and calls `on_dead` once with
/// the reason when it finds the loop dead; the thread ends after that call or on [`Watchdog::stop`].
/// While the loop lives, `housekeeping` runs after each check (the daemon persists the
/// addresses port security locked, [`crate::api::Api::sync_locks`]).
pub fn spawn(
    backend: Arc<dyn Backend>,
    period: Duration,
    mut housekeeping: impl FnMut() + Send + 'static,
    on_dead: impl FnOnce(String) + Send + 'static,
) -> io::Result<Watchdog> {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("vqosd-watchdog".into())
        .spawn(move || {
            let (flag, cv) = &*stop2;
            let mut stopped = flag.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if *stopped {
                    return;
                }
                if let Some(problem) = backend.loop_health().problem() {
                    drop(stopped);
                    on_dead(problem);
                    return;
                }
                drop(stopped);
                housekeeping();
                stopped = flag.lock().unwrap_or_else(|e| e.into_inner());
                if *stopped {
                    return;
                }
                stopped = cv
                    .wait_timeout(stopped, period)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })?;
    Ok(Watchdog {
        stop,
        thread: Some(thread),
    })
}

impl Watchdog {
    /// Stops the thread and waits for it (before the switch is stopped on purpose, so a clean
    /// stop is not reported as a dead loop). Idempotent.
    pub fn stop(&mut self) {
        let (flag, cv) = &*self.stop;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{LoopHealth, MockBackend};
    use std::sync::mpsc;

    #[test]
    fn reports_a_dead_loop_once_and_stays_quiet_while_it_lives() {
        let mock = Arc::new(MockBackend::new());
        let (tx, rx) = mpsc::channel();
        let (ticks_tx, ticks) = mpsc::channel();
        let housekeeping = move || {
            let _ = ticks_tx.send(());
        };
        let mut w = spawn(
            mock.clone(),
            Duration::from_millis(5),
            housekeeping,
            move |why| tx.send(why).unwrap(),
        )
        .unwrap();
        // Housekeeping runs while the loop lives.
        ticks.recv_timeout(Duration::from_secs(30)).unwrap();
        // Alive: nothing is reported (the check runs every 5 ms; 50 ms is ten checks).
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        mock.set_loop_health(LoopHealth {
            running: true,
            stats_age_ns: 6_000_000_000,
            stats_interval_ns: 25_000_000,
        });
        let why = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(why.contains("has not reported for 6000 ms"), "{why}");
        w.stop();
        assert!(rx.recv().is_err(), "reported twice");
    }

    #[test]
    fn a_stop_is_prompt_and_reports_nothing() {
        let mock = Arc::new(MockBackend::new());
        let (tx, rx) = mpsc::channel::<String>();
        let mut w = spawn(
            mock.clone(),
            Duration::from_secs(3600),
            || {},
            move |why| tx.send(why).unwrap(),
        )
        .unwrap();
        w.stop();
        mock.stop();
        assert!(rx.recv().is_err());
    }
}
