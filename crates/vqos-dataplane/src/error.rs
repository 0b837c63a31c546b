//! [`SwitchError`]: why a switch operation failed.

use thiserror::Error;
use vqos_sched::PolicyError;

use crate::port::PortError;
use crate::sys::SysError;

/// Why a switch operation failed.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// A port could not be opened.
    #[error("Cannot open port '{name}'")]
    Port {
        /// The port's name.
        name: String,
        /// What failed.
        #[source]
        source: PortError,
    },
    /// The policy (set) was refused; nothing changed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A port of that name exists.
    #[error("Port '{0}' already exists")]
    DuplicatePort(String),
    /// A configured source address belongs to another port (or the MAC table is full).
    #[error("{kind} address {mac} is in use{}", owner.as_ref().map(|o| format!(" by port '{o}'")).unwrap_or_else(|| format!(" ({kind} table full)")))]
    MacInUse {
        /// "MAC" or "IP".
        kind: &'static str,
        /// The address.
        mac: String,
        /// The port that owns it; `None` when the table had no room.
        owner: Option<String>,
    },
    /// No port of that name.
    #[error("Unknown port '{0}'")]
    UnknownPort(String),
    /// A migration of one vif's identity to another (`vqos port migrate`) was refused;
    /// nothing changed.
    #[error("Cannot migrate '{src}' to '{dst}': {reason}")]
    Migrate {
        /// The source port.
        src: String,
        /// The destination port.
        dst: String,
        /// Why.
        reason: String,
    },
    /// A policy set must name every vif port.
    #[error("Vif '{0}' has no policy in the new set")]
    MissingVif(String),
    /// The uplink cannot be removed or given a vif policy.
    #[error("The uplink '{0}' cannot be changed this way")]
    Uplink(String),
    /// An ECN marking probability outside 0..=1.
    #[error("Vif '{vif}': ECN probability {probability} is outside 0..=1")]
    BadEcnProbability {
        /// The vif it was given for.
        vif: String,
        /// What was given.
        probability: f64,
    },
    /// A system call needed by the loop failed.
    #[error("Loop setup failed")]
    Sys(#[from] SysError),
    /// The loop thread could not be started.
    #[error("Cannot start the loop thread")]
    Spawn(#[source] std::io::Error),
    /// `threads` or `cpus` cannot be had (none, more than the CPUs, a CPU that does not
    /// exist, an engine that cannot be sharded); the text says which.
    #[error("Bad threads/cpus: {0}")]
    Threads(String),
    /// A setting of the switch is out of range (the text says which).
    #[error("Bad switch setting: {0}")]
    Setting(String),
    /// The loop is not running (stopped or crashed).
    #[error("The switch is stopped")]
    Stopped,
}
