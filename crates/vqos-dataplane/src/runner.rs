//! The loop thread: the wrapper around [`Switch`] that owns the clock, epoll and the control
//! channel. It applies pending commands between batches, polls the switch, publishes stats, and
//! when the switch has nothing to do waits (epoll) or spins (busy polling) until new frames or
//! the switch's next deadline.
//!
//! ## Behavior
//! A port's ready flag is cleared by a short read and set again by readiness: epoll events,
//! or every port in busy polling, collected when the loop waits and, while it stays busy, every
//! 50 µs ([`BUSY_HARVEST_INTERVAL_NS`]): a port drained once is read again even while other
//! ports keep the loop busy. Ports without a readiness descriptor are polled every millisecond.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::control::{Answer, Op};
use crate::error::SwitchError;
use crate::stats::SwitchStats;
use crate::switch::Switch;
use crate::sys::{cycles, Epoll, EventFd};

/// Epoll token of the loop's wake-up eventfd.
pub(crate) const WAKE_TOKEN: u64 = u64::MAX;
/// In epoll mode, how often ports without a readiness descriptor are polled, ns.
const POLL_ONLY_INTERVAL_NS: u64 = 1_000_000;
/// While every iteration has work, readiness is collected (without waiting) this often, ns.
/// Without it a port whose short read cleared its flag was not read again for as long as any
/// other port stayed backlogged (C2QoS Fig. 6(e) under `tcm`: VM1 starved for seconds behind
/// three 64-byte floods with a slow uplink). At most 20 000 non-blocking `epoll_wait`s a
/// second, and a drained port waits at most this long before it is a candidate again.
const BUSY_HARVEST_INTERVAL_NS: u64 = 50_000;

/// A command from the handle to the loop.
pub(crate) enum Command {
    /// Apply `op` and answer.
    Call { op: Op, reply: SyncSender<Answer> },
    /// Apply `op`, no answer wanted (ECN probabilities, unlocks).
    Post(Op),
    /// Exit the loop; with `release`, every port this shard reads is released first.
    Stop { release: bool },
}

/// The thread's state.
pub(crate) struct Runner {
    /// The data plane.
    pub sw: Switch,
    /// Epoll instance, in epoll mode; `None` = busy polling.
    pub epoll: Option<Epoll>,
    /// Wake-up eventfd (registered with epoll under [`WAKE_TOKEN`]).
    pub wake: Arc<EventFd>,
    /// Control commands.
    pub commands: Receiver<Command>,
    /// Reload flag: set by the handle when a command is queued.
    pub pending: Arc<AtomicBool>,
    /// Where stats are published.
    pub stats_out: Arc<Mutex<Arc<SwitchStats>>>,
    /// Clock origin (switch time 0).
    pub origin: Instant,
    /// When readiness is next collected while the loop stays busy, ns.
    pub next_harvest_ns: u64,
}

impl Runner {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Registers every port's readiness descriptor (the uplink's at start); under busy
    /// polling tells the ports instead.
    pub fn register_all(&mut self) -> Result<(), SwitchError> {
        match &self.epoll {
            Some(ep) => {
                for (slot, fd) in self.sw.readiness_fds() {
                    ep.add(fd, slot as u64, true)?;
                }
            }
            None => {
                if self.sw.reads(0) {
                    self.sw.set_busy_poll(0);
                }
            }
        }
        Ok(())
    }

    pub fn run(mut self) {
        loop {
            let t0 = cycles();
            if self.pending.swap(false, Ordering::Acquire) && !self.drain_commands() {
                break;
            }
            let now = self.now_ns();
            let poll = self.sw.poll(now);
            if self.sw.stats_due(now) {
                self.publish(now);
            }
            if poll.did_work {
                // An iteration that did work does not wait, so it does not collect readiness
                // either: do it every BUSY_HARVEST_INTERVAL_NS without waiting, or ports
                // drained earlier would starve behind backlogged ones.
                // With emulated work every batch is long (tens of µs per frame): collect after
                // each, or a frame arriving during one (a probe's answer on the uplink, a
                // priority vif's request) would wait out the interval on top of it.
                if now >= self.next_harvest_ns || self.sw.emulated_work().is_some() {
                    self.harvest(Some(0));
                    self.next_harvest_ns = now + BUSY_HARVEST_INTERVAL_NS;
                }
                self.sw.counters.busy_cycles += cycles().wrapping_sub(t0);
            } else {
                self.wait(now, poll.next_deadline_ns);
                self.sw.counters.idle_cycles += cycles().wrapping_sub(t0);
            }
        }
        let now = self.now_ns();
        self.publish(now);
    }

    fn publish(&mut self, now: u64) {
        let mut stats = self.sw.stats(now);
        for l in &mut stats.loops {
            l.epoll_errors = self.epoll.as_ref().map_or(0, Epoll::errors);
            l.epoll_wait_fallback = self.epoll.as_ref().is_some_and(Epoll::uses_fallback);
        }
        *self.stats_out.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(stats);
    }

    /// Applies queued commands; returns false on `Stop`.
    fn drain_commands(&mut self) -> bool {
        while let Ok(cmd) = self.commands.try_recv() {
            self.sw.counters.commands += 1;
            match cmd {
                Command::Stop { release } => {
                    if release {
                        self.sw.release_ports();
                    }
                    return false;
                }
                Command::Post(op) => {
                    let _ = self.apply(op);
                }
                Command::Call { op, reply } => {
                    let answer = self.apply(op);
                    // A change marks the stats due: publish them before answering, so a
                    // caller's `stats()` after its call returns already shows the change
                    // (a port just added is listed, one removed is gone).
                    let now = self.now_ns();
                    if self.sw.stats_due(now) {
                        self.publish(now);
                    }
                    let _ = reply.send(answer);
                }
            }
        }
        true
    }

    /// Applies `op` to the switch, watching the readiness of a port it now reads and no
    /// longer watching one it let go of.
    fn apply(&mut self, op: Op) -> Answer {
        let now = self.now_ns();
        let moves = matches!(op, Op::Rehome { .. });
        // A port removed, or a port (or a queue of it) this shard gave up
        // ([`crate::rehome`]): its descriptor leaves the epoll set once the switch no longer
        // watches it. Decided by what the switch reads before and after, so a shard that
        // reads another queue of the same vif keeps watching its own.
        let slot = match &op {
            Op::RemovePort { name } | Op::Rehome { name, .. } => self.sw.slot_of(name),
            _ => None,
        };
        let watched = slot.and_then(|s| self.sw.readiness_fd(s));
        let mut answer = self.sw.apply(op, now);
        let removed_fd =
            watched.filter(|&fd| slot.and_then(|s| self.sw.readiness_fd(s)) != Some(fd));
        if let Some(slot) = answer.added.as_ref().map(|a| a.slot) {
            match self.watch(slot) {
                Ok(()) => {}
                // A port moved here stays read: polled every millisecond instead.
                Err(_) if moves => self.sw.poll_only(slot),
                Err(e) => {
                    let name = self.sw.port_name(slot);
                    answer.released = self.sw.remove_shared(&name, now).ok().flatten();
                    answer.added = None;
                    answer.result = Err(e);
                }
            }
        }
        if answer.result.is_ok() {
            if let (Some(ep), Some(fd)) = (&self.epoll, removed_fd) {
                ep.remove(fd);
            }
        }
        answer
    }

    /// Registers the readiness descriptor of a new port in `slot`; under busy polling tells
    /// the port instead.
    fn watch(&mut self, slot: usize) -> Result<(), SwitchError> {
        if !self.sw.reads(slot) {
            return Ok(());
        }
        match (&self.epoll, self.sw.readiness_fd(slot)) {
            (Some(ep), Some(fd)) => ep.add(fd, slot as u64, true)?,
            (Some(_), None) => {}
            (None, _) => self.sw.set_busy_poll(slot),
        }
        Ok(())
    }

    /// Nothing to do now: sleep until a port or the wake fd fires or `deadline` passes
    /// (epoll), or mark every port as worth polling (busy polling).
    fn wait(&mut self, now: u64, deadline: u64) {
        if self.epoll.is_none() {
            self.harvest(None);
            std::hint::spin_loop();
            return;
        }
        let mut timeout = deadline.saturating_sub(now);
        // Ports without a readiness descriptor cannot wake us: poll them every millisecond.
        if self.sw.has_poll_only_ports() {
            timeout = timeout.min(POLL_ONLY_INTERVAL_NS);
        }
        self.harvest(Some(timeout));
    }

    /// Sets the ready flag of every port with frames waiting: in epoll mode the ports whose
    /// descriptor fired within `timeout_ns` (`Some(0)`: only those that already did) and the
    /// ports without a descriptor; in busy polling every port (`timeout_ns` unused).
    fn harvest(&mut self, timeout_ns: Option<u64>) {
        let Some(epoll) = self.epoll.as_mut() else {
            self.sw.mark_all_ready(false);
            return;
        };
        for token in epoll.wait(timeout_ns) {
            if token == WAKE_TOKEN {
                self.wake.clear();
            } else {
                self.sw.mark_ready(token as usize);
            }
        }
        if self.sw.has_poll_only_ports() {
            self.sw.mark_all_ready(true);
        }
    }
}
