//! The metric families of the exposition: name, type and help of each, in the order emitted.

/// Every metric family: name, type, help. docs/api.md lists the same names (a test checks).
pub const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vqos_info",
        "gauge",
        "Engine and version of the running switch (always 1).",
    ),
    (
        "vqos_capacity_bps",
        "gauge",
        "Uplink capacity in bit/s (absent when unlimited).",
    ),
    (
        "vqos_start_time_seconds",
        "gauge",
        "When the daemon started, seconds since the Unix epoch.",
    ),
    (
        "vqos_mac_entries",
        "gauge",
        "MAC addresses in the switch's learning table.",
    ),
    (
        "vqos_health_status",
        "gauge",
        "1 for the status GET /v1/health reports (ok; degraded: the etcd agent runs fail-static; \
         unhealthy: the forwarding loop is dead), 0 for the others.",
    ),
    (
        "vqos_forwarding_running",
        "gauge",
        "1 while the forwarding loop's thread runs, 0 once it has stopped.",
    ),
    (
        "vqos_forwarding_stats_age_seconds",
        "gauge",
        "Seconds since the forwarding loop last published its stats.",
    ),
    (
        "vqos_forwarding_stale_after_seconds",
        "gauge",
        "Stats age beyond which the forwarding loop counts as dead (unhealthy; the daemon exits).",
    ),
    (
        "vqos_port_info",
        "gauge",
        "The port and its role, vif or uplink (always 1).",
    ),
    (
        "vqos_port_rx_frames_total",
        "counter",
        "Frames read from the port.",
    ),
    (
        "vqos_port_rx_bytes_total",
        "counter",
        "Bytes read from the port.",
    ),
    (
        "vqos_port_tx_frames_total",
        "counter",
        "Frames written to the port.",
    ),
    (
        "vqos_port_tx_bytes_total",
        "counter",
        "Bytes written to the port.",
    ),
    (
        "vqos_port_tx_cut_through_total",
        "counter",
        "Frames the scheduled downlink sent to the vif without queueing them (cut-through).",
    ),
    (
        "vqos_port_drops_total",
        "counter",
        "Frames dropped, by reason.",
    ),
    (
        "vqos_port_ecn_marked_total",
        "counter",
        "Frames of the port marked ECN CE: on their way to it, or from it to the uplink.",
    ),
    (
        "vqos_port_ecn_not_ect_total",
        "counter",
        "Frames chosen for CE marking but not ECN-capable, left unmarked.",
    ),
    (
        "vqos_port_rx_errors_total",
        "counter",
        "Reads from the port that failed.",
    ),
    (
        "vqos_port_mac_learn_refused_total",
        "counter",
        "Source MACs of the port not learnt because its share of the MAC table was full.",
    ),
    (
        "vqos_port_queued_frames",
        "gauge",
        "Frames waiting in the vif's downlink queue (the scheduled downlink).",
    ),
    (
        "vqos_port_queued_bytes",
        "gauge",
        "On-wire bytes of the frames waiting in the vif's downlink queue.",
    ),
    (
        "vqos_port_credit",
        "gauge",
        "Credit or tokens left in the engine's cost unit (absent for a vif without a bucket).",
    ),
    (
        "vqos_port_throttled",
        "gauge",
        "1 while the engine refuses to serve the port.",
    ),
    (
        "vqos_vhost_user_connected",
        "gauge",
        "1 while a guest (a vhost-user frontend such as QEMU) is connected to the port.",
    ),
    (
        "vqos_vhost_user_quarantined",
        "gauge",
        "1 while the port's session is quarantined: the guest broke its rings, which the port \
         ignores until the guest reconnects.",
    ),
    (
        "vqos_vhost_user_sessions_total",
        "counter",
        "vhost-user sessions started (a frontend connected, or the port connected to it).",
    ),
    (
        "vqos_vhost_user_disconnects_total",
        "counter",
        "vhost-user sessions that ended.",
    ),
    (
        "vqos_vhost_user_connect_failures_total",
        "counter",
        "Client-mode connection attempts that failed (retried with backoff).",
    ),
    (
        "vqos_vhost_user_quarantines_total",
        "counter",
        "Sessions put in quarantine.",
    ),
    (
        "vqos_vhost_user_kicks_total",
        "counter",
        "Guest transmit notifications (kicks) passed to the poll loop.",
    ),
    (
        "vqos_vhost_user_interrupts_total",
        "counter",
        "Interrupts sent to the guest after used-ring updates.",
    ),
    (
        "vqos_vhost_user_refused_messages_total",
        "counter",
        "vhost-user messages refused because a feature they need was not negotiated.",
    ),
    (
        "vqos_vhost_user_dirty_logs_total",
        "counter",
        "Dirty-page logs the frontend handed over: live migrations started from the port.",
    ),
    (
        "vqos_vhost_user_dirty_logs_refused_total",
        "counter",
        "Dirty-page logs refused (before the memory table, empty, too large or longer than \
         their file); the session ended.",
    ),
    (
        "vqos_vhost_user_rarp_requests_total",
        "counter",
        "SEND_RARP requests after a live migration, by result: announced (a RARP from the \
         guest's MAC went through port security) or refused (a group or zero MAC).",
    ),
    (
        "vqos_vhost_user_guest_errors_total",
        "counter",
        "Malformed rings and descriptors the guest posted, by error.",
    ),
    (
        "vqos_vhost_user_guest_rx_dropped_frames_total",
        "counter",
        "Frames for the guest dropped because it could not take them, by reason.",
    ),
    (
        "vqos_vhost_user_queue_frames_total",
        "counter",
        "Frames per queue pair: read from the guest's transmit queue (from_guest), written \
         to its receive queue (to_guest).",
    ),
    (
        "vqos_controller_limit_bps",
        "gauge",
        "The fairness adjuster's limit on the vif, bit/s (absent when it sets none).",
    ),
    (
        "vqos_ecn_probability",
        "gauge",
        "The PID-ECN controller's CE-marking probability for the vif's frames, both ways.",
    ),
    ("vqos_policy_weight", "gauge", "Weight of the vif's policy."),
    (
        "vqos_policy_min_bps",
        "gauge",
        "Guaranteed minimum of the vif, bit/s.",
    ),
    (
        "vqos_policy_max_bps",
        "gauge",
        "Hard maximum of the vif, bit/s (absent when unlimited).",
    ),
    (
        "vqos_policy_priority",
        "gauge",
        "Latency priority of the vif (0 = most urgent).",
    ),
    (
        "vqos_policy_max_in_bps",
        "gauge",
        "Stated inbound maximum of the vif, bit/s (absent: the same as the max, or unlimited).",
    ),
    (
        "vqos_policy_burst_bytes",
        "gauge",
        "Stated burst above the max after idling, bytes (absent: the engine's default).",
    ),
    (
        "vqos_loop_busy_cycles_total",
        "counter",
        "Cycles the poll loop spent moving frames.",
    ),
    (
        "vqos_loop_idle_cycles_total",
        "counter",
        "Cycles the poll loop spent polling or waiting without work.",
    ),
    (
        "vqos_loop_iterations_total",
        "counter",
        "Iterations of the poll loop.",
    ),
    (
        "vqos_loop_bursts_total",
        "counter",
        "Bursts the poll loop read.",
    ),
    (
        "vqos_loop_burst_frames_total",
        "counter",
        "Frames read in those bursts.",
    ),
    (
        "vqos_loop_engine_ticks_total",
        "counter",
        "Engine ticks run.",
    ),
    (
        "vqos_loop_engine_refusals_total",
        "counter",
        "Times the engine refused every ready vif.",
    ),
    (
        "vqos_loop_capacity_waits_total",
        "counter",
        "Times the uplink capacity bucket held vif traffic back.",
    ),
    (
        "vqos_loop_commands_total",
        "counter",
        "Control commands the loop applied.",
    ),
    (
        "vqos_loop_epoll_errors_total",
        "counter",
        "Epoll waits that failed.",
    ),
    (
        "vqos_loop_epoll_wait_fallback",
        "gauge",
        "1 when the kernel refused epoll_pwait2 and the loop waits in whole milliseconds.",
    ),
];
