//! `vqos`: the command line of the vqos virtual switch.
//!
//! Offline commands (`alloc`, `sim`) need no daemon and no root; the control commands talk to a
//! running `vqosd` over its API socket.
#![forbid(unsafe_code)]

mod alloc;
mod ctl;
mod lab;
mod sim;

use clap::{Parser, Subcommand};

/// vqos — network QoS for the VMs and containers of one host.
#[derive(Parser, Debug)]
#[command(name = "vqos", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the reference (weighted max-min) allocation of a link among vifs.
    Alloc(alloc::AllocArgs),
    /// Run a scenario file in the simulator and print the per-phase table.
    Sim(sim::SimArgs),
    /// Vif ports of the running switch: list, add, del.
    Port(ctl::PortArgs),
    /// Get or set a vif's policy live.
    Policy(ctl::PolicyArgs),
    /// Per-vif rate, share of the uplink, policy and drops of the running switch.
    Stats(ctl::StatsArgs),
    /// Run a scenario on real traffic in network namespaces (vqosd or a kernel baseline).
    Lab(lab::LabArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Alloc(args) => alloc::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Port(args) => ctl::port(&args.conn.clone(), args),
        Command::Policy(args) => ctl::policy(&args.conn.clone(), args),
        Command::Stats(args) => ctl::stats(&args.conn.clone(), args),
        Command::Lab(args) => lab::run(args),
    };
    if let Err(e) = result {
        eprintln!("vqos: {e:#}");
        std::process::exit(1);
    }
}
