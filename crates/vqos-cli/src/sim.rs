//! `vqos sim`: run a scenario in the simulator (being written).

use anyhow::Result;
use clap::Args;

/// Arguments of `vqos sim`.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// The scenario file (TOML, see docs/scenarios.md).
    file: std::path::PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Seed of the simulation's random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `vqos sim`.
pub fn run(args: SimArgs) -> Result<()> {
    anyhow::bail!(
        "vqos sim {}: the simulator is not wired yet",
        args.file.display()
    )
}
