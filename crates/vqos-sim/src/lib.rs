//! # vqos-sim
//!
//! A deterministic discrete-event simulator that drives the real engines and controllers of
//! `vqos-sched` with TCP-like and UDP sources, so a scenario file predicts in seconds what the
//! lab measures in minutes on real traffic.
//!
//! ## Behavior
//! [`Scenario::parse`] reads and validates a scenario file; [`simulate`] runs it (same seed,
//! same result); [`build_report`] turns the delivered bytes into per-phase means beside the
//! reference allocation and checks the scenario's expectations.
//!
//! ## Limitations
//! See [`sim`]: one forwarding core, no TSO, no timeouts.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cluster;
pub mod cluster_agg;
pub mod cluster_async;
pub mod report;
pub mod scenario;
pub mod settle;
pub mod sim;

pub use report::{build_report, render_text, timeseries_csv, Report};
pub use scenario::{Scenario, ScenarioError};
pub use sim::{simulate, SimOutput, BIN_NS};

/// Parses, simulates and reports a scenario text in one call.
pub fn run_text(text: &str, seed: u64) -> Result<(Report, SimOutput), String> {
    let sc = Scenario::parse(text).map_err(|e| e.to_string())?;
    let out = simulate(&sc, seed).map_err(|e| e.to_string())?;
    let report = build_report(&sc, "sim", &out.bins, BIN_NS, out.cpu_busy);
    Ok((report, out))
}
