//! The listeners: the root-only unix socket and the optional token-protected loopback TCP port.
//!
//! Each listener has an accept thread; each connection gets its own thread (at most
//! [`MAX_CONNECTIONS`] at once, beyond that the client gets a 503) that reads one request under
//! a timeout, answers it, and closes.
//!
//! The unix socket is bound inside a fresh private directory (mode 0700) next to its final path,
//! given mode 0600 and owner root (when running as root), and only then renamed into place, so
//! there is no moment where another user could connect. Peers are also checked with
//! `SO_PEERCRED`: only root and the daemon's own user are served.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::api::Api;
use crate::config::{Config, TcpConfig};
use crate::http::{read_request, Response, MAX_BODY_BYTES};

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 32;

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

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Path of the unix socket.
    pub socket_path: PathBuf,
    /// Optional TCP listener with its token.
    pub tcp: Option<TcpConfig>,
    /// Timeout of each read and write on a connection.
    pub io_timeout: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
}

impl ServerConfig {
    /// The listener settings of a daemon config, with default limits.
    pub fn from_config(c: &Config) -> ServerConfig {
        ServerConfig {
            socket_path: c.socket_path.clone(),
            tcp: c.tcp.clone(),
            io_timeout: Duration::from_secs(5),
            max_body_bytes: MAX_BODY_BYTES,
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
    /// Open connections (bounded by [`MAX_CONNECTIONS`]).
    connections: AtomicUsize,
    /// Requests being processed.
    in_flight: InFlight,
    /// Read/write timeout.
    io_timeout: Duration,
    /// Largest request body.
    max_body_bytes: usize,
}

/// Running listeners; dropping it shuts them down.
pub struct Server {
    shared: Arc<Shared>,
    /// The unix socket path and the (device, inode) we bound, to remove only our own socket.
    socket: Option<(PathBuf, (u64, u64))>,
    /// The TCP address actually bound.
    tcp_addr: Option<SocketAddr>,
    /// Raw fds of the listeners, to wake their accept calls.
    listener_fds: Vec<i32>,
    /// Accept threads.
    threads: Vec<JoinHandle<()>>,
}

/// Who may use a connection.
#[derive(Clone)]
enum Auth {
    /// Unix socket: root or the daemon's user, checked with SO_PEERCRED.
    PeerCred,
    /// TCP: `Authorization: Bearer <token>`.
    Bearer(Arc<String>),
}

impl Server {
    /// Binds the listeners and starts serving `api`.
    pub fn start(config: &ServerConfig, api: Arc<Api>) -> Result<Server, ServerError> {
        let shared = Arc::new(Shared {
            api,
            stopping: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            in_flight: InFlight::default(),
            io_timeout: config.io_timeout,
            max_body_bytes: config.max_body_bytes,
        });
        let tcp = match &config.tcp {
            Some(t) => Some((
                TcpListener::bind(t.addr).map_err(|source| ServerError::Tcp {
                    addr: t.addr,
                    source,
                })?,
                Arc::new(t.token.clone()),
            )),
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
            listener_fds: Vec::new(),
            threads: Vec::new(),
        };
        server.listener_fds.push(unix.as_raw_fd());
        let shared = server.shared.clone();
        server.threads.push(std::thread::spawn(move || {
            for conn in unix.incoming() {
                if shared.stopping.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = conn {
                    dispatch(&shared, stream, Auth::PeerCred);
                }
            }
        }));
        if let Some((listener, token)) = tcp {
            server.tcp_addr = listener.local_addr().ok();
            server.listener_fds.push(listener.as_raw_fd());
            let shared = server.shared.clone();
            server.threads.push(std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if shared.stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = conn {
                        dispatch(&shared, stream, Auth::Bearer(token.clone()));
                    }
                }
            }));
        }
        Ok(server)
    }

    /// The unix socket's path.
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|(p, _)| p.as_path())
    }

    /// The TCP address bound (with the real port when the config asked for port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
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

/// The uid of the process at the other end of a unix stream.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is a valid socket; cred and len point to writable memory of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
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

/// A connected stream of either listener.
trait Conn: Read + Write + Send + 'static {
    /// Sets the read and write timeouts.
    fn set_timeouts(&self, t: Duration) -> io::Result<()>;
    /// A 403 to send when the peer's credentials are not acceptable.
    fn peer_refused(&self) -> Option<Response>;
}

impl Conn for UnixStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }

    fn peer_refused(&self) -> Option<Response> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        match peer_uid(self) {
            Some(uid) if uid == 0 || uid == me => None,
            _ => Some(Response::error(403, "Only root may use the vqosd socket")),
        }
    }
}

impl Conn for TcpStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }

    fn peer_refused(&self) -> Option<Response> {
        None
    }
}

/// Decrements the connection count when a connection thread ends, even by panic.
struct ConnGuard(Arc<Shared>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

fn dispatch<C: Conn>(shared: &Arc<Shared>, mut stream: C, auth: Auth) {
    if stream.set_timeouts(shared.io_timeout).is_err() {
        return;
    }
    if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        let _ = Response::error(503, "Too many connections").write_to(&mut stream);
        return;
    }
    let guard = ConnGuard(shared.clone());
    let spawned = std::thread::Builder::new()
        .name("vqosd-conn".into())
        .spawn(move || {
            let shared = guard.0.clone();
            serve(&shared, stream, &auth);
            drop(guard);
        });
    // On spawn failure the closure (and so the guard and the stream) is dropped: the count is
    // restored and the client sees the connection close.
    drop(spawned);
}

fn serve<C: Conn>(shared: &Shared, mut stream: C, auth: &Auth) {
    if matches!(auth, Auth::PeerCred) {
        if let Some(resp) = stream.peer_refused() {
            let _ = resp.write_to(&mut stream);
            return;
        }
    }
    let req = match read_request(&mut stream, shared.max_body_bytes) {
        Ok(r) => r,
        Err(e) => {
            if let Some(status) = e.status() {
                let _ = Response::error(status, e.to_string()).write_to(&mut stream);
            }
            return;
        }
    };
    if let Auth::Bearer(token) = auth {
        let presented = req
            .header("authorization")
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        let ok = presented.is_some_and(|t| constant_time_eq(t.as_bytes(), token.as_bytes()));
        if !ok {
            let _ = Response::error(401, "Missing or wrong bearer token")
                .with_header("WWW-Authenticate", "Bearer")
                .write_to(&mut stream);
            return;
        }
    }
    {
        let mut count = lock(&shared.in_flight.count);
        if shared.stopping.load(Ordering::SeqCst) {
            drop(count);
            let _ = Response::error(503, "Shutting down").write_to(&mut stream);
            return;
        }
        *count += 1;
    }
    let resp = shared.api.handle(&req);
    {
        let mut count = lock(&shared.in_flight.count);
        *count -= 1;
        shared.in_flight.done.notify_all();
    }
    let _ = resp.write_to(&mut stream);
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
