//! One queue of a TAP device (`TapQueue`): its descriptor, its counters and, with
//! [`TapIo::Uring`], its own io_uring; and [`TapTxQueue`], a queue a forwarding thread that
//! does not read the TAP writes to without a lock ([`crate::Port::tx_queue`]).
//!
//! ## Behavior
//! - A TAP opened with `IFF_MULTI_QUEUE` has one descriptor per queue; the kernel puts each
//!   frame its side transmits on one of them (by flow hash), and takes frames written to any.
//!   [`crate::TapPort`] reads all its queues; a `TapQueue` is how one of them moves frames.
//! - A [`TapTxQueue`] writes through a descriptor of its own (`dup` of one of the port's
//!   queues) with its own counters and ring, so the thread holding it shares nothing with the
//!   thread reading the port. Writes to one TAP queue from two threads are safe in the kernel
//!   (the tun driver queues under its own lock), so a single-queue TAP hands out transmit
//!   queues too: what they save is the switch's lock around the port, which the reading thread
//!   holds for a whole batch of reads.
//! - A transmit queue is never read: its `recv_batch` returns no frame and it has no
//!   readiness descriptor.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::port::{Batch, Port, PortError, PortIoCounters};
use crate::tap_uring::{TapIo, UringIo};

/// An epoll instance readable while any of `fds` (a port's queues, by index) has frames,
/// level-triggered on each: the readiness descriptor of a port that reads several queues, or
/// that must be able to stop polling one ([`set_polled`]).
pub(crate) fn epoll_over(fds: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 has no memory arguments; checked below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ep is a fresh descriptor we own.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    for (q, &fd) in fds.iter().enumerate() {
        if !set_polled(ep.as_fd(), fd, q, true) {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(ep)
}

/// Puts queue `q`'s descriptor `fd` into the epoll set `ep` (`on`) or takes it out; false when
/// the kernel refused (errno says why).
pub(crate) fn set_polled(ep: BorrowedFd<'_>, fd: RawFd, q: usize, on: bool) -> bool {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: q as u64,
    };
    let op = if on {
        libc::EPOLL_CTL_ADD
    } else {
        libc::EPOLL_CTL_DEL
    };
    // SAFETY: both descriptors are open; ev is live for the call.
    unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) == 0 }
}

/// One queue of a TAP: a non-blocking descriptor and how it moves frames.
#[derive(Debug)]
pub(crate) struct TapQueue {
    /// The queue's descriptor (non-blocking).
    fd: OwnedFd,
    /// I/O counters of this queue.
    pub counters: PortIoCounters,
    /// Its io_uring when it moves frames in batches ([`TapIo::Uring`]).
    uring: Option<UringIo>,
}

impl TapQueue {
    /// A queue on `fd`, moving frames by system calls.
    pub fn new(fd: OwnedFd) -> TapQueue {
        TapQueue {
            fd,
            counters: PortIoCounters::default(),
            uring: None,
        }
    }

    /// Moves frames by `io` from now on: with [`TapIo::Uring`], on a ring made here (an error
    /// if io_uring is not available).
    pub fn set_io(&mut self, io: TapIo) -> io::Result<()> {
        self.uring = match io {
            TapIo::Syscall => None,
            TapIo::Uring => Some(UringIo::new()?),
        };
        Ok(())
    }

    /// How the queue moves frames now (a ring that failed falls back to system calls).
    pub fn io(&self) -> TapIo {
        if self.uring.is_some() {
            TapIo::Uring
        } else {
            TapIo::Syscall
        }
    }

    /// Another descriptor of this queue (a transmit queue's, or a reader's on another shard).
    pub fn dup_fd(&self) -> std::io::Result<OwnedFd> {
        self.fd.as_fd().try_clone_to_owned()
    }

    /// The queue's descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A transmit queue of the port `name` on a duplicate of this queue's descriptor, moving
    /// frames as this one does (or by system calls, should a ring not be made).
    pub fn tx_handle(&self, name: &str) -> Result<TapTxQueue, PortError> {
        let fd = self.dup_fd().map_err(|source| PortError::Io {
            port: name.to_string(),
            op: "dup",
            source,
        })?;
        let mut queue = TapQueue::new(fd);
        // A ring that cannot be made leaves the handle on system calls: it still works.
        let _ = queue.set_io(self.io());
        Ok(TapTxQueue {
            name: name.to_string(),
            queue,
        })
    }

    /// [`Port::recv_batch`] on this queue (of the port `name`).
    pub fn recv(
        &mut self,
        name: &str,
        batch: &mut Batch,
        max_frames: usize,
    ) -> Result<usize, PortError> {
        if self.uring.is_some() {
            return self.recv_uring(name, batch, max_frames);
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
                            port: name.to_string(),
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

    /// [`Port::send_batch`] on this queue (of the port `name`).
    pub fn send(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
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

    /// [`TapQueue::recv`] on the io_uring.
    fn recv_uring(
        &mut self,
        name: &str,
        batch: &mut Batch,
        max_frames: usize,
    ) -> Result<usize, PortError> {
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
                port: name.to_string(),
                op,
                source,
            }),
            None => Ok(got.frames),
        }
    }

    /// [`TapQueue::send`] on the io_uring.
    fn send_uring(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        let raw = self.fd.as_raw_fd();
        let Some(uring) = self.uring.as_mut() else {
            return Ok(0);
        };
        let (sent, failure) = uring.send(raw, batch, indices);
        for &i in &indices[..sent] {
            self.counters.tx_frames += 1;
            self.counters.tx_bytes += batch.frame(usize::from(i)).len() as u64;
        }
        if failure.is_some() {
            // The ring is broken and wrote nothing after `sent`: the rest goes by plain system
            // calls, now and from now on.
            self.uring = None;
            self.counters.uring_failures += 1;
            return Ok(sent + self.send(batch, &indices[sent..])?);
        }
        self.counters.tx_errors += (indices.len() - sent) as u64;
        Ok(sent)
    }
}

/// A transmit queue of a TAP for a thread that does not read it (see the module docs).
#[derive(Debug)]
pub struct TapTxQueue {
    /// The TAP's name.
    name: String,
    /// Its queue.
    queue: TapQueue,
}

impl Port for TapTxQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, _batch: &mut Batch, _max_frames: usize) -> Result<usize, PortError> {
        Ok(0)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        self.queue.send(batch, indices)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        None
    }

    fn counters(&self) -> PortIoCounters {
        self.queue.counters
    }
}
