//! TEMPORARY shim until the PID-ECN controller lands.
#![allow(missing_docs, dead_code)]
#[derive(Default)]
pub struct PidParams {
    pub kp: f64,
    pub ki: f64,
    pub kd: f64,
    pub capacity_bps: u64,
    pub seed: u64,
    pub slot_ns: u64,
}
pub struct PidEcn;
impl PidEcn {
    pub fn new(_p: PidParams, _n: usize) -> Self {
        PidEcn
    }
    pub fn next_slot(&self) -> u64 {
        u64::MAX
    }
    pub fn on_slot(&mut self, _t: u64, _b: &[u64]) {}
    pub fn probability(&self, _v: usize) -> f64 {
        0.0
    }
    pub fn should_mark(&mut self, _v: usize) -> bool {
        false
    }
}
