//! The state a vhost-user port shares between its threads.
//!
//! ## Threads
//! - The **poll loops** (the switch's shards) move frames. The shard that reads the port owns
//!   the [`super::VhostUserPort`] (queue pair 0, and every guest TX queue); each other shard
//!   may own a [`super::VhostUserTxQueue`] (a guest RX queue of its own, pair 1 and up). Each
//!   read-locks [`Shared::session`] once per batch, then write-locks the vring it serves
//!   (`get_mut`, once per batch per vring), and loads the guest memory snapshot once per
//!   batch. Never per frame. Shards on different pairs do not wait for each other; shards that
//!   share a pair (more shards than pairs, or a guest that enabled fewer) take turns on the
//!   vring's lock.
//! - The **protocol** thread of the port ([`super::session`]) accepts or connects, then answers
//!   the frontend's vhost-user messages (`SET_MEM_TABLE`, `SET_VRING_*`, ...) through
//!   [`super::protocol::NetHandler`], one per session, and tears the session down when the
//!   frontend goes away.
//! - The **kick worker** of a session ([`super::kick`]) waits on the guest's kick eventfds and
//!   signals the port's readiness eventfd on every guest TX kick.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use vhost_user_backend::VringRwLock;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use super::counters::{bump, AtomicCounters};
use super::dirty::DirtyLog;
use super::{VhostUserConfig, VhostUserRole};
use crate::sys::EventFd;

/// Queue index of the guest's receive queue of pair 0 (frames the switch sends to the guest).
pub(crate) const RX_QUEUE: usize = 0;
/// Most queue pairs a port offers (`queues`): DPDK's vhost library and QEMU allow more; 16
/// covers a guest with a queue pair per vCPU on the hosts we size for, and bounds what a
/// frontend can make the port allocate.
pub const MAX_QUEUE_PAIRS: u16 = 16;

/// Queue index of pair `pair`'s guest receive queue (virtio-net numbers queues rx0, tx0, rx1,
/// tx1, ...).
pub(crate) const fn rx_queue(pair: usize) -> usize {
    2 * pair
}

/// Queue index of pair `pair`'s guest transmit queue.
pub(crate) const fn tx_queue(pair: usize) -> usize {
    2 * pair + 1
}

/// Whether queue `index` is a guest transmit queue (frames for the switch to read).
pub(crate) const fn is_guest_tx(index: usize) -> bool {
    index % 2 == 1
}

/// Whether a session still deserves service. Atomics: several shards serve one session.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The guest broke a ring: nothing is read from or written to it until it reconnects.
    quarantined: AtomicBool,
    /// Malformed chains seen in this session.
    bad_chains: AtomicU64,
}

impl Health {
    /// The session is quarantined.
    pub(crate) fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Relaxed)
    }
}

/// One connection with one frontend; dropped (guest memory unmapped) when it ends.
pub(crate) struct Session {
    /// The guest's memory, as mapped by `SET_MEM_TABLE` (empty before).
    pub(crate) mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// The session's vrings `[rx0, tx0, rx1, tx1, ...]`, two per configured queue pair
    /// (shared with the protocol thread's handler).
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
    /// The current session, if a frontend is connected: read-locked by the shards for a
    /// batch, write-locked by the protocol thread to start or end it.
    pub(crate) session: RwLock<Option<Session>>,
    /// A session is up (set by the supervisor).
    pub(crate) connected: AtomicBool,
    /// Virtio features the frontend acknowledged in this session (0 when none).
    pub(crate) features: AtomicU64,
    /// The current session is quarantined (mirror of [`Health::quarantined`] for readers).
    pub(crate) quarantined: AtomicBool,
    /// Counters.
    pub(crate) counters: AtomicCounters,
    /// Frames and bytes the switch read from / wrote to the guest: `[rx_frames, rx_bytes,
    /// tx_frames, tx_bytes]` (the sum of the port's and its transmit queues'
    /// `PortIoCounters`, added per batch).
    pub(crate) io: [AtomicU64; 4],
    /// Frames per queue pair, `[read from its TX queue, written to its RX queue]`.
    pub(crate) pair_frames: Vec<[AtomicU64; 2]>,
    /// Transmit queues handed out so far ([`super::VhostUserPort`]'s `tx_queue`).
    pub(crate) handed_out: AtomicUsize,
    /// The session's dirty-page log (`SET_LOG_BASE`), written while the frontend has
    /// `LOG_ALL` acknowledged (a live migration); dropped with the session.
    pub(crate) log: Mutex<Option<Arc<DirtyLog>>>,
    /// A guest announce asked for by `SEND_RARP` ([`super::rarp`]), not yet read by the
    /// loop: the MAC with bit 63 set, or 0.
    pub(crate) rarp: AtomicU64,
    /// The port's readiness eventfd: signalled on every guest TX kick and when the loop
    /// re-enables notifications with frames already waiting.
    pub(crate) ready: EventFd,
    /// Queue pairs whose TX queue another shard reads ([`super::VhostUserRxQueue`]), a bit
    /// each; the port reads the others.
    pub(crate) lent: AtomicU64,
    /// The readiness eventfd of pairs 1.. (`[p - 1]`), used while the pair is lent.
    pub(crate) pair_ready: Vec<EventFd>,
    /// Set when the port is dropped.
    pub(crate) stop: AtomicBool,
    /// Signalled when the port is dropped (wakes the supervisor's poll).
    pub(crate) stop_event: EventFd,
    /// A clone of the current connection, shut down by the port's drop to end the session.
    pub(crate) shutdown: Mutex<Option<UnixStream>>,
    /// Why the last session ended, when the library reported an error (a refused message,
    /// a failed mapping): for the operator.
    pub(crate) last_error: Mutex<Option<String>>,
    /// What the handler refused last and why, in the operator's words (the library's error
    /// says only "invalid parameters"): added to `last_error` if that ends the session.
    pub(crate) refusal: Mutex<Option<String>>,
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

/// Read-locks a rwlock, ignoring poisoning.
pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks a rwlock, ignoring poisoning.
pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Fresh shared state.
    pub(crate) fn new(name: &str, config: VhostUserConfig) -> Result<Shared, crate::sys::SysError> {
        let config_queues = config.queues;
        Ok(Shared {
            name: name.to_string(),
            pair_frames: (0..config.queues).map(|_| Default::default()).collect(),
            handed_out: AtomicUsize::new(0),
            log: Mutex::new(None),
            rarp: AtomicU64::new(0),
            config,
            session: RwLock::new(None),
            connected: AtomicBool::new(false),
            features: AtomicU64::new(0),
            quarantined: AtomicBool::new(false),
            counters: AtomicCounters::default(),
            io: Default::default(),
            ready: EventFd::new()?,
            lent: AtomicU64::new(0),
            pair_ready: (1..config_queues)
                .map(|_| EventFd::new())
                .collect::<Result<_, _>>()?,
            stop: AtomicBool::new(false),
            stop_event: EventFd::new()?,
            shutdown: Mutex::new(None),
            last_error: Mutex::new(None),
            refusal: Mutex::new(None),
        })
    }

    /// The readiness eventfd of queue pair `pair`: its own while another shard reads it,
    /// else the port's.
    pub(crate) fn ready_of(&self, pair: usize) -> &EventFd {
        let lent = pair < 64 && self.lent.load(Ordering::Acquire) & (1 << pair) != 0;
        match pair.checked_sub(1).and_then(|i| self.pair_ready.get(i)) {
            Some(e) if lent => e,
            _ => &self.ready,
        }
    }

    /// The socket role.
    pub(crate) fn mode(&self) -> VhostUserRole {
        self.config.mode
    }

    /// Puts the current session in quarantine (once).
    pub(crate) fn quarantine(&self, health: &Health) {
        if !health.quarantined.swap(true, Ordering::Relaxed) {
            self.quarantined.store(true, Ordering::Relaxed);
            bump(&self.counters.quarantines, 1);
        }
    }

    /// Counts a malformed chain; quarantines past the configured limit.
    pub(crate) fn bad_chain(&self, health: &Health) {
        let bad = health.bad_chains.fetch_add(1, Ordering::Relaxed) + 1;
        let limit = self.config.quarantine_after_bad_chains;
        if limit > 0 && bad >= limit {
            self.quarantine(health);
        }
    }
}
