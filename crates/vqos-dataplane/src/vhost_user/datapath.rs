//! Moving frames between a [`Batch`] and the guest's rings, run by the poll loop.
//!
//! ## Behavior
//! - **Guest TX** (`recv`): up to `max_frames` chains are taken from the avail ring, each
//!   validated whole ([`RingLayout::walk`]) and copied into the batch's next free slot, then
//!   returned to the used ring (length 0: the device wrote nothing). A 10-byte legacy header
//!   is widened to the data plane's 12 bytes. What the loop does not take stays in the avail
//!   ring: that is the back-pressure, the port holds no frame of its own.
//! - **Guest RX** (`send`): each frame needs enough receive chains for its bytes: one chain,
//!   or with `MRG_RXBUF` as many as needed (`num_buffers` in the header says how many). When
//!   the guest has not posted enough, the chains taken for that frame are put back and this
//!   frame and the rest of the batch are lost (`guest_rx_no_buffers_frames`): a guest that
//!   stops consuming costs the switch nothing but the count.
//! - A malformed chain is returned to the used ring with length 0 where its head allows it,
//!   counted by kind, and the next one is tried; a broken ring (avail index too far ahead,
//!   ring outside guest memory) or too many malformed chains in one session quarantines the
//!   session.
//! - Notifications: the guest's kicks on its TX queue are disabled while the loop keeps
//!   finding full batches, and re-enabled when it drains the ring (if frames slipped in
//!   meanwhile, the port signals its own readiness so the loop comes back). Kicks on the
//!   receive queue stay disabled for the whole session (the port never waits for receive
//!   buffers). Interrupts to the guest go once per batch, and with `EVENT_IDX` only when the
//!   guest's `used_event` asks for one.

use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::backend::{Health, Shared, RX_QUEUE, TX_QUEUE};
use super::chain::{gather, RingError, RingLayout, Segment};
use super::counters::bump;
use super::features::{guest_accepts, guest_hdr_len, F_MRG_RXBUF};
use crate::frame::{VnetHdr, MAX_FRAME_BYTES, VNET_HDR_LEN};
use crate::port::{Batch, PortIoCounters};

/// Most guest buffers one received frame may take (Linux's vhost-net has the same bound,
/// `UIO_MAXIOV`): a guest posting 1-byte buffers cannot make one frame cost 64 K descriptor
/// reads and copies. A frame that would need more is lost as `guest_rx_buffer_too_small_frames`.
const MAX_FRAME_SEGS: usize = 1024;

/// One guest receive chain gathered for a frame.
#[derive(Debug, Clone, Copy)]
struct RxChain {
    /// Head descriptor index (for the used ring).
    head: u16,
    /// First of its segments in [`DataPath::rx_segs`].
    first: usize,
    /// Number of its segments.
    count: usize,
}

/// Why a frame could not be written to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxShortage {
    /// Not enough chains posted.
    NoBuffers,
    /// One chain, too small, and no `MRG_RXBUF`; or more than [`MAX_FRAME_SEGS`] buffers.
    TooSmall,
    /// The ring broke (quarantined).
    Ring,
}

/// Scratch space of the data path, allocated once per port.
#[derive(Debug, Default)]
pub(crate) struct DataPath {
    /// Segments of the chain being walked.
    segs: Vec<Segment>,
    /// Segments of every receive chain gathered for the current frame.
    rx_segs: Vec<Segment>,
    /// Receive chains gathered for the current frame.
    chains: Vec<RxChain>,
}

/// The ring layout of a queue.
fn layout(q: &virtio_queue::Queue) -> RingLayout {
    RingLayout {
        desc_table: GuestAddress(q.desc_table()),
        avail_ring: GuestAddress(q.avail_ring()),
        size: q.size(),
    }
}

/// Whether the guest wants an interrupt for the used entries added since the last call:
/// `used_event` with `EVENT_IDX`, else the avail ring's `NO_INTERRUPT` flag.
fn interrupt_due(q: &mut virtio_queue::Queue, mem: &GuestMemoryMmap, ring: &RingLayout) -> bool {
    if q.event_idx_enabled() {
        q.needs_notification(mem).unwrap_or(true)
    } else {
        !ring.no_interrupt(mem)
    }
}

/// The vring `index` if the session has it started and enabled.
fn live_vring(vrings: Option<&Vec<VringRwLock>>, index: usize) -> Option<&VringRwLock> {
    let v = vrings?.get(index)?;
    let st = v.get_ref();
    (st.is_enabled() && st.get_queue().ready()).then_some(v)
}

/// Writes `stream[from..from + len]`, where `stream` is `hdr` followed by `payload`, at `addr`.
fn write_stream(
    mem: &GuestMemoryMmap,
    addr: GuestAddress,
    hdr: &[u8],
    payload: &[u8],
    from: usize,
    len: usize,
) -> bool {
    let end = from + len;
    let mut at = addr;
    if from < hdr.len() {
        let h = &hdr[from..end.min(hdr.len())];
        if mem.write_slice(h, at).is_err() {
            return false;
        }
        at = GuestAddress(at.0 + h.len() as u64);
    }
    if end > hdr.len() {
        let p = &payload[from.max(hdr.len()) - hdr.len()..end - hdr.len()];
        if mem.write_slice(p, at).is_err() {
            return false;
        }
    }
    true
}

impl DataPath {
    /// Reads frames the guest transmitted into `batch` (see the module doc).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn recv(
        &mut self,
        shared: &Shared,
        vrings: Option<&Vec<VringRwLock>>,
        mem: &GuestMemoryMmap,
        health: &mut Health,
        features: u64,
        batch: &mut Batch,
        max_frames: usize,
        io: &mut PortIoCounters,
    ) -> usize {
        if health.quarantined {
            return 0;
        }
        let Some(vring) = live_vring(vrings, TX_QUEUE) else {
            return 0;
        };
        let c = &shared.counters;
        let hdr_len = guest_hdr_len(features);
        let widen = VNET_HDR_LEN - hdr_len;
        let max_guest_bytes = (MAX_FRAME_BYTES - widen) as u64;
        let mut st = vring.get_mut();
        let q = st.get_queue_mut();
        let ring = layout(q);
        let pending = match ring.pending(mem, q.next_avail()) {
            Ok(p) => p,
            Err(e) => {
                e.count(c);
                shared.quarantine(health);
                return 0;
            }
        };
        let (mut n, mut taken, mut used) = (0usize, 0u16, 0u32);
        let mut bytes = 0u64;
        let mut broken = false;
        while n < max_frames && taken < pending {
            let Some(slot) = batch.free_slot() else { break };
            let pos = q.next_avail();
            let head = match ring.head(mem, pos) {
                Ok(h) => h,
                Err(e) => {
                    e.count(c);
                    broken = true;
                    break;
                }
            };
            q.set_next_avail(pos.wrapping_add(1));
            taken += 1;
            let len = match ring.walk(mem, head, false, max_guest_bytes, &mut self.segs) {
                Ok(total) if (total as usize) < hdr_len => {
                    bump(&c.short_chain, 1);
                    None
                }
                Ok(total) => {
                    let total = total as usize;
                    if gather(mem, &self.segs, &mut slot[..total]) {
                        if widen > 0 {
                            slot.copy_within(hdr_len..total, VNET_HDR_LEN);
                            slot[hdr_len..VNET_HDR_LEN].fill(0);
                        }
                        Some(total + widen)
                    } else {
                        bump(&c.bad_desc_address, 1);
                        None
                    }
                }
                Err(e) => {
                    e.count(c);
                    None
                }
            };
            match len {
                Some(len) => {
                    batch.commit(len);
                    n += 1;
                    bytes += len as u64;
                }
                None => shared.bad_chain(health),
            }
            if head < ring.size {
                if q.add_used(mem, head, 0).is_err() {
                    RingError::BadRingAddress.count(c);
                    broken = true;
                    break;
                }
                used += 1;
            }
            if health.quarantined {
                break;
            }
        }
        if broken {
            shared.quarantine(health);
        }
        let drained = taken == pending && !broken && !health.quarantined;
        let notify = used > 0 && interrupt_due(q, mem, &ring);
        if drained {
            // Let the guest kick again; if it queued frames since `pending` was read, come
            // back without waiting for a kick that will not come.
            shared.ready.clear();
            if q.enable_notification(mem).unwrap_or(true) {
                shared.ready.signal();
            }
        } else {
            let _ = q.disable_notification(mem);
        }
        if notify && st.signal_used_queue().is_ok() {
            bump(&c.interrupts, 1);
        }
        io.rx_frames += n as u64;
        io.rx_bytes += bytes;
        bump(&shared.io[0], n as u64);
        bump(&shared.io[1], bytes);
        n
    }

    /// Writes the frames of `batch` at `indices` to the guest (see the module doc); returns
    /// how many were written, the first ones of `indices`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        shared: &Shared,
        vrings: Option<&Vec<VringRwLock>>,
        mem: &GuestMemoryMmap,
        health: &mut Health,
        features: u64,
        batch: &Batch,
        indices: &[u8],
        io: &mut PortIoCounters,
    ) -> usize {
        let c = &shared.counters;
        let vring = if health.quarantined {
            None
        } else {
            live_vring(vrings, RX_QUEUE)
        };
        let Some(vring) = vring else {
            bump(&c.disconnected_frames, indices.len() as u64);
            io.tx_errors += indices.len() as u64;
            return 0;
        };
        let hdr_len = guest_hdr_len(features);
        let mergeable = features & F_MRG_RXBUF != 0;
        let mut st = vring.get_mut();
        let q = st.get_queue_mut();
        if !health.rx_kicks_off {
            let _ = q.disable_notification(mem);
            health.rx_kicks_off = true;
        }
        let ring = layout(q);
        let mut left = match ring.pending(mem, q.next_avail()) {
            Ok(p) => p,
            Err(e) => {
                e.count(c);
                shared.quarantine(health);
                bump(&c.disconnected_frames, indices.len() as u64);
                io.tx_errors += indices.len() as u64;
                return 0;
            }
        };
        let (mut sent, mut bytes, mut used) = (0usize, 0u64, 0u32);
        let mut shortage = None;
        'frames: for &i in indices {
            let frame = batch.frame(usize::from(i));
            if frame.len() < VNET_HDR_LEN || !guest_accepts(features, &VnetHdr::parse(frame)) {
                break;
            }
            let payload = &frame[VNET_HDR_LEN..];
            let need = (hdr_len + payload.len()) as u64;
            self.chains.clear();
            self.rx_segs.clear();
            let mut start = q.next_avail();
            let mut cap = 0u64;
            while cap < need {
                if (!mergeable && !self.chains.is_empty()) || self.rx_segs.len() > MAX_FRAME_SEGS {
                    shortage = Some(RxShortage::TooSmall);
                } else if left == 0 {
                    shortage = Some(RxShortage::NoBuffers);
                }
                if shortage.is_some() {
                    q.set_next_avail(start);
                    break 'frames;
                }
                let pos = q.next_avail();
                let head = match ring.head(mem, pos) {
                    Ok(h) => h,
                    Err(e) => {
                        e.count(c);
                        shortage = Some(RxShortage::Ring);
                        break 'frames;
                    }
                };
                q.set_next_avail(pos.wrapping_add(1));
                left -= 1;
                match ring.walk(mem, head, true, u64::MAX, &mut self.segs) {
                    Ok(len) => {
                        self.chains.push(RxChain {
                            head,
                            first: self.rx_segs.len(),
                            count: self.segs.len(),
                        });
                        self.rx_segs.extend_from_slice(&self.segs);
                        cap += len;
                    }
                    Err(e) => {
                        // Give back this chain and those gathered so far for the frame
                        // (empty), and start gathering again after it: the used entries of
                        // one frame stay consecutive and nothing needs rewinding.
                        e.count(c);
                        shared.bad_chain(health);
                        let heads = self.chains.iter().map(|ch| ch.head);
                        for h in heads.chain((head < ring.size).then_some(head)) {
                            if q.add_used(mem, h, 0).is_err() {
                                RingError::BadRingAddress.count(c);
                                shortage = Some(RxShortage::Ring);
                                break 'frames;
                            }
                            used += 1;
                        }
                        if health.quarantined {
                            shortage = Some(RxShortage::Ring);
                            break 'frames;
                        }
                        self.chains.clear();
                        self.rx_segs.clear();
                        cap = 0;
                        start = q.next_avail();
                    }
                }
            }
            // The header as the guest gets it: `num_buffers` set, legacy guests get 10 bytes.
            let mut hdr = [0u8; VNET_HDR_LEN];
            hdr.copy_from_slice(&frame[..VNET_HDR_LEN]);
            let buffers = if mergeable {
                self.chains.len() as u16
            } else {
                1
            };
            hdr[10..12].copy_from_slice(&buffers.to_le_bytes());
            let hdr = &hdr[..hdr_len];
            let mut off = 0usize;
            let total = need as usize;
            for ch in &self.chains {
                let start_off = off;
                for s in &self.rx_segs[ch.first..ch.first + ch.count] {
                    if off == total {
                        break;
                    }
                    let n = (s.len as usize).min(total - off);
                    if !write_stream(mem, s.addr, hdr, payload, off, n) {
                        bump(&c.bad_desc_address, 1);
                        shortage = Some(RxShortage::Ring);
                        break 'frames;
                    }
                    off += n;
                }
                let written = u32::try_from(off - start_off).unwrap_or(u32::MAX);
                if q.add_used(mem, ch.head, written).is_err() {
                    RingError::BadRingAddress.count(c);
                    shortage = Some(RxShortage::Ring);
                    break 'frames;
                }
                used += 1;
            }
            sent += 1;
            bytes += frame.len() as u64;
        }
        let lost = (indices.len() - sent) as u64;
        match shortage {
            Some(RxShortage::NoBuffers) => bump(&c.guest_rx_no_buffers_frames, lost),
            Some(RxShortage::TooSmall) => bump(&c.guest_rx_buffer_too_small_frames, lost),
            Some(RxShortage::Ring) => {
                shared.quarantine(health);
                bump(&c.disconnected_frames, lost);
            }
            // An offload the guest cannot take: the rest of the batch is lost with that frame
            // (the trait's "exactly the first n written").
            None => bump(&c.guest_offload_unsupported_frames, lost),
        }
        if used > 0 && interrupt_due(q, mem, &ring) && st.signal_used_queue().is_ok() {
            bump(&c.interrupts, 1);
        }
        io.tx_frames += sent as u64;
        io.tx_bytes += bytes;
        io.tx_errors += lost;
        bump(&shared.io[2], sent as u64);
        bump(&shared.io[3], bytes);
        sent
    }
}
