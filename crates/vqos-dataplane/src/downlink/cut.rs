//! Cut-through: the frames a receive batch has for a vif sent at once while no queue of the
//! shard holds a frame (the module docs of [`super`]).

use vqos_sched::{Granted, Step, Usage, Verdict};

use super::{counted, Downlink};
use crate::frame::{self, VNET_HDR_LEN};
use crate::port::{Batch, BATCH_FRAMES};
use crate::ports::PortEntry;
use crate::stats::DropReason;
use crate::sys::cycles;

/// The frames of one receive batch that go to one vif: `idx` of `batch`, each `wire[i]` bytes
/// on the wire; `shared` has bit `i` set for a frame flooded to several ports (its buffer
/// stays in the batch and it is not CE-marked).
pub(crate) struct ForVif<'a> {
    /// The receive batch.
    pub batch: &'a mut Batch,
    /// Which of its frames.
    pub idx: &'a [u8],
    /// Every frame's wire bytes.
    pub wire: &'a [u64; BATCH_FRAMES],
    /// The flooded ones (bit `i`).
    pub shared: u64,
}

impl Downlink {
    /// True when frames for a vif may be cut through ([`Downlink::cut_through`]): no queue holds
    /// a frame. A vif with frames already set aside in this batch keeps them in order.
    pub fn open(&self) -> bool {
        !self.has_work()
    }

    /// Sends `f`'s frames to vif `vif` (port `entry`) at once when the downlink is
    /// [`open`](Downlink::open), the shaper allows and the engine grants the vif a batch; what
    /// is not sent so is queued, in order (module docs).
    pub fn cut_through(
        &mut self,
        vif: usize,
        entry: &mut PortEntry,
        mut f: ForVif<'_>,
        now_ns: u64,
    ) {
        let mut done = 0;
        if self.open() && self.shaper.allows(now_ns) && vif < self.queues.len() {
            self.sched.set_ready(vif, true);
            let step = self.sched.step(now_ns);
            self.sched.set_ready(vif, false);
            match step {
                Step::Serve(g) if g.vif() == vif => {
                    done = self.send_now(g, entry, &mut f, now_ns);
                }
                // Only `vif` was ready; were the engine to grant another, it is charged nothing.
                Step::Serve(g) => self.sched.charge(g, Usage::default(), now_ns),
                Step::Refused { .. } | Step::Idle { .. } => {}
            }
        }
        for &i in &f.idx[done..] {
            let i = usize::from(i);
            let take = f.shared & (1 << i) == 0;
            let r = self.enqueue(vif, f.batch, i, f.wire[i], take, now_ns);
            counted(r, entry);
        }
    }

    /// The granted part of [`Downlink::cut_through`]: admits, sends and charges; how many of
    /// `f.idx` it took (the rest are queued).
    fn send_now(
        &mut self,
        granted: Granted,
        entry: &mut PortEntry,
        f: &mut ForVif<'_>,
        now_ns: u64,
    ) -> usize {
        let ForVif {
            batch,
            idx,
            wire,
            shared,
        } = f;
        let (idx, wire, shared) = (*idx, *wire, *shared);
        let t0 = cycles();
        let avg = idx.iter().map(|&i| wire[usize::from(i)]).sum::<u64>() / idx.len().max(1) as u64;
        let take = granted
            .max_packets()
            .min(idx.len())
            .min(self.shaper.frames_within(avg));
        let mut go = [0u8; BATCH_FRAMES];
        let mut n = 0;
        for &i in &idx[..take] {
            let w = wire[usize::from(i)];
            self.queues[granted.vif()].arrived += w;
            // wire < 2^26 (frame::wire_bytes): fits u32.
            match self.sched.admit(&granted, w as u32, now_ns) {
                Verdict::Forward => {}
                Verdict::MarkCe => {
                    let eth = &mut batch.frame_mut(usize::from(i))[VNET_HDR_LEN..];
                    if shared & (1 << i) == 0 && frame::mark_ce(eth) {
                        entry.c.ecn_marked += 1;
                    } else {
                        entry.c.ecn_not_ect += 1;
                    }
                }
                Verdict::Drop => {
                    entry.c.drops[DropReason::RateLimited] += 1;
                    continue;
                }
            }
            go[n] = i;
            n += 1;
        }
        let sent = if n == 0 {
            0
        } else {
            entry.port.lock().send_batch(batch, &go[..n]).unwrap_or(0)
        };
        let bytes = go[..sent].iter().map(|&i| wire[usize::from(i)]).sum();
        entry.c.tx_cut_through += sent as u64;
        self.charge(granted, entry, (sent, n), bytes, t0, now_ns);
        take
    }
}
