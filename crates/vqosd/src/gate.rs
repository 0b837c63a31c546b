//! The TCP gate: one thread accepts TCP clients and reads their request heads with `poll(2)`,
//! so a client that has not yet sent a complete head with the right token costs a file
//! descriptor and a small buffer, never a thread or one of the few request slots.
//!
//! Any local user can reach the loopback port, and every local user shares the address
//! 127.0.0.1, so a bound per peer address would bound nothing. The gate defends the slots
//! instead by order and time:
//! - a head must arrive complete within the head deadline ([`Gate::head_timeout`], 2 s by
//!   default; 408 beyond);
//! - at most [`Gate::max_pending`] connections wait for their heads (256 by default); a new
//!   connection beyond that evicts the **oldest** waiting one (503). A client that sends its
//!   head right after connecting, as every real client does, is admitted within a few poll
//!   rounds, so a slowloris must open connections faster than that to push it out, and its
//!   trickling connections are the ones evicted;
//! - the bearer token is checked on the head, in the gate; only then is the connection given a
//!   slot ([`crate::server::MAX_TCP_CONNECTIONS`]) and a thread, which reads the body and answers.
//!
//! Every refusal is written without waiting (the answer is small and the send buffer empty);
//! the connection then stays in the poll set, half-closed, while what the client still sends is
//! drained for a bounded time, so it reads the status instead of a connection reset.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::http::{parse_request_head, HeadBuffer, HttpError, RequestHead, Response};

/// Default of [`Gate::head_timeout`].
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Default of [`Gate::max_pending`].
pub const MAX_PENDING_HEADS: usize = 256;
/// How long a refused connection is drained, at most.
const DRAIN_TIME: Duration = Duration::from_secs(1);
/// How many bytes a refused connection may still send, at most.
const DRAIN_BYTES: usize = 1024 * 1024;
/// Longest sleep in poll, so shutdown is seen even if no event wakes the thread.
const MAX_POLL: Duration = Duration::from_millis(500);

/// The gate's limits.
#[derive(Debug, Clone, Copy)]
pub struct Gate {
    /// Time a new connection has to send its complete head.
    pub head_timeout: Duration,
    /// Most connections waiting for their heads (or being drained after a refusal).
    pub max_pending: usize,
}

/// What a connection in the gate is doing.
enum Phase {
    /// Its head is arriving.
    Head(HeadBuffer),
    /// It was refused; what it still sends is read and discarded.
    Draining(usize),
}

/// A connection in the gate.
struct Waiting {
    /// The client.
    stream: TcpStream,
    /// Head or drain.
    phase: Phase,
    /// When the gate gives up on it.
    deadline: Instant,
}

/// What [`run`]'s caller decides for a connection whose head arrived.
pub enum Admit {
    /// The caller took the connection (a slot and a thread).
    Taken,
    /// Refuse it with this answer (wrong token, no free slot).
    Refuse(TcpStream, Response),
}

/// What became of a waiting connection after a read.
enum Step {
    /// Still waiting.
    Keep,
    /// Closed or failed: drop it.
    Drop,
    /// Head complete.
    Head(RequestHead),
    /// The head is invalid: refuse with this answer.
    Refuse(Response),
}

fn read_some(w: &mut Waiting) -> Step {
    let mut chunk = [0u8; 4096];
    loop {
        let n = match w.stream.read(&mut chunk) {
            Ok(0) => return Step::Drop,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Keep,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Step::Drop,
        };
        match &mut w.phase {
            Phase::Draining(drained) => {
                *drained += n;
                if *drained >= DRAIN_BYTES {
                    return Step::Drop;
                }
            }
            Phase::Head(buf) => match buf.push(&chunk[..n], "Request head") {
                Ok(None) => {}
                Ok(Some((head, rest))) => {
                    return match parse_request_head(&head, rest) {
                        Ok(h) => Step::Head(h),
                        Err(e) => Step::Refuse(failure(&e)),
                    }
                }
                Err(e) => return Step::Refuse(failure(&e)),
            },
        }
    }
}

fn failure(e: &HttpError) -> Response {
    Response::error(e.status().unwrap_or(400), e.to_string())
}

/// Writes `resp` without waiting, half-closes, and turns `w` into a draining connection.
fn refuse(w: &mut Waiting, resp: &Response) {
    let _ = resp.write_to(&mut w.stream);
    let _ = w.stream.shutdown(std::net::Shutdown::Write);
    w.phase = Phase::Draining(0);
    w.deadline = Instant::now() + DRAIN_TIME;
}

fn waiting(stream: TcpStream, phase: Phase, within: Duration) -> Waiting {
    Waiting {
        stream,
        phase,
        deadline: Instant::now() + within,
    }
}

/// Runs the gate on `listener` until `stopping` is set. `admit` gets each connection whose
/// head arrived complete; `on_accept_error` each failed accept (the listener is then not
/// polled for `backoff`, so a persistent error does not spin).
pub fn run(
    listener: &TcpListener,
    gate: Gate,
    stopping: &AtomicBool,
    backoff: Duration,
    mut on_accept_error: impl FnMut(&io::Error),
    mut admit: impl FnMut(TcpStream, RequestHead) -> Admit,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let max_pending = gate.max_pending.max(1);
    // Oldest first (the eviction order); expiry scans the whole (bounded) set.
    let mut conns: VecDeque<Waiting> = VecDeque::new();
    let mut paused_until: Option<Instant> = None;
    let mut fds: Vec<libc::pollfd> = Vec::new();
    while !stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        // A head past its deadline gets a 408 (and is drained); a drain past its deadline ends.
        conns.retain_mut(|w| {
            if w.deadline > now {
                return true;
            }
            match w.phase {
                Phase::Head(_) => {
                    refuse(w, &Response::error(408, "Request not received in time"));
                    true
                }
                Phase::Draining(_) => false,
            }
        });
        let listening = paused_until.is_none_or(|t| t <= now);
        if listening {
            paused_until = None;
        }
        let next = conns
            .iter()
            .map(|w| w.deadline)
            .chain(paused_until)
            .min()
            .map_or(MAX_POLL, |d| d.saturating_duration_since(now).min(MAX_POLL));
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: if listening { libc::POLLIN } else { 0 },
            revents: 0,
        });
        fds.extend(conns.iter().map(|w| libc::pollfd {
            fd: w.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        // Round up so a deadline 0.4 ms away does not become a busy loop of 0 ms polls.
        let timeout_ms = i32::try_from(next.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: fds is a valid array of fds.len() pollfd structures.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        // Reads first, so connections that were already waiting are served before any new one
        // can evict them.
        let mut kept = VecDeque::with_capacity(conns.len());
        for (mut w, pfd) in conns.drain(..).zip(&fds[1..]) {
            if pfd.revents == 0 {
                kept.push_back(w);
                continue;
            }
            match read_some(&mut w) {
                Step::Keep => kept.push_back(w),
                Step::Drop => {}
                Step::Refuse(resp) => {
                    refuse(&mut w, &resp);
                    kept.push_back(w);
                }
                Step::Head(head) => match admit(w.stream, head) {
                    Admit::Taken => {}
                    Admit::Refuse(stream, resp) => {
                        let mut w = waiting(stream, Phase::Draining(0), DRAIN_TIME);
                        refuse(&mut w, &resp);
                        kept.push_back(w);
                    }
                },
            }
        }
        conns = kept;
        if fds[0].revents != 0 {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if stream.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if conns.len() >= max_pending {
                            // The oldest waiting connection makes room.
                            if let Some(mut old) = conns.pop_front() {
                                let _ = old.stream.set_nonblocking(true);
                                let _ = Response::error(503, "Too many connections")
                                    .write_to(&mut old.stream);
                            }
                        }
                        conns.push_back(waiting(
                            stream,
                            Phase::Head(HeadBuffer::new()),
                            gate.head_timeout,
                        ));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                        ) => {}
                    Err(e) => {
                        if stopping.load(Ordering::SeqCst) {
                            break;
                        }
                        on_accept_error(&e);
                        paused_until = Some(Instant::now() + backoff);
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}
