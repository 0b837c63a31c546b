//! How a switch is set up: [`SwitchConfig`], the ports it is given ([`PortSpec`]), how it learns
//! of frames ([`Readiness`]) and the experiments' [`EmulatedWork`].

use serde::Serialize;
use vqos_api::port::LockedAddrs;
use vqos_api::wire::MacAddr;
use vqos_sched::{CostModel, Engine, EngineKind};

use crate::afpacket::AfPacketPort;
use crate::downlink::DownlinkConfig;
use crate::error::SwitchError;
use crate::frame::MacKey;
use crate::guard::{IpKey, Services};
use crate::port::Port;
use crate::tap::{TapMode, TapOrigin, TapPort};
use crate::tap_uring::TapIo;

/// How the loop learns that ports have frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Readiness {
    /// Edge-triggered epoll on the ports' descriptors; the loop sleeps when idle.
    #[default]
    Epoll,
    /// Poll every port every idle iteration; the loop never sleeps (one core at 100 %).
    BusyPoll,
}

/// Where a port's frames come from.
pub enum PortBackend {
    /// Create a TAP of the spec's name (owned by the switch, removed with the port).
    TapCreate,
    /// Create a persistent TAP of the spec's name, or re-attach to the one a previous run left
    /// ([`TapMode::Own`]): it survives a restart of the daemon and goes when the port is
    /// removed.
    TapOwn,
    /// Attach to the existing persistent TAP of the spec's name.
    TapAttach,
    /// Attach to the existing interface of the spec's name (a NIC, a veth) through an
    /// `AF_PACKET` socket ([`AfPacketPort`]); for the uplink.
    AfPacket,
    /// A ready-made port (in-memory, fault-injecting, ...).
    Custom(Box<dyn Port>),
}

impl std::fmt::Debug for PortBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortBackend::TapCreate => f.write_str("TapCreate"),
            PortBackend::TapAttach => f.write_str("TapAttach"),
            PortBackend::TapOwn => f.write_str("TapOwn"),
            PortBackend::AfPacket => f.write_str("AfPacket"),
            PortBackend::Custom(p) => write!(f, "Custom({})", p.name()),
        }
    }
}

/// A port opened from a spec, with its source-address policies and, for a TAP, what opening
/// it did.
pub(crate) type OpenedPort = (Box<dyn Port>, PortSecurity, Option<TapOrigin>);

/// A vif's port security: which source MACs it may use and, unless `ips` is `None` (the
/// opt-out, with [`MacPolicy::Any`], of routers and nested bridges), which IP addresses it may
/// claim and what it may serve ([`crate::guard`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortSecurity {
    /// Source MACs.
    pub macs: MacPolicy,
    /// IP addresses and services; `None`: no guard above layer 2, and tagged frames pass.
    pub ips: Option<IpPolicy>,
    /// Addresses the port locked first-come in a previous run (persisted by the daemon):
    /// locked to it again when it is added, before it forwards, and outranking any lock
    /// another port took while it was away. Only where the policy learns (`Learn`).
    pub restored: Locks,
}

impl PortSecurity {
    /// No port security at all: any address no other port owns, no guard above layer 2.
    pub fn open() -> Self {
        PortSecurity {
            macs: MacPolicy::Any,
            ips: None,
            restored: Locks::default(),
        }
    }
}

/// Addresses locked to a port first come (its port security's `Learn` policies).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Locks {
    /// Source MACs.
    pub macs: Vec<MacKey>,
    /// IP addresses (IPv4 mapped, [`crate::guard::ipv4_key`]).
    pub ips: Vec<IpKey>,
}

impl Locks {
    /// True when nothing is locked.
    pub fn is_empty(&self) -> bool {
        self.macs.is_empty() && self.ips.is_empty()
    }

    /// The same addresses as the API has them (a port's stats, the daemon's state file).
    pub fn addrs(&self) -> LockedAddrs {
        LockedAddrs {
            macs: (self.macs.iter())
                .map(|&m| MacAddr(crate::frame::mac_octets(m)))
                .collect(),
            ips: self.ips.iter().map(|&k| crate::guard::key_ip(k)).collect(),
        }
    }

    /// The locks `addrs` gives back (a port restored from the daemon's state file).
    pub fn from_addrs(addrs: &LockedAddrs) -> Locks {
        Locks {
            macs: (addrs.macs.iter())
                .map(|m| crate::frame::mac_key(&m.0))
                .collect(),
            ips: addrs
                .ips
                .iter()
                .map(|&ip| crate::guard::ip_key(ip))
                .collect(),
        }
    }
}

/// IPv4 addresses a vif port locks to when none are configured ([`IpAddrs::Learn`]).
pub const DEFAULT_LEARN_IPV4: usize = 2;
/// IPv6 addresses a vif port locks to when none are configured: a link-local address, a
/// stable and a few temporary (privacy) ones.
pub const DEFAULT_LEARN_IPV6: usize = 8;

/// Which IP addresses a vif may claim (as a source, an ARP sender, a neighbour advertisement's
/// target) and what it may serve. Whatever the policy, an address that lives on another port
/// (configured or locked there, or announced from the network on the uplink within the ageing
/// time) is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpPolicy {
    /// The addresses.
    pub addrs: IpAddrs,
    /// Router advertisements, DHCP server messages.
    pub services: Services,
}

impl Default for IpPolicy {
    fn default() -> Self {
        IpPolicy {
            addrs: IpAddrs::Learn {
                v4: DEFAULT_LEARN_IPV4,
                v6: DEFAULT_LEARN_IPV6,
            },
            services: Services::default(),
        }
    }
}

/// Where a vif's IP addresses come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpAddrs {
    /// The first addresses it claims, per family, locked to it until the port is removed
    /// (first come, as [`MacPolicy::Learn`]).
    Learn {
        /// Most IPv4 addresses locked.
        v4: usize,
        /// Most IPv6 addresses locked.
        v6: usize,
    },
    /// Only these (OpenStack's allowed addresses), the port's from the moment it is added.
    Fixed(Vec<IpKey>),
}

/// Source addresses a vif port locks to when none are configured ([`MacPolicy::Learn`]).
pub const DEFAULT_LEARN_MACS: usize = 4;

/// Which source MAC addresses a vif port may send from (port security). Whatever the policy,
/// an address that lives on another port (configured there, locked there, or seen there within
/// the ageing time) is refused: one tenant cannot take another's traffic by sending one frame
/// from its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MacPolicy {
    /// The default: the port locks to the first `max` addresses it sends from (OpenStack's
    /// port security without a configured address); frames from any other are `spoofed`.
    /// Locked addresses are the port's until it is removed.
    Learn {
        /// Most addresses locked.
        max: usize,
    },
    /// Only these addresses (an operator's list: the VM's MAC). They are the port's from the
    /// moment it is added, also before the VM has sent anything.
    Fixed(Vec<MacKey>),
    /// Any address not owned by another port: the explicit opt-out for routers and nested
    /// bridges behind one port. The uplink always works this way.
    Any,
}

impl Default for MacPolicy {
    fn default() -> Self {
        MacPolicy::Learn {
            max: DEFAULT_LEARN_MACS,
        }
    }
}

/// A port to add.
#[derive(Debug)]
pub struct PortSpec {
    /// Port name (interface name for TAPs; must be unique in the switch).
    pub name: String,
    /// Where its frames come from.
    pub backend: PortBackend,
    /// Source MACs the port may send from (frames from others count `spoofed`).
    pub macs: MacPolicy,
    /// IP addresses and services the port may claim (default: learnt and locked, no router or
    /// DHCP server); `None` for no guard above layer 2.
    pub ips: Option<IpPolicy>,
    /// Addresses a previous run locked to the port ([`PortSecurity::restored`]).
    pub restored: Locks,
    /// How a TAP port moves frames (ignored by other kinds).
    pub tap_io: TapIo,
    /// A TAP port's queues, 1 to [`crate::MAX_TAP_QUEUES`] (ignored by other kinds; a
    /// vhost-user port's are in its own config).
    pub tap_queues: u16,
    /// The forwarding thread (shard) that reads it, `0..threads` (OVS's `pmd-rxq-affinity`);
    /// `None`: the one with the fewest ports.
    pub thread: Option<usize>,
}

impl PortSpec {
    /// A TAP the switch creates.
    pub fn tap(name: &str) -> Self {
        PortSpec {
            name: name.to_string(),
            backend: PortBackend::TapCreate,
            macs: MacPolicy::default(),
            ips: Some(IpPolicy::default()),
            restored: Locks::default(),
            tap_io: TapIo::default(),
            tap_queues: 1,
            thread: None,
        }
    }

    /// A TAP the switch owns across restarts ([`PortBackend::TapOwn`]).
    pub fn tap_owned(name: &str) -> Self {
        PortSpec {
            name: name.to_string(),
            backend: PortBackend::TapOwn,
            macs: MacPolicy::default(),
            ips: Some(IpPolicy::default()),
            restored: Locks::default(),
            tap_io: TapIo::default(),
            tap_queues: 1,
            thread: None,
        }
    }

    /// An existing persistent TAP.
    pub fn tap_attach(name: &str) -> Self {
        PortSpec {
            name: name.to_string(),
            backend: PortBackend::TapAttach,
            macs: MacPolicy::default(),
            ips: Some(IpPolicy::default()),
            restored: Locks::default(),
            tap_io: TapIo::default(),
            tap_queues: 1,
            thread: None,
        }
    }

    /// An existing interface attached through an `AF_PACKET` socket ([`PortBackend::AfPacket`]),
    /// the uplink on a NIC without a TAP in between.
    pub fn af_packet(name: &str) -> Self {
        PortSpec {
            name: name.to_string(),
            backend: PortBackend::AfPacket,
            macs: MacPolicy::default(),
            ips: Some(IpPolicy::default()),
            restored: Locks::default(),
            tap_io: TapIo::default(),
            tap_queues: 1,
            thread: None,
        }
    }

    /// A ready-made port, named after it.
    pub fn custom(port: Box<dyn Port>) -> Self {
        PortSpec {
            name: port.name().to_string(),
            backend: PortBackend::Custom(port),
            macs: MacPolicy::default(),
            ips: Some(IpPolicy::default()),
            restored: Locks::default(),
            tap_io: TapIo::default(),
            tap_queues: 1,
            thread: None,
        }
    }

    /// Restricts the source MACs the port may use to `macs` ([`MacPolicy::Fixed`]).
    pub fn with_allowed_macs(mut self, macs: Vec<MacKey>) -> Self {
        self.macs = MacPolicy::Fixed(macs);
        self
    }

    /// Read by forwarding thread `thread` (`None`: the least loaded).
    pub fn with_thread(mut self, thread: Option<usize>) -> Self {
        self.thread = thread;
        self
    }

    /// A TAP port with `queues` queues (`IFF_MULTI_QUEUE` above 1; [`crate::tap`]).
    pub fn with_tap_queues(mut self, queues: u16) -> Self {
        self.tap_queues = queues;
        self
    }

    /// Moves a TAP port's frames by `io` ([`TapIo::Uring`]: batches on an io_uring).
    pub fn with_tap_io(mut self, io: TapIo) -> Self {
        self.tap_io = io;
        self
    }

    /// Sets the port's source-address policy.
    pub fn with_mac_policy(mut self, macs: MacPolicy) -> Self {
        self.macs = macs;
        self
    }

    /// Sets the port's IP address policy (`None`: no guard above layer 2).
    pub fn with_ip_policy(mut self, ips: Option<IpPolicy>) -> Self {
        self.ips = ips;
        self
    }

    /// Sets the port's whole port security.
    pub fn with_security(mut self, security: PortSecurity) -> Self {
        self.macs = security.macs;
        self.ips = security.ips;
        self.restored = security.restored;
        self
    }

    pub(crate) fn open(self) -> Result<OpenedPort, SwitchError> {
        let name = self.name;
        let wrap = |source| SwitchError::Port {
            name: name.clone(),
            source,
        };
        let mut origin = None;
        let mut tap = |mode| -> Result<Box<dyn Port>, SwitchError> {
            let port =
                TapPort::open_queues(&name, mode, self.tap_io, self.tap_queues).map_err(wrap)?;
            origin = Some(port.origin().clone());
            Ok(Box::new(port))
        };
        let port: Box<dyn Port> = match self.backend {
            PortBackend::TapCreate => tap(TapMode::Create)?,
            PortBackend::TapAttach => tap(TapMode::Attach)?,
            PortBackend::TapOwn => tap(TapMode::Own)?,
            PortBackend::AfPacket => Box::new(AfPacketPort::open(&name).map_err(wrap)?),
            PortBackend::Custom(p) => p,
        };
        let security = PortSecurity {
            macs: self.macs,
            ips: self.ips,
            restored: self.restored,
        };
        Ok((port, security, origin))
    }
}

/// How to start a switch.
pub struct SwitchConfig {
    /// The uplink port.
    pub uplink: PortSpec,
    /// The scheduling engine.
    pub engine: EngineKind,
    /// Uplink capacity, bits per second; `None` = unlimited.
    pub capacity_bps: Option<u64>,
    /// Downlink capacity (what the vifs receive, under the scheduled downlink), bits per
    /// second: `None` = `capacity_bps`; [`vqos_sched::policy::UNLIMITED_IN_BPS`] = unlimited.
    pub capacity_in_bps: Option<u64>,
    /// Schedule what the vifs receive ([`crate::downlink`]): per-vif queues with an AQM,
    /// served by an engine of `engine`'s kind under each vif's inbound policy. `None` (the
    /// library's default; vqosd's default is on): frames to a vif go straight out, through
    /// its inbound maximum's bucket (drops) only.
    pub downlink: Option<DownlinkConfig>,
    /// What vifs are charged in (bytes or measured cycles).
    pub cost: CostModel,
    /// Cycles per second of the forwarding core, for the cycles cost model and `cpu_fair`
    /// (rdtsc units).
    pub cycles_per_sec: u64,
    /// Engine `vqos`, cost bytes: shares count the core's time too
    /// ([`vqos_sched::PolicySet::cpu_fair`]); default false here, vqosd's default is true.
    pub cpu_fair: bool,
    /// The papers as written or with vqos's departures ([`vqos_sched::Variant`]): ANCS's
    /// CreditLeft, and PID-ECN marking only what a vif receives. Experiments only.
    pub variant: vqos_sched::Variant,
    /// Epoll (default) or busy polling.
    pub readiness: Readiness,
    /// MAC table entries age out after this, ns (default 300 s).
    pub mac_age_ns: u64,
    /// Most learnt MAC addresses (default 4096).
    pub mac_capacity: usize,
    /// Most MAC addresses learnt on one vif port (default 64); the uplink may hold half of
    /// `mac_capacity`. Addresses beyond are not learnt (`mac_learn_refused`) and frames to them
    /// are flooded, so one tenant cannot push everyone's unicast into flooding.
    pub mac_capacity_per_vif: usize,
    /// Stats are published this often, ns (default 25 ms; at most 50 ms is sensible).
    pub stats_interval_ns: u64,
    /// Enforce each vif's maximum on the uplink→vif direction too when its policy states no
    /// `max_in_bps` (default true); a stated `max_in_bps` is enforced either way.
    pub downlink_max: bool,
    /// Storm control: most broadcast, multicast and unknown-unicast frames a port may send per
    /// second (burst: one second's worth), beyond which they drop as `storm`; 0 = off
    /// (default 1000).
    pub storm_pps: u64,
    /// Unknown-unicast frames from a vif go to the uplink only (default), not to the other
    /// vifs: a tenant's frames to an address the switch has not learnt (or has had to forget)
    /// never reach another tenant. True floods them to every port, as a plain bridge does.
    pub flood_unknown_to_vifs: bool,
    /// An engine to use instead of building `engine` (tests, experiments); it is configured
    /// with the initial policy set on start.
    pub custom_engine: Option<Box<dyn Engine>>,
    /// A least cost per forwarded vif frame, for experiments (default none); see
    /// [`EmulatedWork`].
    pub emulated_work: Option<EmulatedWork>,
    /// Forwarding threads (shards, default 1): each reads its own set of ports and runs its
    /// own engine over their vifs; see docs/dataplane.md, "Shards".
    pub threads: usize,
    /// CPUs to pin the threads to, one per thread in order (empty: not pinned).
    pub cpus: Vec<usize>,
}

/// A least cost per frame read from a vif, emulating a heavier datapath (tunnelling,
/// firewalling, a slower core) on a machine whose real forwarding cost is too small for an
/// experiment: the lab's 2-core machine cannot generate enough 64-byte frames to load a real
/// core, so the C2QoS experiment gives each frame the cost of its scenario's cycle model.
///
/// After forwarding a vif's batch the loop spins on the cycle counter until the batch has
/// taken at least `per_frame_cycles × frames + per_byte_cycles × bytes` since it began
/// (frames read, on-wire bytes admitted). A batch whose real work took longer is not
/// slowed further, so the model is a floor on the cost and the simulator, which charges the
/// model alone, predicts the same capacity. The spin is inside the span the loop measures for
/// the cycle cost model, so the engine charges it as it would real work. The spin yields the
/// CPU to anything runnable on the core (kernel work such as the TAP deliveries the loop set
/// off), which then runs inside the emulated time. Only the vif→uplink direction, the one the
/// engine schedules, is slowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedWork {
    /// Cycles (counter units: TSC on x86_64) per frame read.
    pub per_frame_cycles: u64,
    /// Cycles per on-wire byte forwarded.
    pub per_byte_cycles: f64,
    /// Most frames per vif batch while emulating (0: the engine's grant, at most
    /// [`BATCH_FRAMES`](crate::BATCH_FRAMES)). A core slowed down a hundredfold that kept its batches of 32 frames
    /// would hold every other vif, a latency-sensitive one too, a hundred times longer behind
    /// a batch in progress; smaller batches keep a batch as short, relative to the traffic's
    /// round trips, as on the core being emulated.
    pub batch_frames: usize,
}

impl EmulatedWork {
    /// Counter cycles a batch of `frames` frames carrying `bytes` on-wire bytes takes at least.
    pub fn cycles(&self, frames: u64, bytes: u64) -> u64 {
        self.per_frame_cycles
            .saturating_mul(frames)
            .saturating_add((self.per_byte_cycles * bytes as f64) as u64)
    }
}

impl std::fmt::Debug for SwitchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchConfig")
            .field("uplink", &self.uplink)
            .field("engine", &self.engine)
            .field("capacity_bps", &self.capacity_bps)
            .field("capacity_in_bps", &self.capacity_in_bps)
            .field("downlink", &self.downlink)
            .field("cost", &self.cost)
            .field("readiness", &self.readiness)
            .field("emulated_work", &self.emulated_work)
            .field("threads", &self.threads)
            .field("cpus", &self.cpus)
            .field(
                "custom_engine",
                &self.custom_engine.as_ref().map(|e| e.kind()),
            )
            .finish_non_exhaustive()
    }
}

impl SwitchConfig {
    /// Defaults around `uplink`: engine `rr`, unlimited capacity, epoll.
    pub fn new(uplink: PortSpec) -> Self {
        SwitchConfig {
            uplink,
            engine: EngineKind::Rr,
            capacity_bps: None,
            capacity_in_bps: None,
            downlink: None,
            cost: CostModel::Bytes,
            cycles_per_sec: 2_000_000_000,
            cpu_fair: false,
            variant: vqos_sched::Variant::Vqos,
            readiness: Readiness::Epoll,
            mac_age_ns: 300_000_000_000,
            mac_capacity: 4096,
            mac_capacity_per_vif: 64,
            stats_interval_ns: 25_000_000,
            downlink_max: true,
            storm_pps: 1_000,
            flood_unknown_to_vifs: false,
            custom_engine: None,
            emulated_work: None,
            threads: 1,
            cpus: Vec::new(),
        }
    }
}
