//! [`AfPacketPort`]: an uplink that is an existing interface (a NIC, one end of a veth pair),
//! reached through an `AF_PACKET` socket instead of a TAP the kernel must bridge or route on.
//!
//! ## Behavior
//! - **Attach**: a `SOCK_RAW` packet socket (non-blocking), bound to the interface's index with
//!   `ETH_P_ALL`, so it sees every frame of that interface and of no other. The interface is
//!   brought up and put in promiscuous mode (`PACKET_ADD_MEMBERSHIP` with `PACKET_MR_PROMISC`:
//!   the VMs' addresses are not the NIC's); the membership goes with the socket, so the
//!   interface leaves promiscuous mode when the port is dropped. The interface is never created
//!   nor deleted.
//! - **Header**: `PACKET_VNET_HDR_SZ = 12` (Linux ≥ 6.2): the kernel prepends and expects
//!   `virtio_net_hdr_mrg_rxbuf`, which is our 12-byte `virtio_net_hdr_v1` ([`crate::frame`]);
//!   it writes `num_buffers = 0` on receive and ignores it on send, so frames cross between
//!   this port and TAP or vhost-user ports unchanged: TCP super-frames (GSO) with a partial
//!   checksum in both directions where the device makes them (veth passes a TSO sender's
//!   super-frames as they are; a NIC's GRO completes with a partial checksum). Where the
//!   kernel only knows `PACKET_VNET_HDR` (the legacy 10-byte header, before 6.2) the port
//!   reads and writes with two iovecs, header into bytes 0..10 and frame from byte 12, and
//!   zeroes `num_buffers`: the same layout, no copy ([`AfPacketOptions::legacy_vnet_hdr`]
//!   forces this path, for tests).
//! - **Batches**: `recvmmsg` / `sendmmsg`, one system call per batch of up to
//!   [`BATCH_FRAMES`], straight into and out of the [`Batch`]'s buffers (the kernel's one copy).
//!   Why not a `TPACKET_V3` ring: a ring saves the system call on receive, but its frames live
//!   in the ring and the switch's batches are its own buffers, so every frame would be copied
//!   once more (a ring's slots are also fixed-size: 64 KiB super-frames need 64 KiB slots);
//!   a TX ring still needs a `sendto` per flush. One call per 32 frames is already below the
//!   cost of copying a super-frame twice.
//! - **What is read**: only frames the switch should forward. Frames the host itself sends on
//!   the interface (`PACKET_OUTGOING`, also turned off with `PACKET_IGNORE_OUTGOING`) and
//!   frames addressed to the interface's own MAC (`PACKET_HOST`: the host's, not a VM's) are
//!   skipped and counted ([`AfPacketStatus`]); the kernel never hands a socket its own
//!   transmissions, so nothing the switch sends comes back. Frames too long for a buffer come
//!   back cut to the buffer and are dropped as `oversized` by validation, like a TAP's.
//! - **Transmit**: `PACKET_QDISC_BYPASS` by default: the switch is the scheduler (its shaper
//!   paces the uplink at its capacity), so a second queue in a qdisc only adds latency and a
//!   lock; frames go straight to the driver, which segments super-frames the device cannot
//!   take. A frame the kernel refuses (too long for the MTU without GSO, a bad header, no
//!   room) ends the batch as the [`Port::send_batch`] contract says, counted in `tx_errors`.
//! - **Buffers**: 8 MiB of receive and 4 MiB of send buffer (`SO_RCVBUFFORCE`, falling back
//!   to `SO_RCVBUF`), so a burst arriving while the loop is busy waits rather than drops;
//!   frames the kernel dropped anyway (`PACKET_STATISTICS`) are in [`AfPacketStatus`].
//!
//! ## Limitations
//! - Needs `CAP_NET_RAW` (and `CAP_NET_ADMIN` for the forced buffer sizes and the link).
//! - VLAN tags of received frames are not re-inserted: the kernel strips them into metadata
//!   (`PACKET_AUXDATA`) before packet sockets see the frame, so a tagged frame reaches the
//!   vifs untagged.
//! - Hardware LRO super-frames arrive without a partial checksum and are dropped as
//!   `bad_vnet_hdr`: turn LRO off on the NIC (`ethtool -K DEV lro off`; GRO is fine).
//! - The host's own stack on the interface is not reachable from the vifs (their frames go to
//!   the wire), as with any NIC given to a switch.
//! - No AF_XDP (see docs/dataplane.md).
//!
//! ## Shards
//! Each shard that does not read the uplink gets a transmit-only socket of its own
//! ([`Port::tx_queue`]): bound to the same interface with protocol 0, so the kernel queues no
//! frame on it (it is no reader, and needs no receive buffer nor promiscuous membership), with
//! the port's header size and options. The shards' frames then leave without waiting for the
//! reading shard's lock; the driver's own transmit lock orders them, as for any two sockets.
//! The socket is made in the namespace the port was opened in, whichever thread asks.
//!
//! With the scheduled downlink, each other shard reads the uplink too ([`Port::rx_queue`]):
//! a receiving socket of its own, joined with the first one in a `PACKET_FANOUT_HASH` group,
//! so the kernel hands each flow's frames to one of the shards by the flow's hash (order
//! within a flow is kept; IP fragments hash on their addresses alone and stay together). The
//! group's id is one the kernel picks (`PACKET_FANOUT_FLAG_UNIQUEID`), so no other process's
//! group is joined by chance. What the downlink's shards then carry for one vif is divided
//! among them (docs/dataplane.md, "Shards").

use std::cell::Cell;
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::frame::VNET_HDR_LEN;
use crate::port::{Batch, Port, PortError, PortIoCounters, PortStatus, BATCH_FRAMES};
use crate::sys::NetNs;
pub use vqos_api::stats::AfPacketStatus;

mod socket;
use socket::{join_fanout, op_err, sockaddr_ll_zeroed, socket};

/// An `int` option's "on".
const ONE: libc::c_int = 1;

/// Bytes of the legacy `virtio_net_hdr` (no `num_buffers`).
const LEGACY_VNET_HDR_LEN: usize = 10;

/// How an [`AfPacketPort`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfPacketOptions {
    /// Transmit straight to the driver (`PACKET_QDISC_BYPASS`); default true.
    pub qdisc_bypass: bool,
    /// Use the legacy 10-byte header (with split iovecs) even where the kernel offers the
    /// 12-byte one; default false (tests of the path older kernels take).
    pub legacy_vnet_hdr: bool,
    /// Socket receive buffer, bytes (default 8 MiB).
    pub rcvbuf_bytes: usize,
    /// Socket send buffer, bytes (default 4 MiB).
    pub sndbuf_bytes: usize,
}

impl Default for AfPacketOptions {
    fn default() -> Self {
        AfPacketOptions {
            qdisc_bypass: true,
            legacy_vnet_hdr: false,
            rcvbuf_bytes: 8 << 20,
            sndbuf_bytes: 4 << 20,
        }
    }
}

/// An existing interface attached through an `AF_PACKET` socket.
#[derive(Debug)]
pub struct AfPacketPort {
    /// Interface name.
    name: String,
    /// The packet socket (non-blocking).
    fd: OwnedFd,
    /// A transmit queue of another shard: bound with protocol 0, it reads nothing.
    tx_only: bool,
    /// How it was set up (for its transmit queues).
    opts: AfPacketOptions,
    /// The network namespace it was opened in (its transmit queues are made there).
    netns: Option<std::sync::Arc<NetNs>>,
    /// I/O counters.
    counters: PortIoCounters,
    /// Status; `kernel_drops` is summed when the status is read (the kernel's count resets
    /// on every read, hence the cell: [`Port::status`] takes `&self`).
    status: Cell<AfPacketStatus>,
    /// The fanout group it reads in, once it has receive queues ([`Port::rx_queue`]).
    fanout: Cell<Option<u16>>,
}

fn io_err(port: &str, op: &'static str) -> PortError {
    PortError::Io {
        port: port.to_string(),
        op,
        source: io::Error::last_os_error(),
    }
}

impl AfPacketPort {
    /// Attaches to interface `name` with the default options.
    pub fn open(name: &str) -> Result<AfPacketPort, PortError> {
        Self::open_with(name, AfPacketOptions::default())
    }

    /// Attaches to interface `name` (in the calling thread's network namespace): binds a packet
    /// socket to it, sets the header and options, brings the link up and makes it promiscuous.
    pub fn open_with(name: &str, opts: AfPacketOptions) -> Result<AfPacketPort, PortError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(PortError::BadName(name.to_string()));
        }
        let cname = CString::new(name).map_err(|_| PortError::BadName(name.to_string()))?;
        // SAFETY: cname is NUL-terminated and outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(PortError::Missing(name.to_string()));
        }
        let (fd, vnet_hdr_bytes) = socket(name, ifindex, opts, true)?;
        Ok(AfPacketPort {
            name: name.to_string(),
            fd,
            tx_only: false,
            opts,
            netns: NetNs::current().ok().map(std::sync::Arc::new),
            counters: PortIoCounters::default(),
            status: Cell::new(AfPacketStatus {
                ifindex,
                vnet_hdr_bytes: vnet_hdr_bytes as u64,
                qdisc_bypass: opts.qdisc_bypass,
                readers: 1,
                ..Default::default()
            }),
            fanout: Cell::new(None),
        })
    }

    /// The port's status now (reads and sums the kernel's drop count).
    pub fn af_status(&self) -> AfPacketStatus {
        let mut st = self.status.get();
        let mut ks = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: ks and len are live and of the sizes the kernel expects.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut ks as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r == 0 {
            st.kernel_drops += u64::from(ks.tp_drops);
            self.status.set(st);
        }
        st
    }

    /// True when the kernel uses the legacy 10-byte header (split iovecs).
    fn legacy(&self) -> bool {
        self.status.get().vnet_hdr_bytes == LEGACY_VNET_HDR_LEN as u64
    }
}

/// A batch's worth of message headers, zeroed.
fn mmsghdrs() -> [libc::mmsghdr; BATCH_FRAMES] {
    // SAFETY: mmsghdr is plain old data (null pointers, zero lengths); all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// An iovec of nothing (the unused second one of a 12-byte-header message).
const EMPTY_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

impl Port for AfPacketPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        if self.tx_only {
            return Ok(0);
        }
        let legacy = self.legacy();
        let raw = self.fd.as_raw_fd();
        let mut got = 0;
        loop {
            let k = max_frames.saturating_sub(got).min(batch.spare());
            if k == 0 {
                break;
            }
            let base = batch.len();
            let mut iovs = [[EMPTY_IOV; 2]; BATCH_FRAMES];
            let mut addrs = [sockaddr_ll_zeroed(); BATCH_FRAMES];
            let mut msgs = mmsghdrs();
            for j in 0..k {
                let (ptr, len) = batch.spare_buf(base + j);
                let iov = &mut iovs[j];
                if legacy {
                    // Header into bytes 0..10, the frame from byte 12: our layout.
                    iov[0] = libc::iovec {
                        iov_base: ptr.cast(),
                        iov_len: LEGACY_VNET_HDR_LEN,
                    };
                    iov[1] = libc::iovec {
                        // SAFETY: the buffer is FRAME_BUF_BYTES long, far beyond 12 bytes.
                        iov_base: unsafe { ptr.add(VNET_HDR_LEN) }.cast(),
                        iov_len: len - VNET_HDR_LEN,
                    };
                } else {
                    iov[0] = libc::iovec {
                        iov_base: ptr.cast(),
                        iov_len: len,
                    };
                }
                let h = &mut msgs[j].msg_hdr;
                h.msg_iov = iov.as_mut_ptr();
                h.msg_iovlen = if legacy { 2 } else { 1 };
                h.msg_name = (&mut addrs[j] as *mut libc::sockaddr_ll).cast();
                h.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            }
            // SAFETY: msgs[..k] point at iovecs and addresses on this stack frame and at free
            // buffers of `batch`, all live and otherwise unused until the call returns.
            let r = unsafe {
                libc::recvmmsg(
                    raw,
                    msgs.as_mut_ptr(),
                    k as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            let n = if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => 0,
                    // Frames read before stay in the batch; the error has the switch retry.
                    _ => {
                        self.counters.rx_errors += 1;
                        return Err(op_err(&self.name, "recvmmsg", e));
                    }
                }
            } else {
                r as usize
            };
            let mut st = self.status.get();
            for j in 0..n.min(k) {
                match addrs[j].sll_pkttype {
                    libc::PACKET_HOST => {
                        st.skipped_host += 1;
                        continue;
                    }
                    libc::PACKET_OTHERHOST | libc::PACKET_BROADCAST | libc::PACKET_MULTICAST => {}
                    _ => {
                        st.skipped_outgoing += 1;
                        continue;
                    }
                }
                let mut len = msgs[j].msg_len as usize;
                if legacy {
                    len += VNET_HDR_LEN - LEGACY_VNET_HDR_LEN;
                }
                // A frame cut to the buffer keeps the buffer's length: `oversized`.
                batch.commit_spare(base + j, len);
                let i = batch.len() - 1;
                if legacy {
                    if let Some(nb) = batch
                        .frame_mut(i)
                        .get_mut(LEGACY_VNET_HDR_LEN..VNET_HDR_LEN)
                    {
                        nb.fill(0);
                    }
                }
                self.counters.rx_frames += 1;
                self.counters.rx_bytes += batch.frame(i).len() as u64;
                got += 1;
            }
            self.status.set(st);
            if n < k {
                // Drained (frames skipped above do not count as read, so a full call
                // reads on).
                break;
            }
        }
        Ok(got)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        let legacy = self.legacy();
        let raw = self.fd.as_raw_fd();
        let mut sent = 0;
        for chunk in indices.chunks(BATCH_FRAMES) {
            let mut iovs = [[EMPTY_IOV; 2]; BATCH_FRAMES];
            let mut msgs = mmsghdrs();
            let mut k = 0;
            for (j, &i) in chunk.iter().enumerate() {
                let f = batch.frame(usize::from(i));
                if f.len() < VNET_HDR_LEN {
                    // Not a frame (the switch never sends one): refused here.
                    break;
                }
                let iov = &mut iovs[j];
                if legacy {
                    iov[0] = libc::iovec {
                        iov_base: f.as_ptr() as *mut libc::c_void,
                        iov_len: LEGACY_VNET_HDR_LEN,
                    };
                    iov[1] = libc::iovec {
                        iov_base: f[VNET_HDR_LEN..].as_ptr() as *mut libc::c_void,
                        iov_len: f.len() - VNET_HDR_LEN,
                    };
                } else {
                    iov[0] = libc::iovec {
                        iov_base: f.as_ptr() as *mut libc::c_void,
                        iov_len: f.len(),
                    };
                }
                let h = &mut msgs[j].msg_hdr;
                h.msg_iov = iov.as_mut_ptr();
                h.msg_iovlen = if legacy { 2 } else { 1 };
                k = j + 1;
            }
            let n = if k == 0 {
                0
            } else {
                loop {
                    // SAFETY: msgs[..k] point at iovecs on this stack frame and at frames of
                    // `batch` borrowed for this call; the kernel only reads through them.
                    let r = unsafe {
                        libc::sendmmsg(
                            raw,
                            msgs.as_mut_ptr(),
                            k as libc::c_uint,
                            libc::MSG_DONTWAIT,
                        )
                    };
                    if r >= 0 {
                        break (r as usize).min(k);
                    }
                    if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                        break 0;
                    }
                }
            };
            for &i in &chunk[..n] {
                self.counters.tx_frames += 1;
                self.counters.tx_bytes += batch.frame(usize::from(i)).len() as u64;
            }
            sent += n;
            if n < chunk.len() {
                // The kernel refused frame `n` (sendmmsg stops at the first failure): the
                // rest of the batch is lost, as the trait says.
                self.counters.tx_errors += (indices.len() - sent) as u64;
                return Ok(sent);
            }
        }
        Ok(sent)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        (!self.tx_only).then(|| self.fd.as_raw_fd())
    }

    fn counters(&self) -> PortIoCounters {
        self.counters
    }

    fn status(&self) -> Option<PortStatus> {
        Some(PortStatus::AfPacket(self.af_status()))
    }

    /// A transmit-only socket of its own for another shard (see the module doc), made in the
    /// namespace the port was opened in.
    fn tx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(Some(Box::new(self.sibling(false)?)))
    }

    /// A receiving socket of its own for another shard, in this port's fanout group (see the
    /// module doc; this port joins one first, the kernel picking its id).
    fn rx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        let id = match self.fanout.get() {
            Some(id) => id,
            None => {
                let id = join_fanout(self.fd.as_raw_fd(), None)
                    .map_err(|source| op_err(&self.name, "PACKET_FANOUT", source))?;
                self.fanout.set(Some(id));
                id
            }
        };
        let q = self.sibling(true)?;
        join_fanout(q.fd.as_raw_fd(), Some(id))
            .map_err(|source| op_err(&self.name, "PACKET_FANOUT", source))?;
        q.fanout.set(Some(id));
        Ok(Some(Box::new(q)))
    }
}

impl AfPacketPort {
    /// Another socket on the same interface with the same options, made in the namespace the
    /// port was opened in: a reader (`receive`) or a transmit queue.
    fn sibling(&self, receive: bool) -> Result<AfPacketPort, PortError> {
        let st = self.status.get();
        let mut opts = self.opts;
        opts.legacy_vnet_hdr = self.legacy();
        let name = self.name.as_str();
        let open = || socket(name, st.ifindex, opts, receive);
        let (fd, vnet_hdr_bytes) = match &self.netns {
            Some(ns) => ns
                .run(open)
                .map_err(|source| op_err(&self.name, "setns", source))??,
            None => open()?,
        };
        Ok(AfPacketPort {
            name: self.name.clone(),
            fd,
            tx_only: !receive,
            opts,
            netns: self.netns.clone(),
            counters: PortIoCounters::default(),
            status: Cell::new(AfPacketStatus {
                ifindex: st.ifindex,
                vnet_hdr_bytes: vnet_hdr_bytes as u64,
                qdisc_bypass: opts.qdisc_bypass,
                readers: u32::from(receive),
                ..Default::default()
            }),
            fanout: Cell::new(None),
        })
    }
}
