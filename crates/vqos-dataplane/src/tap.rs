//! [`TapPort`]: a Linux TAP device with the virtio-net header and TCP segmentation offload.
//!
//! ## Behavior
//! Opens `/dev/net/tun` non-blocking with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, sets the header
//! size to 12 bytes (`virtio_net_hdr_v1`, see [`crate::frame`]) and enables `TUN_F_CSUM |
//! TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN`: the kernel hands us TCP super-frames of up to
//! 64 KiB with a partial checksum, and accepts the same back, so bulk TCP crosses the switch in
//! few, large frames and the header travels unchanged from port to port.
//!
//! A port is *created* (the switch owns the interface: not persistent, it disappears when the
//! port is dropped), *owned* (the switch creates it persistent, so it outlives a restart of the
//! daemon with its guest's configuration, and re-attaches to it by name at the next start —
//! also when the interface was moved into a named network namespace under `/run/netns`; only
//! [`Port::release`], i.e. removing the port, deletes it), or *attached* to an existing
//! persistent TAP (which stays). [`TapPort::origin`] tells which happened. Finding an owned
//! TAP in a namespace means entering it (`setns`, CAP_SYS_ADMIN): when one under `/run/netns`
//! cannot be entered, opening an owned TAP that is not in the host's namespace fails
//! ([`PortError::NetnsUnsearchable`]) instead of creating a second one beside its guest's. The link is brought up with `SIOCSIFFLAGS`. The file
//! descriptor keeps working when the interface is moved to another network namespace.
//!
//! Frames move with one `read`/`write` system call each ([`TapIo::Syscall`], the default) or in
//! batches on an io_uring ([`TapIo::Uring`], [`TapPort::open_with`]; see [`crate::tap_uring`]).
//!
//! ## Queues
//! With more than one queue ([`TapPort::open_queues`], a port's `queues`), the TAP is made
//! (or attached) with `IFF_MULTI_QUEUE` and one descriptor per queue: the kernel spreads what
//! its side transmits over them by flow, as it does for a multiqueue virtio-net guest. The
//! port reads every queue, starting one queue further at each call so that none waits behind
//! a busy one; a short read means every queue was found empty. Its readiness descriptor is an
//! epoll instance over the queues (readable while any has frames). Threads that do not read
//! the port write through transmit queues of their own ([`Port::tx_queue`],
//! [`crate::tap_queue`]): queue 1, 2, … in turn, queue 0 being the reader's. The uplink's
//! arrivals are steered to the queue of the vif they are for ([`Port::steer_by_destination`],
//! [`crate::tap_steer`]), and its queues read within budgets ([`Port::budget_rx_queues`],
//! [`crate::tap_budget`]): a queue that spent its budget leaves the epoll set until it earned
//! it back.
//!
//! ## Limitations
//! - A vif TAP's queues are all read by one thread (the port's shard). An uplink TAP's are
//!   read one per thread ([`Port::rx_queue`] lends the last queue it still reads; queue 0 is
//!   never lent), when the downlink is scheduled.
//! - An existing TAP keeps how it was made: a single-queue TAP cannot be attached with
//!   `queues` above 1, nor a multiqueue one with 1 (the kernel refuses; the error says so).

use std::cell::Cell;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::frame::VNET_HDR_LEN;
use crate::port::{Batch, Port, PortError, PortIoCounters, PortStatus};
use crate::tap_budget::RxBudgets;
use crate::tap_queue::{epoll_over, set_polled, TapQueue};
use crate::tap_steer::Steering;
use crate::tap_uring::TapIo;
use vqos_api::stats::TapStatus;

/// Most queues of a TAP port (the kernel allows 256; 16 is what a guest's virtio-net offers
/// at most here, as for vhost-user ports).
pub const MAX_TAP_QUEUES: u16 = 16;

/// How a [`TapPort`] comes to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapMode {
    /// Create the interface; it is removed when the port is dropped. Fails if it exists.
    Create,
    /// Attach to an existing (persistent) TAP; it stays when the port is dropped.
    Attach,
    /// Create it persistent, or re-attach to the one a previous run left (here or in a named
    /// network namespace); it stays when the port is dropped (a daemon restart) and goes when
    /// the port is released (removed).
    Own,
}

/// What opening a [`TapPort`] did, for the daemon's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapOrigin {
    /// A new interface was made ([`TapMode::Create`], or [`TapMode::Own`] finding none).
    Created,
    /// [`TapMode::Own`] found the interface a previous run left, in the host's namespace
    /// (`netns: None`) or in the named network namespace `netns` (under `/run/netns`).
    Reattached {
        /// The named namespace it was found in.
        netns: Option<String>,
    },
    /// [`TapMode::Attach`]: an existing persistent TAP.
    Attached,
}

/// A TAP device opened for the switch.
#[derive(Debug)]
pub struct TapPort {
    /// Interface name.
    name: String,
    /// Its queues (one unless opened with several).
    queues: Vec<TapQueue>,
    /// The queue the next read starts with.
    next_rx: usize,
    /// The queue the next transmit queue handed out writes to.
    next_tx: Cell<usize>,
    /// With several queues, or as a lent queue: an epoll instance over them, the port's
    /// readiness descriptor, which a queue held for its read budget leaves.
    epoll: Option<OwnedFd>,
    /// Queues lent to other shards to read ([`Port::rx_queue`]): the last `lent` ones,
    /// which this port no longer reads.
    lent: Cell<usize>,
    /// The switch made it (Create, Own): releasing the port deletes it.
    owned: bool,
    /// Made, re-attached or attached.
    origin: TapOrigin,
    /// A queue lent to another shard ([`Port::rx_queue`]): its index among the TAP's
    /// queues, and how many there are (what its status reports under).
    lent_as: Option<(usize, usize)>,
    /// Read budgets of the queues it reads ([`crate::tap_budget`]; none by default).
    budgets: RxBudgets,
}

fn io_err(port: &str, op: &'static str) -> PortError {
    PortError::Io {
        port: port.to_string(),
        op,
        source: io::Error::last_os_error(),
    }
}

/// An `ifreq` holding `name` and `flags`.
fn ifreq(name: &str, flags: libc::c_short) -> Result<libc::ifreq, PortError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(PortError::BadName(name.to_string()));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = flags;
    Ok(req)
}

/// Brings interface `name` up (`SIOCGIFFLAGS` then `SIOCSIFFLAGS` with `IFF_UP`).
pub fn set_link_up(name: &str) -> Result<(), PortError> {
    let mut req = ifreq(name, 0)?;
    // SAFETY: socket() has no memory arguments; checked below.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io_err(name, "socket"));
    }
    // SAFETY: sock is a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: req is a valid ifreq that outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io_err(name, "SIOCGIFFLAGS"));
    }
    // SAFETY: the kernel filled the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io_err(name, "SIOCSIFFLAGS"));
    }
    Ok(())
}

/// Whether interface `name` exists in the calling thread's network namespace (asked through
/// a socket made there: `/sys` shows the namespace it was mounted in, not the thread's).
fn exists_here(name: &str) -> Result<bool, PortError> {
    let mut req = ifreq(name, 0)?;
    // SAFETY: socket() has no memory arguments; checked below.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io_err(name, "socket"));
    }
    // SAFETY: sock is a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: req is a valid ifreq that outlives the call.
    Ok(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) } == 0)
}

/// Runs `f` in the network namespace at `path`; an error if it cannot be entered (the file
/// cannot be opened, `setns` is refused).
fn in_netns<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    crate::sys::NetNs::open(path)?.run(f)
}

impl TapPort {
    /// Opens TAP `name` per `mode` with one queue, moving frames by `io` (see
    /// [`TapPort::open_queues`]).
    pub fn open_with(name: &str, mode: TapMode, io: TapIo) -> Result<TapPort, PortError> {
        Self::open_queues(name, mode, io, 1)
    }

    /// Opens TAP `name` per `mode` with `queues` queues (1 to [`MAX_TAP_QUEUES`]; above 1 with
    /// `IFF_MULTI_QUEUE`), moving frames by `io`. With [`TapIo::Uring`] every queue's ring is
    /// made first: where io_uring is not available (old kernel, a seccomp filter) this fails
    /// before any interface is created or attached.
    pub fn open_queues(
        name: &str,
        mode: TapMode,
        io: TapIo,
        queues: u16,
    ) -> Result<TapPort, PortError> {
        if !(1..=MAX_TAP_QUEUES).contains(&queues) {
            return Err(PortError::BadSetting {
                port: name.to_string(),
                message: format!("queues = {queues} is outside 1..={MAX_TAP_QUEUES}"),
            });
        }
        let ring_err = |source| PortError::Io {
            port: name.to_string(),
            op: "io_uring_setup",
            source,
        };
        if io == TapIo::Uring {
            // Fail before anything is made (the rings are made again on the queues).
            crate::tap_uring::UringIo::new().map_err(ring_err)?;
        }
        let mut port = Self::open_in(name, mode, queues)?;
        for q in &mut port.queues {
            q.set_io(io).map_err(ring_err)?;
        }
        Ok(port)
    }

    /// Opens TAP `name` per `mode` (one queue, one system call per frame), configures header
    /// and offloads, and brings the link up.
    pub fn open(name: &str, mode: TapMode) -> Result<TapPort, PortError> {
        Self::open_in(name, mode, 1)
    }

    /// [`TapPort::open`] with `queues` queues.
    fn open_in(name: &str, mode: TapMode, queues: u16) -> Result<TapPort, PortError> {
        if mode != TapMode::Own || exists_here(name)? {
            return Self::open_here(name, mode, queues);
        }
        // A TAP this switch owned may have been moved into a guest's namespace since: find it
        // there and attach from inside (TUNSETIFF looks names up in the caller's namespace;
        // the descriptor then works from anywhere). A namespace that cannot be searched fails
        // the open: creating the TAP here could leave its guest on a twin nobody reads.
        let mut unsearched = None;
        if let Ok(dir) = std::fs::read_dir("/run/netns") {
            for entry in dir.flatten() {
                let path = entry.path();
                let found = in_netns(&path, || match exists_here(name) {
                    Ok(true) => Ok(Some(Self::open_here(name, TapMode::Own, queues))),
                    Ok(false) => Ok(None),
                    Err(PortError::Io { source, .. }) => Err(source),
                    Err(e) => Err(io::Error::other(e.to_string())),
                })
                .and_then(|r| r);
                match found {
                    Ok(Some(opened)) => {
                        let netns = entry.file_name().to_string_lossy().into_owned();
                        return opened.map(|mut p| {
                            p.origin = TapOrigin::Reattached { netns: Some(netns) };
                            p
                        });
                    }
                    // Not a network namespace (a stale file an `ip netns del` left): nothing
                    // can hide there.
                    Ok(None) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(source) => {
                        unsearched.get_or_insert((path.display().to_string(), source));
                    }
                }
            }
        }
        if let Some((netns, source)) = unsearched {
            return Err(PortError::NetnsUnsearchable {
                port: name.to_string(),
                netns,
                source,
            });
        }
        Self::open_here(name, TapMode::Own, queues)
    }

    /// One queue of TAP `name` (`IFF_MULTI_QUEUE` when `multi`), opened in the calling thread's
    /// network namespace, with the header size and offloads set.
    fn open_queue(name: &str, multi: bool) -> Result<OwnedFd, PortError> {
        let mut flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        if multi {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        let mut req = ifreq(name, flags as libc::c_short)?;
        let path: &CStr = c"/dev/net/tun";
        // SAFETY: path is NUL-terminated; the result is checked.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io_err(name, "open /dev/net/tun"));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        // SAFETY: req is a valid ifreq that outlives the call.
        if unsafe { libc::ioctl(raw, libc::TUNSETIFF, &mut req) } < 0 {
            let source = io::Error::last_os_error();
            if source.raw_os_error() == Some(libc::EINVAL) && exists_here(name)? {
                return Err(PortError::BadSetting {
                    port: name.to_string(),
                    message: format!(
                        "the existing TAP was made {}: it cannot be opened with {} (TUNSETIFF: \
                         {source})",
                        if multi {
                            "with one queue"
                        } else {
                            "multiqueue"
                        },
                        if multi { "several queues" } else { "one" }
                    ),
                });
            }
            return Err(PortError::Io {
                port: name.to_string(),
                op: "TUNSETIFF",
                source,
            });
        }
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer, which is live.
        if unsafe { libc::ioctl(raw, libc::TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            return Err(io_err(name, "TUNSETVNETHDRSZ"));
        }
        let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
        // SAFETY: TUNSETOFFLOAD takes the feature bits as the integer argument itself.
        if unsafe { libc::ioctl(raw, libc::TUNSETOFFLOAD, libc::c_ulong::from(offloads)) } < 0 {
            return Err(io_err(name, "TUNSETOFFLOAD"));
        }
        Ok(fd)
    }

    /// [`TapPort::open`] in the calling thread's network namespace.
    fn open_here(name: &str, mode: TapMode, queues: u16) -> Result<TapPort, PortError> {
        let exists = exists_here(name)?;
        match (mode, exists) {
            (TapMode::Create, true) => return Err(PortError::Exists(name.to_string())),
            (TapMode::Attach, false) => return Err(PortError::Missing(name.to_string())),
            _ => {}
        }
        let multi = queues > 1;
        let first = Self::open_queue(name, multi)?;
        let persist = match mode {
            // The switch owns the interface: it must vanish with the port.
            TapMode::Create => Some(0),
            // It must outlive the daemon (a restart under running guests).
            TapMode::Own => Some(1),
            TapMode::Attach => None,
        };
        if let Some(p) = persist {
            // SAFETY: TUNSETPERSIST takes an integer argument.
            if unsafe { libc::ioctl(first.as_raw_fd(), libc::TUNSETPERSIST, p as libc::c_ulong) }
                < 0
            {
                return Err(io_err(name, "TUNSETPERSIST"));
            }
        }
        let mut fds = vec![first];
        for _ in 1..queues {
            fds.push(Self::open_queue(name, true)?);
        }
        let epoll = if multi {
            let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
            Some(epoll_over(&raw).map_err(|source| PortError::Io {
                port: name.to_string(),
                op: "epoll",
                source,
            })?)
        } else {
            None
        };
        set_link_up(name)?;
        let origin = match (mode, exists) {
            (TapMode::Attach, _) => TapOrigin::Attached,
            (TapMode::Own, true) => TapOrigin::Reattached { netns: None },
            _ => TapOrigin::Created,
        };
        Ok(TapPort {
            name: name.to_string(),
            queues: fds.into_iter().map(TapQueue::new).collect(),
            next_rx: 0,
            next_tx: Cell::new(1),
            epoll,
            lent: Cell::new(0),
            owned: mode != TapMode::Attach,
            origin,
            lent_as: None,
            budgets: RxBudgets::default(),
        })
    }

    /// Whether opening it made the interface, re-attached the one a previous run left, or
    /// attached an existing persistent TAP.
    pub fn origin(&self) -> &TapOrigin {
        &self.origin
    }

    /// How the port moves frames now (a ring that failed falls back to system calls).
    pub fn io(&self) -> TapIo {
        self.queues[0].io()
    }

    /// How many queues it has.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Reads what queue `q` holds into `batch` (tests: which queue a frame landed in).
    #[cfg(test)]
    pub(crate) fn recv_queue(&mut self, q: usize, batch: &mut Batch) -> Result<usize, PortError> {
        self.queues[q].recv(&self.name, batch, 64)
    }

    /// Creates TAP `name`, owned by the switch.
    pub fn create(name: &str) -> Result<TapPort, PortError> {
        Self::open(name, TapMode::Create)
    }

    /// Attaches to the existing persistent TAP `name`.
    pub fn attach(name: &str) -> Result<TapPort, PortError> {
        Self::open(name, TapMode::Attach)
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        let n = self.queues.len() - self.lent.get();
        let start = self.next_rx % n;
        // The next call starts one queue further, whatever this one finds.
        self.next_rx = (start + 1) % n;
        let mut got = 0;
        for k in 0..n {
            let i = (start + k) % n;
            let q = &mut self.queues[i];
            if self.budgets.budgeted(i) {
                // A frame at a time, each charged before the next: a read overdraws the
                // budget by one frame at most, never by a batch of super-frames.
                while got < max_frames && self.budgets.readable(i) {
                    let bytes = q.counters.rx_bytes;
                    if q.recv(&self.name, batch, 1)? == 0 {
                        break;
                    }
                    got += 1;
                    self.budgets.charge(i, q.counters.rx_bytes - bytes);
                }
            } else {
                got += q.recv(&self.name, batch, max_frames - got)?;
            }
            if got >= max_frames || batch.is_full() {
                break;
            }
        }
        Ok(got)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        self.queues[0].send(batch, indices)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(match &self.epoll {
            Some(ep) => ep.as_raw_fd(),
            None => self.queues[0].raw_fd(),
        })
    }

    fn counters(&self) -> PortIoCounters {
        let mut c = PortIoCounters::default();
        for q in &self.queues {
            c.add(&q.counters);
        }
        c
    }

    fn release(&mut self) {
        if self.owned {
            // Not persistent any more: the interface goes when the last descriptor closes. A
            // failure leaves it behind (persistent), which is all this can do.
            // SAFETY: TUNSETPERSIST takes an integer argument.
            unsafe {
                libc::ioctl(
                    self.queues[0].raw_fd(),
                    libc::TUNSETPERSIST,
                    0 as libc::c_ulong,
                )
            };
        }
    }

    fn status(&self) -> Option<PortStatus> {
        if let (Some((i, n)), Some(q)) = (self.lent_as, self.queues.first()) {
            // A lent queue: its count at its index, for the shards' stats to add up.
            let mut queue_rx_frames = vec![0; n];
            queue_rx_frames[i] = q.counters.rx_frames;
            return Some(PortStatus::Tap(TapStatus {
                queue_rx_frames,
                budget_holds: self.budgets.holds,
            }));
        }
        (self.queues.len() > 1).then(|| {
            PortStatus::Tap(TapStatus {
                queue_rx_frames: self.queues.iter().map(|q| q.counters.rx_frames).collect(),
                budget_holds: self.budgets.holds,
            })
        })
    }

    fn steer_by_destination(&self) -> Result<Option<Steering>, PortError> {
        if self.queues.len() < 2 || self.lent_as.is_some() {
            return Ok(None);
        }
        Steering::attach(self.queues[0].raw_fd(), self.queues.len())
            .map(Some)
            .map_err(|source| {
                // A program a previous run left would steer by a map nobody updates: the
                // arrivals go back to the flow hash, as the caller is told.
                let _ = Steering::detach(self.queues[0].raw_fd());
                PortError::Io {
                    port: self.name.clone(),
                    op: "steering program",
                    source,
                }
            })
    }

    fn budget_rx_queues(&mut self, max_bps: &[Option<u64>], now_ns: u64) {
        if self.epoll.is_none() {
            return;
        }
        match self.lent_as {
            // A lent queue: the budget of its index among the TAP's queues.
            Some((i, _)) => self
                .budgets
                .set(&[max_bps.get(i).copied().flatten()], now_ns),
            None => {
                let own = self.queues.len() - self.lent.get();
                self.budgets.set(&max_bps[..own.min(max_bps.len())], now_ns);
            }
        }
    }

    fn refill_rx_budgets(&mut self, now_ns: u64) -> Option<u64> {
        let (Some(ep), true) = (&self.epoll, self.budgets.any() || self.budgets.holds > 0) else {
            return None;
        };
        // Queues lent since have no budget here.
        self.budgets.truncate(self.queues.len() - self.lent.get());
        let holds = self.budgets.refill(now_ns);
        let ctl = |on, q: usize| set_polled(ep.as_fd(), self.queues[q].raw_fd(), q, on);
        for &q in &holds.hold {
            if !ctl(false, q) {
                // Still polled: held, it would wake the loop for nothing at every poll. Its
                // budget goes instead (read as before budgets; counted).
                self.budgets.forget(q);
            }
        }
        for &q in &holds.release {
            // A queue that cannot be polled again is still read whenever another queue's
            // frames wake the port; counted.
            if !ctl(true, q) {
                self.budgets.failures += 1;
            }
        }
        holds.wake_at
    }

    fn tx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        let n = self.queues.len();
        // Queue 0 is the reader's own when there are others.
        let q = if n == 1 { 0 } else { self.next_tx.get() % n };
        self.next_tx
            .set(if q + 1 >= n { 1.min(n - 1) } else { q + 1 });
        Ok(Some(Box::new(self.queues[q].tx_handle(&self.name)?)))
    }

    /// The last queue this port still reads, lent to another shard to read and send on
    /// (the kernel spreads what the host sends into the TAP over its queues by flow); `None`
    /// when only queue 0 is left. The uplink's queues, read on every shard.
    fn rx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        let own = self.queues.len() - self.lent.get();
        let (Some(ep), true) = (&self.epoll, own > 1) else {
            return Ok(None);
        };
        let q = &self.queues[own - 1];
        let fd = q.dup_fd().map_err(|source| PortError::Io {
            port: self.name.clone(),
            op: "dup",
            source,
        })?;
        // Its reader holds it out of an epoll set of its own when its budget is spent (as
        // this port does with the queues it keeps), so the reader's loop never spins on it.
        let own_set = epoll_over(&[fd.as_raw_fd()]).map_err(|source| PortError::Io {
            port: self.name.clone(),
            op: "epoll",
            source,
        })?;
        // A queue held for its budget is out of the set already.
        if !set_polled(ep.as_fd(), q.raw_fd(), own - 1, false) && !self.budgets.is_held(own - 1) {
            return Err(io_err(&self.name, "epoll_ctl"));
        }
        // Its budget here is dropped at the next refill: its reader keeps one of its own.
        self.lent.set(self.lent.get() + 1);
        let mut queue = TapQueue::new(fd);
        // A ring that cannot be made leaves the reader on system calls: it still works.
        let _ = queue.set_io(q.io());
        Ok(Some(Box::new(TapPort {
            name: self.name.clone(),
            queues: vec![queue],
            next_rx: 0,
            next_tx: Cell::new(0),
            epoll: Some(own_set),
            lent: Cell::new(0),
            // The interface is this port's to keep or delete, not the reader's.
            owned: false,
            origin: TapOrigin::Attached,
            lent_as: Some((own - 1, self.queues.len())),
            budgets: RxBudgets::default(),
        })))
    }
}

#[cfg(test)]
#[path = "tap_tests.rs"]
mod tests;
