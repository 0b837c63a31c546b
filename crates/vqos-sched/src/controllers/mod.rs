//! Controllers layered on an engine: they watch per-vif rates and return new limits (fairness
//! adjuster) or per-frame marking decisions (PID-ECN). Like engines, they take `now` and never
//! read a clock.

pub mod fairness;
pub mod pid_ecn;
