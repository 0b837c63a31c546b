//! `vqos`: the command line of the vqos virtual switch.
//!
//! Offline commands (`alloc`, `sim`) need no daemon and no root; the control commands talk to a
//! running `vqosd` over its API socket. Exit statuses: see [`exit`].
#![forbid(unsafe_code)]
// Output goes through `out::stdout()`, which notes a closed pipe; `println!` would panic.
#![deny(clippy::print_stdout)]

mod alloc;
mod calibrate;
mod cluster;
mod cluster_agg_sim;
mod cluster_sim;
mod cluster_view;
mod ctl;
mod exit;
mod lab;
mod out;
mod reload;
mod sim;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};

/// vqos — network QoS for the VMs and containers of one host.
#[derive(Parser, Debug)]
#[command(
    name = "vqos",
    version,
    about,
    long_about = None,
    after_help = "Exit status: 0 ok, 1 failure, 2 usage, 3 vqosd (or etcd) unreachable, \
                  4 request refused by vqosd, 5 a --check expectation failed, 141 stdout closed \
                  early (| head), quietly."
)]
struct Cli {
    /// How to reach vqosd (before or after the subcommand).
    #[command(flatten)]
    conn: ctl::ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the reference (weighted max-min) allocation of a link among vifs.
    Alloc(alloc::AllocArgs),
    /// Run a scenario file in the simulator and print the per-phase table.
    Sim(sim::SimArgs),
    /// Vif ports of the running switch: list, add, del, migrate.
    Port(ctl::PortArgs),
    /// Get or set a vif's policy live.
    Policy(ctl::PolicyArgs),
    /// Per-vif rate, share of the uplink, policy and drops of the running switch.
    Stats(ctl::StatsArgs),
    /// The switch at a glance: health, every port with its policy and guest, rates and drops
    /// (exit 1 when vqosd is unhealthy).
    Status(ctl::StatusArgs),
    /// Make vqosd re-read its config file and apply what changed (as SIGHUP does).
    Reload(reload::ReloadArgs),
    /// Fit the running switch's cycle cost model (cycles per frame and per byte); --apply
    /// installs it.
    ///
    /// The model is cycles(frame) = base_cycles + cycles_per_byte * bytes, fitted by least
    /// squares over the last 1024 vif batches the switch forwarded (frames, bytes and the cycles
    /// each batch took). c2qos, and vqos with cost = "cycles", price every purchase with it: a
    /// purchase of R bit/s needs R / (8 * S) frames per second of S bytes (price_frame_bytes,
    /// the iMIX average 354 by default), each costing cycles(S).
    Calibrate(calibrate::CalibrateArgs),
    /// Run a scenario on real traffic in network namespaces (vqosd or a kernel baseline).
    Lab(lab::LabArgs),
    /// Tenant and vif policies across hosts, in etcd; the hosts' status (docs/cluster.md).
    Cluster(cluster::ClusterArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "Example: vqos completions bash > /etc/bash_completion.d/vqos")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (vqos.1 and one per subcommand) into DIR, or print vqos.1.
    Man {
        /// Directory to write the pages into; without it vqos.1 goes to stdout.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Writes `vqos.1` and `vqos-SUB.1` for every subcommand into `dir`, or `vqos.1` to stdout.
fn man(dir: Option<PathBuf>) -> Result<()> {
    let cmd = Cli::command();
    let Some(dir) = dir else {
        let mut out = out::stdout();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        return Ok(out.flush()?);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("Cannot create {}", dir.display()))?;
    let mut pages = vec![("vqos".to_string(), clap_mangen::Man::new(cmd.clone()))];
    for sub in cmd.get_subcommands() {
        let name = format!("vqos-{}", sub.get_name());
        pages.push((name.clone(), clap_mangen::Man::new(sub.clone()).title(name)));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        page.render(&mut buf)?;
        std::fs::write(&path, buf).with_context(|| format!("Cannot write {}", path.display()))?;
    }
    Ok(())
}

fn main() {
    // clap's own usage errors exit with 2 (exit::USAGE).
    let cli = Cli::parse();
    let conn = cli.conn;
    let result = match cli.command {
        Command::Alloc(args) => alloc::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Port(args) => ctl::port(&conn, args),
        Command::Policy(args) => ctl::policy(&conn, args),
        Command::Stats(args) => ctl::stats(&conn, args),
        Command::Status(args) => ctl::status(&conn, args),
        Command::Reload(args) => reload::run(&conn, args),
        Command::Calibrate(args) => calibrate::run(&conn, args),
        Command::Lab(args) => lab::run(args),
        Command::Cluster(args) => cluster::run(args),
        Command::Completions { shell } => {
            // Into a buffer first: the generator panics on a failed write (a closed pipe).
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "vqos", &mut buf);
            out::stdout()
                .write_all(&buf)
                .context("Cannot write the completions")
        }
        Command::Man { dir } => man(dir),
    };
    // Whatever the command: a reader that went away ends the run quietly (exit::CLOSED_PIPE).
    let result = result.and_then(|()| Ok(out::stdout().flush()?));
    if out::closed() {
        std::process::exit(exit::CLOSED_PIPE);
    }
    if let Err(e) = result {
        eprintln!("vqos: {e:#}");
        std::process::exit(exit::status(&e));
    }
}
