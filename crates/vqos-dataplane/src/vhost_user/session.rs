//! The supervisor thread of a vhost-user port: one `VhostUserDaemon` per session.
//!
//! ## Behavior
//! - **Server** role: the socket is bound when the port is created; the supervisor waits
//!   (`poll`) until a frontend connects or the port is dropped, serves that one connection, and
//!   when it ends waits for the next. Each connection is a fresh session: new daemon, new vrings,
//!   new (empty) guest memory; nothing carries over but the counters.
//! - **Client** role: the supervisor connects to the frontend's socket; when that fails, or when
//!   a session ends, it retries after a backoff that doubles from `reconnect_min_ms` to
//!   `reconnect_max_ms` (reset by every successful connection).
//!
//! A session ends when the frontend closes the socket or sends a message the library refuses.
//! Then the daemon is joined and dropped (its protocol thread and vring worker end), the port's
//! [`Session`] is taken out under its lock (so no batch is using it), and with the last
//! reference to its `GuestMemoryAtomic` the guest memory is unmapped.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use super::backend::{lock, NetBackend, Session, Shared};
use super::counters::bump;
use super::VhostUserMode;

/// A session's daemon.
type Daemon = VhostUserDaemon<Arc<NetBackend>>;

/// Starts the supervisor; `listener` is the bound socket in the server role.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    listener: Option<Listener>,
) -> std::io::Result<JoinHandle<()>> {
    let name = format!("vhu-{}", shared.name);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || match (shared.mode(), listener) {
            (VhostUserMode::Server, Some(l)) => run_server(&shared, l),
            _ => run_client(&shared),
        })
}

/// Waits until `fd` is readable or the port is stopped, at most `timeout_ms` (-1: forever).
/// True when `fd` is readable and the port not stopped.
fn wait_readable(shared: &Shared, fd: Option<RawFd>, timeout_ms: i32) -> bool {
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return false;
        }
        let mut fds = [
            libc::pollfd {
                fd: shared.stop_event.raw(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a live array of 2 pollfd; a negative fd is ignored by poll.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if shared.stop.load(Ordering::Acquire) || fds[0].revents != 0 {
            return false;
        }
        return fd.is_some() && fds[1].revents != 0;
    }
}

/// A fresh session (installed in `shared`) and its daemon.
fn new_session(shared: &Arc<Shared>, id: u64) -> Option<Daemon> {
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let backend = Arc::new(NetBackend::new(shared.clone(), id));
    let daemon =
        VhostUserDaemon::new(format!("vhu-{}-{id}", shared.name), backend, mem.clone()).ok()?;
    *lock(&shared.session) = Some(Session {
        id,
        mem,
        vrings: None,
        health: Default::default(),
    });
    Some(daemon)
}

/// Serves one connected session until it ends, then tears it down.
fn serve(shared: &Shared, mut daemon: Daemon) {
    *lock(&shared.shutdown) = daemon.shutdown_handle();
    shared.connected.store(true, Ordering::Release);
    bump(&shared.counters.sessions, 1);
    if shared.stop.load(Ordering::Acquire) {
        daemon.request_shutdown();
    }
    let _ = daemon.wait();
    lock(&shared.shutdown).take();
    end_session(shared, Some(daemon));
    bump(&shared.counters.disconnects, 1);
}

/// Drops the daemon (joining its threads) and the session (unmapping guest memory).
fn end_session(shared: &Shared, daemon: Option<Daemon>) {
    drop(daemon);
    let session = lock(&shared.session).take();
    shared.connected.store(false, Ordering::Release);
    shared.features.store(0, Ordering::Release);
    shared.quarantined.store(false, Ordering::Relaxed);
    drop(session);
}

fn run_server(shared: &Arc<Shared>, mut listener: Listener) {
    let mut id = 0u64;
    let fd = listener.as_raw_fd();
    while wait_readable(shared, Some(fd), -1) {
        id += 1;
        let Some(mut daemon) = new_session(shared, id) else {
            end_session(shared, None);
            continue;
        };
        // poll said a connection waits: accept does not block.
        if daemon.start(&mut listener).is_err() {
            end_session(shared, Some(daemon));
            continue;
        }
        serve(shared, daemon);
    }
    // Dropping the listener removes the socket file.
}

fn run_client(shared: &Arc<Shared>) {
    let min_ms = shared.config.reconnect_min_ms.max(1);
    let max_ms = shared.config.reconnect_max_ms.max(min_ms);
    let path = shared.config.socket.to_string_lossy().into_owned();
    let mut backoff_ms = min_ms;
    let mut id = 0u64;
    while !shared.stop.load(Ordering::Acquire) {
        id += 1;
        if let Some(mut daemon) = new_session(shared, id) {
            if daemon.start_client(&path).is_ok() {
                serve(shared, daemon);
                backoff_ms = min_ms;
                // Even after a clean session, wait a little: a frontend that accepts and
                // closes at once must not make us spin.
                wait_readable(shared, None, i32::try_from(min_ms).unwrap_or(i32::MAX));
                continue;
            }
            end_session(shared, Some(daemon));
        } else {
            end_session(shared, None);
        }
        bump(&shared.counters.connect_failures, 1);
        let wait = i32::try_from(backoff_ms).unwrap_or(i32::MAX);
        // Returns early (false) when the port is stopped; the loop condition ends it.
        wait_readable(shared, None, wait);
        backoff_ms = (backoff_ms * 2).min(max_ms);
    }
}
