//! Reading the guest's split virtqueue: chain heads from the avail ring and descriptor chains
//! from the descriptor table, every value checked, each misbehaviour by name.
//!
//! `virtio-queue`'s own iterators end a chain silently on a bad `next` or a loop; we walk the
//! table ourselves so that each case moves its own counter ([`ChainError`]) and so that the
//! chain is validated as a whole before one byte is copied. The `Queue` of `virtio-queue` still
//! keeps the ring indexes, the used ring and the notification state.

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::counters::{bump, AtomicCounters};

/// Descriptor flag: the chain continues at `next`.
const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is a table of descriptors.
const DESC_F_INDIRECT: u16 = 4;
/// Bytes of one split-ring descriptor.
const DESC_BYTES: u64 = 16;

/// One buffer of a validated chain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    /// Guest-physical address of the buffer.
    pub(crate) addr: GuestAddress,
    /// Bytes.
    pub(crate) len: u32,
}

/// Why a descriptor chain was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChainError {
    /// The head index is not below the ring size.
    #[error("Chain head out of range")]
    HeadOutOfRange,
    /// A `next` index is not below the ring size.
    #[error("Descriptor next out of range")]
    NextOutOfRange,
    /// More descriptors than the ring holds: a loop.
    #[error("Descriptor chain loops")]
    Loop,
    /// A descriptor of length zero.
    #[error("Descriptor of length zero")]
    ZeroLength,
    /// A buffer (or the descriptor itself) outside guest memory.
    #[error("Descriptor address outside guest memory")]
    BadAddress,
    /// A buffer of the wrong direction for this ring.
    #[error("Descriptor of the wrong direction")]
    WrongDirection,
    /// An indirect descriptor (not negotiated).
    #[error("Indirect descriptor")]
    Indirect,
    /// More bytes than any frame may have.
    #[error("Descriptor chain too long")]
    TooLong,
}

impl ChainError {
    /// Moves this error's counter.
    pub(crate) fn count(self, c: &AtomicCounters) {
        let field = match self {
            ChainError::HeadOutOfRange => &c.head_out_of_range,
            ChainError::NextOutOfRange => &c.next_out_of_range,
            ChainError::Loop => &c.chain_loop,
            ChainError::ZeroLength => &c.zero_length_desc,
            ChainError::BadAddress => &c.bad_desc_address,
            ChainError::WrongDirection => &c.wrong_direction_desc,
            ChainError::Indirect => &c.indirect_desc,
            ChainError::TooLong => &c.oversized_chain,
        };
        bump(field, 1);
    }
}

/// The ring itself is broken: the session is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RingError {
    /// The avail index is more than a ring size ahead of the last one consumed.
    #[error("Avail index out of range")]
    BadAvailIndex,
    /// The avail ring (or the used ring) is outside guest memory.
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

/// Where one ring lives, copied out of the `Queue` once per batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingLayout {
    /// Descriptor table address.
    pub(crate) desc_table: GuestAddress,
    /// Avail ring address.
    pub(crate) avail_ring: GuestAddress,
    /// Entries in the ring.
    pub(crate) size: u16,
}

impl RingLayout {
    /// Chain heads the guest made available beyond `next_avail`, checked against the ring size.
    pub(crate) fn pending(&self, mem: &GuestMemoryMmap, next_avail: u16) -> Result<u16, RingError> {
        let idx_addr = self
            .avail_ring
            .0
            .checked_add(2)
            .ok_or(RingError::BadRingAddress)?;
        let idx: u16 = mem
            .load(GuestAddress(idx_addr), Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|_| RingError::BadRingAddress)?;
        let pending = (Wrapping(idx) - Wrapping(next_avail)).0;
        if pending > self.size {
            return Err(RingError::BadAvailIndex);
        }
        Ok(pending)
    }

    /// Without `EVENT_IDX`: the guest set `VRING_AVAIL_F_NO_INTERRUPT` (a polling driver such
    /// as DPDK's does), so no interrupt is due. (`virtio-queue` does not look at this flag.)
    pub(crate) fn no_interrupt(&self, mem: &GuestMemoryMmap) -> bool {
        mem.load::<u16>(self.avail_ring, Ordering::Relaxed)
            .is_ok_and(|f| u16::from_le(f) & 1 != 0)
    }

    /// The chain head at avail position `pos` (not range-checked: see [`RingLayout::walk`]).
    pub(crate) fn head(&self, mem: &GuestMemoryMmap, pos: u16) -> Result<u16, RingError> {
        let off = 4 + 2 * u64::from(pos % self.size.max(1));
        let addr = self
            .avail_ring
            .0
            .checked_add(off)
            .ok_or(RingError::BadRingAddress)?;
        mem.read_obj::<u16>(GuestAddress(addr))
            .map(u16::from_le)
            .map_err(|_| RingError::BadRingAddress)
    }

    /// Validates the chain starting at `head` and appends its buffers to `segs` (cleared
    /// first). `device_writes` is the direction the ring needs (guest RX: true). Returns the
    /// chain's total bytes; more than `max_bytes` is [`ChainError::TooLong`].
    pub(crate) fn walk(
        &self,
        mem: &GuestMemoryMmap,
        head: u16,
        device_writes: bool,
        max_bytes: u64,
        segs: &mut Vec<Segment>,
    ) -> Result<u64, ChainError> {
        segs.clear();
        if head >= self.size {
            return Err(ChainError::HeadOutOfRange);
        }
        let mut index = head;
        let mut total = 0u64;
        for _ in 0..self.size {
            let at = self
                .desc_table
                .0
                .checked_add(u64::from(index) * DESC_BYTES)
                .ok_or(ChainError::BadAddress)?;
            let mut raw = [0u8; DESC_BYTES as usize];
            mem.read_slice(&mut raw, GuestAddress(at))
                .map_err(|_| ChainError::BadAddress)?;
            let addr = u64::from_le_bytes(raw[0..8].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default());
            let flags = u16::from_le_bytes([raw[12], raw[13]]);
            let next = u16::from_le_bytes([raw[14], raw[15]]);
            if flags & DESC_F_INDIRECT != 0 {
                return Err(ChainError::Indirect);
            }
            if (flags & DESC_F_WRITE != 0) != device_writes {
                return Err(ChainError::WrongDirection);
            }
            if len == 0 {
                return Err(ChainError::ZeroLength);
            }
            if !GuestMemoryBackend::check_range(mem, GuestAddress(addr), len as usize) {
                return Err(ChainError::BadAddress);
            }
            total += u64::from(len);
            if total > max_bytes {
                return Err(ChainError::TooLong);
            }
            segs.push(Segment {
                addr: GuestAddress(addr),
                len,
            });
            if flags & DESC_F_NEXT == 0 {
                return Ok(total);
            }
            if next >= self.size {
                return Err(ChainError::NextOutOfRange);
            }
            index = next;
        }
        Err(ChainError::Loop)
    }
}

/// Copies guest buffers `segs` (a validated chain) into `out`, which must hold their total.
pub(crate) fn gather(mem: &GuestMemoryMmap, segs: &[Segment], out: &mut [u8]) -> bool {
    let mut off = 0usize;
    for s in segs {
        let len = s.len as usize;
        let Some(dst) = out.get_mut(off..off + len) else {
            return false;
        };
        if mem.read_slice(dst, s.addr).is_err() {
            return false;
        }
        off += len;
    }
    true
}
