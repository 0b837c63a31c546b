//! What a vhost-user port saw of its guest, each misbehaviour by name: the live form of
//! [`VhostUserCounters`] (`vqos_api::stats`, the one definition the API, `/metrics` and the
//! CLI read).
//!
//! The poll loop and the protocol thread both count, and the operator reads through a
//! [`super::VhostUserHandle`] from a third thread, so the live counters are atomics
//! ([`AtomicCounters`], relaxed: they are statistics, not synchronisation); a snapshot names
//! every field of [`VhostUserCounters`], so a counter added there does not compile here until
//! it is counted. Frame counts are added once per batch, misbehaviours once per event.

use std::sync::atomic::{AtomicU64, Ordering};

pub use vqos_api::stats::VhostUserCounters;

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
    dirty_logs_refused,
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
