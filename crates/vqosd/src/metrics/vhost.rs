//! The vhost-user families: whether a port's guest is connected, whether its session is
//! quarantined, and the guest's misbehaviour counters, from the port's `vhost_user` status
//! ([`VhostUserStatus`]; other port kinds have none). A test of
//! crates/vqosd/tests/metrics_doc.rs serialises the data plane's own type and checks that
//! every counter it has reaches the exposition.

use vqos_api::stats::VhostUserStatus;

use crate::backend::PortStats;

/// The counters: field of `VhostUserCounters`, family, the label that tells the field apart
/// within a family that has several (empty: none).
const COUNTERS: &[(&str, &str, &str)] = &[
    ("sessions", "vqos_vhost_user_sessions_total", ""),
    ("disconnects", "vqos_vhost_user_disconnects_total", ""),
    (
        "connect_failures",
        "vqos_vhost_user_connect_failures_total",
        "",
    ),
    ("quarantines", "vqos_vhost_user_quarantines_total", ""),
    ("kicks", "vqos_vhost_user_kicks_total", ""),
    ("interrupts", "vqos_vhost_user_interrupts_total", ""),
    (
        "refused_messages",
        "vqos_vhost_user_refused_messages_total",
        "",
    ),
    ("dirty_logs", "vqos_vhost_user_dirty_logs_total", ""),
    ("rarp_announces", RARP, "result=\"announced\""),
    ("rarp_refused", RARP, "result=\"refused\""),
    ("bad_avail_index", ERRORS, "error=\"bad_avail_index\""),
    ("bad_ring_address", ERRORS, "error=\"bad_ring_address\""),
    ("head_out_of_range", ERRORS, "error=\"head_out_of_range\""),
    ("next_out_of_range", ERRORS, "error=\"next_out_of_range\""),
    ("chain_loop", ERRORS, "error=\"chain_loop\""),
    ("zero_length_desc", ERRORS, "error=\"zero_length_desc\""),
    ("bad_desc_address", ERRORS, "error=\"bad_desc_address\""),
    (
        "wrong_direction_desc",
        ERRORS,
        "error=\"wrong_direction_desc\"",
    ),
    ("indirect_desc", ERRORS, "error=\"indirect_desc\""),
    ("oversized_chain", ERRORS, "error=\"oversized_chain\""),
    ("short_chain", ERRORS, "error=\"short_chain\""),
    (
        "guest_rx_no_buffers_frames",
        RX_DROPS,
        "reason=\"no_buffers\"",
    ),
    (
        "guest_rx_buffer_too_small_frames",
        RX_DROPS,
        "reason=\"buffer_too_small\"",
    ),
    (
        "guest_offload_unsupported_frames",
        RX_DROPS,
        "reason=\"offload_unsupported\"",
    ),
    ("disconnected_frames", RX_DROPS, "reason=\"disconnected\""),
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
            .map(|(field, _, label)| {
                let labels = if label.is_empty() {
                    String::new()
                } else {
                    format!(",{label}")
                };
                // A counter the status does not carry (an older data plane) is 0, as it would
                // be at the port's start: a series from the start, never a gap.
                let n = s.counters.get(*field).copied().unwrap_or(0);
                (labels, n.to_string())
            })
            .collect(),
    }
}
