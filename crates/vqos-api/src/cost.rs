//! The cost model on the wire: `GET /v1/cost-model`, `POST /v1/calibrate`, and the
//! `cost_model` of `GET /v1/stats`.

use serde::{Deserialize, Serialize};

/// How the switch prices purchases in cycles (`GET /v1/cost-model`, `cost_model` in
/// `GET /v1/stats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModelView {
    /// What vifs are charged: `"cycles"` or `"bytes"` (the model prices only under cycles).
    pub cost: String,
    /// Where the model comes from: `"config"` (`[cost_model]`), `"calibrated"` (installed by
    /// `POST /v1/calibrate` with `apply`), or `"capacity share"` (no model: a purchase's share
    /// of the capacity is its share of the core).
    pub source: String,
    /// Cycles every frame costs; `null` without a model.
    pub base_cycles: Option<f64>,
    /// Cycles per byte of a frame; `null` without a model.
    pub cycles_per_byte: Option<f64>,
    /// The frame size purchases are priced at, bytes.
    pub price_frame_bytes: u32,
    /// The share of `cycles_per_sec` purchases may add up to.
    pub core_share: f64,
    /// The core's cycle budget per second (config `cycles_per_sec`).
    pub cycles_per_sec: u64,
    /// What the engine's guarantees need, priced (cost units per second); `null` when the
    /// engine sells nothing in this unit.
    pub sold_per_sec: Option<u64>,
    /// What may be sold (cost units per second); `null` as `sold_per_sec`.
    pub budget_per_sec: Option<u64>,
    /// Vif batches sampled for calibration (at most 1024, the latest).
    #[serde(default)]
    pub samples: usize,
}

/// The body of `POST /v1/calibrate` (optional: an empty body fits without applying).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrateRequest {
    /// Install the fitted model in the running switch (until vqosd restarts).
    #[serde(default)]
    pub apply: bool,
}

/// The answer of `POST /v1/calibrate`: the fit and whether it was installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationView {
    /// Fitted cycles per frame (the per-batch cost spread over a full batch included).
    pub base_cycles: f64,
    /// Fitted cycles per byte.
    pub cycles_per_byte: f64,
    /// Fitted cycles per batch whatever it holds (before being spread over 32 frames).
    #[serde(default)]
    pub batch_cycles: f64,
    /// Batches the fit used.
    pub samples: usize,
    /// Batches left out as outliers (preempted).
    pub outliers: usize,
    /// Smallest mean frame size of a batch used, bytes.
    pub min_frame_bytes: u64,
    /// Largest mean frame size of a batch used, bytes.
    pub max_frame_bytes: u64,
    /// RMS of the relative error of the model over the batches used.
    pub rms_relative_error: f64,
    /// The unit of the cycles (`"tsc"` or `"ns"`, the loop's `cycles_unit`).
    pub cycles_unit: String,
    /// True when the model was installed (`apply`).
    pub applied: bool,
    /// The pricing in force after the call.
    pub cost_model: CostModelView,
}

impl CostModelView {
    /// One line on the pricing in force (for `vqos stats` and `vqos calibrate`), e.g.
    /// `pricing (cycles): config model, 1300.0 + 0.2500 x bytes cycles per frame, priced at
    /// 1518-byte frames; purchases need 1.106G of 1.540G cycles/s (72 %)`.
    pub fn describe(&self) -> String {
        let m = self;
        let model = match (m.base_cycles, m.cycles_per_byte) {
            (Some(a), Some(b)) => format!(
                "{} model, {a:.1} + {b:.4} x bytes cycles per frame, priced at {}-byte frames",
                m.source, m.price_frame_bytes
            ),
            _ => {
                "no model, a purchase's share of the capacity is its share of the core".to_string()
            }
        };
        let unit = if m.cost == "cycles" {
            "cycles/s"
        } else {
            "bytes/s"
        };
        let sold = match (m.sold_per_sec, m.budget_per_sec) {
            (Some(s), Some(b)) if b > 0 => format!(
                "; purchases need {} of {} {unit} ({:.0} %)",
                giga(s),
                giga(b),
                100.0 * s as f64 / b as f64
            ),
            _ => String::new(),
        };
        format!("pricing ({}): {model}{sold}", m.cost)
    }
}

fn giga(v: u64) -> String {
    format!("{:.3}G", v as f64 / 1e9)
}
