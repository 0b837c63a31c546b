//! The state a vhost-user port shares between its threads, and the `vhost-user-backend`
//! device ([`NetBackend`]) the protocol thread drives.
//!
//! ## Threads
//! - The **poll loop** (the switch's thread) owns the [`super::VhostUserPort`] and moves frames:
//!   it locks [`Shared::session`] once per batch, then the one vring it serves (`get_mut`, once
//!   per batch), and loads the guest memory snapshot once per batch. Never per frame.
//! - The **supervisor** thread of the port ([`super::session`]) accepts or connects, builds one
//!   `VhostUserDaemon` per session and tears it down when the frontend goes away.
//! - The daemon's own threads: the **protocol thread** answers vhost-user messages
//!   (`SET_MEM_TABLE`, `SET_VRING_*`, ...) and the **vring worker** waits on the guest's kick
//!   eventfds and calls [`NetBackend`]'s `handle_event`, which signals the port's readiness
//!   eventfd.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VringRwLock};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::counters::{bump, AtomicCounters};
use super::features::{offered_protocol_features, OFFERED_FEATURES};
use super::{VhostUserConfig, VhostUserMode};
use crate::sys::EventFd;

/// Queue index of the guest's receive queue (frames the switch sends to the guest).
pub(crate) const RX_QUEUE: usize = 0;
/// Queue index of the guest's transmit queue (frames the switch reads from the guest).
pub(crate) const TX_QUEUE: usize = 1;
/// Queues of one queue pair.
pub(crate) const NUM_QUEUES: usize = 2;

/// Whether a session still deserves service.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The guest broke a ring: nothing is read from or written to it until it reconnects.
    pub(crate) quarantined: bool,
    /// Malformed chains seen in this session.
    pub(crate) bad_chains: u64,
    /// Kicks on the guest's receive queue are suppressed (the port never waits for receive
    /// buffers: without any it drops, it does not queue).
    pub(crate) rx_kicks_off: bool,
}

/// One connection with one frontend; dropped (guest memory unmapped) when it ends.
pub(crate) struct Session {
    /// Sequence number of the session within the port.
    pub(crate) id: u64,
    /// The guest's memory, as mapped by `SET_MEM_TABLE` (empty before).
    pub(crate) mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// The session's vrings `[rx, tx]`, known from the vring worker's first event (the
    /// worker reports every vring as soon as it is started and enabled).
    pub(crate) vrings: Option<Vec<VringRwLock>>,
    /// Quarantine state and malformed-chain count.
    pub(crate) health: Health,
}

/// What the port, its handle, the supervisor and the backend share.
pub(crate) struct Shared {
    /// Port name.
    pub(crate) name: String,
    /// Socket role, path and limits.
    pub(crate) config: VhostUserConfig,
    /// The current session, if a frontend is connected.
    pub(crate) session: Mutex<Option<Session>>,
    /// A session is up (set by the supervisor).
    pub(crate) connected: AtomicBool,
    /// Virtio features the frontend acknowledged in this session (0 when none).
    pub(crate) features: AtomicU64,
    /// The current session is quarantined (mirror of [`Health::quarantined`] for readers).
    pub(crate) quarantined: AtomicBool,
    /// Counters.
    pub(crate) counters: AtomicCounters,
    /// Frames and bytes the switch read from / wrote to the guest: `[rx_frames, rx_bytes,
    /// tx_frames, tx_bytes]` (mirror of the port's `PortIoCounters`, added per batch).
    pub(crate) io: [AtomicU64; 4],
    /// The port's readiness eventfd: signalled on every guest TX kick and when the loop
    /// re-enables notifications with frames already waiting.
    pub(crate) ready: EventFd,
    /// Set when the port is dropped.
    pub(crate) stop: AtomicBool,
    /// Signalled when the port is dropped (wakes the supervisor's poll).
    pub(crate) stop_event: EventFd,
    /// Closes the current connection (for the port's drop).
    pub(crate) shutdown: Mutex<Option<ShutdownHandle>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("connected", &self.connected)
            .finish()
    }
}

/// Locks a mutex, ignoring poisoning (the data stays consistent per batch).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Fresh shared state.
    pub(crate) fn new(name: &str, config: VhostUserConfig) -> Result<Shared, crate::sys::SysError> {
        Ok(Shared {
            name: name.to_string(),
            config,
            session: Mutex::new(None),
            connected: AtomicBool::new(false),
            features: AtomicU64::new(0),
            quarantined: AtomicBool::new(false),
            counters: AtomicCounters::default(),
            io: Default::default(),
            ready: EventFd::new()?,
            stop: AtomicBool::new(false),
            stop_event: EventFd::new()?,
            shutdown: Mutex::new(None),
        })
    }

    /// The socket role.
    pub(crate) fn mode(&self) -> VhostUserMode {
        self.config.mode
    }

    /// Puts the current session in quarantine (once).
    pub(crate) fn quarantine(&self, health: &mut Health) {
        if !health.quarantined {
            health.quarantined = true;
            self.quarantined.store(true, Ordering::Relaxed);
            bump(&self.counters.quarantines, 1);
        }
    }

    /// Counts a malformed chain; quarantines past the configured limit.
    pub(crate) fn bad_chain(&self, health: &mut Health) {
        health.bad_chains += 1;
        let limit = self.config.quarantine_after_bad_chains;
        if limit > 0 && health.bad_chains >= limit {
            self.quarantine(health);
        }
    }
}

/// The virtio-net device as `vhost-user-backend` sees it: one per session.
pub(crate) struct NetBackend {
    /// State shared with the port.
    shared: Arc<Shared>,
    /// The session this backend serves.
    session_id: u64,
    /// The session's vrings were handed to the port.
    vrings_known: AtomicBool,
}

impl NetBackend {
    /// A backend for session `session_id`.
    pub(crate) fn new(shared: Arc<Shared>, session_id: u64) -> NetBackend {
        NetBackend {
            shared,
            session_id,
            vrings_known: AtomicBool::new(false),
        }
    }
}

impl VhostUserBackend for NetBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.shared.config.max_queue_size)
    }

    fn features(&self) -> u64 {
        OFFERED_FEATURES
    }

    fn acked_features(&self, features: u64) {
        self.shared.features.store(features, Ordering::Release);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        offered_protocol_features()
    }

    fn set_event_idx(&self, _enabled: bool) {
        // The library sets the queues' event-index mode itself; the port reads the acked
        // features.
    }

    fn update_memory(&self, _mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        // The session's GuestMemoryAtomic is the one the library updates in place; the port
        // loads it once per batch.
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Without an exit event the library's vring worker would never stop and dropping the
        // daemon would hang; one pair per worker thread.
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        if !self.vrings_known.load(Ordering::Acquire) && vrings.len() == NUM_QUEUES {
            let mut guard = lock(&self.shared.session);
            if let Some(s) = guard.as_mut().filter(|s| s.id == self.session_id) {
                s.vrings = Some(vrings.to_vec());
            }
            self.vrings_known.store(true, Ordering::Release);
        }
        if usize::from(device_event) == TX_QUEUE {
            bump(&self.shared.counters.kicks, 1);
            self.shared.ready.signal();
        }
        Ok(())
    }
}
