//! The scheduled downlink: what the vifs receive (from the uplink and from each other) waits
//! in a queue per destination vif and leaves it through an engine of the switch's kind, at the
//! downlink capacity, under each vif's inbound policy ([`vqos_sched::PolicySet::downlink`]):
//! its weight, min, priority and inbound max act on what it receives as on what it sends.
//!
//! ## Behavior
//! - **Enqueue** (`Downlink::enqueue`): a unicast frame's buffer is taken from the receive
//!   batch without a copy when it is large (a fresh buffer from the pool takes its place), and
//!   copied into a small buffer otherwise; a flooded copy is always copied. It joins the flow
//!   queue of its flow ([`crate::flow`], [`vqos_sched::fq`]) inside its vif's queue. A queue
//!   past its bound in frames or in buffer memory then drops the oldest frames of its fattest
//!   flow until it is within it (Linux's fq_codel does the same); a shard past its memory
//!   bound drops the arrival (`queue_full` on the destination, either way).
//! - **Cut-through** (`Downlink::cut_through`, `cut.rs`): while no queue of the shard holds a frame and
//!   the shaper is not in debt, the frames a receive batch has for a vif are not queued: the
//!   engine grants the vif a batch as it would at dequeue (the vif is the only one ready, so
//!   the order between vifs is not at stake), its `admit` rules each frame, and they are sent
//!   from the receive batch, charged to the engine and the shaper like a served batch. Frames
//!   past the grant, and every frame once a queue holds one, are queued in arrival order. It
//!   saves the two copies of a small frame (into a pooled buffer, back into the batch sent):
//!   10–15 % of a 64-byte frame's cycles on vhost-user (docs/benchmarks.md). A cut-through
//!   frame waits for no one, so CoDel (a sojourn of 0) has nothing to say of it; a flooded
//!   copy is one buffer shared by every copy, so the engine's CE mark is not put on it
//!   (`ecn_not_ect`), as on the unscheduled path.
//! - **Dequeue** (`Downlink::serve`, up to four batches per poll): the engine picks a ready vif and a
//!   batch size; its flow queues give the frames (flows that were idle first, then the busy
//!   ones in turn by wire bytes); each frame leaving passes its flow's CoDel on its sojourn
//!   time ([`vqos_sched::aqm`]):
//!   signalled, an ECN-capable frame is marked CE (`ecn_marked`), any other is dropped
//!   (`aqm`); then the engine's `admit` (a policer's drop counts `rate_limited`). The batch is
//!   sent with one `send_batch`; frames the port cannot take are lost (`tx_error`), as on every
//!   path: a guest that reads slowly loses its own frames and holds back no other vif's queue.
//!   The batch is charged to the engine (frames, wire bytes, cycles) and to the downlink
//!   shaper, which gates the next batch while in debt.
//!
//! ## Memory, known in advance
//! Each queue holds at most `frames` frames and `bytes` of buffers (a large frame's buffer is
//! [`FRAME_BUF_BYTES`], a small one's [`SMALL_BUF_BYTES`]); a shard holds at most `memory` in
//! all its queues. Worst case per shard: `min(vifs × bytes, memory)`, 256 MiB by default
//! whatever the number of vifs (1,024 vifs at 4 MiB each would be 4 GiB: the shard's bound
//! decides). Pools keep at most [`POOL_BIG`] large and [`POOL_SMALL`] small free buffers.
//!
//! ## Shards
//! Each shard has its own downlink over every vif (the frames it switches: shard 0 reads the
//! uplink). `capacity_in` and each vif's inbound floor and max are divided among them every
//! period by what each queue held and passed ([`crate::balance`]): a vif receiving through
//! two shards gets its max once, not once per shard (docs/dataplane.md, "Shards").

pub use vqos_sched::aqm::DownlinkConfig;
use vqos_sched::fq::{FlowQueues, Popped};
use vqos_sched::{EngineKind, Granted, PolicySet, Scheduler, Step, Usage, Verdict};

use crate::balance::{smooth, Want};
use crate::error::SwitchError;
use crate::frame::{self, FRAME_BUF_BYTES, VNET_HDR_LEN};
use crate::port::{Batch, BATCH_FRAMES};
use crate::ports::{PortEntry, PortTable};
use crate::shaper::UplinkShaper;
use crate::stats::DropReason;
use crate::sys::cycles;

mod cut;
pub(crate) use cut::ForVif;

pub use vqos_sched::aqm::SMALL_BUF_BYTES;

/// Free large buffers a shard keeps for reuse.
pub const POOL_BIG: usize = 64;

/// Free small buffers a shard keeps for reuse.
pub const POOL_SMALL: usize = 1024;

/// Indices `0..BATCH_FRAMES` for `send_batch`.
const ALL: [u8; BATCH_FRAMES] = {
    let mut a = [0u8; BATCH_FRAMES];
    let mut i = 0;
    while i < BATCH_FRAMES {
        a[i] = i as u8;
        i += 1;
    }
    a
};

// A queue's least bound holds one largest frame's buffer.
const _: () = assert!(FRAME_BUF_BYTES as u64 <= vqos_sched::aqm::MIN_QUEUE_BYTES);

/// A frame waiting for its vif (its wire bytes and arrival time are kept by its flow queue).
struct Queued {
    /// Its buffer (virtio-net header + Ethernet frame in the first `len` bytes).
    buf: Box<[u8]>,
    /// Frame length.
    len: usize,
}

/// One vif's queue.
struct VifQueue {
    /// The frames, in flow queues, each with its CoDel.
    frames: FlowQueues<Queued>,
    /// Buffer bytes held.
    held: u64,
    /// Wire bytes queued since the last [`Downlink::sample`].
    arrived: u64,
    /// What joined it, smoothed, bits/s.
    rate: u64,
    /// The vif's port slot.
    slot: usize,
}

impl VifQueue {
    fn new(flows: usize) -> VifQueue {
        VifQueue {
            frames: FlowQueues::new(flows),
            held: 0,
            arrived: 0,
            rate: 0,
            slot: usize::MAX,
        }
    }
}

/// What a queue holds, for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueDepth {
    /// Frames waiting.
    pub frames: u64,
    /// Their bytes on the wire.
    pub bytes: u64,
}

/// What one [`Downlink::serve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// A batch was sent (frames).
    Batch(usize),
    /// The shaper is in debt.
    CapacityWait,
    /// Ready vifs, none may go now.
    Refused,
    /// Nothing queued.
    Idle,
}

/// The downlink of one shard; see the module docs.
pub(crate) struct Downlink {
    /// The engine over every vif's inbound policy.
    sched: Scheduler,
    /// The downlink capacity.
    shaper: UplinkShaper,
    /// Per vif (the policy set's ids).
    queues: Vec<VifQueue>,
    /// The set in force (its names carry queues over a new one).
    set: PolicySet,
    /// Bounds and AQM.
    config: DownlinkConfig,
    /// Buffer bytes held in all queues.
    held: u64,
    /// Free small buffers.
    small: Vec<Box<[u8]>>,
    /// Free large buffers.
    big: Vec<Box<[u8]>>,
    /// The flow hash's seed, drawn when the downlink is made ([`crate::flow`]).
    seed: u64,
    /// The batch being sent.
    out: Batch,
    /// Wire bytes of each frame of `out`.
    out_wire: [u64; BATCH_FRAMES],
}

impl Downlink {
    /// A downlink with an engine of `kind` over `set` (the vifs' inbound policies, as this
    /// shard runs them: [`Switch::downlink_set`](crate::Switch)), its shaper at `shaper_bps`.
    pub fn new(
        kind: EngineKind,
        set: &PolicySet,
        shaper_bps: Option<u64>,
        slots: &[usize],
        config: DownlinkConfig,
        now_ns: u64,
    ) -> Result<Downlink, SwitchError> {
        config.validate().map_err(SwitchError::Setting)?;
        let engine = vqos_sched::build(kind, set, now_ns)?;
        let mut d = Downlink {
            sched: Scheduler::new(engine, set.len()),
            shaper: UplinkShaper::default(),
            queues: Vec::new(),
            set: set.clone(),
            config,
            held: 0,
            small: Vec::new(),
            big: Vec::new(),
            seed: config.flow_seed.unwrap_or_else(random_seed),
            out: Batch::new(),
            out_wire: [0; BATCH_FRAMES],
        };
        d.shaper.configure(shaper_bps, now_ns);
        d.remap(set, slots);
        Ok(d)
    }

    /// Installs a new set (vif `i` in slot `slots[i]`); refused before anything changes
    /// when the engine refuses it. Queues follow their vif by name; a removed vif's are freed.
    pub fn configure(
        &mut self,
        set: &PolicySet,
        shaper_bps: Option<u64>,
        slots: &[usize],
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        self.install(set, slots, now_ns)?;
        self.shaper.configure(shaper_bps, now_ns);
        Ok(())
    }

    /// The engine over `set`, the queues moved to its ids (refused before anything changes).
    fn install(
        &mut self,
        set: &PolicySet,
        slots: &[usize],
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        self.sched.configure(set, now_ns)?;
        self.remap(set, slots);
        self.set = set.clone();
        Ok(())
    }

    /// A new division of the shards' parts ([`crate::balance`]): the shaper follows its part
    /// keeping its tokens; the engine is configured again only when the set changed.
    pub fn update(
        &mut self,
        set: &PolicySet,
        shaper_bps: Option<u64>,
        slots: &[usize],
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        if *set != self.set {
            self.install(set, slots, now_ns)?;
        }
        self.shaper.retarget(shaper_bps, now_ns);
        Ok(())
    }

    /// What each vif's queue says for this period of `dt` ns (`(slot, want)`): greedy when
    /// it holds frames, else the rate that joined it, smoothed.
    pub fn sample(&mut self, dt: u64) -> Vec<(usize, Want)> {
        self.queues
            .iter_mut()
            .map(|q| {
                q.rate = smooth(q.rate, q.arrived, dt);
                q.arrived = 0;
                let want = Want {
                    greedy: !q.frames.is_empty(),
                    rate: q.rate,
                };
                (q.slot, want)
            })
            .collect()
    }

    /// Moves the queues to the ids of `set`, sets each vif's slot and readiness.
    fn remap(&mut self, set: &PolicySet, slots: &[usize]) {
        let names = self.set.vifs.iter().map(|v| v.name.clone());
        let mut old: std::collections::HashMap<String, VifQueue> =
            names.zip(self.queues.drain(..)).collect();
        for (id, spec) in set.vifs.iter().enumerate() {
            let flows = self.config.flows;
            let mut q = old
                .remove(&spec.name)
                .unwrap_or_else(|| VifQueue::new(flows));
            q.slot = slots.get(id).copied().unwrap_or(usize::MAX);
            self.sched.set_ready(id, !q.frames.is_empty());
            self.queues.push(q);
        }
        for (_, q) in old {
            self.held -= q.held;
        }
    }

    /// Its bounds and AQM.
    pub fn config(&self) -> DownlinkConfig {
        self.config
    }

    /// True when some queue holds frames.
    pub fn has_work(&self) -> bool {
        !self.sched.ready().none()
    }

    /// When the downlink next has something to do without new frames (a tick, a refill).
    pub fn wake_at(&self, now_ns: u64) -> u64 {
        let mut at = self.sched.wake_at(now_ns);
        if self.has_work() {
            if let Some(t) = self.shaper.blocked_until() {
                at = at.min(t);
            }
        }
        at
    }

    /// What vif `vif`'s queue holds.
    pub fn depth(&self, vif: usize) -> QueueDepth {
        self.queues
            .get(vif)
            .map_or_else(QueueDepth::default, |q| QueueDepth {
                frames: q.frames.len() as u64,
                bytes: q.frames.wire(),
            })
    }

    /// Queues frame `i` of `batch` (`wire` bytes on the wire) for vif `vif` at `now_ns`, on
    /// its flow's queue; `take`: the frame goes nowhere else, so a large one's buffer may be
    /// taken (the batch gets a fresh one). A vif's queue past its bound then drops the oldest
    /// frames of its fattest flow until it is within it (the arrival's own flow when that is
    /// the fattest; the arrival itself if it is all that flow holds): Ok(frames dropped so,
    /// each a `queue_full` on the vif). Err: the shard's memory is full (`queue_full`), the
    /// arrival is not queued.
    pub fn enqueue(
        &mut self,
        vif: usize,
        batch: &mut Batch,
        i: usize,
        wire: u64,
        take: bool,
        now_ns: u64,
    ) -> Result<u64, DropReason> {
        let Some(q) = self.queues.get_mut(vif) else {
            return Err(DropReason::QueueFull);
        };
        let len = batch.frame(i).len();
        let small = len <= SMALL_BUF_BYTES;
        let cost = if small {
            SMALL_BUF_BYTES
        } else {
            FRAME_BUF_BYTES
        } as u64;
        if self.held + cost > self.config.memory_bytes {
            return Err(DropReason::QueueFull);
        }
        let hash = crate::flow::flow_hash(&batch.frame(i)[VNET_HDR_LEN..], self.seed);
        let buf = if small {
            let mut b = self
                .small
                .pop()
                .unwrap_or_else(|| vec![0u8; SMALL_BUF_BYTES].into_boxed_slice());
            b[..len].copy_from_slice(batch.frame(i));
            b
        } else {
            let mut b = self
                .big
                .pop()
                .unwrap_or_else(|| vec![0u8; FRAME_BUF_BYTES].into_boxed_slice());
            if take {
                batch.swap_buf(i, &mut b);
            } else {
                b[..len].copy_from_slice(batch.frame(i));
            }
            b
        };
        q.frames.push(hash, Queued { buf, len }, wire, now_ns);
        q.held += cost;
        q.arrived += wire;
        self.held += cost;
        // Past the vif's bound: the oldest frames of the fattest flow make room, as in Linux's
        // fq_codel (the arrival's own flow too, when it is the fattest: a drop at its head).
        let mut evicted = 0;
        while q.frames.len() > self.config.queue_frames || q.held > self.config.queue_bytes {
            let Some((f, _)) = q.frames.drop_fattest() else {
                break;
            };
            q.held -= f.buf.len() as u64;
            self.held -= f.buf.len() as u64;
            recycle(f.buf, &mut self.small, &mut self.big);
            evicted += 1;
        }
        self.sched.set_ready(vif, !q.frames.is_empty());
        Ok(evicted)
    }

    /// Counts a sent batch on its port and charges the engine and the shaper: `sent` of `n`
    /// frames taken by the port (`bytes` on the wire), the rest lost (`tx_error`). The vif is
    /// charged what its guest took: frames its port refused cost it nothing more than their
    /// cycles, so a guest that stops reading does not hold the capacity.
    fn charge(
        &mut self,
        granted: Granted,
        entry: &mut PortEntry,
        (sent, n): (usize, usize),
        bytes: u64,
        t0: u64,
        now_ns: u64,
    ) {
        entry.c.tx_frames += sent as u64;
        entry.c.tx_bytes += bytes;
        entry.c.drops[DropReason::TxError] += (n - sent) as u64;
        let usage = Usage {
            packets: sent as u32,
            bytes,
            cycles: cycles().wrapping_sub(t0),
        };
        self.shaper.charge(bytes, now_ns);
        self.sched.charge(granted, usage, now_ns);
    }

    /// Serves one batch if the capacity and the engine allow; see the module docs.
    pub fn serve(&mut self, ports: &mut PortTable, now_ns: u64) -> Served {
        if !self.has_work() {
            // The engine ticks on time whether or not frames wait, as the uplink side's does:
            // its next tick is part of the loop's deadline ([`Downlink::wake_at`]), and one
            // left in the past kept the loop from sleeping.
            self.sched.tick_if_due(now_ns);
            return Served::Idle;
        }
        if !self.shaper.allows(now_ns) {
            return Served::CapacityWait;
        }
        let granted = match self.sched.step(now_ns) {
            Step::Serve(g) => g,
            Step::Refused { .. } => return Served::Refused,
            Step::Idle { .. } => return Served::Idle,
        };
        let t0 = cycles();
        let vif = granted.vif();
        let Downlink {
            sched,
            shaper,
            queues,
            config,
            held,
            small,
            big,
            out,
            out_wire,
            ..
        } = self;
        let q = &mut queues[vif];
        let Some(entry) = ports.get_mut(q.slot) else {
            // The port went away before the snapshot that removes its vif: drop its frames.
            for f in q.frames.drain() {
                recycle(f.buf, small, big);
            }
            *held -= q.held;
            q.held = 0;
            sched.set_ready(vif, false);
            sched.charge(granted, Usage::default(), now_ns);
            return Served::Batch(0);
        };
        let avg = q.frames.wire() / (q.frames.len() as u64).max(1);
        let want = granted
            .max_packets()
            .min(BATCH_FRAMES)
            .min(shaper.frames_within(avg));
        out.clear();
        while out.len() < want {
            let Some(Popped {
                item: mut f,
                wire,
                signal,
            }) = q.frames.pop(&config.aqm, now_ns)
            else {
                break;
            };
            let cost = f.buf.len() as u64;
            q.held -= cost;
            *held -= cost;
            let eth = &mut f.buf[VNET_HDR_LEN..f.len];
            if signal {
                if frame::mark_ce(eth) {
                    entry.c.ecn_marked += 1;
                } else {
                    entry.c.drops[DropReason::Aqm] += 1;
                    recycle(f.buf, small, big);
                    continue;
                }
            }
            // wire < 2^26 (frame::wire_bytes): fits u32.
            match sched.admit(&granted, wire as u32, now_ns) {
                Verdict::Forward => {}
                Verdict::MarkCe => {
                    if frame::mark_ce(eth) {
                        entry.c.ecn_marked += 1;
                    } else {
                        entry.c.ecn_not_ect += 1;
                    }
                }
                Verdict::Drop => {
                    entry.c.drops[DropReason::RateLimited] += 1;
                    recycle(f.buf, small, big);
                    continue;
                }
            }
            out_wire[out.len()] = wire;
            if f.buf.len() == FRAME_BUF_BYTES {
                // The batch takes the buffer and gives back one of the same size.
                out.push_buf(&mut f.buf, f.len);
            } else {
                out.push(&f.buf[..f.len]);
            }
            recycle(f.buf, small, big);
        }
        if q.frames.is_empty() {
            sched.set_ready(vif, false);
        }
        let n = out.len();
        let sent = if n == 0 {
            0
        } else {
            entry.port.lock().send_batch(out, &ALL[..n]).unwrap_or(0)
        };
        let bytes = out_wire[..sent].iter().sum::<u64>();
        self.charge(granted, entry, (sent, n), bytes, t0, now_ns);
        Served::Batch(sent)
    }
}

/// Counts on `entry` what [`Downlink::enqueue`] dropped (the arrival, or frames of a fatter
/// flow that made room for it); true when the arrival was queued.
pub(crate) fn counted(r: Result<u64, DropReason>, entry: &mut PortEntry) -> bool {
    match r {
        Ok(evicted) => {
            entry.c.drops[DropReason::QueueFull] += evicted;
            true
        }
        Err(reason) => {
            entry.c.drops[reason] += 1;
            false
        }
    }
}

/// A seed for the flow hash, from the standard library's random hash keys (each
/// `RandomState` has keys of its own).
fn random_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}

/// Gives a buffer back to its pool (or frees it when the pool is full).
fn recycle(buf: Box<[u8]>, small: &mut Vec<Box<[u8]>>, big: &mut Vec<Box<[u8]>>) {
    let (pool, keep) = if buf.len() == FRAME_BUF_BYTES {
        (big, POOL_BIG)
    } else {
        (small, POOL_SMALL)
    };
    if pool.len() < keep {
        pool.push(buf);
    }
}
