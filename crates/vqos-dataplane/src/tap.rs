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
//! ## Limitations
//! One queue per TAP (no `IFF_MULTI_QUEUE`).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::frame::VNET_HDR_LEN;
use crate::port::{Batch, Port, PortError, PortIoCounters};
use crate::tap_uring::{TapIo, UringIo};

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
    /// The queue's file descriptor (non-blocking).
    fd: OwnedFd,
    /// I/O counters.
    counters: PortIoCounters,
    /// The switch made it (Create, Own): releasing the port deletes it.
    owned: bool,
    /// The port's io_uring when it moves frames in batches ([`TapIo::Uring`]).
    uring: Option<UringIo>,
    /// Made, re-attached or attached.
    origin: TapOrigin,
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
    /// Opens TAP `name` per `mode`, moving frames by `io`. With [`TapIo::Uring`] the ring is
    /// made first: where io_uring is not available (old kernel, a seccomp filter) this fails
    /// before any interface is created or attached.
    pub fn open_with(name: &str, mode: TapMode, io: TapIo) -> Result<TapPort, PortError> {
        let uring = match io {
            TapIo::Syscall => None,
            TapIo::Uring => Some(UringIo::new().map_err(|source| PortError::Io {
                port: name.to_string(),
                op: "io_uring_setup",
                source,
            })?),
        };
        let mut port = Self::open(name, mode)?;
        port.uring = uring;
        Ok(port)
    }

    /// Opens TAP `name` per `mode` (one system call per frame), configures header and
    /// offloads, and brings the link up.
    pub fn open(name: &str, mode: TapMode) -> Result<TapPort, PortError> {
        if mode != TapMode::Own || exists_here(name)? {
            return Self::open_here(name, mode);
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
                    Ok(true) => Ok(Some(Self::open_here(name, TapMode::Own))),
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
        Self::open_here(name, TapMode::Own)
    }

    /// [`TapPort::open`] in the calling thread's network namespace.
    fn open_here(name: &str, mode: TapMode) -> Result<TapPort, PortError> {
        let flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        let mut req = ifreq(name, flags)?;
        let exists = exists_here(name)?;
        match (mode, exists) {
            (TapMode::Create, true) => return Err(PortError::Exists(name.to_string())),
            (TapMode::Attach, false) => return Err(PortError::Missing(name.to_string())),
            _ => {}
        }
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
            return Err(io_err(name, "TUNSETIFF"));
        }
        let persist = match mode {
            // The switch owns the interface: it must vanish with the port.
            TapMode::Create => Some(0),
            // It must outlive the daemon (a restart under running guests).
            TapMode::Own => Some(1),
            TapMode::Attach => None,
        };
        if let Some(p) = persist {
            // SAFETY: TUNSETPERSIST takes an integer argument.
            if unsafe { libc::ioctl(raw, libc::TUNSETPERSIST, p as libc::c_ulong) } < 0 {
                return Err(io_err(name, "TUNSETPERSIST"));
            }
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
        set_link_up(name)?;
        let origin = match (mode, exists) {
            (TapMode::Attach, _) => TapOrigin::Attached,
            (TapMode::Own, true) => TapOrigin::Reattached { netns: None },
            _ => TapOrigin::Created,
        };
        Ok(TapPort {
            name: name.to_string(),
            fd,
            counters: PortIoCounters::default(),
            owned: mode != TapMode::Attach,
            uring: None,
            origin,
        })
    }

    /// Whether opening it made the interface, re-attached the one a previous run left, or
    /// attached an existing persistent TAP.
    pub fn origin(&self) -> &TapOrigin {
        &self.origin
    }

    /// How the port moves frames now (a ring that failed falls back to system calls).
    pub fn io(&self) -> TapIo {
        if self.uring.is_some() {
            TapIo::Uring
        } else {
            TapIo::Syscall
        }
    }

    /// [`Port::recv_batch`] on the io_uring.
    fn recv_uring(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        let raw = self.fd.as_raw_fd();
        let Some(uring) = self.uring.as_mut() else {
            return Ok(0);
        };
        let got = uring.recv(raw, batch, max_frames);
        self.counters.rx_frames += got.frames as u64;
        self.counters.rx_bytes += got.bytes;
        self.counters.rx_errors += got.errors;
        let failure = match (got.ring_error, got.read_error) {
            (Some(source), _) => {
                // The ring is broken: plain system calls from now on (every read it made has
                // completed, see `UringIo`).
                self.uring = None;
                self.counters.uring_failures += 1;
                Some(("io_uring_enter", source))
            }
            (None, Some(source)) => Some(("read", source)),
            (None, None) => None,
        };
        match failure {
            // The frames read stay in the batch; the error tells the switch to retry the port.
            Some((op, source)) => Err(PortError::Io {
                port: self.name.clone(),
                op,
                source,
            }),
            None => Ok(got.frames),
        }
    }

    /// [`Port::send_batch`] on the io_uring.
    fn send_uring(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        let raw = self.fd.as_raw_fd();
        let Some(uring) = self.uring.as_mut() else {
            return Ok(0);
        };
        let (sent, failure) = uring.send(raw, batch, indices);
        self.count_sent(batch, &indices[..sent]);
        if failure.is_some() {
            // The ring is broken and wrote nothing after `sent`: the rest goes by plain system
            // calls, now and from now on.
            self.uring = None;
            self.counters.uring_failures += 1;
            return Ok(sent + self.send_batch(batch, &indices[sent..])?);
        }
        self.counters.tx_errors += (indices.len() - sent) as u64;
        Ok(sent)
    }

    /// Counts frames `indices` of `batch` as written.
    fn count_sent(&mut self, batch: &Batch, indices: &[u8]) {
        for &i in indices {
            self.counters.tx_frames += 1;
            self.counters.tx_bytes += batch.frame(usize::from(i)).len() as u64;
        }
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
        if self.uring.is_some() {
            return self.recv_uring(batch, max_frames);
        }
        let raw = self.fd.as_raw_fd();
        let mut n = 0;
        while n < max_frames {
            let Some(slot) = batch.free_slot() else { break };
            // SAFETY: reads into a live buffer of slot.len() bytes.
            let r = unsafe { libc::read(raw, slot.as_mut_ptr().cast(), slot.len()) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    // Also after some frames: they stay in the batch, and the error tells the
                    // switch to retry this port (frames may still wait behind it).
                    _ => {
                        self.counters.rx_errors += 1;
                        return Err(PortError::Io {
                            port: self.name.clone(),
                            op: "read",
                            source: e,
                        });
                    }
                }
            }
            // The kernel never returns more than asked; should it, the frame is clamped to the
            // buffer (and dropped as oversized), never trusted.
            let len = (r as usize).min(slot.len());
            batch.commit(len);
            self.counters.rx_frames += 1;
            self.counters.rx_bytes += len as u64;
            n += 1;
        }
        Ok(n)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        if self.uring.is_some() {
            return self.send_uring(batch, indices);
        }
        let raw = self.fd.as_raw_fd();
        let mut sent = 0;
        for &i in indices {
            let f = batch.frame(usize::from(i));
            loop {
                // SAFETY: writes from a live buffer of f.len() bytes.
                let r = unsafe { libc::write(raw, f.as_ptr().cast(), f.len()) };
                if r >= 0 {
                    self.counters.tx_frames += 1;
                    self.counters.tx_bytes += f.len() as u64;
                    sent += 1;
                } else if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                } else {
                    // The kernel refused this frame (link down, bad header): stop here, as the
                    // trait says, so that the caller's "first `sent` frames went out" (its
                    // byte counters and the uplink charge) holds; the rest are lost.
                    self.counters.tx_errors += (indices.len() - sent) as u64;
                    return Ok(sent);
                }
                break;
            }
        }
        Ok(sent)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn counters(&self) -> PortIoCounters {
        self.counters
    }

    fn release(&mut self) {
        if self.owned {
            // Not persistent any more: the interface goes when the descriptor closes. A failure
            // leaves it behind (persistent), which is all this can do.
            // SAFETY: TUNSETPERSIST takes an integer argument.
            unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TUNSETPERSIST, 0 as libc::c_ulong) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build_frame, VnetHdr};

    #[test]
    fn send_batch_stops_at_the_first_refused_frame() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: needs root");
            return;
        }
        let name = format!("vqt{}s", std::process::id() % 100_000);
        let mut tap = TapPort::open(&name, TapMode::Create).unwrap();
        let mut batch = Batch::new();
        let good = build_frame(
            VnetHdr::default(),
            0x02_00_00_00_00_01,
            0x02_00_00_00_00_02,
            0x0800,
            &[0; 46],
        );
        let bad = {
            let mut f = good.clone();
            f[1] = 3; // unknown GSO type: the kernel refuses the write
            f
        };
        assert!(batch.push(&good) && batch.push(&bad) && batch.push(&good));
        assert_eq!(tap.send_batch(&batch, &[0, 1, 2]).unwrap(), 1);
        let c = tap.counters();
        assert_eq!(
            (c.tx_frames, c.tx_bytes, c.tx_errors),
            (1, good.len() as u64, 2)
        );
    }

    #[test]
    fn an_owned_tap_outlives_its_port_is_found_again_in_a_namespace_and_goes_on_release() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: needs root");
            return;
        }
        let pid = std::process::id() % 100_000;
        let name = format!("vqt{pid}o");
        let ns = format!("vqt{pid}ns");
        let ip = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        /// Deletes the namespace (and the TAP, if it is in it) even if the test fails.
        struct Cleanup(String, String);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &self.1])
                    .output();
                let _ = std::process::Command::new("ip")
                    .args(["link", "del", &self.0])
                    .output();
            }
        }
        let _cleanup = Cleanup(name.clone(), ns.clone());
        assert!(ip(&["netns", "add", &ns]));
        let first = TapPort::open(&name, TapMode::Own).unwrap();
        assert_eq!(first.origin(), &TapOrigin::Created);
        drop(first);
        assert!(
            exists_here(&name).unwrap(),
            "an owned TAP outlives its port"
        );
        let here = TapPort::open(&name, TapMode::Own).unwrap();
        assert_eq!(here.origin(), &TapOrigin::Reattached { netns: None });
        drop(here);
        // Moved into a guest's namespace, it is found there and attached again.
        assert!(ip(&["link", "set", &name, "netns", &ns]));
        assert!(!exists_here(&name).unwrap());
        let mut again = TapPort::open(&name, TapMode::Own).unwrap();
        assert!(!exists_here(&name).unwrap(), "a second TAP was made here");
        assert_eq!(
            again.origin(),
            &TapOrigin::Reattached {
                netns: Some(ns.clone())
            }
        );
        assert!(ip(&["-n", &ns, "link", "show", &name]));
        again.release();
        drop(again);
        assert!(
            !ip(&["-n", &ns, "link", "show", &name]),
            "released, yet it stayed"
        );
    }
}
