//! What a port kind reports beyond the switch's counters ([`PortStatus`]): a vhost-user port's
//! session ([`VhostUserStatus`], [`VhostUserCounters`]), an `AF_PACKET` port's socket
//! ([`AfPacketStatus`]) and a multiqueue TAP's queues ([`TapStatus`]). The data plane's ports
//! fill these types themselves (`Port::status`).

use serde::{Deserialize, Serialize};

use crate::port::VhostUserRole;

/// What a port kind reports beyond its counters ([`super::PortStats::status`]), serialised
/// under the kind's name: `"vhost_user": {...}`, `"af_packet": {...}` or `"tap": {...}` beside
/// the port's counters. (A status that does not parse, from another version of the daemon,
/// reads as none.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortStatus {
    /// A vhost-user port: connection, features, the guest's misbehaviour counters.
    VhostUser(Box<VhostUserStatus>),
    /// An `AF_PACKET` port (the uplink on an existing interface).
    AfPacket(AfPacketStatus),
    /// A multiqueue TAP (`queues` above 1): frames read per queue.
    Tap(TapStatus),
}

impl PortStatus {
    /// The vhost-user status, `None` for another kind.
    pub fn vhost_user(&self) -> Option<&VhostUserStatus> {
        match self {
            PortStatus::VhostUser(s) => Some(s),
            PortStatus::AfPacket(_) | PortStatus::Tap(_) => None,
        }
    }
}

/// A multiqueue TAP's queues.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapStatus {
    /// Frames read from each queue, by queue index: how the kernel spread what the guest's
    /// side sent.
    pub queue_rx_frames: Vec<u64>,
    /// Times one of its queues was held for its read budget (the uplink's: what the network
    /// sent toward a vif faster than 150 % of its inbound max was left to the kernel, which
    /// drops what does not fit; docs/dataplane.md).
    #[serde(default)]
    pub budget_holds: u64,
}

impl TapStatus {
    /// Adds another shard's counts of the same TAP's queues (a queue lent to it), by index.
    pub fn add(&mut self, o: &TapStatus) {
        if self.queue_rx_frames.len() < o.queue_rx_frames.len() {
            self.queue_rx_frames.resize(o.queue_rx_frames.len(), 0);
        }
        for (a, b) in self.queue_rx_frames.iter_mut().zip(&o.queue_rx_frames) {
            *a += b;
        }
        self.budget_holds += o.budget_holds;
    }
}

/// A vhost-user port's session: connection, features, the guest's misbehaviour counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostUserStatus {
    /// Port name.
    pub name: String,
    /// Socket role.
    pub mode: VhostUserRole,
    /// Socket path.
    pub socket: String,
    /// A frontend is connected.
    pub connected: bool,
    /// The session is quarantined (the guest's rings ignored until it reconnects).
    pub quarantined: bool,
    /// Virtio feature bits the frontend acknowledged (0 when not connected).
    #[serde(default)]
    pub negotiated_features: u64,
    /// Their names (`VERSION_1`, `MRG_RXBUF`, ...).
    #[serde(default)]
    pub feature_names: Vec<String>,
    /// Frames the switch read from the guest.
    #[serde(default)]
    pub rx_frames: u64,
    /// Bytes the switch read from the guest, virtio-net headers included.
    #[serde(default)]
    pub rx_bytes: u64,
    /// Frames the switch wrote to the guest.
    #[serde(default)]
    pub tx_frames: u64,
    /// Bytes the switch wrote to the guest, virtio-net headers included.
    #[serde(default)]
    pub tx_bytes: u64,
    /// Why the last session ended, if the vhost-user library reported an error (a message it
    /// refused, a mapping that failed), or, in the client role, why the last connection
    /// attempt failed; `None` after clean disconnects.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Queue pairs offered.
    #[serde(default)]
    pub queues: u16,
    /// Per queue pair: `[frames read from its TX queue, frames written to its RX queue]`.
    #[serde(default)]
    pub pair_frames: Vec<[u64; 2]>,
    /// The session and misbehaviour counters.
    #[serde(default)]
    pub counters: VhostUserCounters,
}

/// Counters of one vhost-user port, accumulated over every session of the port.
///
/// "Guest TX" is the guest's transmit queue (frames the switch reads from the port), "guest RX"
/// its receive queue (frames the switch writes to the port). The fields are in name order, the
/// order of their JSON (it was a sorted map); a counter missing from the JSON (an older daemon)
/// reads as 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VhostUserCounters {
    /// The avail index ran more than a ring size ahead of us (ring corrupt: quarantine).
    pub bad_avail_index: u64,
    /// A descriptor whose buffer lies (partly) outside guest memory (in a hole between regions,
    /// past the end) or whose address overflows.
    pub bad_desc_address: u64,
    /// A ring (descriptor table, avail or used ring) lies outside guest memory, across two
    /// memory regions, or misaligned in host memory (quarantine).
    pub bad_ring_address: u64,
    /// A chain longer than the ring (a loop in the descriptor table).
    pub chain_loop: u64,
    /// Client mode: connection attempts that failed (then retried with backoff).
    pub connect_failures: u64,
    /// Dirty logs the frontend handed over (`SET_LOG_BASE`): live migrations of the guest
    /// started from this port.
    pub dirty_logs: u64,
    /// Dirty logs refused (`SET_LOG_BASE` before the memory table, or a log that is empty,
    /// too large or longer than its file): the session ended.
    #[serde(default)]
    pub dirty_logs_refused: u64,
    /// Frames for the guest lost because no guest was connected, its receive ring was not
    /// started, or the session was quarantined.
    pub disconnected_frames: u64,
    /// Sessions that ended (the frontend went away or the port was stopped).
    pub disconnects: u64,
    /// Frames for the guest lost because they carry an offload (GSO type, partial checksum)
    /// the guest did not negotiate.
    pub guest_offload_unsupported_frames: u64,
    /// Frames for the guest lost because its receive chain was too small (without
    /// `VIRTIO_NET_F_MRG_RXBUF`).
    pub guest_rx_buffer_too_small_frames: u64,
    /// Frames for the guest lost because it posted no (or too few) receive buffers: a guest
    /// that stopped consuming.
    pub guest_rx_no_buffers_frames: u64,
    /// A chain head read from the avail ring is not below the ring size.
    pub head_out_of_range: u64,
    /// An indirect descriptor (`VIRTIO_RING_F_INDIRECT_DESC` is not offered).
    pub indirect_desc: u64,
    /// Interrupts (call eventfd writes) sent to the guest after used-ring updates.
    pub interrupts: u64,
    /// Guest TX notifications (kicks) the protocol thread forwarded to the loop.
    pub kicks: u64,
    /// A descriptor's `next` is not below the ring size.
    pub next_out_of_range: u64,
    /// A guest TX chain longer than the longest frame (dropped).
    pub oversized_chain: u64,
    /// Sessions put in quarantine: the port stopped using the guest's rings until it reconnects.
    pub quarantines: u64,
    /// `SEND_RARP` requests accepted (after a live migration, the destination's frontend asks
    /// for the guest to be announced): a RARP frame from the guest's MAC was put in the
    /// port's next batch, where port security decides on it like on any frame (another
    /// guest's MAC is dropped as `spoofed`).
    pub rarp_announces: u64,
    /// `SEND_RARP` requests refused: a group or zero MAC.
    pub rarp_refused: u64,
    /// vhost-user messages refused and skipped: a feature they need was not yet negotiated
    /// (QEMU's `SET_VRING_ENABLE` before `SET_FEATURES`), or they name a vring the port did
    /// not offer (a guest asking for more queue pairs than its `queues`).
    pub refused_messages: u64,
    /// Sessions started (a frontend connected, or we connected to it).
    pub sessions: u64,
    /// A guest TX chain shorter than the virtio-net header (dropped).
    pub short_chain: u64,
    /// A write-only descriptor in a guest TX chain, or a read-only one in a guest RX chain.
    pub wrong_direction_desc: u64,
    /// A descriptor of length zero.
    pub zero_length_desc: u64,
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

/// An `AF_PACKET` port's socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfPacketStatus {
    /// The interface's index.
    pub ifindex: u32,
    /// Bytes of the virtio-net header the kernel uses: 12, or 10 on kernels before 6.2.
    pub vnet_hdr_bytes: u64,
    /// Frames skip the qdisc.
    pub qdisc_bypass: bool,
    /// Frames the kernel dropped because the socket's receive buffer was full.
    pub kernel_drops: u64,
    /// Frames addressed to the interface's own MAC (the host's), not read.
    pub skipped_host: u64,
    /// Frames the host sent on the interface, not read.
    pub skipped_outgoing: u64,
    /// Sockets reading the interface: 1 for the uplink on one shard, one per shard when its
    /// arrivals are spread over the shards (fanout), 0 for a transmit queue.
    #[serde(default)]
    pub readers: u32,
}

impl AfPacketStatus {
    /// Adds another reader's counts (the same interface read by another shard).
    pub fn add(&mut self, o: &AfPacketStatus) {
        self.kernel_drops += o.kernel_drops;
        self.skipped_host += o.skipped_host;
        self.skipped_outgoing += o.skipped_outgoing;
        self.readers += o.readers;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters serialise in name order, as the sorted map they were in the API, and a
    /// counter an older daemon did not send reads as 0.
    #[test]
    fn vhost_user_counters_are_in_name_order_and_default_to_zero() {
        let json = serde_json::to_string(&VhostUserCounters::default()).unwrap();
        let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&json).unwrap();
        let keys: Vec<&String> = map.keys().collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted, "{json}");
        let old: VhostUserCounters = serde_json::from_str(r#"{"sessions": 2}"#).unwrap();
        assert_eq!(
            old,
            VhostUserCounters {
                sessions: 2,
                ..Default::default()
            }
        );
    }

    #[test]
    fn an_af_packet_readers_counts_add_up() {
        let mut a = AfPacketStatus {
            ifindex: 2,
            vnet_hdr_bytes: 12,
            qdisc_bypass: true,
            kernel_drops: 1,
            skipped_host: 2,
            skipped_outgoing: 3,
            readers: 1,
        };
        a.add(&AfPacketStatus {
            kernel_drops: 10,
            skipped_host: 20,
            skipped_outgoing: 30,
            readers: 1,
            ..a
        });
        assert_eq!(
            (
                a.kernel_drops,
                a.skipped_host,
                a.skipped_outgoing,
                a.readers
            ),
            (11, 22, 33, 2)
        );
        assert_eq!((a.ifindex, a.vnet_hdr_bytes), (2, 12));
    }
}
