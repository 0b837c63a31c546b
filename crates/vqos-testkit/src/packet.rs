//! [`PacketSocket`]: a raw `AF_PACKET` socket on one link, to put frames on a wire and read
//! what crosses it, byte for byte (no IP stack involved).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A non-blocking raw socket bound to one link of the calling thread's namespace (make it
/// inside [`crate::Netns::run`]; it keeps working from any thread afterwards).
pub struct PacketSocket {
    /// The socket.
    fd: OwnedFd,
    /// The link's interface index.
    ifindex: i32,
}

/// A `sockaddr_ll` for `ifindex` and `protocol` (network order).
fn addr(ifindex: i32, protocol: u16) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    a.sll_family = libc::AF_PACKET as u16;
    a.sll_protocol = protocol;
    a.sll_ifindex = ifindex;
    a
}

impl PacketSocket {
    /// Binds to `link` for frames of EtherType `ethertype` (`libc::ETH_P_ALL` for all, 0 for
    /// none: a socket that only sends).
    pub fn bind(link: &str, ethertype: u16) -> PacketSocket {
        let protocol = ethertype.to_be();
        // SAFETY: socket() has no memory arguments; checked below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                i32::from(protocol),
            )
        };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(link).unwrap();
        // SAFETY: name is NUL-terminated.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
        assert!(ifindex > 0, "no link {link} here");
        let a = addr(ifindex, protocol);
        // SAFETY: a is live and sized for the call.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&a as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        PacketSocket { fd, ifindex }
    }

    /// Sends the Ethernet frame `frame` out of the link (its destination from its first bytes).
    pub fn send(&self, frame: &[u8]) {
        let mut a = addr(self.ifindex, 0);
        a.sll_halen = 6;
        a.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: frame and a are live for the call; sizes are theirs.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&a as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(
            r,
            frame.len() as isize,
            "sendto: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Every frame waiting now that came in on the link (not the copies of what was sent out
    /// of it), in order.
    pub fn drain(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 70_000];
        loop {
            let mut from = addr(0, 0);
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buf and from are live and sized for the call.
            let r = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if r < 0 {
                return out;
            }
            if from.sll_pkttype != libc::PACKET_OUTGOING {
                out.push(buf[..r as usize].to_vec());
            }
        }
    }

    /// The frames that come in until `want` came or none came for a second (the kernel hands
    /// frames on in softirq context); more than `want` if more came at once.
    pub fn receive(&self, want: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut last = std::time::Instant::now();
        while out.len() < want && last.elapsed() < std::time::Duration::from_secs(1) {
            let more = self.drain();
            if more.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            } else {
                last = std::time::Instant::now();
            }
            out.extend(more);
        }
        out.extend(self.drain());
        out
    }
}
