//! Scenario files: one TOML file per experiment, run by `vqos sim` and `vqos lab run`.
//!
//! The format is documented in `docs/scenarios.md`. Parsing is strict: an unknown key is an
//! error that names the key and its line; every rate and time is checked; the policies are
//! validated at every phase (so an event that would make Σ min exceed the capacity is refused
//! before anything runs).

use std::collections::BTreeSet;
use thiserror::Error;
use vqos_sched::{CostModel, EngineKind, PolicyError, PolicySet, Variant, VifPolicy};

/// Why a scenario was refused.
#[derive(Debug, Error)]
pub enum ScenarioError {
    /// The TOML is malformed or has an unknown key (the message names key and line).
    #[error("{0}")]
    Toml(String),
    /// A value is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// A policy (at some phase) is impossible (what is wrong is the source, not repeated here).
    #[error("At {at_s}s")]
    Policy {
        /// When the policy set became invalid.
        at_s: f64,
        /// What is wrong with it.
        #[source]
        source: PolicyError,
    },
}

/// The longest scenario: one hour. The simulator keeps 10 ms bins per VM for the whole run
/// and the lab runs in real time; a longer run is almost surely a typo (`"36000"` for `"3600"`).
pub const MAX_DURATION_NS: u64 = 3_600 * 1_000_000_000;

mod cost;
mod expect;
mod keys;
mod paper;
mod raw;

pub use cost::{ControllerParams, CycleCostModel};
pub use expect::{Check, Expectation};
pub use paper::{PaperQuantity, PaperValue};

use keys::{
    apply_keys, cpu_limit, download_policy_warning, link_share, parse_direction, rate, time,
};
use raw::{toml_error, RawScenario, RawVmKeys};

fn invalid(msg: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid(msg.into())
}

/// How a VM sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Greedy TCP-like flows (AIMD, react to loss and ECN).
    Tcp,
    /// Constant-rate datagrams.
    Udp,
}

/// Direction of the traffic relative to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// VMs send out through the uplink.
    Upload,
    /// The outside sends to the VMs.
    Download,
}

/// One VM's settings at some moment.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSettings {
    /// Policy (weight, min, max, priority).
    pub policy: VifPolicy,
    /// Parallel connections (TCP).
    pub flows: u32,
    /// TCP or UDP.
    pub traffic: Traffic,
    /// Bytes on the wire per packet.
    pub packet_size: u32,
    /// Offered load, bits/s (`None` = as much as allowed).
    pub rate_bps: Option<u64>,
    /// Base round-trip time of its flows, ns.
    pub rtt_ns: u64,
    /// On/off source: sends for `on` then pauses for `off`, from its start (ns; `None` =
    /// always on).
    pub on_off_ns: Option<(u64, u64)>,
}

impl VmSettings {
    /// Whether an on/off source is in its on period at `t_ns` (always true for other sources).
    pub fn is_on(&self, start_ns: u64, t_ns: u64) -> bool {
        match self.on_off_ns {
            None => true,
            Some((on, off)) => t_ns.saturating_sub(start_ns) % (on + off) < on,
        }
    }

    /// When the on/off state next changes after `t_ns` (`u64::MAX` for other sources).
    pub fn next_toggle(&self, start_ns: u64, t_ns: u64) -> u64 {
        match self.on_off_ns {
            None => u64::MAX,
            Some((on, off)) => {
                let into = t_ns.saturating_sub(start_ns) % (on + off);
                let left = if into < on {
                    on - into
                } else {
                    on + off - into
                };
                t_ns + left
            }
        }
    }
}

/// A VM of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Vm {
    /// Unique name (also the vif's name).
    pub name: String,
    /// Which way its traffic goes (its own `direction`, else `[topology].direction`).
    pub direction: Direction,
    /// Settings at time 0.
    pub initial: VmSettings,
    /// When it starts sending, ns.
    pub start_ns: u64,
    /// When it stops sending, ns.
    pub stop_ns: u64,
    /// The lab's CPU limit on the VM's TCP endpoint (`cpu`, a fraction of one core): the
    /// PID-ECN paper's cause of unfairness, a receiving VM short of CPU. The simulator has no
    /// model of a VM's CPU, so it predicts the VM without it (and warns).
    pub cpu_limit: Option<f64>,
    /// A CPU limit the lab calibrates to the machine before the run (`cpu_alone`): the share
    /// of a core at which the VM, alone, gets this fraction of the tightest link. The
    /// simulator predicts the VM without it, as for `cpu`.
    pub cpu_alone: Option<f64>,
}

/// A change at a time: of one VM's settings, or of the external bottleneck's rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When, ns.
    pub at_ns: u64,
    /// The new bottleneck rate, for an event that changes the path (`vm` absent).
    pub bottleneck_bps: Option<u64>,
    /// Index of the VM in [`Scenario::vms`] (for a bottleneck event, 0 and unused).
    pub vm: usize,
    /// The VM's settings from then on (the event applied on top of the previous ones).
    pub settings: VmSettings,
    /// New start time, if the event sets one.
    pub start_ns: Option<u64>,
    /// New stop time, if the event sets one.
    pub stop_ns: Option<u64>,
}

/// A parsed, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// One-line description.
    pub description: String,
    /// Length, ns.
    pub duration_ns: u64,
    /// Host uplink capacity, bits/s.
    pub capacity_bps: u64,
    /// Engine.
    pub engine: EngineKind,
    /// Left out of each phase's mean after a change, ns.
    pub settle_ns: u64,
    /// What vifs are charged in.
    pub cost: CostModel,
    /// Cycles per second of the forwarding core.
    pub cpu_hz: u64,
    /// Engine `vqos`, cost bytes: shares count the core's time too (`cpu_fair`, vqosd's
    /// default: true).
    pub cpu_fair: bool,
    /// The papers' algorithms with vqos's measured departures or as written (`variant`,
    /// default `"vqos"`; [`vqos_sched::variant`]).
    pub variant: Variant,
    /// vqosd's forwarding threads in the lab (`threads`, default 1). The simulator models the
    /// allocation one switch gives, which the shards reproduce (docs/dataplane.md, "Shards"),
    /// so it does not change a prediction.
    pub threads: usize,
    /// The downlink's capacity ([`PolicySet::capacity_in_bps`]: `None` = `capacity`).
    pub capacity_in_bps: Option<u64>,
    /// What VMs receive is scheduled (`downlink = "scheduled"`, the default, as vqosd's):
    /// queues with CoDel and the engine under each VM's inbound policy; `"bucket"`: only its
    /// inbound maximum acts (a bucket that drops), as before the scheduled downlink.
    pub downlink_scheduled: bool,
    /// Flow queues in each VM's downlink queue in the lab (`downlink_flows`, default
    /// [`vqos_sched::fq::DEFAULT_FLOWS`]; 1: one FIFO per VM). The simulator's flows are fluid
    /// within a VM, so it does not change a prediction of rates (docs/design.md, "The
    /// scheduled downlink").
    pub downlink_flows: usize,
    /// Per-packet CPU cost.
    pub cost_model: CycleCostModel,
    /// `[topology].direction`: the default of every VM's [`Vm::direction`].
    pub direction: Direction,
    /// External bottleneck rate, bits/s.
    pub bottleneck_bps: Option<u64>,
    /// External bottleneck queue, packets.
    pub bottleneck_queue: u32,
    /// `vqos lab`: the VMs' TCP may hand the switch 64 KiB TSO/GSO super-frames (`tso`, default
    /// true); `false` limits each VM interface to one segment per frame (`gso_max_segs 1`), so
    /// the switch sees MTU frames as the papers' Xen netback did. The simulator's packets are
    /// MTU-sized either way.
    pub tso: bool,
    /// Fairness adjuster enabled.
    pub fairness: bool,
    /// PID-ECN enabled.
    pub pid_ecn: bool,
    /// Controller parameters.
    pub controller: ControllerParams,
    /// The VMs.
    pub vms: Vec<Vm>,
    /// Changes, sorted by time.
    pub events: Vec<Event>,
    /// Expectations.
    pub expectations: Vec<Expectation>,
    /// The paper's numbers (`[[paper]]`): carried for the reports, never simulated.
    pub paper: Vec<PaperValue>,
    /// The paper's claims its checks test (`[claims]`: id → the claim, with the paper's
    /// number and where the paper states it), by id; verdict tables group checks by them.
    pub claims: std::collections::BTreeMap<String, String>,
    /// What the file sets that cannot act (a weight, minimum or priority on a download VM),
    /// one line each; the reports repeat them.
    pub warnings: Vec<String>,
}

/// Most forwarding threads a scenario may ask the lab's vqosd for.
pub const MAX_THREADS: usize = 64;

/// Default base RTT inside one host (a namespace or VM to a sink through the switch).
pub const DEFAULT_RTT_NS: u64 = 200_000;

impl Scenario {
    /// Parses and validates a scenario from TOML text.
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        let probe_claims: Vec<String> = (raw._probe.iter())
            .filter_map(|p| p.get("claim").and_then(|v| v.as_str()).map(String::from))
            .collect();
        let duration_ns = time("duration", &raw.duration)?;
        if duration_ns == 0 {
            return Err(invalid("duration: must be greater than 0"));
        }
        if duration_ns > MAX_DURATION_NS {
            return Err(invalid(format!(
                "duration: {} is longer than the {} s a scenario may last",
                raw.duration,
                MAX_DURATION_NS / 1_000_000_000
            )));
        }
        let capacity_bps = rate("capacity", &raw.capacity)?
            .ok_or_else(|| invalid("capacity: the simulated link needs a finite rate"))?;
        if capacity_bps == 0 {
            return Err(invalid("capacity: must be greater than 0"));
        }
        let engine: EngineKind = raw.engine.parse().map_err(invalid)?;
        let variant: Variant = match &raw.variant {
            Some(v) => v.parse().map_err(invalid)?,
            None => Variant::Vqos,
        };
        let capacity_in_bps = match &raw.capacity_in {
            None => None,
            Some(t) => match rate("capacity_in", t)? {
                None => Some(vqos_sched::policy::UNLIMITED_IN_BPS),
                Some(0) => return Err(invalid("capacity_in: must be greater than 0")),
                Some(r) => Some(r),
            },
        };
        let downlink_scheduled = match raw.downlink.as_deref() {
            None | Some("scheduled") => true,
            Some("bucket") => false,
            Some(other) => {
                return Err(invalid(format!(
                    "downlink: '{other}' (expected \"scheduled\" or \"bucket\")"
                )))
            }
        };
        let downlink_flows = match raw.downlink_flows {
            None => vqos_sched::fq::DEFAULT_FLOWS,
            Some(_) if !downlink_scheduled => {
                return Err(invalid(
                    "downlink_flows: the flow queues are the scheduled downlink's (downlink = \"bucket\" has no queue)",
                ))
            }
            Some(n) if (1..=vqos_sched::fq::MAX_FLOWS).contains(&n) => n,
            Some(n) => {
                return Err(invalid(format!(
                    "downlink_flows: {n} is outside 1..={}",
                    vqos_sched::fq::MAX_FLOWS
                )))
            }
        };
        let settle_ns = match &raw.settle {
            Some(s) => time("settle", s)?,
            None => 2_000_000_000,
        };
        if raw.settle.is_some() && settle_ns >= duration_ns {
            return Err(invalid(format!(
                "settle: {} leaves nothing of the {} run to measure (must be shorter)",
                raw.settle.as_deref().unwrap_or_default(),
                raw.duration
            )));
        }
        let cost = match raw.cost.as_deref() {
            None if engine == EngineKind::C2qos => CostModel::Cycles,
            None | Some("bytes") => CostModel::Bytes,
            Some("cycles") => CostModel::Cycles,
            Some(other) => {
                return Err(invalid(format!(
                    "cost: '{other}' (expected \"bytes\" or \"cycles\")"
                )))
            }
        };
        let topo = raw.topology.unwrap_or_default();
        let direction = parse_direction("topology.direction", topo.direction.as_deref())?
            .unwrap_or(Direction::Upload);
        let bottleneck_bps = match &topo.bottleneck {
            Some(b) => rate("topology.bottleneck", b)?,
            None => None,
        };
        if bottleneck_bps == Some(0) {
            // Found by fuzzing: a 0 bit/s router divided the simulator by zero.
            return Err(invalid("topology.bottleneck: must be greater than 0"));
        }
        let mut fairness = false;
        let mut pid_ecn = false;
        for c in &topo.controllers {
            match c.as_str() {
                "fairness" => fairness = true,
                "pid-ecn" => pid_ecn = true,
                other => {
                    return Err(invalid(format!(
                        "topology.controllers: unknown controller '{other}' (expected \"fairness\" or \"pid-ecn\")"
                    )))
                }
            }
        }
        if raw.vm.is_empty() {
            return Err(invalid("a scenario needs at least one [[vm]]"));
        }
        let defaults = VmSettings {
            policy: VifPolicy::default(),
            flows: 1,
            traffic: Traffic::Tcp,
            packet_size: 1500,
            rate_bps: None,
            rtt_ns: DEFAULT_RTT_NS,
            on_off_ns: None,
        };
        let mut vms: Vec<Vm> = Vec::new();
        let mut warnings = Vec::new();
        let mut names = BTreeSet::new();
        for v in &raw.vm {
            if !names.insert(v.name.clone()) {
                return Err(invalid(format!("vm '{}' is defined twice", v.name)));
            }
            let what = format!("vm '{}'", v.name);
            let (initial, start, stop) = apply_keys(&what, &defaults, &v.keys)?;
            let start_ns = start.unwrap_or(0);
            let stop_ns = stop.unwrap_or(duration_ns).min(duration_ns);
            if start_ns >= stop_ns {
                return Err(invalid(format!("{what}: start is not before stop")));
            }
            let vm_direction =
                parse_direction(&format!("{what}.direction"), v.direction.as_deref())?
                    .unwrap_or(direction);
            if vm_direction == Direction::Download && !downlink_scheduled {
                warnings.extend(download_policy_warning(&what, &initial.policy));
            }
            let (cpu_limit, cpu_alone) = match (&v.cpu, &v.cpu_alone) {
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "{what}: give cpu (a share of a core) or cpu_alone (the lab finds the \
                         share), not both"
                    )))
                }
                (Some(c), None) => (Some(cpu_limit(&format!("{what}.cpu"), c)?), None),
                (None, Some(a)) => (None, Some(link_share(&format!("{what}.cpu_alone"), a)?)),
                (None, None) => (None, None),
            };
            if let Some(c) = v.cpu.as_ref().or(v.cpu_alone.as_ref()) {
                warnings.push(format!(
                    "{what}: the simulator does not model a VM's CPU, so its prediction is \
                     for the VM without its cpu limit ({c}); the lab applies it"
                ));
            }
            vms.push(Vm {
                name: v.name.clone(),
                direction: vm_direction,
                initial,
                start_ns,
                stop_ns,
                cpu_limit,
                cpu_alone,
            });
        }
        let mut timed = Vec::new();
        for e in &raw.event {
            let at_ns = time("event.at", &e.at)?;
            if at_ns > duration_ns {
                return Err(invalid(format!(
                    "event at {}: after the end of the scenario",
                    e.at
                )));
            }
            let vm = match (&e.vm, &e.bottleneck) {
                (Some(name), None) => {
                    Some(vms.iter().position(|v| &v.name == name).ok_or_else(|| {
                        invalid(format!("event at {}: unknown vm '{name}'", e.at))
                    })?)
                }
                (None, Some(_)) => None,
                _ => {
                    return Err(invalid(format!(
                        "event at {}: give either vm (and its keys) or bottleneck",
                        e.at
                    )))
                }
            };
            timed.push((at_ns, vm, e));
        }
        timed.sort_by_key(|(at, _, _)| *at);
        let mut current: Vec<VmSettings> = vms.iter().map(|v| v.initial.clone()).collect();
        let mut events = Vec::new();
        for (at_ns, vm, e) in timed {
            let Some(vm) = vm else {
                let b = e.bottleneck.as_deref().unwrap_or_default();
                let what = format!("event at {}: bottleneck", e.at);
                let bps = rate(&what, b)?;
                if bps == Some(0) {
                    return Err(invalid(format!("{what}: must be greater than 0")));
                }
                if e.keys != RawVmKeys::default() {
                    return Err(invalid(format!(
                        "event at {}: a bottleneck event takes no vm keys",
                        e.at
                    )));
                }
                events.push(Event {
                    at_ns,
                    bottleneck_bps: bps.or(Some(u64::MAX)),
                    vm: 0,
                    settings: current[0].clone(),
                    start_ns: None,
                    stop_ns: None,
                });
                continue;
            };
            let what = format!("event at {} for '{}'", e.at, vms[vm].name);
            let (settings, start_ns, stop_ns) = apply_keys(&what, &current[vm], &e.keys)?;
            if vms[vm].direction == Direction::Download && !downlink_scheduled {
                warnings.extend(download_policy_warning(&what, &settings.policy));
            }
            current[vm] = settings.clone();
            events.push(Event {
                at_ns,
                bottleneck_bps: None,
                vm,
                settings,
                start_ns,
                stop_ns,
            });
        }
        for (i, v) in vms.iter().enumerate() {
            let udp = std::iter::once(&v.initial)
                .chain(
                    events
                        .iter()
                        .filter(|e| e.vm == i && e.bottleneck_bps.is_none())
                        .map(|e| &e.settings),
                )
                .any(|s| s.traffic == Traffic::Udp);
            if (v.cpu_limit.is_some() || v.cpu_alone.is_some()) && udp {
                return Err(invalid(format!(
                    "vm '{}': cpu limits the VM's TCP endpoint (iperf3); a UDP flood is a thread \
                     of the lab itself and cannot be limited",
                    v.name
                )));
            }
        }
        let mut scenario = Scenario {
            name: raw.name,
            description: raw.description,
            duration_ns,
            capacity_bps,
            engine,
            settle_ns,
            cost,
            cpu_hz: raw.cpu_hz.unwrap_or(2_000_000_000),
            cpu_fair: raw.cpu_fair.unwrap_or(true),
            variant,
            threads: raw.threads.unwrap_or(1),
            capacity_in_bps,
            downlink_scheduled,
            downlink_flows,
            cost_model: raw.cost_model.unwrap_or_default(),
            direction,
            bottleneck_bps,
            bottleneck_queue: topo.bottleneck_queue.unwrap_or(100).max(2),
            tso: topo.tso.unwrap_or(true),
            fairness,
            pid_ecn,
            controller: raw.controller.unwrap_or_default(),
            vms,
            events,
            expectations: Vec::new(),
            paper: Vec::new(),
            claims: raw.claims.clone(),
            warnings,
        };
        if scenario.cpu_hz == 0 {
            return Err(invalid("cpu_hz: must be greater than 0"));
        }
        if !(1..=MAX_THREADS).contains(&scenario.threads) {
            return Err(invalid(format!(
                "threads: must be 1..={MAX_THREADS} (vqosd's forwarding threads in the lab)"
            )));
        }
        let pricing = scenario
            .cost_model
            .pricing()
            .map_err(|e| invalid(format!("cost_model: {e}")))?;
        // vqosd refuses the same (its `[cost_model]` prices purchases in cycles only).
        if pricing.is_some() && scenario.cost != CostModel::Cycles {
            return Err(invalid(
                "cost_model.price_frame_bytes prices purchases in cycles; it needs cost = \"cycles\"",
            ));
        }
        scenario.expectations = raw
            .expect
            .iter()
            .map(|x| scenario.expectation(x))
            .collect::<Result<_, _>>()?;
        scenario.check_claims_used(&probe_claims)?;
        for x in scenario.expectations.iter().filter(|x| x.lab_only) {
            let at = x.phase_label();
            scenario.warnings.push(format!(
                "expect ({at}): lab only (lab_only = true); the simulator does not check it"
            ));
        }
        scenario.paper = raw
            .paper
            .iter()
            .map(|x| scenario.paper_value(x))
            .collect::<Result<_, _>>()?;
        // Every phase's policy set must be valid.
        for p in scenario.phases() {
            let set = scenario.policies_at(p.0);
            set.validate()
                .and_then(|()| set.check_sold(scenario.engine))
                .map_err(|source| ScenarioError::Policy {
                    at_s: p.0 as f64 / 1e9,
                    source,
                })?;
        }
        Ok(scenario)
    }

    /// Every VM's settings, start and stop as they stand at `t_ns` (events at `t_ns` applied).
    pub fn state_at(&self, t_ns: u64) -> Vec<(VmSettings, u64, u64)> {
        let mut s: Vec<(VmSettings, u64, u64)> = self
            .vms
            .iter()
            .map(|v| (v.initial.clone(), v.start_ns, v.stop_ns))
            .collect();
        for e in self.events.iter().take_while(|e| e.at_ns <= t_ns) {
            if e.bottleneck_bps.is_some() {
                continue;
            }
            s[e.vm].0 = e.settings.clone();
            if let Some(st) = e.start_ns {
                s[e.vm].1 = st;
            }
            if let Some(sp) = e.stop_ns {
                s[e.vm].2 = sp.min(self.duration_ns);
            }
        }
        s
    }

    /// The policy set in force at `t_ns`.
    pub fn policies_at(&self, t_ns: u64) -> PolicySet {
        let mut set = PolicySet::new(Some(self.capacity_bps));
        set.cost = self.cost;
        set.cycles_per_sec = self.cpu_hz;
        set.cpu_fair = self.cpu_fair;
        set.variant = self.variant;
        set.capacity_in_bps = self.capacity_in_bps;
        if let Ok(Some(pricing)) = self.cost_model.pricing() {
            set.pricing = pricing;
        }
        for (vm, (s, _, _)) in self.vms.iter().zip(self.state_at(t_ns)) {
            set = set.with_vif(&vm.name, s.policy);
        }
        set
    }

    /// Whether VM `i` receives (its data comes from the uplink) rather than sends.
    pub fn is_download(&self, i: usize) -> bool {
        self.vms[i].direction == Direction::Download
    }

    /// Whether some VMs upload and others download.
    pub fn mixed_directions(&self) -> bool {
        let first = self.vms.first().map(|v| v.direction);
        self.vms.iter().any(|v| Some(v.direction) != first)
    }

    /// The policy a VM's data meets, for the reference allocation: upload as written (the
    /// engine's); download its inbound policy ([`VifPolicy::inbound`], the downlink engine's)
    /// when the downlink is scheduled, else only its inbound maximum (`max_in`, else `max`,
    /// as the data plane's downlink bucket) — weight 1, no minimum, no burst.
    pub fn reference_policy(&self, i: usize, p: &VifPolicy) -> VifPolicy {
        match self.vms[i].direction {
            Direction::Upload => p.clone(),
            Direction::Download if self.downlink_scheduled => p.inbound(true),
            Direction::Download => VifPolicy {
                max_bps: p.inbound_max_bps(true),
                max_in_bps: None,
                burst_bytes: None,
                ..VifPolicy::default()
            },
        }
    }

    /// Whether VM `i` is sending at `t_ns`.
    pub fn active_at(&self, i: usize, t_ns: u64) -> bool {
        let (_, start, stop) = &self.state_at(t_ns)[i];
        *start <= t_ns && t_ns < *stop
    }

    /// Phase boundaries `(start_ns, end_ns)`: between consecutive times at which anything
    /// changes (0, every event, every start and stop, the end).
    pub fn phases(&self) -> Vec<(u64, u64)> {
        let mut cuts = BTreeSet::new();
        cuts.insert(0);
        cuts.insert(self.duration_ns);
        for v in &self.vms {
            cuts.insert(v.start_ns);
            cuts.insert(v.stop_ns);
        }
        for e in &self.events {
            cuts.insert(e.at_ns);
            if let Some(s) = e.start_ns {
                cuts.insert(s);
            }
            if let Some(s) = e.stop_ns {
                cuts.insert(s);
            }
        }
        let cuts: Vec<u64> = cuts
            .into_iter()
            .filter(|&c| c <= self.duration_ns)
            .collect();
        cuts.windows(2).map(|w| (w[0], w[1])).collect()
    }

    /// The external bottleneck's rate at `t_ns` (bottleneck events applied; `None` = none).
    pub fn bottleneck_at(&self, t_ns: u64) -> Option<u64> {
        let mut b = self.bottleneck_bps;
        for e in self.events.iter().take_while(|e| e.at_ns <= t_ns) {
            if let Some(nb) = e.bottleneck_bps {
                // u64::MAX stands for "unlimited": the bottleneck is gone.
                b = (nb != u64::MAX).then_some(nb);
            }
        }
        b
    }

    /// The capacity of the tightest shared link at `t_ns` (the bottleneck when one is set).
    pub fn tightest_at(&self, t_ns: u64) -> u64 {
        self.bottleneck_at(t_ns)
            .map_or(self.capacity_bps, |b| b.min(self.capacity_bps))
    }

    /// The capacity of the tightest link what VMs receive crosses at `t_ns`: the bottleneck,
    /// the downlink capacity (`capacity_in`, else `capacity`).
    pub fn tightest_in_at(&self, t_ns: u64) -> u64 {
        let cap = self
            .policies_at(t_ns)
            .downlink_capacity_bps()
            .unwrap_or(u64::MAX);
        self.bottleneck_at(t_ns).map_or(cap, |b| b.min(cap))
    }

    /// The capacity of the tightest shared link at the start.
    pub fn tightest_bps(&self) -> u64 {
        self.tightest_at(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIG5: &str = r#"
name = "t"
duration = "30s"
capacity = "940Mbit"
engine = "vqos"
[[vm]]
name = "vm1"
weight = 1
[[vm]]
name = "vm5"
weight = 5
[[event]]
at = "10s"
vm = "vm5"
max = "150Mbit"
[[event]]
at = "20s"
vm = "vm1"
min = "200Mbit"
[[expect]]
phase = 3
vm = "vm1"
near_reference_pct = 3
"#;

    #[test]
    fn parses_phases_and_events() {
        let s = Scenario::parse(FIG5).unwrap();
        assert_eq!(
            s.phases(),
            vec![
                (0, 10_000_000_000),
                (10_000_000_000, 20_000_000_000),
                (20_000_000_000, 30_000_000_000)
            ]
        );
        let p = s.policies_at(25_000_000_000);
        assert_eq!(p.vifs[0].policy.min_bps, 200_000_000);
        assert_eq!(p.vifs[1].policy.max_bps, Some(150_000_000));
        assert_eq!(s.policies_at(5_000_000_000).vifs[1].policy.max_bps, None);
        assert_eq!(s.expectations[0].check, Check::NearReference(3.0));
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = FIG5.replace("weight = 5", "wieght = 5");
        let err = Scenario::parse(&text).unwrap_err().to_string();
        assert!(err.contains("wieght"), "{err}");
        assert!(err.contains("line 11"), "{err}");
    }

    #[test]
    fn refuses_bad_values() {
        for (from, to, needle) in [
            ("capacity = \"940Mbit\"", "capacity = \"fast\"", "capacity"),
            ("engine = \"vqos\"", "engine = \"wfq\"", "Unknown engine"),
            ("max = \"150Mbit\"", "max = \"150MB\"", "max"),
            ("vm = \"vm5\"", "vm = \"vm9\"", "unknown vm 'vm9'"),
            ("min = \"200Mbit\"", "min = \"950Mbit\"", "Sum of minimums"),
            (
                "engine = \"vqos\"",
                "engine = \"vqos\"\n[cost_model]\nprice_frame_bytes = 1518",
                "it needs cost = \"cycles\"",
            ),
            ("near_reference_pct = 3", "", "exactly one check"),
            ("phase = 3", "phase = 7", "phase must be"),
            (
                "duration = \"30s\"",
                "duration = \"3601s\"",
                "longer than the 3600 s",
            ),
            ("duration = \"30s\"", "duration = \"1e9\"", "'1e9'"),
            (
                "engine = \"vqos\"",
                "engine = \"vqos\"\n[topology]\nbottleneck = \"000Mbit\"",
                "topology.bottleneck: must be greater than 0",
            ),
            (
                "duration = \"30s\"",
                "duration = \"30s\"\nsettle = \"30s\"",
                "settle: 30s",
            ),
            (
                "duration = \"30s\"",
                "duration = \"30s\"\nsettle = \"1h\"",
                "settle",
            ),
        ] {
            let e = Scenario::parse(&FIG5.replace(from, to)).unwrap_err();
            // The message with its sources, as the CLI prints it.
            let mut err = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                err = format!("{err}: {s}");
                source = s.source();
            }
            assert!(err.contains(needle), "{from} -> {to}: {err}");
            assert_eq!(err.matches(needle).count(), 1, "repeated: {err}");
        }
    }

    #[test]
    fn on_off_sources() {
        let text = FIG5.replace("weight = 5", "weight = 5\non = \"100ms\"\noff = \"300ms\"");
        let s = Scenario::parse(&text).unwrap();
        let v = &s.vms[1].initial;
        assert_eq!(v.on_off_ns, Some((100_000_000, 300_000_000)));
        assert!(v.is_on(0, 50_000_000));
        assert!(!v.is_on(0, 150_000_000));
        assert!(v.is_on(0, 420_000_000));
        assert_eq!(v.next_toggle(0, 50_000_000), 100_000_000);
        assert_eq!(v.next_toggle(0, 150_000_000), 400_000_000);
        let bad = FIG5.replace("weight = 5", "weight = 5\non = \"100ms\"");
        assert!(Scenario::parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("both on and off"));
    }
}
