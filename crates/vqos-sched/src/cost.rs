//! What a frame costs the forwarding core, and how purchases are priced in cycles (C2QoS §III).
//!
//! C2QoS measures the cycles a switch spends per packet and finds them linear in packets per
//! second, with the packet size adding only to the ingress copy (its Fig. 3(a)-(b)). So one
//! frame of `bytes` costs `cycles(frame) = base_cycles + cycles_per_byte · bytes`
//! ([`FrameCost`]), measured on the running switch (`vqos calibrate`, [`crate::calibrate`]) or
//! configured.
//!
//! ## Behavior
//! - **Pricing.** Under the cycles cost model a purchase of `R` bit/s is worth
//!   `R / (8·S) · cycles(S)` cycles/s: the frames per second `R` is at the reference frame size
//!   `S` ([`Pricing::frame_bytes`]), times what one such frame costs. The paper prices
//!   purchases "under iMIX traffic", so `S` defaults to the simple iMIX average
//!   ([`IMIX_FRAME_BYTES`]); a tenant that sends smaller frames runs out of cycles below `R`, one
//!   that sends larger ones gets more than `R` (C2TB's intent: its cycles, not its bits, are
//!   guaranteed). Without a model, a purchase's fraction of the capacity is the same fraction of
//!   the core (the linear pricing this crate had before).
//! - **Selling.** What an engine guarantees must fit in the share of the core the switch may
//!   sell ([`Pricing::core_share`] × `cycles_per_sec`): [`crate::PolicySet::check_sold`] (in [`crate::sold`]) refuses a set
//!   that oversells. `c2qos` guarantees every vif its token rate (its `max`, or its `min` when it
//!   has no max); `vqos` guarantees the floors (`min`). The other engines do not price in cycles.
//!
//! ## Limitations
//! - One model for every vif: the paper's deployment factors (remote NUMA, more VMs, more
//!   cores) are folded into the measured or configured `base_cycles` and `cycles_per_byte`, not
//!   kept per vif.
//! - The number of flows (classifier misses) is not priced: a tenant spreading its frames over
//!   many flows pays for its misses from its own cycles, as the paper's noisy neighbours do.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Average frame of the simple iMIX (7:4:1 of 64-, 570- and 1518-byte frames): 354 bytes. The
/// default size purchases are priced at.
pub const IMIX_FRAME_BYTES: u32 = 354;

/// Largest reference frame: a 64 KiB offload frame.
pub const MAX_FRAME_BYTES: u32 = 65_536;

/// Largest `base_cycles` accepted: a frame that costs more than 10 ms of a 10 GHz core is a
/// unit mistake.
pub const MAX_BASE_CYCLES: f64 = 1e8;

/// Largest `cycles_per_byte` accepted (see [`MAX_BASE_CYCLES`]).
pub const MAX_CYCLES_PER_BYTE: f64 = 1e6;

/// Why a cost model or a pricing was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CostError {
    /// A coefficient that is NaN, infinite, negative or absurdly large.
    #[error("{name} = {value} must be a finite number in 0..={max}")]
    BadCoefficient {
        /// `base_cycles` or `cycles_per_byte`.
        name: &'static str,
        /// The value given.
        value: String,
        /// The largest value accepted.
        max: String,
    },
    /// A model in which frames cost nothing.
    #[error("base_cycles and cycles_per_byte cannot both be 0")]
    Free,
    /// A reference frame size outside 1..=65536 bytes.
    #[error("price_frame_bytes = {0} must be in 1..=65536")]
    BadFrameBytes(u32),
    /// A share of the core outside (0, 1].
    #[error("core_share = {0} must be above 0 and at most 1")]
    BadCoreShare(String),
}

/// `cycles(frame) = base_cycles + cycles_per_byte · bytes`: what forwarding one frame costs the
/// core. Validated on construction (and deserialisation): finite, non-negative, not both zero.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFrameCost")]
pub struct FrameCost {
    /// Cycles every frame costs whatever its size (descriptors, classification, egress).
    base_cycles: f64,
    /// Cycles per byte of a frame (the ingress copy).
    cycles_per_byte: f64,
}

/// The fields of a [`FrameCost`] before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFrameCost {
    base_cycles: f64,
    cycles_per_byte: f64,
}

impl TryFrom<RawFrameCost> for FrameCost {
    type Error = CostError;

    fn try_from(raw: RawFrameCost) -> Result<Self, CostError> {
        FrameCost::new(raw.base_cycles, raw.cycles_per_byte)
    }
}

// Both fields are finite (checked by `new`, the only way to build one), so `==` is an
// equivalence relation.
impl Eq for FrameCost {}

fn coefficient(name: &'static str, value: f64, max: f64) -> Result<f64, CostError> {
    if value.is_finite() && (0.0..=max).contains(&value) {
        Ok(value)
    } else {
        Err(CostError::BadCoefficient {
            name,
            value: value.to_string(),
            max: max.to_string(),
        })
    }
}

impl FrameCost {
    /// A model, validated: both coefficients finite, in `0..=`[`MAX_BASE_CYCLES`] and
    /// `0..=`[`MAX_CYCLES_PER_BYTE`], not both zero.
    pub fn new(base_cycles: f64, cycles_per_byte: f64) -> Result<FrameCost, CostError> {
        let base_cycles = coefficient("base_cycles", base_cycles, MAX_BASE_CYCLES)?;
        let cycles_per_byte = coefficient("cycles_per_byte", cycles_per_byte, MAX_CYCLES_PER_BYTE)?;
        if base_cycles == 0.0 && cycles_per_byte == 0.0 {
            return Err(CostError::Free);
        }
        Ok(FrameCost {
            base_cycles,
            cycles_per_byte,
        })
    }

    /// Cycles every frame costs.
    pub fn base_cycles(&self) -> f64 {
        self.base_cycles
    }

    /// Cycles per byte of a frame.
    pub fn cycles_per_byte(&self) -> f64 {
        self.cycles_per_byte
    }

    /// Cycles to forward one frame of `bytes`.
    pub fn cycles(&self, bytes: u32) -> f64 {
        self.base_cycles + self.cycles_per_byte * f64::from(bytes)
    }

    /// Cycles per second a rate of `bps` needs when all its frames are `frame_bytes` long
    /// (`frame_bytes` ≥ 1), rounded to the nearest cycle and saturating at `u64::MAX`.
    pub fn cycles_per_sec(&self, bps: u64, frame_bytes: u32) -> u64 {
        let frame_bytes = frame_bytes.max(1);
        let frames_per_sec = bps as f64 / (8.0 * f64::from(frame_bytes));
        // `as` saturates a float above u64::MAX (and cannot see NaN: both factors are finite).
        (frames_per_sec * self.cycles(frame_bytes)).round() as u64
    }
}

/// How the cycles cost model prices purchases and how much of the core it may sell.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Pricing {
    /// What a frame costs; `None`: a purchase's share of the capacity is the same share of the
    /// core (linear pricing, the default when nothing is configured or calibrated).
    pub model: Option<FrameCost>,
    /// The frame size purchases are priced at, bytes (default [`IMIX_FRAME_BYTES`]).
    pub frame_bytes: u32,
    /// The share of `cycles_per_sec` that purchases may add up to, in (0, 1] (default 1: the
    /// whole core).
    pub core_share: f64,
}

impl Default for Pricing {
    fn default() -> Self {
        Pricing {
            model: None,
            frame_bytes: IMIX_FRAME_BYTES,
            core_share: 1.0,
        }
    }
}

// `core_share` is checked by `validate` before any engine uses a set; an invalid (NaN) share
// only makes an invalid set unequal to itself.
impl Eq for Pricing {}

impl Pricing {
    /// Checks the reference frame size and the share of the core.
    pub fn validate(&self) -> Result<(), CostError> {
        if self.frame_bytes == 0 || self.frame_bytes > MAX_FRAME_BYTES {
            return Err(CostError::BadFrameBytes(self.frame_bytes));
        }
        if !(self.core_share > 0.0 && self.core_share <= 1.0) {
            return Err(CostError::BadCoreShare(self.core_share.to_string()));
        }
        Ok(())
    }
}

/// Per-packet CPU cost of the switch as the simulator models it, after C2QoS §III: ingress
/// (copy, grows with size), classification (grows with the number of flows), egress; times a
/// deployment factor. At a given number of flows it is a [`FrameCost`] ([`Self::linear`]).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CycleCostModel {
    /// Fixed ingress + egress cycles per packet.
    pub per_packet_cycles: f64,
    /// Ingress copy cycles per byte.
    pub per_byte_cycles: f64,
    /// Classification cycles per packet with a warm flow cache.
    pub classify_cycles: f64,
    /// Extra classification cost (fraction) when the flows overflow the flow cache.
    pub miss_factor: f64,
    /// Flows the exact-match cache holds before misses begin.
    pub flow_cache_entries: u32,
    /// Deployment multiplier (remote NUMA 1.4–1.5, 2 cores 1.47, ...).
    pub deployment_factor: f64,
    /// Price purchases with this model (at one flow, warm cache: [`Self::linear`]) at frames
    /// of this many bytes, as vqosd's `[cost_model]` does; unset: purchases are priced as their
    /// share of the capacity (linear pricing).
    pub price_frame_bytes: Option<u32>,
    /// In the lab, make every vif batch of vqosd take at least the model's cycles (`[emulate]`
    /// of vqosd: it spins on the cycle counter when its real work was quicker), so the real
    /// switch's core has the model's cost and the simulator's capacity. The model's cycles are
    /// then the counter's (TSC) cycles: give the scenario the counter's rate as `cpu_hz`. The
    /// simulator ignores the flag. Default false.
    pub emulate_in_lab: bool,
    /// With `emulate_in_lab`: most frames per vif batch of the lab's vqosd (0: no limit, the
    /// engine's 32). A core slowed down to the model's cost that kept batches of 32 would hold
    /// a latency-sensitive vif that much longer behind a batch in progress than the emulated
    /// core does. The simulator (which has no latency) ignores it.
    pub emulate_batch: u32,
}

impl Default for CycleCostModel {
    fn default() -> Self {
        // Calibrated so a 2 GHz core forwards about 10 Gbit/s of 1518-byte frames (~2 400
        // cycles each) and 64-byte frames cost ~10× more cycles per bit (C2QoS Fig. 2).
        CycleCostModel {
            per_packet_cycles: 800.0,
            per_byte_cycles: 0.9,
            classify_cycles: 200.0,
            miss_factor: 1.0,
            flow_cache_entries: 8192,
            deployment_factor: 1.0,
            price_frame_bytes: None,
            emulate_in_lab: false,
            emulate_batch: 0,
        }
    }
}

impl CycleCostModel {
    /// Cycles to forward one packet of `bytes` when `flows` flows cross the switch.
    pub fn cycles(&self, bytes: u32, flows: u32) -> f64 {
        self.frame_cycles(flows) + self.byte_cycles() * f64::from(bytes)
    }

    /// The part of [`cycles`](Self::cycles) every packet costs whatever its size.
    pub fn frame_cycles(&self, flows: u32) -> f64 {
        let miss = (f64::from(flows) / f64::from(self.flow_cache_entries.max(1))).min(1.0);
        let classify = self.classify_cycles * (1.0 + self.miss_factor * miss);
        (self.per_packet_cycles + classify) * self.deployment_factor
    }

    /// The part of [`cycles`](Self::cycles) per byte of a packet.
    pub fn byte_cycles(&self) -> f64 {
        self.per_byte_cycles * self.deployment_factor
    }

    /// The model at one flow (warm cache) as `cycles(frame) = a + b·bytes`: what a switch
    /// calibrated on this core would measure for ordinary traffic.
    pub fn linear(&self) -> Result<FrameCost, CostError> {
        FrameCost::new(self.frame_cycles(1), self.byte_cycles())
    }

    /// The pricing a scenario with this model uses: [`Self::linear`] at `price_frame_bytes`,
    /// or `None` (linear pricing) when `price_frame_bytes` is unset.
    pub fn pricing(&self) -> Result<Option<Pricing>, CostError> {
        let Some(frame_bytes) = self.price_frame_bytes else {
            return Ok(None);
        };
        let p = Pricing {
            model: Some(self.linear()?),
            frame_bytes,
            ..Pricing::default()
        };
        p.validate()?;
        Ok(Some(p))
    }
}

#[cfg(test)]
mod tests;
