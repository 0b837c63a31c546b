//! `[emulate]`: a least cost per vif frame, to emulate a slower core (experiments only).

use serde::Deserialize;
use vqos_sched::engine::MAX_BURST;

use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEmulate {
    #[serde(default)]
    pub frame_cycles: u64,
    #[serde(default)]
    pub byte_cycles: f64,
    #[serde(default)]
    pub batch: usize,
}

/// `[emulate]`: a least cost per vif frame, to emulate a slower core (experiments only; the
/// switch backend hands it to the data plane's `EmulatedWork`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedWork {
    /// Cycles (counter units: TSC on x86_64) per frame read.
    pub per_frame_cycles: u64,
    /// Cycles per on-wire byte forwarded.
    pub per_byte_cycles: f64,
    /// Most frames per vif batch while emulating (0: the engine's grant), at most
    /// [`MAX_BURST`].
    pub batch_frames: usize,
}

/// The `[emulate]` table, checked.
pub(super) fn emulated(e: RawEmulate) -> Result<EmulatedWork, ConfigError> {
    // The loop answers no command while it spins: at most ~1 ms per frame and
    // ~0.2 ms per KiB at a few GHz, so even a batch of 32 offload frames of 64 KiB
    // stays under a second.
    if e.frame_cycles > 5_000_000
        || !(0.0..=100.0).contains(&e.byte_cycles)
        || e.byte_cycles.is_nan()
    {
        return Err(ConfigError::Emulate(format!(
            "emulate: frame_cycles must be 0..=5000000 and byte_cycles 0..=100 \
                 (got {} and {})",
            e.frame_cycles, e.byte_cycles
        )));
    }
    if e.batch > usize::from(MAX_BURST) {
        return Err(ConfigError::Emulate(format!(
            "emulate: batch must be 0..={MAX_BURST} frames (got {})",
            e.batch
        )));
    }
    Ok(EmulatedWork {
        per_frame_cycles: e.frame_cycles,
        per_byte_cycles: e.byte_cycles,
        batch_frames: e.batch,
    })
}
