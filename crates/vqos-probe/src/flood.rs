//! A paced UDP packet generator: small frames at rates iperf3 cannot reach.
//!
//! The C2QoS experiment needs neighbours that flood the switch with 64-byte frames fast enough
//! to make its forwarding core, not the generators, the bottleneck. iperf3 sends one datagram
//! per system call behind its own pacing and select loop and tops out at a few tens of
//! thousands of 64-byte frames per second on the lab's machine. This generator hands the kernel
//! up to [`FloodConfig::batch`] datagrams per `sendmmsg(2)` call from one connected socket.
//!
//! ## Behavior
//! - **Frame size** is the on-wire Ethernet frame without FCS: the UDP payload is
//!   `frame_bytes - 42` (Ethernet 14, IPv4 20, UDP 8 bytes of headers), at least 1 byte. The
//!   rate counts the same on-wire bytes, so `frame_bytes = 64, rate_bps = 100 Mbit/s` is
//!   195 312 frames per second — the unit in which the switch charges and reports.
//! - **Pacing**: an absolute schedule from the start (frame `i` is due at `i / pps`), so there
//!   is no drift. Each round sends every due frame, at most `batch` per call. When nothing is
//!   due it sleeps until the next frame is (yielding instead when that is under 50 µs away), so a
//!   paced generator leaves the CPU to others. `rate_bps = None` floods: every call is a full
//!   batch.
//! - **Falling behind** (the CPU was busy elsewhere): the schedule is never made up by more than
//!   [`MAX_CATCH_UP`] of frames; older ones are skipped and counted in
//!   [`FloodSummary::skipped`], so a generator that was starved does not answer with a
//!   line-rate burst.
//! - **Full queues**: a send the kernel refuses for lack of buffer (`ENOBUFS`, `EAGAIN`) counts
//!   the whole batch in [`FloodSummary::send_failures`] and goes on; any other error ends the
//!   run with [`ProbeError::Io`]. A UDP socket whose qdisc or device queue is full usually drops
//!   silently instead: what reached the far end is for the receiver (the switch's counters, in
//!   the lab) to say.
//! - **Stopping**: after `duration`, or once the `stop` flag is set (checked every round, and at
//!   least every 10 ms while pacing sleeps).
//! - **Greedy floods yield** ([`FloodConfig::greedy_nice`], off by default): a flood starts
//!   greedy, at nice value `greedy_nice`, and stays so while it asks for more than it gets —
//!   unpaced, or more than 1/10 of a 100 ms window's frames skipped; after 1 s of windows it
//!   kept up with it is well-behaved, at the thread's own nice value again, until it falls
//!   behind again. Lowering the value again needs CAP_SYS_NICE: without it a flood stays at
//!   `greedy_nice` once it was greedy. On a small machine shared by the switch and every
//!   tenant's sender, a spinning generator would otherwise take the CPU from the switch and
//!   from the well-behaved senders, which in a real host run on cores of their own.
//!
//! ## Limitations
//! Linux only (`sendmmsg`). IPv4 and IPv6 destinations both work; the frame-size arithmetic
//! assumes IPv4 headers (IPv6 frames are 20 bytes longer than stated).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::pace::{Greedy, Pacer, Step};
pub use crate::pace::{GREEDY_WINDOW, MAX_CATCH_UP};
use crate::{ProbeError, Protocol};

/// Ethernet, IPv4 and UDP header bytes in front of a UDP payload on the wire.
pub const UDP_OVERHEAD: usize = 14 + 20 + 8;

/// Smallest frame accepted (a 1-byte payload).
pub const MIN_FRAME: usize = UDP_OVERHEAD + 1;

/// Largest frame accepted (a standard 1500-byte MTU).
pub const MAX_FRAME: usize = 1514;

/// Most datagrams per `sendmmsg` call.
pub const MAX_BATCH: usize = 256;

/// What to send.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// Destination.
    pub to: SocketAddr,
    /// On-wire frame size in bytes (FCS not counted), [`MIN_FRAME`]..=[`MAX_FRAME`].
    pub frame_bytes: usize,
    /// On-wire bits per second; `None` sends as fast as the kernel takes them.
    pub rate_bps: Option<u64>,
    /// How long to send.
    pub duration: Duration,
    /// Datagrams per `sendmmsg` call, 1..=[`MAX_BATCH`].
    pub batch: usize,
    /// Nice value the sending thread takes while the flood is greedy (see the module docs);
    /// `None` leaves the thread's priority alone.
    pub greedy_nice: Option<i32>,
}

impl FloodConfig {
    /// 64-byte frames, unpaced, 10 s, batches of 32.
    pub fn new(to: SocketAddr) -> Self {
        FloodConfig {
            to,
            frame_bytes: 64,
            rate_bps: None,
            duration: Duration::from_secs(10),
            batch: 32,
            greedy_nice: None,
        }
    }

    fn validate(&self) -> Result<(), ProbeError> {
        let bad = |m: String| Err(ProbeError::InvalidArgument(m));
        if !(MIN_FRAME..=MAX_FRAME).contains(&self.frame_bytes) {
            return bad(format!(
                "frame size {} bytes: expected {MIN_FRAME}..={MAX_FRAME}",
                self.frame_bytes
            ));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return bad(format!("batch {}: expected 1..={MAX_BATCH}", self.batch));
        }
        if self.rate_bps == Some(0) {
            return bad("rate 0: leave the rate out to send unpaced".into());
        }
        if self.duration.is_zero() {
            return bad("duration 0".into());
        }
        if self.greedy_nice.is_some_and(|n| !(-20..=19).contains(&n)) {
            return bad(format!(
                "greedy nice {}: expected -20..=19",
                self.greedy_nice.unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// Frames per second at the configured rate (`None` when unpaced).
    pub fn frames_per_second(&self) -> Option<f64> {
        self.rate_bps
            .map(|r| r as f64 / (8.0 * self.frame_bytes as f64))
    }
}

/// What a flood did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FloodSummary {
    /// Datagrams the kernel accepted.
    pub sent_frames: u64,
    /// Their on-wire bytes (frame size × frames).
    pub sent_wire_bytes: u64,
    /// Datagrams refused for lack of buffer (`ENOBUFS`/`EAGAIN`).
    pub send_failures: u64,
    /// Scheduled frames skipped after the generator fell behind by more than [`MAX_CATCH_UP`].
    pub skipped: u64,
    /// `sendmmsg` calls.
    pub calls: u64,
    /// 100 ms windows the flood spent greedy (unpaced floods: all of them).
    pub greedy_windows: u64,
    /// Seconds from the first to the last send.
    pub elapsed_s: f64,
    /// On-wire bits per second the kernel accepted.
    pub sent_bps: f64,
}

/// Floods `cfg.to` until `cfg.duration` has passed or `stop` is set.
pub fn run_flood(cfg: &FloodConfig, stop: Option<&AtomicBool>) -> Result<FloodSummary, ProbeError> {
    cfg.validate()?;
    let bind: SocketAddr = if cfg.to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let connect_err = |source| ProbeError::Connect {
        protocol: Protocol::Udp,
        addr: cfg.to,
        source,
    };
    let sock = UdpSocket::bind(bind).map_err(connect_err)?;
    // Not connected: an unconnected socket is not told of the far end's ICMP "port
    // unreachable", so a flood at a port nobody listens on is not cut short by ECONNREFUSED.
    let (mut dst, dst_len) = sockaddr(cfg.to);
    let payload = vec![0x5au8; cfg.frame_bytes - UDP_OVERHEAD];
    // One iovec per datagram, all over the same payload and to the same address.
    let mut iov: Vec<libc::iovec> = (0..cfg.batch)
        .map(|_| libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: mmsghdr is plain data; zero is a valid "no name, no control" header.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_name = &mut dst as *mut libc::sockaddr_storage as *mut libc::c_void;
            m.msg_hdr.msg_namelen = dst_len;
            m.msg_hdr.msg_iov = v as *mut libc::iovec;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();

    let mut pacer = cfg.frames_per_second().map(Pacer::new);
    let mut s = FloodSummary::default();
    let start = Instant::now();
    let end = start + cfg.duration;
    let mut greedy = Greedy::new(cfg.greedy_nice);
    // Greedy until shown otherwise: a new flood must not take the CPU from the senders already
    // running while its first windows are judged.
    greedy.set(true);
    loop {
        if stop.is_some_and(|f| f.load(Ordering::Relaxed)) {
            break;
        }
        let now = Instant::now();
        if now >= end {
            break;
        }
        let n = match pacer.as_mut() {
            None => cfg.batch,
            Some(p) => {
                greedy.window(now - start, p.scheduled, p.skipped);
                match p.step(now - start, cfg.batch as u64) {
                    Step::Send(n) => n as usize,
                    Step::Wait(wait) => {
                        let wait = wait.min(end - now);
                        if wait > Duration::from_micros(50) {
                            // At most 10 ms at a time, so the stop flag is seen promptly.
                            std::thread::sleep(wait.min(Duration::from_millis(10)));
                        } else {
                            std::thread::yield_now();
                        }
                        continue;
                    }
                }
            }
        };
        // SAFETY: `msgs[..n]` are valid headers whose iovecs point into `payload`, which
        // outlives the call; the socket is open.
        let rc = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
        s.calls += 1;
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) => s.send_failures += n as u64,
                _ => {
                    return Err(ProbeError::Io {
                        context: "sendmmsg",
                        source: e,
                    })
                }
            }
        } else {
            let sent = rc as u64;
            s.sent_frames += sent;
            // A partial send: the rest of the batch was refused.
            s.send_failures += n as u64 - sent;
        }
    }
    s.skipped = pacer.as_ref().map_or(0, |p| p.skipped);
    s.greedy_windows = if pacer.is_none() {
        (start.elapsed().as_secs_f64() / GREEDY_WINDOW.as_secs_f64()).ceil() as u64
    } else {
        greedy.windows
    };
    drop(greedy);
    s.elapsed_s = start
        .elapsed()
        .as_secs_f64()
        .min(cfg.duration.as_secs_f64());
    s.sent_wire_bytes = s.sent_frames * cfg.frame_bytes as u64;
    if s.elapsed_s > 0.0 {
        s.sent_bps = s.sent_wire_bytes as f64 * 8.0 / s.elapsed_s;
    }
    Ok(s)
}

/// `addr` as a C socket address and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zero is a valid (unspecified) address.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A UDP sink on loopback that counts datagrams and their payload bytes until dropped.
    struct Sink {
        addr: SocketAddr,
        stop: Arc<AtomicBool>,
        /// Datagrams received so far.
        received: Arc<std::sync::atomic::AtomicU64>,
        thread: Option<std::thread::JoinHandle<(u64, u64, usize)>>,
    }

    impl Sink {
        fn start() -> Sink {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let addr = sock.local_addr().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let st = stop.clone();
            let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let rc = received.clone();
            let thread = std::thread::spawn(move || {
                let (mut n, mut bytes, mut last) = (0u64, 0u64, 0usize);
                let mut buf = [0u8; 2048];
                while !st.load(Ordering::Relaxed) {
                    if let Ok(len) = sock.recv(&mut buf) {
                        n += 1;
                        rc.store(n, Ordering::Relaxed);
                        bytes += len as u64;
                        last = len;
                    }
                }
                (n, bytes, last)
            });
            Sink {
                addr,
                stop,
                received,
                thread: Some(thread),
            }
        }

        fn finish(mut self) -> (u64, u64, usize) {
            std::thread::sleep(Duration::from_millis(50));
            self.stop.store(true, Ordering::Relaxed);
            self.thread.take().unwrap().join().unwrap()
        }
    }

    #[test]
    fn paced_flood_sends_the_scheduled_frames_of_the_stated_size() {
        let sink = Sink::start();
        let mut cfg = FloodConfig::new(sink.addr);
        cfg.frame_bytes = 100;
        // 2000 frames/s for 0.5 s: 1000 frames.
        cfg.rate_bps = Some(2000 * 100 * 8);
        cfg.duration = Duration::from_millis(500);
        let s = run_flood(&cfg, None).unwrap();
        let (got, bytes, last) = sink.finish();
        assert_eq!(last, 100 - UDP_OVERHEAD, "payload = frame - 42");
        assert_eq!(bytes, got * (100 - UDP_OVERHEAD) as u64);
        // The schedule is absolute: never more than the 1000 frames due (the schedule itself,
        // catching up and skipping when this thread was starved, is tested on a virtual clock
        // in `pace`; how many were due when the run ended depends on the machine's load).
        let accounted = s.sent_frames + s.send_failures + s.skipped;
        assert!(accounted <= 1001 && s.sent_frames > 0, "{s:?}");
        assert_eq!(s.sent_wire_bytes, s.sent_frames * 100);
        // Paced, a frame or a few per call (up to 5 ms of frames after a stall): never a
        // full batch of 32 at 2000 frames/s.
        assert!(s.calls * 10 >= s.sent_frames + s.send_failures, "{s:?}");
        assert!(got <= s.sent_frames, "{s:?}");
    }

    #[test]
    fn unpaced_flood_sends_full_batches_and_stops_on_the_flag() {
        let sink = Sink::start();
        let mut cfg = FloodConfig::new(sink.addr);
        cfg.duration = Duration::from_secs(30);
        cfg.batch = 16;
        let stop = AtomicBool::new(false);
        let s = std::thread::scope(|scope| {
            let h = scope.spawn(|| run_flood(&cfg, Some(&stop)));
            // Stopped once the sink has seen it send (however busy the machine is); if the
            // flag were ignored, the flood would run its 30 s and the join below would show
            // a full duration.
            while sink.received.load(Ordering::Relaxed) == 0 && !h.is_finished() {
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::Relaxed);
            h.join().unwrap().unwrap()
        });
        sink.finish();
        assert!(s.elapsed_s < 29.0, "the flag stops it: {s:?}");
        assert!(s.calls > 0 && s.sent_frames + s.send_failures == s.calls * 16);
        assert_eq!(s.skipped, 0);
    }

    /// The nice value of thread `tid` of this process, from /proc.
    fn task_nice(tid: i32) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // Fields after "(comm)": state is field 3, nice is field 19.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split_whitespace()
            .nth(19 - 3)
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn greedy_windows_are_counted_in_real_floods() {
        // The judgment itself is tested on a virtual clock in `pace`; here only what holds
        // whatever the machine's load: a paced flood is greedy in at most every window it
        // ran, an unpaced one in all of them.
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let run = |rate_bps: Option<u64>, ms: u64| {
            let mut cfg = FloodConfig::new(to);
            cfg.rate_bps = rate_bps;
            cfg.duration = Duration::from_millis(ms);
            // Its own thread, so the test runner's thread keeps its priority.
            std::thread::spawn(move || run_flood(&cfg, None).unwrap())
                .join()
                .unwrap()
        };
        let windows = |s: &FloodSummary| (s.elapsed_s / GREEDY_WINDOW.as_secs_f64()).ceil() as u64;
        let s = run(Some(1000 * 64 * 8), 300);
        assert!(s.greedy_windows <= windows(&s), "{s:?}");
        let s = run(None, 300);
        assert!(s.greedy_windows >= windows(&s), "{s:?}");
        assert_eq!(s.skipped, 0, "{s:?}");
    }

    #[test]
    fn a_greedy_flood_runs_at_its_nice_value_until_it_ends() {
        let stop = AtomicBool::new(false);
        let tid = std::sync::atomic::AtomicI32::new(0);
        let mut cfg = FloodConfig::new("127.0.0.1:9".parse().unwrap());
        cfg.duration = Duration::from_secs(30);
        cfg.greedy_nice = Some(10);
        // The nice value threads start with here (0 normally, 10 under `nice cargo test`).
        // SAFETY: gettid has no preconditions.
        let initial = task_nice(unsafe { libc::gettid() });
        let (during, after) = std::thread::scope(|scope| {
            let h = scope.spawn(|| {
                // SAFETY: gettid has no preconditions.
                tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
                run_flood(&cfg, Some(&stop)).unwrap();
                task_nice(tid.load(Ordering::SeqCst))
            });
            // Until the flood thread runs and has turned greedy (it does so before its first
            // send). No deadline: a busy machine only delays it; a flood that never turns
            // greedy ends after its 30 s and reading its gone thread's nice value fails.
            let during = loop {
                let t = tid.load(Ordering::SeqCst);
                if t != 0 && task_nice(t) == 10 {
                    break 10;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            stop.store(true, Ordering::Relaxed);
            (during, h.join().unwrap())
        });
        assert_eq!(during, 10, "an unpaced flood is greedy");
        // Lowering a nice value again needs CAP_SYS_NICE (the lab runs as root).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(
                after, initial,
                "the priority is restored when the flood ends"
            );
        }
    }

    #[test]
    fn nobody_listening_is_not_an_error() {
        // A port just closed: loopback answers with ICMP port unreachable.
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = FloodConfig::new(SocketAddr::from(([127, 0, 0, 1], port)));
        cfg.rate_bps = Some(1000 * 64 * 8);
        cfg.duration = Duration::from_millis(200);
        let s = run_flood(&cfg, None).unwrap();
        assert!(s.sent_frames > 0, "{s:?}");
        assert_eq!(s.send_failures, 0, "{s:?}");
    }

    #[test]
    fn ipv6_destinations_work() {
        let Ok(sock) = UdpSocket::bind("[::1]:0") else {
            return; // no IPv6 loopback here
        };
        let mut cfg = FloodConfig::new(sock.local_addr().unwrap());
        cfg.rate_bps = Some(1000 * 64 * 8);
        cfg.duration = Duration::from_millis(100);
        let s = run_flood(&cfg, None).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 128];
        assert_eq!(sock.recv(&mut buf).unwrap(), 64 - UDP_OVERHEAD);
        assert!(s.sent_frames > 0, "{s:?}");
    }

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let err = |f: fn(&mut FloodConfig)| {
            let mut c = FloodConfig::new(to);
            f(&mut c);
            run_flood(&c, None).unwrap_err().to_string()
        };
        assert!(err(|c| c.frame_bytes = 42).contains("frame size 42"));
        assert!(err(|c| c.frame_bytes = 9000).contains("frame size 9000"));
        assert!(err(|c| c.batch = 0).contains("batch 0"));
        assert!(err(|c| c.rate_bps = Some(0)).contains("rate 0"));
        assert!(err(|c| c.duration = Duration::ZERO).contains("duration 0"));
        assert!(err(|c| c.greedy_nice = Some(20)).contains("greedy nice 20"));
    }

    #[test]
    fn frames_per_second_counts_on_wire_bytes() {
        let mut c = FloodConfig::new("127.0.0.1:9".parse().unwrap());
        c.rate_bps = Some(100_000_000);
        assert_eq!(c.frames_per_second(), Some(100e6 / 512.0));
        c.rate_bps = None;
        assert_eq!(c.frames_per_second(), None);
    }
}
