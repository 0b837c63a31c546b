//! The VMs' sources: TCP flows (into the guest ring, or for a download VM through the
//! inbound path) and their ACK clock, UDP at a constant rate.

use super::*;

impl Sim<'_> {
    /// Lets the VM's TCP flows put segments into its ring while they may; a download VM's
    /// senders outside send them into the inbound path at once.
    pub(super) fn fill_tcp(&mut self, vm: usize, t: u64) {
        if self.sc.is_download(vm) {
            self.send_inbound_tcp(vm, t);
            return;
        }
        let v = &mut self.vms[vm];
        if !v.active
            || v.settings.traffic != Traffic::Tcp
            || v.flows.is_empty()
            || !v.settings.is_on(v.start_ns, t)
        {
            return;
        }
        let n = v.flows.len();
        let mut idle_rounds = 0;
        while v.queue.len() < VIF_QUEUE_PKTS && idle_rounds < n {
            let f = v.flows[v.flow_cursor % n];
            v.flow_cursor = (v.flow_cursor + 1) % n;
            let flow = &mut self.flows[f];
            if f64::from(flow.inflight) < flow.cwnd {
                flow.inflight += 1;
                v.queue.push_back(Pkt {
                    flow: f as u32,
                    bytes: flow.seg_bytes,
                    sent_ns: t,
                });
                idle_rounds = 0;
            } else {
                idle_rounds += 1;
            }
        }
    }

    /// The segments a download VM's flows may send at `t`, through the inbound path.
    pub(super) fn send_inbound_tcp(&mut self, vm: usize, t: u64) {
        let v = &self.vms[vm];
        if !v.active
            || v.settings.traffic != Traffic::Tcp
            || v.flows.is_empty()
            || !v.settings.is_on(v.start_ns, t)
        {
            return;
        }
        let n = v.flows.len();
        let mut idle_rounds = 0;
        while idle_rounds < n {
            let v = &mut self.vms[vm];
            let f = v.flows[v.flow_cursor % n];
            v.flow_cursor = (v.flow_cursor + 1) % n;
            let flow = &mut self.flows[f];
            if f64::from(flow.inflight) < flow.cwnd {
                flow.inflight += 1;
                let pkt = Pkt {
                    flow: f as u32,
                    bytes: flow.seg_bytes,
                    sent_ns: t,
                };
                self.inbound(vm, pkt, t);
                idle_rounds = 0;
            } else {
                idle_rounds += 1;
            }
        }
    }

    /// Turns UDP credit accrued up to `t` into datagrams in the ring (overflow is lost); for
    /// a download VM, into datagrams through the inbound path (an unlimited source outside
    /// sends at `capacity`).
    pub(super) fn fill_udp(&mut self, vm: usize, t: u64) {
        if self.sc.is_download(vm) {
            self.send_inbound_udp(vm, t);
            return;
        }
        let v = &mut self.vms[vm];
        // `<`, not `<=`: an unlimited source tops its queue up whenever it is asked, also at the
        // instant of its last fill (at its start nothing else would wake the loop for it).
        if !v.active || v.settings.traffic != Traffic::Udp || t < v.udp_last_ns {
            return;
        }
        if !v.settings.is_on(v.start_ns, t) {
            // Off: the application produces nothing; credit does not accrue.
            v.udp_last_ns = t;
            return;
        }
        let pkt_bits_ns = u128::from(v.settings.packet_size) * 8 * u128::from(NS);
        match v.settings.rate_bps {
            None => {
                while v.queue.len() < VIF_QUEUE_PKTS {
                    v.queue.push_back(Pkt {
                        flow: UDP,
                        bytes: v.settings.packet_size,
                        sent_ns: t,
                    });
                }
            }
            Some(r) => {
                v.udp_credit += u128::from(r) * u128::from(t - v.udp_last_ns);
                let n = v.udp_credit / pkt_bits_ns;
                v.udp_credit -= n * pkt_bits_ns;
                for _ in 0..n {
                    if v.queue.len() < VIF_QUEUE_PKTS {
                        v.queue.push_back(Pkt {
                            flow: UDP,
                            bytes: v.settings.packet_size,
                            sent_ns: t,
                        });
                    } else {
                        self.counters[vm].guest_drops += 1;
                    }
                }
            }
        }
        v.udp_last_ns = t;
    }

    /// The datagrams a download VM's source outside has produced by `t`, through the inbound
    /// path.
    pub(super) fn send_inbound_udp(&mut self, vm: usize, t: u64) {
        let v = &mut self.vms[vm];
        if !v.active || v.settings.traffic != Traffic::Udp || t <= v.udp_last_ns {
            return;
        }
        if !v.settings.is_on(v.start_ns, t) {
            v.udp_last_ns = t;
            return;
        }
        let rate = v.settings.rate_bps.unwrap_or(self.sc.capacity_bps);
        let pkt_bits_ns = u128::from(v.settings.packet_size) * 8 * u128::from(NS);
        v.udp_credit += u128::from(rate) * u128::from(t - v.udp_last_ns);
        let n = v.udp_credit / pkt_bits_ns;
        v.udp_credit -= n * pkt_bits_ns;
        v.udp_last_ns = t;
        let pkt = Pkt {
            flow: UDP,
            bytes: v.settings.packet_size,
            sent_ns: t,
        };
        for _ in 0..n {
            self.inbound(vm, pkt, t);
        }
    }

    /// When the next UDP datagram of any VM arrives, or an on/off source turns, after `t`.
    pub(super) fn next_udp_ns(&self, t: u64) -> u64 {
        let mut next = u64::MAX;
        for (i, v) in self.vms.iter().enumerate() {
            if v.active {
                next = next.min(v.settings.next_toggle(v.start_ns, t));
            }
            if !v.active || v.settings.traffic != Traffic::Udp || !v.settings.is_on(v.start_ns, t) {
                continue;
            }
            // A download source outside without a rate sends at the capacity.
            let rate = match v.settings.rate_bps {
                None if self.sc.is_download(i) => Some(self.sc.capacity_bps),
                r => r,
            };
            if let Some(r) = rate {
                let pkt = u128::from(v.settings.packet_size) * 8 * u128::from(NS);
                let need = pkt.saturating_sub(v.udp_credit).div_ceil(u128::from(r));
                next = next.min(v.udp_last_ns.saturating_add(need as u64).max(t + 1));
            }
        }
        next
    }

    pub(super) fn on_event(&mut self, t: u64, f: usize, kind: EvKind) {
        let flow = &mut self.flows[f];
        if !flow.alive {
            return;
        }
        flow.inflight = flow.inflight.saturating_sub(1);
        let congestion = match kind {
            EvKind::Ack { ce } => ce,
            EvKind::Loss => true,
        };
        if congestion {
            if t.saturating_sub(flow.last_cut_ns) >= flow.srtt_ns {
                flow.cwnd = (flow.cwnd / 2.0).max(1.0);
                flow.ssthresh = flow.cwnd;
                flow.last_cut_ns = t;
            }
        } else if flow.cwnd < flow.ssthresh {
            flow.cwnd += 1.0;
        } else {
            flow.cwnd += 1.0 / flow.cwnd;
        }
        let max_cwnd = RWND_BYTES / f64::from(flow.seg_bytes);
        flow.cwnd = flow.cwnd.min(max_cwnd);
        let vm = flow.vm;
        self.fill_tcp(vm, t);
    }
}
