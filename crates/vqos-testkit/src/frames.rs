//! Ethernet frames a hostile tenant sends, built byte by byte with valid checksums so that a
//! real kernel accepts them (the attacks of the address-guard tests): gratuitous ARP, UDP
//! from a chosen source, IPv6 router and neighbour advertisements, DHCP offers, BPDUs and
//! tagged frames. No virtio-net header: prepend one where a port wants it.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The broadcast MAC.
pub const BROADCAST: [u8; 6] = [0xff; 6];
/// The IPv6 all-nodes group's MAC (33:33:00:00:00:01).
pub const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];

/// An Ethernet frame.
pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len().max(46));
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    // Padded to the 60-byte minimum, as a NIC would.
    f.resize(f.len().max(60), 0);
    f
}

/// A gratuitous ARP reply from `mac` claiming `ip`, broadcast.
pub fn garp(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    arp_reply(BROADCAST, mac, ip, BROADCAST, ip)
}

/// An ARP reply from hardware address `sha` (also the frame's source) for `spa`, to `dst`.
pub fn arp_reply(
    dst: [u8; 6],
    sha: [u8; 6],
    spa: Ipv4Addr,
    tha: [u8; 6],
    tpa: Ipv4Addr,
) -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 2];
    a.extend_from_slice(&sha);
    a.extend_from_slice(&spa.octets());
    a.extend_from_slice(&tha);
    a.extend_from_slice(&tpa.octets());
    eth(dst, sha, 0x0806, &a)
}

/// The one's-complement sum of `data` folded to 16 bits, added to `sum`.
fn fold(mut sum: u32, data: &[u8]) -> u32 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// An IPv4 UDP datagram (UDP checksum 0: none) in a frame from `src_mac` to `dst_mac`.
pub fn udp4(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ports: (u16, u16),
    data: &[u8],
) -> Vec<u8> {
    let total = (20 + 8 + data.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = !(fold(0, &ip) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&ports.0.to_be_bytes());
    ip.extend_from_slice(&ports.1.to_be_bytes());
    ip.extend_from_slice(&(8 + data.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(data);
    eth(dst_mac, src_mac, 0x0800, &ip)
}

/// A DHCPv4 offer of `yiaddr` from server `server` (router and DNS options set to it), to the
/// client with hardware address `chaddr`, broadcast.
pub fn dhcp_offer(
    src_mac: [u8; 6],
    server: Ipv4Addr,
    yiaddr: Ipv4Addr,
    chaddr: [u8; 6],
    xid: u32,
) -> Vec<u8> {
    let mut d = vec![2, 1, 6, 0];
    d.extend_from_slice(&xid.to_be_bytes());
    d.extend_from_slice(&[0; 8]); // secs, flags, ciaddr
    d.extend_from_slice(&yiaddr.octets());
    d.extend_from_slice(&server.octets());
    d.extend_from_slice(&[0; 4]); // giaddr
    d.extend_from_slice(&chaddr);
    d.extend_from_slice(&[0; 10 + 64 + 128]);
    d.extend_from_slice(&[99, 130, 83, 99, 53, 1, 2, 54, 4]);
    d.extend_from_slice(&server.octets());
    d.extend_from_slice(&[1, 4, 255, 255, 255, 0, 3, 4]);
    d.extend_from_slice(&server.octets());
    d.extend_from_slice(&[6, 4]);
    d.extend_from_slice(&server.octets());
    d.extend_from_slice(&[51, 4, 0, 0, 0x0e, 0x10, 255]);
    udp4(
        BROADCAST,
        src_mac,
        server,
        Ipv4Addr::BROADCAST,
        (67, 68),
        &d,
    )
}

/// An ICMPv6 message (`body` from its type byte, checksum field zero) from `src` to `dst` in
/// a frame, hop limit 255, checksum computed.
pub fn icmp6(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    body: &[u8],
) -> Vec<u8> {
    let len = body.len() as u32;
    let mut pseudo = Vec::with_capacity(40);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&len.to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    let sum = !(fold(fold(0, &pseudo), body) as u16);
    let mut msg = body.to_vec();
    msg[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(len as u16).to_be_bytes());
    ip.extend_from_slice(&[58, 255]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&msg);
    eth(dst_mac, src_mac, 0x86dd, &ip)
}

/// A router advertisement from `mac` / link-local `src` to all nodes: default router for 30
/// minutes, with a prefix information option for `prefix`/64 (on-link, autonomous).
pub fn router_advertisement(mac: [u8; 6], src: Ipv6Addr, prefix: Ipv6Addr) -> Vec<u8> {
    let mut b = vec![134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
    // Source link-layer address option.
    b.extend_from_slice(&[1, 1]);
    b.extend_from_slice(&mac);
    // Prefix information: length 4 (32 bytes), /64, L and A, lifetimes 1 day.
    b.extend_from_slice(&[3, 4, 64, 0xc0]);
    b.extend_from_slice(&86_400u32.to_be_bytes());
    b.extend_from_slice(&86_400u32.to_be_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&prefix.octets());
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    icmp6(ALL_NODES_MAC, mac, src, all_nodes, &b)
}

/// An unsolicited neighbour advertisement (override set) from `mac` / `src` claiming that
/// `target` is at `mac`, to all nodes.
pub fn neighbour_advertisement(mac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut b = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
    b.extend_from_slice(&target.octets());
    // Target link-layer address option.
    b.extend_from_slice(&[2, 1]);
    b.extend_from_slice(&mac);
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    icmp6(ALL_NODES_MAC, mac, src, all_nodes, &b)
}

/// An STP configuration BPDU from `mac` (802.3 length + LLC, to 01:80:c2:00:00:00).
pub fn bpdu(mac: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0x01, 0x80, 0xc2, 0, 0, 0];
    f.extend_from_slice(&mac);
    f.extend_from_slice(&38u16.to_be_bytes());
    f.extend_from_slice(&[0x42, 0x42, 0x03, 0, 0, 0, 0]);
    f.resize(60, 0);
    f
}

/// `inner` (an Ethernet frame) with an 802.1Q tag of `vid` after its addresses.
pub fn tagged(inner: &[u8], vid: u16) -> Vec<u8> {
    let mut f = inner[..12].to_vec();
    f.extend_from_slice(&[0x81, 0x00]);
    f.extend_from_slice(&(vid & 0xfff).to_be_bytes());
    f.extend_from_slice(&inner[12..]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify_to_zero() {
        let f = udp4(
            BROADCAST,
            [2; 6],
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            (1, 2),
            b"x",
        );
        assert_eq!(fold(0, &f[14..34]), 0xffff, "IPv4 header");
        let ll = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
        let ra = router_advertisement([2; 6], ll, Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0));
        let body = &ra[54..];
        let mut pseudo = ra[22..54].to_vec();
        pseudo.extend_from_slice(&(body.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        assert_eq!(fold(fold(0, &pseudo), body), 0xffff, "ICMPv6");
        assert_eq!(tagged(&ra, 5)[12..16], [0x81, 0, 0, 5]);
        assert_eq!(bpdu([2; 6]).len(), 60);
    }
}
