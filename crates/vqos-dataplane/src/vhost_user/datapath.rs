//! Moving frames between a [`Batch`] and the guest's rings, run by the poll loop.
//!
//! ## Behavior
//! - **Guest TX** (`recv`): up to `max_frames` chains are taken from the avail ring; each
//!   descriptor is read once and checked ([`walk`]) and its buffer copied straight into the
//!   batch's next free slot (the one copy on this side); the chain is then returned to the used
//!   ring (length 0: the device wrote nothing). A 10-byte legacy header is widened to the data
//!   plane's 12 bytes as it is copied. What the loop does not take stays in the avail ring:
//!   that is the back-pressure, the port holds no frame of its own.
//! - **Guest RX** (`send`): each frame needs enough receive chains for its bytes: one chain,
//!   or with `MRG_RXBUF` as many as needed (`num_buffers` in the header says how many). When
//!   the guest has not posted enough, the chains taken for that frame are put back and this
//!   frame and the rest of the batch are lost (`guest_rx_no_buffers_frames`): a guest that
//!   stops consuming costs the switch nothing but the count.
//! - **Per burst**, not per frame: the rings are resolved once ([`RingView::new`]), the avail
//!   index is read once (acquire), used elements are written as chains complete and published
//!   with one release store of the used index, and the guest is interrupted at most once.
//! - A malformed chain is returned to the used ring with length 0 where its head allows it,
//!   counted by kind, and the next one is tried; a broken ring (avail index too far ahead,
//!   ring outside guest memory) or too many malformed chains in one session quarantines the
//!   session.
//! - **Queue pairs**: `recv` reads every guest TX queue of the session (starting one further
//!   each call, so no queue waits behind a busy one); `send` writes to the RX queue of the
//!   pair it is given, or of pair 0 when the guest has not enabled that pair (a Linux guest
//!   enables as many pairs as it has vCPUs, up to what the device offers).
//! - Notifications: the guest's kicks on a TX queue are disabled while the loop keeps
//!   finding full batches, and re-enabled when it drains the ring (if frames slipped in
//!   meanwhile, the port signals its own readiness so the loop comes back). The port's
//!   readiness is cleared once per call, before the first queue's kicks are re-enabled, so a
//!   kick on any queue after that wakes the loop again; under busy
//!   polling ([`DataPath::busy_poll`]) they stay disabled: the loop comes back anyway. Kicks
//!   on the receive queue stay disabled for the whole session (the port never waits for
//!   receive buffers). Interrupts to the guest go once per burst, and with `EVENT_IDX` only
//!   when the guest's `used_event` asks for one.

use std::sync::RwLockWriteGuard;

use vhost_user_backend::{VringRwLock, VringState, VringT};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::backend::{rx_queue, tx_queue, Health, Shared, RX_QUEUE};
use super::chain::{walk, Segment};
use super::counters::{bump, AtomicCounters};
use super::dirty::{DirtyLog, LogCache};
use super::features::{guest_accepts, guest_hdr_len, F_MRG_RXBUF};
use super::guest::{GuestView, RingError, RingView, Slice};
use crate::frame::{VnetHdr, MAX_FRAME_BYTES, VNET_HDR_LEN};
use crate::port::{Batch, PortIoCounters};
use crate::sys::EventFd;

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

/// Scratch space and mode of the data path, allocated once per port (the vectors grow to
/// their largest need once, then are reused: nothing is allocated per frame or per burst).
#[derive(Debug, Default)]
pub(crate) struct DataPath {
    /// Segments of every receive chain gathered for the current frame.
    rx_segs: Vec<Segment>,
    /// Receive chains gathered for the current frame.
    chains: Vec<RxChain>,
    /// The loop polls the port without waiting for its readiness (busy polling): the guest's
    /// TX kicks are never re-enabled.
    pub(crate) busy_poll: bool,
    /// The pair whose TX queue the next `recv` reads first.
    next_pair: usize,
    /// The dirty log's marks of the current batch (a live migration).
    log_cache: LogCache,
}

/// What one batch of a port works on: the session's state, read once per batch.
pub(crate) struct Ctx<'a> {
    /// The port's shared state.
    pub(crate) shared: &'a Shared,
    /// The session's vrings (`None`: no session).
    pub(crate) vrings: Option<&'a [VringRwLock]>,
    /// The guest memory snapshot.
    pub(crate) mem: &'a GuestMemoryMmap,
    /// The session's health.
    pub(crate) health: &'a Health,
    /// The virtio features the frontend acknowledged.
    pub(crate) features: u64,
    /// The dirty log, while the frontend has `LOG_ALL` acknowledged (a live migration):
    /// every write into guest memory is marked in it.
    pub(crate) log: Option<&'a DirtyLog>,
}

/// Marks the used ring of `q` dirty (its index, entries and `avail_event`: 6 + 8 × size
/// bytes), after a batch that may have written it, and writes out the batch's other marks
/// (`cache`). The whole ring rather than each entry: a page or two per batch, and marking too
/// much only makes QEMU copy a page again.
fn log_used_ring(log: Option<&DirtyLog>, cache: &mut LogCache, q: &Queue) {
    if let Some(log) = log {
        cache.mark(log, q.used_ring(), 6 + 8 * u64::from(q.size()));
        cache.flush(log);
    }
}

/// Readiness bookkeeping over one `recv` call.
#[derive(Debug)]
struct Wake<'a> {
    /// The readiness eventfd of the queues read (the port's, or a lent pair's).
    ready: &'a EventFd,
    /// The readiness eventfd was cleared in this call.
    cleared: bool,
    /// A queue still has frames (or was not read): the loop must come back.
    again: bool,
}

/// The write-locked state of vring `index`, if the session has it started and enabled.
fn live_vring(
    vrings: Option<&[VringRwLock]>,
    index: usize,
) -> Option<RwLockWriteGuard<'_, VringState>> {
    let st = vrings?.get(index)?.get_mut();
    (st.is_enabled() && st.get_queue().ready()).then_some(st)
}

/// Resolves the rings of `q` and counts the chains the guest has made available since the
/// queue's `next_avail` (one acquire load of the avail index).
fn open_ring<'m>(view: &mut GuestView<'m>, q: &Queue) -> Result<(RingView<'m>, u16), RingError> {
    let ring = RingView::new(view, q)?;
    let pending = ring.pending(q.next_avail())?;
    Ok((ring, pending))
}

/// Ends a burst that wrote `used` used elements before `next_used`: one release store of the
/// used index, and the queue's own copy moves with it (also when the store failed: the
/// session is quarantined then). `Ok(true)` when something was published.
fn publish(
    ring: &RingView<'_>,
    q: &mut Queue,
    next_used: u16,
    used: u16,
) -> Result<bool, RingError> {
    if used == 0 {
        return Ok(false);
    }
    let stored = ring.publish_used(next_used);
    q.set_next_used(next_used);
    stored.map(|()| true)
}

/// Interrupts the guest once for the used elements `first_used..next_used` just published,
/// if it wants one ([`RingView::interrupt_due`]).
fn interrupt(
    ring: &RingView<'_>,
    st: &VringState,
    event_idx: bool,
    first_used: u16,
    next_used: u16,
    c: &AtomicCounters,
) {
    if ring.interrupt_due(event_idx, first_used, next_used) && st.signal_used_queue().is_ok() {
        bump(&c.interrupts, 1);
    }
}

/// Copies `src` to `slot[at..]`; false when it does not fit.
#[inline]
fn copy_in(slot: &mut [u8], at: usize, src: &Slice<'_>) -> bool {
    let Some(end) = at.checked_add(src.len()) else {
        return false;
    };
    match slot.get_mut(at..end) {
        Some(dst) => src.copy_to(dst) == src.len(),
        None => false,
    }
}

/// Copies `src`, the bytes of a guest TX chain from offset `off`, into `slot`, leaving `widen`
/// bytes after the guest's `hdr_len`-byte header (a legacy header widened to 12 bytes).
#[inline]
fn place(slot: &mut [u8], off: u64, src: Slice<'_>, hdr_len: usize, widen: usize) -> bool {
    let Ok(off) = usize::try_from(off) else {
        return false;
    };
    if off >= hdr_len {
        return copy_in(slot, off + widen, &src);
    }
    if widen == 0 || off + src.len() <= hdr_len {
        return copy_in(slot, off, &src);
    }
    let k = hdr_len - off;
    match (src.subslice(0, k), src.offset(k)) {
        (Ok(h), Ok(rest)) => copy_in(slot, off, &h) && copy_in(slot, hdr_len + widen, &rest),
        _ => false,
    }
}

/// Writes `stream[from..from + dst.len()]` into `dst`, where `stream` is `hdr` then `payload`.
fn write_stream(dst: &Slice<'_>, hdr: &[u8], payload: &[u8], from: usize) -> bool {
    let end = from + dst.len();
    let mut at = 0;
    if from < hdr.len() {
        let Some(h) = hdr.get(from..end.min(hdr.len())) else {
            return false;
        };
        let Ok(d) = dst.subslice(0, h.len()) else {
            return false;
        };
        d.copy_from(h);
        at = h.len();
    }
    if end > hdr.len() {
        let Some(p) = payload.get(from.max(hdr.len()) - hdr.len()..end - hdr.len()) else {
            return false;
        };
        let Ok(d) = dst.subslice(at, p.len()) else {
            return false;
        };
        d.copy_from(p);
    }
    true
}

impl DataPath {
    /// Reads frames the guest transmitted on the TX queues of its first `pairs` queue pairs,
    /// those of `mine` (a bit per pair: the pairs this port object reads), into `batch` (see
    /// the module doc); `ready` is their readiness eventfd.
    #[allow(clippy::too_many_arguments)] // one call per batch; a struct would only rename them
    pub(crate) fn recv(
        &mut self,
        cx: &Ctx<'_>,
        (pairs, mine): (usize, u64),
        ready: &EventFd,
        batch: &mut Batch,
        max_frames: usize,
        io: &mut PortIoCounters,
    ) -> usize {
        let pairs = pairs.max(1);
        let first = self.next_pair % pairs;
        self.next_pair = first + 1;
        let mut wake = Wake {
            ready,
            cleared: false,
            again: false,
        };
        let (mut n, mut bytes) = (0, 0);
        for k in 0..pairs {
            if n >= max_frames || batch.is_full() {
                wake.again = true;
                break;
            }
            let pair = (first + k) % pairs;
            if pair >= 64 || mine & (1 << pair) == 0 {
                continue;
            }
            let (got, got_bytes) = self.recv_queue(cx, pair, batch, max_frames - n, &mut wake);
            n += got;
            bytes += got_bytes;
            if let Some(f) = cx.shared.pair_frames.get(pair) {
                bump(&f[0], got as u64);
            }
        }
        if wake.cleared && wake.again {
            ready.signal();
        }
        io.rx_frames += n as u64;
        io.rx_bytes += bytes;
        bump(&cx.shared.io[0], n as u64);
        bump(&cx.shared.io[1], bytes);
        n
    }

    /// Reads up to `max_frames` frames from the TX queue of `pair` into `batch`: frames and
    /// bytes read.
    fn recv_queue(
        &mut self,
        cx: &Ctx<'_>,
        pair: usize,
        batch: &mut Batch,
        max_frames: usize,
        wake: &mut Wake<'_>,
    ) -> (usize, u64) {
        let (shared, mem, health, features) = (cx.shared, cx.mem, cx.health, cx.features);
        if health.is_quarantined() {
            return (0, 0);
        }
        let Some(mut st) = live_vring(cx.vrings, tx_queue(pair)) else {
            return (0, 0);
        };
        let c = &shared.counters;
        let hdr_len = guest_hdr_len(features);
        let widen = VNET_HDR_LEN - hdr_len;
        let max_guest_bytes = (MAX_FRAME_BYTES - widen) as u64;
        let q = st.get_queue_mut();
        let mut view = GuestView::new(mem);
        let resolved = open_ring(&mut view, q);
        let (ring, pending) = match resolved {
            Ok(rp) => rp,
            Err(e) => {
                e.count(c);
                shared.quarantine(health);
                return (0, 0);
            }
        };
        let first_used = q.next_used();
        let mut pos = q.next_avail();
        let (mut n, mut taken, mut used) = (0usize, 0u16, 0u16);
        let mut bytes = 0u64;
        let mut broken = false;
        while n < max_frames && taken < pending {
            let Some(slot) = batch.free_slot() else { break };
            let head = match ring.head(pos) {
                Ok(h) => h,
                Err(e) => {
                    e.count(c);
                    broken = true;
                    break;
                }
            };
            pos = pos.wrapping_add(1);
            taken += 1;
            let walked = walk(
                &ring,
                &mut view,
                head,
                false,
                max_guest_bytes,
                |off, _, s| place(slot, off, s, hdr_len, widen),
            );
            let len = match walked {
                Ok(total) if (total as usize) < hdr_len => {
                    bump(&c.short_chain, 1);
                    None
                }
                Ok(total) => {
                    slot[hdr_len..VNET_HDR_LEN].fill(0);
                    Some(total as usize + widen)
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
                if let Err(e) = ring.put_used(first_used.wrapping_add(used), head, 0) {
                    e.count(c);
                    broken = true;
                    break;
                }
                used += 1;
            }
            if health.is_quarantined() {
                break;
            }
        }
        q.set_next_avail(pos);
        let next_used = first_used.wrapping_add(used);
        let published = publish(&ring, q, next_used, used).unwrap_or_else(|e| {
            e.count(c);
            broken = true;
            false
        });
        if broken {
            shared.quarantine(health);
        }
        let event_idx = q.event_idx_enabled();
        if taken < pending {
            wake.again = true;
        }
        // Marked after the writes below too (notifications change `avail_event`): see the
        // end of this function.
        if health.is_quarantined() {
            // Nothing more is written to a quarantined session's rings.
        } else if taken == pending && !self.busy_poll {
            // Let the guest kick again; if it queued frames since `pending` was read, come
            // back without waiting for a kick that will not come. The readiness is cleared
            // before the first queue's kicks are re-enabled, never after (a kick in between
            // would be lost).
            if !wake.cleared {
                wake.ready.clear();
                wake.cleared = true;
            }
            if q.enable_notification(mem).unwrap_or(true) {
                wake.again = true;
            }
        } else if !event_idx && !ring.kicks_off() {
            // (With EVENT_IDX kicks stop by themselves: `avail_event` is not moved.)
            let _ = q.disable_notification(mem);
        }
        log_used_ring(cx.log, &mut self.log_cache, st.get_queue());
        if published {
            interrupt(&ring, &st, event_idx, first_used, next_used, c);
        }
        (n, bytes)
    }

    /// Writes the frames of `batch` at `indices` to the guest on the RX queue of `pair` (of
    /// pair 0 when the guest has not enabled `pair`; see the module doc); returns how many
    /// were written, the first ones of `indices`.
    pub(crate) fn send(
        &mut self,
        cx: &Ctx<'_>,
        pair: usize,
        batch: &Batch,
        indices: &[u8],
        io: &mut PortIoCounters,
    ) -> usize {
        let (shared, mem, health, features) = (cx.shared, cx.mem, cx.health, cx.features);
        let c = &shared.counters;
        let (st, pair) = if health.is_quarantined() {
            (None, 0)
        } else {
            match live_vring(cx.vrings, rx_queue(pair)) {
                Some(st) => (Some(st), pair),
                None => (live_vring(cx.vrings, RX_QUEUE), 0),
            }
        };
        let Some(mut st) = st else {
            bump(&c.disconnected_frames, indices.len() as u64);
            io.tx_errors += indices.len() as u64;
            return 0;
        };
        let hdr_len = guest_hdr_len(features);
        let mergeable = features & F_MRG_RXBUF != 0;
        let q = st.get_queue_mut();
        let event_idx = q.event_idx_enabled();
        let mut view = GuestView::new(mem);
        let resolved = open_ring(&mut view, q);
        let (ring, mut left) = match resolved {
            Ok(rp) => rp,
            Err(e) => {
                e.count(c);
                shared.quarantine(health);
                bump(&c.disconnected_frames, indices.len() as u64);
                io.tx_errors += indices.len() as u64;
                return 0;
            }
        };
        if !event_idx && !ring.kicks_off() {
            let _ = q.disable_notification(mem);
        }
        let first_used = q.next_used();
        let mut pos = q.next_avail();
        let (mut sent, mut bytes, mut used) = (0usize, 0u64, 0u16);
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
            let mut start = pos;
            let mut cap = 0u64;
            while cap < need {
                if (!mergeable && !self.chains.is_empty()) || self.rx_segs.len() > MAX_FRAME_SEGS {
                    shortage = Some(RxShortage::TooSmall);
                } else if left == 0 {
                    shortage = Some(RxShortage::NoBuffers);
                }
                if shortage.is_some() {
                    pos = start;
                    break 'frames;
                }
                let head = match ring.head(pos) {
                    Ok(h) => h,
                    Err(e) => {
                        e.count(c);
                        shortage = Some(RxShortage::Ring);
                        break 'frames;
                    }
                };
                pos = pos.wrapping_add(1);
                left -= 1;
                let first = self.rx_segs.len();
                let segs = &mut self.rx_segs;
                // A segment is part of one descriptor's buffer: its length fits in u32.
                let walked = walk(&ring, &mut view, head, true, u64::MAX, |_, addr, s| {
                    segs.push(Segment {
                        addr,
                        len: s.len() as u32,
                    });
                    true
                });
                match walked {
                    Ok(len) => {
                        self.chains.push(RxChain {
                            head,
                            first,
                            count: self.rx_segs.len() - first,
                        });
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
                            if let Err(e) = ring.put_used(first_used.wrapping_add(used), h, 0) {
                                e.count(c);
                                shortage = Some(RxShortage::Ring);
                                break 'frames;
                            }
                            used += 1;
                        }
                        if health.is_quarantined() {
                            shortage = Some(RxShortage::Ring);
                            break 'frames;
                        }
                        self.chains.clear();
                        self.rx_segs.clear();
                        cap = 0;
                        start = pos;
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
                for seg in &self.rx_segs[ch.first..ch.first + ch.count] {
                    if off == total {
                        break;
                    }
                    let n = (seg.len as usize).min(total - off);
                    // Resolved by the walk in this burst's memory map (the view's cached
                    // region): it cannot fail, but a failure is a broken ring, not a panic.
                    let written = view
                        .slice(seg.addr, n)
                        .is_some_and(|d| write_stream(&d, hdr, payload, off));
                    if let Some(log) = cx.log.filter(|_| written) {
                        self.log_cache.mark(log, seg.addr, n as u64);
                    }
                    if !written {
                        bump(&c.bad_desc_address, 1);
                        shortage = Some(RxShortage::Ring);
                        break 'frames;
                    }
                    off += n;
                }
                let written = u32::try_from(off - start_off).unwrap_or(u32::MAX);
                if let Err(e) = ring.put_used(first_used.wrapping_add(used), ch.head, written) {
                    e.count(c);
                    shortage = Some(RxShortage::Ring);
                    break 'frames;
                }
                used += 1;
            }
            sent += 1;
            bytes += frame.len() as u64;
        }
        q.set_next_avail(pos);
        let next_used = first_used.wrapping_add(used);
        let published = publish(&ring, q, next_used, used).unwrap_or_else(|e| {
            // Nothing written this burst reaches the guest.
            e.count(c);
            shortage = Some(RxShortage::Ring);
            sent = 0;
            bytes = 0;
            false
        });
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
        log_used_ring(cx.log, &mut self.log_cache, q);
        if published {
            interrupt(&ring, &st, event_idx, first_used, next_used, c);
        }
        io.tx_frames += sent as u64;
        io.tx_bytes += bytes;
        io.tx_errors += lost;
        if let Some(f) = shared.pair_frames.get(pair) {
            bump(&f[1], sent as u64);
        }
        bump(&shared.io[2], sent as u64);
        bump(&shared.io[3], bytes);
        sent
    }
}
