//! The frame-moving side of a vhost-user port, per queue pair: [`QueueIo`] (one per port
//! object, the port's own on pair 0) and [`VhostUserTxQueue`], the transmit queue a shard
//! other than the port's own gets ([`crate::Port::tx_queue`]), so that shards writing to one
//! guest do not wait for each other.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vm_memory::GuestAddressSpace;

use super::backend::{lock, read, Shared};
use super::counters::bump;
use super::datapath::{Ctx, DataPath};
use super::dirty::DirtyLog;
use super::features::F_LOG_ALL;
use crate::port::{Batch, Port, PortError, PortIoCounters};

/// The session's dirty log while the frontend has `LOG_ALL` acknowledged (a live
/// migration): one lock per batch then, none otherwise.
pub(crate) fn dirty_log(shared: &Shared, features: u64) -> Option<Arc<DirtyLog>> {
    if features & F_LOG_ALL == 0 {
        return None;
    }
    lock(&shared.log).clone()
}

/// Moves frames for one port object: its data path's scratch space, its pair and counters.
#[derive(Debug)]
pub(crate) struct QueueIo {
    /// State shared with the port.
    pub(crate) shared: Arc<Shared>,
    /// The queue pair whose RX queue `send` writes to.
    pub(crate) pair: usize,
    /// Scratch space of the data path.
    pub(crate) datapath: DataPath,
    /// I/O counters of this port object.
    pub(crate) io: PortIoCounters,
}

impl QueueIo {
    /// Moves frames for pair `pair`.
    pub(crate) fn new(shared: Arc<Shared>, pair: usize) -> QueueIo {
        QueueIo {
            shared,
            pair,
            datapath: DataPath::default(),
            io: PortIoCounters::default(),
        }
    }

    /// Runs `f` on the current session's batch context (read once: features, guest memory,
    /// the dirty log while one is on), or returns `None` without a session.
    fn with_session<R>(
        &mut self,
        f: impl FnOnce(&mut DataPath, &Ctx<'_>, usize, &mut PortIoCounters) -> R,
    ) -> Option<R> {
        let shared = &*self.shared;
        let features = shared.features.load(Ordering::Acquire);
        let guard = read(&shared.session);
        let s = guard.as_ref()?;
        let mem = s.mem.memory();
        let log = dirty_log(shared, features);
        let cx = Ctx {
            shared,
            vrings: Some(&s.vrings),
            mem: &mem,
            health: &s.health,
            features,
            log: log.as_deref(),
        };
        Some(f(&mut self.datapath, &cx, s.vrings.len() / 2, &mut self.io))
    }

    /// Reads what the guest sent on every TX queue not lent to another shard (see
    /// `DataPath::recv`).
    pub(crate) fn recv(&mut self, batch: &mut Batch, max_frames: usize) -> usize {
        let mine = !self.shared.lent.load(Ordering::Acquire);
        let shared = self.shared.clone();
        self.with_session(|dp, cx, pairs, io| {
            dp.recv(cx, (pairs, mine), &shared.ready, batch, max_frames, io)
        })
        .unwrap_or(0)
    }

    /// Reads what the guest sent on this object's pair's TX queue (a lent pair).
    fn recv_own(&mut self, batch: &mut Batch, max_frames: usize) -> usize {
        let pair = self.pair;
        let shared = self.shared.clone();
        self.with_session(|dp, cx, pairs, io| {
            let ready = shared.ready_of(pair);
            dp.recv(cx, (pairs, 1 << pair), ready, batch, max_frames, io)
        })
        .unwrap_or(0)
    }

    /// Writes frames to the guest on this object's pair (see `DataPath::send`).
    pub(crate) fn send(&mut self, batch: &Batch, indices: &[u8]) -> usize {
        let pair = self.pair;
        let sent = self.with_session(|dp, cx, _, io| dp.send(cx, pair, batch, indices, io));
        sent.unwrap_or_else(|| {
            let n = indices.len() as u64;
            bump(&self.shared.counters.disconnected_frames, n);
            self.io.tx_errors += n;
            0
        })
    }
}

/// A transmit queue of a [`super::VhostUserPort`] for a shard that does not read the port:
/// it writes to the guest's RX queue of a pair of its own (pair 1 and up; pair 0 when the
/// guest enabled only one). It reads nothing and has no readiness.
#[derive(Debug)]
pub struct VhostUserTxQueue {
    /// The port's name.
    name: String,
    /// The queue.
    queue: QueueIo,
}

impl VhostUserTxQueue {
    /// The next transmit queue of the port behind `shared`, or `None` when it has one queue
    /// pair (the shards then share the port under its lock). Pairs 1.. are handed out in
    /// turn: with more shards than pairs, shards share a pair (and take turns on its vring).
    pub(crate) fn next(shared: &Arc<Shared>) -> Option<VhostUserTxQueue> {
        let others = usize::from(shared.config.queues).checked_sub(1)?;
        if others == 0 {
            return None;
        }
        let k = shared.handed_out.fetch_add(1, Ordering::Relaxed);
        Some(VhostUserTxQueue {
            name: shared.name.clone(),
            queue: QueueIo::new(shared.clone(), 1 + k % others),
        })
    }

    /// The queue pair this queue writes to.
    pub fn pair(&self) -> usize {
        self.queue.pair
    }
}

impl Port for VhostUserTxQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, _batch: &mut Batch, _max_frames: usize) -> Result<usize, PortError> {
        Ok(0)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        Ok(self.queue.send(batch, indices))
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        None
    }

    fn counters(&self) -> PortIoCounters {
        self.queue.io
    }
}

/// A receive queue of a [`super::VhostUserPort`] lent to another shard
/// ([`crate::Port::rx_queue`]): that shard reads the TX queue of one queue pair (the highest
/// not yet lent; pair 0 stays the port's) and writes to the same pair's RX queue. The guest
/// spreads its flows over its pairs, so a multiqueue VM is read on as many shards as it
/// has pairs. Its readiness is the pair's own eventfd, which the kick worker signals for
/// that pair's kicks once it is lent.
#[derive(Debug)]
pub struct VhostUserRxQueue {
    /// The port's name.
    name: String,
    /// The queue.
    queue: QueueIo,
}

impl VhostUserRxQueue {
    /// Lends the highest pair of the port behind `shared` that is not lent yet, if any but
    /// pair 0 is left.
    pub(crate) fn lend(shared: &Arc<Shared>) -> Option<VhostUserRxQueue> {
        let pairs = usize::from(shared.config.queues).min(64);
        for pair in (1..pairs).rev() {
            let bit = 1u64 << pair;
            if shared.lent.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
                // Kicks that came before the pair was lent woke the port: the borrower
                // starts ready (its shard marks it so), nothing is lost.
                return Some(VhostUserRxQueue {
                    name: shared.name.clone(),
                    queue: QueueIo::new(shared.clone(), pair),
                });
            }
        }
        None
    }

    /// The queue pair this queue reads and writes.
    pub fn pair(&self) -> usize {
        self.queue.pair
    }
}

impl Port for VhostUserRxQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        Ok(self.queue.recv_own(batch, max_frames))
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        Ok(self.queue.send(batch, indices))
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.queue.shared.ready_of(self.queue.pair).raw())
    }

    fn counters(&self) -> PortIoCounters {
        self.queue.io
    }

    fn set_busy_poll(&mut self, busy: bool) {
        self.queue.datapath.busy_poll = busy;
    }
}
