//! The connections of the listeners: what the server needs of a unix or TCP stream ([`Conn`]),
//! the unix peer's uid (`SO_PEERCRED`), and reads and writes against one deadline ([`Timed`]).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::http::Response;

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

/// A connected stream of either listener.
pub(super) trait Conn: Read + Write + Send + 'static {
    /// Sets the timeout of the next reads (`None`: none).
    fn read_timeout_to(&self, t: Option<Duration>) -> io::Result<()>;
    /// Sets the timeout of the next writes (`None`: none).
    fn write_timeout_to(&self, t: Option<Duration>) -> io::Result<()>;
    /// Makes the stream (non-)blocking.
    fn nonblocking(&self, on: bool) -> io::Result<()>;
    /// Half-closes: no more writes, reads still possible.
    fn shutdown_write(&self) -> io::Result<()>;
    /// A 403 to send when the peer's credentials are not acceptable.
    fn peer_refused(&self) -> Option<Response>;
    /// Who is calling, for the audit log: `uid=N` on the unix socket, `token` on TCP.
    fn caller(&self) -> String;
}

impl Conn for UnixStream {
    fn read_timeout_to(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }

    fn write_timeout_to(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }

    fn nonblocking(&self, on: bool) -> io::Result<()> {
        self.set_nonblocking(on)
    }

    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }

    fn peer_refused(&self) -> Option<Response> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        match peer_uid(self) {
            Some(uid) if uid == 0 || uid == me => None,
            _ => Some(Response::error(403, "Only root may use the vqosd socket")),
        }
    }

    fn caller(&self) -> String {
        peer_uid(self).map_or_else(|| "uid=unknown".to_string(), |u| format!("uid={u}"))
    }
}

impl Conn for TcpStream {
    fn read_timeout_to(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }

    fn write_timeout_to(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }

    fn nonblocking(&self, on: bool) -> io::Result<()> {
        self.set_nonblocking(on)
    }

    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }

    fn peer_refused(&self) -> Option<Response> {
        None
    }

    fn caller(&self) -> String {
        // Only a client that presented the token gets this far on the control port (the
        // metrics port changes nothing, so it is never audited).
        "token".to_string()
    }
}

/// A connection read and written against deadlines: before each call the socket's timeout is
/// set to the time left, so the deadline bounds the whole exchange, however the peer paces it.
pub(super) struct Timed<'a, C: Conn> {
    /// The connection.
    pub(super) conn: &'a mut C,
    /// When the exchange must be done.
    pub(super) until: Instant,
}

impl<'a, C: Conn> Timed<'a, C> {
    /// `conn` with a deadline `within` from now.
    pub(super) fn new(conn: &'a mut C, within: Duration) -> Self {
        Timed {
            conn,
            until: Instant::now() + within,
        }
    }

    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(left)
    }
}

impl<C: Conn> Read for Timed<'_, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.conn.read_timeout_to(Some(left))?;
        self.conn.read(buf)
    }
}

impl<C: Conn> Write for Timed<'_, C> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.conn.write_timeout_to(Some(left))?;
        self.conn.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.conn.flush()
    }
}
