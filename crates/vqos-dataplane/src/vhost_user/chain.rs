//! Walking a guest's descriptor chain: every descriptor read once and checked, each
//! misbehaviour by name, its buffer resolved to guest-memory slices as it is met.
//!
//! `virtio-queue`'s own iterators end a chain silently on a bad `next` or a loop; we walk the
//! table ourselves so that each case moves its own counter ([`ChainError`]), and so that each
//! buffer is resolved once, straight into the slice the frame is copied from or to (no second
//! lookup, no intermediate buffer). The `Queue` of `virtio-queue` still keeps the ring
//! indexes and the notification state.

use super::counters::{bump, AtomicCounters};
use super::guest::{GuestView, RingView, Slice};

/// Descriptor flag: the chain continues at `next`.
const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is a table of descriptors.
const DESC_F_INDIRECT: u16 = 4;

/// A buffer of a validated chain, or the part of one that lies in one memory region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    /// Guest-physical address.
    pub(crate) addr: u64,
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

/// Walks the chain starting at `head` and hands each buffer to `sink(chain_offset, guest_addr,
/// slice)` in chain order (a buffer across two memory regions comes as two slices). The
/// descriptor table is read one descriptor at a time, each once, and each value checked before
/// its buffer reaches `sink`: the index below the ring size, no `INDIRECT` flag, the direction
/// the ring needs (`device_writes`: guest RX), a length above zero, the buffer inside guest
/// memory, at most `max_bytes` in all (else [`ChainError::TooLong`], before any byte of that
/// buffer reaches `sink`), at most a ring's worth of descriptors. A `sink` that returns false
/// ends the walk with [`ChainError::TooLong`]. Returns the chain's total bytes. On an error,
/// `sink` may already have seen the chain's first buffers: the caller drops what it did with
/// them.
pub(crate) fn walk<'m>(
    ring: &RingView<'m>,
    view: &mut GuestView<'m>,
    head: u16,
    device_writes: bool,
    max_bytes: u64,
    mut sink: impl FnMut(u64, u64, Slice<'m>) -> bool,
) -> Result<u64, ChainError> {
    if head >= ring.size {
        return Err(ChainError::HeadOutOfRange);
    }
    let mut index = head;
    let mut total = 0u64;
    for _ in 0..ring.size {
        // `index` < size, so the read stays in the table resolved for this burst.
        let d = ring.desc(index).ok_or(ChainError::BadAddress)?;
        if d.flags & DESC_F_INDIRECT != 0 {
            return Err(ChainError::Indirect);
        }
        if (d.flags & DESC_F_WRITE != 0) != device_writes {
            return Err(ChainError::WrongDirection);
        }
        if d.len == 0 {
            return Err(ChainError::ZeroLength);
        }
        let len = u64::from(d.len);
        if d.addr.checked_add(len).is_none() {
            return Err(ChainError::BadAddress);
        }
        if total + len > max_bytes {
            return Err(if view.covers(d.addr, len) {
                ChainError::TooLong
            } else {
                ChainError::BadAddress
            });
        }
        let (mut at, mut left) = (d.addr, len);
        while left > 0 {
            let s = view.prefix(at, left).ok_or(ChainError::BadAddress)?;
            let n = s.len() as u64;
            if !sink(total, at, s) {
                return Err(ChainError::TooLong);
            }
            total += n;
            at += n;
            left -= n;
        }
        if d.flags & DESC_F_NEXT == 0 {
            return Ok(total);
        }
        if d.next >= ring.size {
            return Err(ChainError::NextOutOfRange);
        }
        index = d.next;
    }
    Err(ChainError::Loop)
}
