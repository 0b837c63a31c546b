//! The boundary between the daemon and the switch: the [`Backend`] trait, the statistics it
//! reports, and [`MockBackend`] (`backend/mock.rs`), an in-memory switch for tests and API
//! demos.
//!
//! The daemon validates every change as a whole policy set before it calls the backend, so a
//! backend sees only changes that already passed [`PolicySet::validate`]; it may still refuse
//! (a TAP that cannot be opened, its own policy check) and must then leave itself unchanged.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use vqos_sched::calibrate::Sample;
use vqos_sched::{PolicyError, PolicySet, VifPolicy};

pub use vqos_api::stats::{LoopStats, PortStats, SwitchStats};
use vqos_api::wire::{MacAddr, PortConfig, PortKind, PortRequest, PortState, VhostUserRole};

use crate::socket_access::SocketAccess;

/// Why the switch refused or failed a change.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BackendError {
    /// The switch found the policy invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// No port of that name in the switch.
    #[error("Unknown port '{0}'")]
    UnknownPort(String),
    /// A port of that name already exists.
    #[error("Port '{0}' already exists")]
    PortExists(String),
    /// A configured MAC address belongs to another port.
    #[error("{0}")]
    MacInUse(String),
    /// A migration (`vqos port migrate`) the switch refused.
    #[error("{0}")]
    Migrate(String),
    /// The switch failed as a whole (stopped, unresponsive loop).
    #[error("Switch: {0}")]
    Switch(String),
    /// The port could not be created, attached or removed (TAP, ioctl, ...).
    #[error("Port '{name}': {message}")]
    Port {
        /// The port.
        name: String,
        /// What failed, from the data plane.
        message: String,
    },
}

/// A port as the daemon holds it: how it is made (the API's [`PortConfig`], checked by
/// [`Port::checked`]) and what it acquired since (persisted with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// How it is made.
    pub config: PortConfig,
    /// Addresses locked to it first come, its identity handed over.
    pub state: PortState,
}

impl Port {
    /// The port a `POST /v1/ports` body or a `[[port]]` entry describes, checked: a vhost-user
    /// port needs its socket (an absolute path) and has no TAP to create or attach; a TAP has
    /// no socket nor socket role. Defaults are made explicit (a null port's `frame_len`), the
    /// services sorted; it has acquired nothing yet.
    pub fn checked(req: &PortRequest) -> Result<Port, String> {
        let frame_len = check_frame_len(&req.name, req.kind, req.frame_len)?;
        SocketAccess::of(req).check(&req.name, req.kind, req.mode)?;
        check_kind(req)?;
        check_addresses(req)?;
        let mut config = req.clone().with_policy(());
        config.frame_len = frame_len;
        config.serves.sort_unstable();
        config.serves.dedup();
        Ok(Port {
            config,
            state: PortState::default(),
        })
    }
}

/// What a port of `req.kind` may set.
fn check_kind<P>(req: &PortConfig<P>) -> Result<(), String> {
    match req.kind {
        PortKind::Null => {
            if req.socket.is_some() || req.mode.is_some() || !req.create {
                return Err(format!(
                    "Port '{}': a null port has no socket, mode nor TAP to attach",
                    req.name
                ));
            }
            check_queues(
                req,
                "receive queues of the generator, read on as many threads",
            )?;
        }
        PortKind::AfPacket => {
            return Err(format!(
                "Port '{}': kind = \"af-packet\" is for the uplink only ([uplink] kind)",
                req.name
            ));
        }
        PortKind::Tap => {
            if req.socket.is_some() || req.mode.is_some() {
                return Err(format!(
                    "Port '{}': socket and mode are for kind = \"vhost-user\"",
                    req.name
                ));
            }
            check_queues(req, "queues of the TAP, IFF_MULTI_QUEUE above 1")?;
        }
        PortKind::VhostUser => {
            let Some(socket) = &req.socket else {
                return Err(format!(
                    "Port '{}': a vhost-user port needs its socket path",
                    req.name
                ));
            };
            if !socket.starts_with('/') || socket.contains('\0') || socket.len() > 107 {
                return Err(format!(
                    "Port '{}': socket '{socket}' must be an absolute path of at most 107 bytes",
                    req.name
                ));
            }
            if !req.create {
                return Err(format!(
                    "Port '{}': create = false is for TAPs (a vhost-user port has its socket)",
                    req.name
                ));
            }
            check_queues(req, "queue pairs offered to the guest")?;
        }
    }
    Ok(())
}

/// A port's `thread` among the switch's `threads` forwarding threads.
pub fn check_thread<P>(req: &PortConfig<P>, threads: usize) -> Result<(), String> {
    match req.thread.filter(|&t| t >= threads) {
        Some(t) => Err(format!(
            "Port '{}': thread = {t}, but the switch has {threads} forwarding thread(s) \
             (0..={})",
            req.name,
            threads.saturating_sub(1)
        )),
        None => Ok(()),
    }
}

/// A port's `queues` within 1..=[`MAX_QUEUES`] (`what` they are, for the error).
pub(crate) fn check_queues<P>(req: &PortConfig<P>, what: &str) -> Result<(), String> {
    match req.queues.filter(|q| !(1..=MAX_QUEUES).contains(q)) {
        Some(q) => Err(format!(
            "Port '{}': queues = {q} is outside 1..={MAX_QUEUES} ({what})",
            req.name
        )),
        None => Ok(()),
    }
}

/// Shortest null-port frame, bytes on the wire (the data plane's `NULL_MIN_FRAME`; this crate
/// builds without the data plane, a test in `switch.rs` checks they agree).
pub const NULL_MIN_FRAME: u32 = 64;
/// Longest null-port frame (the data plane's `NULL_MAX_FRAME`).
pub const NULL_MAX_FRAME: u32 = 1518;

/// Most queues of a port: queue pairs of a vhost-user port, queues of a TAP (the data plane's
/// `MAX_QUEUE_PAIRS` and `MAX_TAP_QUEUES`; a test in `switch.rs` checks they agree).
pub const MAX_QUEUES: u16 = 16;

/// A port's `frame_len`: null ports only, within what a null port generates (default 64), or
/// 0 for a null vif that sends nothing and only receives (download benchmarks).
pub fn check_frame_len(
    name: &str,
    kind: PortKind,
    len: Option<u32>,
) -> Result<Option<u32>, String> {
    match (kind, len) {
        (PortKind::Null, None) => Ok(Some(NULL_MIN_FRAME)),
        (PortKind::Null, Some(0)) => Ok(Some(0)),
        (PortKind::Null, Some(l)) if (NULL_MIN_FRAME..=NULL_MAX_FRAME).contains(&l) => Ok(Some(l)),
        (PortKind::Null, Some(l)) => Err(format!(
            "Port '{name}': frame_len {l} is outside {NULL_MIN_FRAME}..={NULL_MAX_FRAME} (bytes \
             on the wire, FCS included), or 0 (it only receives)"
        )),
        (_, None) => Ok(None),
        (_, Some(_)) => Err(format!("Port '{name}': frame_len is for kind = \"null\"")),
    }
}

/// The refusal of a port named `name` configured with `macs` and `ips` when another port of
/// `ports` is configured with one of them ("MAC address … is in use by port '…'"): a
/// configured address belongs to one port. The data plane refuses a second owner too;
/// checking here answers before a TAP is made.
pub fn configured_address_in_use(
    ports: &[Port],
    name: &str,
    macs: &[MacAddr],
    ips: &[std::net::IpAddr],
) -> Option<String> {
    let others = || (ports.iter().map(|o| &o.config)).filter(|o| o.name != name);
    let mac = macs.iter().find_map(|m| {
        others()
            .find(|o| o.macs.contains(m))
            .map(|o| format!("MAC address {m} is in use by port '{}'", o.name))
    });
    mac.or_else(|| {
        ips.iter().find_map(|ip| {
            others()
                .find(|o| o.ips.contains(ip))
                .map(|o| format!("IP address {ip} is in use by port '{}'", o.name))
        })
    })
}

/// A port's IP allow-list and services: only with port security (without it nothing is
/// checked above layer 2), and only addresses a station can send from.
fn check_addresses<P>(req: &PortConfig<P>) -> Result<(), String> {
    let unset = req.ips.is_empty() && req.serves.is_empty();
    if !req.port_security && !unset {
        return Err(format!(
            "Port '{}': ips and serves need port_security (without it no address is checked)",
            req.name
        ));
    }
    match req
        .ips
        .iter()
        .find(|ip| ip.is_unspecified() || ip.is_multicast() || ip.is_loopback())
    {
        Some(ip) => Err(format!(
            "Port '{}': {ip} cannot be a vif's address (unspecified, multicast or loopback)",
            req.name
        )),
        None => Ok(()),
    }
}

/// What adding a port did, for the log ([`Backend::add_port`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortOpened {
    /// A TAP was made (none of that name was left by a previous run).
    TapCreated,
    /// The persistent TAP a previous run made was found again: in the host's namespace
    /// (`netns: None`) or in the named network namespace a guest moved it into.
    TapReattached {
        /// The namespace's name (under `/run/netns`).
        netns: Option<String>,
    },
    /// An existing persistent TAP the switch does not own (`create = false`).
    TapAttached,
    /// A null port generating frames of this length (benchmarks).
    Null {
        /// Bytes on the wire.
        frame_len: u32,
    },
    /// A vhost-user port on its socket.
    VhostUser {
        /// Server: vqosd listens on the socket; client: QEMU does and vqosd connects.
        role: VhostUserRole,
        /// The socket's path.
        socket: String,
    },
}

impl std::fmt::Display for PortOpened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortOpened::TapCreated => f.write_str("TAP created"),
            PortOpened::TapReattached { netns: None } => f.write_str("TAP re-attached"),
            PortOpened::TapReattached { netns: Some(ns) } => {
                write!(f, "TAP re-attached in network namespace {ns}")
            }
            PortOpened::TapAttached => f.write_str("attached to an existing TAP"),
            PortOpened::Null { frame_len: 0 } => write!(f, "null port, receiving only"),
            PortOpened::Null { frame_len } => write!(f, "null port, {frame_len}-byte frames"),
            PortOpened::VhostUser {
                role: VhostUserRole::Server,
                socket,
            } => write!(f, "vhost-user server on {socket}"),
            PortOpened::VhostUser {
                role: VhostUserRole::Client,
                socket,
            } => write!(f, "vhost-user client of {socket}"),
        }
    }
}

impl PortOpened {
    /// What adding `port` does on a host where no TAP of its name exists yet (the mock's
    /// answer; the real switch says what it found).
    pub fn fresh(port: &Port) -> PortOpened {
        let port = &port.config;
        match port.kind {
            PortKind::VhostUser => PortOpened::VhostUser {
                role: port.mode.unwrap_or_default(),
                socket: port.socket.clone().unwrap_or_default(),
            },
            PortKind::Null => PortOpened::Null {
                frame_len: port.frame_len.unwrap_or(NULL_MIN_FRAME),
            },
            _ if port.create => PortOpened::TapCreated,
            _ => PortOpened::TapAttached,
        }
    }
}

/// The forwarding loop's liveness as the daemon judges it ([`Backend::loop_health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopHealth {
    /// The loop thread has not exited (stopped, or died of a panic).
    pub running: bool,
    /// Nanoseconds since the loop last published its stats.
    pub stats_age_ns: u64,
    /// How often a live loop publishes its stats, ns.
    pub stats_interval_ns: u64,
}

/// A loop that has not published its stats for this many of its stats intervals is dead (hung
/// in a call, spinning in a bug, starved). With the data plane's 25 ms interval that is 5 s:
/// far above the longest legitimate pause (an `[emulate]` batch spins for under a second; a
/// loaded host deschedules the thread for milliseconds), so a slow host is never taken for a
/// dead loop, and short enough that systemd restarts a hung switch within seconds.
pub const STALE_AFTER_INTERVALS: u64 = 200;

impl LoopHealth {
    /// A live loop that published just now (the mock's default).
    pub fn alive(stats_interval_ns: u64) -> LoopHealth {
        LoopHealth {
            running: true,
            stats_age_ns: 0,
            stats_interval_ns,
        }
    }

    /// The age beyond which the loop counts as dead, ns ([`STALE_AFTER_INTERVALS`] intervals).
    pub fn stale_after_ns(&self) -> u64 {
        self.stats_interval_ns
            .max(1)
            .saturating_mul(STALE_AFTER_INTERVALS)
    }

    /// Why the loop is not healthy, `None` when it is.
    pub fn problem(&self) -> Option<String> {
        if !self.running {
            return Some("The forwarding loop has stopped".to_string());
        }
        if self.stats_age_ns > self.stale_after_ns() {
            return Some(format!(
                "The forwarding loop has not reported for {} ms (limit {} ms)",
                self.stats_age_ns / 1_000_000,
                self.stale_after_ns() / 1_000_000
            ));
        }
        None
    }
}

/// The switch as the daemon drives it. Implementations are shared between the API threads.
pub trait Backend: Send + Sync {
    /// Adds a vif port with its policy; says what it opened.
    fn add_port(&self, port: &Port, policy: &VifPolicy) -> Result<PortOpened, BackendError>;
    /// Removes a vif port.
    fn remove_port(&self, name: &str) -> Result<(), BackendError>;
    /// Hands vif `src`'s identity (policy, port security, addresses, counters at its
    /// removal) over to vif `dst` (`vqos port migrate`); on refusal nothing changed.
    fn migrate_port(&self, src: &str, dst: &str) -> Result<(), BackendError>;
    /// Installs a new policy snapshot (all vifs).
    fn set_policies(&self, policies: &PolicySet) -> Result<(), BackendError>;
    /// Sets the probability of marking CE on frames from the uplink to each named vif (the
    /// PID-ECN controller's output); vifs not named get 0.
    fn set_ecn_probabilities(&self, probabilities: &[(String, f64)]) -> Result<(), BackendError>;
    /// Current counters.
    fn stats(&self) -> SwitchStats;
    /// Whether the forwarding loop is alive and reporting (`/v1/health`, the watchdog).
    fn loop_health(&self) -> LoopHealth;
    /// The last vif batches' frames, bytes and cycles, for calibration (`POST /v1/calibrate`);
    /// none by default.
    fn cost_samples(&self) -> Vec<Sample> {
        Vec::new()
    }
    /// Stops forwarding; called once when the daemon leaves.
    fn stop(&self);
}

mod mock;

pub use mock::{MockBackend, MockCall, MOCK_STATS_INTERVAL_NS};

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str) -> Port {
        Port::checked(&PortRequest::tap(name)).unwrap()
    }

    #[test]
    fn mock_refuses_and_stays_unchanged() {
        let m = MockBackend::new();
        m.add_port(&port("a"), &VifPolicy::default()).unwrap();
        assert_eq!(
            m.add_port(&port("a"), &VifPolicy::default()),
            Err(BackendError::PortExists("a".into()))
        );
        m.fail_next_add("No such device");
        assert!(m.add_port(&port("b"), &VifPolicy::default()).is_err());
        assert_eq!(m.ports().len(), 1);
        let bad = PolicySet::new(None).with_vif("zz", VifPolicy::default());
        assert_eq!(
            m.set_policies(&bad),
            Err(BackendError::UnknownPort("zz".into()))
        );
        assert_eq!(
            m.remove_port("b"),
            Err(BackendError::UnknownPort("b".into()))
        );
        assert_eq!(m.loop_health().problem(), None);
        m.stop();
        assert!(m.stopped());
        assert_eq!(
            m.loop_health().problem().as_deref(),
            Some("The forwarding loop has stopped")
        );
    }

    #[test]
    fn a_loop_is_dead_past_its_staleness_limit_only() {
        let mut h = LoopHealth::alive(25_000_000);
        assert_eq!(h.stale_after_ns(), 5_000_000_000);
        h.stats_age_ns = 5_000_000_000;
        assert_eq!(h.problem(), None);
        h.stats_age_ns += 1;
        assert_eq!(
            h.problem().as_deref(),
            Some("The forwarding loop has not reported for 5000 ms (limit 5000 ms)")
        );
    }
}
