//! The client: [`run_client`] sends timestamped requests at a fixed rate and measures the RTT of
//! each response.

use std::io::{self, ErrorKind, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::stats::{Counters, Summary};
use crate::wire::{FrameEvent, FrameReader, Header, Kind, MAX_SIZE, MIN_SIZE, PREFIX_LEN};
use crate::{ProbeError, Protocol, MIN_INTERVAL};

/// How often the receiver looks at the run's state while no response arrives.
const RECV_POLL: Duration = Duration::from_millis(10);
/// Longest sleep of the sender between checks of the abort flag.
const SEND_POLL: Duration = Duration::from_millis(50);
/// TCP connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Most requests one run may send.
const MAX_REQUESTS: u128 = 1 << 32;

/// What to measure. [`ClientConfig::new`] gives the defaults: 64-byte messages, one every
/// millisecond (1000/s) for 10 s, a response later than 1 s is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// The server's address.
    pub target: SocketAddr,
    /// Transport.
    pub protocol: Protocol,
    /// Message size in bytes, [`MIN_SIZE`]`..=`[`MAX_SIZE`] (without TCP's 4-byte length prefix).
    pub size: usize,
    /// Time between two requests (1 / rate), at least 1 µs.
    pub interval: Duration,
    /// How long to send; ⌈duration / interval⌉ requests are sent.
    pub duration: Duration,
    /// A response not back within this time is lost.
    pub timeout: Duration,
}

impl ClientConfig {
    /// The defaults for `target` over `protocol`.
    pub fn new(target: SocketAddr, protocol: Protocol) -> Self {
        ClientConfig {
            target,
            protocol,
            size: 64,
            interval: Duration::from_millis(1),
            duration: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
        }
    }

    /// Number of requests the run sends: ⌈duration / interval⌉.
    pub fn requests(&self) -> u64 {
        let n = self
            .duration
            .as_nanos()
            .div_ceil(self.interval.as_nanos().max(1));
        n.min(u128::from(u64::MAX)) as u64
    }

    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), ProbeError> {
        let bad = |m: String| Err(ProbeError::InvalidArgument(m));
        if !(MIN_SIZE..=MAX_SIZE).contains(&self.size) {
            return bad(format!(
                "size {} is outside {MIN_SIZE}..={MAX_SIZE} bytes",
                self.size
            ));
        }
        if self.interval < MIN_INTERVAL {
            return bad(format!(
                "interval {:?} is below {MIN_INTERVAL:?}",
                self.interval
            ));
        }
        if self.duration.is_zero() {
            return bad("duration must be positive".into());
        }
        if self.timeout.is_zero() {
            return bad("timeout must be positive".into());
        }
        if self.target.port() == 0 {
            return bad(format!("target {} has port 0", self.target));
        }
        if u128::from(self.requests()) > MAX_REQUESTS {
            return bad(format!(
                "{} requests (duration / interval) is more than one run can track",
                self.requests()
            ));
        }
        Ok(())
    }
}

/// State shared by the sender and the receiver.
struct Shared {
    /// Requests handed to the socket so far (updated before each send).
    sent: AtomicU64,
    /// Send time of the last request, ns since the epoch.
    last_send_ns: AtomicU64,
    /// The sender has finished.
    done: AtomicBool,
    /// Stop everything (an error on either side).
    abort: AtomicBool,
}

enum Tx {
    Udp(UdpSocket),
    Tcp(TcpStream),
}

enum Rx {
    Udp(UdpSocket, Vec<u8>),
    Tcp(TcpStream, Box<FrameReader>),
}

/// Result of one send: a lost request is counted, an error ends the run.
enum SendOutcome {
    Sent,
    Failed,
}

impl Tx {
    fn send(&mut self, msg: &[u8], target: SocketAddr) -> Result<SendOutcome, ProbeError> {
        match self {
            // Any UDP send error (no route yet, ENOBUFS under load, ICMP unreachable reported on
            // the connected socket) loses this request only.
            Tx::Udp(s) => Ok(match s.send(msg) {
                Ok(_) => SendOutcome::Sent,
                Err(_) => SendOutcome::Failed,
            }),
            Tx::Tcp(s) => match s.write_all(msg) {
                Ok(()) => Ok(SendOutcome::Sent),
                Err(e) if closed(&e) => Err(ProbeError::ConnectionClosed(target)),
                Err(source) => Err(ProbeError::Io {
                    context: "sending a request over TCP",
                    source,
                }),
            },
        }
    }
}

fn closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::BrokenPipe
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof
    )
}

impl Rx {
    /// The next message, or `None` when the poll interval passed without one.
    fn recv(&mut self, target: SocketAddr) -> Result<Option<&[u8]>, ProbeError> {
        match self {
            Rx::Udp(s, buf) => match s.recv(buf) {
                Ok(n) => Ok(Some(&buf[..n])),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock
                            | ErrorKind::TimedOut
                            | ErrorKind::Interrupted
                            | ErrorKind::ConnectionRefused
                    ) =>
                {
                    Ok(None)
                }
                Err(source) => Err(ProbeError::Io {
                    context: "receiving a UDP response",
                    source,
                }),
            },
            Rx::Tcp(s, reader) => match reader.poll(s) {
                Ok(FrameEvent::Frame) => Ok(Some(&reader.frame()[PREFIX_LEN..])),
                Ok(FrameEvent::Idle) => Ok(None),
                Ok(FrameEvent::Eof | FrameEvent::BadLength(_)) => {
                    Err(ProbeError::ConnectionClosed(target))
                }
                Err(e) if closed(&e) => Err(ProbeError::ConnectionClosed(target)),
                Err(source) => Err(ProbeError::Io {
                    context: "receiving a TCP response",
                    source,
                }),
            },
        }
    }
}

/// Matches responses to requests and records the samples.
struct Tracker {
    session: u32,
    size: usize,
    epoch: Instant,
    timeout_ns: u64,
    received: Vec<u64>,
    answered: u64,
    max_seq: Option<u64>,
    rtts_ns: Vec<u64>,
    counters: Counters,
}

impl Tracker {
    fn on_message(&mut self, msg: &[u8], sent: u64) {
        let now_ns = nanos(self.epoch.elapsed());
        let h = match Header::parse(msg) {
            Some(h)
                if h.kind == Kind::Response
                    && h.session == self.session
                    && msg.len() == self.size
                    && h.seq < sent
                    && h.send_ns <= now_ns =>
            {
                h
            }
            _ => {
                self.counters.foreign += 1;
                return;
            }
        };
        let (word, bit) = ((h.seq / 64) as usize, 1u64 << (h.seq % 64));
        if word >= self.received.len() {
            self.received.resize(word + 1, 0);
        }
        if self.received[word] & bit != 0 {
            self.counters.duplicates += 1;
            return;
        }
        self.received[word] |= bit;
        self.answered += 1;
        match self.max_seq {
            Some(m) if h.seq < m => self.counters.reordered += 1,
            _ => self.max_seq = Some(h.seq),
        }
        let rtt = now_ns - h.send_ns;
        if rtt > self.timeout_ns {
            self.counters.late += 1;
        } else {
            self.rtts_ns.push(rtt);
        }
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// A session id that differs between runs (and processes), so that a late echo of an earlier
/// run to the same port is not taken for one of this run.
fn session_id() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // splitmix64 finaliser over time, pid and a per-process counter.
    let mut z = t
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

fn connect(cfg: &ClientConfig) -> Result<(Tx, Rx), ProbeError> {
    let err = |source| ProbeError::Connect {
        protocol: cfg.protocol,
        addr: cfg.target,
        source,
    };
    match cfg.protocol {
        Protocol::Udp => {
            let local: SocketAddr = if cfg.target.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let s = UdpSocket::bind(local).map_err(err)?;
            s.connect(cfg.target).map_err(err)?;
            s.set_read_timeout(Some(RECV_POLL)).map_err(err)?;
            let r = s.try_clone().map_err(err)?;
            Ok((Tx::Udp(s), Rx::Udp(r, vec![0; MAX_SIZE + 1])))
        }
        Protocol::Tcp => {
            let s = TcpStream::connect_timeout(&cfg.target, CONNECT_TIMEOUT).map_err(err)?;
            s.set_nodelay(true).map_err(err)?;
            s.set_read_timeout(Some(RECV_POLL)).map_err(err)?;
            s.set_write_timeout(Some(cfg.timeout.max(Duration::from_secs(1))))
                .map_err(err)?;
            let r = s.try_clone().map_err(err)?;
            Ok((Tx::Tcp(s), Rx::Tcp(r, Box::new(FrameReader::new()))))
        }
    }
}

/// Runs one measurement against a server and returns its summary. Blocks for about
/// `duration` plus, at most, `timeout`.
///
/// Errors: [`ProbeError::InvalidArgument`] for a bad configuration, [`ProbeError::Connect`] when
/// the socket cannot be set up or the TCP connection is refused, [`ProbeError::ConnectionClosed`]
/// when the TCP server goes away during the run. A UDP server that does not answer is not an
/// error: every request is then lost.
pub fn run_client(cfg: ClientConfig) -> Result<Summary, ProbeError> {
    cfg.validate()?;
    let (mut tx, mut rx) = connect(&cfg)?;
    let session = session_id();
    let total = cfg.requests();
    let shared = Shared {
        sent: AtomicU64::new(0),
        last_send_ns: AtomicU64::new(0),
        done: AtomicBool::new(false),
        abort: AtomicBool::new(false),
    };
    let epoch = Instant::now();
    let mut tracker = Tracker {
        session,
        size: cfg.size,
        epoch,
        timeout_ns: nanos(cfg.timeout),
        received: Vec::new(),
        answered: 0,
        max_seq: None,
        rtts_ns: Vec::with_capacity(total.min(1 << 20) as usize),
        counters: Counters::default(),
    };

    let (send_result, recv_result) = thread::scope(|s| {
        let receiver = s.spawn(|| {
            let r = receive(&mut rx, &mut tracker, &cfg, &shared);
            if r.is_err() {
                shared.abort.store(true, Ordering::SeqCst);
            }
            r
        });
        let sent = send(&mut tx, &cfg, session, total, epoch, &shared);
        if sent.is_err() {
            shared.abort.store(true, Ordering::SeqCst);
        }
        shared.done.store(true, Ordering::SeqCst);
        let received = match receiver.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (sent, received)
    });
    recv_result?;
    let send_failures = send_result?;
    let elapsed_s = epoch.elapsed().as_secs_f64();
    let mut counters = tracker.counters;
    counters.sent = shared.sent.load(Ordering::SeqCst);
    counters.send_failures = send_failures;
    Ok(Summary::build(
        tracker.rtts_ns,
        counters,
        cfg.protocol,
        cfg.size,
        cfg.interval.as_nanos() as f64 / 1000.0,
        elapsed_s,
    ))
}

/// The sender: request `seq` leaves at `epoch + seq · interval`. Returns the number of requests
/// the socket refused (lost).
fn send(
    tx: &mut Tx,
    cfg: &ClientConfig,
    session: u32,
    total: u64,
    epoch: Instant,
    shared: &Shared,
) -> Result<u64, ProbeError> {
    let prefix = match cfg.protocol {
        Protocol::Udp => 0,
        Protocol::Tcp => PREFIX_LEN,
    };
    let mut buf = vec![0u8; prefix + cfg.size];
    if prefix > 0 {
        buf[..PREFIX_LEN].copy_from_slice(&(cfg.size as u32).to_le_bytes());
    }
    let interval_ns = cfg.interval.as_nanos();
    let mut failures = 0;
    for seq in 0..total {
        let offset = interval_ns * u128::from(seq);
        let target = epoch + Duration::from_nanos(offset.min(u128::from(u64::MAX)) as u64);
        wait_until(target, &shared.abort);
        if shared.abort.load(Ordering::SeqCst) {
            break;
        }
        let send_ns = nanos(epoch.elapsed());
        let header = Header {
            kind: Kind::Request,
            session,
            seq,
            send_ns,
        };
        header.encode_into(&mut buf[prefix..]);
        shared.last_send_ns.store(send_ns, Ordering::SeqCst);
        shared.sent.store(seq + 1, Ordering::SeqCst);
        if let SendOutcome::Failed = tx.send(&buf, cfg.target)? {
            failures += 1;
        }
    }
    Ok(failures)
}

fn wait_until(target: Instant, abort: &AtomicBool) {
    loop {
        let now = Instant::now();
        if now >= target || abort.load(Ordering::Relaxed) {
            return;
        }
        thread::sleep((target - now).min(SEND_POLL));
    }
}

/// The receiver: runs until the sender is done and every request is answered or timed out.
fn receive(
    rx: &mut Rx,
    tracker: &mut Tracker,
    cfg: &ClientConfig,
    shared: &Shared,
) -> Result<(), ProbeError> {
    loop {
        if shared.abort.load(Ordering::SeqCst) {
            return Ok(());
        }
        if shared.done.load(Ordering::SeqCst) {
            let sent = shared.sent.load(Ordering::SeqCst);
            let deadline =
                Duration::from_nanos(shared.last_send_ns.load(Ordering::SeqCst)) + cfg.timeout;
            if tracker.answered >= sent || tracker.epoch.elapsed() > deadline {
                return Ok(());
            }
        }
        if let Some(msg) = rx.recv(cfg.target)? {
            // Loaded after the message arrived: its request was counted before it was sent.
            tracker.on_message(msg, shared.sent.load(Ordering::SeqCst));
        }
    }
}
