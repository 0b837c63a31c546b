//! The scheduled downlink, modelled as the data plane runs it (`vqos_dataplane::downlink`):
//! a download VM's packets, once past the bottleneck, wait in a queue per VM bounded as the
//! data plane's ([`DownlinkConfig`]: frames, and a small buffer's bytes per packet, every
//! simulated packet fitting one), and leave through a second engine of the scenario's kind
//! over the VMs' inbound policies ([`PolicySet::downlink`]) at the downlink capacity, each
//! passing the same CoDel ([`Codel`]) on its sojourn time: a TCP packet (ECN-capable) is
//! marked CE, a UDP datagram dropped; then the engine's `admit`, then PID-ECN's mark.
//!
//! ## Choices
//! - The downlink's batches cost the simulated core no time: the core's clock is not
//!   advanced by them (as the inbound path did before; docs/design.md, "The scheduled
//!   downlink"). The engine is charged their bytes and the cycle model's cycles.
//! - A packet is delivered when its batch is served (the downlink capacity is the pace;
//!   the NIC's line rate is taken as faster, as the lab's veth is).

use vqos_sched::aqm::SMALL_BUF_BYTES;
use vqos_sched::{Codel, DownlinkConfig};

use super::*;

/// The downlink's state.
pub(super) struct DownSim {
    /// The engine over the VMs' inbound policies.
    sched: Scheduler,
    /// The downlink capacity (`None`: unlimited).
    shaper: Option<TokenBucket>,
    /// Per VM: packets and when each arrived, oldest first.
    queues: Vec<VecDeque<(Pkt, u64)>>,
    /// Per VM: bytes queued.
    bytes: Vec<u64>,
    /// Per VM: its AQM.
    codel: Vec<Codel>,
    /// Bounds and AQM.
    config: DownlinkConfig,
    /// When the engine last said a ready VM may go again (it refused them all).
    refused_until: u64,
}

/// One packet leaving the downlink: delivered (with CE or not) or lost.
enum Out {
    Delivered(Pkt, bool),
    Lost(Pkt),
}

impl DownSim {
    /// A downlink over `policies` (its own vifs' order) at time 0.
    pub(super) fn new(sc: &Scenario, policies: &PolicySet) -> Result<DownSim, PolicyError> {
        let set = policies.downlink(true);
        let n = set.len();
        Ok(DownSim {
            sched: Scheduler::build(sc.engine, &set, 0)?,
            shaper: set.downlink_capacity_bps().map(|c| link_bucket(c, 0)),
            queues: vec![VecDeque::new(); n],
            bytes: vec![0; n],
            codel: vec![Codel::default(); n],
            config: DownlinkConfig::default(),
            refused_until: 0,
        })
    }

    /// Installs the policies in force at `t`; an unchanged capacity keeps its bucket.
    pub(super) fn configure(&mut self, policies: &PolicySet, t: u64) -> Result<(), PolicyError> {
        let set = policies.downlink(true);
        self.sched.configure(&set, t)?;
        let rate = set.downlink_capacity_bps();
        self.shaper = match (self.shaper.take(), rate) {
            (_, None) => None,
            (Some(old), Some(r)) if old.rate_per_sec() == bytes_per_sec(r) => Some(old),
            (_, Some(r)) => Some(link_bucket(r, t)),
        };
        Ok(())
    }

    /// Queues `pkt` for `vm`, arriving at `at`; false when the queue is full.
    pub(super) fn enqueue(&mut self, vm: usize, pkt: Pkt, at: u64) -> bool {
        let q = &mut self.queues[vm];
        let held = (q.len() as u64 + 1) * SMALL_BUF_BYTES as u64;
        if q.len() >= self.config.queue_frames || held > self.config.queue_bytes {
            return false;
        }
        q.push_back((pkt, at));
        self.bytes[vm] += u64::from(pkt.bytes);
        true
    }

    /// Forgets what `vm` had queued (its application stopped).
    pub(super) fn clear(&mut self, vm: usize) {
        self.queues[vm].clear();
        self.bytes[vm] = 0;
    }

    /// When the downlink next has something to do after `t`: a packet arriving, or for
    /// packets already there the capacity refilling or the engine letting them go (its ticks
    /// matter only then: an idle downlink does not wake the loop).
    pub(super) fn wake_at(&self, t: u64) -> u64 {
        let mut at = u64::MAX;
        let mut waiting = false;
        for q in &self.queues {
            match q.front() {
                Some(&(_, a)) if a > t => at = at.min(a),
                Some(_) => waiting = true,
                None => {}
            }
        }
        if waiting {
            // Packets are there: the capacity or the engine held them back.
            let capacity = self.shaper.as_ref().map_or(0, |b| b.positive_at());
            let engine = self.refused_until.min(self.sched.wake_at(t));
            at = at.min(capacity.max(engine).max(t + 1));
        }
        at
    }
}

impl Sim<'_> {
    /// Serves one downlink batch at `t` if a packet has arrived, the capacity allows and the
    /// engine grants; true if it did (the caller loops at the same `t`).
    pub(super) fn serve_down(&mut self, t: u64) -> bool {
        let Some(d) = self.down.as_mut() else {
            return false;
        };
        for (i, q) in d.queues.iter().enumerate() {
            d.sched
                .set_ready(i, q.front().is_some_and(|&(_, a)| a <= t));
        }
        if d.sched.ready().none() {
            return false;
        }
        if let Some(b) = &mut d.shaper {
            b.refill(t);
            if !b.positive() {
                return false;
            }
        }
        let g = match d.sched.step(t) {
            Step::Serve(g) => g,
            Step::Refused { until_ns } => {
                d.refused_until = until_ns;
                return false;
            }
            Step::Idle { .. } => return false,
        };
        let vm = g.vif();
        let mut out = Vec::with_capacity(g.max_packets());
        let mut usage = Usage::default();
        let mut cycles = 0.0;
        let mut aqm_drops = 0;
        while out.len() < g.max_packets() {
            let Some(&(pkt, at)) = d.queues[vm].front().filter(|(_, a)| *a <= t) else {
                break;
            };
            d.queues[vm].pop_front();
            d.bytes[vm] -= u64::from(pkt.bytes);
            cycles += self.cost_model.cycles(pkt.bytes, self.total_flows);
            let tcp = pkt.flow != UDP;
            let signal =
                d.codel[vm].on_dequeue(&d.config.aqm, t - at, u64::from(pkt.bytes), d.bytes[vm], t);
            if signal && !tcp {
                aqm_drops += 1;
                continue;
            }
            match d.sched.admit(&g, pkt.bytes, t) {
                Verdict::Drop => out.push(Out::Lost(pkt)),
                v => {
                    usage.packets += 1;
                    usage.bytes += u64::from(pkt.bytes);
                    out.push(Out::Delivered(pkt, signal || v == Verdict::MarkCe));
                }
            }
        }
        usage.cycles = cycles as u64;
        if let Some(b) = &mut d.shaper {
            b.consume(usage.bytes);
        }
        d.sched.charge(g, usage, t);
        self.counters[vm].aqm_drops += aqm_drops;
        for o in out {
            match o {
                Out::Delivered(pkt, ce) => self.deliver_in(vm, pkt, ce, t),
                Out::Lost(pkt) => {
                    self.counters[vm].rate_limited += 1;
                    if pkt.flow != UDP {
                        let rtt = self.flows[pkt.flow as usize].base_rtt_ns;
                        self.push_event(t + rtt, pkt.flow as usize, EvKind::Loss);
                    }
                }
            }
        }
        true
    }

    /// Delivers a packet to download VM `vm` at `at`: PID-ECN's mark, the counters, and the
    /// ACK one base RTT later.
    pub(super) fn deliver_in(&mut self, vm: usize, pkt: Pkt, ce: bool, at: u64) {
        let tcp = pkt.flow != UDP;
        let ce = tcp && (ce || self.pid.as_mut().is_some_and(|p| p.should_mark(vm)));
        if ce {
            self.counters[vm].ce_marks += 1;
        }
        self.counters[vm].switched_bytes += u64::from(pkt.bytes);
        if let Some(b) = self.bins[vm].get_mut((at / BIN_NS) as usize) {
            *b += u64::from(pkt.bytes);
            self.counters[vm].delivered_bytes += u64::from(pkt.bytes);
        }
        if tcp {
            let f = pkt.flow as usize;
            let rtt = self.flows[f].base_rtt_ns;
            let flow = &mut self.flows[f];
            flow.srtt_ns = (flow.srtt_ns * 7 + (at + rtt - pkt.sent_ns)) / 8;
            self.push_event(at + rtt, f, EvKind::Ack { ce });
        }
    }
}
