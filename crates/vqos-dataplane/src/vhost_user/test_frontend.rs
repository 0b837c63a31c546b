//! A minimal vhost-user frontend for tests: the `vhost` crate's `Frontend` speaks the
//! protocol; guest memory is a memfd mapped in this process; the guest's split rings are
//! written by hand, so tests can also write them wrong.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

use super::features::{F_PROTOCOL_FEATURES, OFFERED_FEATURES};
use super::{VhostUserHandle, VhostUserPort};
use crate::port::{Batch, Port};

/// Bytes of guest memory.
pub(crate) const MEM_BYTES: usize = 64 << 20;
/// Ring size used by the tests.
pub(crate) const RING: u16 = 256;
/// Bytes reserved per descriptor buffer.
pub(crate) const BUF_BYTES: u64 = 0x11000;
/// Guest-physical base of the rings of queue `q`.
const fn ring_base(q: usize) -> u64 {
    0x1000 + q as u64 * 0x10000
}
/// Guest-physical base of the buffers of queue `q`.
pub(crate) const fn buf_addr(q: usize, idx: u16) -> u64 {
    0x10_0000 + (q as u64 * RING as u64 + idx as u64) * BUF_BYTES
}

/// Guest memory: a memfd, mapped shared here and handed to the backend.
pub(crate) struct GuestMem {
    /// The memfd.
    pub(crate) fd: OwnedFd,
    /// Where it is mapped here.
    ptr: *mut u8,
    /// Its name in /proc/self/maps.
    pub(crate) name: String,
}

// SAFETY: the mapping is plain shared memory; tests access it from one thread at a time.
unsafe impl Send for GuestMem {}

impl GuestMem {
    fn new() -> GuestMem {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "vqos-guest-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let c = CString::new(name.clone()).unwrap();
        // SAFETY: c is NUL-terminated; the result is checked.
        let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscalls on our descriptor; results checked.
        let ptr = unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), MEM_BYTES as libc::off_t), 0);
            libc::mmap(
                std::ptr::null_mut(),
                MEM_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        GuestMem {
            fd,
            ptr: ptr.cast(),
            name,
        }
    }

    /// This process's address of guest address `gpa`.
    pub(crate) fn va(&self, gpa: u64) -> u64 {
        self.ptr as u64 + gpa
    }

    /// Writes `data` at `gpa`.
    pub(crate) fn write(&self, gpa: u64, data: &[u8]) {
        assert!(gpa as usize + data.len() <= MEM_BYTES);
        // SAFETY: in bounds of our mapping (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(gpa as usize), data.len())
        };
    }

    /// Reads `len` bytes at `gpa`.
    pub(crate) fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        assert!(gpa as usize + len <= MEM_BYTES);
        let mut v = vec![0u8; len];
        // SAFETY: in bounds of our mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(gpa as usize), v.as_mut_ptr(), len) };
        v
    }

    /// Writes a little-endian u16 (release: what was written before is visible first).
    pub(crate) fn put_u16(&self, gpa: u64, v: u16) {
        fence(Ordering::SeqCst);
        self.write(gpa, &v.to_le_bytes());
        fence(Ordering::SeqCst);
    }

    /// Reads a little-endian u16.
    pub(crate) fn get_u16(&self, gpa: u64) -> u16 {
        fence(Ordering::SeqCst);
        let b = self.read(gpa, 2);
        u16::from_le_bytes([b[0], b[1]])
    }
}

impl Drop for GuestMem {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped.
        unsafe { libc::munmap(self.ptr.cast(), MEM_BYTES) };
    }
}

/// Mappings of `name` in this process (the test's own and the backend's).
pub(crate) fn mappings_of(name: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(name))
        .count()
}

/// The driver side of one split ring.
pub(crate) struct Ring {
    /// Descriptor table address.
    pub(crate) desc: u64,
    /// Avail ring address.
    pub(crate) avail: u64,
    /// Used ring address.
    pub(crate) used: u64,
    /// Our avail index.
    pub(crate) avail_idx: u16,
    /// Used entries consumed so far.
    pub(crate) last_used: u16,
}

impl Ring {
    /// The default layout of queue `q`.
    pub(crate) fn new(q: usize) -> Ring {
        let desc = ring_base(q);
        let avail = desc + 16 * u64::from(RING);
        let used = (avail + 6 + 2 * u64::from(RING) + 3) & !3;
        Ring {
            desc,
            avail,
            used,
            avail_idx: 0,
            last_used: 0,
        }
    }

    /// Writes descriptor `idx`.
    pub(crate) fn set_desc(
        &self,
        m: &GuestMem,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        m.write(self.desc + 16 * u64::from(idx), &d);
    }

    /// Makes chain `head` available.
    pub(crate) fn publish(&mut self, m: &GuestMem, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % RING);
        m.put_u16(slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        m.put_u16(self.avail + 2, self.avail_idx);
    }

    /// New used entries `(id, len)`.
    pub(crate) fn take_used(&mut self, m: &GuestMem) -> Vec<(u16, u32)> {
        let idx = m.get_u16(self.used + 2);
        let mut out = Vec::new();
        while self.last_used != idx {
            let e = m.read(self.used + 4 + 8 * u64::from(self.last_used % RING), 8);
            let id = u32::from_le_bytes(e[0..4].try_into().unwrap());
            let len = u32::from_le_bytes(e[4..8].try_into().unwrap());
            out.push((id as u16, len));
            self.last_used = self.last_used.wrapping_add(1);
        }
        out
    }

    /// Sets `used_event` (EVENT_IDX: interrupt when the used index passes it).
    pub(crate) fn set_used_event(&self, m: &GuestMem, v: u16) {
        m.put_u16(self.avail + 4 + 2 * u64::from(RING), v);
    }

    /// Reads `avail_event` (EVENT_IDX: the device wants a kick when avail passes it).
    pub(crate) fn avail_event(&self, m: &GuestMem) -> u16 {
        m.get_u16(self.used + 4 + 8 * u64::from(RING))
    }

    /// Reads the used ring's flags.
    pub(crate) fn used_flags(&self, m: &GuestMem) -> u16 {
        m.get_u16(self.used)
    }
}

/// A connected test frontend with guest memory and both rings configured.
pub(crate) struct TestFrontend {
    /// The protocol side.
    pub(crate) fe: Frontend,
    /// Guest memory.
    pub(crate) mem: GuestMem,
    /// Guest receive ring (queue 0).
    pub(crate) rx: Ring,
    /// Guest transmit ring (queue 1).
    pub(crate) tx: Ring,
    /// Kick eventfds `[rx, tx]`.
    pub(crate) kick: [EventFd; 2],
    /// Call eventfds `[rx, tx]`.
    pub(crate) call: [EventFd; 2],
    /// Negotiated features.
    pub(crate) features: u64,
}

/// Waits until `cond` holds (10 s at most, then panics with `what`).
pub(crate) fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl TestFrontend {
    /// Connects to a server-role port at `path`, negotiating `features` (masked by the offer).
    pub(crate) fn connect(path: &Path, features: u64) -> TestFrontend {
        Self::connect_with_rings(path, features, [Ring::new(0), Ring::new(1)])
    }

    /// As [`TestFrontend::connect`], with rings placed by the caller.
    pub(crate) fn connect_with_rings(path: &Path, features: u64, rings: [Ring; 2]) -> TestFrontend {
        let fe = Frontend::connect(path, 2).expect("connect");
        Self::setup(fe, features, rings, true)
    }

    /// Connects as QEMU 7.2 does: `SET_VRING_ENABLE` for both rings first (before
    /// `SET_FEATURES`, written raw: the `vhost` crate's frontend would not send it), and never
    /// again after `SET_FEATURES`.
    pub(crate) fn connect_qemu_style(path: &Path, features: u64) -> TestFrontend {
        use std::io::Write;
        let mut stream = std::os::unix::net::UnixStream::connect(path).expect("connect");
        for q in 0..2u32 {
            let mut msg = Vec::new();
            for word in [18u32, 1, 8, q, 1] {
                msg.extend_from_slice(&word.to_le_bytes());
            }
            stream.write_all(&msg).unwrap();
        }
        let fe = Frontend::from_stream(stream, 2);
        Self::setup(fe, features, [Ring::new(0), Ring::new(1)], false)
    }

    /// As [`TestFrontend::connect`], keeping a second handle on the connection for messages
    /// the `vhost` crate's frontend does not send (`SEND_RARP`: [`send_rarp`]).
    pub(crate) fn connect_raw(
        path: &Path,
        features: u64,
    ) -> (TestFrontend, std::os::unix::net::UnixStream) {
        let stream = std::os::unix::net::UnixStream::connect(path).expect("connect");
        let raw = stream.try_clone().unwrap();
        let fe = Frontend::from_stream(stream, 2);
        let fe = Self::setup(fe, features, [Ring::new(0), Ring::new(1)], true);
        (fe, raw)
    }

    /// Accepts one client-role port on `listener`.
    pub(crate) fn accept(listener: &UnixListener, features: u64) -> TestFrontend {
        let (stream, _) = listener.accept().expect("accept");
        Self::setup(
            Frontend::from_stream(stream, 2),
            features,
            [Ring::new(0), Ring::new(1)],
            true,
        )
    }

    fn setup(mut fe: Frontend, want: u64, rings: [Ring; 2], enable: bool) -> TestFrontend {
        let mem = GuestMem::new();
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        assert_eq!(offered, OFFERED_FEATURES);
        let features = want & offered;
        fe.set_features(features).unwrap();
        if features & F_PROTOCOL_FEATURES != 0 {
            let p = fe.get_protocol_features().unwrap();
            // REPLY_ACK: every message below is acknowledged before the call returns. RARP:
            // the tests may send SEND_RARP (raw, [`TestFrontend::connect_raw`]).
            let wanted = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::RARP;
            fe.set_protocol_features(p & wanted).unwrap();
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM_BYTES as u64,
            userspace_addr: mem.va(0),
            mmap_offset: 0,
            mmap_handle: mem.fd.as_raw_fd(),
        };
        fe.set_mem_table(&[region]).unwrap();
        let kick = [EventFd::new(0).unwrap(), EventFd::new(0).unwrap()];
        let call = [
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        ];
        for (q, r) in rings.iter().enumerate() {
            fe.set_vring_num(q, RING).unwrap();
            let cfg = VringConfigData {
                queue_max_size: RING,
                queue_size: RING,
                flags: 0,
                desc_table_addr: mem.va(r.desc),
                used_ring_addr: mem.va(r.used),
                avail_ring_addr: mem.va(r.avail),
                log_addr: None,
            };
            fe.set_vring_addr(q, &cfg).unwrap();
            fe.set_vring_base(q, 0).unwrap();
            fe.set_vring_call(q, &call[q]).unwrap();
            fe.set_vring_kick(q, &kick[q]).unwrap();
            if enable && features & F_PROTOCOL_FEATURES != 0 {
                fe.set_vring_enable(q, true).unwrap();
            }
        }
        let [rx, tx] = rings;
        TestFrontend {
            fe,
            mem,
            rx,
            tx,
            kick,
            call,
            features,
        }
    }

    /// Transmits `frame` (guest header included) as one readable descriptor and kicks.
    pub(crate) fn send(&mut self, frame: &[u8]) {
        let idx = self.tx.avail_idx % RING;
        let addr = buf_addr(1, idx);
        self.mem.write(addr, frame);
        self.tx
            .set_desc(&self.mem, idx, addr, frame.len() as u32, 0, 0);
        self.tx.publish(&self.mem, idx);
        self.kick[1].write(1).unwrap();
    }

    /// Posts `count` receive buffers of `len` bytes each (one descriptor per chain).
    pub(crate) fn post_rx(&mut self, count: u16, len: u32) {
        for _ in 0..count {
            let idx = self.rx.avail_idx % RING;
            let addr = buf_addr(0, idx);
            self.rx.set_desc(&self.mem, idx, addr, len, 2, 0);
            self.rx.publish(&self.mem, idx);
        }
    }

    /// Frames received so far (guest header included), merging `num_buffers` entries with
    /// MRG_RXBUF.
    pub(crate) fn received(&mut self) -> Vec<Vec<u8>> {
        let used = self.rx.take_used(&self.mem);
        let mergeable = self.features & super::features::F_MRG_RXBUF != 0;
        let mut out = Vec::new();
        let mut it = used.into_iter();
        while let Some((id, len)) = it.next() {
            let mut frame = self.mem.read(buf_addr(0, id), len as usize);
            if mergeable && frame.len() >= 12 {
                let n = u16::from_le_bytes([frame[10], frame[11]]);
                for _ in 1..n {
                    let (id, len) = it.next().expect("num_buffers beyond the used entries");
                    frame.extend(self.mem.read(buf_addr(0, id), len as usize));
                }
            }
            out.push(frame);
        }
        out
    }

    /// Interrupts pending on queue `q` (reads and resets the call eventfd).
    pub(crate) fn calls(&self, q: usize) -> u64 {
        self.call[q].read().unwrap_or(0)
    }
}

/// Sends `SEND_RARP` for `mac` on `raw` with `NEED_REPLY` and returns the backend's answer
/// (0: accepted).
pub(crate) fn send_rarp(raw: &mut std::os::unix::net::UnixStream, mac: [u8; 6]) -> u64 {
    use std::io::{Read, Write};
    let mut msg = Vec::new();
    for w in [19u32, 0x1 | 0x8, 8] {
        msg.extend_from_slice(&w.to_le_bytes());
    }
    msg.extend_from_slice(&mac);
    msg.extend_from_slice(&[0, 0]);
    raw.write_all(&msg).unwrap();
    let mut reply = [0u8; 20];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(
        &reply[..12],
        &[19, 0, 0, 0, 5, 0, 0, 0, 8, 0, 0, 0],
        "the reply header"
    );
    u64::from_le_bytes(reply[12..].try_into().unwrap())
}

/// Waits until the port's session has both vrings started and enabled (needed only when the
/// frontend did not negotiate `REPLY_ACK`).
pub(crate) fn wait_ready(h: &VhostUserHandle) {
    use vhost_user_backend::VringT;
    use virtio_queue::QueueT;
    wait_until("a started session", || {
        super::backend::read(&h.shared.session)
            .as_ref()
            .is_some_and(|s| {
                s.vrings.iter().all(|v| {
                    let st = v.get_ref();
                    st.is_enabled() && st.get_queue().ready()
                })
            })
    });
}

/// Reads from `port` until `want` frames arrived (waiting on its readiness fd).
pub(crate) fn recv_n(port: &mut VhostUserPort, batch: &mut Batch, want: usize) -> usize {
    let mut got = 0;
    let fd = port.readiness_fd().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < want {
        got += port.recv_batch(batch, want - got).unwrap();
        if got < want {
            assert!(
                Instant::now() < deadline,
                "timed out: {got} of {want} frames"
            );
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, 10) };
        }
    }
    got
}

/// A unique socket path in a fresh temporary directory (removed with the returned guard).
pub(crate) fn socket_path() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("vqos-vhu-")
        .tempdir()
        .unwrap();
    let p = dir.path().join("vhu.sock");
    (dir, p)
}
