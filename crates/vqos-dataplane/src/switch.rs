//! The switch: a [`SwitchHandle`] for control and the poll loop thread it starts.
//!
//! ## Behavior
//! One thread owns every port, the MAC table, the engine and the counters. Per iteration it
//! (1) applies pending control commands (between batches only), (2) ticks the engine when due,
//! (3) serves one batch from the uplink if it has frames, (4) if the uplink capacity bucket has
//! tokens, asks the engine which ready vif to serve and reads at most the granted number of
//! frames from that vif only, asking `admit` per frame and `charge`-ing the batch afterwards,
//! (5) publishes stats every `stats_interval_ns`, and (6) waits (epoll) or spins (busy polling)
//! when there was nothing to do. A port's ready flag is cleared by a short read and set again by
//! readiness (epoll events, or every port in busy polling), collected when the loop waits and,
//! while it stays busy, every 50 µs (`BUSY_HARVEST_INTERVAL_NS`): a port drained once is read
//! again even while other ports keep the loop busy.
//!
//! Control calls on the handle are synchronous: they validate, send an immutable snapshot to the
//! loop and return once the loop applied it (or refused it, in which case nothing changed).
//! They wait as long as the loop takes (no timeout: a queued command is always applied, so the
//! handle never gives up on an answer). A port the loop lets go of (removed, refused on add) is
//! handed back with the answer and closed on the calling thread, not on the loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;
use vqos_sched::{
    CostModel, Engine, EngineKind, Grant, PolicyError, PolicySet, ReadySet, Usage, Verdict, VifId,
    VifPolicy, VifSpec,
};

use crate::bucket::TokenBucket;
use crate::frame::{self, is_group, mac_key, FrameError, MacKey, VNET_HDR_LEN};
use crate::l2::MacTable;
use crate::port::{Batch, Port, PortError, BATCH_FRAMES};
use crate::stats::{DropCounters, LoopStats, PortRole, PortStats, SwitchStats};
use crate::sys::{cycles, Epoll, EventFd, SysError, CYCLES_UNIT};
use crate::tap::{TapMode, TapPort};

/// Epoll token of the loop's wake-up eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// Samples kept per port for the rate window (window = (samples − 1) × stats interval).
const RATE_SAMPLES: usize = 5;
/// Burst absorbed by the capacity and per-vif buckets, in time at their rate (4 ms).
const BUCKET_WINDOW_NS: u64 = 4_000_000;
/// In epoll mode, how often ports without a readiness descriptor are polled, ns.
const POLL_ONLY_INTERVAL_NS: u64 = 1_000_000;
/// Smallest bucket depth: two 64 KiB super-frames.
const BUCKET_MIN_DEPTH_BYTES: u64 = 2 * 65_536;
/// While every iteration has work, readiness is collected (without waiting) this often, ns.
/// Without it a port whose short read cleared its flag was not read again for as long as any
/// other port stayed backlogged (C2QoS Fig. 6(e) under `tcm`: VM1 starved for seconds behind
/// three 64-byte floods with a slow uplink). At most 20 000 non-blocking `epoll_wait`s a
/// second, and a drained port waits at most this long before it is a candidate again.
const BUSY_HARVEST_INTERVAL_NS: u64 = 50_000;

/// Why a switch operation failed.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// A port could not be opened.
    #[error("Cannot open port '{name}'")]
    Port {
        /// The port's name.
        name: String,
        /// What failed.
        #[source]
        source: PortError,
    },
    /// The policy (set) was refused; nothing changed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A port of that name exists.
    #[error("Port '{0}' already exists")]
    DuplicatePort(String),
    /// No port of that name.
    #[error("Unknown port '{0}'")]
    UnknownPort(String),
    /// A policy set must name every vif port.
    #[error("Vif '{0}' has no policy in the new set")]
    MissingVif(String),
    /// The uplink cannot be removed or given a vif policy.
    #[error("The uplink '{0}' cannot be changed this way")]
    Uplink(String),
    /// ECN probabilities must be one per vif, each in 0..=1.
    #[error("Expected {expected} ECN probabilities in 0..=1, got {got:?}")]
    BadEcnProbabilities {
        /// Number of vifs.
        expected: usize,
        /// What was given.
        got: Vec<f64>,
    },
    /// A system call needed by the loop failed.
    #[error("Loop setup failed")]
    Sys(#[from] SysError),
    /// The loop thread could not be started.
    #[error("Cannot start the loop thread")]
    Spawn(#[source] std::io::Error),
    /// The loop is not running (stopped or crashed).
    #[error("The switch is stopped")]
    Stopped,
}

/// How the loop learns that ports have frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Readiness {
    /// Edge-triggered epoll on the ports' descriptors; the loop sleeps when idle.
    #[default]
    Epoll,
    /// Poll every port every idle iteration; the loop never sleeps (one core at 100 %).
    BusyPoll,
}

/// Where a port's frames come from.
pub enum PortBackend {
    /// Create a TAP of the spec's name (owned by the switch, removed with the port).
    TapCreate,
    /// Attach to the existing persistent TAP of the spec's name.
    TapAttach,
    /// A ready-made port (in-memory, fault-injecting, ...).
    Custom(Box<dyn Port>),
}

impl std::fmt::Debug for PortBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortBackend::TapCreate => f.write_str("TapCreate"),
            PortBackend::TapAttach => f.write_str("TapAttach"),
            PortBackend::Custom(p) => write!(f, "Custom({})", p.name()),
        }
    }
}

/// A port opened from a spec, with its allow-list.
type OpenedPort = (Box<dyn Port>, Option<Vec<MacKey>>);

/// A port to add.
#[derive(Debug)]
pub struct PortSpec {
    /// Port name (interface name for TAPs; must be unique in the switch).
    pub name: String,
    /// Where its frames come from.
    pub backend: PortBackend,
    /// Source MACs the port may send from; `None` = any (frames from others count `spoofed`).
    pub allowed_macs: Option<Vec<MacKey>>,
}

impl PortSpec {
    /// A TAP the switch creates.
    pub fn tap(name: &str) -> Self {
        PortSpec {
            name: name.to_string(),
            backend: PortBackend::TapCreate,
            allowed_macs: None,
        }
    }

    /// An existing persistent TAP.
    pub fn tap_attach(name: &str) -> Self {
        PortSpec {
            name: name.to_string(),
            backend: PortBackend::TapAttach,
            allowed_macs: None,
        }
    }

    /// A ready-made port, named after it.
    pub fn custom(port: Box<dyn Port>) -> Self {
        PortSpec {
            name: port.name().to_string(),
            backend: PortBackend::Custom(port),
            allowed_macs: None,
        }
    }

    /// Restricts the source MACs the port may use.
    pub fn with_allowed_macs(mut self, macs: Vec<MacKey>) -> Self {
        self.allowed_macs = Some(macs);
        self
    }

    fn open(self) -> Result<OpenedPort, SwitchError> {
        let name = self.name;
        let wrap = |source| SwitchError::Port {
            name: name.clone(),
            source,
        };
        let port: Box<dyn Port> = match self.backend {
            PortBackend::TapCreate => {
                Box::new(TapPort::open(&name, TapMode::Create).map_err(wrap)?)
            }
            PortBackend::TapAttach => {
                Box::new(TapPort::open(&name, TapMode::Attach).map_err(wrap)?)
            }
            PortBackend::Custom(p) => p,
        };
        Ok((port, self.allowed_macs))
    }
}

/// How to start a switch.
pub struct SwitchConfig {
    /// The uplink port.
    pub uplink: PortSpec,
    /// The scheduling engine.
    pub engine: EngineKind,
    /// Uplink capacity, bits per second; `None` = unlimited.
    pub capacity_bps: Option<u64>,
    /// What vifs are charged in (bytes or measured cycles).
    pub cost: CostModel,
    /// Cycles per second of the forwarding core, for the cycles cost model (rdtsc units).
    pub cycles_per_sec: u64,
    /// Epoll (default) or busy polling.
    pub readiness: Readiness,
    /// MAC table entries age out after this, ns (default 300 s).
    pub mac_age_ns: u64,
    /// Most learnt MAC addresses (default 4096).
    pub mac_capacity: usize,
    /// Most MAC addresses learnt on one vif port (default 64); the uplink may hold half of
    /// `mac_capacity`. Addresses beyond are not learnt (`mac_learn_refused`) and frames to them
    /// are flooded, so one tenant cannot push everyone's unicast into flooding.
    pub mac_capacity_per_vif: usize,
    /// Stats are published this often, ns (default 25 ms; at most 50 ms is sensible).
    pub stats_interval_ns: u64,
    /// Enforce each vif's maximum on the uplink→vif direction too (default true).
    pub downlink_max: bool,
    /// An engine to use instead of building `engine` (tests, experiments); it is configured
    /// with the initial policy set on start.
    pub custom_engine: Option<Box<dyn Engine>>,
    /// A least cost per forwarded vif frame, for experiments (default none); see
    /// [`EmulatedWork`].
    pub emulated_work: Option<EmulatedWork>,
}

/// A least cost per frame read from a vif, emulating a heavier datapath (tunnelling,
/// firewalling, a slower core) on a machine whose real forwarding cost is too small for an
/// experiment: the lab's 2-core machine cannot generate enough 64-byte frames to load a real
/// core, so the C2QoS experiment gives each frame the cost of its scenario's cycle model.
///
/// After forwarding a vif's batch the loop spins on the cycle counter until the batch has
/// taken at least `per_frame_cycles × frames + per_byte_cycles × bytes` since it began
/// (frames read, on-wire bytes admitted). A batch whose real work took longer is not
/// slowed further, so the model is a floor on the cost and the simulator, which charges the
/// model alone, predicts the same capacity. The spin is inside the span the loop measures for
/// the cycle cost model, so the engine charges it as it would real work. The spin yields the
/// CPU to anything runnable on the core (kernel work such as the TAP deliveries the loop set
/// off), which then runs inside the emulated time. Only the vif→uplink direction, the one the
/// engine schedules, is slowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedWork {
    /// Cycles (counter units: TSC on x86_64) per frame read.
    pub per_frame_cycles: u64,
    /// Cycles per on-wire byte forwarded.
    pub per_byte_cycles: f64,
    /// Most frames per vif batch while emulating (0: the engine's grant, at most
    /// [`BATCH_FRAMES`]). A core slowed down a hundredfold that kept its batches of 32 frames
    /// would hold every other vif, a latency-sensitive one too, a hundred times longer behind
    /// a batch in progress; smaller batches keep a batch as short, relative to the traffic's
    /// round trips, as on the core being emulated.
    pub batch_frames: usize,
}

impl EmulatedWork {
    /// Counter cycles a batch of `frames` frames carrying `bytes` on-wire bytes takes at least.
    pub fn cycles(&self, frames: u64, bytes: u64) -> u64 {
        self.per_frame_cycles
            .saturating_mul(frames)
            .saturating_add((self.per_byte_cycles * bytes as f64) as u64)
    }
}

impl std::fmt::Debug for SwitchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchConfig")
            .field("uplink", &self.uplink)
            .field("engine", &self.engine)
            .field("capacity_bps", &self.capacity_bps)
            .field("cost", &self.cost)
            .field("readiness", &self.readiness)
            .field("emulated_work", &self.emulated_work)
            .field(
                "custom_engine",
                &self.custom_engine.as_ref().map(|e| e.kind()),
            )
            .finish_non_exhaustive()
    }
}

impl SwitchConfig {
    /// Defaults around `uplink`: engine `rr`, unlimited capacity, epoll.
    pub fn new(uplink: PortSpec) -> Self {
        SwitchConfig {
            uplink,
            engine: EngineKind::Rr,
            capacity_bps: None,
            cost: CostModel::Bytes,
            cycles_per_sec: 2_000_000_000,
            readiness: Readiness::Epoll,
            mac_age_ns: 300_000_000_000,
            mac_capacity: 4096,
            mac_capacity_per_vif: 64,
            stats_interval_ns: 25_000_000,
            downlink_max: true,
            custom_engine: None,
            emulated_work: None,
        }
    }
}

/// The loop's answer to a control command, with a port it let go of (removed, or refused on
/// add): the control thread drops it, because closing a TAP can take tens to hundreds of
/// milliseconds (RTNL) that the loop must not stall for.
type Reply = (Result<(), SwitchError>, Option<Box<dyn Port>>);

/// A command from the handle to the loop.
enum Command {
    AddPort {
        port: Box<dyn Port>,
        allowed: Option<Vec<MacKey>>,
        policies: Arc<PolicySet>,
        reply: SyncSender<Reply>,
    },
    RemovePort {
        name: String,
        policies: Arc<PolicySet>,
        reply: SyncSender<Reply>,
    },
    SetPolicies {
        policies: Arc<PolicySet>,
        reply: SyncSender<Reply>,
    },
    SetEcn {
        probabilities: Vec<f64>,
    },
    Stop,
}

/// Control state shared by handle calls (never touched by the loop).
struct Control {
    /// The policy set the loop runs with.
    policies: PolicySet,
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
        let mut policies = PolicySet::new(config.capacity_bps);
        policies.cost = config.cost;
        policies.cycles_per_sec = config.cycles_per_sec;
        policies.validate()?;
        let (engine, engine_kind) = match config.custom_engine {
            Some(mut e) => {
                e.configure(&policies, 0)?;
                let kind = e.kind();
                (e, kind)
            }
            None => (
                vqos_sched::build(config.engine, &policies, 0)?,
                config.engine,
            ),
        };
        let uplink_name = config.uplink.name.clone();
        let (uplink, _) = config.uplink.open()?;
        let wake = Arc::new(EventFd::new()?);
        let pending = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let epoll = match config.readiness {
            Readiness::Epoll => {
                let e = Epoll::new(64)?;
                e.add(wake.raw(), WAKE_TOKEN, false)?;
                Some(e)
            }
            Readiness::BusyPoll => None,
        };
        let stats = Arc::new(Mutex::new(Arc::new(SwitchStats {
            time_ns: 0,
            policy_epoch: 0,
            engine: engine_kind,
            capacity_bps: config.capacity_bps,
            mac_entries: 0,
            ports: Vec::new(),
            loop_stats: LoopStats {
                cycles_unit: CYCLES_UNIT,
                ..Default::default()
            },
        })));
        let mut lp = Loop {
            slots: Vec::new(),
            vif_slots: Vec::new(),
            out: Vec::new(),
            touched: Vec::with_capacity(64),
            engine,
            engine_kind,
            policies: Arc::new(policies.clone()),
            policy_epoch: 0,
            ready: ReadySet::new(0),
            macs: {
                let mut t = MacTable::new(
                    config.mac_capacity,
                    config.mac_capacity_per_vif,
                    config.mac_age_ns,
                );
                t.set_port_capacity(0, config.mac_capacity / 2);
                t
            },
            batch: Batch::new(),
            wire_bytes: [0; BATCH_FRAMES],
            uplink_bucket: None,
            epoll,
            stats_interval_ns: config.stats_interval_ns.max(1_000_000),
            downlink_max: config.downlink_max,
            emulated_work: config.emulated_work,
            commands: rx,
            pending: pending.clone(),
            wake: wake.clone(),
            stats_out: stats.clone(),
            origin: Instant::now(),
            counters: LoopStats {
                cycles_unit: CYCLES_UNIT,
                ..Default::default()
            },
            rng: 0x9e37_79b9_7f4a_7c15,
            next_stats_ns: 0,
            next_age_ns: 1_000_000_000,
            next_harvest_ns: 0,
        };
        let origin = lp.origin;
        lp.insert_slot(uplink, None, PortRole::Uplink)
            .map_err(|(e, _)| e)?;
        lp.apply_policies(Arc::new(policies.clone()), 0)?;
        let thread = std::thread::Builder::new()
            .name("vqos-loop".into())
            .spawn(move || lp.run())
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
            uplink: uplink_name,
            origin,
        })
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

    fn call(
        &self,
        control: &Control,
        make: impl FnOnce(SyncSender<Reply>) -> Command,
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
            Ok((r, port)) => {
                drop(port);
                r
            }
            Err(mpsc::RecvError) => Err(SwitchError::Stopped),
        }
    }

    /// The uplink's name.
    pub fn uplink_name(&self) -> &str {
        &self.uplink
    }

    /// Adds a vif port with its policy. The whole new policy set is validated first; on error
    /// nothing changes (a TAP created for it is removed again).
    pub fn add_port(&self, spec: PortSpec, policy: VifPolicy) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        if spec.name == self.uplink || control.policies.id(&spec.name).is_ok() {
            return Err(SwitchError::DuplicatePort(spec.name));
        }
        let mut next = control.policies.clone();
        next.vifs.push(VifSpec {
            name: spec.name.clone(),
            policy,
        });
        next.validate()?;
        let (port, allowed) = spec.open()?;
        let next = Arc::new(next);
        let policies = next.clone();
        self.call(&control, |reply| Command::AddPort {
            port,
            allowed,
            policies,
            reply,
        })?;
        control.policies = (*next).clone();
        Ok(())
    }

    /// Removes vif port `name`; other ports keep forwarding. A TAP the switch created vanishes.
    pub fn remove_port(&self, name: &str) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        if name == self.uplink {
            return Err(SwitchError::Uplink(name.to_string()));
        }
        let id = control
            .policies
            .id(name)
            .map_err(|_| SwitchError::UnknownPort(name.to_string()))?;
        let mut next = control.policies.clone();
        next.vifs.remove(id);
        let next = Arc::new(next);
        let policies = next.clone();
        self.call(&control, |reply| Command::RemovePort {
            name: name.to_string(),
            policies,
            reply,
        })?;
        control.policies = (*next).clone();
        Ok(())
    }

    /// Replaces the whole policy set (capacity, cost model, every vif's policy). It must name
    /// exactly the vif ports; it is validated, then the engine is reconfigured between batches.
    pub fn set_policies(&self, policies: PolicySet) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        self.set_policies_locked(&mut control, policies)
    }

    /// [`SwitchHandle::set_policies`] with the control lock held by the caller.
    fn set_policies_locked(
        &self,
        control: &mut Control,
        policies: PolicySet,
    ) -> Result<(), SwitchError> {
        policies.validate()?;
        for v in &policies.vifs {
            if v.name == self.uplink {
                return Err(SwitchError::Uplink(v.name.clone()));
            }
            control.policies.id(&v.name)?;
        }
        for v in &control.policies.vifs {
            if policies.id(&v.name).is_err() {
                return Err(SwitchError::MissingVif(v.name.clone()));
            }
        }
        let next = Arc::new(policies);
        let snapshot = next.clone();
        self.call(control, |reply| Command::SetPolicies {
            policies: snapshot,
            reply,
        })?;
        control.policies = (*next).clone();
        Ok(())
    }

    /// Replaces one vif's policy (validated against the others).
    /// The read-modify-write happens under the control lock, so concurrent calls (on
    /// different vifs) never undo each other.
    pub fn set_policy(&self, name: &str, policy: VifPolicy) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        let next = control.policies.with_policy(name, policy)?;
        self.set_policies_locked(&mut control, next)
    }

    /// The policy set in force.
    pub fn policies(&self) -> PolicySet {
        lock(&self.control).policies.clone()
    }

    /// Sets the probability of marking ECN CE on frames from the uplink to each vif (the
    /// PID-ECN controller's output), one per vif in the order of [`SwitchHandle::policies`].
    /// Applied between batches; new ports start at 0.
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

    /// The latest stats snapshot (published by the loop every `stats_interval_ns`).
    pub fn stats(&self) -> Arc<SwitchStats> {
        lock(&self.stats).clone()
    }

    /// Stops the loop and closes every port. Idempotent.
    pub fn stop(&self) -> Result<(), SwitchError> {
        let mut control = lock(&self.control);
        let Some(thread) = control.thread.take() else {
            return Ok(());
        };
        let _ = control.tx.send(Command::Stop);
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

/// Counters the loop keeps per port.
#[derive(Debug, Default, Clone, Copy)]
struct PortCounters {
    /// Frames read.
    rx_frames: u64,
    /// Ethernet bytes read.
    rx_bytes: u64,
    /// Frames written.
    tx_frames: u64,
    /// Ethernet bytes written.
    tx_bytes: u64,
    /// Drops by reason.
    drops: DropCounters,
    /// Frames marked CE.
    ecn_marked: u64,
    /// Reads that failed.
    rx_errors: u64,
    /// Source addresses not learnt (port or table full).
    mac_learn_refused: u64,
    /// Frames chosen for CE marking that were not ECN-capable (left unmarked).
    ecn_not_ect: u64,
}

/// One port as the loop holds it.
struct Slot {
    /// The port.
    port: Box<dyn Port>,
    /// Its name (copied once, for stats and lookups).
    name: String,
    /// Uplink or vif.
    role: PortRole,
    /// Vif id in the current policy set.
    vif: Option<VifId>,
    /// The vif's policy.
    policy: Option<VifPolicy>,
    /// Frames may be waiting (set by epoll or busy polling, cleared by a short read).
    ready: bool,
    /// The last read failed: retried at the next stats publication (frames may still wait,
    /// and an edge-triggered descriptor will not fire for them again).
    rx_failed: bool,
    /// Readiness descriptor registered with epoll.
    fd: Option<std::os::fd::RawFd>,
    /// Allowed source MACs, sorted (binary search per frame).
    allowed: Option<Vec<MacKey>>,
    /// Counters.
    c: PortCounters,
    /// The vif's maximum enforced on uplink→vif frames.
    down_bucket: Option<TokenBucket>,
    /// CE marking probability on uplink→vif frames, scaled to 2^32 (2^32 = always).
    ecn_threshold: u64,
    /// Moving average of frame size read from this port, bytes (to size capacity-limited
    /// batches).
    avg_frame_bytes: u64,
    /// Recent (time ns, rx bytes, tx bytes) samples for rates.
    rate_hist: [(u64, u64, u64); RATE_SAMPLES],
    /// Next sample to overwrite.
    rate_pos: usize,
}

/// The poll loop's state; lives on the loop thread.
struct Loop {
    /// Ports by slot; slot 0 is the uplink; removed ports leave `None`.
    slots: Vec<Option<Slot>>,
    /// Vif id → slot.
    vif_slots: Vec<usize>,
    /// Per slot: indices into `batch` to send there (preallocated, ≤ BATCH_FRAMES).
    out: Vec<Vec<u8>>,
    /// Slots with a non-empty `out` list in the current batch.
    touched: Vec<usize>,
    /// The scheduling engine.
    engine: Box<dyn Engine>,
    /// Which engine.
    engine_kind: EngineKind,
    /// The snapshot in force.
    policies: Arc<PolicySet>,
    /// Snapshots applied.
    policy_epoch: u64,
    /// Vifs with frames waiting.
    ready: ReadySet,
    /// MAC learning table.
    macs: MacTable,
    /// Receive buffers.
    batch: Batch,
    /// Per frame of `batch`: the bytes it puts on the wire (set once validated).
    wire_bytes: [u64; BATCH_FRAMES],
    /// Uplink capacity (vif→uplink bytes).
    uplink_bucket: Option<TokenBucket>,
    /// Epoll instance, in epoll mode.
    epoll: Option<Epoll>,
    /// Stats publication period, ns.
    stats_interval_ns: u64,
    /// Enforce vif maximums on the downlink.
    downlink_max: bool,
    /// Extra work per vif frame (experiments).
    emulated_work: Option<EmulatedWork>,
    /// Control commands.
    commands: Receiver<Command>,
    /// Reload flag.
    pending: Arc<AtomicBool>,
    /// Wake-up eventfd.
    wake: Arc<EventFd>,
    /// Where stats are published.
    stats_out: Arc<Mutex<Arc<SwitchStats>>>,
    /// Clock origin (loop time 0).
    origin: Instant,
    /// Loop counters.
    counters: LoopStats,
    /// xorshift64 state for ECN marking decisions.
    rng: u64,
    /// When stats are next published, ns.
    next_stats_ns: u64,
    /// When the MAC table is next swept, ns.
    next_age_ns: u64,
    /// When readiness is next collected while the loop stays busy, ns.
    next_harvest_ns: u64,
}

impl Loop {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn insert_slot(
        &mut self,
        port: Box<dyn Port>,
        allowed: Option<Vec<MacKey>>,
        role: PortRole,
    ) -> Result<usize, (SwitchError, Box<dyn Port>)> {
        let idx = match role {
            PortRole::Uplink => 0,
            PortRole::Vif => self
                .slots
                .iter()
                .skip(1)
                .position(Option::is_none)
                .map_or(self.slots.len(), |p| p + 1),
        };
        let fd = port.readiness_fd();
        if let (Some(ep), Some(fd)) = (&self.epoll, fd) {
            if let Err(e) = ep.add(fd, idx as u64, true) {
                return Err((e.into(), port));
            }
        }
        let slot = Slot {
            name: port.name().to_string(),
            port,
            role,
            vif: None,
            policy: None,
            // A new port may already hold frames: the edge may have passed before we watched.
            ready: true,
            rx_failed: false,
            fd,
            // Sorted once, searched per frame.
            allowed: allowed.map(|mut a| {
                a.sort_unstable();
                a.dedup();
                a
            }),
            c: PortCounters::default(),
            down_bucket: None,
            ecn_threshold: 0,
            // Start pessimistic (a super-frame) so that the first capacity-limited read is small.
            avg_frame_bytes: 65_536,
            rate_hist: [(0, 0, 0); RATE_SAMPLES],
            rate_pos: 0,
        };
        if idx == self.slots.len() {
            self.slots.push(Some(slot));
            self.out.push(Vec::with_capacity(BATCH_FRAMES));
        } else {
            self.slots[idx] = Some(slot);
        }
        if self.touched.capacity() < self.slots.len() {
            self.touched.reserve(self.slots.len());
        }
        Ok(idx)
    }

    /// Empties slot `idx` and returns its port, for the control thread to drop.
    fn remove_slot(&mut self, idx: usize) -> Option<Box<dyn Port>> {
        let slot = self.slots[idx].take()?;
        if let (Some(ep), Some(fd)) = (&self.epoll, slot.fd) {
            ep.remove(fd);
        }
        self.macs.purge_slot(idx as u16);
        Some(slot.port)
    }

    fn slot_by_name(&self, name: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.name == name))
    }

    /// The vif slot of every vif of `policies`, by vif id; an error if a vif names no vif
    /// slot or a vif slot is not named (the handle checks this too; the loop does not trust
    /// it, since a wrong mapping would serve one tenant's port under another's policy).
    /// Slot `removed`, if any, counts as gone already.
    fn resolve_vifs(
        &self,
        policies: &PolicySet,
        removed: Option<usize>,
    ) -> Result<Vec<usize>, SwitchError> {
        let mut slots = Vec::with_capacity(policies.len());
        for spec in &policies.vifs {
            match self.slot_by_name(&spec.name) {
                Some(idx) if idx != 0 && Some(idx) != removed && !slots.contains(&idx) => {
                    slots.push(idx)
                }
                Some(0) => return Err(SwitchError::Uplink(spec.name.clone())),
                _ => return Err(SwitchError::UnknownPort(spec.name.clone())),
            }
        }
        for (idx, s) in self.slots.iter().enumerate().skip(1) {
            if let Some(s) = s {
                if Some(idx) != removed && !slots.contains(&idx) {
                    return Err(SwitchError::MissingVif(s.name.clone()));
                }
            }
        }
        Ok(slots)
    }

    /// Installs a snapshot whose vifs name exactly the vif slots; refused before any state
    /// (engine included) is touched otherwise.
    fn apply_policies(&mut self, policies: Arc<PolicySet>, now_ns: u64) -> Result<(), SwitchError> {
        let vif_slots = self.resolve_vifs(&policies, None)?;
        self.engine.configure(&policies, now_ns)?;
        for s in self.slots.iter_mut().flatten() {
            s.vif = None;
        }
        self.vif_slots = vif_slots;
        self.ready = ReadySet::new(policies.len());
        for (id, spec) in policies.vifs.iter().enumerate() {
            let idx = self.vif_slots[id];
            let slot = self.slots[idx].as_mut().expect("slot resolved by name");
            slot.vif = Some(id);
            slot.policy = Some(spec.policy.clone());
            self.ready.set(id, slot.ready);
            slot.down_bucket = match (self.downlink_max, spec.policy.max_bps) {
                (true, Some(max)) => match &slot.down_bucket {
                    Some(b) if b.rate_bps() == (max / 8).max(1) * 8 => slot.down_bucket.take(),
                    _ => Some(TokenBucket::new(
                        max,
                        BUCKET_WINDOW_NS,
                        BUCKET_MIN_DEPTH_BYTES,
                        now_ns,
                    )),
                },
                _ => None,
            };
        }
        self.uplink_bucket = match policies.capacity_bps {
            Some(cap) => match self.uplink_bucket.take() {
                Some(b) if b.rate_bps() == (cap / 8).max(1) * 8 => Some(b),
                _ => Some(TokenBucket::new(
                    cap,
                    BUCKET_WINDOW_NS,
                    BUCKET_MIN_DEPTH_BYTES,
                    now_ns,
                )),
            },
            None => None,
        };
        self.policies = policies;
        self.policy_epoch += 1;
        // Show the change in the stats right away.
        self.next_stats_ns = now_ns;
        Ok(())
    }

    /// Applies queued commands; returns false on `Stop`.
    fn drain_commands(&mut self) -> bool {
        while let Ok(cmd) = self.commands.try_recv() {
            self.counters.commands += 1;
            let now = self.now_ns();
            match cmd {
                Command::Stop => return false,
                Command::AddPort {
                    port,
                    allowed,
                    policies,
                    reply,
                } => {
                    let r = match self.insert_slot(port, allowed, PortRole::Vif) {
                        Ok(idx) => match self.apply_policies(policies, now) {
                            Ok(()) => (Ok(()), None),
                            Err(e) => (Err(e), self.remove_slot(idx)),
                        },
                        Err((e, port)) => (Err(e), Some(port)),
                    };
                    let _ = reply.send(r);
                }
                Command::RemovePort {
                    name,
                    policies,
                    reply,
                } => {
                    let r = match self.slot_by_name(&name) {
                        Some(idx) if idx != 0 => {
                            // Check the snapshot and configure the engine first: if either
                            // refuses, the port stays.
                            let checked = self.resolve_vifs(&policies, Some(idx));
                            match checked.and_then(|_| Ok(self.engine.configure(&policies, now)?)) {
                                Ok(()) => {
                                    let port = self.remove_slot(idx);
                                    (self.apply_policies(policies, now), port)
                                }
                                Err(e) => (Err(e), None),
                            }
                        }
                        _ => (Err(SwitchError::UnknownPort(name)), None),
                    };
                    let _ = reply.send(r);
                }
                Command::SetPolicies { policies, reply } => {
                    let _ = reply.send((self.apply_policies(policies, now), None));
                }
                Command::SetEcn { probabilities } => {
                    for (vif, p) in probabilities.into_iter().enumerate() {
                        if let Some(Some(slot)) =
                            self.vif_slots.get(vif).and_then(|&i| self.slots.get_mut(i))
                        {
                            slot.ecn_threshold = (p.clamp(0.0, 1.0) * 4_294_967_296.0) as u64;
                        }
                    }
                    self.next_stats_ns = now;
                }
            }
        }
        true
    }

    fn run(mut self) {
        loop {
            let t0 = cycles();
            self.counters.iterations += 1;
            if self.pending.swap(false, Ordering::Acquire) && !self.drain_commands() {
                break;
            }
            let now = self.now_ns();
            if self.engine.next_tick() <= now {
                self.engine.tick(&self.ready, now);
                self.counters.engine_ticks += 1;
            }
            let mut did = false;
            if self.slots[0].as_ref().is_some_and(|s| s.ready) {
                self.serve_uplink(now);
                did = true;
            }
            if !self.ready.none() {
                let link_ok = match &mut self.uplink_bucket {
                    Some(b) => {
                        b.refill(now);
                        b.allows()
                    }
                    None => true,
                };
                if !link_ok {
                    self.counters.capacity_waits += 1;
                } else if let Some(grant) = self.engine.select(&self.ready, now) {
                    self.serve_vif(grant, now);
                    did = true;
                } else {
                    self.counters.engine_refusals += 1;
                }
            }
            if now >= self.next_stats_ns {
                self.publish(now);
            }
            if now >= self.next_age_ns {
                self.macs.expire(now);
                self.next_age_ns = now + 1_000_000_000;
            }
            if did {
                // An iteration that did work does not wait, so it does not collect readiness
                // either: do it every BUSY_HARVEST_INTERVAL_NS without waiting, or ports
                // drained earlier would starve behind backlogged ones.
                // With emulated work every batch is long (tens of µs per frame): collect after
                // each, or a frame arriving during one (a probe's answer on the uplink, a
                // priority vif's request) would wait out the interval on top of it.
                if now >= self.next_harvest_ns || self.emulated_work.is_some() {
                    self.harvest(Some(0));
                    self.next_harvest_ns = now + BUSY_HARVEST_INTERVAL_NS;
                }
                self.counters.busy_cycles += cycles().wrapping_sub(t0);
            } else {
                self.wait(now);
                self.counters.idle_cycles += cycles().wrapping_sub(t0);
            }
        }
        self.publish(self.now_ns());
    }

    /// Nothing to do now: sleep until a port or the wake fd fires or a deadline passes
    /// (epoll), or mark every port as worth polling (busy polling).
    fn wait(&mut self, now: u64) {
        if self.epoll.is_none() {
            self.harvest(None);
            std::hint::spin_loop();
            return;
        }
        let mut deadline = self.next_stats_ns.min(self.engine.next_tick());
        if !self.ready.none() {
            deadline = deadline.min(self.engine.eligible_at(now));
            if let Some(b) = &self.uplink_bucket {
                if !b.allows() {
                    deadline = deadline.min(b.ready_at());
                }
            }
        }
        let mut timeout = deadline.saturating_sub(now);
        // Ports without a readiness descriptor cannot wake us: poll them every millisecond.
        if self.slots.iter().flatten().any(|s| s.fd.is_none()) {
            timeout = timeout.min(POLL_ONLY_INTERVAL_NS);
        }
        self.harvest(Some(timeout));
    }

    /// Sets the ready flag of every port with frames waiting: in epoll mode the ports whose
    /// descriptor fired within `timeout_ns` (`Some(0)`: only those that already did) and the
    /// ports without a descriptor; in busy polling every port (`timeout_ns` unused).
    fn harvest(&mut self, timeout_ns: Option<u64>) {
        let Some(epoll) = self.epoll.as_mut() else {
            for s in self.slots.iter_mut().flatten() {
                s.ready = true;
                if let Some(v) = s.vif {
                    self.ready.set(v, true);
                }
            }
            return;
        };
        let poll_only = self.slots.iter().flatten().any(|s| s.fd.is_none());
        for token in epoll.wait(timeout_ns) {
            if token == WAKE_TOKEN {
                self.wake.clear();
                continue;
            }
            if let Some(Some(s)) = self.slots.get_mut(token as usize) {
                s.ready = true;
                if let Some(v) = s.vif {
                    self.ready.set(v, true);
                }
            }
        }
        if poll_only {
            for s in self.slots.iter_mut().flatten().filter(|s| s.fd.is_none()) {
                s.ready = true;
                if let Some(v) = s.vif {
                    self.ready.set(v, true);
                }
            }
        }
    }

    fn serve_uplink(&mut self, now: u64) {
        let slot = self.slots[0].as_mut().expect("uplink present");
        self.batch.clear();
        let got = match slot.port.recv_batch(&mut self.batch, BATCH_FRAMES) {
            Ok(n) => n,
            Err(_) => {
                // Frames read before the error stay in the batch and are forwarded; the port
                // is retried at the next stats publication.
                slot.c.rx_errors += 1;
                slot.rx_failed = true;
                self.batch.len()
            }
        };
        if got < BATCH_FRAMES {
            slot.ready = false;
        }
        self.counters.bursts += 1;
        self.counters.burst_frames += got as u64;
        self.forward_batch(0, None, now);
    }

    fn serve_vif(&mut self, grant: Grant, now: u64) {
        let vif = grant.vif;
        let Some(&idx) = self.vif_slots.get(vif) else {
            return;
        };
        let t0 = cycles();
        let slot = self.slots[idx].as_mut().expect("vif slot present");
        let mut want = usize::from(grant.max_packets).clamp(1, BATCH_FRAMES);
        if let Some(w) = self.emulated_work.filter(|w| w.batch_frames > 0) {
            want = want.min(w.batch_frames);
        }
        if let Some(b) = &self.uplink_bucket {
            // Read no more than the tokens cover (plus one frame): a full batch of 64 KiB
            // super-frames would otherwise run the link's bucket 2 MiB into debt.
            let est = (b.tokens_bytes().max(0) as u64 / slot.avg_frame_bytes.max(64)) as usize + 1;
            want = want.min(est);
        }
        self.batch.clear();
        let got = match slot.port.recv_batch(&mut self.batch, want) {
            Ok(n) => n,
            Err(_) => {
                // Frames read before the error stay in the batch and are forwarded; the port
                // is retried at the next stats publication.
                slot.c.rx_errors += 1;
                slot.rx_failed = true;
                self.batch.len()
            }
        };
        if got < want {
            slot.ready = false;
            self.ready.set(vif, false);
        }
        self.counters.bursts += 1;
        self.counters.burst_frames += got as u64;
        let (packets, bytes) = self.forward_batch(idx, Some(vif), now);
        if let Some(w) = self.emulated_work {
            let until = t0.wrapping_add(w.cycles(got as u64, bytes));
            while (until.wrapping_sub(cycles()) as i64) > 0 {
                // Yield while spinning: kernel work queued on this core (the deliveries of the
                // frames this loop wrote into TAPs, run by ksoftirqd when the core is busy)
                // runs inside the emulated time instead of waiting behind it.
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        let usage = Usage {
            packets,
            bytes,
            cycles: cycles().wrapping_sub(t0),
        };
        self.engine.charge(vif, usage, now);
    }

    #[inline]
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Validates, learns, admits and switches every frame of `batch` read from slot `src`, then
    /// sends. Returns the frames and on-wire bytes ([`frame::wire_bytes`]) admitted.
    fn forward_batch(&mut self, src: usize, src_vif: Option<VifId>, now: u64) -> (u32, u64) {
        let mut packets = 0u32;
        let mut bytes = 0u64;
        for i in 0..self.batch.len() {
            let len = self.batch.frame(i).len();
            let eth_len = len.saturating_sub(VNET_HDR_LEN) as u64;
            let s = self.slots[src].as_mut().expect("source slot present");
            s.c.rx_frames += 1;
            let checked = frame::validate(self.batch.frame(i))
                .map(|h| frame::wire_bytes(self.batch.frame(i), &h));
            // Valid frames count (and are charged) as the bytes they put on the wire.
            s.c.rx_bytes += *checked.as_ref().unwrap_or(&eth_len);
            let wire = match checked {
                Ok(w) => w,
                Err(FrameError::Truncated) => {
                    s.c.drops.truncated += 1;
                    continue;
                }
                Err(FrameError::Oversized) => {
                    s.c.drops.oversized += 1;
                    continue;
                }
                Err(FrameError::BadVnetHdr(_)) => {
                    s.c.drops.bad_vnet_hdr += 1;
                    continue;
                }
            };
            self.wire_bytes[i] = wire;
            // Smooth the frame size (1/8 weight), used only to size capacity-limited reads.
            s.avg_frame_bytes = (s.avg_frame_bytes * 7 + wire) / 8;
            let f = self.batch.frame(i);
            let dst_mac = mac_key(&f[VNET_HDR_LEN..]);
            let src_mac = mac_key(&f[VNET_HDR_LEN + 6..]);
            let allowed = s
                .allowed
                .as_ref()
                .map_or(true, |a| a.binary_search(&src_mac).is_ok());
            if !allowed || is_group(src_mac) {
                s.c.drops.spoofed += 1;
                continue;
            }
            if let Some(vif) = src_vif {
                // wire < 2^26 (see frame::wire_bytes): fits u32.
                match self.engine.admit(vif, wire as u32, now) {
                    Verdict::Forward => {}
                    Verdict::Drop => {
                        s.c.drops.policed += 1;
                        continue;
                    }
                    Verdict::MarkCe => {
                        // A GSO frame is marked once: every segment cut from it carries CE.
                        if frame::mark_ce(&mut self.batch.frame_mut(i)[VNET_HDR_LEN..]) {
                            s.c.ecn_marked += 1;
                        } else {
                            s.c.ecn_not_ect += 1;
                        }
                    }
                }
            }
            if !self.macs.learn(src_mac, src as u16, now) {
                self.slots[src]
                    .as_mut()
                    .expect("source")
                    .c
                    .mac_learn_refused += 1;
            }
            let dest = if is_group(dst_mac) {
                None
            } else {
                self.macs.lookup(dst_mac, now)
            };
            match dest {
                Some(d) if usize::from(d) == src => {
                    self.slots[src].as_mut().expect("source").c.drops.hairpin += 1;
                    continue;
                }
                Some(d) => {
                    if !self.unicast(i, usize::from(d), src, wire, now) {
                        continue;
                    }
                }
                None => {
                    for d in 0..self.slots.len() {
                        if d != src && self.slots[d].is_some() {
                            self.push_out(d, i);
                        }
                    }
                }
            }
            packets += 1;
            bytes += wire;
        }
        self.flush(now);
        (packets, bytes)
    }

    #[inline]
    fn push_out(&mut self, d: usize, i: usize) {
        if self.out[d].is_empty() {
            self.touched.push(d);
        }
        self.out[d].push(i as u8);
    }

    /// Queues frame `i` for slot `d`, applying the downlink maximum and ECN marking on
    /// uplink→vif frames; false if it was dropped.
    fn unicast(&mut self, i: usize, d: usize, src: usize, wire: u64, now: u64) -> bool {
        if src == 0 {
            let mark = {
                let Some(slot) = self.slots[d].as_mut() else {
                    return false;
                };
                if let Some(b) = &mut slot.down_bucket {
                    b.refill(now);
                    if !b.allows() {
                        slot.c.drops.rate_limited += 1;
                        return false;
                    }
                    b.consume(wire);
                }
                slot.ecn_threshold
            };
            if mark > 0 && (self.next_random() >> 32) < mark {
                let f = self.batch.frame_mut(i);
                let c = &mut self.slots[d].as_mut().expect("dest").c;
                if frame::mark_ce(&mut f[VNET_HDR_LEN..]) {
                    c.ecn_marked += 1;
                } else {
                    c.ecn_not_ect += 1;
                }
            }
        }
        self.push_out(d, i);
        true
    }

    fn flush(&mut self, now: u64) {
        for k in 0..self.touched.len() {
            let d = self.touched[k];
            let Some(slot) = self.slots[d].as_mut() else {
                self.out[d].clear();
                continue;
            };
            let idx = &self.out[d];
            let sent = slot.port.send_batch(&self.batch, idx).unwrap_or(0);
            let sent_bytes: u64 = idx[..sent]
                .iter()
                .map(|&i| self.wire_bytes[usize::from(i)])
                .sum();
            slot.c.tx_frames += sent as u64;
            slot.c.tx_bytes += sent_bytes;
            slot.c.drops.tx_error += (idx.len() - sent) as u64;
            if d == 0 {
                if let Some(b) = &mut self.uplink_bucket {
                    b.refill(now);
                    b.consume(sent_bytes);
                }
            }
            self.out[d].clear();
        }
        self.touched.clear();
    }

    fn publish(&mut self, now: u64) {
        self.next_stats_ns = now + self.stats_interval_ns;
        let mut ports = Vec::with_capacity(self.slots.len());
        for s in self.slots.iter_mut().flatten() {
            if s.rx_failed {
                s.rx_failed = false;
                s.ready = true;
                if let Some(v) = s.vif {
                    self.ready.set(v, true);
                }
            }
            let oldest = s.rate_hist[s.rate_pos];
            s.rate_hist[s.rate_pos] = (now, s.c.rx_bytes, s.c.tx_bytes);
            s.rate_pos = (s.rate_pos + 1) % RATE_SAMPLES;
            let dt = now.saturating_sub(oldest.0).max(1);
            // bytes < 2^64, ×8e9 fits in u128.
            let rate = |b: u64| (u128::from(b) * 8_000_000_000 / u128::from(dt)) as u64;
            ports.push(PortStats {
                name: s.name.clone(),
                role: s.role,
                vif: s.vif,
                policy: s.policy.clone(),
                rx_frames: s.c.rx_frames,
                rx_bytes: s.c.rx_bytes,
                tx_frames: s.c.tx_frames,
                tx_bytes: s.c.tx_bytes,
                drops: s.c.drops,
                ecn_marked: s.c.ecn_marked,
                rx_errors: s.c.rx_errors,
                mac_learn_refused: s.c.mac_learn_refused,
                ecn_not_ect: s.c.ecn_not_ect,
                ecn_probability: s.ecn_threshold as f64 / 4_294_967_296.0,
                engine: s.vif.map(|v| self.engine.vif_state(v)),
                rx_rate_bps: rate(s.c.rx_bytes - oldest.1),
                tx_rate_bps: rate(s.c.tx_bytes - oldest.2),
                io: s.port.counters(),
            });
        }
        let stats = SwitchStats {
            time_ns: now,
            policy_epoch: self.policy_epoch,
            engine: self.engine_kind,
            capacity_bps: self.policies.capacity_bps,
            mac_entries: self.macs.len(),
            ports,
            loop_stats: LoopStats {
                epoll_errors: self.epoll.as_ref().map_or(0, Epoll::errors),
                epoll_wait_fallback: self.epoll.as_ref().is_some_and(Epoll::uses_fallback),
                ..self.counters.clone()
            },
        };
        *lock(&self.stats_out) = Arc::new(stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemPort;

    /// A loop (not running) with an uplink and vif ports `vifs`, configured with `vifs` in order.
    fn test_loop(vifs: &[&str]) -> Loop {
        let policies = PolicySet::new(None);
        let (_tx, rx) = mpsc::channel();
        let mut lp = Loop {
            slots: Vec::new(),
            vif_slots: Vec::new(),
            out: Vec::new(),
            touched: Vec::new(),
            engine: vqos_sched::build(EngineKind::Rr, &policies, 0).unwrap(),
            engine_kind: EngineKind::Rr,
            policies: Arc::new(policies.clone()),
            policy_epoch: 0,
            ready: ReadySet::new(0),
            macs: MacTable::new(64, 64, 1_000_000_000),
            batch: Batch::new(),
            wire_bytes: [0; BATCH_FRAMES],
            uplink_bucket: None,
            epoll: None,
            stats_interval_ns: 25_000_000,
            downlink_max: true,
            emulated_work: None,
            commands: rx,
            pending: Arc::new(AtomicBool::new(false)),
            wake: Arc::new(EventFd::new().unwrap()),
            stats_out: Arc::new(Mutex::new(Arc::new(SwitchStats {
                time_ns: 0,
                policy_epoch: 0,
                engine: EngineKind::Rr,
                capacity_bps: None,
                mac_entries: 0,
                ports: Vec::new(),
                loop_stats: LoopStats::default(),
            }))),
            origin: Instant::now(),
            counters: LoopStats::default(),
            rng: 1,
            next_stats_ns: 0,
            next_age_ns: 0,
            next_harvest_ns: 0,
        };
        assert!(lp
            .insert_slot(Box::new(MemPort::pair("up", 1).0), None, PortRole::Uplink)
            .is_ok());
        for name in vifs {
            assert!(lp
                .insert_slot(Box::new(MemPort::pair(name, 1).0), None, PortRole::Vif)
                .is_ok());
        }
        lp.apply_policies(Arc::new(set(vifs)), 0).unwrap();
        lp
    }

    fn set(vifs: &[&str]) -> PolicySet {
        let mut p = PolicySet::new(None);
        for name in vifs {
            p.vifs.push(VifSpec {
                name: name.to_string(),
                policy: VifPolicy::default(),
            });
        }
        p
    }

    #[test]
    fn snapshot_naming_a_missing_port_is_refused_before_anything_changes() {
        let mut lp = test_loop(&["a", "b", "c"]);
        assert_eq!(lp.vif_slots, vec![1, 2, 3]);
        let epoch = lp.policy_epoch;
        // "zz" has no slot: by position, b and c would have been served as vifs 0 and 1.
        for bad in [
            &["zz", "b", "c"][..],
            &["b", "c"],
            &["a", "a", "c"],
            &["up", "b", "c"],
        ] {
            assert!(lp.apply_policies(Arc::new(set(bad)), 1).is_err(), "{bad:?}");
            assert_eq!(lp.vif_slots, vec![1, 2, 3], "{bad:?}");
            assert_eq!(lp.policy_epoch, epoch);
            assert_eq!(lp.policies.len(), 3);
        }
        // Reordered: mapped by name, not by position.
        lp.apply_policies(Arc::new(set(&["c", "a", "b"])), 2)
            .unwrap();
        assert_eq!(lp.vif_slots, vec![3, 1, 2]);
        for (idx, vif) in [(1, 1), (2, 2), (3, 0)] {
            assert_eq!(lp.slots[idx].as_ref().unwrap().vif, Some(vif));
        }
    }
}
