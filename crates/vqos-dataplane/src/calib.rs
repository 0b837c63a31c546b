//! [`CostSamples`]: the last [`COST_SAMPLES`] vif batches (frames, bytes, cycles), for
//! `vqos calibrate` to fit the switch's cost model ([`vqos_sched::calibrate`]).
//!
//! ## Behavior
//! - The loop records every charged vif batch that forwarded frames; the oldest sample is
//!   overwritten. One writer (the loop), any number of readers (the daemon's API threads).
//! - A sample is packed into one `u64` (8 bits of frames, 24 of bytes, 32 of cycles), so a
//!   reader never sees half of one: no lock and no allocation per batch.
//! - A batch that does not fit the packing (more than 255 frames, 16 MiB or 2³² cycles — a
//!   batch the kernel preempted for over a second) is not recorded; it is counted in
//!   [`CostSamples::skipped`].
//!
//! ## Limitations
//! - A reader copies the ring while the loop writes it: the copy mixes samples of before and
//!   after, each of them whole.
//! - The frames and bytes are those forwarded; frames the batch read and dropped cost cycles
//!   that the model puts on the forwarded ones.

use std::sync::atomic::{AtomicU64, Ordering};

use vqos_sched::calibrate::Sample;

/// Samples kept: the last this many vif batches.
pub const COST_SAMPLES: usize = 1024;

const FRAME_BITS: u32 = 8;
const BYTE_BITS: u32 = 24;

/// The last [`COST_SAMPLES`] vif batches; see the module docs.
#[derive(Debug)]
pub struct CostSamples {
    /// Packed samples; 0 = never written (a recorded batch has at least one frame).
    slots: Box<[AtomicU64]>,
    /// Samples recorded so far (the next slot is `recorded % COST_SAMPLES`).
    recorded: AtomicU64,
    /// Batches not recorded because they did not fit the packing.
    skipped: AtomicU64,
}

impl Default for CostSamples {
    fn default() -> Self {
        CostSamples {
            slots: (0..COST_SAMPLES).map(|_| AtomicU64::new(0)).collect(),
            recorded: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }
}

/// `sample` packed into one word, or `None` if it does not fit.
fn pack(frames: u32, bytes: u64, cycles: u64) -> Option<u64> {
    if frames >= 1 << FRAME_BITS || bytes >= 1 << BYTE_BITS || cycles > u64::from(u32::MAX) {
        return None;
    }
    Some(u64::from(frames) | bytes << FRAME_BITS | cycles << (FRAME_BITS + BYTE_BITS))
}

fn unpack(word: u64) -> Sample {
    Sample {
        frames: (word & ((1 << FRAME_BITS) - 1)) as u32,
        bytes: (word >> FRAME_BITS) & ((1 << BYTE_BITS) - 1),
        cycles: word >> (FRAME_BITS + BYTE_BITS),
    }
}

impl CostSamples {
    /// An empty ring (allocated once, here).
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one batch (the loop thread only); batches without frames are ignored.
    pub fn record(&self, frames: u32, bytes: u64, cycles: u64) {
        if frames == 0 {
            return;
        }
        let Some(word) = pack(frames, bytes, cycles) else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // One writer: a load and a store, no read-modify-write on the hot path.
        let n = self.recorded.load(Ordering::Relaxed);
        self.slots[(n % COST_SAMPLES as u64) as usize].store(word, Ordering::Relaxed);
        self.recorded.store(n + 1, Ordering::Release);
    }

    /// A copy of the samples held (at most [`COST_SAMPLES`], in no particular order).
    pub fn snapshot(&self) -> Vec<Sample> {
        self.slots
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&w| w != 0)
            .map(unpack)
            .collect()
    }

    /// Batches recorded since the switch started (older ones were overwritten).
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Acquire)
    }

    /// Batches not recorded because they did not fit the packing.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_batches_whole() {
        let ring = CostSamples::new();
        assert!(ring.snapshot().is_empty());
        ring.record(0, 0, 500);
        assert_eq!(ring.recorded(), 0, "an empty batch is no sample");
        ring.record(32, 32 * 65_535, u64::from(u32::MAX));
        assert_eq!(
            ring.snapshot(),
            vec![Sample {
                frames: 32,
                bytes: 32 * 65_535,
                cycles: u64::from(u32::MAX)
            }]
        );
        // Too long to pack (a preempted batch), too many frames, too many bytes: skipped.
        ring.record(1, 64, 1 << 32);
        ring.record(256, 64, 1);
        ring.record(1, 1 << 24, 1);
        assert_eq!((ring.recorded(), ring.skipped()), (1, 3));
        // Wrap around: the oldest are overwritten, the ring never grows.
        for i in 0..(COST_SAMPLES as u64 + 10) {
            ring.record(1, 64 + i, 1000 + i);
        }
        let s = ring.snapshot();
        assert_eq!(s.len(), COST_SAMPLES);
        assert_eq!(ring.recorded(), COST_SAMPLES as u64 + 11);
        let oldest = s.iter().map(|x| x.cycles).min().unwrap();
        assert_eq!(oldest, 1010);
        assert!(s
            .iter()
            .all(|x| x.bytes == x.cycles - 1000 + 64 && x.frames == 1));
    }
}
