//! [`FaultPort`]: wraps any port and injects failures, to test that the switch survives them.
//!
//! ## Behavior
//! Deterministic: every `n`-th call fails, or every received frame is truncated or gets its
//! virtio-net header corrupted, per [`FaultPlan`]. Counts what it injected.

use std::os::fd::RawFd;

use crate::port::{Batch, Port, PortError, PortIoCounters};

/// Which faults to inject (all off by default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Fail every n-th `recv_batch` call with an error.
    pub fail_recv_every: Option<u64>,
    /// Fail every n-th `recv_batch` call with an error after reading (frames stay in the batch).
    pub fail_recv_after_read_every: Option<u64>,
    /// Fail every n-th `send_batch` call with an error (nothing sent).
    pub fail_send_every: Option<u64>,
    /// Cut every n-th received frame to 10 bytes.
    pub truncate_rx_every: Option<u64>,
    /// Set an invalid GSO type in every n-th received frame.
    pub corrupt_hdr_every: Option<u64>,
}

/// A port that misbehaves on purpose.
pub struct FaultPort {
    /// The real port.
    inner: Box<dyn Port>,
    /// What to inject.
    plan: FaultPlan,
    /// `recv_batch` calls so far.
    recv_calls: u64,
    /// `send_batch` calls so far.
    send_calls: u64,
    /// Frames received so far.
    rx_frames: u64,
    /// Faults injected so far.
    injected: u64,
    /// Name, copied so that errors can carry it.
    name: String,
}

impl FaultPort {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn Port>, plan: FaultPlan) -> Self {
        FaultPort {
            name: inner.name().to_string(),
            inner,
            plan,
            recv_calls: 0,
            send_calls: 0,
            rx_frames: 0,
            injected: 0,
        }
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected
    }
}

fn hits(every: Option<u64>, count: u64) -> bool {
    every.is_some_and(|n| n > 0 && count % n == 0)
}

impl Port for FaultPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        self.recv_calls += 1;
        if hits(self.plan.fail_recv_every, self.recv_calls) {
            self.injected += 1;
            return Err(PortError::Injected(self.name.clone()));
        }
        let first = batch.len();
        let n = self.inner.recv_batch(batch, max_frames)?;
        let fail_after = hits(self.plan.fail_recv_after_read_every, self.recv_calls);
        for i in first..first + n {
            self.rx_frames += 1;
            if hits(self.plan.corrupt_hdr_every, self.rx_frames) {
                self.injected += 1;
                batch.frame_mut(i)[1] = 0x33;
            }
            if hits(self.plan.truncate_rx_every, self.rx_frames) {
                self.injected += 1;
                batch.truncate_frame(i, 10);
            }
        }
        if fail_after {
            self.injected += 1;
            return Err(PortError::Injected(self.name.clone()));
        }
        Ok(n)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        self.send_calls += 1;
        if hits(self.plan.fail_send_every, self.send_calls) {
            self.injected += 1;
            return Err(PortError::Injected(self.name.clone()));
        }
        self.inner.send_batch(batch, indices)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        self.inner.readiness_fd()
    }

    fn set_busy_poll(&mut self, busy: bool) {
        self.inner.set_busy_poll(busy);
    }

    fn counters(&self) -> PortIoCounters {
        self.inner.counters()
    }
}
