//! The simulated switch core's per-packet cost (`[cost_model]`) and the controllers' parameters
//! (`[controller]`).

use serde::Deserialize;

/// The per-packet CPU cost model (`[cost_model]`): defined with the pricing it feeds in
/// `vqos-sched`, re-exported here under its old path.
pub use vqos_sched::cost::CycleCostModel;

/// Parameters of the controllers (optional `[controller]` table).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerParams {
    /// PID-ECN proportional gain (default: the controller's documented default).
    pub kp: Option<f64>,
    /// PID-ECN integral gain.
    pub ki: Option<f64>,
    /// PID-ECN derivative gain.
    pub kd: Option<f64>,
    /// Fairness adjuster period, seconds.
    pub fairness_period_s: Option<f64>,
}
