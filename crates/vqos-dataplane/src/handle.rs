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
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use vqos_sched::{PolicySet, VifPolicy};

use crate::calib::CostSamples;
use crate::config::{PortSpec, Readiness, SwitchConfig};
use crate::control::{Answer, Op};
use crate::ecn::check_ecn_probabilities;
use crate::error::SwitchError;
use crate::ports::PortIo;
use crate::runner::{Command, Runner, WAKE_TOKEN};
use crate::shards::{Caller, Placement};
use crate::stats::SwitchStats;
use crate::switch::Switch;
use crate::sys::{allowed_cpus, pin_to_cpu, Epoll, EventFd};
use crate::tap::TapOrigin;

/// One forwarding thread as the handle reaches it.
struct Shard {
    /// Commands to its loop.
    tx: Sender<Command>,
    /// Reload flag: set when a command is queued, cleared by the loop.
    pending: Arc<AtomicBool>,
    /// Wakes the loop from epoll.
    wake: Arc<EventFd>,
    /// Its latest stats snapshot.
    stats: Arc<Mutex<Arc<SwitchStats>>>,
    /// The thread, until stopped.
    thread: Option<JoinHandle<()>>,
}

impl Shard {
    /// Queues `cmd` and wakes the loop; false if the loop is gone.
    fn send(&self, cmd: Command) -> bool {
        let sent = self.tx.send(cmd).is_ok();
        self.pending.store(true, Ordering::Release);
        self.wake.signal();
        sent
    }
}

/// Control state shared by handle calls (never touched by the loops).
struct Control {
    /// The forwarding threads, shard 0 (the uplink's) first.
    shards: Vec<Shard>,
    /// Where ports are read, and the policy set in force.
    placement: Placement,
    /// Set once stopped.
    stopped: bool,
}

/// Reaches the loops over their channels ([`Caller`]).
struct Channels<'a> {
    shards: &'a [Shard],
    stopped: bool,
    policies: Arc<PolicySet>,
}

impl Caller for Channels<'_> {
    fn call(&mut self, shard: usize, op: Op) -> Answer {
        let stopped = |policies: &Arc<PolicySet>| Answer {
            result: Err(SwitchError::Stopped),
            added: None,
            released: None,
            policies: policies.clone(),
            identity: None,
            given: None,
        };
        if self.stopped {
            return stopped(&self.policies);
        }
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        if !self.shards[shard].send(Command::Call {
            op,
            reply: reply_tx,
        }) {
            return stopped(&self.policies);
        }
        // Wait as long as it takes: the command is queued and will be applied, so giving up
        // would leave the handle's view and the loop's disagreeing. A loop that exits (stop,
        // panic) drops the command and its sender, which ends the wait.
        match reply_rx.recv() {
            Ok(answer) => {
                self.policies = answer.policies.clone();
                answer
            }
            Err(mpsc::RecvError) => stopped(&self.policies),
        }
    }

    fn post(&mut self, shard: usize, op: Op) {
        if !self.stopped {
            self.shards[shard].send(Command::Post(op));
        }
    }
}

impl Control {
    /// Runs `f` with the placement and a caller over the loops' channels.
    fn with<T>(&mut self, f: impl FnOnce(&mut Placement, &mut dyn Caller) -> T) -> T {
        let mut c = Channels {
            shards: &self.shards,
            stopped: self.stopped,
            policies: self.placement.policies.clone(),
        };
        f(&mut self.placement, &mut c)
    }
}

/// Controls a running switch; `Send + Sync`, share it behind an `Arc`. Dropping it stops the
/// switch.
pub struct SwitchHandle {
    /// Serialises control calls.
    control: Mutex<Control>,
    /// The uplink's name.
    uplink: String,
    /// Each shard's per-batch cost samples (written by its loop, read here).
    cost_samples: Vec<Arc<CostSamples>>,
    /// The loops' clock origin (their `time_ns` counts from here).
    origin: Instant,
    /// Forwarding threads.
    threads: usize,
    /// How the uplink's arrivals were steered at the start ([`Switch::uplink_steering`]).
    steering: Result<bool, String>,
}

/// The forwarding loops' liveness ([`SwitchHandle::loop_health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopHealth {
    /// No loop thread has exited (stopped, or died of a panic).
    pub running: bool,
    /// Nanoseconds since the loop that published least recently last did (each does every
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

/// Checks `threads` and `cpus` against the CPUs this process may use; the CPU of each thread.
fn placement(config: &SwitchConfig) -> Result<Vec<Option<usize>>, SwitchError> {
    let n = config.threads;
    if n == 0 {
        return Err(SwitchError::Threads("threads must be at least 1".into()));
    }
    let allowed = allowed_cpus()?;
    if n > allowed.len() {
        return Err(SwitchError::Threads(format!(
            "{n} threads but this process may use {} CPU(s) ({allowed:?})",
            allowed.len()
        )));
    }
    if config.custom_engine.is_some() && n > 1 {
        return Err(SwitchError::Threads(
            "a custom engine runs on one thread only".into(),
        ));
    }
    if config.cpus.is_empty() {
        return Ok(vec![None; n]);
    }
    if config.cpus.len() != n {
        return Err(SwitchError::Threads(format!(
            "{} cpus for {n} threads: give one CPU per thread",
            config.cpus.len()
        )));
    }
    for (i, c) in config.cpus.iter().enumerate() {
        if !allowed.contains(c) {
            return Err(SwitchError::Threads(format!(
                "CPU {c} does not exist or this process may not use it (allowed: {allowed:?})"
            )));
        }
        if config.cpus[..i].contains(c) {
            return Err(SwitchError::Threads(format!("CPU {c} is given twice")));
        }
    }
    Ok(config.cpus.iter().map(|&c| Some(c)).collect())
}

/// Starts the loop of `sw` on a thread of its own (pinned to `cpu`).
fn spawn(
    sw: Switch,
    readiness: Readiness,
    origin: Instant,
    cpu: Option<usize>,
) -> Result<Shard, SwitchError> {
    let index = sw.shard_index();
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
    let mut sw = sw;
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
    let (pinned_tx, pinned_rx) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name(format!("vqos-loop{index}"))
        .spawn(move || {
            let pinned = cpu.map_or(Ok(()), pin_to_cpu);
            let ok = pinned.is_ok();
            let _ = pinned_tx.send(pinned);
            if ok {
                runner.run();
            }
        })
        .map_err(SwitchError::Spawn)?;
    match pinned_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(SwitchError::Threads(format!(
                "cannot pin thread {index} to CPU {}: {e}",
                cpu.unwrap_or_default()
            )));
        }
        Err(_) => return Err(SwitchError::Stopped),
    }
    Ok(Shard {
        tx,
        pending,
        wake,
        stats,
        thread: Some(thread),
    })
}

impl SwitchHandle {
    /// Opens the uplink, builds the engine and starts the loop threads (`config.threads`,
    /// pinned to `config.cpus`; shard 0 reads the uplink).
    pub fn start(config: SwitchConfig) -> Result<SwitchHandle, SwitchError> {
        let cpus = placement(&config)?;
        let readiness = config.readiness;
        let origin = Instant::now();
        let switches = crate::shards::build(config, cpus.len(), 0)?;
        let uplink = switches[0].uplink_name().to_string();
        let steering = switches[0]
            .uplink_steering()
            .map(|s| s.is_some())
            .map_err(str::to_string);
        let policies = switches[0].policies().clone();
        let cost_samples: Vec<Arc<CostSamples>> =
            switches.iter().map(|s| s.cost_samples().clone()).collect();
        let mut shards = Vec::new();
        for (sw, cpu) in switches.into_iter().zip(cpus) {
            match spawn(sw, readiness, origin, cpu) {
                Ok(s) => shards.push(s),
                Err(e) => {
                    stop_all(&mut shards, false);
                    return Err(e);
                }
            }
        }
        let threads = shards.len();
        Ok(SwitchHandle {
            control: Mutex::new(Control {
                placement: Placement::new(shards.len(), policies),
                shards,
                stopped: false,
            }),
            uplink,
            cost_samples,
            origin,
            threads,
            steering,
        })
    }

    /// Whether what the network sends is steered to its vifs' uplink queues
    /// ([`crate::tap_steer`]): `Ok(false)` by the kernel's flow hash (one queue, or not a
    /// TAP), `Err` why a multiqueue TAP could not be steered.
    pub fn uplink_steered(&self) -> Result<bool, &str> {
        self.steering.as_ref().map(|&b| b).map_err(String::as_str)
    }

    /// The uplink's name.
    pub fn uplink_name(&self) -> &str {
        &self.uplink
    }

    /// Forwarding threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Adds a vif port with its policy. The new policy set is validated before the port is
    /// opened (a refused change creates no TAP); the loops validate it again.
    pub fn add_port(&self, spec: PortSpec, policy: VifPolicy) -> Result<(), SwitchError> {
        self.add_port_reporting(spec, policy).map(drop)
    }

    /// [`SwitchHandle::add_port`], telling for a TAP whether it was created, re-attached or
    /// attached (`None` for other ports).
    ///
    /// The port is read by the shard its spec names ([`PortSpec::with_thread`]; a thread the
    /// switch does not have is refused before anything opens), else by the shard with the
    /// fewest ports. Every other shard adds it first
    /// (to send to), then its own shard (which pins its addresses and starts reading it), so
    /// no shard can learn of it before it can send to it.
    pub fn add_port_reporting(
        &self,
        spec: PortSpec,
        policy: VifPolicy,
    ) -> Result<Option<TapOrigin>, SwitchError> {
        let mut control = lock(&self.control);
        control
            .placement
            .check_new(&spec.name, &self.uplink, &policy)?;
        if control.stopped {
            return Err(SwitchError::Stopped);
        }
        let home = spec.thread;
        if let Some(t) = home.filter(|&t| t >= self.threads) {
            return Err(SwitchError::Threads(format!(
                "port '{}': thread {t} does not exist (threads 0..={})",
                spec.name,
                self.threads - 1
            )));
        }
        let (port, macs, origin) = spec.open()?;
        let io = PortIo::new(port);
        // On refusal the shards' holds come back in their answers and are dropped there: this
        // one is the last, so the port closes here, off the loops.
        control.with(|p, c| p.add(c, io, macs, policy, home))?;
        Ok(origin)
    }

    /// Removes vif port `name`; other ports keep forwarding. A TAP the switch created vanishes.
    pub fn remove_port(&self, name: &str) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        if name == self.uplink {
            return Err(SwitchError::Uplink(name.to_string()));
        }
        let last = control.with(|p, c| p.remove(c, name))?;
        drop(control);
        if let Some(mut port) = last.and_then(PortIo::into_port) {
            // Removed for good: a persistent TAP the switch made goes too.
            port.release();
        }
        Ok(())
    }

    /// Hands vif `src`'s identity (policy, port security with its locks, addresses, and at
    /// `src`'s removal its counters) over to vif `dst`, for a guest live-migrating between
    /// them: `dst` co-owns `src`'s addresses until its first frame from one of them, so no
    /// other port can claim them at any moment. See `crate::migrate` (docs/vhost-user.md,
    /// "Live migration"). On refusal nothing changed.
    pub fn migrate_port(&self, src: &str, dst: &str) -> Result<(), SwitchError> {
        lock(&self.control).with(|p, c| p.migrate(c, (src, dst), &self.uplink))
    }

    /// Replaces the whole policy set (capacity, cost model, every vif's policy). It must name
    /// exactly the vif ports; it is validated, then each engine is reconfigured between
    /// batches.
    pub fn set_policies(&self, policies: PolicySet) -> Result<(), SwitchError> {
        lock(&self.control).with(|p, c| p.set_policies(c, policies))
    }

    /// Replaces one vif's policy (validated against the others). The read-modify-write happens
    /// on the loops, so concurrent calls (on different vifs) never undo each other.
    pub fn set_policy(&self, name: &str, policy: VifPolicy) -> Result<(), SwitchError> {
        lock(&self.control).with(|p, c| p.set_policy(c, name, policy))
    }

    /// The policy set in force.
    pub fn policies(&self) -> PolicySet {
        (*lock(&self.control).placement.policies).clone()
    }

    /// Sets the probability of marking ECN CE on each named vif's data (the PID-ECN
    /// controller's output; vifs not named get 0): ECT frames from the uplink to the vif and
    /// ECT frames the vif sends to the uplink. Checked against the vifs in force under the
    /// same lock that orders it with port changes, applied between batches by name; new ports
    /// start at 0. An unknown vif or a probability outside 0..=1 refuses the call.
    pub fn set_ecn_probabilities(
        &self,
        probabilities: Vec<(String, f64)>,
    ) -> Result<(), SwitchError> {
        let control = lock(&self.control);
        check_ecn_probabilities(&control.placement.policies, &probabilities)?;
        if control.stopped {
            return Err(SwitchError::Stopped);
        }
        for shard in &control.shards {
            let op = Op::SetEcn {
                probabilities: probabilities.clone(),
            };
            if !shard.send(Command::Post(op)) {
                return Err(SwitchError::Stopped);
            }
        }
        Ok(())
    }

    /// Every shard's last vif batches' frames, bytes and cycles ([`CostSamples`]), read
    /// without waiting for the loops.
    pub fn cost_samples(&self) -> ShardSamples<'_> {
        ShardSamples(&self.cost_samples)
    }

    /// The latest stats: every shard's last snapshot (each publishes every
    /// `stats_interval_ns`, and before it answers a control call that changed something),
    /// merged ([`crate::stats::merge`]). So once a call such as
    /// [`SwitchHandle::add_port`] returns, the stats show its change.
    pub fn stats(&self) -> Arc<SwitchStats> {
        let control = lock(&self.control);
        let snaps: Vec<Arc<SwitchStats>> = control
            .shards
            .iter()
            .map(|s| lock(&s.stats).clone())
            .collect();
        drop(control);
        match snaps.len() {
            1 => snaps
                .into_iter()
                .next()
                .unwrap_or_else(|| Arc::new(crate::stats::merge(&[]))),
            _ => Arc::new(crate::stats::merge(&snaps)),
        }
    }

    /// Whether the forwarding loops live and how recently the stalest published: the
    /// daemon's health check and watchdog read this (a loop that panicked, or one stuck in a
    /// call, stops publishing stats every `stats_interval_ns`).
    pub fn loop_health(&self) -> LoopHealth {
        let running = {
            let control = lock(&self.control);
            !control.stopped
                && control
                    .shards
                    .iter()
                    .all(|s| s.thread.as_ref().is_some_and(|t| !t.is_finished()))
        };
        let now_ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        LoopHealth {
            running,
            // No snapshot yet: as old as the switch.
            stats_age_ns: now_ns.saturating_sub(self.stats().time_ns.unwrap_or(0)),
        }
    }

    /// Stops the loops and closes every port; TAPs the switch owns persistently
    /// ([`crate::TapMode::Own`]) stay for the next run. Idempotent.
    pub fn stop(&self) -> Result<(), SwitchError> {
        self.stop_with(false)
    }

    /// Stops the loops and releases every port ([`crate::Port::release`]): the switch's own
    /// TAPs go too (an operator's explicit "remove everything").
    pub fn stop_with_release(&self) -> Result<(), SwitchError> {
        self.stop_with(true)
    }

    /// Same as [`SwitchHandle::stop_with_release`].
    pub fn stop_and_release(&self) -> Result<(), SwitchError> {
        self.stop_with(true)
    }

    fn stop_with(&self, release: bool) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        if control.stopped {
            return Ok(());
        }
        control.stopped = true;
        if stop_all(&mut control.shards, release) {
            Ok(())
        } else {
            Err(SwitchError::Stopped)
        }
    }
}

/// Stops every loop (each releasing its own ports first with `release`) and joins them; false
/// if one had died of a panic.
fn stop_all(shards: &mut [Shard], release: bool) -> bool {
    for s in shards.iter() {
        s.send(Command::Stop { release });
    }
    let mut clean = true;
    for s in shards.iter_mut() {
        if let Some(t) = s.thread.take() {
            clean &= t.join().is_ok();
        }
    }
    clean
}

impl Drop for SwitchHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The cost samples of every shard of a switch ([`SwitchHandle::cost_samples`]): each shard
/// records into a ring of its own (one writer, no shared cache line on the hot path), read
/// together here.
#[derive(Debug, Clone, Copy)]
pub struct ShardSamples<'a>(&'a [Arc<CostSamples>]);

impl ShardSamples<'_> {
    /// Every shard's samples ([`CostSamples::snapshot`]), shard 0's first.
    pub fn snapshot(&self) -> Vec<vqos_sched::calibrate::Sample> {
        self.0.iter().flat_map(|s| s.snapshot()).collect()
    }

    /// Batches recorded since the switch started, all shards.
    pub fn recorded(&self) -> u64 {
        self.0.iter().map(|s| s.recorded()).sum()
    }

    /// Batches not recorded because they did not fit the packing, all shards.
    pub fn skipped(&self) -> u64 {
        self.0.iter().map(|s| s.skipped()).sum()
    }
}
