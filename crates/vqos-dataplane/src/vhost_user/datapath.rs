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

mod to_guest;

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
        debug_assert!(self.log_cache.is_empty(), "marks left from a batch");
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
}
