//! [`TapPort`]: a Linux TAP device with the virtio-net header and TCP segmentation offload.
//!
//! ## Behavior
//! Opens `/dev/net/tun` non-blocking with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, sets the header
//! size to 12 bytes (`virtio_net_hdr_v1`, see [`crate::frame`]) and enables `TUN_F_CSUM |
//! TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN`: the kernel hands us TCP super-frames of up to
//! 64 KiB with a partial checksum, and accepts the same back, so bulk TCP crosses the switch in
//! few, large frames and the header travels unchanged from port to port.
//!
//! A port is either *created* (the switch owns the interface: not persistent, it disappears
//! when the port is dropped) or *attached* to an existing persistent TAP (which stays). The
//! link is brought up with `SIOCSIFFLAGS`. The file descriptor keeps working when the interface
//! is moved to another network namespace.
//!
//! ## Limitations
//! One queue per TAP (no `IFF_MULTI_QUEUE`); one `read`/`write` system call per frame.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::frame::VNET_HDR_LEN;
use crate::port::{Batch, Port, PortError, PortIoCounters};

/// How a [`TapPort`] comes to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapMode {
    /// Create the interface; it is removed when the port is dropped. Fails if it exists.
    Create,
    /// Attach to an existing (persistent) TAP; it stays when the port is dropped.
    Attach,
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

impl TapPort {
    /// Creates (or attaches to, per `mode`) TAP `name`, configures header and offloads, and
    /// brings the link up.
    pub fn open(name: &str, mode: TapMode) -> Result<TapPort, PortError> {
        let flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        let mut req = ifreq(name, flags)?;
        let exists = Path::new("/sys/class/net").join(name).exists();
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
        if mode == TapMode::Create {
            // The switch owns the interface: it must vanish with the port.
            // SAFETY: TUNSETPERSIST takes an integer argument.
            if unsafe { libc::ioctl(raw, libc::TUNSETPERSIST, 0 as libc::c_ulong) } < 0 {
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
        Ok(TapPort {
            name: name.to_string(),
            fd,
            counters: PortIoCounters::default(),
        })
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
}
