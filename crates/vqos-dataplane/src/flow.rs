//! Which flow a frame belongs to, for the flow queues of a vif's downlink queue
//! ([`vqos_sched::fq`]).
//!
//! A flow is what the receiving guest's transport sees as one: for IPv4 and IPv6, the source
//! and destination addresses, the protocol and, for TCP, UDP, UDP-Lite and SCTP, the ports
//! (IPv4 fragments after the first, which carry no ports, and the first, hash by addresses and
//! protocol alone, so that every fragment of a datagram stays in one flow); for anything else,
//! the two MAC addresses and the EtherType. One 802.1Q tag is looked through.
//!
//! The hash is seeded: each downlink draws its seed at random when it is made, so a sender
//! outside cannot choose flows that share a victim's flow queue (fq_codel's perturbation).
//! It is a multiply–xorshift over the key's 64-bit words, written here rather than taken from
//! a crate because it runs once per queued frame over at most 40 bytes and needs no more than
//! spreading, not resistance to an attacker who sees the seed (they do not).

/// The multiplier of the mix (2^64 / golden ratio, odd).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Mixes one word into `h`.
#[inline]
fn mix(h: u64, w: u64) -> u64 {
    let h = (h ^ w).wrapping_mul(K);
    h ^ (h >> 29)
}

/// Mixes `bytes` into `h`, 8 at a time (the last word zero-padded).
#[inline]
fn mix_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = mix(h, u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = mix(h, u64::from_le_bytes(w));
    }
    h
}

/// True for the protocols whose first 4 bytes are the source and destination ports.
fn has_ports(proto: u8) -> bool {
    matches!(proto, 6 | 17 | 132 | 136)
}

/// The flow of Ethernet frame `eth` (no virtio-net header), hashed with `seed`.
pub fn flow_hash(eth: &[u8], seed: u64) -> u32 {
    let h = key_hash(eth, seed).unwrap_or_else(|| {
        // Not IP, or too short for its header: the MACs and the EtherType.
        mix_bytes(mix(seed, 1), &eth[..eth.len().min(14)])
    });
    (h >> 32) as u32
}

/// The hash of an IP frame's flow key, `None` for anything else.
fn key_hash(eth: &[u8], seed: u64) -> Option<u64> {
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([*eth.get(off)?, *eth.get(off + 1)?]);
    if ethertype == 0x8100 {
        off += 4;
        ethertype = u16::from_be_bytes([*eth.get(off)?, *eth.get(off + 1)?]);
    }
    let ip = eth.get(off + 2..)?;
    match ethertype {
        0x0800 => {
            let ihl = usize::from(*ip.first()? & 0x0f) * 4;
            if ip[0] >> 4 != 4 || ihl < 20 || ip.len() < ihl {
                return None;
            }
            let proto = ip[9];
            let h = mix_bytes(mix(seed, 4 << 8 | u64::from(proto)), &ip[12..20]);
            let fragmented = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
            Some(match ip.get(ihl..ihl + 4) {
                Some(ports) if has_ports(proto) && !fragmented => mix_bytes(h, ports),
                _ => h,
            })
        }
        0x86dd => {
            if ip.len() < 40 || ip[0] >> 4 != 6 {
                return None;
            }
            let next = ip[6];
            let h = mix_bytes(mix(seed, 6 << 8 | u64::from(next)), &ip[8..40]);
            Some(match ip.get(40..44) {
                Some(ports) if has_ports(next) => mix_bytes(h, ports),
                _ => h,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build_frame, ipv4_header, VnetHdr, VNET_HDR_LEN};

    /// An IPv4 frame from 10.0.0.1 to 10.0.0.`dst`, protocol `proto`, ports `sport` → 80.
    fn v4(dst: u8, proto: u8, sport: u16, frag: u16) -> Vec<u8> {
        let mut ip = ipv4_header(0, 40).to_vec();
        ip[6..8].copy_from_slice(&frag.to_be_bytes());
        ip[9] = proto;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, dst]);
        ip.extend_from_slice(&sport.to_be_bytes());
        ip.extend_from_slice(&80u16.to_be_bytes());
        ip.extend_from_slice(&[0u8; 16]);
        let f = build_frame(
            VnetHdr::default(),
            0x0200_0000_0002,
            0x0200_0000_0001,
            0x0800,
            &ip,
        );
        f[VNET_HDR_LEN..].to_vec()
    }

    #[test]
    fn addresses_protocol_and_ports_make_a_flow_and_nothing_else_does() {
        let s = 42;
        let a = flow_hash(&v4(2, 6, 5000, 0), s);
        assert_eq!(a, flow_hash(&v4(2, 6, 5000, 0), s), "deterministic");
        assert_ne!(a, flow_hash(&v4(2, 6, 5001, 0), s), "source port");
        assert_ne!(a, flow_hash(&v4(3, 6, 5000, 0), s), "destination");
        assert_ne!(a, flow_hash(&v4(2, 17, 5000, 0), s), "protocol");
        assert_ne!(a, flow_hash(&v4(2, 6, 5000, 0), s + 1), "seed");
        // The payload is not part of the flow.
        let mut other = v4(2, 6, 5000, 0);
        *other.last_mut().unwrap() ^= 0xff;
        assert_eq!(a, flow_hash(&other, s));
        // Fragments of one datagram (the first has the MF bit, the others an offset) are
        // one flow, whatever their "ports" bytes say; ICMP has no ports.
        let first = flow_hash(&v4(2, 17, 5000, 0x2000), s);
        assert_eq!(first, flow_hash(&v4(2, 17, 999, 0x0010), s));
        assert_eq!(
            flow_hash(&v4(2, 1, 5000, 0), s),
            flow_hash(&v4(2, 1, 7, 0), s)
        );
    }

    #[test]
    fn a_vlan_tag_is_looked_through_and_ipv6_and_other_frames_hash_too() {
        let plain = v4(2, 6, 5000, 0);
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&plain[12..]);
        assert_eq!(flow_hash(&plain, 7), flow_hash(&tagged, 7));
        let mut v6 = vec![0u8; 14 + 40 + 8];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[14] = 0x60;
        v6[14 + 6] = 17;
        v6[14 + 40..14 + 42].copy_from_slice(&5000u16.to_be_bytes());
        let a = flow_hash(&v6, 7);
        v6[14 + 41] = 1;
        assert_ne!(a, flow_hash(&v6, 7));
        // ARP, and frames too short for their header, fall back to the MACs.
        let arp = [&[0xffu8; 6][..], &[2, 0, 0, 0, 0, 9], &[0x08, 0x06]].concat();
        let mut other = arp.clone();
        other[11] = 8;
        assert_ne!(flow_hash(&arp, 7), flow_hash(&other, 7));
        assert_eq!(flow_hash(&[], 7), flow_hash(&[], 7));
        let short_v4 = [&plain[..14], &[0x45u8, 0][..]].concat();
        let _ = flow_hash(&short_v4, 7);
    }
}
