//! Batched TAP I/O on io_uring ([`TapIo::Uring`]): many reads or writes per system call.
//!
//! ## Behavior
//! A TAP hands over one frame per `read` and takes one per `write`, so the plain path
//! ([`TapIo::Syscall`]) makes one system call per frame (and one more read that finds the
//! queue empty). Here a port owns a small io_uring (no SQPOLL thread: the switch's core stays
//! the only one it uses):
//! - **Receive**: up to `k` `IORING_OP_READ`s, each straight into a free buffer of the
//!   [`Batch`] (no copy), submitted with one `io_uring_enter` that waits for all `k`. Each
//!   read is `RWF_NOWAIT`, so it completes at once: with a frame or `EAGAIN` (without the flag
//!   io_uring waits for a frame even on a non-blocking descriptor).
//!   `k` adapts: twice what the last call found (at least [`MIN_READS`]), so an idle port costs
//!   a few empty reads inside one call and a busy one fills the batch in one or two calls.
//!   Reads are issued in order, so frames keep their order; a read that found nothing between
//!   two that found frames leaves a hole the batch closes by swapping buffers, not copying.
//! - **Transmit**: one `IORING_OP_WRITE` per frame, linked (`IOSQE_IO_LINK`), submitted with
//!   one `io_uring_enter` that waits for all: the first refused write cancels the rest, which
//!   is the [`crate::Port::send_batch`] contract (the first `sent` frames went out).
//!
//! Why by hand over a crate: the `io-uring` crate is the ring; what is written here is only how
//! a TAP's batch maps onto it (which buffers, how many reads, how results come back).
//!
//! ## Limitations
//! - The ring is used synchronously: every call waits for all it submitted before returning, so
//!   no buffer is ever lent to the kernel across calls. Should `io_uring_enter` fail with
//!   anything but an interruption, the ring reports it and the port goes back to plain
//!   system calls for good (counted in [`crate::PortIoCounters`] as an error).
//! - No multishot reads with provided buffers: those save the empty reads but add a copy per
//!   frame out of the kernel's buffers, which costs more than a read on TSO super-frames.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

use crate::port::{Batch, BATCH_FRAMES};

/// How a TAP port moves frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TapIo {
    /// One `read`/`write` system call per frame.
    #[default]
    Syscall,
    /// Batches of reads and writes per `io_uring_enter` (see [`crate::tap_uring`]).
    Uring,
}

/// Reads submitted at least per receive call.
pub const MIN_READS: usize = 4;

/// Ring entries: one batch of writes, or of reads.
const RING_ENTRIES: u32 = BATCH_FRAMES as u32;

/// `user_data` of a cancelled or failed link: the frame index is in the low bits.
const INDEX_MASK: u64 = 0xff;

/// A port's io_uring.
pub(crate) struct UringIo {
    /// The ring (submission and completion queues of [`RING_ENTRIES`]).
    ring: IoUring,
    /// Reads to submit at the next receive call.
    next_reads: usize,
}

impl std::fmt::Debug for UringIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringIo")
            .field("next_reads", &self.next_reads)
            .finish_non_exhaustive()
    }
}

/// What one receive call did.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Frames added to the batch.
    pub frames: usize,
    /// Bytes of those frames.
    pub bytes: u64,
    /// Reads that failed with an error other than "would block".
    pub errors: u64,
    /// The first of those errors.
    pub read_error: Option<io::Error>,
    /// The ring itself failed (`io_uring_enter`): the frames above were read before it.
    pub ring_error: Option<io::Error>,
}

impl UringIo {
    /// A ring for one port; fails where io_uring is not available (old kernel, seccomp).
    pub(crate) fn new() -> io::Result<UringIo> {
        // Not SINGLE_ISSUER: the ring is made where the port is opened (the control thread)
        // and used by the switch's thread.
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .build(RING_ENTRIES)?;
        Ok(UringIo {
            ring,
            next_reads: MIN_READS,
        })
    }

    /// Submits the `k` requests queued and reaps their completions into `results` (indexed by
    /// `user_data`). On `Ok` every request has completed, so no buffer stays lent to the
    /// kernel: reads on a non-blocking descriptor and writes to a TAP complete without waiting,
    /// and an interrupted wait is resumed. `Err` when the kernel took fewer than `k`: those it
    /// took have completed (their results are in `results`, the others keep the value they
    /// had), and the ring must not be used again.
    fn run(&mut self, k: usize, results: &mut [i32; BATCH_FRAMES]) -> io::Result<()> {
        let submitted = loop {
            match self.ring.submit_and_wait(k) {
                Ok(n) => break n,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // None taken (a taken request is never reported as an error).
                Err(e) => return Err(e),
            }
        };
        let mut reaped = 0;
        loop {
            for cqe in self.ring.completion() {
                if let Some(r) = results.get_mut((cqe.user_data() & INDEX_MASK) as usize) {
                    *r = cqe.result();
                }
                reaped += 1;
            }
            if reaped >= submitted {
                break;
            }
            // Only an interrupted wait gets here; the requests are done or about to be.
            let _ = self.ring.submit_and_wait(submitted - reaped);
        }
        if submitted < k {
            return Err(io::Error::other(format!(
                "io_uring took {submitted} of {k} requests"
            )));
        }
        Ok(())
    }

    /// Reads up to `max_frames` frames from `fd` into `batch`'s free buffers; stops at the
    /// first read error other than "would block" or at a failure of the ring.
    pub(crate) fn recv(&mut self, fd: RawFd, batch: &mut Batch, max_frames: usize) -> Received {
        let mut got = Received::default();
        loop {
            let room = max_frames.saturating_sub(got.frames).min(batch.spare());
            let k = self.next_reads.clamp(1, RING_ENTRIES as usize).min(room);
            if k == 0 {
                break;
            }
            let base = batch.len();
            for j in 0..k {
                let (ptr, len) = batch.spare_buf(base + j);
                // RWF_NOWAIT: an empty queue answers EAGAIN at once (io_uring would otherwise
                // park the read until a frame comes, O_NONBLOCK or not).
                let read = opcode::Read::new(types::Fd(fd), ptr, len as u32)
                    .rw_flags(libc::RWF_NOWAIT)
                    .build()
                    .user_data((base + j) as u64);
                // SAFETY: the buffer is one of the batch's, live and not otherwise used until
                // `submit_all` below returns, by which time every read has completed. The
                // queue has room: it holds RING_ENTRIES and was drained by the last submit.
                if unsafe { self.ring.submission().push(&read) }.is_err() {
                    got.ring_error = Some(io::Error::other("io_uring submission queue full"));
                    return got;
                }
            }
            let mut results = [0i32; BATCH_FRAMES];
            got.ring_error = self.run(k, &mut results).err();
            let mut found = 0;
            // In issue order: a frame after a hole moves down by a buffer swap.
            for (slot, &r) in results.iter().enumerate().take(base + k).skip(base) {
                if r > 0 {
                    let len = r as usize;
                    batch.commit_spare(slot, len);
                    got.frames += 1;
                    got.bytes += len as u64;
                    found += 1;
                } else if r == -libc::EOPNOTSUPP || r == -libc::EINVAL {
                    // A kernel without RWF_NOWAIT reads on TAPs: plain system calls instead.
                    got.ring_error
                        .get_or_insert(io::Error::from_raw_os_error(-r));
                } else if r < 0 && -r != libc::EAGAIN && -r != libc::EINTR {
                    got.errors += 1;
                    got.read_error
                        .get_or_insert(io::Error::from_raw_os_error(-r));
                }
            }
            self.next_reads = (found * 2).max(MIN_READS);
            if found < k || got.read_error.is_some() || got.ring_error.is_some() {
                break;
            }
        }
        got
    }

    /// Writes `batch`'s frames `indices` (at most [`BATCH_FRAMES`]) to `fd`, in order,
    /// stopping at the first refused one. Returns how many went out and, if the ring itself
    /// failed, why (the frames after those were not written).
    pub(crate) fn send(
        &mut self,
        fd: RawFd,
        batch: &Batch,
        indices: &[u8],
    ) -> (usize, Option<io::Error>) {
        let indices = &indices[..indices.len().min(BATCH_FRAMES)];
        for (j, &i) in indices.iter().enumerate() {
            let f = batch.frame(usize::from(i));
            let mut write = opcode::Write::new(types::Fd(fd), f.as_ptr(), f.len() as u32)
                .build()
                .user_data(j as u64);
            if j + 1 < indices.len() {
                write = write.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: the frame is borrowed from `batch` for this whole call, and every write
            // has completed when `run` returns. The queue has room (see `recv`).
            if unsafe { self.ring.submission().push(&write) }.is_err() {
                return (0, Some(io::Error::other("io_uring submission queue full")));
            }
        }
        let mut results = [-libc::ECANCELED; BATCH_FRAMES];
        let failure = self.run(indices.len(), &mut results).err();
        // A write refused (or cut short) cancels the ones linked after it.
        let sent = indices
            .iter()
            .zip(results)
            .take_while(|&(&i, r)| r >= 0 && r as usize == batch.frame(usize::from(i)).len())
            .count();
        (sent, failure)
    }
}
