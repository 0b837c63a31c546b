//! Guest memory as the data path sees it during one burst: guest addresses resolved to
//! bounds-checked `vm-memory` [`VolatileSlice`]s with the last region remembered, and the three
//! parts of a split virtqueue resolved once per burst.
//!
//! `vm-memory`'s `Bytes` accessors on `GuestMemoryMmap` (`read_slice`, `write_obj`, `load`,
//! `store`) look the region up (a binary search behind an iterator) on every call; for a
//! 64-byte frame that was about ten lookups. Here a burst looks a region up once
//! ([`GuestView::region`] keeps the last hit: a guest's buffers almost always lie in its one
//! large RAM region), resolves the descriptor table, avail ring and used ring into slices once
//! ([`RingView::new`]), and every access after that is an offset into a slice, still checked
//! by `vm-memory` (no `unsafe` here: `GuestMemoryRegion::get_slice`, `VolatileSlice::subslice`,
//! `copy_to` / `copy_from`, which copy with `memcpy` above 8 bytes, and `get_atomic_ref` for
//! ring fields, read and written with `std`'s atomics: [`atomic`]).
//!
//! A buffer may lie across two adjacent regions: [`GuestView::prefix`] gives the part in one
//! region and the caller goes on with the rest. A ring must lie in one region (as DPDK's vhost
//! library requires): otherwise it is [`RingError::BadRingAddress`] and the session is
//! quarantined.

use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, Ordering};

use virtio_queue::{Queue, QueueT};
use vm_memory::{
    AtomicInteger, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MemoryRegionAddress, VolatileMemory, VolatileSlice,
};

use super::counters::{bump, AtomicCounters};

/// A slice of guest memory, valid for one burst.
pub(crate) type Slice<'m> = VolatileSlice<'m, ()>;

/// Bytes of one split-ring descriptor.
pub(crate) const DESC_BYTES: usize = 16;
/// Bytes of one used-ring element (`id: u32`, `len: u32`).
const USED_ELEM_BYTES: usize = 8;
/// `VRING_USED_F_NO_NOTIFY`.
const USED_F_NO_NOTIFY: u16 = 1;
/// `VRING_AVAIL_F_NO_INTERRUPT`.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// The atomic at `offset` of ring slice `s`, for one access with `std`'s own `load` / `store`
/// (ring fields are little-endian in guest memory: the caller converts). `vm-memory`'s
/// `Bytes::load` / `store` reach the atomic through a trait method that is not inlined across
/// crates, a call per ring access on the hot path; `get_atomic_ref` is generic, so inlined
/// here. Outside the slice or misaligned: [`RingError::BadRingAddress`].
#[inline]
fn atomic<'a, A: AtomicInteger>(s: &'a Slice<'_>, offset: usize) -> Result<&'a A, RingError> {
    s.get_atomic_ref::<A>(offset)
        .map_err(|_| RingError::BadRingAddress)
}

/// The region of the last translation.
#[derive(Clone, Copy)]
struct Hit<'m> {
    /// First guest address of the region.
    start: u64,
    /// One past its last guest address.
    end: u64,
    /// The region.
    region: &'m GuestRegionMmap,
}

/// Guest-address translation for one burst, over one memory snapshot.
pub(crate) struct GuestView<'m> {
    /// The snapshot the burst holds.
    mem: &'m GuestMemoryMmap,
    /// The last region hit, if any.
    last: Option<Hit<'m>>,
}

impl<'m> GuestView<'m> {
    /// A view of `mem` with nothing cached yet.
    pub(crate) fn new(mem: &'m GuestMemoryMmap) -> Self {
        GuestView { mem, last: None }
    }

    /// The region holding `addr` (the last one hit when it does).
    #[inline]
    fn region(&mut self, addr: u64) -> Option<Hit<'m>> {
        if let Some(h) = self.last {
            if addr >= h.start && addr < h.end {
                return Some(h);
            }
        }
        let region = self.mem.find_region(GuestAddress(addr))?;
        let start = region.start_addr().0;
        let hit = Hit {
            start,
            end: start.checked_add(region.len())?,
            region,
        };
        self.last = Some(hit);
        Some(hit)
    }

    /// The `len` bytes at `addr`, if they lie in guest memory and in one region.
    #[inline]
    pub(crate) fn slice(&mut self, addr: u64, len: usize) -> Option<Slice<'m>> {
        let h = self.region(addr)?;
        if len as u64 > h.end - addr {
            return None;
        }
        h.region
            .get_slice(MemoryRegionAddress(addr - h.start), len)
            .ok()
    }

    /// The longest start of the `len` bytes at `addr` that lies in one region (`len` > 0); `None`
    /// when `addr` is outside guest memory.
    #[inline]
    pub(crate) fn prefix(&mut self, addr: u64, len: u64) -> Option<Slice<'m>> {
        let h = self.region(addr)?;
        let n = len.min(h.end - addr);
        h.region
            .get_slice(
                MemoryRegionAddress(addr - h.start),
                usize::try_from(n).ok()?,
            )
            .ok()
    }

    /// True when the `len` bytes at `addr` all lie in guest memory (across regions if need be).
    pub(crate) fn covers(&mut self, mut addr: u64, mut len: u64) -> bool {
        while len > 0 {
            let Some(s) = self.prefix(addr, len) else {
                return false;
            };
            addr += s.len() as u64;
            len -= s.len() as u64;
        }
        true
    }
}

/// One descriptor, decoded from a single 16-byte read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Desc {
    /// Guest address of the buffer.
    pub(crate) addr: u64,
    /// Bytes.
    pub(crate) len: u32,
    /// `VIRTQ_DESC_F_*`.
    pub(crate) flags: u16,
    /// Next descriptor when `flags` has `NEXT`.
    pub(crate) next: u16,
}

/// The descriptor table, avail ring and used ring of one queue, resolved for one burst.
pub(crate) struct RingView<'m> {
    /// `size` descriptors.
    desc: Slice<'m>,
    /// `flags`, `idx`, `ring[size]`, `used_event`.
    avail: Slice<'m>,
    /// `flags`, `idx`, `ring[size]`, `avail_event`.
    used: Slice<'m>,
    /// Entries in the ring (a power of two: `SET_VRING_NUM` checks it).
    pub(crate) size: u16,
}

impl<'m> RingView<'m> {
    /// Resolves the rings of `q`; any of them outside guest memory or across two regions is
    /// [`RingError::BadRingAddress`].
    pub(crate) fn new(view: &mut GuestView<'m>, q: &Queue) -> Result<Self, RingError> {
        let size = q.size();
        let n = usize::from(size);
        let mut get =
            |addr: u64, len: usize| view.slice(addr, len).ok_or(RingError::BadRingAddress);
        Ok(RingView {
            desc: get(q.desc_table(), DESC_BYTES * n)?,
            avail: get(q.avail_ring(), 6 + 2 * n)?,
            used: get(q.used_ring(), 6 + USED_ELEM_BYTES * n)?,
            size,
        })
    }

    /// Position `pos` of a ring of this size.
    #[inline]
    fn slot(&self, pos: u16) -> usize {
        usize::from(pos & self.size.wrapping_sub(1))
    }

    /// Chain heads the guest made available beyond `next_avail`: one acquire load of the avail
    /// index per burst (what the guest wrote to the ring before it is visible after it).
    pub(crate) fn pending(&self, next_avail: u16) -> Result<u16, RingError> {
        let idx = atomic::<AtomicU16>(&self.avail, 2)?.load(Ordering::Acquire);
        let pending = u16::from_le(idx).wrapping_sub(next_avail);
        if pending > self.size {
            return Err(RingError::BadAvailIndex);
        }
        Ok(pending)
    }

    /// The chain head at avail position `pos` (not range-checked: see the chain walk).
    #[inline]
    pub(crate) fn head(&self, pos: u16) -> Result<u16, RingError> {
        let head = atomic::<AtomicU16>(&self.avail, 4 + 2 * self.slot(pos))?;
        Ok(u16::from_le(head.load(Ordering::Relaxed)))
    }

    /// Descriptor `index` (< size), read once: the guest may rewrite the table at any time, so
    /// each value is decoded from this one read and never read again. Two 8-byte loads (the
    /// table is 16-byte aligned, `virtio-queue` refuses a ring that is not), not a copy into a
    /// stack buffer read back field by field: no call, no store to reload.
    #[inline]
    pub(crate) fn desc(&self, index: u16) -> Option<Desc> {
        let at = DESC_BYTES * usize::from(index);
        let addr = atomic::<AtomicU64>(&self.desc, at)
            .ok()?
            .load(Ordering::Relaxed);
        let rest = atomic::<AtomicU64>(&self.desc, at + 8).ok()?;
        let rest = u64::from_le(rest.load(Ordering::Relaxed));
        Some(Desc {
            addr: u64::from_le(addr),
            len: rest as u32,
            flags: (rest >> 32) as u16,
            next: (rest >> 48) as u16,
        })
    }

    /// Writes used element `(head, len)` at used position `pos`. Not visible to the guest
    /// before [`RingView::publish_used`] moves the used index past it. Two 4-byte stores (the
    /// used ring is 4-byte aligned): a value staged in a stack buffer and copied out would be
    /// reloaded with a load wider than the stores that built it, which waits for every older
    /// store of the burst to reach the cache (docs/dataplane.md, "The vhost-user hot path").
    #[inline]
    pub(crate) fn put_used(&self, pos: u16, head: u16, len: u32) -> Result<(), RingError> {
        let at = 4 + USED_ELEM_BYTES * self.slot(pos);
        atomic::<AtomicU32>(&self.used, at)?.store(u32::from(head).to_le(), Ordering::Relaxed);
        atomic::<AtomicU32>(&self.used, at + 4)?.store(len.to_le(), Ordering::Relaxed);
        Ok(())
    }

    /// The guest's kicks are off (`VRING_USED_F_NO_NOTIFY` is set in the used ring): read
    /// before writing it, so that a burst writes the flag only when it changes (and again
    /// after the guest reset its ring).
    pub(crate) fn kicks_off(&self) -> bool {
        atomic::<AtomicU16>(&self.used, 0)
            .is_ok_and(|f| u16::from_le(f.load(Ordering::Relaxed)) & USED_F_NO_NOTIFY != 0)
    }

    /// Publishes every used element written up to `next_used` with one release store of the
    /// used index: the guest sees the buffers and elements before it sees the index.
    pub(crate) fn publish_used(&self, next_used: u16) -> Result<(), RingError> {
        atomic::<AtomicU16>(&self.used, 2)?.store(next_used.to_le(), Ordering::Release);
        Ok(())
    }

    /// Whether the guest wants an interrupt for the used entries `old..new` just published:
    /// with `EVENT_IDX` when its `used_event` lies in that window, else unless it set
    /// `VRING_AVAIL_F_NO_INTERRUPT` (a polling driver such as DPDK's; `virtio-queue` does not
    /// look at that flag). The full fence orders our used-index store before the read of the
    /// guest's field (the guest pairs it with its own barrier when it re-enables interrupts).
    pub(crate) fn interrupt_due(&self, event_idx: bool, old: u16, new: u16) -> bool {
        fence(Ordering::SeqCst);
        if event_idx {
            let Ok(ev) = atomic::<AtomicU16>(&self.avail, 4 + 2 * usize::from(self.size)) else {
                return true;
            };
            let ev = u16::from_le(ev.load(Ordering::Relaxed));
            let (ev, old, new) = (Wrapping(ev), Wrapping(old), Wrapping(new));
            new - ev - Wrapping(1) < new - old
        } else {
            atomic::<AtomicU16>(&self.avail, 0).map_or(true, |f| {
                u16::from_le(f.load(Ordering::Relaxed)) & AVAIL_F_NO_INTERRUPT == 0
            })
        }
    }
}

/// The ring itself is broken: the session is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RingError {
    /// The avail index is more than a ring size ahead of the last one consumed.
    #[error("Avail index out of range")]
    BadAvailIndex,
    /// A ring (descriptor table, avail or used ring) is outside guest memory, across two
    /// memory regions, or misaligned.
    #[error("Ring outside guest memory")]
    BadRingAddress,
}

impl RingError {
    /// Moves this error's counter.
    pub(crate) fn count(self, c: &AtomicCounters) {
        match self {
            RingError::BadAvailIndex => bump(&c.bad_avail_index, 1),
            RingError::BadRingAddress => bump(&c.bad_ring_address, 1),
        }
    }
}
