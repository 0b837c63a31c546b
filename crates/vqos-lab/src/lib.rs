//! # vqos-lab
//!
//! Runs a scenario file (the same one `vqos sim` runs) on real traffic: VMs as network
//! namespaces behind vqosd's TAP ports (or behind a Linux bridge for the kernel baselines), a
//! sink namespace beyond the uplink, an optional router with a tbf bottleneck, iperf3 for TCP
//! and [`vqos_probe::flood`] for UDP. It sets the measurement beside the reference allocation and the simulator's
//! prediction.
//!
//! ## Behavior
//! - [`run_lab`] parses the scenario (optionally scaled in time), simulates it, builds the
//!   topology ([`topo`]), starts vqosd with a generated config (capacity, engine, cost, the
//!   initial policies, the controllers; temporary state file and socket), starts two iperf3 servers per VM in the
//!   sink and the clients in the VMs at their start times (TCP with `-P flows`; UDP as a paced
//!   `sendmmsg` flood of `packet_size`-byte frames at the on-wire `rate` on a thread in the
//!   VM's namespace, ending at a socket that never reads), applies events at their times (policies through the control API or `tc`;
//!   traffic changes restart the VM's client; bottleneck changes `tc qdisc change`), samples
//!   the per-VM byte counters every 100 ms (vqosd's `/v1/stats`, or `/proc/net/dev` of the
//!   bridge's namespace for the baselines), measures vqosd's CPU (`/proc/PID/stat`) and the
//!   kernel's softirq time (`/proc/stat`), and writes `results.json`, `timeseries.csv`,
//!   `report.md` and `rates.svg` (see [`output`]).
//! - Everything is torn down on success, on error and on interrupt ([`install_interrupt_handler`]
//!   sets a flag the runner polls every 100 ms): processes are killed by PID, namespaces deleted
//!   (which removes their links), vqosd's TAPs vanish with it, its scratch directory is removed.
//!
//! ## Limitations
//! - Needs root, `ip`, `tc` and iperf3.
//! - Rates are what each VM sent into the switch, not what reached the sink (under `ovs`, less
//!   what its meter dropped).
//! - Latency: a scenario's `[[probe]]` tables ([`probe`]) run a vqos-probe server in the sink
//!   and one client per phase in the VM; `results.json` gets `latency` (per probe, per phase
//!   p50/p99/p99.9) and the report a latency table. The simulator ignores `[[probe]]`.
//! - A download VM (its `direction`, else `[topology].direction`) runs iperf3 in reverse
//!   (`-R`), its UDP flood from the sink; the baselines then shape the bridge's port toward it
//!   only with the capacity tbf (no per-VM HTB).
//! - The scenario's `controllers` (fairness adjuster, PID-ECN) and `[controller]` gains run in
//!   vqosd (its `controllers` config key; PID-ECN's NC is the tightest link, as in the
//!   simulator); the baselines run without them. The VMs and the sink run Reno (AIMD, the
//!   simulator's model) with `net.ipv4.tcp_ecn = 1`, so TCP negotiates ECN and CE marks reach
//!   the senders (a host default of BBR would ignore them).
//! - The router's tbf sits on its interface toward the sink when every VM uploads, toward the
//!   switch's uplink when every VM downloads, and on an IFB device both interfaces' egress is
//!   redirected to when the directions are mixed (one queue for both, as in the simulator);
//!   bottleneck events change its rate in place (`tc qdisc change`).
//! - CPU numbers on a small machine include iperf3's and TCP's own work in softirq.
//! - Scenarios with `[cost_model] emulate_in_lab` (the switch's core is what is under test) get
//!   vqosd pinned to a CPU of its own and the lab's threads and children to the others
//!   ([`topo::dedicated_cpus`]); UDP floods that ask for more than they get run at nice 19, and
//!   the probes at SCHED_FIFO ([`probe`]). Without these, on a 2-core machine the host's
//!   scheduler, not the switch, decides what the VMs get (docs/experiments.md, C2QoS).
#![deny(missing_docs)]

pub mod app;
pub mod cpu_limit;
pub mod outcome;
pub mod output;
pub mod ovs;
pub mod paper;
pub mod paper_all;
pub mod paper_apps;
pub mod plot;
pub mod probe;
pub mod publish;
pub mod real_load;
pub mod resume;
pub mod run;
pub mod summary;
pub mod sys;
pub mod topo;
pub mod variant;
pub mod verdict;

pub use paper::{run_paper, PaperOptions, PAPERS};
pub use paper_all::{run_all, AllOptions};
pub use publish::{publish, Published};
pub use real_load::PaperSwitch;
pub use run::{run_lab, LabOptions, LabOutcome};
pub use sys::{install_interrupt_handler, interrupted, request_interrupt};
pub use topo::Baseline;

use thiserror::Error;

/// Why a lab run failed.
#[derive(Debug, Error)]
pub enum LabError {
    /// The scenario file is invalid.
    #[error("{file}")]
    Scenario {
        /// The file.
        file: String,
        /// What is wrong.
        #[source]
        source: vqos_sim::ScenarioError,
    },
    /// An option or value is out of range.
    #[error("{0}")]
    Invalid(String),
    /// Not running as root.
    #[error("The lab needs root (network namespaces, TAP devices, tc)")]
    NotRoot,
    /// A tool is missing.
    #[error("Missing tool: {0}")]
    MissingTool(String),
    /// A program could not be started.
    #[error("Cannot run {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A command failed.
    #[error("Command failed: {command}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its stderr.
        stderr: String,
    },
    /// A file could not be read or written.
    #[error("Cannot access {what}")]
    Io {
        /// The path.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Building the topology failed.
    #[error("{0}")]
    Setup(String),
    /// vqosd failed to start, died, or refused a request.
    #[error("{0}")]
    Vqosd(String),
    /// The run was interrupted (Ctrl-C or [`request_interrupt`]).
    #[error("Interrupted; everything the run created was removed")]
    Interrupted,
}
