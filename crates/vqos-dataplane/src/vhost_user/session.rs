//! The protocol thread of a vhost-user port: connections, sessions, the request loop.
//!
//! ## Behavior
//! - **Server** role: the socket is bound when the port is created; the thread waits (`poll`)
//!   until a frontend connects or the port is dropped, serves that one connection, and when it
//!   ends waits for the next. Each connection is a fresh session: new handler, new vrings, new
//!   (empty) guest memory, new kick worker; nothing carries over but the counters.
//! - **Client** role: the thread connects to the frontend's socket; when that fails, or when a
//!   session ends, it retries after a backoff that doubles from `reconnect_min_ms` to
//!   `reconnect_max_ms` (reset by every successful connection). A failed connection says why
//!   in [`super::VhostUserStatus::last_error`].
//! - The request loop hands each message to the `vhost` crate's `BackendReqHandler`, which
//!   parses it and calls [`NetHandler`]. A message refused because a feature is not yet
//!   negotiated is skipped (counted in `refused_messages`), and QEMU's early
//!   `SET_VRING_ENABLE` (see [`super::protocol`]), seen with `MSG_PEEK` before the `vhost`
//!   crate refuses it, is applied all the same; any other error, or the frontend closing the
//!   socket, ends the session (the error is kept for
//!   [`super::VhostUserStatus::last_error`]).
//!
//! When a session ends, the kick worker is joined, the port's [`Session`] is taken out under
//! its lock (so no batch is using it), and with the last reference to its `GuestMemoryAtomic`
//! the guest memory is unmapped.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vhost::vhost_user::{
    BackendListener, BackendReqHandler, Error, Listener, VhostUserBackendReqHandlerMut,
};
use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use super::backend::{lock, write, Session, Shared};
use super::counters::bump;
use super::kick::KickWorker;
use super::protocol::NetHandler;
use super::rarp;
use super::VhostUserRole;

/// The `vhost` crate's request parser over our handler.
type Requests = BackendReqHandler<Mutex<NetHandler>>;

/// Starts the protocol thread; `listener` is the bound socket in the server role.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    listener: Option<Listener>,
) -> std::io::Result<JoinHandle<()>> {
    let name = format!("vhu-{}", shared.name);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || match (shared.mode(), listener) {
            (VhostUserRole::Server, Some(l)) => run_server(&shared, l),
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

/// A fresh session installed in `shared`: its handler (for the request parser) and its kick
/// worker.
fn new_session(shared: &Arc<Shared>) -> Option<(Arc<Mutex<NetHandler>>, KickWorker)> {
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let max = shared.config.max_queue_size;
    let vrings: Vec<VringRwLock> = (0..2 * usize::from(shared.config.queues))
        .map(|_| VringRwLock::new(mem.clone(), max))
        .collect::<Result<_, _>>()
        .ok()?;
    let worker = KickWorker::start(shared.clone(), vrings.clone()).ok()?;
    let handler = NetHandler::new(shared.clone(), mem.clone(), vrings.clone(), worker.rearm());
    *write(&shared.session) = Some(Session {
        mem,
        vrings,
        health: Default::default(),
    });
    Some((Arc::new(Mutex::new(handler)), worker))
}

/// Runs the request loop of one connected session, then tears it down.
fn serve(shared: &Shared, handler: &Mutex<NetHandler>, mut requests: Requests, worker: KickWorker) {
    let conn = requests.try_clone_connection().ok();
    let conn_fd = conn.as_ref().map_or(-1, |c| c.as_raw_fd());
    *lock(&shared.shutdown) = conn;
    shared.connected.store(true, Ordering::Release);
    bump(&shared.counters.sessions, 1);
    lock(&shared.refusal).take();
    if shared.stop.load(Ordering::Acquire) {
        shutdown(shared);
    }
    let error = loop {
        // Look at the next message: QEMU's early SET_VRING_ENABLE (before SET_FEATURES) and
        // SEND_RARP are refused by the `vhost` crate but must still take effect.
        let peeked = peek(conn_fd);
        match requests.handle_request() {
            Ok(()) => {}
            // Refused before any state changed (the message was read whole): skip it.
            Err(Error::InactiveFeature(_)) | Err(Error::InactiveOperation(_)) => {
                bump(&shared.counters.refused_messages, 1);
                if let Some(Peeked::VringEnable(index, enable)) = peeked {
                    if shared.features.load(Ordering::Acquire) == 0 {
                        let _ = lock(handler).set_vring_enable(index, enable);
                    }
                }
            }
            // An unknown request to the crate, read whole: ours if it is a SEND_RARP.
            Err(Error::InvalidMessage) if matches!(peeked, Some(Peeked::Rarp(_))) => {
                if let Some(Peeked::Rarp(msg)) = peeked {
                    rarp::apply(shared, conn_fd, msg);
                }
            }
            Err(Error::Disconnected) | Err(Error::PartialMessage) => break None,
            Err(Error::SocketBroken(_)) => break None,
            Err(e) => {
                if matches!(peeked, Some(Peeked::LogBase)) {
                    bump(&shared.counters.dirty_logs_refused, 1);
                    break Some(format!("dirty log refused: {e}"));
                }
                let why = lock(&shared.refusal).take();
                break Some(why.map_or_else(|| e.to_string(), |why| format!("{e}: {why}")));
            }
        }
    };
    if let Some(e) = error.filter(|_| !shared.stop.load(Ordering::Acquire)) {
        *lock(&shared.last_error) = Some(e);
    }
    lock(&shared.shutdown).take();
    drop(requests);
    end_session(shared, Some(worker));
    bump(&shared.counters.disconnects, 1);
}

/// `VHOST_USER_SET_VRING_ENABLE` (request 18).
const SET_VRING_ENABLE: u32 = 18;
/// `VHOST_USER_SET_LOG_BASE` (request 6).
const SET_LOG_BASE: u32 = 6;

/// A message the request loop applies itself when the `vhost` crate refuses it.
#[derive(Debug, Clone, Copy)]
enum Peeked {
    /// `SET_VRING_ENABLE (index, enable)`.
    VringEnable(u32, bool),
    /// `SEND_RARP`.
    Rarp(rarp::SendRarp),
    /// `SET_LOG_BASE` (its refusals are counted: some are the `vhost` crate's, before the
    /// handler sees the message).
    LogBase,
}

/// The `SET_VRING_ENABLE`, `SEND_RARP` or `SET_LOG_BASE` message at the head of the
/// connection `fd`, without consuming it (`MSG_PEEK`; blocks until a message arrives, as the
/// request loop would). The first two are 20 bytes: a header of 12 and a payload of 8, waited
/// for whole once the header says so; the third is known by its header.
fn peek(fd: RawFd) -> Option<Peeked> {
    let mut buf = [0u8; 20];
    // SAFETY: peeks at most 12 bytes into a live buffer.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), 12, libc::MSG_PEEK) };
    let word = |b: &[u8; 20], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if n == 12 && word(&buf, 0) == SET_LOG_BASE {
        return Some(Peeked::LogBase);
    }
    if n != 12 || word(&buf, 8) != 8 {
        return None;
    }
    let flags = libc::MSG_PEEK | libc::MSG_WAITALL;
    // SAFETY: peeks at most 20 bytes into a live buffer; the payload follows its header.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n != 20 {
        return None;
    }
    if word(&buf, 0) == SET_VRING_ENABLE {
        return Some(Peeked::VringEnable(word(&buf, 12), word(&buf, 16) != 0));
    }
    rarp::parse(&buf).map(Peeked::Rarp)
}

/// Closes the current connection (the request loop then ends).
pub(crate) fn shutdown(shared: &Shared) {
    if let Some(s) = lock(&shared.shutdown).as_ref() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

/// Stops the kick worker and drops the session (unmapping guest memory).
fn end_session(shared: &Shared, worker: Option<KickWorker>) {
    drop(worker);
    let session = write(&shared.session).take();
    lock(&shared.log).take();
    shared.connected.store(false, Ordering::Release);
    shared.features.store(0, Ordering::Release);
    shared.quarantined.store(false, Ordering::Relaxed);
    drop(session);
}

fn run_server(shared: &Arc<Shared>, mut listener: Listener) {
    let fd = listener.as_raw_fd();
    while wait_readable(shared, Some(fd), -1) {
        let Some((handler, worker)) = new_session(shared) else {
            end_session(shared, None);
            continue;
        };
        // poll said a connection waits: accept does not block.
        let accepted = BackendListener::new(&mut listener, handler.clone())
            .and_then(|mut l| l.accept())
            .ok()
            .flatten();
        match accepted {
            Some(requests) => serve(shared, &handler, requests, worker),
            None => end_session(shared, Some(worker)),
        }
    }
    // Dropping the listener removes the socket file.
}

fn run_client(shared: &Arc<Shared>) {
    let min_ms = shared.config.reconnect_min_ms.max(1);
    let max_ms = shared.config.reconnect_max_ms.max(min_ms);
    let ms = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
    let path = shared.config.socket.to_string_lossy().into_owned();
    let mut backoff_ms = min_ms;
    while !shared.stop.load(Ordering::Acquire) {
        if let Some((handler, worker)) = new_session(shared) {
            match BackendReqHandler::connect(&path, handler.clone()) {
                Ok(requests) => {
                    serve(shared, &handler, requests, worker);
                    backoff_ms = min_ms;
                    // Even after a clean session, wait a little: a frontend that accepts and
                    // closes at once must not make us spin.
                    wait_readable(shared, None, ms(min_ms));
                    continue;
                }
                // Told before the failure is counted, so that whoever sees the count sees why.
                Err(e) => {
                    *lock(&shared.last_error) = Some(format!("cannot connect to {path}: {e}"))
                }
            }
            end_session(shared, Some(worker));
        } else {
            end_session(shared, None);
        }
        bump(&shared.counters.connect_failures, 1);
        // Returns early (false) when the port is stopped; the loop condition ends it.
        wait_readable(shared, None, ms(backoff_ms));
        backoff_ms = (backoff_ms * 2).min(max_ms);
    }
}
