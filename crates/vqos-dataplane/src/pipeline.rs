//! The forwarding pipeline of one batch, in the order a frame meets it:
//! [`Pipeline::read`] (port → [`Batch`]) → [`Pipeline::forward`]: per frame
//! [`validate`](Pipeline::validate) → [`anti_spoof`](Pipeline::anti_spoof) →
//! [`admit`](Pipeline::admit) (the engine's verdict, vif batches only) →
//! [`learn_and_lookup`](Pipeline::learn_and_lookup) → per-output queues
//! ([`unicast`](Pipeline::unicast) with the downlink maximum and ECN, or
//! [`flood`](Pipeline::flood)) → [`flush`](Pipeline::flush) (one `send_batch` per output port,
//! the uplink's bytes charged to its shaper). The caller charges the engine.
//!
//! The pipeline owns only its buffers; it borrows the port table, the MAC table, the
//! scheduler and the uplink shaper for one batch, so each stage touches exactly the parts it
//! needs and no slot is looked up twice per frame.

use vqos_sched::{Granted, Scheduler, Verdict};

use crate::frame::{self, is_group, mac_key, FrameError, MacKey, VNET_HDR_LEN};
use crate::l2::MacTable;
use crate::port::{Batch, BATCH_FRAMES};
use crate::ports::{PortEntry, PortTable};
use crate::shaper::UplinkShaper;

/// The engine's side of a vif batch: who admits its frames.
pub(crate) struct Admission<'a> {
    /// The scheduler that granted the batch.
    pub sched: &'a mut Scheduler,
    /// The batch.
    pub granted: &'a Granted,
}

/// What the pipeline borrows for one batch.
pub(crate) struct Parts<'a> {
    /// Every port.
    pub ports: &'a mut PortTable,
    /// Where addresses were learnt.
    pub macs: &'a mut MacTable,
    /// The uplink capacity.
    pub shaper: &'a mut UplinkShaper,
}

/// Buffers of the batch in flight.
pub(crate) struct Pipeline {
    /// Receive buffers.
    batch: Batch,
    /// Per frame of `batch`: the bytes it puts on the wire (set once validated).
    wire_bytes: [u64; BATCH_FRAMES],
    /// Per slot: indices into `batch` to send there (≤ BATCH_FRAMES each).
    out: Vec<Vec<u8>>,
    /// Slots with a non-empty `out` list in the current batch.
    touched: Vec<usize>,
    /// xorshift64 state for ECN marking decisions (seeded: runs are reproducible).
    rng: u64,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline {
            batch: Batch::new(),
            wire_bytes: [0; BATCH_FRAMES],
            out: Vec::new(),
            touched: Vec::with_capacity(64),
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }
}

impl Pipeline {
    /// Reads up to `want` frames of `entry` into the batch; a read error is counted and the
    /// port retried later, frames read before it are kept. Returns the frames read; a short
    /// read clears the port's ready flag.
    pub fn read(&mut self, entry: &mut PortEntry, want: usize) -> usize {
        self.batch.clear();
        let got = match entry.port.recv_batch(&mut self.batch, want) {
            Ok(n) => n,
            Err(_) => {
                entry.c.rx_errors += 1;
                entry.rx_failed = true;
                self.batch.len()
            }
        };
        if got < want {
            entry.ready = false;
        }
        got
    }

    /// Switches every frame of the batch read from slot `src`, then sends. `admission` is the
    /// engine's grant for a vif batch (`None` for the uplink). Returns the frames and on-wire
    /// bytes ([`frame::wire_bytes`]) admitted.
    pub fn forward(
        &mut self,
        parts: Parts<'_>,
        src: usize,
        mut admission: Option<Admission<'_>>,
        now: u64,
    ) -> (u32, u64) {
        let Parts {
            ports,
            macs,
            shaper,
        } = parts;
        if self.out.len() < ports.slot_count() {
            self.out
                .resize_with(ports.slot_count(), || Vec::with_capacity(BATCH_FRAMES));
        }
        let mut packets = 0u32;
        let mut bytes = 0u64;
        for i in 0..self.batch.len() {
            let Some(s) = ports.get_mut(src) else {
                break;
            };
            let Some(wire) = self.validate(s, i) else {
                continue;
            };
            let f = self.batch.frame(i);
            let dst_mac = mac_key(&f[VNET_HDR_LEN..]);
            let src_mac = mac_key(&f[VNET_HDR_LEN + 6..]);
            if !Self::anti_spoof(s, src_mac) {
                continue;
            }
            if let Some(a) = admission.as_mut() {
                if !self.admit(s, a, i, wire, now) {
                    continue;
                }
            }
            let Some(dest) = Self::learn_and_lookup(s, macs, src, src_mac, dst_mac, now) else {
                self.flood(ports, src, i);
                packets += 1;
                bytes += wire;
                continue;
            };
            if dest == src {
                s.c.drops.hairpin += 1;
                continue;
            }
            if self.unicast(ports, i, dest, src, wire, now) {
                packets += 1;
                bytes += wire;
            }
        }
        self.flush(ports, shaper, now);
        (packets, bytes)
    }

    /// Checks frame `i` ([`frame::validate`]); counts it and returns its on-wire bytes, or
    /// counts the drop reason.
    fn validate(&mut self, s: &mut PortEntry, i: usize) -> Option<u64> {
        let f = self.batch.frame(i);
        let eth_len = f.len().saturating_sub(VNET_HDR_LEN) as u64;
        s.c.rx_frames += 1;
        let checked = frame::validate(f).map(|h| frame::wire_bytes(f, &h));
        // Valid frames count (and are charged) as the bytes they put on the wire.
        s.c.rx_bytes += *checked.as_ref().unwrap_or(&eth_len);
        match checked {
            Ok(wire) => {
                self.wire_bytes[i] = wire;
                // Smooth the frame size (1/8 weight), used only to size capacity-limited reads.
                s.avg_frame_bytes = (s.avg_frame_bytes * 7 + wire) / 8;
                Some(wire)
            }
            Err(FrameError::Truncated) => {
                s.c.drops.truncated += 1;
                None
            }
            Err(FrameError::Oversized) => {
                s.c.drops.oversized += 1;
                None
            }
            Err(FrameError::BadVnetHdr(_)) => {
                s.c.drops.bad_vnet_hdr += 1;
                None
            }
        }
    }

    /// A group source address, or one outside the port's allow-list, is `spoofed`.
    #[inline]
    fn anti_spoof(s: &mut PortEntry, src_mac: MacKey) -> bool {
        let allowed = s
            .allowed
            .as_ref()
            .map_or(true, |a| a.binary_search(&src_mac).is_ok());
        if !allowed || is_group(src_mac) {
            s.c.drops.spoofed += 1;
            return false;
        }
        true
    }

    /// The engine's verdict on frame `i` of a vif batch: dropped (`policed`), forwarded, or
    /// forwarded with CE set.
    fn admit(
        &mut self,
        s: &mut PortEntry,
        a: &mut Admission<'_>,
        i: usize,
        wire: u64,
        now: u64,
    ) -> bool {
        // wire < 2^26 (see frame::wire_bytes): fits u32.
        match a.sched.admit(a.granted, wire as u32, now) {
            Verdict::Forward => true,
            Verdict::Drop => {
                s.c.drops.policed += 1;
                false
            }
            Verdict::MarkCe => {
                // A GSO frame is marked once: every segment cut from it carries CE.
                if frame::mark_ce(&mut self.batch.frame_mut(i)[VNET_HDR_LEN..]) {
                    s.c.ecn_marked += 1;
                } else {
                    s.c.ecn_not_ect += 1;
                }
                true
            }
        }
    }

    /// Learns where `src_mac` is and returns the slot `dst_mac` was learnt on; `None` for a
    /// group or unknown destination (flooded).
    #[inline]
    fn learn_and_lookup(
        s: &mut PortEntry,
        macs: &mut MacTable,
        src: usize,
        src_mac: MacKey,
        dst_mac: MacKey,
        now: u64,
    ) -> Option<usize> {
        if !macs.learn(src_mac, src as u16, now) {
            s.c.mac_learn_refused += 1;
        }
        if is_group(dst_mac) {
            return None;
        }
        macs.lookup(dst_mac, now).map(usize::from)
    }

    #[inline]
    fn push_out(&mut self, d: usize, i: usize) {
        if self.out[d].is_empty() {
            self.touched.push(d);
        }
        self.out[d].push(i as u8);
    }

    /// Queues frame `i` for every port but its source.
    fn flood(&mut self, ports: &PortTable, src: usize, i: usize) {
        for d in 0..ports.slot_count() {
            if d != src && ports.get(d).is_some() {
                self.push_out(d, i);
            }
        }
    }

    /// Queues frame `i` for slot `d`, applying the downlink maximum and ECN marking on
    /// uplink→vif frames; false if it was dropped.
    fn unicast(
        &mut self,
        ports: &mut PortTable,
        i: usize,
        d: usize,
        src: usize,
        wire: u64,
        now: u64,
    ) -> bool {
        let Some(slot) = ports.get_mut(d) else {
            return false;
        };
        if src == 0 {
            if let Some(b) = &mut slot.down_bucket {
                b.refill(now);
                if !b.positive() {
                    slot.c.drops.rate_limited += 1;
                    return false;
                }
                b.consume(wire);
            }
            let mark = slot.ecn_threshold;
            if mark > 0 && (self.next_random() >> 32) < mark {
                if frame::mark_ce(&mut self.batch.frame_mut(i)[VNET_HDR_LEN..]) {
                    slot.c.ecn_marked += 1;
                } else {
                    slot.c.ecn_not_ect += 1;
                }
            }
        }
        self.push_out(d, i);
        true
    }

    /// Sends each output port its frames (one `send_batch` per port), counts what was sent and
    /// what was lost, and charges the uplink's bytes to its shaper.
    fn flush(&mut self, ports: &mut PortTable, shaper: &mut UplinkShaper, now: u64) {
        for k in 0..self.touched.len() {
            let d = self.touched[k];
            let idx = &self.out[d];
            if let Some(slot) = ports.get_mut(d) {
                let sent = slot.port.send_batch(&self.batch, idx).unwrap_or(0);
                let sent_bytes: u64 = idx[..sent]
                    .iter()
                    .map(|&i| self.wire_bytes[usize::from(i)])
                    .sum();
                slot.c.tx_frames += sent as u64;
                slot.c.tx_bytes += sent_bytes;
                slot.c.drops.tx_error += (idx.len() - sent) as u64;
                if d == 0 {
                    shaper.charge(sent_bytes, now);
                }
            }
            self.out[d].clear();
        }
        self.touched.clear();
    }

    #[inline]
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}
