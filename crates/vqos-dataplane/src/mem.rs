//! [`MemPort`]: an in-memory port for tests, driven from outside the poll loop through its
//! [`MemPortPeer`] (the "guest" side).
//!
//! ## Behavior
//! The peer injects frames (they wait in an unbounded queue until the loop reads them, exactly
//! like frames in a TAP queue) and collects what the switch sent. Injection signals an eventfd,
//! so the port works with epoll as well as with busy polling.
//!
//! ## Limitations
//! Queues are behind a mutex: fine for tests, not a fast path.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::port::{Batch, Port, PortError, PortIoCounters};
use crate::sys::EventFd;

/// State shared by the port and its peer.
#[derive(Debug)]
struct Shared {
    /// Frames injected by the peer, not yet read by the switch.
    to_switch: Mutex<VecDeque<Vec<u8>>>,
    /// Frames the switch sent, not yet taken by the peer.
    from_switch: Mutex<VecDeque<Vec<u8>>>,
    /// Most frames `from_switch` holds; further sends fail (as a full ring would).
    tx_capacity_frames: usize,
    /// Signalled on every injection.
    event: EventFd,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The switch side of an in-memory port.
#[derive(Debug)]
pub struct MemPort {
    /// Port name.
    name: String,
    /// Queues shared with the peer.
    shared: Arc<Shared>,
    /// Further receive queues ([`MemPort::multi`]) not lent yet ([`Port::rx_queue`]).
    more: std::cell::RefCell<Vec<Arc<Shared>>>,
    /// I/O counters.
    counters: PortIoCounters,
}

/// The outside (guest) side of a [`MemPort`]; cloneable, usable from any thread.
#[derive(Debug, Clone)]
pub struct MemPortPeer {
    /// Queues shared with the port.
    shared: Arc<Shared>,
}

impl MemPort {
    /// A port and its peer; the switch may queue up to `tx_capacity_frames` frames for the peer.
    pub fn pair(name: &str, tx_capacity_frames: usize) -> (MemPort, MemPortPeer) {
        let event = EventFd::new().unwrap_or_else(|e| panic!("MemPort {name}: {e}"));
        let shared = Arc::new(Shared {
            to_switch: Mutex::new(VecDeque::new()),
            from_switch: Mutex::new(VecDeque::new()),
            tx_capacity_frames,
            event,
        });
        (
            MemPort {
                name: name.to_string(),
                shared: shared.clone(),
                more: Default::default(),
                counters: PortIoCounters::default(),
            },
            MemPortPeer { shared },
        )
    }

    /// A port with `queues` queue pairs (at least one) and a peer for each: what a peer
    /// injects waits on its queue; the port reads every queue it has not lent to another
    /// shard ([`Port::rx_queue`] lends the last), a lent queue is read and sent on by its
    /// borrower.
    pub fn multi(
        name: &str,
        queues: usize,
        tx_capacity_frames: usize,
    ) -> (MemPort, Vec<MemPortPeer>) {
        let (mut port, first) = MemPort::pair(name, tx_capacity_frames);
        let mut peers = vec![first];
        for _ in 1..queues {
            let (q, peer) = MemPort::pair(name, tx_capacity_frames);
            port.more.get_mut().push(q.shared);
            peers.push(peer);
        }
        (port, peers)
    }
}

impl MemPortPeer {
    /// Queues a frame (virtio-net header + Ethernet frame) for the switch to read.
    pub fn inject(&self, frame: Vec<u8>) {
        lock(&self.shared.to_switch).push_back(frame);
        self.shared.event.signal();
    }

    /// Frames injected and not yet read by the switch.
    pub fn pending(&self) -> usize {
        lock(&self.shared.to_switch).len()
    }

    /// Takes every frame the switch sent so far.
    pub fn take_sent(&self) -> Vec<Vec<u8>> {
        lock(&self.shared.from_switch).drain(..).collect()
    }
}

impl Port for MemPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        let mut n = 0;
        let more = self.more.get_mut();
        for shared in std::iter::once(&self.shared).chain(more.iter()) {
            let mut q = lock(&shared.to_switch);
            while n < max_frames && !batch.is_full() {
                let Some(f) = q.pop_front() else { break };
                self.counters.rx_frames += 1;
                self.counters.rx_bytes += f.len() as u64;
                batch.push(&f);
                n += 1;
            }
            if q.is_empty() {
                shared.event.clear();
            }
        }
        Ok(n)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        let mut q = lock(&self.shared.from_switch);
        let mut sent = 0;
        for &i in indices {
            if q.len() >= self.shared.tx_capacity_frames {
                self.counters.tx_errors += (indices.len() - sent) as u64;
                break;
            }
            let f = batch.frame(usize::from(i));
            self.counters.tx_frames += 1;
            self.counters.tx_bytes += f.len() as u64;
            q.push_back(f.to_vec());
            sent += 1;
        }
        Ok(sent)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.shared.event.raw())
    }

    fn counters(&self) -> PortIoCounters {
        self.counters
    }

    fn rx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(self.more.borrow_mut().pop().map(|shared| {
            Box::new(MemPort {
                name: self.name.clone(),
                shared,
                more: Default::default(),
                counters: PortIoCounters::default(),
            }) as Box<dyn Port>
        }))
    }
}
