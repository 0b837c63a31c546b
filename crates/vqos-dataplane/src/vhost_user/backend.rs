//! The state a vhost-user port shares between its threads.
//!
//! ## Threads
//! - The **poll loop** (the switch's thread) owns the [`super::VhostUserPort`] and moves frames:
//!   it locks [`Shared::session`] once per batch, then the one vring it serves (`get_mut`, once
//!   per batch), and loads the guest memory snapshot once per batch. Never per frame.
//! - The **protocol** thread of the port ([`super::session`]) accepts or connects, then answers
//!   the frontend's vhost-user messages (`SET_MEM_TABLE`, `SET_VRING_*`, ...) through
//!   [`super::protocol::NetHandler`], one per session, and tears the session down when the
//!   frontend goes away.
//! - The **kick worker** of a session ([`super::kick`]) waits on the guest's kick eventfds and
//!   signals the port's readiness eventfd on every guest TX kick.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use vhost_user_backend::VringRwLock;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use super::counters::{bump, AtomicCounters};
use super::{VhostUserConfig, VhostUserMode};
use crate::sys::EventFd;

/// Queue index of the guest's receive queue (frames the switch sends to the guest).
pub(crate) const RX_QUEUE: usize = 0;
/// Queue index of the guest's transmit queue (frames the switch reads from the guest).
pub(crate) const TX_QUEUE: usize = 1;

/// Whether a session still deserves service.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The guest broke a ring: nothing is read from or written to it until it reconnects.
    pub(crate) quarantined: bool,
    /// Malformed chains seen in this session.
    pub(crate) bad_chains: u64,
}

/// One connection with one frontend; dropped (guest memory unmapped) when it ends.
pub(crate) struct Session {
    /// The guest's memory, as mapped by `SET_MEM_TABLE` (empty before).
    pub(crate) mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// The session's vrings `[rx, tx]` (shared with the protocol thread's handler).
    pub(crate) vrings: Vec<VringRwLock>,
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
    /// A clone of the current connection, shut down by the port's drop to end the session.
    pub(crate) shutdown: Mutex<Option<UnixStream>>,
    /// Why the last session ended, when the library reported an error (a refused message,
    /// a failed mapping): for the operator.
    pub(crate) last_error: Mutex<Option<String>>,
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
            last_error: Mutex::new(None),
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
