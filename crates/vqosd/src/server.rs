//! The listeners: the root-only unix socket, the optional token-protected loopback TCP port, and
//! the optional read-only metrics port (`GET /metrics` only, no token).
//!
//! The unix socket has an accept thread; each of its connections gets its own thread that reads
//! one request, answers it, and closes, at most [`MAX_CONNECTIONS`] at once (503 beyond). The
//! whole request must arrive within the I/O timeout (a deadline, not a timeout per read), and the
//! answer must be taken within the same time. Unix peers are refused before they get a slot.
//!
//! The TCP port, which anyone on the host can reach, goes through the [`crate::gate`]:
//! one thread reads the heads of all TCP clients with poll(2) under a short head deadline,
//! checks the token, and only then gives the connection one of [`MAX_TCP_CONNECTIONS`] slots and
//! a thread, which reads the body and answers. Unauthenticated clients, however slow or many,
//! hold no slot, and the two listeners' slots are separate, so TCP clients cannot take the slots
//! root needs on the unix socket. An error answered before the whole request was read is
//! followed by a half-close and a short, bounded drain of the input, so the client reads the
//! status instead of a connection reset.
//!
//! The unix socket is bound inside a fresh private directory (mode 0700) next to its final path,
//! given mode 0600 and owner root (when running as root), and only then renamed into place, so
//! there is no moment where another user could connect. Peers are also checked with
//! `SO_PEERCRED`: only root and the daemon's own user are served.

use std::fs;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::api::Api;
use crate::config::{Config, TcpConfig};
use crate::gate::{self, Admit, Gate, HEAD_TIMEOUT, MAX_PENDING_HEADS};
use crate::http::{read_request_head, HttpError, RequestHead, Response, MAX_BODY_BYTES};

mod conn;
use conn::{Conn, Timed};

/// Most connections served at once on the unix socket.
pub const MAX_CONNECTIONS: usize = 32;
/// Most connections served at once on the TCP port.
pub const MAX_TCP_CONNECTIONS: usize = 8;
/// Pause of an accept loop after a failed accept (no file descriptors left, ...), so a
/// persistent error does not spin a core.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long, at most, the input is drained after an early error answer.
const DRAIN_TIME: Duration = Duration::from_secs(1);
/// How many bytes, at most, are drained after an early error answer.
const DRAIN_BYTES: usize = 1024 * 1024;
/// Drained without waiting after a 503/403 answered by the accept thread itself.
const DRAIN_NOW_BYTES: usize = 64 * 1024;

/// Why a listener could not be set up.
#[derive(Debug, Error)]
pub enum ServerError {
    /// Creating, binding or securing the unix socket failed.
    #[error("Cannot listen on {path}")]
    Unix {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A daemon already answers on the socket.
    #[error("Another vqosd is already listening on {0}")]
    InUse(PathBuf),
    /// Something that is not a socket sits at the socket path.
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    /// The TCP port is held by another program: vqosd refuses to start rather than leave
    /// its clients talking to that program (they would refuse to send it their token, see
    /// `vqos_api::peer`, but the switch would not be reachable either).
    #[error("TCP port {addr} is taken{}: another program listens there; stop it or set another api.tcp", match owner {
        Some(uid) => format!(" by uid {uid}"),
        None => String::new(),
    })]
    TcpTaken {
        /// The address.
        addr: SocketAddr,
        /// The owner of the listening socket, if the kernel's tables show it.
        owner: Option<u32>,
    },
    /// Binding the TCP port failed.
    #[error("Cannot listen on tcp {addr}")]
    Tcp {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Why `addr` could not be bound: taken (with the listener's owner where the kernel's tables
/// show it), or another error.
fn bind_error(addr: SocketAddr, source: io::Error) -> ServerError {
    if source.kind() != io::ErrorKind::AddrInUse {
        return ServerError::Tcp { addr, source };
    }
    let any = match addr {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let file = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let owner = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| vqos_api::peer::owner_in(&t, &addr, &any));
    ServerError::TcpTaken { addr, owner }
}

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Path of the unix socket.
    pub socket_path: PathBuf,
    /// Optional TCP listener with its token.
    pub tcp: Option<TcpConfig>,
    /// Optional read-only metrics listener.
    pub metrics: Option<SocketAddr>,
    /// Time allowed to receive a whole request, and again to send the whole answer.
    pub io_timeout: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Most connections at once on the unix socket.
    pub max_unix_connections: usize,
    /// Most connections at once on the TCP port (after their head and token were checked).
    pub max_tcp_connections: usize,
    /// Time a TCP client has to send its complete head (at most `io_timeout`).
    pub head_timeout: Duration,
    /// Most TCP connections waiting for their heads; a new one evicts the oldest.
    pub max_pending_heads: usize,
}

impl ServerConfig {
    /// The listener settings of a daemon config, with default limits.
    pub fn from_config(c: &Config) -> ServerConfig {
        ServerConfig {
            socket_path: c.socket_path.clone(),
            tcp: c.tcp.clone(),
            metrics: c.metrics_listen,
            io_timeout: Duration::from_secs(5),
            max_body_bytes: MAX_BODY_BYTES,
            max_unix_connections: MAX_CONNECTIONS,
            max_tcp_connections: MAX_TCP_CONNECTIONS,
            head_timeout: HEAD_TIMEOUT,
            max_pending_heads: MAX_PENDING_HEADS,
        }
    }
}

/// Counts requests being processed, so shutdown can wait for them to finish.
#[derive(Default)]
struct InFlight {
    /// Requests between "read" and "answered".
    count: Mutex<usize>,
    /// Signalled when `count` drops.
    done: Condvar,
}

/// State shared by the accept and connection threads.
struct Shared {
    api: Arc<Api>,
    /// Set once shutdown begins: accept loops exit, new requests get a 503.
    stopping: AtomicBool,
    /// Open connections of the unix socket, the TCP port and the metrics port, each bounded by
    /// its own limit.
    connections: [Slots; 3],
    /// Failed accept calls (both listeners).
    accept_errors: AtomicU64,
    /// Requests being processed.
    in_flight: InFlight,
    /// Deadline to receive a request, and to send its answer.
    io_timeout: Duration,
    /// Largest request body.
    max_body_bytes: usize,
}

/// The connection slots of one listener.
struct Slots {
    /// Open connections.
    open: AtomicUsize,
    /// Most open connections.
    max: usize,
}

/// Which listener a connection came from (index into [`Shared::connections`]).
#[derive(Clone, Copy)]
enum Listener {
    Unix = 0,
    Tcp = 1,
    Metrics = 2,
}

/// Running listeners; dropping it shuts them down.
pub struct Server {
    shared: Arc<Shared>,
    /// The unix socket path and the (device, inode) we bound, to remove only our own socket.
    socket: Option<(PathBuf, (u64, u64))>,
    /// The TCP address actually bound.
    tcp_addr: Option<SocketAddr>,
    /// The metrics address actually bound.
    metrics_addr: Option<SocketAddr>,
    /// Raw fds of the listeners, to wake their accept calls.
    listener_fds: Vec<i32>,
    /// Accept threads.
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds the listeners and starts serving `api`.
    pub fn start(config: &ServerConfig, api: Arc<Api>) -> Result<Server, ServerError> {
        let shared = Arc::new(Shared {
            api,
            stopping: AtomicBool::new(false),
            connections: [
                Slots {
                    open: AtomicUsize::new(0),
                    max: config.max_unix_connections,
                },
                Slots {
                    open: AtomicUsize::new(0),
                    max: config.max_tcp_connections,
                },
                Slots {
                    open: AtomicUsize::new(0),
                    max: config.max_tcp_connections,
                },
            ],
            accept_errors: AtomicU64::new(0),
            in_flight: InFlight::default(),
            io_timeout: config.io_timeout,
            max_body_bytes: config.max_body_bytes,
        });
        let tcp = match &config.tcp {
            Some(t) => Some((
                TcpListener::bind(t.addr).map_err(|source| bind_error(t.addr, source))?,
                Arc::new(t.token.clone()),
            )),
            None => None,
        };
        let metrics = match config.metrics {
            Some(addr) => Some(TcpListener::bind(addr).map_err(|source| bind_error(addr, source))?),
            None => None,
        };
        let unix = bind_private(&config.socket_path)?;
        let meta = fs::metadata(&config.socket_path).map_err(|source| ServerError::Unix {
            path: config.socket_path.clone(),
            source,
        })?;
        let mut server = Server {
            shared,
            socket: Some((config.socket_path.clone(), (meta.dev(), meta.ino()))),
            tcp_addr: None,
            metrics_addr: None,
            listener_fds: Vec::new(),
            threads: Vec::new(),
        };
        server.listener_fds.push(unix.as_raw_fd());
        let shared = server.shared.clone();
        server.threads.push(std::thread::spawn(move || {
            accept_loop(
                &shared,
                "unix socket",
                || unix.accept().map(|(s, _)| s),
                |s| dispatch(&shared, s),
            )
        }));
        let gate = Gate {
            head_timeout: config.head_timeout.min(config.io_timeout),
            max_pending: config.max_pending_heads,
        };
        if let Some((listener, token)) = tcp {
            server.tcp_addr = listener.local_addr().ok();
            server.gated(listener, gate, "tcp", move |shared, stream, head| {
                admit_tcp(shared, stream, head, Some(&token))
            });
        }
        if let Some(listener) = metrics {
            server.metrics_addr = listener.local_addr().ok();
            server.gated(listener, gate, "metrics", |shared, stream, head| {
                admit_tcp(shared, stream, head, None)
            });
        }
        Ok(server)
    }

    /// Serves a TCP listener through the gate; `admit` decides on each complete head.
    fn gated(
        &mut self,
        listener: TcpListener,
        gate: Gate,
        what: &'static str,
        admit: impl Fn(&Arc<Shared>, TcpStream, RequestHead) -> Admit + Send + 'static,
    ) {
        self.listener_fds.push(listener.as_raw_fd());
        let shared = self.shared.clone();
        self.threads.push(std::thread::spawn(move || {
            let mut last_log = None;
            let result = gate::run(
                &listener,
                gate,
                &shared.stopping,
                ACCEPT_BACKOFF,
                |e| note_accept_error(&shared, what, e, &mut last_log),
                |stream, head| admit(&shared, stream, head),
            );
            if let Err(e) = result {
                tracing::error!("The {what} listener stopped: {e}");
            }
        }));
    }

    /// How many accept calls failed so far (both listeners); each failure pauses its listener
    /// for [`ACCEPT_BACKOFF`].
    pub fn accept_errors(&self) -> u64 {
        self.shared.accept_errors.load(Ordering::Relaxed)
    }

    /// The unix socket's path.
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|(p, _)| p.as_path())
    }

    /// The TCP address bound (with the real port when the config asked for port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The metrics address bound (with the real port when the config asked for port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops accepting, waits for the requests being processed, and removes the socket.
    /// Idempotent; also run on drop.
    pub fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for fd in self.listener_fds.drain(..) {
            // Linux wakes a thread blocked in accept() on a listening socket that is shut
            // down; the accept thread then sees `stopping` and closes the listener.
            // SAFETY: the fd belongs to a listener still owned by its accept thread, which
            // is joined below, so it is open here.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut count = lock(&self.shared.in_flight.count);
        while *count > 0 {
            count = self
                .shared
                .in_flight
                .done
                .wait(count)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(count);
        if let Some((path, id)) = self.socket.take() {
            if let Ok(m) = fs::symlink_metadata(&path) {
                if (m.dev(), m.ino()) == id {
                    let _ = fs::remove_file(&path);
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Binds the unix socket at `path` so that it is never reachable by anyone but root.
fn bind_private(path: &Path) -> Result<UnixListener, ServerError> {
    let err = |source| ServerError::Unix {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(err)?;
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServerError::InUse(path.to_path_buf()));
            }
            // A stale socket left by a daemon that died.
            fs::remove_file(path).map_err(err)?;
        }
        Ok(_) => return Err(ServerError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let private = dir.join(format!(
        ".vqosd-bind.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(err)?;
    let tmp = private.join("s");
    let result = (|| {
        let listener = UnixListener::bind(&tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&tmp, Some(0), Some(0))?;
        }
        fs::rename(&tmp, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&private);
    result.map_err(err)
}

/// Compares two secrets in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Accepts connections until shutdown. A failed accept (EMFILE, ENFILE, ENOBUFS, ...) is
/// counted, logged at most every 10 s, and followed by a pause of [`ACCEPT_BACKOFF`]: the
/// pending connection stays in the backlog, so retrying at once would only spin.
fn accept_loop<C>(
    shared: &Shared,
    what: &str,
    mut accept: impl FnMut() -> io::Result<C>,
    mut dispatch: impl FnMut(C),
) {
    let mut last_log: Option<Instant> = None;
    loop {
        let conn = accept();
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        match conn {
            Ok(stream) => dispatch(stream),
            // A signal, or a client that gave up before we accepted it: nothing is wrong.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                note_accept_error(shared, what, &e, &mut last_log);
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
}

/// Counts a failed accept and logs it, at most every 10 s per listener.
fn note_accept_error(shared: &Shared, what: &str, e: &io::Error, last_log: &mut Option<Instant>) {
    let n = shared.accept_errors.fetch_add(1, Ordering::Relaxed) + 1;
    if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
        tracing::warn!(
            "Accept on the {what} failed: {e} ({n} failures so far); retrying every {} ms",
            ACCEPT_BACKOFF.as_millis()
        );
        *last_log = Some(Instant::now());
    }
}

/// Runs in a TCP gate's thread, so it never blocks: a TCP client whose head arrived is
/// refused (wrong token, no free slot) or given a slot and a thread that reads its body and
/// answers. `token: None` is the read-only metrics port: only `GET /metrics`, no token.
fn admit_tcp(
    shared: &Arc<Shared>,
    stream: TcpStream,
    head: RequestHead,
    token: Option<&str>,
) -> Admit {
    let listener = match token {
        Some(token) => {
            if !bearer_ok(head.header("authorization"), token) {
                let resp = Response::error(401, "Missing or wrong bearer token")
                    .with_header("WWW-Authenticate", "Bearer");
                return Admit::Refuse(stream, resp);
            }
            Listener::Tcp
        }
        None => {
            if head.path != "/metrics" {
                return Admit::Refuse(stream, Response::error(404, "Only /metrics is served here"));
            }
            if head.method != "GET" {
                let resp = Response::error(405, "Only GET is allowed").with_header("Allow", "GET");
                return Admit::Refuse(stream, resp);
            }
            Listener::Metrics
        }
    };
    let slots = &shared.connections[listener as usize];
    if slots.open.fetch_add(1, Ordering::SeqCst) >= slots.max {
        slots.open.fetch_sub(1, Ordering::SeqCst);
        return Admit::Refuse(stream, Response::error(503, "Too many connections"));
    }
    let guard = ConnGuard(shared.clone(), listener);
    let spawned = std::thread::Builder::new()
        .name("vqosd-conn".into())
        .spawn(move || {
            let shared = guard.0.clone();
            let mut stream = stream;
            if stream.set_nonblocking(false).is_ok() {
                // The body gets the request deadline, from now.
                let until = Instant::now() + shared.io_timeout;
                serve_head(&shared, &mut stream, head, until);
            }
            drop(guard);
        });
    // On spawn failure the closure (guard and stream) is dropped: the slot is freed and the
    // client sees the connection close.
    drop(spawned);
    Admit::Taken
}

/// Frees a connection slot when a connection thread ends, even by panic.
struct ConnGuard(Arc<Shared>, Listener);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connections[self.1 as usize]
            .open
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs in the unix socket's accept thread, so it never blocks: refuses the peer (only root
/// and the daemon's user, checked with SO_PEERCRED, before it holds a slot) or takes a slot
/// and hands the connection to a new thread.
fn dispatch(shared: &Arc<Shared>, mut stream: UnixStream) {
    if let Some(resp) = stream.peer_refused() {
        refuse_now(&mut stream, &resp);
        return;
    }
    let listener = Listener::Unix;
    let slots = &shared.connections[listener as usize];
    if slots.open.fetch_add(1, Ordering::SeqCst) >= slots.max {
        slots.open.fetch_sub(1, Ordering::SeqCst);
        refuse_now(&mut stream, &Response::error(503, "Too many connections"));
        return;
    }
    let guard = ConnGuard(shared.clone(), listener);
    let spawned = std::thread::Builder::new()
        .name("vqosd-conn".into())
        .spawn(move || {
            let shared = guard.0.clone();
            serve(&shared, stream);
            drop(guard);
        });
    // On spawn failure the closure (and so the guard and the stream) is dropped: the slot is
    // freed and the client sees the connection close.
    drop(spawned);
}

/// Answers `resp` from the accept thread without ever waiting: the answer is small and fits in
/// the empty send buffer of a new connection; whatever the client already sent is drained (up
/// to [`DRAIN_NOW_BYTES`]) so the close does not reset the connection over it.
fn refuse_now<C: Conn>(stream: &mut C, resp: &Response) {
    if stream.nonblocking(true).is_err() {
        return;
    }
    let _ = resp.write_to(stream);
    let _ = stream.shutdown_write();
    let mut buf = [0u8; 8192];
    let mut drained = 0;
    while drained < DRAIN_NOW_BYTES {
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => drained += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
}

/// Answers an error before the request was read to its end: writes `resp`, half-closes, and
/// reads what the client still sends for at most [`DRAIN_TIME`] and [`DRAIN_BYTES`]. Closing
/// with unread input would make the kernel reset the connection, and the client would see
/// ECONNRESET instead of the answer.
fn refuse<C: Conn>(shared: &Shared, stream: &mut C, resp: &Response) {
    if resp
        .write_to(&mut Timed::new(stream, shared.io_timeout))
        .is_err()
    {
        return;
    }
    if stream.shutdown_write().is_err() {
        return;
    }
    let mut input = Timed::new(stream, DRAIN_TIME);
    let mut buf = [0u8; 8192];
    let mut drained = 0;
    while drained < DRAIN_BYTES {
        match input.read(&mut buf) {
            Ok(n) if n > 0 => drained += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
}

/// The answer to a request that could not be read, `None` when the connection is unusable.
fn read_failure(e: &HttpError) -> Option<Response> {
    if e.is_timeout() {
        return Some(Response::error(408, "Request not received in time"));
    }
    e.status()
        .map(|status| Response::error(status, e.to_string()))
}

/// True when the head carries `Authorization: Bearer <token>`.
fn bearer_ok(authorization: Option<&str>, token: &str) -> bool {
    authorization
        .and_then(|h| h.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .is_some_and(|t| constant_time_eq(t.as_bytes(), token.as_bytes()))
}

/// Serves a unix socket connection: reads its head, then as [`serve_head`].
fn serve<C: Conn>(shared: &Shared, mut stream: C) {
    // One deadline for the whole request, head and body.
    let until = Instant::now() + shared.io_timeout;
    let mut input = Timed {
        conn: &mut stream,
        until,
    };
    let head = match read_request_head(&mut input) {
        Ok(h) => h,
        Err(e) => {
            if let Some(resp) = read_failure(&e) {
                refuse(shared, &mut stream, &resp);
            }
            return;
        }
    };
    serve_head(shared, &mut stream, head, until);
}

/// Reads the body of a request whose head (already authorised) arrived, by `until`, and
/// answers it.
fn serve_head<C: Conn>(shared: &Shared, stream: &mut C, head: RequestHead, until: Instant) {
    let mut input = Timed {
        conn: &mut *stream,
        until,
    };
    let req = match head.read_body(&mut input, shared.max_body_bytes) {
        Ok(r) => r,
        Err(e) => {
            if let Some(resp) = read_failure(&e) {
                refuse(shared, stream, &resp);
            }
            return;
        }
    };
    {
        let mut count = lock(&shared.in_flight.count);
        if shared.stopping.load(Ordering::SeqCst) {
            drop(count);
            let resp = Response::error(503, "Shutting down");
            let _ = resp.write_to(&mut Timed::new(stream, shared.io_timeout));
            return;
        }
        *count += 1;
    }
    let caller = stream.caller();
    let resp = shared.api.handle_as(&req, &caller);
    crate::logging::audit(&caller, &req, &resp);
    {
        let mut count = lock(&shared.in_flight.count);
        *count -= 1;
        shared.in_flight.done.notify_all();
    }
    // The answer gets a deadline of its own, from now.
    let _ = resp.write_to(&mut Timed::new(stream, shared.io_timeout));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_contents_and_lengths() {
        assert!(constant_time_eq(b"secret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-token", b"secret-tokeN"));
        assert!(!constant_time_eq(b"secret-token", b"secret-token2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
