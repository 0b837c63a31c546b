//! The discrete-event simulation of what the switch does, in both directions, with ACKs back
//! to TCP senders:
//!
//! - **upload** (a VM sends): sources → vif queue → the engine's poll loop on one core → the
//!   host link → an optional external bottleneck → receivers;
//! - **download** (a VM receives): sources outside → the external bottleneck → the scheduled
//!   downlink (a queue per VM, CoDel, a second engine over the inbound policies at
//!   `capacity_in`, then PID-ECN marking: `sim/downlink.rs`) → the VM; with `downlink = "bucket"`,
//!   the host link's inbound direction and the VM's inbound maximum (a token bucket that
//!   drops) instead (docs/design.md, "The scheduled downlink").
//!
//! ## Behavior
//! - **Sources.** Greedy TCP-like flows (slow start, then AIMD: +1 segment per RTT, halve once
//!   per RTT on a loss or an ECN echo, a receive-window cap) and constant-rate UDP. A VM's
//!   flows share its vif queue (a guest ring of [`VIF_QUEUE_PKTS`] packets): when the ring is
//!   full a TCP flow waits (back-pressure, no loss) and a UDP source loses the datagram
//!   (counted as `guest_drops`).
//! - **The switch** is one core of `cpu_hz` running the real engine from `vqos-sched` exactly as
//!   the data plane does: tick when due, `select` among ready vifs, take up to 32 packets, `admit`
//!   each, charge bytes/packets/cycles. Every packet costs cycles after C2QoS §III
//!   ([`CycleCostModel`]); the batch occupies the core for those cycles. A NIC transmit ring of
//!   [`TX_RING_NS`] decouples the core from the link; when it is full the core waits.
//! - **The link** serialises at `capacity`; the optional **bottleneck** is a drop-tail FIFO of
//!   `bottleneck_queue` packets at its own rate, shared by whoever sends (so by connection count).
//! - **The inbound path without the scheduled downlink** (`downlink = "bucket"`) is the data
//!   plane's then: its inbound maximum (`max_in`,
//!   else `max`) is [`vqos_sched::bucket::link_bucket`], the very bucket the data plane's
//!   downlink uses (4 ms deep, at least two 64 KiB frames); a packet that finds it empty is
//!   dropped (`rate_limited`), the TCP sender sees a loss. The host link's inbound direction
//!   serialises at `capacity` with no queue limit (the sender's own queue).
//! - **Controllers** run at their own wake times on the per-vif byte counters of the switch
//!   (sent plus received), as in the daemon: the fairness adjuster's limits become the vifs'
//!   maximums (the lower of the user's and the controller's; for a download VM the inbound
//!   maximum follows, as `max` does without `max_in`); PID-ECN marks CE on ECN-capable packets
//!   of the VM's data direction: as they are served (upload) or as they pass the inbound path
//!   (download), as the data plane does.
//! - Deterministic: the only randomness (ECN draws, flow start jitter) comes from the seed.
//!
//! ## Limitations
//! - Inbound packets cost the simulated core no cycles (the data plane reads the uplink in
//!   the same loop; at the papers' rates the cost is a few % of the core).
//! - The bottleneck is one FIFO for both directions; a download packet enters it when sent,
//!   an upload packet when the host link has sent it, up to [`TX_RING_NS`] ahead of the core's
//!   clock: the two streams are merged in the order they are computed, not exactly in time.
//! - An unlimited UDP source outside sends at `capacity`.
//! - No TSO super-frames, no delayed ACKs, no retransmission timeouts (a loss is detected one
//!   RTT later, as by duplicate ACKs).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use vqos_sched::bucket::{bytes_per_sec, link_bucket};
use vqos_sched::controllers::fairness::{FairnessAdjuster, FairnessParams};
use vqos_sched::controllers::pid_ecn::{PidEcn, PidParams};
use vqos_sched::{Granted, PolicyError, PolicySet, Scheduler, Step, TokenBucket, Usage, Verdict};

use crate::scenario::{CycleCostModel, Scenario, Traffic, VmSettings};

mod downlink;
mod path;
mod sources;

/// Packets a vif queue (the guest's ring) holds.
pub const VIF_QUEUE_PKTS: usize = 256;

/// How far ahead of the link the core may run (the NIC's transmit ring), ns.
pub const TX_RING_NS: u64 = 200_000;

/// Width of the time-series bins, ns.
pub const BIN_NS: u64 = 10_000_000;

/// TCP receive window cap, bytes.
const RWND_BYTES: f64 = 4.0 * 1024.0 * 1024.0;

/// Initial congestion window, segments.
const INITIAL_CWND: f64 = 10.0;

const NS: u64 = 1_000_000_000;

/// One packet in a vif queue.
#[derive(Debug, Clone, Copy)]
struct Pkt {
    /// Global flow index, or `u32::MAX` for UDP.
    flow: u32,
    /// Bytes on the wire.
    bytes: u32,
    /// When the sender queued it (for RTT samples).
    sent_ns: u64,
}

const UDP: u32 = u32::MAX;

/// A TCP-like flow.
#[derive(Debug, Clone)]
struct Flow {
    /// Owning VM.
    vm: usize,
    /// False once the VM stopped or its flows were rebuilt: late ACKs are ignored.
    alive: bool,
    /// Congestion window, segments.
    cwnd: f64,
    /// Slow-start threshold, segments.
    ssthresh: f64,
    /// Segments sent and not yet acknowledged or lost.
    inflight: u32,
    /// When the window was last halved (at most once per RTT).
    last_cut_ns: u64,
    /// Smoothed RTT, ns.
    srtt_ns: u64,
    /// Base RTT (propagation + host), ns.
    base_rtt_ns: u64,
    /// Segment size, bytes on the wire.
    seg_bytes: u32,
}

/// Per-VM runtime state.
#[derive(Debug)]
struct VmRt {
    /// Current settings.
    settings: VmSettings,
    /// Whether its sources are running.
    active: bool,
    /// The guest ring.
    queue: VecDeque<Pkt>,
    /// Its TCP flows (indices into `Sim::flows`).
    flows: Vec<usize>,
    /// Round-robin cursor over `flows` when refilling the ring.
    flow_cursor: usize,
    /// UDP arrivals not yet turned into packets, in bit·ns (rate × time).
    udp_credit: u128,
    /// When UDP credit was last accrued.
    udp_last_ns: u64,
    /// When the VM (re)started sending: the phase origin of an on/off source.
    start_ns: u64,
}

/// Per-VM counters of a run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VmCounters {
    /// Bytes the switch forwarded from the vif.
    pub switched_bytes: u64,
    /// Bytes that reached the receiver.
    pub delivered_bytes: u64,
    /// Datagrams lost because the guest ring was full (UDP).
    pub guest_drops: u64,
    /// Packets the engine's policer dropped.
    pub policed: u64,
    /// Packets dropped at the external bottleneck.
    pub bottleneck_drops: u64,
    /// Packets to a download VM dropped by its inbound maximum (the data plane's
    /// `rate_limited`: the bucket, or the downlink engine's policer).
    pub rate_limited: u64,
    /// Packets to a download VM that found its downlink queue full (`queue_full`).
    pub queue_full: u64,
    /// Datagrams to a download VM the downlink's AQM dropped (`aqm`).
    pub aqm_drops: u64,
    /// Packets marked CE.
    pub ce_marks: u64,
    /// Cycles the core spent on the vif's packets.
    pub cycles: u64,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct SimOutput {
    /// Delivered bytes per VM per [`BIN_NS`] bin.
    pub bins: Vec<Vec<u64>>,
    /// Counters per VM.
    pub counters: Vec<VmCounters>,
    /// Fraction of the core busy over the run.
    pub cpu_busy: f64,
    /// Controller trace: per bin, per VM, the controller's rate limit (bps) or ECN
    /// probability (×1e6), whichever controller runs; empty without controllers.
    pub control_trace: Vec<Vec<u64>>,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EvKind {
    Ack { ce: bool },
    Loss,
}

/// The simulator.
pub struct Sim<'a> {
    sc: &'a Scenario,
    /// The engine with its ready set (the protocol the data plane runs too).
    sched: Scheduler,
    vms: Vec<VmRt>,
    flows: Vec<Flow>,
    /// ACK/loss events: (time, sequence, flow, kind).
    events: BinaryHeap<Reverse<(u64, u64, usize, EvKind)>>,
    seq: u64,
    /// The core's clock: when it is next free.
    switch_ns: u64,
    /// When the link finishes what it was given.
    link_free_ns: u64,
    /// When the host link's inbound direction finishes what it was given.
    link_in_free_ns: u64,
    /// Each VM's inbound maximum (download VMs), as the data plane's downlink bucket, when
    /// the downlink is not scheduled.
    down_buckets: Vec<Option<TokenBucket>>,
    /// The scheduled downlink.
    down: Option<downlink::DownSim>,
    /// Departure times of packets in the bottleneck queue.
    bottleneck: VecDeque<u64>,
    bottleneck_free_ns: u64,
    /// The bottleneck's current rate (bottleneck events change it).
    bottleneck_bps: Option<u64>,
    counters: Vec<VmCounters>,
    bins: Vec<Vec<u64>>,
    busy_cycles: u128,
    total_flows: u32,
    rng: u64,
    fairness: Option<FairnessAdjuster>,
    /// The fairness adjuster's current limits.
    ctrl_limits: Vec<Option<u64>>,
    pid: Option<PidEcn>,
    control_trace: Vec<Vec<u64>>,
    cost_model: CycleCostModel,
}

/// splitmix64: a small, good, seedable generator.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<'a> Sim<'a> {
    /// Prepares a run of `sc` with `seed`.
    pub fn new(sc: &'a Scenario, seed: u64) -> Result<Self, PolicyError> {
        let policies = sc.policies_at(0);
        let sched = Scheduler::build(sc.engine, &policies, 0)?;
        // Only download VMs' data is modelled on the downlink (ACKs are not packets here).
        let receives = (0..sc.vms.len()).any(|i| sc.is_download(i));
        let down = match sc.downlink_scheduled && receives {
            true => Some(downlink::DownSim::new(sc, &policies)?),
            false => None,
        };
        let n = sc.vms.len();
        let nbins = sc.duration_ns.div_ceil(BIN_NS) as usize;
        let fairness = sc.fairness.then(|| {
            let mut p = FairnessParams {
                variant: sc.variant,
                ..FairnessParams::default()
            };
            if let Some(s) = sc.controller.fairness_period_s {
                p.period_ns = (s * 1e9) as u64;
            }
            let weights: Vec<u32> = policies.vifs.iter().map(|v| v.policy.weight).collect();
            FairnessAdjuster::new(p, &weights)
        });
        let pid = sc.pid_ecn.then(|| {
            let mut p = PidParams {
                capacity_bps: sc.tightest_bps(),
                seed,
                ..PidParams::default()
            };
            if let Some(k) = sc.controller.kp {
                p.kp = k;
            }
            if let Some(k) = sc.controller.ki {
                p.ki = k;
            }
            if let Some(k) = sc.controller.kd {
                p.kd = k;
            }
            PidEcn::new(p, n)
        });
        let vms = sc
            .vms
            .iter()
            .map(|v| VmRt {
                settings: v.initial.clone(),
                active: false,
                queue: VecDeque::with_capacity(VIF_QUEUE_PKTS),
                flows: Vec::new(),
                flow_cursor: 0,
                udp_credit: 0,
                udp_last_ns: 0,
                start_ns: v.start_ns,
            })
            .collect();
        Ok(Sim {
            sc,
            sched,
            vms,
            flows: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            switch_ns: 0,
            link_free_ns: 0,
            link_in_free_ns: 0,
            down_buckets: vec![None; n],
            down,
            bottleneck: VecDeque::new(),
            bottleneck_free_ns: 0,
            bottleneck_bps: sc.bottleneck_bps,
            counters: vec![VmCounters::default(); n],
            bins: vec![vec![0; nbins]; n],
            busy_cycles: 0,
            total_flows: 0,
            rng: seed ^ 0x5EED,
            fairness,
            ctrl_limits: vec![None; n],
            pid,
            control_trace: Vec::new(),
            cost_model: sc.cost_model,
        })
    }

    /// The policies in force at `t`, with the fairness adjuster's limits applied.
    fn effective_policies(&self, t: u64) -> PolicySet {
        let mut set = self.sc.policies_at(t);
        for (v, lim) in set.vifs.iter_mut().zip(&self.ctrl_limits) {
            if let Some(l) = lim {
                let l = (*l).max(v.policy.min_bps);
                v.policy.max_bps = Some(v.policy.max_bps.map_or(l, |m| m.min(l)));
            }
        }
        set
    }

    fn push_event(&mut self, at: u64, flow: usize, kind: EvKind) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, flow, kind)));
    }

    /// Applies the scenario's state at `t`: starts, stops, settings, policies.
    fn apply_changes(&mut self, t: u64) {
        self.bottleneck_bps = self.sc.bottleneck_at(t);
        let state = self.sc.state_at(t);
        for (i, (settings, start, stop)) in state.into_iter().enumerate() {
            let active = start <= t && t < stop;
            let rebuild = active
                && (!self.vms[i].active
                    || settings.flows != self.vms[i].settings.flows
                    || settings.traffic != self.vms[i].settings.traffic
                    || settings.rtt_ns != self.vms[i].settings.rtt_ns
                    || settings.packet_size != self.vms[i].settings.packet_size);
            if !active || rebuild {
                for &f in &self.vms[i].flows {
                    self.flows[f].alive = false;
                }
                self.total_flows -= self.vms[i].flows.len() as u32;
                self.vms[i].flows.clear();
            }
            let was_active = self.vms[i].active;
            self.vms[i].settings = settings.clone();
            self.vms[i].active = active;
            if rebuild && settings.traffic == Traffic::Tcp {
                for _ in 0..settings.flows {
                    // A little start jitter so flows do not move in lockstep.
                    let jitter = splitmix(&mut self.rng) % 50_000;
                    self.flows.push(Flow {
                        vm: i,
                        alive: true,
                        cwnd: INITIAL_CWND,
                        ssthresh: f64::INFINITY,
                        inflight: 0,
                        last_cut_ns: 0,
                        srtt_ns: settings.rtt_ns + jitter,
                        base_rtt_ns: settings.rtt_ns,
                        seg_bytes: settings.packet_size,
                    });
                    self.vms[i].flows.push(self.flows.len() - 1);
                }
                self.total_flows += settings.flows;
            }
            if active && !was_active {
                self.vms[i].udp_last_ns = t;
                self.vms[i].udp_credit = 0;
                self.vms[i].start_ns = start;
            }
            if !active {
                // An application that stops takes its unsent data with it.
                self.vms[i].queue.clear();
                if let Some(d) = self.down.as_mut() {
                    d.clear(i);
                }
            }
            self.fill_tcp(i, t);
        }
        self.configure(t);
    }

    /// Gives the engine the policies in force (the scenario's, with the controllers' limits)
    /// and sets every download VM's inbound bucket from them; an unchanged rate keeps its
    /// bucket, as the data plane's `rebucket` does.
    fn configure(&mut self, t: u64) {
        let policies = self.effective_policies(t);
        // Validated when the scenario was parsed; the controller's limits never go below a
        // floor, so a failure here would be a bug worth seeing.
        if let Err(e) = self.sched.configure(&policies, t) {
            panic!("policy set at {t} ns refused: {e}");
        }
        if let Some(d) = self.down.as_mut() {
            if let Err(e) = d.configure(&policies, t) {
                panic!("downlink policy set at {t} ns refused: {e}");
            }
        }
        for (i, v) in policies.vifs.iter().enumerate() {
            let rate = (self.sc.is_download(i) && self.down.is_none())
                .then(|| v.policy.inbound_max_bps(true))
                .flatten();
            let b = &mut self.down_buckets[i];
            *b = match (b.take(), rate) {
                (_, None) => None,
                (Some(old), Some(r)) if old.rate_per_sec() == bytes_per_sec(r) => Some(old),
                (_, Some(r)) => Some(link_bucket(r, t)),
            };
        }
    }

    /// Runs the whole scenario.
    pub fn run(mut self) -> SimOutput {
        let end = self.sc.duration_ns;
        let mut changes: Vec<u64> = self.sc.phases().iter().map(|p| p.0).collect();
        changes.retain(|&c| c > 0);
        let mut next_change = 0usize;
        self.apply_changes(0);
        let mut next_trace = 0u64;
        loop {
            let t = self.switch_ns;
            if t >= end {
                break;
            }
            // Events due before the core's next decision.
            if let Some(Reverse((at, _, _, _))) = self.events.peek() {
                if *at <= t {
                    let Reverse((at, _, f, kind)) = self.events.pop().expect("peeked");
                    self.on_event(at, f, kind);
                    continue;
                }
            }
            if next_change < changes.len() && changes[next_change] <= t {
                self.apply_changes(changes[next_change]);
                next_change += 1;
                continue;
            }
            self.run_controllers(t);
            if t >= next_trace {
                self.trace();
                next_trace += BIN_NS;
            }
            for i in 0..self.vms.len() {
                self.fill_udp(i, t);
                if self.vms[i].settings.on_off_ns.is_some() {
                    // An on/off TCP source turning on has no ACK to clock it.
                    self.fill_tcp(i, t);
                }
                self.sched.set_ready(i, !self.vms[i].queue.is_empty());
            }
            if self.serve_down(t) {
                continue;
            }
            match self.sched.step(t) {
                Step::Serve(g) => self.serve(g, t),
                Step::Refused { until_ns } | Step::Idle { until_ns } => {
                    let down = self.down.as_ref().map_or(u64::MAX, |d| d.wake_at(t));
                    let mut wake = until_ns
                        .min(down)
                        .min(self.next_udp_ns(t))
                        .min(self.controller_wake())
                        .min(end);
                    if let Some(Reverse((at, _, _, _))) = self.events.peek() {
                        wake = wake.min(*at);
                    }
                    if next_change < changes.len() {
                        wake = wake.min(changes[next_change]);
                    }
                    self.switch_ns = wake.max(t + 1);
                }
            }
        }
        let cpu_busy = self.busy_cycles as f64 / (self.sc.cpu_hz as f64 * end as f64 / 1e9);
        SimOutput {
            bins: self.bins,
            counters: self.counters,
            cpu_busy,
            control_trace: self.control_trace,
        }
    }

    fn controller_wake(&self) -> u64 {
        let a = self.fairness.as_ref().map_or(u64::MAX, |f| f.next_wake());
        let b = self.pid.as_ref().map_or(u64::MAX, |p| p.next_slot());
        a.min(b)
    }

    fn run_controllers(&mut self, t: u64) {
        let bytes: Vec<u64> = self.counters.iter().map(|c| c.switched_bytes).collect();
        if let Some(pid) = self.pid.as_mut() {
            if pid.next_slot() <= t {
                pid.on_slot(t, &bytes);
            }
        }
        let mut changed = false;
        if let Some(f) = self.fairness.as_mut() {
            if f.next_wake() <= t {
                for c in f.on_sample(t, &bytes) {
                    self.ctrl_limits[c.vif] = c.max_bps;
                    changed = true;
                }
            }
        }
        if changed {
            self.configure(t);
        }
    }

    fn trace(&mut self) {
        if let Some(pid) = &self.pid {
            self.control_trace.push(
                (0..self.vms.len())
                    .map(|i| (pid.probability(i) * 1e6) as u64)
                    .collect(),
            );
        } else if self.fairness.is_some() {
            self.control_trace
                .push(self.ctrl_limits.iter().map(|l| l.unwrap_or(0)).collect());
        }
    }
}

/// Runs `sc` with `seed`.
pub fn simulate(sc: &Scenario, seed: u64) -> Result<SimOutput, PolicyError> {
    Ok(Sim::new(sc, seed)?.run())
}
