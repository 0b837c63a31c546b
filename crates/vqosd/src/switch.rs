//! The real backend: [`SwitchBackend`] drives a `vqos-dataplane` [`SwitchHandle`] (TAP ports,
//! the poll loop, the engine) through the [`Backend`] trait.

use vqos_api::wire::Service;
use vqos_api::wire::{PortKind, VhostUserRole};
use vqos_dataplane::frame::mac_key;
use vqos_dataplane::guard::ip_key;
use vqos_dataplane::null::{NullPort, NULL_UPLINK_MAC};
use vqos_dataplane::vhost_user::{VhostUserConfig, VhostUserPort};
use vqos_dataplane::{
    EmulatedWork, IpAddrs, IpPolicy, Locks, MacPolicy, PortSecurity, PortSpec, Readiness, Services,
    SwitchConfig, SwitchError, SwitchHandle, TapIo, TapOrigin,
};
use vqos_sched::{PolicySet, VifPolicy};

use crate::backend::{
    Backend, BackendError, LoopHealth, Port, PortOpened, SwitchStats, NULL_MIN_FRAME,
};
use crate::config::{self, Config};
use crate::socket_access::SocketAccess;
use vqos_api::chain;

/// The data plane's switch behind the [`Backend`] trait.
pub struct SwitchBackend {
    /// The running switch.
    handle: SwitchHandle,
    /// How often the loop publishes its stats, ns (judges its staleness).
    stats_interval_ns: u64,
    /// Delete the TAPs vqosd made when it stops (config `remove_taps_on_exit`); by default
    /// they stay, with their guests' configuration, for the next start to re-attach.
    remove_taps_on_exit: bool,
    /// How TAP ports move frames (config `tap_io`), for the ports added later too.
    tap_io: TapIo,
}

/// [`config::DEFAULT_UPLINK_TAP_QUEUES`], or 1 for a single-queue TAP that already exists here (made
/// by an earlier version, or by hand): the kernel would refuse to open it multiqueue.
fn default_uplink_queues(name: &str) -> u16 {
    let flags = std::fs::read_to_string(format!("/sys/class/net/{name}/tun_flags"));
    match flags.map(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16)) {
        Ok(Ok(f)) if f & libc::IFF_MULTI_QUEUE as u32 == 0 => {
            tracing::info!(
                "Uplink {name}: the existing TAP has one queue; arrivals are not steered by \
                 destination (delete it, or set [uplink] queues)"
            );
            1
        }
        _ => config::DEFAULT_UPLINK_TAP_QUEUES,
    }
}

/// The data plane's TAP I/O for the config's.
fn tap_io(io: config::TapIo) -> TapIo {
    match io {
        config::TapIo::Syscall => TapIo::Syscall,
        config::TapIo::Uring => TapIo::Uring,
    }
}

/// A port spec of the data plane for a port of the daemon, its TAP moving frames by `io`. A
/// vhost-user port is made here (its server socket is bound at once: a path that cannot be
/// used fails the call).
fn spec(port: &Port, io: TapIo) -> Result<PortSpec, BackendError> {
    let spec =
        match port.config.kind {
            PortKind::Tap if port.config.create => PortSpec::tap_owned(&port.config.name)
                .with_tap_queues(port.config.queues.unwrap_or(1)),
            PortKind::Tap => PortSpec::tap_attach(&port.config.name)
                .with_tap_queues(port.config.queues.unwrap_or(1)),
            // The uplink only (the config and the API refuse vifs of this kind).
            PortKind::AfPacket => PortSpec::af_packet(&port.config.name),
            PortKind::Null => {
                let len = port.config.frame_len.unwrap_or(NULL_MIN_FRAME) as usize;
                let null = match len {
                    0 => NullPort::sink(&port.config.name),
                    _ => NullPort::vif(&port.config.name, len),
                }
                .map_err(|e| BackendError::Port {
                    name: port.config.name.clone(),
                    message: chain(&e),
                })?;
                let queues = usize::from(port.config.queues.unwrap_or(1));
                PortSpec::custom(Box::new(null.with_queues(queues)))
            }
            PortKind::VhostUser => {
                let socket = port.config.socket.as_deref().unwrap_or_default();
                let config = VhostUserConfig {
                    queues: port.config.queues.unwrap_or(1),
                    ..match port.config.mode.unwrap_or_default() {
                        VhostUserRole::Server => VhostUserConfig {
                            socket_mode: port.config.socket_mode.map(|m| m.0),
                            ..VhostUserConfig::server(socket)
                        },
                        VhostUserRole::Client => VhostUserConfig::client(socket),
                    }
                };
                let fail = |message| BackendError::Port {
                    name: port.config.name.clone(),
                    message,
                };
                let vhu = VhostUserPort::with_config(&port.config.name, config)
                    .map_err(|e| fail(chain(&e)))?;
                // The socket is bound (and its mode set): now its owner and group. On failure the
                // port is dropped, which removes the socket.
                if port.config.mode.unwrap_or_default() == VhostUserRole::Server {
                    SocketAccess::of(&port.config)
                        .apply(std::path::Path::new(socket))
                        .map_err(fail)?;
                }
                PortSpec::custom(Box::new(vhu))
            }
        };
    Ok(spec
        .with_security(security(port))
        .with_tap_io(io)
        .with_thread(port.config.thread))
}

/// A port's security as the data plane applies it: its configured MACs, else a first-come
/// lock; with `port_security` the guards above layer 2 too ([`IpPolicy`]), without it none.
/// A port whose identity a completed migration handed over may claim no address at all.
fn security(port: &Port) -> PortSecurity {
    if port.state.handover.as_ref().is_some_and(|h| h.complete) {
        return PortSecurity {
            macs: MacPolicy::Fixed(Vec::new()),
            ips: port.config.port_security.then(|| IpPolicy {
                addrs: IpAddrs::Fixed(Vec::new()),
                services: Services::default(),
            }),
            restored: Locks::default(),
        };
    }
    let macs = if !port.config.macs.is_empty() {
        MacPolicy::Fixed(port.config.macs.iter().map(|m| mac_key(&m.0)).collect())
    } else if port.config.port_security && port.config.kind == PortKind::Null {
        // A null vif's one station, known before it sends: a null uplink can reach a vif
        // that only receives.
        MacPolicy::Fixed(vec![NullPort::station(&port.config.name).0])
    } else if port.config.port_security {
        MacPolicy::default()
    } else {
        MacPolicy::Any
    };
    let ips = port.config.port_security.then(|| IpPolicy {
        addrs: if port.config.ips.is_empty() {
            IpPolicy::default().addrs
        } else {
            IpAddrs::Fixed(port.config.ips.iter().map(|&ip| ip_key(ip)).collect())
        },
        services: Services {
            router: port.config.serves.contains(&Service::Router),
            dhcp_server: port.config.serves.contains(&Service::DhcpServer),
        },
    });
    PortSecurity {
        macs,
        ips,
        restored: Locks::from_addrs(&port.state.locked),
    }
}

/// Flattens a data plane error into the daemon's (message chain kept, short and capitalised).
fn convert(e: SwitchError) -> BackendError {
    match e {
        SwitchError::Policy(p) => BackendError::Policy(p),
        SwitchError::DuplicatePort(name) => BackendError::PortExists(name),
        SwitchError::UnknownPort(name) => BackendError::UnknownPort(name),
        e @ SwitchError::MacInUse { .. } => BackendError::MacInUse(e.to_string()),
        e @ SwitchError::Migrate { .. } => BackendError::Migrate(e.to_string()),
        SwitchError::Port { name, source } => {
            // The data plane's message names the port too: say it once.
            let message = chain(&source);
            let message = message
                .strip_prefix(&format!("Port '{name}': "))
                .map_or_else(|| message.clone(), str::to_string);
            BackendError::Port { name, message }
        }
        other => BackendError::Switch(chain(&other)),
    }
}

impl SwitchBackend {
    /// Starts the switch the config describes (uplink, engine, capacity, cost model, polling),
    /// with no vif yet: the daemon's API adds them.
    pub fn start(config: &Config) -> Result<SwitchBackend, BackendError> {
        let uplink = config.uplink.as_ref().ok_or_else(|| {
            BackendError::Switch("The config has no [uplink] (name = \"...\")".into())
        })?;
        let io = tap_io(config.tap_io);
        let uplink_spec = if uplink.config.kind == PortKind::Null {
            // Discards what it is sent, and sends to the null vifs of `to`; its station is the
            // one null vifs send to. Every thread reads a queue of its own (as the AF_PACKET
            // uplink's fanout), when the downlink is scheduled.
            let len = uplink.config.frame_len.unwrap_or(NULL_MIN_FRAME) as usize;
            let null =
                NullPort::uplink(&uplink.config.name, len, &config.uplink_to).map_err(|e| {
                    BackendError::Port {
                        name: uplink.config.name.clone(),
                        message: chain(&e),
                    }
                })?;
            PortSpec::custom(Box::new(null.with_queues(config.threads)))
                .with_mac_policy(MacPolicy::Fixed(vec![NULL_UPLINK_MAC]))
        } else {
            let mut spec = spec(uplink, io)?;
            if uplink.config.kind == PortKind::Tap && uplink.config.queues.is_none() {
                spec = spec.with_tap_queues(default_uplink_queues(&uplink.config.name));
            }
            spec
        };
        let mut sc = SwitchConfig::new(uplink_spec);
        sc.engine = config.engine;
        sc.capacity_bps = config.capacity_bps;
        sc.capacity_in_bps = config.capacity_in_bps;
        sc.downlink = config.downlink;
        sc.cost = config.cost;
        sc.cycles_per_sec = config.cycles_per_sec;
        sc.cpu_fair = config.cpu_fair;
        sc.variant = config.variant;
        sc.emulated_work = config.emulated_work.map(|e| EmulatedWork {
            per_frame_cycles: e.per_frame_cycles,
            per_byte_cycles: e.per_byte_cycles,
            batch_frames: e.batch_frames,
        });
        sc.storm_pps = config.storm_pps;
        sc.threads = config.threads;
        sc.cpus = config.cpus.clone();
        sc.flood_unknown_to_vifs = config.flood_unknown_to_vifs;
        sc.readiness = if config.busy_poll {
            Readiness::BusyPoll
        } else {
            Readiness::Epoll
        };
        // The loop publishes at least every millisecond, whatever the config says.
        let stats_interval_ns = sc.stats_interval_ns.max(1_000_000);
        let handle = SwitchHandle::start(sc).map_err(convert)?;
        match handle.uplink_steered() {
            Ok(true) => tracing::info!(
                "Uplink {}: what the network sends lands in its vif's queue (steered by \
                 destination MAC)",
                handle.uplink_name()
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "Uplink {}: arrivals not steered by destination, the kernel spreads them by \
                 flow ({e}): a flood toward one vif can fill the queue others' frames share",
                handle.uplink_name()
            ),
        }
        Ok(SwitchBackend {
            handle,
            stats_interval_ns,
            remove_taps_on_exit: config.remove_taps_on_exit,
            tap_io: io,
        })
    }

    /// Wraps a switch started by the caller (tests start one on in-memory ports) whose loop
    /// publishes its stats every `stats_interval_ns`.
    pub fn from_handle(handle: SwitchHandle, stats_interval_ns: u64) -> SwitchBackend {
        SwitchBackend {
            handle,
            stats_interval_ns: stats_interval_ns.max(1_000_000),
            remove_taps_on_exit: false,
            tap_io: TapIo::default(),
        }
    }

    /// The switch.
    pub fn handle(&self) -> &SwitchHandle {
        &self.handle
    }
}

impl Backend for SwitchBackend {
    fn add_port(&self, port: &Port, policy: &VifPolicy) -> Result<PortOpened, BackendError> {
        if port.config.kind == PortKind::AfPacket {
            // The API and the config refuse these; a state file edited by hand may not.
            return Err(BackendError::Port {
                name: port.config.name.clone(),
                message: "kind = \"af-packet\" is for the uplink only".into(),
            });
        }
        let mut spec = spec(port, self.tap_io)?;
        if let Some(t) = spec.thread.filter(|&t| t >= self.handle.threads()) {
            // The API and the config refuse such a thread; a port saved before `threads` was
            // lowered (a restart key) is not lost for it: it goes where a new port would.
            tracing::warn!(
                "Port {}: thread {t} does not exist any more ({} thread(s)); read by the least \
                 loaded one",
                port.config.name,
                self.handle.threads()
            );
            spec = spec.with_thread(None);
        }
        let origin = self
            .handle
            .add_port_reporting(spec, policy.clone())
            .map_err(convert)?;
        Ok(match origin {
            Some(TapOrigin::Created) => PortOpened::TapCreated,
            Some(TapOrigin::Reattached { netns }) => PortOpened::TapReattached { netns },
            Some(TapOrigin::Attached) => PortOpened::TapAttached,
            None => PortOpened::fresh(port),
        })
    }

    fn remove_port(&self, name: &str) -> Result<(), BackendError> {
        self.handle.remove_port(name).map_err(convert)
    }

    fn migrate_port(&self, src: &str, dst: &str) -> Result<(), BackendError> {
        self.handle.migrate_port(src, dst).map_err(convert)
    }

    fn set_policies(&self, policies: &PolicySet) -> Result<(), BackendError> {
        self.handle.set_policies(policies.clone()).map_err(convert)
    }

    fn cost_samples(&self) -> Vec<vqos_sched::calibrate::Sample> {
        self.handle.cost_samples().snapshot()
    }

    fn set_ecn_probabilities(&self, probabilities: &[(String, f64)]) -> Result<(), BackendError> {
        // By name: the switch finds each vif when it applies them, under the lock that orders
        // them with port changes.
        self.handle
            .set_ecn_probabilities(probabilities.to_vec())
            .map_err(convert)
    }

    fn stats(&self) -> SwitchStats {
        std::sync::Arc::unwrap_or_clone(self.handle.stats())
    }

    fn loop_health(&self) -> LoopHealth {
        let h = self.handle.loop_health();
        LoopHealth {
            running: h.running,
            stats_age_ns: h.stats_age_ns,
            stats_interval_ns: self.stats_interval_ns,
        }
    }

    fn stop(&self) {
        // A loop that already died has nothing left to stop.
        let _ = if self.remove_taps_on_exit {
            self.handle.stop_and_release()
        } else {
            self.handle.stop()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vqos_dataplane::MemPort;
    use vqos_sched::{EngineKind, PolicyError};

    #[test]
    fn drives_a_switch_on_memory_ports() {
        let (uplink, _peer) = MemPort::pair("up0", 64);
        let mut sc = SwitchConfig::new(PortSpec::custom(Box::new(uplink)));
        sc.engine = EngineKind::Vqos;
        sc.capacity_bps = Some(1_000_000_000);
        let interval_ns = sc.stats_interval_ns;
        let b = SwitchBackend::from_handle(SwitchHandle::start(sc).unwrap(), interval_ns);
        assert_eq!(b.loop_health().problem(), None);
        // Custom (in-memory) vif ports go straight to the handle; the trait drives policies.
        let (vm1, _p1) = MemPort::pair("vm1", 64);
        b.handle()
            .add_port(PortSpec::custom(Box::new(vm1)), VifPolicy::default())
            .unwrap();
        let set = b
            .handle()
            .policies()
            .with_policy(
                "vm1",
                VifPolicy {
                    weight: 4,
                    max_bps: Some(300_000_000),
                    ..Default::default()
                },
            )
            .unwrap();
        b.set_policies(&set).unwrap();
        assert_eq!(b.handle().policies().vifs[0].policy.weight, 4);
        let bad = set
            .with_policy(
                "vm1",
                VifPolicy {
                    min_bps: 2_000_000_000,
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(bad.to_string().contains("exceeds capacity"));
        let unknown = PolicySet::new(Some(1_000_000_000)).with_vif("zz", VifPolicy::default());
        assert!(matches!(
            b.set_policies(&unknown),
            Err(BackendError::Policy(_)) | Err(BackendError::UnknownPort(_))
        ));
        assert_eq!(
            b.remove_port("nope"),
            Err(BackendError::UnknownPort("nope".into()))
        );
        // The loop publishes stats asynchronously (within its stats interval): wait for the
        // snapshot that has vm1, with a generous bound so a loaded machine does not fail it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let stats = loop {
            let s = b.stats();
            if s.ports.iter().any(|p| p.name == "vm1") || std::time::Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(stats.loops.len(), 1);
        let names: Vec<_> = stats.ports.iter().map(|p| p.name.as_str()).collect();
        assert!(
            names.contains(&"vm1") && names.contains(&"up0"),
            "{names:?}"
        );
        b.remove_port("vm1").unwrap();
        b.stop();
        assert_eq!(
            b.loop_health().problem().as_deref(),
            Some("The forwarding loop has stopped")
        );
        assert!(b
            .set_policies(&PolicySet::new(Some(1_000_000_000)))
            .is_err());
    }

    /// The real switch samples its vif batches for calibration, and its c2qos engine refuses an
    /// overselling set even when nothing checked it before.
    #[test]
    fn samples_batches_and_refuses_an_overselling_set() {
        use vqos_dataplane::frame::{build_frame, VnetHdr};
        let (uplink, _peer) = MemPort::pair("up0", 1024);
        let mut sc = SwitchConfig::new(PortSpec::custom(Box::new(uplink)));
        sc.engine = EngineKind::C2qos;
        sc.cost = vqos_sched::CostModel::Cycles;
        sc.capacity_bps = Some(1_000_000_000);
        let interval_ns = sc.stats_interval_ns;
        let b = SwitchBackend::from_handle(SwitchHandle::start(sc).unwrap(), interval_ns);
        let (vm1, peer) = MemPort::pair("vm1", 1024);
        b.handle()
            .add_port(PortSpec::custom(Box::new(vm1)), VifPolicy::default())
            .unwrap();
        for (i, len) in [60usize, 1400].into_iter().cycle().take(20).enumerate() {
            let src = 0x02_00_00_00_00_01 + (i as u64 % 2);
            peer.inject(build_frame(
                VnetHdr::default(),
                0x02_00_00_00_00_ff,
                src,
                0x0800,
                &vec![0; len],
            ));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while b.cost_samples().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let samples = b.cost_samples();
        assert!(!samples.is_empty());
        assert!(
            samples.iter().all(|s| s.frames >= 1 && s.bytes >= 74),
            "{samples:?}"
        );
        let over = b
            .handle()
            .policies()
            .with_policy(
                "vm1",
                VifPolicy {
                    max_bps: Some(2_000_000_000),
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(matches!(
            b.set_policies(&over),
            Err(BackendError::Policy(PolicyError::Oversold { .. }))
        ));
        b.stop();
    }

    #[test]
    fn the_configs_batch_limit_is_the_data_planes() {
        assert_eq!(
            usize::from(vqos_sched::engine::MAX_BURST),
            vqos_dataplane::BATCH_FRAMES
        );
    }

    #[test]
    fn health_follows_the_real_loop() {
        use crate::api::Api;
        use crate::http::Request;
        use std::sync::Arc;
        let (uplink, _peer) = MemPort::pair("up0", 64);
        let sc = SwitchConfig::new(PortSpec::custom(Box::new(uplink)));
        let interval_ns = sc.stats_interval_ns;
        let backend = Arc::new(SwitchBackend::from_handle(
            SwitchHandle::start(sc).unwrap(),
            interval_ns,
        ));
        let dir = tempfile::tempdir().unwrap();
        let text = format!("state_file = \"{}/state.json\"", dir.path().display());
        let api = Api::start(&Config::parse(&text, |_| None).unwrap(), backend.clone()).unwrap();
        let health = || {
            let r = api.handle(&Request {
                method: "GET".into(),
                path: "/v1/health".into(),
                headers: Vec::new(),
                body: Vec::new(),
            });
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            (r.status, v["error"].as_str().unwrap_or("").to_string())
        };
        assert_eq!(health(), (200, String::new()));
        backend.handle().stop().unwrap();
        assert_eq!(
            health(),
            (503, "The forwarding loop has stopped".to_string())
        );
    }

    #[test]
    fn the_null_frame_lengths_are_the_data_planes() {
        use vqos_dataplane::null::{NULL_MAX_FRAME, NULL_MIN_FRAME as MIN};
        assert_eq!(
            (
                NULL_MIN_FRAME as usize,
                crate::backend::NULL_MAX_FRAME as usize
            ),
            (MIN, NULL_MAX_FRAME)
        );
        assert_eq!(
            crate::backend::MAX_QUEUES,
            vqos_dataplane::vhost_user::MAX_QUEUE_PAIRS
        );
        assert_eq!(crate::backend::MAX_QUEUES, vqos_dataplane::MAX_TAP_QUEUES);
    }
}
