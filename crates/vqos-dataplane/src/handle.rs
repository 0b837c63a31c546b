//! [`SwitchHandle`]: a [`Switch`] on a loop thread of its own, controlled from any thread.
//!
//! ## Behavior
//! Control calls are synchronous: they check what they can cheaply (so that no TAP is created
//! for a change that would be refused), open the port on the calling thread, send the command
//! to the loop and return once the loop applied it (or refused it, in which case nothing
//! changed). They wait as long as the loop takes (no timeout: a queued command is always
//! applied, so the handle never gives up on an answer). A port the loop lets go of (removed,
//! refused on add) is handed back with the answer and closed on the calling thread, not on the
//! loop. The loop is the one authority on the policy set; the handle keeps the copy each
//! answer carries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use vqos_sched::{PolicySet, VifPolicy, VifSpec};

use crate::calib::CostSamples;
use crate::config::{PortSpec, Readiness, SwitchConfig};
use crate::error::SwitchError;
use crate::runner::{Answer, Command, Runner, WAKE_TOKEN};
use crate::stats::SwitchStats;
use crate::switch::Switch;
use crate::sys::{Epoll, EventFd};
use crate::tap::TapOrigin;

/// Control state shared by handle calls (never touched by the loop).
struct Control {
    /// The policy set the loop runs with (from its last answer).
    policies: Arc<PolicySet>,
    /// Commands to the loop.
    tx: Sender<Command>,
    /// The loop thread, until stopped.
    thread: Option<JoinHandle<()>>,
}

/// Controls a running switch; `Send + Sync`, share it behind an `Arc`. Dropping it stops the
/// switch.
pub struct SwitchHandle {
    /// Serialises control calls.
    control: Mutex<Control>,
    /// Reload flag: set when a command is queued, cleared by the loop.
    pending: Arc<AtomicBool>,
    /// Wakes the loop from epoll.
    wake: Arc<EventFd>,
    /// The latest stats snapshot.
    stats: Arc<Mutex<Arc<SwitchStats>>>,
    /// The uplink's name.
    uplink: String,
    /// The loop's per-batch cost samples (written by the loop, read here).
    cost_samples: Arc<CostSamples>,
    /// The loop's clock origin (its `time_ns` counts from here).
    origin: Instant,
}

/// The forwarding loop's liveness ([`SwitchHandle::loop_health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopHealth {
    /// The loop thread has not exited (stopped, or died of a panic).
    pub running: bool,
    /// Nanoseconds since the loop last published stats (it does so every
    /// `stats_interval_ns` while it lives).
    pub stats_age_ns: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a switch (same as [`SwitchHandle::start`]).
pub fn start(config: SwitchConfig) -> Result<SwitchHandle, SwitchError> {
    SwitchHandle::start(config)
}

impl SwitchHandle {
    /// Opens the uplink, builds the engine and starts the poll loop thread.
    pub fn start(config: SwitchConfig) -> Result<SwitchHandle, SwitchError> {
        let readiness = config.readiness;
        let origin = Instant::now();
        let mut sw = Switch::new(config, 0)?;
        let uplink = sw.uplink_name().to_string();
        let policies = sw.policies().clone();
        let cost_samples = sw.cost_samples().clone();
        let wake = Arc::new(EventFd::new()?);
        let pending = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let epoll = match readiness {
            Readiness::Epoll => {
                let e = Epoll::new(64)?;
                e.add(wake.raw(), WAKE_TOKEN, false)?;
                Some(e)
            }
            Readiness::BusyPoll => None,
        };
        let stats = Arc::new(Mutex::new(Arc::new(sw.stats(0))));
        let mut runner = Runner {
            sw,
            epoll,
            wake: wake.clone(),
            commands: rx,
            pending: pending.clone(),
            stats_out: stats.clone(),
            origin,
            next_harvest_ns: 0,
        };
        runner.register_all()?;
        let thread = std::thread::Builder::new()
            .name("vqos-loop".into())
            .spawn(move || runner.run())
            .map_err(SwitchError::Spawn)?;
        Ok(SwitchHandle {
            control: Mutex::new(Control {
                policies,
                tx,
                thread: Some(thread),
            }),
            pending,
            wake,
            stats,
            uplink,
            cost_samples,
            origin,
        })
    }

    /// Sends a command and waits for the loop's answer.
    fn call(
        &self,
        control: &mut Control,
        make: impl FnOnce(SyncSender<Answer>) -> Command,
    ) -> Result<(), SwitchError> {
        if control.thread.is_none() {
            return Err(SwitchError::Stopped);
        }
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        control
            .tx
            .send(make(reply_tx))
            .map_err(|_| SwitchError::Stopped)?;
        self.pending.store(true, Ordering::Release);
        self.wake.signal();
        // Wait as long as it takes: the command is queued and will be applied, so giving up
        // would leave the handle's view and the loop's disagreeing. A loop that exits (stop,
        // panic) drops the command and its sender, which ends the wait.
        match reply_rx.recv() {
            Ok(mut answer) => {
                if let Some(port) = answer.released.as_mut().filter(|_| answer.result.is_ok()) {
                    // Removed for good: a persistent TAP the switch made goes too.
                    port.release();
                }
                drop(answer.released);
                control.policies = answer.policies;
                answer.result
            }
            Err(mpsc::RecvError) => Err(SwitchError::Stopped),
        }
    }

    /// The uplink's name.
    pub fn uplink_name(&self) -> &str {
        &self.uplink
    }

    /// Adds a vif port with its policy. The new policy set is validated before the port is
    /// opened (a refused change creates no TAP); the loop validates it again.
    pub fn add_port(&self, spec: PortSpec, policy: VifPolicy) -> Result<(), SwitchError> {
        self.add_port_reporting(spec, policy).map(drop)
    }

    /// [`SwitchHandle::add_port`], telling for a TAP whether it was created, re-attached or
    /// attached (`None` for other ports).
    pub fn add_port_reporting(
        &self,
        spec: PortSpec,
        policy: VifPolicy,
    ) -> Result<Option<TapOrigin>, SwitchError> {
        let mut control = lock(&self.control);
        if spec.name == self.uplink || control.policies.id(&spec.name).is_ok() {
            return Err(SwitchError::DuplicatePort(spec.name));
        }
        let mut next = (*control.policies).clone();
        next.vifs.push(VifSpec {
            name: spec.name.clone(),
            policy: policy.clone(),
        });
        next.validate()?;
        let (port, macs, origin) = spec.open()?;
        self.call(&mut control, |reply| Command::AddPort {
            port,
            macs,
            policy,
            reply,
        })?;
        Ok(origin)
    }

    /// Removes vif port `name`; other ports keep forwarding. A TAP the switch created vanishes.
    pub fn remove_port(&self, name: &str) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        if name == self.uplink {
            return Err(SwitchError::Uplink(name.to_string()));
        }
        self.call(&mut control, |reply| Command::RemovePort {
            name: name.to_string(),
            reply,
        })
    }

    /// Replaces the whole policy set (capacity, cost model, every vif's policy). It must name
    /// exactly the vif ports; it is validated, then the engine is reconfigured between batches.
    pub fn set_policies(&self, policies: PolicySet) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        self.call(&mut control, |reply| Command::SetPolicies {
            policies,
            reply,
        })
    }

    /// Replaces one vif's policy (validated against the others). The read-modify-write happens
    /// on the loop, so concurrent calls (on different vifs) never undo each other.
    pub fn set_policy(&self, name: &str, policy: VifPolicy) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        self.call(&mut control, |reply| Command::SetPolicy {
            name: name.to_string(),
            policy,
            reply,
        })
    }

    /// The policy set in force.
    pub fn policies(&self) -> PolicySet {
        (*lock(&self.control).policies).clone()
    }

    /// Sets the probability of marking ECN CE on each vif's data (the PID-ECN controller's
    /// output): ECT frames from the uplink to the vif and ECT frames the vif sends to the
    /// uplink, one per vif in the order of [`SwitchHandle::policies`]. Applied between batches;
    /// new ports start at 0.
    pub fn set_ecn_probabilities(&self, probabilities: Vec<f64>) -> Result<(), SwitchError> {
        let control = lock(&self.control);
        if probabilities.len() != control.policies.len()
            || probabilities.iter().any(|p| !(0.0..=1.0).contains(p))
        {
            return Err(SwitchError::BadEcnProbabilities {
                expected: control.policies.len(),
                got: probabilities,
            });
        }
        if control.thread.is_none() {
            return Err(SwitchError::Stopped);
        }
        control
            .tx
            .send(Command::SetEcn { probabilities })
            .map_err(|_| SwitchError::Stopped)?;
        self.pending.store(true, Ordering::Release);
        self.wake.signal();
        Ok(())
    }

    /// The last vif batches' frames, bytes and cycles ([`CostSamples`]), read without waiting
    /// for the loop.
    pub fn cost_samples(&self) -> &CostSamples {
        &self.cost_samples
    }

    /// The latest stats snapshot (published by the loop every `stats_interval_ns`).
    pub fn stats(&self) -> Arc<SwitchStats> {
        lock(&self.stats).clone()
    }

    /// Whether the forwarding loop lives and how recently it published: the daemon's health
    /// check and watchdog read this (a loop that panicked, or one stuck in a call, stops
    /// publishing stats every `stats_interval_ns`).
    pub fn loop_health(&self) -> LoopHealth {
        let running = lock(&self.control)
            .thread
            .as_ref()
            .is_some_and(|t| !t.is_finished());
        let now_ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        LoopHealth {
            running,
            stats_age_ns: now_ns.saturating_sub(self.stats().time_ns),
        }
    }

    /// Stops the loop and closes every port; TAPs the switch owns persistently
    /// ([`crate::TapMode::Own`]) stay for the next run. Idempotent.
    pub fn stop(&self) -> Result<(), SwitchError> {
        self.stop_with(false)
    }

    /// Stops the loop and releases every port ([`crate::Port::release`]): the switch's own
    /// TAPs go too (an operator's explicit "remove everything").
    pub fn stop_and_release(&self) -> Result<(), SwitchError> {
        self.stop_with(true)
    }

    fn stop_with(&self, release: bool) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        let Some(thread) = control.thread.take() else {
            return Ok(());
        };
        let _ = control.tx.send(Command::Stop { release });
        self.pending.store(true, Ordering::Release);
        self.wake.signal();
        thread.join().map_err(|_| SwitchError::Stopped)
    }
}

impl Drop for SwitchHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
