//! The [`Port`] trait: batch I/O of frames (virtio-net header + Ethernet frame) with a readiness
//! file descriptor, and the [`Batch`] of preallocated buffers it reads into.

use std::io;
use std::os::fd::RawFd;

use serde::Serialize;
use thiserror::Error;
use vqos_sched::MAX_BURST;

use crate::frame::FRAME_BUF_BYTES;
pub use vqos_api::stats::PortStatus;

/// Frames one [`Batch`] holds (the engine's burst limit).
pub const BATCH_FRAMES: usize = MAX_BURST as usize;

/// Why a port operation failed.
#[derive(Debug, Error)]
pub enum PortError {
    /// A system call on the port failed.
    #[error("Port '{port}': {op} failed")]
    Io {
        /// The port's name.
        port: String,
        /// What was attempted (`read`, `TUNSETIFF`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The name does not fit in IFNAMSIZ or contains a NUL byte.
    #[error("Invalid interface name '{0}'")]
    BadName(String),
    /// A TAP to create already exists.
    #[error("Interface '{0}' already exists")]
    Exists(String),
    /// A TAP to attach does not exist.
    #[error("Interface '{0}' does not exist")]
    Missing(String),
    /// A TAP the switch owns is not in this namespace and a named network namespace could
    /// not be searched for it: creating it here could duplicate one a guest still uses.
    #[error(
        "Port '{port}': not in the host's network namespace, and network namespace {netns} \
         could not be searched for it (entering a namespace needs CAP_SYS_ADMIN and, under \
         systemd, RestrictNamespaces= allowing net); refusing to create a second TAP of that \
         name on the host"
    )]
    NetnsUnsearchable {
        /// The port's name.
        port: String,
        /// The namespace file that could not be entered (under `/run/netns`).
        netns: String,
        /// Why (`setns`, or opening the file).
        #[source]
        source: io::Error,
    },
    /// A setting the port kind cannot take (e.g. a null port's frame length).
    #[error("Port '{port}': {message}")]
    BadSetting {
        /// The port.
        port: String,
        /// What is wrong with the setting.
        message: String,
    },
    /// The fault-injecting wrapper failed this call on purpose.
    #[error("Port '{0}': injected fault")]
    Injected(String),
}

/// What a port saw at its own level (before the switch's validation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PortIoCounters {
    /// Frames read.
    pub rx_frames: u64,
    /// Bytes read, virtio-net headers included.
    pub rx_bytes: u64,
    /// Frames written.
    pub tx_frames: u64,
    /// Bytes written, virtio-net headers included.
    pub tx_bytes: u64,
    /// Reads that failed with an error other than "would block".
    pub rx_errors: u64,
    /// Frames whose write failed or found no room.
    pub tx_errors: u64,
    /// Times the port's io_uring failed and it went back to one system call per frame
    /// ([`crate::TapIo::Uring`]; 0 or 1).
    pub uring_failures: u64,
}

impl PortIoCounters {
    /// Adds `o`'s counts (one port's queues added up).
    pub fn add(&mut self, o: &PortIoCounters) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.tx_frames += o.tx_frames;
        self.tx_bytes += o.tx_bytes;
        self.rx_errors += o.rx_errors;
        self.tx_errors += o.tx_errors;
        self.uring_failures += o.uring_failures;
    }
}

/// Up to [`BATCH_FRAMES`] frame buffers of [`FRAME_BUF_BYTES`] each, allocated once.
pub struct Batch {
    /// The buffers; only the first `count` hold frames.
    bufs: Vec<Box<[u8]>>,
    /// Length in bytes of each held frame.
    lens: [usize; BATCH_FRAMES],
    /// Frames held.
    count: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("count", &self.count).finish()
    }
}

impl Batch {
    /// Allocates the buffers (about 2 MiB).
    pub fn new() -> Self {
        Batch {
            bufs: (0..BATCH_FRAMES)
                .map(|_| vec![0u8; FRAME_BUF_BYTES].into_boxed_slice())
                .collect(),
            lens: [0; BATCH_FRAMES],
            count: 0,
        }
    }

    /// Frames held.
    #[inline]
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no frame is held.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// True when no more frame fits.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.count == BATCH_FRAMES
    }

    /// Forgets every frame (buffers are kept).
    #[inline]
    pub fn clear(&mut self) {
        self.count = 0;
    }

    /// Frame `i` (virtio-net header + Ethernet frame).
    #[inline]
    pub fn frame(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }

    /// Frame `i`, mutable (for ECN marking).
    #[inline]
    pub fn frame_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i][..self.lens[i]]
    }

    /// The whole buffer of the next free slot, for a port to read into; `None` when full.
    #[inline]
    pub fn free_slot(&mut self) -> Option<&mut [u8]> {
        if self.count == BATCH_FRAMES {
            return None;
        }
        Some(&mut self.bufs[self.count][..])
    }

    /// Keeps the first `len` bytes of the free slot as a new frame (after [`Batch::free_slot`]).
    /// A `len` beyond the buffer (a port's bug) is clamped to [`FRAME_BUF_BYTES`], one byte
    /// more than any valid frame, so validation drops it as `oversized`; false (nothing kept)
    /// when the batch is full.
    #[inline]
    pub fn commit(&mut self, len: usize) -> bool {
        if self.count == BATCH_FRAMES {
            return false;
        }
        self.lens[self.count] = len.min(FRAME_BUF_BYTES);
        self.count += 1;
        true
    }

    /// Free slots left.
    #[inline]
    pub fn spare(&self) -> usize {
        BATCH_FRAMES - self.count
    }

    /// The buffer of free slot `slot` (`len() ≤ slot < BATCH_FRAMES`) as a raw pointer and its
    /// length, for a port that fills several free slots at once ([`crate::TapIo::Uring`]).
    #[inline]
    pub(crate) fn spare_buf(&mut self, slot: usize) -> (*mut u8, usize) {
        debug_assert!(slot >= self.count && slot < BATCH_FRAMES);
        let buf = &mut self.bufs[slot];
        (buf.as_mut_ptr(), buf.len())
    }

    /// Keeps the first `len` bytes of free slot `slot` as the next frame: the slot's buffer
    /// is swapped into place (no copy), so frames filled out of order keep the order of their
    /// slots when committed in that order. `len` is clamped as by [`Batch::commit`].
    #[inline]
    pub(crate) fn commit_spare(&mut self, slot: usize, len: usize) -> bool {
        if slot < self.count || slot >= BATCH_FRAMES {
            return false;
        }
        self.bufs.swap(self.count, slot);
        self.commit(len)
    }

    /// Swaps frame `i`'s buffer with `buf` (of [`FRAME_BUF_BYTES`]): the caller takes the
    /// frame without a copy and the batch keeps a buffer to read into. Frame `i` is then
    /// garbage until the batch is cleared.
    pub(crate) fn swap_buf(&mut self, i: usize, buf: &mut Box<[u8]>) {
        debug_assert_eq!(buf.len(), FRAME_BUF_BYTES);
        std::mem::swap(&mut self.bufs[i], buf);
    }

    /// Appends the first `len` bytes of `buf` (of [`FRAME_BUF_BYTES`]) as a new frame by
    /// swapping it with the free slot's buffer, which `buf` then holds; false when full.
    pub(crate) fn push_buf(&mut self, buf: &mut Box<[u8]>, len: usize) -> bool {
        if self.count == BATCH_FRAMES || buf.len() != FRAME_BUF_BYTES {
            return false;
        }
        std::mem::swap(&mut self.bufs[self.count], buf);
        self.commit(len)
    }

    /// Shortens frame `i` to at most `len` bytes.
    pub fn truncate_frame(&mut self, i: usize, len: usize) {
        self.lens[i] = self.lens[i].min(len);
    }

    /// Copies `frame` in as a new frame, truncated to the buffer size; false when full.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        let Some(slot) = self.free_slot() else {
            return false;
        };
        let n = frame.len().min(slot.len());
        slot[..n].copy_from_slice(&frame[..n]);
        self.commit(n);
        true
    }
}

/// A switch port: batch I/O of frames that start with a 12-byte virtio-net header.
///
/// Implementations never block: `recv_batch` returns what is available now, `send_batch` what
/// could be written now. The poll loop owns the port; nothing else touches it.
pub trait Port: Send {
    /// The port's name (interface name for a TAP).
    fn name(&self) -> &str;

    /// Reads up to `max_frames` frames, appending them to `batch` (never beyond its capacity).
    /// Returns how many were read; fewer than asked means the port is drained. On an error,
    /// frames read before it stay appended to `batch` (the caller forwards them and retries
    /// the port later: frames may still wait).
    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError>;

    /// Writes the frames of `batch` at `indices`, in order, and stops at the first one that
    /// cannot be written. Returns how many were written: exactly the first `n` of `indices`
    /// (the caller counts their bytes); the rest are lost (counted by the caller).
    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError>;

    /// A file descriptor that becomes readable (edge) when frames arrive, for epoll; `None`
    /// when the port can only be polled.
    fn readiness_fd(&self) -> Option<RawFd>;

    /// The port's own I/O counters.
    fn counters(&self) -> PortIoCounters;

    /// The loop polls this port without waiting for its readiness descriptor (busy polling,
    /// `busy` true): a port may then stop asking its peer for notifications (a vhost-user
    /// port keeps its guest's TX kicks disabled, sparing the guest a system call per burst and
    /// the switch's core a wake-up). Called once when the port joins the loop; never per frame.
    fn set_busy_poll(&mut self, _busy: bool) {}

    /// The port is being removed for good (not dropped for a shutdown or restart): a resource
    /// meant to outlive the daemon (a persistent TAP the switch made) goes too. Called off the
    /// loop thread, before the port is dropped.
    fn release(&mut self) {}

    /// What the port kind has to say beyond its counters, for operators (a vhost-user port:
    /// connected, negotiated features, its guest's misbehaviour counters); `None` for most.
    /// Called when stats are published, never per frame.
    fn status(&self) -> Option<PortStatus> {
        None
    }

    /// Makes what the host sends into the port land in the queue of its destination's port
    /// slot ([`crate::tap_steer`]), once, for the uplink; `None` (the default) where the port
    /// has one queue or cannot: arrivals keep the kernel's flow hash.
    fn steer_by_destination(&self) -> Result<Option<crate::tap_steer::Steering>, PortError> {
        Ok(None)
    }

    /// Read budgets for the receive queues this port reads, by queue index: bits/s that the
    /// vifs whose arrivals a queue carries may receive (`None`: no budget); a queue that has
    /// spent its budget is not read until it earned it back ([`crate::tap_budget`]). Ignored
    /// (the default) by ports that cannot hold a queue.
    fn budget_rx_queues(&mut self, _max_bps: &[Option<u64>], _now_ns: u64) {}

    /// Refills the receive queues' budgets at `now_ns`: when a queue held for its budget will
    /// be read again (`None`: none is held).
    fn refill_rx_budgets(&mut self, _now_ns: u64) -> Option<u64> {
        None
    }

    /// Another transmit queue of this port, for a forwarding thread that does not read it
    /// (shards, docs/dataplane.md): frames it sends there need no lock shared with the other
    /// threads. `None` (the default): the port has one queue, shared under a short lock. A
    /// queue is never read.
    fn tx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(None)
    }

    /// Another receive queue of this port, for another shard to read and send on: the
    /// port's arrivals are then spread over its queues by flow, as a NIC's receive queues
    /// are (the AF_PACKET uplink's `PACKET_FANOUT`). `None` (the default): one reader.
    fn rx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{validate, FrameError};

    #[test]
    fn commit_clamps_a_bad_length_and_refuses_beyond_capacity() {
        let mut b = Batch::new();
        assert!(b.free_slot().is_some());
        assert!(b.commit(usize::MAX));
        assert_eq!(b.frame(0).len(), FRAME_BUF_BYTES);
        assert_eq!(validate(b.frame(0)), Err(FrameError::Oversized));
        while !b.is_full() {
            assert!(b.commit(60));
        }
        assert!(!b.commit(60));
        assert_eq!(b.len(), BATCH_FRAMES);
    }
}
