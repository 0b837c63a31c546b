//! The daemon's TOML configuration.
//!
//! ```toml
//! capacity = "940Mbit"        # uplink capacity; default "unlimited"
//! capacity_in = "940Mbit"     # downlink capacity (what the vifs receive); default: capacity
//! engine = "vqos"             # rr, ancs, policer, tcm, c2qos, vqos; default "vqos"
//! cost = "bytes"              # what vifs are charged: "bytes" (default) or "cycles"
//! cycles_per_sec = 2000000000 # the core's cycles per second (cost = "cycles", cpu_fair)
//! cpu_fair = true             # engine vqos, cost bytes: shares count the core's time too,
//!                             # so small frames cannot buy the core (default true)
//! variant = "vqos"            # experiments: "paper" runs ANCS's CreditLeft, the fairness
//!                             # paper's Algorithm 1 and PID-ECN marking as the papers wrote
//!                             # them (docs/experiments.md); default "vqos"
//! busy_poll = false           # poll without sleeping (default false: epoll readiness)
//! threads = 1                 # forwarding threads (shards); each reads its own ports
//! # cpus = [2, 3]             # pin them, one CPU per thread (default: not pinned)
//! tap_io = "syscall"          # TAP ports: "syscall" (a read/write per frame, default) or
//!                             # "uring" (batches of reads/writes per io_uring_enter)
//! state_file = "/var/lib/vqos/state.json"
//! expect_state = false        # true: warn loudly when the state file is missing at start
//! max_ports = 1024            # most vif ports (config and API together); default 1024
//! storm_pps = 1000            # broadcast/multicast/unknown-unicast frames/s per port; 0 = off
//! flood_unknown_to_vifs = false # true: a vif's unknown unicast reaches the other vifs too
//! remove_taps_on_exit = false # true: delete the TAPs vqosd created when it stops (default:
//!                             # they persist and the next start re-attaches to them)
//!
//! [api]
//! socket = "/run/vqos/vqosd.sock"
//! tcp = "127.0.0.1:7451"      # optional, loopback only, needs a token
//! token_file = "/etc/vqos/token"   # or token_env = "VQOS_TOKEN"
//!
//! [downlink]                 # optional; see config/downlink.rs
//! schedule = true             # default: what the vifs receive is scheduled (queues, CoDel)
//!
//! [metrics]                  # optional: GET /metrics only, no token, on its own address
//! listen = "127.0.0.1:9469"
//!
//! [uplink]
//! name = "vqos-up"
//! create = true
//! # kind = "af-packet"        # attach to an existing interface (a NIC, no TAP): "tap" (default)
//! #                           # or "af-packet" (then no `create`)
//! # kind = "null"             # benchmarks: discards what it is sent; with `to`, it also sends
//! # to = ["vm1", "vm2"]       # frame_len-byte frames to those null vifs in turn (downloads)
//! # frame_len = 64
//! # queues = 4                # a TAP uplink's queues (default 4, 1 for an existing
//! #                           # single-queue TAP): arrivals steered by destination vif
//!
//! [[port]]
//! name = "vm1"
//! create = true               # vqosd creates the TAP (persistent: it outlives a restart and
//!                             # goes with `vqos port del`); false: attach to an existing one
//! macs = ["02:00:00:00:00:01"]   # the only source MACs it may use (pinned to it)
//! # port_security = false    # without macs: false lets it use any MAC no other port owns
//! #                          # (default true: it locks to the first 4 it sends from) and
//! #                          # turns the guards above layer 2 off (routers, VNFs)
//! # ips = ["10.0.0.5", "fd00::5"]   # the only IP addresses it may claim (default: the first
//! #                          # 2 IPv4 and 8 IPv6 it uses, locked to it)
//! # serves = ["router", "dhcp-server"]   # may send IPv6 RAs / DHCP server messages
//! policy = { weight = 3, min = "200Mbit", max = "500Mbit", priority = 1 }
//! # also: max_out (= max, what the vm sends), max_in = "100Mbit" (what it receives; default:
//! # the same as max, "unlimited": none), burst = "64KiB" (sent above max after idling)
//!
//! [cost_model]                # optional, with cost = "cycles": how purchases are priced
//! base_cycles = 1300.0        # cycles(frame) = base_cycles + cycles_per_byte · bytes
//! cycles_per_byte = 0.25      # (fit them with `vqos calibrate`); neither: a purchase's share
//! price_frame_bytes = 354     # of the capacity is its share of the core. Frames purchases are
//! core_share = 1.0            # priced at (iMIX); share of cycles_per_sec that may be sold
//!
//! [emulate]                   # optional, experiments only: a least cost per vif frame
//! frame_cycles = 20000        # a vif's batch takes at least these cycle-counter (TSC)
//! byte_cycles = 0.25          # cycles per frame read plus these per on-wire byte
//! batch = 1                   # at most this many frames per vif batch (0: no limit)
//!
//! controllers = ["fairness", "pid-ecn"]   # optional, at the top level
//! [fairness]                  # optional, only with "fairness"
//! period = "5s"
//! probe = "500ms"
//! [pid_ecn]                   # optional, only with "pid-ecn"
//! slot = "200ms"
//! kp = 0.0005
//! ki = 0.0005
//! kd = 0.00005
//! capacity = "940Mbit"        # NC; default: the uplink capacity (1Gbit when unlimited)
//!
//! [cluster]                   # optional: the etcd agent (docs/cluster.md, crate::cluster)
//! host = "h1"
//! endpoints = ["http://127.0.0.1:2379"]
//! ```
//!
//! Unknown keys are errors that name the key. The ports and policies are validated as one
//! [`PolicySet`] (weight 0, min > max, Σ min > capacity, duplicates are refused).

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;
use vqos_sched::{CostModel, EngineKind, PolicyError, PolicySet, Pricing, Variant, VifPolicy};

use crate::backend::Port;

/// Queues of a TAP uplink whose config sets none: what the network sends is steered into
/// them by destination vif (`vqos_dataplane::tap_steer`), so that a flood toward one vif fills
/// its queue, not its neighbours' (docs/security.md); few, so that the loop's reads of empty
/// queues cost little. Operators with many vifs may set up to 16.
pub const DEFAULT_UPLINK_TAP_QUEUES: u16 = 4;

mod controller_keys;
mod cost_model;
mod downlink;
mod emulate;
mod threads;
mod uplink;

use crate::wire::{check_port_name, PortRequest, Rate, WireError};
pub use controller_keys::ControllersConfig;
use controller_keys::{controllers, RawFairness, RawPid};
pub use emulate::EmulatedWork;
use emulate::RawEmulate;

/// How TAP ports move frames (config `tap_io`): the daemon's name for the data plane's
/// `TapIo`, which this crate cannot name without its `switch` feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TapIo {
    /// One `read`/`write` system call per frame.
    #[default]
    Syscall,
    /// Batches of reads and writes per `io_uring_enter`.
    Uring,
}

/// Default path of the API socket.
pub use vqos_api::DEFAULT_SOCKET;
/// Default path of the state file.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/vqos/state.json";
/// Default of `storm_pps`: broadcast, multicast and unknown-unicast frames per second a port
/// may send.
pub const DEFAULT_STORM_PPS: u64 = 1_000;
/// Default of `max_ports`: most vif ports of one switch.
pub const DEFAULT_MAX_PORTS: usize = 1024;

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("Cannot read config {path}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax, unknown key or wrong type (the message names the key).
    #[error("Invalid config: {0}")]
    Syntax(String),
    /// An unknown engine name.
    #[error("Invalid config: {0}")]
    Engine(String),
    /// A port entry or MAC that is not valid.
    #[error("Invalid config")]
    Wire(#[from] WireError),
    /// The ports' policies do not form a valid set.
    #[error("Invalid config")]
    Policy(#[from] PolicyError),
    /// The TCP listener would be reachable from outside the host.
    #[error("Invalid config: api.tcp {0} is not a loopback address (use 127.0.0.1 or [::1])")]
    NotLoopback(SocketAddr),
    /// A TCP listener without a token, or a token given twice.
    #[error("Invalid config: {0}")]
    Token(String),
    /// A controller name or parameter that is not valid.
    #[error("Invalid config: {0}")]
    Controllers(String),
    /// The `[cluster]` section is not valid.
    #[error("Invalid config: {0}")]
    Cluster(String),
    /// A `[[port]]` whose kind and settings do not fit together.
    #[error("Invalid config: {0}")]
    Port(String),
    /// `max_ports` is 0 or below the number of configured ports.
    #[error("Invalid config: {0}")]
    MaxPorts(String),
    /// An `[emulate]` value out of range.
    #[error("Invalid config: {0}")]
    Emulate(String),
    /// `threads` or `cpus` that this host cannot give.
    #[error("Invalid config: {0}")]
    Threads(String),
    /// `capacity_in` or a `[downlink]` value out of range.
    #[error("Invalid config: {0}")]
    Downlink(String),
    /// A `[cost_model]` value out of range or out of place.
    #[error("Invalid config: {0}")]
    CostModel(String),
    /// The token file could not be read.
    #[error("Cannot read token file {path}")]
    TokenFile {
        /// The token file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    capacity: Option<Rate>,
    capacity_in: Option<Rate>,
    downlink: Option<downlink::RawDownlink>,
    engine: Option<String>,
    cost: Option<CostModel>,
    cycles_per_sec: Option<u64>,
    cpu_fair: Option<bool>,
    variant: Option<Variant>,
    busy_poll: Option<bool>,
    threads: Option<usize>,
    cpus: Option<Vec<usize>>,
    tap_io: Option<TapIo>,
    storm_pps: Option<u64>,
    remove_taps_on_exit: Option<bool>,
    flood_unknown_to_vifs: Option<bool>,
    state_file: Option<PathBuf>,
    expect_state: Option<bool>,
    max_ports: Option<usize>,
    #[serde(default)]
    api: RawApi,
    #[serde(default)]
    metrics: RawMetrics,
    uplink: Option<uplink::RawUplink>,
    #[serde(default)]
    port: Vec<PortRequest>,
    #[serde(default)]
    controllers: Vec<String>,
    fairness: Option<RawFairness>,
    pid_ecn: Option<RawPid>,
    emulate: Option<RawEmulate>,
    cost_model: Option<cost_model::RawCostModel>,
    cluster: Option<crate::cluster::RawCluster>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApi {
    socket: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    token_file: Option<PathBuf>,
    token_env: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<SocketAddr>,
}

/// The optional TCP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Loopback address and port (port 0: any free port).
    pub addr: SocketAddr,
    /// The bearer token clients must present.
    pub token: String,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Uplink capacity in bit/s; `None` = unlimited.
    pub capacity_bps: Option<u64>,
    /// Downlink capacity ([`PolicySet::capacity_in_bps`]): `None` = `capacity_bps`.
    pub capacity_in_bps: Option<u64>,
    /// The scheduled downlink's queues and AQM (`[downlink]`); `None`: `schedule = false`.
    pub downlink: Option<vqos_sched::DownlinkConfig>,
    /// The scheduling engine.
    pub engine: EngineKind,
    /// What vifs are charged in.
    pub cost: CostModel,
    /// The core's cycle budget per second (cost model `cycles`, `cpu_fair`).
    pub cycles_per_sec: u64,
    /// How purchases are priced in cycles (`[cost_model]`).
    pub pricing: Pricing,
    /// Shares count the core's time too ([`PolicySet::cpu_fair`]); default true.
    pub cpu_fair: bool,
    /// The papers' algorithms with vqos's departures or as written ([`Variant`]).
    pub variant: Variant,
    /// Busy polling instead of readiness notification.
    pub busy_poll: bool,
    /// Forwarding threads (shards).
    pub threads: usize,
    /// CPUs to pin the threads to, one per thread (empty: not pinned).
    pub cpus: Vec<usize>,
    /// How TAP ports move frames.
    pub tap_io: TapIo,
    /// Storm control: most broadcast, multicast and unknown-unicast frames per second and
    /// port (0 = off).
    pub storm_pps: u64,
    /// Unknown unicast from a vif is flooded to the other vifs too, not only the uplink.
    pub flood_unknown_to_vifs: bool,
    /// Delete the TAPs vqosd created when it stops; by default they persist (with their
    /// guests' configuration) and the next start re-attaches to them.
    pub remove_taps_on_exit: bool,
    /// Path of the API's unix socket.
    pub socket_path: PathBuf,
    /// Optional TCP listener.
    pub tcp: Option<TcpConfig>,
    /// Optional read-only listener for `GET /metrics` (`[metrics] listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// Path of the state file.
    pub state_file: PathBuf,
    /// The state file must exist at start (ports were made through the API before): a missing
    /// one is warned about loudly.
    pub expect_state: bool,
    /// Most vif ports (config and API together); more are refused.
    pub max_ports: usize,
    /// The uplink port, if any.
    pub uplink: Option<Port>,
    /// A null uplink's destinations: the null vifs it sends `frame_len`-byte frames to in
    /// turn (`[uplink] to`; empty: it sends nothing).
    pub uplink_to: Vec<String>,
    /// The initial vif ports and their policies, in order.
    pub ports: Vec<(Port, VifPolicy)>,
    /// The controllers run beside the switch (none by default).
    pub controllers: ControllersConfig,
    /// A least cost per vif frame (`[emulate]`, experiments only; none by default).
    pub emulated_work: Option<EmulatedWork>,
    /// The etcd agent (`[cluster]`; none by default).
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

impl Config {
    /// Reads and validates the config file at `path`; `token_env` values come from the process
    /// environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, |k| std::env::var(k).ok())
    }

    /// Parses and validates config text; `env` looks up the variable named by `api.token_env`.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(toml_message(&e, text)))?;
        let engine = match raw.engine {
            Some(name) => name.parse::<EngineKind>().map_err(ConfigError::Engine)?,
            None => EngineKind::Vqos,
        };
        let mut set = PolicySet::new(raw.capacity.and_then(|r| r.0));
        set.cost = raw.cost.unwrap_or_default();
        if let Some(c) = raw.cycles_per_sec {
            set.cycles_per_sec = c;
        }
        set.pricing = cost_model::pricing(raw.cost_model, set.cost)?;
        set.capacity_in_bps = downlink::capacity_in(raw.capacity_in)?;
        let downlink = downlink::downlink(raw.downlink)?;
        let mut ports = Vec::with_capacity(raw.port.len());
        for p in raw.port {
            check_port_name(&p.name)?;
            let policy = p.policy.apply(&VifPolicy::default(), &p.name)?;
            set = set.with_vif(&p.name, policy.clone());
            let port = Port::checked(&p).map_err(ConfigError::Port)?;
            ports.push((port, policy));
        }
        set.validate()?;
        set.check_sold(engine)?;
        let max_ports = raw.max_ports.unwrap_or(DEFAULT_MAX_PORTS);
        if max_ports == 0 || ports.len() > max_ports {
            return Err(ConfigError::MaxPorts(format!(
                "max_ports = {max_ports} but the config has {} port(s) (max_ports must be at \
                 least 1 and at least the number of [[port]])",
                ports.len()
            )));
        }
        let mut controllers = controllers(
            &raw.controllers,
            raw.fairness,
            raw.pid_ecn,
            set.capacity_bps,
        )?;
        let variant = raw.variant.unwrap_or_default();
        if let Some(f) = controllers.fairness.as_mut() {
            f.variant = variant;
        }
        let names: Vec<&str> = ports.iter().map(|(p, _)| p.config.name.as_str()).collect();
        let (uplink, uplink_to) = uplink::parse(raw.uplink, &names)?;
        let tcp = match raw.api.tcp {
            None => {
                if raw.api.token_file.is_some() || raw.api.token_env.is_some() {
                    return Err(ConfigError::Token(
                        "api.token_file/api.token_env given without api.tcp".into(),
                    ));
                }
                None
            }
            Some(addr) => {
                if !addr.ip().is_loopback() {
                    return Err(ConfigError::NotLoopback(addr));
                }
                let token = load_token(
                    raw.api.token_file.as_deref(),
                    raw.api.token_env.as_deref(),
                    env,
                )?;
                Some(TcpConfig { addr, token })
            }
        };
        let emulated_work = raw.emulate.map(emulate::emulated).transpose()?;
        let (threads, cpus) = threads::check(raw.threads, raw.cpus)?;
        for (p, _) in &ports {
            crate::backend::check_thread(&p.config, threads).map_err(ConfigError::Port)?;
        }
        Ok(Config {
            threads,
            cpus,
            capacity_bps: set.capacity_bps,
            capacity_in_bps: set.capacity_in_bps,
            downlink,
            engine,
            cost: set.cost,
            cycles_per_sec: set.cycles_per_sec,
            pricing: set.pricing,
            cpu_fair: raw.cpu_fair.unwrap_or(true),
            variant,
            busy_poll: raw.busy_poll.unwrap_or(false),
            tap_io: raw.tap_io.unwrap_or_default(),
            storm_pps: raw.storm_pps.unwrap_or(DEFAULT_STORM_PPS),
            flood_unknown_to_vifs: raw.flood_unknown_to_vifs.unwrap_or(false),
            remove_taps_on_exit: raw.remove_taps_on_exit.unwrap_or(false),
            socket_path: raw.api.socket.unwrap_or_else(|| DEFAULT_SOCKET.into()),
            tcp,
            metrics_listen: raw.metrics.listen,
            state_file: raw.state_file.unwrap_or_else(|| DEFAULT_STATE_FILE.into()),
            expect_state: raw.expect_state.unwrap_or(false),
            max_ports,
            uplink,
            uplink_to,
            ports,
            controllers,
            emulated_work,
            cluster: raw
                .cluster
                .map(|c| c.validate())
                .transpose()
                .map_err(ConfigError::Cluster)?,
        })
    }

    /// The policy set of the configured ports.
    pub fn policy_set(&self) -> PolicySet {
        let mut set = PolicySet::new(self.capacity_bps);
        set.capacity_in_bps = self.capacity_in_bps;
        set.cost = self.cost;
        set.cycles_per_sec = self.cycles_per_sec;
        set.pricing = self.pricing;
        set.cpu_fair = self.cpu_fair;
        set.variant = self.variant;
        for (p, policy) in &self.ports {
            set = set.with_vif(&p.config.name, policy.clone());
        }
        set
    }

    /// For a reload (SIGHUP, `POST /v1/reload`): the keys of `next` that differ from this
    /// config and cannot change without a restart, empty when `next` may be applied live.
    /// Live: the `[[port]]` list and policies, `capacity`, `capacity_in`, `cpu_fair` and `max_ports`. Every other key
    /// needs a restart; a new key must be listed here (the destructuring makes the compiler
    /// ask).
    pub fn restart_needed(&self, next: &Config) -> Vec<&'static str> {
        let Config {
            capacity_bps: _,
            capacity_in_bps: _,
            downlink,
            engine,
            cost,
            cycles_per_sec,
            pricing,
            cpu_fair: _,
            variant,
            busy_poll,
            threads,
            cpus,
            tap_io,
            storm_pps,
            flood_unknown_to_vifs,
            remove_taps_on_exit,
            socket_path,
            tcp,
            metrics_listen,
            state_file,
            expect_state,
            max_ports: _,
            uplink,
            uplink_to,
            ports: _,
            controllers,
            emulated_work,
            cluster,
        } = self;
        let mut keys = Vec::new();
        let mut differ = |same: bool, key: &'static str| {
            if !same {
                keys.push(key);
            }
        };
        differ(*engine == next.engine, "engine");
        differ(*downlink == next.downlink, "downlink");
        differ(*cost == next.cost, "cost");
        differ(*cycles_per_sec == next.cycles_per_sec, "cycles_per_sec");
        differ(*pricing == next.pricing, "cost_model");
        differ(*variant == next.variant, "variant");
        differ(*busy_poll == next.busy_poll, "busy_poll");
        differ(*threads == next.threads, "threads");
        differ(*cpus == next.cpus, "cpus");
        differ(*tap_io == next.tap_io, "tap_io");
        differ(*storm_pps == next.storm_pps, "storm_pps");
        differ(
            *flood_unknown_to_vifs == next.flood_unknown_to_vifs,
            "flood_unknown_to_vifs",
        );
        differ(
            *remove_taps_on_exit == next.remove_taps_on_exit,
            "remove_taps_on_exit",
        );
        differ(*socket_path == next.socket_path, "api.socket");
        differ(*tcp == next.tcp, "api.tcp/token");
        differ(*metrics_listen == next.metrics_listen, "metrics.listen");
        differ(*state_file == next.state_file, "state_file");
        differ(*expect_state == next.expect_state, "expect_state");
        differ(
            *uplink == next.uplink && *uplink_to == next.uplink_to,
            "uplink",
        );
        differ(*controllers == next.controllers, "controllers");
        differ(*emulated_work == next.emulated_work, "emulate");
        // The etcd agent is a thread started with the daemon, with its own session and lease.
        differ(*cluster == next.cluster, "cluster");
        keys
    }
}

/// The toml error on one line (its multi-line rendering quotes the source), with the line and
/// column of `text` it points at.
fn toml_message(e: &toml::de::Error, text: &str) -> String {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
            format!("{msg} (line {line}, column {column})")
        }
        None => msg,
    }
}

fn load_token(
    file: Option<&Path>,
    var: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let token = match (file, var) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Token(
                "give api.token_file or api.token_env, not both".into(),
            ))
        }
        (None, None) => {
            return Err(ConfigError::Token(
                "api.tcp needs api.token_file or api.token_env".into(),
            ))
        }
        (Some(path), None) => {
            let meta = fs::metadata(path).map_err(|source| ConfigError::TokenFile {
                path: path.to_path_buf(),
                source,
            })?;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(ConfigError::Token(format!(
                    "token file {} is readable by others (chmod 600 it)",
                    path.display()
                )));
            }
            fs::read_to_string(path).map_err(|source| ConfigError::TokenFile {
                path: path.to_path_buf(),
                source,
            })?
        }
        (None, Some(var)) => env(var).ok_or_else(|| {
            ConfigError::Token(format!(
                "environment variable {var} (api.token_env) is not set"
            ))
        })?,
    };
    let token = token.trim().to_string();
    if token.len() < 16 {
        return Err(ConfigError::Token(
            "the API token must be at least 16 characters".into(),
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests;
