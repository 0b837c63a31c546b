//! The echo server: [`spawn_server`] runs it on background threads until [`ServerHandle::stop`].

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::wire::{answer_in_place, FrameEvent, FrameReader, MAX_SIZE, PREFIX_LEN};
use crate::{ProbeError, Protocol};

/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// How long a TCP echo may block on a client that does not read before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// What to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address to bind; port 0 picks a free port (see [`ServerHandle::local_addr`]).
    pub bind: SocketAddr,
    /// Transport.
    pub protocol: Protocol,
}

impl ServerConfig {
    /// A server for `protocol` on `bind`.
    pub fn new(bind: SocketAddr, protocol: Protocol) -> Self {
        ServerConfig { bind, protocol }
    }
}

/// Counters of a running server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests answered.
    pub echoed: u64,
    /// Datagrams or frames ignored: malformed, foreign, responses, bad TCP length prefixes.
    pub ignored: u64,
    /// TCP connections accepted (0 for UDP).
    pub connections: u64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    echoed: AtomicU64,
    ignored: AtomicU64,
    connections: AtomicU64,
}

/// A running server; stops (and joins its threads) on [`ServerHandle::stop`] or when dropped.
pub struct ServerHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The bound address (with the actual port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            echoed: self.shared.echoed.load(Ordering::Relaxed),
            ignored: self.shared.ignored.load(Ordering::Relaxed),
            connections: self.shared.connections.load(Ordering::Relaxed),
        }
    }

    /// Stops the server, waits for its threads and returns the final counters.
    pub fn stop(mut self) -> ServerStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("local_addr", &self.local_addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Binds the server's socket (errors are returned here, synchronously) and serves on background
/// threads.
pub fn spawn_server(cfg: ServerConfig) -> Result<ServerHandle, ProbeError> {
    let bind_err = |source| ProbeError::Bind {
        protocol: cfg.protocol,
        addr: cfg.bind,
        source,
    };
    let shared = Arc::new(Shared::default());
    let (local_addr, thread) = match cfg.protocol {
        Protocol::Udp => {
            let sock = UdpSocket::bind(cfg.bind).map_err(bind_err)?;
            sock.set_read_timeout(Some(POLL)).map_err(bind_err)?;
            let addr = sock.local_addr().map_err(bind_err)?;
            let sh = shared.clone();
            (addr, thread::spawn(move || serve_udp(sock, &sh)))
        }
        Protocol::Tcp => {
            let listener = TcpListener::bind(cfg.bind).map_err(bind_err)?;
            listener.set_nonblocking(true).map_err(bind_err)?;
            let addr = listener.local_addr().map_err(bind_err)?;
            let sh = shared.clone();
            (addr, thread::spawn(move || serve_tcp(listener, sh)))
        }
    };
    Ok(ServerHandle {
        local_addr,
        shared,
        thread: Some(thread),
    })
}

fn serve_udp(sock: UdpSocket, sh: &Shared) {
    let mut buf = vec![0u8; MAX_SIZE + 1];
    while !sh.stop.load(Ordering::Relaxed) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => {
                // E.g. a queued ICMP error: nothing to answer; avoid spinning on a persistent one.
                thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        let msg = &mut buf[..n];
        if answer_in_place(msg) {
            // A send error (e.g. the client is gone) is the client's loss, not the server's.
            if sock.send_to(msg, from).is_ok() {
                sh.echoed.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            sh.ignored.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn serve_tcp(listener: TcpListener, sh: Arc<Shared>) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                sh.connections.fetch_add(1, Ordering::Relaxed);
                conns.retain(|h| !h.is_finished());
                let sh = sh.clone();
                conns.push(thread::spawn(move || serve_conn(stream, &sh)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
    for h in conns {
        let _ = h.join();
    }
}

fn serve_conn(mut stream: TcpStream, sh: &Shared) {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_nodelay(true))
        .and_then(|_| stream.set_read_timeout(Some(POLL)))
        .and_then(|_| stream.set_write_timeout(Some(WRITE_TIMEOUT)));
    if setup.is_err() {
        return;
    }
    let mut reader = FrameReader::new();
    while !sh.stop.load(Ordering::Relaxed) {
        match reader.poll(&mut stream) {
            Ok(FrameEvent::Frame) => {
                let frame = reader.frame();
                if answer_in_place(&mut frame[PREFIX_LEN..]) {
                    if stream.write_all(frame).is_err() {
                        return;
                    }
                    sh.echoed.fetch_add(1, Ordering::Relaxed);
                } else {
                    sh.ignored.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(FrameEvent::Idle) => {}
            Ok(FrameEvent::BadLength(_)) => {
                sh.ignored.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(FrameEvent::Eof) | Err(_) => return,
        }
    }
}
