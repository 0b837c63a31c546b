//! The forwarding pipeline of one batch, in the order a frame meets it:
//! [`Pipeline::read`] (port → [`Batch`]) → [`Pipeline::forward`]: per frame
//! [`validate`](Pipeline::validate) → [`anti_spoof`](Pipeline::anti_spoof) (port security
//! and address ownership, which also learns the source) → [`admit`](Pipeline::admit) (the
//! engine's verdict, vif batches only) → [`lookup`](Pipeline::lookup) → per-output queues
//! ([`unicast`](Pipeline::unicast), or for group and unknown destinations
//! [`storm`](Pipeline::storm) control then [`flood`](Pipeline::flood)) →
//! [`flush`](Pipeline::flush) (one `send_batch` per output port, the uplink's bytes charged to
//! its shaper). The caller charges the engine.
//!
//! Every frame going from the uplink to a vif, unicast or a flooded copy, passes that vif's
//! downlink maximum; unicast ones may be CE-marked with the vif's ECN probability (a flooded
//! frame is one buffer shared by all its copies, so its copies are not marked). Frames a vif
//! sends to the uplink alone may be CE-marked with the same probability after admission, so
//! the PID-ECN controller marks the data direction of whatever the vif does (not under
//! `variant = "paper"`, which marks only what a vif receives, as the PID-ECN paper does). Unknown unicast from a vif goes to the
//! uplink only unless the switch is configured to flood it to the vifs too.
//!
//! The pipeline owns only its buffers; it borrows the port table, the MAC table, the
//! scheduler and the uplink shaper for one batch, so each stage touches exactly the parts it
//! needs and no slot is looked up twice per frame.

use vqos_sched::{Granted, Scheduler, Verdict};

use crate::addrs::AddrView;
use crate::downlink::Downlink;
use crate::frame::{self, is_group, mac_key, FrameError, MacKey, VNET_HDR_LEN};
use crate::guard;
use crate::l2::{AddrKey, Learnt};
use crate::port::{Batch, BATCH_FRAMES};
use crate::ports::{PortEntry, PortTable, Security};
use crate::shaper::UplinkShaper;
use crate::stats::DropReason;

/// What [`Pipeline::forward`] did with a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Forwarded {
    /// Frames admitted and switched.
    pub packets: u32,
    /// Their on-wire bytes ([`frame::wire_bytes`]).
    pub bytes: u64,
    /// Frames the sender pays for: every frame read but those the engine refused.
    pub charged_packets: u32,
    /// Their bytes (on the wire; a malformed frame: its length).
    pub charged_bytes: u64,
}

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
    /// Where addresses live (this shard's view of the shared tables).
    pub addrs: &'a mut AddrView,
    /// The uplink capacity.
    pub shaper: &'a mut UplinkShaper,
    /// The scheduled downlink, when on: frames to vifs are queued there.
    pub downlink: Option<&'a mut Downlink>,
    /// Unknown unicast from a vif is flooded to the other vifs too (not only the uplink).
    pub flood_unknown_to_vifs: bool,
    /// PID-ECN marks what a vif sends too, not only what it receives (false under
    /// `variant = "paper"`: the paper marks only traffic into the guest).
    pub mark_sent: bool,
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
    /// Frames of the batch flooded (bit `i`): their buffer is shared by every copy.
    shared: u64,
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
            shared: 0,
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
        let got = match entry.port.lock().recv_batch(&mut self.batch, want) {
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
        entry.backlogged = got >= want;
        got
    }

    /// Switches every frame of the batch read from slot `src`, then sends. `admission` is the
    /// engine's grant for a vif batch (`None` for the uplink). Returns what was admitted and
    /// what the sender is charged ([`Forwarded`]).
    pub fn forward(
        &mut self,
        parts: Parts<'_>,
        src: usize,
        mut admission: Option<Admission<'_>>,
        now: u64,
    ) -> Forwarded {
        let Parts {
            ports,
            addrs,
            shaper,
            mut downlink,
            flood_unknown_to_vifs,
            mark_sent,
        } = parts;
        if self.out.len() < ports.slot_count() {
            self.out
                .resize_with(ports.slot_count(), || Vec::with_capacity(BATCH_FRAMES));
        }
        addrs.begin_batch();
        self.shared = 0;
        let mut packets = 0u32;
        let mut bytes = 0u64;
        let mut policed = (0u32, 0u64);
        let read_before = ports
            .get(src)
            .map_or((0, 0), |s| (s.c.rx_frames, s.c.rx_bytes));
        for i in 0..self.batch.len() {
            let Some(s) = ports.get_mut(src) else {
                break;
            };
            let Some(wire) = self.validate(s, i) else {
                continue;
            };
            let eth = &self.batch.frame(i)[VNET_HDR_LEN..];
            let dst_mac = mac_key(eth);
            let src_mac = mac_key(&eth[6..]);
            if !Self::anti_spoof(s, addrs, src, src_mac, now)
                || !Self::guard(s, addrs, src, eth, dst_mac, src_mac, now)
            {
                continue;
            }
            let dst = Self::lookup(addrs, dst_mac, now);
            if let Some(a) = admission.as_mut() {
                let Some(marked) = self.admit(s, a, i, wire, now) else {
                    policed = (policed.0 + 1, policed.1 + wire);
                    continue;
                };
                // PID-ECN on the data a vif sends: what goes to the uplink alone (unicast,
                // or unknown unicast that is not flooded to the vifs) may be CE-marked with
                // the vif's probability, unless the engine marked it already.
                let to_uplink_only = match dst {
                    Some(d) => d == 0,
                    None => !is_group(dst_mac) && !flood_unknown_to_vifs,
                };
                if !marked && to_uplink_only && mark_sent {
                    self.mark_with(s, i);
                }
            }
            match dst {
                Some(d) if d == src => {
                    s.c.drops[DropReason::Hairpin] += 1;
                    continue;
                }
                Some(d) => {
                    if !self.unicast(ports, downlink.as_deref_mut(), i, d, src, wire, now) {
                        continue;
                    }
                }
                None => {
                    if !Self::storm(s, now) {
                        continue;
                    }
                    let to_vifs = src == 0 || is_group(dst_mac) || flood_unknown_to_vifs;
                    self.flood(ports, downlink.as_deref_mut(), src, i, wire, to_vifs, now);
                }
            }
            packets += 1;
            bytes += wire;
        }
        self.flush(ports, shaper, downlink, now);
        // Everything read costs its sender but what the engine itself refused (a policer's
        // drop is its own decision, already metered): malformed, spoofed, guarded, hairpin
        // and storm frames are paid for, so a capped tenant cannot buy the core with frames
        // the switch throws away.
        let read = ports
            .get(src)
            .map_or((0, 0), |s| (s.c.rx_frames, s.c.rx_bytes));
        Forwarded {
            packets,
            bytes,
            charged_packets: ((read.0 - read_before.0) as u32).saturating_sub(policed.0),
            charged_bytes: (read.1 - read_before.1).saturating_sub(policed.1),
        }
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
        let reason = match checked {
            Ok(wire) => {
                self.wire_bytes[i] = wire;
                // Smooth the frame size (1/8 weight), used only to size capacity-limited reads.
                s.avg_frame_bytes = (s.avg_frame_bytes * 7 + wire) / 8;
                return Some(wire);
            }
            Err(FrameError::Truncated) => DropReason::Truncated,
            Err(FrameError::Oversized) => DropReason::Oversized,
            Err(FrameError::BadVnetHdr(_)) => DropReason::BadVnetHdr,
        };
        s.c.drops[reason] += 1;
        None
    }

    /// May port `src` send from `src_mac`? Not from a group address, not from one outside its
    /// configured list or beyond its learning lock (a new address within the lock is pinned to
    /// it), and never from one that lives on another port. Learns the address; counts
    /// `spoofed` when refused. The shard's cache answers most frames ([`crate::addrs`]); the
    /// shared tables decide the rest.
    fn anti_spoof(
        s: &mut PortEntry,
        addrs: &mut AddrView,
        src: usize,
        src_mac: MacKey,
        now: u64,
    ) -> bool {
        let slot = src as u16;
        if !is_group(src_mac) {
            match addrs.cached_owner(src_mac, now) {
                Some(owner) if owner == slot => return true,
                Some(_) => {}
                None => {
                    let mut t = addrs.lock();
                    let claimed = Self::claim(&mut s.security, src_mac, |max| {
                        t.claim(AddrKey::Mac(src_mac), slot, max, now)
                    });
                    let learnt = claimed.then(|| t.macs.learn(src_mac, slot, now));
                    if learnt == Some(Learnt::Inherited) {
                        // The port's first frame from an address handed over to it.
                        t.complete_handover(slot);
                    }
                    let found = t.macs.lookup_until(src_mac, now);
                    drop(t);
                    match learnt {
                        // Learning never takes (only an assignment does).
                        Some(Learnt::Yes | Learnt::Taken(_) | Learnt::Inherited) => {
                            addrs.remember(src_mac, found, now);
                            return true;
                        }
                        Some(Learnt::Full) => {
                            s.c.mac_learn_refused += 1;
                            return true;
                        }
                        Some(Learnt::Owned(_)) => addrs.remember(src_mac, found, now),
                        None => {}
                    }
                }
            }
        }
        s.c.drops[DropReason::Spoofed] += 1;
        false
    }

    /// May a port under `security` claim `addr`? Yes if configured for it or already locked
    /// to it, or (learning) if its lock has room and `pin` (the shared tables' first-come
    /// claim, [`crate::l2::Addresses::claim`], given the lock's size) says yes, the address
    /// then joining the lock. One rule for MACs and IP addresses; the tables are asked only
    /// for an address the port's own lists cannot answer (for a port read on several shards
    /// the lists are a cache, and the tables count the whole port's locks).
    #[inline]
    fn claim<K: PartialEq + Ord + Copy>(
        security: &mut Security<K>,
        addr: K,
        pin: impl FnOnce(usize) -> bool,
    ) -> bool {
        match security {
            Security::Any => true,
            Security::Fixed(list) => list.binary_search(&addr).is_ok(),
            Security::Learn { max, locked } => {
                locked.contains(&addr)
                    || (locked.len() < *max && pin(*max) && {
                        locked.push(addr);
                        true
                    })
            }
        }
    }

    /// The guards above layer 2 ([`guard`]) on a frame from slot `src`: reserved multicast
    /// from any port; for a guarded vif, tags, the services it may offer and every address
    /// the frame claims. The uplink's announced on-link addresses are recorded as the
    /// network's. Counts the refusal's reason.
    fn guard(
        s: &mut PortEntry,
        addrs: &mut AddrView,
        src: usize,
        eth: &[u8],
        dst_mac: MacKey,
        src_mac: MacKey,
        now: u64,
    ) -> bool {
        if let Some(reason) = guard::l2_refusal(eth, dst_mac, s.guard.is_some()) {
            s.c.drops[reason] += 1;
            return false;
        }
        let Some(g) = &mut s.guard else {
            if src == 0 {
                if let Some(ip) = guard::announced(eth) {
                    // A vif's locked address stays the vif's: the result is not needed.
                    let _ = addrs.lock().ips.learn(ip, 0, now);
                }
            }
            return true;
        };
        let refused = match guard::inspect(eth, src_mac, g.services) {
            Err(reason) => Some(reason),
            Ok(claims) => claims
                .iter()
                .find(|&(ip, _)| {
                    guard::is_group_ip(ip)
                        || !Self::claim(g.family(ip), ip, |max| {
                            addrs.lock().claim(AddrKey::Ip(ip), src as u16, max, now)
                        })
                })
                .map(|(_, reason)| reason),
        };
        match refused {
            None => true,
            Some(reason) => {
                s.c.drops[reason] += 1;
                false
            }
        }
    }

    /// The engine's verdict on frame `i` of a vif batch: dropped (`policed`, `None`),
    /// forwarded (`Some(false)`), or forwarded with CE set (`Some(true)`).
    fn admit(
        &mut self,
        s: &mut PortEntry,
        a: &mut Admission<'_>,
        i: usize,
        wire: u64,
        now: u64,
    ) -> Option<bool> {
        // wire < 2^26 (see frame::wire_bytes): fits u32.
        match a.sched.admit(a.granted, wire as u32, now) {
            Verdict::Forward => Some(false),
            Verdict::Drop => {
                s.c.drops[DropReason::Policed] += 1;
                None
            }
            Verdict::MarkCe => {
                self.mark(s, i);
                Some(true)
            }
        }
    }

    /// Sets CE on frame `i` and counts it on `s` (`ecn_marked`, or `ecn_not_ect` when the
    /// frame is not ECT). A GSO frame is marked once: every segment cut from it carries CE.
    fn mark(&mut self, s: &mut PortEntry, i: usize) {
        if frame::mark_ce(&mut self.batch.frame_mut(i)[VNET_HDR_LEN..]) {
            s.c.ecn_marked += 1;
        } else {
            s.c.ecn_not_ect += 1;
        }
    }

    /// Marks frame `i` with the probability `s` was given (PID-ECN), counted on `s`; no draw
    /// when the probability is 0.
    #[inline]
    fn mark_with(&mut self, s: &mut PortEntry, i: usize) {
        let threshold = s.ecn_threshold;
        if threshold > 0 && (self.next_random() >> 32) < threshold {
            self.mark(s, i);
        }
    }

    /// The slot `dst_mac` lives on; `None` for a group or unknown destination.
    #[inline]
    fn lookup(addrs: &mut AddrView, dst_mac: MacKey, now: u64) -> Option<usize> {
        if is_group(dst_mac) {
            return None;
        }
        addrs.lookup(dst_mac, now).map(usize::from)
    }

    /// Storm control on the source port: a frame to be flooded takes one token; none left →
    /// `storm`.
    #[inline]
    fn storm(s: &mut PortEntry, now: u64) -> bool {
        let Some(b) = &mut s.storm else {
            return true;
        };
        b.refill(now);
        if b.positive() {
            b.consume(1);
            true
        } else {
            s.c.drops[DropReason::Storm] += 1;
            false
        }
    }

    #[inline]
    fn push_out(&mut self, d: usize, i: usize) {
        if self.out[d].is_empty() {
            self.touched.push(d);
        }
        self.out[d].push(i as u8);
    }

    /// Queues frame `i` for every port but its source (only the uplink unless `to_vifs`).
    /// Under the scheduled downlink each vif's copy joins its queue; otherwise copies from
    /// the uplink pass each receiving vif's downlink maximum.
    #[allow(clippy::too_many_arguments)]
    fn flood(
        &mut self,
        ports: &mut PortTable,
        mut downlink: Option<&mut Downlink>,
        src: usize,
        i: usize,
        wire: u64,
        to_vifs: bool,
        now: u64,
    ) {
        for d in 0..ports.slot_count() {
            if d == src || (d != 0 && !to_vifs) {
                continue;
            }
            let Some(slot) = ports.get_mut(d) else {
                continue;
            };
            if d != 0 {
                if let (Some(dl), Some(v)) = (downlink.as_deref_mut(), slot.global_vif) {
                    if dl.open() || !self.out[d].is_empty() {
                        // Cut through at the flush, or queued there behind this batch's
                        // earlier frames for the vif.
                        self.shared |= 1 << i;
                        self.push_out(d, i);
                    } else {
                        let r = dl.enqueue(v, &mut self.batch, i, wire, false, now);
                        crate::downlink::counted(r, slot);
                    }
                    continue;
                }
            }
            if src == 0 && !Self::downlink_allows(slot, wire, now) {
                continue;
            }
            self.push_out(d, i);
        }
    }

    /// The receiving vif's maximum on the uplink→vif direction: false (counted
    /// `rate_limited`) when its bucket is empty.
    #[inline]
    fn downlink_allows(slot: &mut PortEntry, wire: u64, now: u64) -> bool {
        if let Some(b) = &mut slot.down_bucket {
            b.refill(now);
            if !b.positive() {
                slot.c.drops[DropReason::RateLimited] += 1;
                return false;
            }
            b.consume(wire);
        }
        true
    }

    /// Queues frame `i` for slot `d`, ECN-marking uplink→vif frames with the vif's
    /// probability: a vif's frames join its downlink queue when the downlink is scheduled,
    /// else uplink→vif frames pass the vif's downlink maximum first. False if it was dropped.
    #[allow(clippy::too_many_arguments)]
    fn unicast(
        &mut self,
        ports: &mut PortTable,
        downlink: Option<&mut Downlink>,
        i: usize,
        d: usize,
        src: usize,
        wire: u64,
        now: u64,
    ) -> bool {
        let Some(slot) = ports.get_mut(d) else {
            return false;
        };
        let queue = downlink.zip(slot.global_vif).filter(|_| d != 0);
        if src == 0 {
            if queue.is_none() && !Self::downlink_allows(slot, wire, now) {
                return false;
            }
            self.mark_with(slot, i);
        }
        if let Some((dl, v)) = queue {
            if dl.open() || !self.out[d].is_empty() {
                // Cut through at the flush ([`Downlink::cut_through`]).
                self.push_out(d, i);
                return true;
            }
            // The frame goes nowhere else: a large one's buffer is taken, not copied.
            let r = dl.enqueue(v, &mut self.batch, i, wire, true, now);
            return crate::downlink::counted(r, slot);
        }
        self.push_out(d, i);
        true
    }

    /// Sends each output port its frames (one `send_batch` per port), counts what was sent and
    /// what was lost, and charges the uplink's bytes to its shaper; a vif's frames under the
    /// scheduled downlink are cut through or queued ([`Downlink::cut_through`]).
    fn flush(
        &mut self,
        ports: &mut PortTable,
        shaper: &mut UplinkShaper,
        mut downlink: Option<&mut Downlink>,
        now: u64,
    ) {
        for k in 0..self.touched.len() {
            let d = self.touched[k];
            let idx = &self.out[d];
            let Some(slot) = ports.get_mut(d) else {
                self.out[d].clear();
                continue;
            };
            let scheduled = downlink
                .as_deref_mut()
                .zip(slot.global_vif)
                .filter(|_| d != 0);
            if let Some((dl, v)) = scheduled {
                let f = crate::downlink::ForVif {
                    batch: &mut self.batch,
                    idx,
                    wire: &self.wire_bytes,
                    shared: self.shared,
                };
                dl.cut_through(v, slot, f, now);
            } else {
                let sent = slot.port.lock().send_batch(&self.batch, idx).unwrap_or(0);
                let sent_bytes: u64 = idx[..sent]
                    .iter()
                    .map(|&i| self.wire_bytes[usize::from(i)])
                    .sum();
                slot.c.tx_frames += sent as u64;
                slot.c.tx_bytes += sent_bytes;
                slot.c.drops[DropReason::TxError] += (idx.len() - sent) as u64;
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
