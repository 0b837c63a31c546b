//! The vhost-user families: whether a port's guest is connected, whether its session is
//! quarantined, and the guest's misbehaviour counters, from the port's `vhost_user` status
//! ([`VhostUserStatus`], which the data plane fills; other port kinds have none). A counter
//! the status did not carry (an older daemon's JSON) reads as 0: a series from the start, never
//! a gap. A test of crates/vqosd/tests/metrics_doc.rs gives every field of
//! [`VhostUserCounters`] its own value and checks that each reaches the exposition.

use vqos_api::stats::{VhostUserCounters, VhostUserStatus};

use super::Counter;
use crate::backend::PortStats;

/// The counters: how to read it out of [`VhostUserCounters`], family, the label that tells the
/// field apart within a family that has several (empty: none).
const COUNTERS: &[(Counter<VhostUserCounters>, &str, &str)] = &[
    (|c| c.sessions, "vqos_vhost_user_sessions_total", ""),
    (|c| c.disconnects, "vqos_vhost_user_disconnects_total", ""),
    (
        |c| c.connect_failures,
        "vqos_vhost_user_connect_failures_total",
        "",
    ),
    (|c| c.quarantines, "vqos_vhost_user_quarantines_total", ""),
    (|c| c.kicks, "vqos_vhost_user_kicks_total", ""),
    (|c| c.interrupts, "vqos_vhost_user_interrupts_total", ""),
    (
        |c| c.refused_messages,
        "vqos_vhost_user_refused_messages_total",
        "",
    ),
    (|c| c.dirty_logs, "vqos_vhost_user_dirty_logs_total", ""),
    (
        |c| c.dirty_logs_refused,
        "vqos_vhost_user_dirty_logs_refused_total",
        "",
    ),
    (|c| c.rarp_announces, RARP, "result=\"announced\""),
    (|c| c.rarp_refused, RARP, "result=\"refused\""),
    (|c| c.bad_avail_index, ERRORS, "error=\"bad_avail_index\""),
    (|c| c.bad_ring_address, ERRORS, "error=\"bad_ring_address\""),
    (
        |c| c.head_out_of_range,
        ERRORS,
        "error=\"head_out_of_range\"",
    ),
    (
        |c| c.next_out_of_range,
        ERRORS,
        "error=\"next_out_of_range\"",
    ),
    (|c| c.chain_loop, ERRORS, "error=\"chain_loop\""),
    (|c| c.zero_length_desc, ERRORS, "error=\"zero_length_desc\""),
    (|c| c.bad_desc_address, ERRORS, "error=\"bad_desc_address\""),
    (
        |c| c.wrong_direction_desc,
        ERRORS,
        "error=\"wrong_direction_desc\"",
    ),
    (|c| c.indirect_desc, ERRORS, "error=\"indirect_desc\""),
    (|c| c.oversized_chain, ERRORS, "error=\"oversized_chain\""),
    (|c| c.short_chain, ERRORS, "error=\"short_chain\""),
    (
        |c| c.guest_rx_no_buffers_frames,
        RX_DROPS,
        "reason=\"no_buffers\"",
    ),
    (
        |c| c.guest_rx_buffer_too_small_frames,
        RX_DROPS,
        "reason=\"buffer_too_small\"",
    ),
    (
        |c| c.guest_offload_unsupported_frames,
        RX_DROPS,
        "reason=\"offload_unsupported\"",
    ),
    (
        |c| c.disconnected_frames,
        RX_DROPS,
        "reason=\"disconnected\"",
    ),
];

/// The family of the frontend's `SEND_RARP` requests.
const RARP: &str = "vqos_vhost_user_rarp_requests_total";
/// The family of the guest's ring and descriptor errors.
const ERRORS: &str = "vqos_vhost_user_guest_errors_total";
/// The family of the frames for the guest it could not take.
const RX_DROPS: &str = "vqos_vhost_user_guest_rx_dropped_frames_total";

/// The port's vhost-user status, `None` for other port kinds.
fn status(p: &PortStats) -> Option<&VhostUserStatus> {
    p.status.as_ref()?.vhost_user()
}

/// The samples of the vhost-user family `name` for port `p`: labels after `port` (each with
/// its leading comma), value. Empty for ports that are not vhost-user.
pub fn port_samples(name: &str, p: &PortStats) -> Vec<(String, String)> {
    let Some(s) = status(p) else {
        return Vec::new();
    };
    match name {
        "vqos_vhost_user_connected" => vec![(String::new(), u8::from(s.connected).to_string())],
        "vqos_vhost_user_quarantined" => {
            vec![(String::new(), u8::from(s.quarantined).to_string())]
        }
        "vqos_vhost_user_queue_frames_total" => s
            .pair_frames
            .iter()
            .enumerate()
            .flat_map(|(pair, [from, to])| {
                [("from_guest", from), ("to_guest", to)].map(|(dir, n)| {
                    (
                        format!(",pair=\"{pair}\",direction=\"{dir}\""),
                        n.to_string(),
                    )
                })
            })
            .collect(),
        _ => COUNTERS
            .iter()
            .filter(|(_, family, _)| *family == name)
            .map(|(get, _, label)| {
                let labels = if label.is_empty() {
                    String::new()
                } else {
                    format!(",{label}")
                };
                (labels, get(&s.counters).to_string())
            })
            .collect(),
    }
}
