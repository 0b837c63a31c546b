//! Where packets go once they leave a source: upload through the engine's batch, the host
//! link and the bottleneck ([`Sim::serve`]); download through the bottleneck, the host link
//! inbound and the inbound path ([`Sim::inbound`]).

use super::*;

impl Sim<'_> {
    pub(super) fn serve(&mut self, granted: Granted, t: u64) {
        let vm = granted.vif();
        let max_packets = granted.max_packets();
        let cap = self.sc.capacity_bps;
        let mut usage = Usage::default();
        let mut cpu_cycles: f64 = 0.0;
        for _ in 0..max_packets {
            let Some(pkt) = self.vms[vm].queue.pop_front() else {
                break;
            };
            cpu_cycles += self.cost_model.cycles(pkt.bytes, self.total_flows);
            let at_cpu = t + (cpu_cycles * 1e9 / self.sc.cpu_hz as f64) as u64;
            let verdict = self.sched.admit(&granted, pkt.bytes, at_cpu);
            let rtt = if pkt.flow == UDP {
                0
            } else {
                self.flows[pkt.flow as usize].base_rtt_ns
            };
            if verdict == Verdict::Drop {
                self.counters[vm].policed += 1;
                if pkt.flow != UDP {
                    self.push_event(at_cpu + rtt, pkt.flow as usize, EvKind::Loss);
                }
                continue;
            }
            let mut ce = verdict == Verdict::MarkCe;
            // PID-ECN marks what a VM sends too; the paper marks only what it receives.
            if let Some(pid) = self.pid.as_mut().filter(|_| !self.sc.variant.is_paper()) {
                if pkt.flow != UDP && pid.should_mark(vm) {
                    ce = true;
                }
            }
            if ce && pkt.flow != UDP {
                self.counters[vm].ce_marks += 1;
            }
            usage.packets += 1;
            usage.bytes += u64::from(pkt.bytes);
            // The host link.
            let ser = (u64::from(pkt.bytes) * 8 * NS).div_ceil(cap);
            self.link_free_ns = self.link_free_ns.max(at_cpu) + ser;
            // The external bottleneck.
            let sent = self.link_free_ns;
            let Some(delivered) = self.through_bottleneck(vm, pkt.bytes, sent) else {
                if pkt.flow != UDP {
                    self.push_event(sent + rtt, pkt.flow as usize, EvKind::Loss);
                }
                continue;
            };
            let bin = (delivered / BIN_NS) as usize;
            if let Some(b) = self.bins[vm].get_mut(bin) {
                *b += u64::from(pkt.bytes);
                self.counters[vm].delivered_bytes += u64::from(pkt.bytes);
            }
            if pkt.flow != UDP {
                let f = pkt.flow as usize;
                let sample = delivered + rtt - pkt.sent_ns;
                let flow = &mut self.flows[f];
                flow.srtt_ns = (flow.srtt_ns * 7 + sample) / 8;
                self.push_event(delivered + rtt, f, EvKind::Ack { ce });
            }
        }
        let cycles = cpu_cycles as u64;
        usage.cycles = cycles;
        self.busy_cycles += u128::from(cycles);
        self.counters[vm].cycles += cycles;
        self.counters[vm].switched_bytes += usage.bytes;
        let cpu_ns = (u128::from(cycles) * u128::from(NS) / u128::from(self.sc.cpu_hz)) as u64;
        let mut next = t + cpu_ns.max(1);
        // The NIC ring is full: the core waits for the link.
        if self.link_free_ns > next + TX_RING_NS {
            next = self.link_free_ns - TX_RING_NS;
        }
        self.switch_ns = next;
        self.sched.charge(granted, usage, next);
        self.fill_tcp(vm, t);
    }

    /// The external bottleneck for a packet of VM `vm` arriving at `at`: when it leaves, or
    /// `None` when the queue is full (counted).
    pub(super) fn through_bottleneck(&mut self, vm: usize, bytes: u32, at: u64) -> Option<u64> {
        let Some(b) = self.bottleneck_bps else {
            return Some(at);
        };
        while self.bottleneck.front().is_some_and(|&d| d <= at) {
            self.bottleneck.pop_front();
        }
        if self.bottleneck.len() >= self.sc.bottleneck_queue as usize {
            self.counters[vm].bottleneck_drops += 1;
            return None;
        }
        let ser_b = (u64::from(bytes) * 8 * NS).div_ceil(b);
        self.bottleneck_free_ns = self.bottleneck_free_ns.max(at) + ser_b;
        self.bottleneck.push_back(self.bottleneck_free_ns);
        Some(self.bottleneck_free_ns)
    }

    /// A packet sent to download VM `vm` at `t`: the bottleneck, then the scheduled downlink's
    /// queue ([`Sim::serve_down`] delivers it), or without one the host link inbound, the VM's
    /// inbound maximum (drop), PID-ECN's mark, delivery, and the ACK (or loss) one base RTT
    /// later.
    pub(super) fn inbound(&mut self, vm: usize, pkt: Pkt, t: u64) {
        let tcp = pkt.flow != UDP;
        let rtt = if tcp {
            self.flows[pkt.flow as usize].base_rtt_ns
        } else {
            0
        };
        let Some(at) = self.through_bottleneck(vm, pkt.bytes, t) else {
            if tcp {
                self.push_event(t + rtt, pkt.flow as usize, EvKind::Loss);
            }
            return;
        };
        if let Some(d) = self.down.as_mut() {
            if !d.enqueue(vm, pkt, at) {
                self.counters[vm].queue_full += 1;
                if tcp {
                    self.push_event(at + rtt, pkt.flow as usize, EvKind::Loss);
                }
            }
            return;
        }
        let ser = (u64::from(pkt.bytes) * 8 * NS).div_ceil(self.sc.capacity_bps);
        self.link_in_free_ns = self.link_in_free_ns.max(at) + ser;
        let at = self.link_in_free_ns;
        if let Some(b) = &mut self.down_buckets[vm] {
            b.refill(at);
            if !b.positive() {
                self.counters[vm].rate_limited += 1;
                if tcp {
                    self.push_event(at + rtt, pkt.flow as usize, EvKind::Loss);
                }
                return;
            }
            b.consume(u64::from(pkt.bytes));
        }
        self.deliver_in(vm, pkt, false, at);
    }
}
