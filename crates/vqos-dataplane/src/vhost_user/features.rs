//! The virtio and vhost-user features a vhost-user port offers, and what follows from the ones
//! the frontend accepted.

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use virtio_bindings::bindings::virtio_config::{VIRTIO_F_IN_ORDER, VIRTIO_F_VERSION_1};
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use crate::frame::{
    VnetHdr, VNET_F_NEEDS_CSUM, VNET_GSO_ECN, VNET_GSO_NONE, VNET_GSO_TCPV4, VNET_GSO_TCPV6,
};

/// Bit `n` of a feature word.
const fn bit(n: u32) -> u64 {
    1u64 << n
}

/// `VIRTIO_F_VERSION_1`.
pub const F_VERSION_1: u64 = bit(VIRTIO_F_VERSION_1);
/// `VIRTIO_F_IN_ORDER`: the device uses buffers in the order the driver made them available.
pub const F_IN_ORDER: u64 = bit(VIRTIO_F_IN_ORDER);
/// `VIRTIO_NET_F_MRG_RXBUF`: a received frame may span several receive chains.
pub const F_MRG_RXBUF: u64 = bit(VIRTIO_NET_F_MRG_RXBUF);
/// `VIRTIO_NET_F_CSUM`: the guest may send frames with a partial checksum.
pub const F_CSUM: u64 = bit(VIRTIO_NET_F_CSUM);
/// `VIRTIO_NET_F_GUEST_CSUM`: the guest accepts frames with a partial checksum.
pub const F_GUEST_CSUM: u64 = bit(VIRTIO_NET_F_GUEST_CSUM);
/// `VIRTIO_NET_F_HOST_TSO4`: the guest may send TCPv4 GSO super-frames.
pub const F_HOST_TSO4: u64 = bit(VIRTIO_NET_F_HOST_TSO4);
/// `VIRTIO_NET_F_HOST_TSO6`: the guest may send TCPv6 GSO super-frames.
pub const F_HOST_TSO6: u64 = bit(VIRTIO_NET_F_HOST_TSO6);
/// `VIRTIO_NET_F_HOST_ECN`: the guest may send GSO frames with the ECN bit.
pub const F_HOST_ECN: u64 = bit(VIRTIO_NET_F_HOST_ECN);
/// `VIRTIO_NET_F_GUEST_TSO4`: the guest accepts TCPv4 GSO super-frames.
pub const F_GUEST_TSO4: u64 = bit(VIRTIO_NET_F_GUEST_TSO4);
/// `VIRTIO_NET_F_GUEST_TSO6`: the guest accepts TCPv6 GSO super-frames.
pub const F_GUEST_TSO6: u64 = bit(VIRTIO_NET_F_GUEST_TSO6);
/// `VIRTIO_NET_F_GUEST_ECN`: the guest accepts GSO frames with the ECN bit.
pub const F_GUEST_ECN: u64 = bit(VIRTIO_NET_F_GUEST_ECN);
/// `VIRTIO_RING_F_EVENT_IDX`: notifications suppressed with the used/avail event indexes.
pub const F_EVENT_IDX: u64 = bit(VIRTIO_RING_F_EVENT_IDX);
/// `VIRTIO_NET_F_MQ`: several queue pairs (offered when the port has more than one).
pub const F_MQ: u64 = bit(VIRTIO_NET_F_MQ);
/// `VHOST_F_LOG_ALL`: the frontend may ask for every write into guest memory to be logged
/// (a live migration; the log comes with `SET_LOG_BASE`).
pub const F_LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();
/// `VHOST_USER_F_PROTOCOL_FEATURES`.
pub const F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// Every virtio feature the port offers. The offloads are exactly those of the TAP ports
/// (partial checksum, TCP segmentation with ECN), so frames cross the switch unchanged.
/// `LOG_ALL` is offered for live migration (QEMU blocks migrating a guest whose backend lacks
/// it). `IN_ORDER` is offered because the data path already keeps it: both directions take
/// chains in the order the guest made them available and give each back in that order (a
/// malformed chain too, with length 0; a frame that does not fit leaves its chains available),
/// so a driver such as DPDK's virtio PMD may take its simpler in-order paths. Not offered:
/// `INDIRECT_DESC`, `CTRL_VQ` (QEMU answers the guest's control queue
/// itself, and enables the pairs the guest asks for with `SET_VRING_ENABLE`), `MAC`,
/// `STATUS`, UFO. `MQ` is added by [`offered_features`] for a port with
/// several queue pairs. `VHOST_USER_F_PROTOCOL_FEATURES` is offered: QEMU 7.2 fails
/// to start a vhost-user net device without it (`vhost_set_vring_enable` returns EINVAL).
pub const OFFERED_FEATURES: u64 = F_VERSION_1
    | F_MRG_RXBUF
    | F_CSUM
    | F_GUEST_CSUM
    | F_HOST_TSO4
    | F_HOST_TSO6
    | F_HOST_ECN
    | F_GUEST_TSO4
    | F_GUEST_TSO6
    | F_GUEST_ECN
    | F_EVENT_IDX
    | F_IN_ORDER
    | F_LOG_ALL
    | F_PROTOCOL_FEATURES;

/// The virtio features a port with `queues` queue pairs offers: [`OFFERED_FEATURES`], and
/// `MQ` when `queues > 1` (a one-pair port offers exactly what it did before `MQ` existed).
pub fn offered_features(queues: u16) -> u64 {
    if queues > 1 {
        OFFERED_FEATURES | F_MQ
    } else {
        OFFERED_FEATURES
    }
}

/// vhost-user protocol features offered: `REPLY_ACK` (the frontend may ask for an
/// acknowledgement of every message), `MQ` (`GET_QUEUE_NUM` says how many queue pairs the
/// port has, so QEMU refuses `queues=N` above it at start instead of failing later),
/// `LOG_SHMFD` (the dirty log is a shared memory file, `SET_LOG_BASE`) and `RARP` (after a
/// live migration `SEND_RARP` announces the guest, `vhost_user/rarp.rs`). Guest memory comes
/// whole with `SET_MEM_TABLE` (no `CONFIGURE_MEM_SLOTS`), no config space.
pub fn offered_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::LOG_SHMFD
        | VhostUserProtocolFeatures::RARP
}

/// Names of the known feature bits set in `features` (for status output).
pub fn names(features: u64) -> Vec<&'static str> {
    const NAMES: [(u64, &str); 15] = [
        (F_VERSION_1, "VERSION_1"),
        (F_MRG_RXBUF, "MRG_RXBUF"),
        (F_CSUM, "CSUM"),
        (F_GUEST_CSUM, "GUEST_CSUM"),
        (F_HOST_TSO4, "HOST_TSO4"),
        (F_HOST_TSO6, "HOST_TSO6"),
        (F_HOST_ECN, "HOST_ECN"),
        (F_GUEST_TSO4, "GUEST_TSO4"),
        (F_GUEST_TSO6, "GUEST_TSO6"),
        (F_GUEST_ECN, "GUEST_ECN"),
        (F_EVENT_IDX, "EVENT_IDX"),
        (F_IN_ORDER, "IN_ORDER"),
        (F_MQ, "MQ"),
        (F_LOG_ALL, "LOG_ALL"),
        (F_PROTOCOL_FEATURES, "PROTOCOL_FEATURES"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| features & b != 0)
        .map(|&(_, n)| n)
        .collect()
}

/// Bytes of the virtio-net header on the guest's side: 12 with `VERSION_1` or `MRG_RXBUF`
/// (`virtio_net_hdr_mrg_rxbuf`, the data plane's own layout), else 10 (legacy
/// `virtio_net_hdr`, converted by the port).
pub fn guest_hdr_len(features: u64) -> usize {
    if features & (F_VERSION_1 | F_MRG_RXBUF) != 0 {
        12
    } else {
        10
    }
}

/// Whether a guest that negotiated `features` can receive a frame with header `hdr`: a GSO
/// type needs the matching `GUEST_TSO*` (and `GUEST_ECN` for the ECN bit), a partial checksum
/// needs `GUEST_CSUM`. The port does not segment nor checksum in software.
pub fn guest_accepts(features: u64, hdr: &VnetHdr) -> bool {
    if hdr.flags & VNET_F_NEEDS_CSUM != 0 && features & F_GUEST_CSUM == 0 {
        return false;
    }
    if hdr.gso_type & VNET_GSO_ECN != 0 && features & F_GUEST_ECN == 0 {
        return false;
    }
    match hdr.gso_type & !VNET_GSO_ECN {
        VNET_GSO_NONE => true,
        VNET_GSO_TCPV4 => features & F_GUEST_TSO4 != 0,
        VNET_GSO_TCPV6 => features & F_GUEST_TSO6 != 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_length_follows_version_1_or_mergeable_buffers() {
        assert_eq!(guest_hdr_len(F_VERSION_1), 12);
        assert_eq!(guest_hdr_len(F_MRG_RXBUF), 12);
        assert_eq!(guest_hdr_len(F_EVENT_IDX), 10);
    }

    #[test]
    fn offloads_need_their_guest_feature() {
        let tso4 = VnetHdr {
            flags: VNET_F_NEEDS_CSUM,
            gso_type: VNET_GSO_TCPV4,
            ..VnetHdr::default()
        };
        assert!(guest_accepts(0, &VnetHdr::default()));
        assert!(!guest_accepts(F_GUEST_CSUM, &tso4));
        assert!(!guest_accepts(F_GUEST_TSO4, &tso4));
        assert!(guest_accepts(F_GUEST_CSUM | F_GUEST_TSO4, &tso4));
        let ecn6 = VnetHdr {
            gso_type: VNET_GSO_TCPV6 | VNET_GSO_ECN,
            ..VnetHdr::default()
        };
        assert!(!guest_accepts(F_GUEST_TSO6, &ecn6));
        assert!(guest_accepts(F_GUEST_TSO6 | F_GUEST_ECN, &ecn6));
        assert_eq!(OFFERED_FEATURES & bit(28), 0, "no indirect descriptors");
    }
}
