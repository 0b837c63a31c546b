//! The simulated switch core's per-packet cost (`[cost_model]`) and the controllers' parameters
//! (`[controller]`).

use serde::Deserialize;

/// Per-packet CPU cost of the switch, after C2QoS §III: ingress (copy, grows with size),
/// classification (grows with the number of flows), egress; times a deployment factor.
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
}

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
