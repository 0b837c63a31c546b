//! [`VhostUserPort`]: a virtio-net device for a VM (QEMU, Cloud Hypervisor, DPDK's
//! virtio-user) over vhost-user, as one more [`Port`] of the switch.
//!
//! ## API
//! - [`VhostUserPort::server`]`(name, socket_path)`: binds `socket_path` (replacing a stale
//!   file) and serves one frontend at a time; [`VhostUserPort::client`]`(name, socket_path)`:
//!   connects to a frontend that listens there, and reconnects with backoff;
//!   [`VhostUserPort::with_config`]`(name, `[`VhostUserConfig`]`)` for the limits.
//! - [`VhostUserPort::handle`]`() -> `[`VhostUserHandle`]: cloneable, readable from any thread
//!   once the port itself belongs to the switch (`PortSpec::custom(Box::new(port))`):
//!   `is_connected()`, `negotiated_features()`, `is_quarantined()`, `counters() ->`
//!   [`VhostUserCounters`], `status() ->` [`VhostUserStatus`] (serde `Serialize`).
//! - The port implements [`Port`]; its frames carry the data plane's 12-byte virtio-net header.
//!
//! ## Behavior
//! See docs/vhost-user.md. In short: up to [`MAX_QUEUE_PAIRS`] queue pairs
//! ([`VhostUserConfig::queues`], virtio-net `MQ`); every guest TX queue is read by the shard
//! that reads the port, and each other shard writes to the guest on a pair of its own
//! ([`VhostUserTxQueue`]); the guest's rings are read and written by the poll loops, each
//! vring locked once per batch; the vhost-user messages are answered by the
//! port's protocol thread (the `vhost` crate parses them), one handler per session; a frame the
//! loop does not take stays in the guest's avail ring; every guest misbehaviour has a counter
//! ([`VhostUserCounters`]), and a broken ring quarantines the session until the guest
//! reconnects. Guest memory is unmapped when the session ends.
//!
//! ## Limitations
//! A port's TX queues are all read by one shard (a vif is not spread over shards), no
//! indirect descriptors, no packed rings, no postcopy migration, no software segmentation or
//! checksum for guests without the offloads (such frames are dropped, counted).

mod backend;
#[cfg(test)]
mod bench_log;
mod chain;
mod counters;
mod datapath;
mod dirty;
pub mod features;
#[doc(hidden)]
pub mod fuzzing;
mod guest;
mod kick;
mod protocol;
mod queue;
mod rarp;
mod session;

#[cfg(test)]
mod test_frontend;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fuzz;
#[cfg(test)]
mod tests_hostile;
#[cfg(test)]
mod tests_log;
#[cfg(test)]
mod tests_mq;
#[cfg(test)]
mod tests_rarp;
#[cfg(test)]
mod tests_regions;
#[cfg(test)]
mod tests_switch;

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Serialize;
use thiserror::Error;
use vhost::vhost_user::Listener;

use crate::port::{Batch, Port, PortError, PortIoCounters, PortStatus};
use backend::{lock, Shared};
use queue::QueueIo;

pub use backend::MAX_QUEUE_PAIRS;
pub use counters::VhostUserCounters;
pub use queue::{VhostUserRxQueue, VhostUserTxQueue};
pub use vqos_api::port::VhostUserRole;
pub use vqos_api::stats::VhostUserStatus;

/// How a [`VhostUserPort`] connects, and its limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VhostUserConfig {
    /// Socket role.
    pub mode: VhostUserRole,
    /// The unix socket's path.
    pub socket: PathBuf,
    /// Largest ring size accepted (`SET_VRING_NUM`), a power of two up to 32768; 1024 by
    /// default (QEMU's and DPDK's largest usual size).
    pub max_queue_size: u16,
    /// Client mode: first delay before reconnecting, ms.
    pub reconnect_min_ms: u64,
    /// Client mode: longest delay between attempts (the delay doubles up to it), ms.
    pub reconnect_max_ms: u64,
    /// Malformed chains in one session before it is quarantined; 0: never for that reason
    /// (a broken ring always quarantines).
    pub quarantine_after_bad_chains: u64,
    /// Server role: permission bits given to the socket file after binding (e.g. `0o660`, so
    /// that a QEMU running as another user in the socket's group can connect); `None` keeps
    /// what the process umask gave.
    pub socket_mode: Option<u32>,
    /// Queue pairs offered to the guest, 1..=[`MAX_QUEUE_PAIRS`] (virtio-net `MQ` when more
    /// than one; QEMU's `-netdev vhost-user,queues=N` must not ask for more). 1 by default.
    pub queues: u16,
}

impl VhostUserConfig {
    /// Server role on `socket`, default limits.
    pub fn server(socket: impl AsRef<Path>) -> Self {
        VhostUserConfig {
            mode: VhostUserRole::Server,
            socket: socket.as_ref().to_path_buf(),
            max_queue_size: 1024,
            reconnect_min_ms: 10,
            reconnect_max_ms: 1000,
            quarantine_after_bad_chains: 1024,
            socket_mode: None,
            queues: 1,
        }
    }

    /// Client role on `socket`, default limits.
    pub fn client(socket: impl AsRef<Path>) -> Self {
        VhostUserConfig {
            mode: VhostUserRole::Client,
            ..Self::server(socket)
        }
    }
}

/// Why a vhost-user port could not be created.
#[derive(Debug, Error)]
pub enum VhostUserError {
    /// Binding the server socket failed.
    #[error("Port '{port}': cannot listen on {path}")]
    Listen {
        /// Port name.
        port: String,
        /// Socket path.
        path: String,
        /// The library's error.
        #[source]
        source: vhost::vhost_user::Error,
    },
    /// Something other than a socket exists at the server socket's path (it is not replaced).
    #[error("Port '{port}': {path} exists and is not a socket")]
    NotASocket {
        /// Port name.
        port: String,
        /// Socket path.
        path: String,
    },
    /// The ring size is not a power of two in 1..=32768.
    #[error("Port '{0}': max_queue_size must be a power of two up to 32768")]
    QueueSize(String),
    /// The number of queue pairs is not in 1..=[`MAX_QUEUE_PAIRS`].
    #[error("Port '{0}': queues must be 1 to {MAX_QUEUE_PAIRS}")]
    Queues(String),
    /// An eventfd or the supervisor thread could not be created.
    #[error("Port '{port}': {op} failed")]
    Os {
        /// Port name.
        port: String,
        /// What was attempted.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A cloneable view of a [`VhostUserPort`], usable from any thread.
#[derive(Debug, Clone)]
pub struct VhostUserHandle {
    /// State shared with the port.
    shared: Arc<Shared>,
}

impl VhostUserHandle {
    /// A frontend is connected (a session is up).
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// Virtio features the frontend acknowledged in this session (0 when none).
    pub fn negotiated_features(&self) -> u64 {
        self.shared.features.load(Ordering::Acquire)
    }

    /// The current session is quarantined.
    pub fn is_quarantined(&self) -> bool {
        self.shared.quarantined.load(Ordering::Relaxed)
    }

    /// The counters so far.
    pub fn counters(&self) -> VhostUserCounters {
        self.shared.counters.snapshot()
    }

    /// Socket role.
    pub fn mode(&self) -> VhostUserRole {
        self.shared.config.mode
    }

    /// Socket path.
    pub fn socket_path(&self) -> &Path {
        &self.shared.config.socket
    }

    /// Everything at once.
    pub fn status(&self) -> VhostUserStatus {
        let features = self.negotiated_features();
        let io = |i: usize| self.shared.io[i].load(Ordering::Relaxed);
        VhostUserStatus {
            name: self.shared.name.clone(),
            mode: self.mode(),
            socket: self.shared.config.socket.display().to_string(),
            connected: self.is_connected(),
            quarantined: self.is_quarantined(),
            negotiated_features: features,
            feature_names: (features::names(features).into_iter())
                .map(String::from)
                .collect(),
            rx_frames: io(0),
            rx_bytes: io(1),
            tx_frames: io(2),
            tx_bytes: io(3),
            last_error: lock(&self.shared.last_error).clone(),
            queues: self.shared.config.queues,
            pair_frames: self
                .shared
                .pair_frames
                .iter()
                .map(|p| p.each_ref().map(|c| c.load(Ordering::Relaxed)))
                .collect(),
            counters: self.counters(),
        }
    }
}

/// A vhost-user net port (see the module doc).
pub struct VhostUserPort {
    /// Port name.
    name: String,
    /// State shared with the handle, the supervisor and the backend.
    shared: Arc<Shared>,
    /// Moves the frames: every TX queue, and the RX queue of pair 0.
    queue: QueueIo,
    /// The supervisor thread (joined on drop).
    supervisor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for VhostUserPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserPort")
            .field("name", &self.name)
            .field("shared", &self.shared)
            .finish()
    }
}

impl VhostUserPort {
    /// A port in the server role on `socket_path` (bound now; a stale file is replaced).
    pub fn server(name: &str, socket_path: impl AsRef<Path>) -> Result<Self, VhostUserError> {
        Self::with_config(name, VhostUserConfig::server(socket_path))
    }

    /// A port in the client role: connects to `socket_path` now and whenever the session ends.
    pub fn client(name: &str, socket_path: impl AsRef<Path>) -> Result<Self, VhostUserError> {
        Self::with_config(name, VhostUserConfig::client(socket_path))
    }

    /// A port with explicit limits.
    pub fn with_config(name: &str, config: VhostUserConfig) -> Result<Self, VhostUserError> {
        if !config.max_queue_size.is_power_of_two() || config.max_queue_size > 32768 {
            return Err(VhostUserError::QueueSize(name.to_string()));
        }
        if !(1..=MAX_QUEUE_PAIRS).contains(&config.queues) {
            return Err(VhostUserError::Queues(name.to_string()));
        }
        let os = |op, source| VhostUserError::Os {
            port: name.to_string(),
            op,
            source,
        };
        let listener = match config.mode {
            VhostUserRole::Server => Some(bind(name, &config.socket, config.socket_mode)?),
            VhostUserRole::Client => None,
        };
        let shared = Shared::new(name, config).map_err(|e| {
            let crate::sys::SysError::Call(_, source) = e;
            os("eventfd", source)
        })?;
        let shared = Arc::new(shared);
        let supervisor = session::spawn(shared.clone(), listener).map_err(|e| os("spawn", e))?;
        Ok(VhostUserPort {
            name: name.to_string(),
            queue: QueueIo::new(shared.clone(), 0),
            shared,
            supervisor: Some(supervisor),
        })
    }

    /// A view for other threads.
    pub fn handle(&self) -> VhostUserHandle {
        VhostUserHandle {
            shared: self.shared.clone(),
        }
    }

    /// A frontend is connected.
    pub fn is_connected(&self) -> bool {
        self.handle().is_connected()
    }

    /// Virtio features the frontend acknowledged (0 when none).
    pub fn negotiated_features(&self) -> u64 {
        self.handle().negotiated_features()
    }

    /// The vhost-user counters so far.
    pub fn vhost_counters(&self) -> VhostUserCounters {
        self.shared.counters.snapshot()
    }
}

/// Binds the server socket at `path`, replacing a stale socket file but nothing else, and
/// gives it `mode` if set.
fn bind(name: &str, path: &Path, mode: Option<u32>) -> Result<Listener, VhostUserError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let text = || path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(VhostUserError::NotASocket {
                port: name.to_string(),
                path: text(),
            });
        }
    }
    let listener = Listener::new(path, true).map_err(|e| VhostUserError::Listen {
        port: name.to_string(),
        path: text(),
        source: e,
    })?;
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
            VhostUserError::Os {
                port: name.to_string(),
                op: "chmod",
                source: e,
            }
        })?;
    }
    Ok(listener)
}

impl Drop for VhostUserPort {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.stop_event.signal();
        session::shutdown(&self.shared);
        if let Some(t) = self.supervisor.take() {
            let _ = t.join();
        }
    }
}

impl Port for VhostUserPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        // A pending `SEND_RARP` announce first, as if the guest had sent it.
        let announced = rarp::take(&self.shared, batch);
        let max = max_frames.saturating_sub(announced);
        let read = if max > 0 {
            self.queue.recv(batch, max)
        } else {
            0
        };
        // An announce stored after the take above, whose wake-up the queue's read then
        // cleared from the readiness eventfd, would wait for the guest's next kick (seen in CI:
        // a `SEND_RARP` right after connecting never reached the uplink): wake the loop again,
        // so the next read puts it first.
        if rarp::pending(&self.shared) {
            self.shared.ready.signal();
        }
        Ok(announced + read)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        Ok(self.queue.send(batch, indices))
    }

    /// The port's own eventfd, stable for the port's life. Not the guest's kick eventfd: that
    /// one changes with every session (and may be replaced within one by `SET_VRING_KICK`),
    /// while the loop registers a port's descriptor once; and the session's kick worker
    /// already consumes the kick. The worker signals this eventfd on every guest TX kick, and
    /// the loop's own `recv_batch` signals it when frames slipped in while notifications were
    /// being re-enabled.
    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.shared.ready.raw())
    }

    fn counters(&self) -> PortIoCounters {
        self.queue.io
    }

    fn set_busy_poll(&mut self, busy: bool) {
        self.queue.datapath.busy_poll = busy;
    }

    fn status(&self) -> Option<PortStatus> {
        Some(PortStatus::VhostUser(Box::new(self.handle().status())))
    }

    /// A guest RX queue of its own for another shard when the port has several pairs
    /// ([`VhostUserTxQueue`]); `None` with one (the shards share the port under its lock).
    fn tx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(VhostUserTxQueue::next(&self.shared).map(|q| Box::new(q) as Box<dyn Port>))
    }

    /// The TX queue of its highest pair not yet lent, for another shard to read
    /// ([`VhostUserRxQueue`]); `None` when only pair 0 is left.
    fn rx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(VhostUserRxQueue::lend(&self.shared).map(|q| Box::new(q) as Box<dyn Port>))
    }
}
