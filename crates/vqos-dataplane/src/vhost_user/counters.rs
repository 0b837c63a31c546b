//! [`VhostUserCounters`]: what a vhost-user port saw of its guest, each misbehaviour by name.
//!
//! The poll loop and the protocol thread both count, and the operator reads through a
//! [`super::VhostUserHandle`] from a third thread, so the live counters are atomics
//! ([`AtomicCounters`], relaxed: they are statistics, not synchronisation). Frame counts are
//! added once per batch, misbehaviours once per event.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of one vhost-user port, accumulated over every session of the port.
///
/// "Guest TX" is the guest's transmit queue (frames the switch reads from the port), "guest RX"
/// its receive queue (frames the switch writes to the port).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VhostUserCounters {
    /// Sessions started (a frontend connected, or we connected to it).
    pub sessions: u64,
    /// Sessions that ended (the frontend went away or the port was stopped).
    pub disconnects: u64,
    /// Client mode: connection attempts that failed (then retried with backoff).
    pub connect_failures: u64,
    /// Sessions put in quarantine: the port stopped using the guest's rings until it reconnects.
    pub quarantines: u64,
    /// Guest TX notifications (kicks) the protocol thread forwarded to the loop.
    pub kicks: u64,
    /// Interrupts (call eventfd writes) sent to the guest after used-ring updates.
    pub interrupts: u64,
    /// vhost-user messages refused and skipped because a feature they need was not yet
    /// negotiated (QEMU's `SET_VRING_ENABLE` before `SET_FEATURES`).
    pub refused_messages: u64,
    /// Dirty logs the frontend handed over (`SET_LOG_BASE`): live migrations of the guest
    /// started from this port.
    pub dirty_logs: u64,
    /// `SEND_RARP` requests accepted (after a live migration, the destination's frontend asks
    /// for the guest to be announced): a RARP frame from the guest's MAC was put in the
    /// port's next batch, where port security decides on it like on any frame (another
    /// guest's MAC is dropped as `spoofed`).
    pub rarp_announces: u64,
    /// `SEND_RARP` requests refused: a group or zero MAC.
    pub rarp_refused: u64,
    /// The avail index ran more than a ring size ahead of us (ring corrupt: quarantine).
    pub bad_avail_index: u64,
    /// A ring (descriptor table, avail or used ring) lies outside guest memory, across two
    /// memory regions, or misaligned in host memory (quarantine).
    pub bad_ring_address: u64,
    /// A chain head read from the avail ring is not below the ring size.
    pub head_out_of_range: u64,
    /// A descriptor's `next` is not below the ring size.
    pub next_out_of_range: u64,
    /// A chain longer than the ring (a loop in the descriptor table).
    pub chain_loop: u64,
    /// A descriptor of length zero.
    pub zero_length_desc: u64,
    /// A descriptor whose buffer lies (partly) outside guest memory (in a hole between regions,
    /// past the end) or whose address overflows.
    pub bad_desc_address: u64,
    /// A write-only descriptor in a guest TX chain, or a read-only one in a guest RX chain.
    pub wrong_direction_desc: u64,
    /// An indirect descriptor (`VIRTIO_RING_F_INDIRECT_DESC` is not offered).
    pub indirect_desc: u64,
    /// A guest TX chain longer than the longest frame (dropped).
    pub oversized_chain: u64,
    /// A guest TX chain shorter than the virtio-net header (dropped).
    pub short_chain: u64,
    /// Frames for the guest lost because it posted no (or too few) receive buffers: a guest
    /// that stopped consuming.
    pub guest_rx_no_buffers_frames: u64,
    /// Frames for the guest lost because its receive chain was too small (without
    /// `VIRTIO_NET_F_MRG_RXBUF`).
    pub guest_rx_buffer_too_small_frames: u64,
    /// Frames for the guest lost because they carry an offload (GSO type, partial checksum)
    /// the guest did not negotiate.
    pub guest_offload_unsupported_frames: u64,
    /// Frames for the guest lost because no guest was connected, its receive ring was not
    /// started, or the session was quarantined.
    pub disconnected_frames: u64,
}

impl VhostUserCounters {
    /// Malformed-descriptor events of every kind (the sum of the per-kind counters).
    pub fn malformed(&self) -> u64 {
        self.head_out_of_range
            + self.next_out_of_range
            + self.chain_loop
            + self.zero_length_desc
            + self.bad_desc_address
            + self.wrong_direction_desc
            + self.indirect_desc
            + self.oversized_chain
            + self.short_chain
    }
}

/// Names the atomic fields once so that the snapshot cannot forget one.
macro_rules! atomic_counters {
    ($($field:ident),* $(,)?) => {
        /// The live, shared form of [`VhostUserCounters`].
        #[derive(Debug, Default)]
        pub(crate) struct AtomicCounters {
            $(
                /// See [`VhostUserCounters`].
                pub(crate) $field: AtomicU64,
            )*
        }

        impl AtomicCounters {
            /// A consistent-enough copy (each field read once, relaxed).
            pub(crate) fn snapshot(&self) -> VhostUserCounters {
                VhostUserCounters {
                    $($field: self.$field.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

atomic_counters!(
    sessions,
    disconnects,
    connect_failures,
    quarantines,
    kicks,
    interrupts,
    refused_messages,
    dirty_logs,
    rarp_announces,
    rarp_refused,
    bad_avail_index,
    bad_ring_address,
    head_out_of_range,
    next_out_of_range,
    chain_loop,
    zero_length_desc,
    bad_desc_address,
    wrong_direction_desc,
    indirect_desc,
    oversized_chain,
    short_chain,
    guest_rx_no_buffers_frames,
    guest_rx_buffer_too_small_frames,
    guest_offload_unsupported_frames,
    disconnected_frames,
);

/// Adds `n` to a counter (relaxed).
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    if n != 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}
