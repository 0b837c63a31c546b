use super::*;
use crate::frame::mac_key;

const SRC: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const DST: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
const NONE: Services = Services {
    router: false,
    dhcp_server: false,
};

fn eth(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = DST.to_vec();
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn arp(sha: [u8; 6], spa: [u8; 4]) -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 2];
    a.extend_from_slice(&sha);
    a.extend_from_slice(&spa);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&[10, 0, 0, 9]);
    eth(ETH_ARP, &a)
}

fn udp4(src: [u8; 4], sport: u16, dport: u16, frag: u16) -> Vec<u8> {
    let mut ip = vec![0x45, 0, 0, 28, 0, 0];
    ip.extend_from_slice(&frag.to_be_bytes());
    ip.extend_from_slice(&[64, IPPROTO_UDP, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&[255, 255, 255, 255]);
    ip.extend_from_slice(&sport.to_be_bytes());
    ip.extend_from_slice(&dport.to_be_bytes());
    ip.extend_from_slice(&[0, 8, 0, 0]);
    eth(ETH_IPV4, &ip)
}

/// An IPv6 packet from `src` with the extension headers `ext` (each: its kind, 8 bytes)
/// before `proto`'s `payload`.
fn ip6(src: u128, ext: &[(u8, [u8; 8])], proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x60, 0, 0, 0, 0, 0];
    ip.push(ext.first().map_or(proto, |e| e.0));
    ip.push(255);
    ip.extend_from_slice(&src.to_be_bytes());
    ip.extend_from_slice(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    for (k, (_, body)) in ext.iter().enumerate() {
        let mut h = *body;
        h[0] = ext.get(k + 1).map_or(proto, |e| e.0);
        ip.extend_from_slice(&h);
    }
    ip.extend_from_slice(payload);
    eth(ETH_IPV6, &ip)
}

fn icmp6(kind: u8, target: u128) -> Vec<u8> {
    let mut p = vec![kind, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&target.to_be_bytes());
    p
}

const LL_A: u128 = 0xfe80_0000_0000_0000_0000_0000_0000_000a;
const LL_B: u128 = 0xfe80_0000_0000_0000_0000_0000_0000_000b;

fn claims(f: &[u8], s: Services) -> Result<Vec<(IpKey, DropReason)>, DropReason> {
    inspect(f, mac_key(&SRC), s).map(|c| c.iter().collect())
}

#[test]
fn arp_claims_its_sender_ip_and_must_carry_the_frames_source_mac() {
    let f = arp(SRC, [10, 0, 0, 2]);
    assert_eq!(
        claims(&f, NONE),
        Ok(vec![(ipv4_key([10, 0, 0, 2]), DropReason::ArpSpoofed)])
    );
    // A probe claims nothing; another station's hardware address is refused.
    assert_eq!(claims(&arp(SRC, [0; 4]), NONE), Ok(vec![]));
    assert_eq!(
        claims(&arp(DST, [10, 0, 0, 2]), NONE),
        Err(DropReason::ArpSpoofed)
    );
    assert_eq!(announced(&f), Some(ipv4_key([10, 0, 0, 2])));
    assert_eq!(announced(&arp(SRC, [0; 4])), None);
}

#[test]
fn ipv4_claims_its_source_and_dhcp_servers_need_the_right() {
    let client = udp4([0; 4], 68, 67, 0);
    assert_eq!(
        claims(&client, NONE),
        Ok(vec![]),
        "DHCP discover from 0.0.0.0"
    );
    let offer = udp4([10, 0, 0, 5], 67, 68, 0);
    assert_eq!(claims(&offer, NONE), Err(DropReason::RogueDhcp));
    let server = Services {
        dhcp_server: true,
        ..NONE
    };
    assert_eq!(
        claims(&offer, server),
        Ok(vec![(ipv4_key([10, 0, 0, 5]), DropReason::IpSpoofed)])
    );
    // Not a first fragment: its bytes at the port's offset are data, not a port.
    assert_eq!(
        claims(&udp4([10, 0, 0, 5], 67, 68, 185), NONE).map(|c| c.len()),
        Ok(1)
    );
    assert_eq!(
        claims(&udp4([0; 4], 5, 6, 0), NONE),
        Err(DropReason::IpSpoofed)
    );
    assert_eq!(
        claims(&udp4([10, 0, 0, 255], 5, 6, 0), NONE).map(|c| is_group_ip(c[0].0)),
        Ok(false)
    );
    assert!(is_group_ip(ipv4_key([224, 0, 0, 1])));
    assert!(is_group_ip(ipv4_key([255; 4])));
}

#[test]
fn router_advertisements_and_redirects_need_the_right_even_behind_extension_headers() {
    let router = Services {
        router: true,
        ..NONE
    };
    for kind in [134, 137] {
        let ra = ip6(LL_A, &[], IPPROTO_ICMPV6, &icmp6(kind, 0));
        assert_eq!(
            claims(&ra, NONE),
            Err(DropReason::RogueRouter),
            "type {kind}"
        );
        assert_eq!(claims(&ra, router).map(|c| c.len()), Ok(1));
        // Hop-by-hop, destination options and a first fragment before it: still seen.
        let hidden = ip6(
            LL_A,
            &[(0, [0; 8]), (60, [0; 8]), (44, [0; 8])],
            IPPROTO_ICMPV6,
            &icmp6(kind, 0),
        );
        assert_eq!(claims(&hidden, NONE), Err(DropReason::RogueRouter));
    }
    // A header chain that runs past the packet is refused (RFC 7113).
    let mut cut = ip6(LL_A, &[(60, [0, 4, 0, 0, 0, 0, 0, 0])], IPPROTO_ICMPV6, &[]);
    cut.truncate(cut.len() - 2);
    assert_eq!(claims(&cut, NONE), Err(DropReason::RogueRouter));
    // A later fragment carries no upper-layer header: only its source is claimed.
    let later = ip6(
        LL_A,
        &[(44, [0, 0, 0, 8, 0, 0, 0, 1])],
        IPPROTO_ICMPV6,
        &[134],
    );
    assert_eq!(
        claims(&later, NONE),
        Ok(vec![(LL_A, DropReason::IpSpoofed)])
    );
    // A neighbour solicitation and an echo pass with their source claimed.
    let ns = ip6(LL_A, &[], IPPROTO_ICMPV6, &icmp6(135, LL_B));
    assert_eq!(claims(&ns, NONE), Ok(vec![(LL_A, DropReason::IpSpoofed)]));
}

#[test]
fn neighbour_advertisements_claim_their_target_and_dad_claims_nothing() {
    let na = ip6(LL_A, &[], IPPROTO_ICMPV6, &icmp6(136, LL_B));
    assert_eq!(
        claims(&na, NONE),
        Ok(vec![
            (LL_A, DropReason::IpSpoofed),
            (LL_B, DropReason::NdSpoofed)
        ])
    );
    assert_eq!(announced(&na), Some(LL_B));
    let dad = ip6(0, &[], IPPROTO_ICMPV6, &icmp6(135, LL_A));
    assert_eq!(claims(&dad, NONE), Ok(vec![]));
    let udp_from_nowhere = ip6(0, &[], IPPROTO_UDP, &[0, 5, 0, 6, 0, 8, 0, 0]);
    assert_eq!(claims(&udp_from_nowhere, NONE), Err(DropReason::IpSpoofed));
    let dhcp6 = ip6(LL_A, &[], IPPROTO_UDP, &[2, 0x23, 2, 0x22, 0, 8, 0, 0]);
    assert_eq!(claims(&dhcp6, NONE), Err(DropReason::RogueDhcp));
    assert!(is_group_ip(0xff02 << 112));
}

#[test]
fn reserved_group_addresses_mac_control_and_tags() {
    let bpdu = mac_key(&[0x01, 0x80, 0xc2, 0, 0, 0]);
    let lldp = mac_key(&[0x01, 0x80, 0xc2, 0, 0, 0x0e]);
    let other = mac_key(&[0x01, 0x80, 0xc2, 0, 0, 0x10]);
    let f = eth(0x88cc, &[0; 46]);
    assert_eq!(l2_refusal(&f, bpdu, false), Some(DropReason::Reserved));
    assert_eq!(l2_refusal(&f, lldp, true), Some(DropReason::Reserved));
    assert_eq!(l2_refusal(&f, other, true), None);
    let pause = eth(ETH_MAC_CONTROL, &[0, 1, 0, 0]);
    assert_eq!(
        l2_refusal(&pause, mac_key(&DST), false),
        Some(DropReason::Reserved)
    );
    for tag in ETH_TAGS {
        let tagged = eth(tag, &[0, 5, 8, 0]);
        assert_eq!(
            l2_refusal(&tagged, mac_key(&DST), true),
            Some(DropReason::Tagged)
        );
        assert_eq!(l2_refusal(&tagged, mac_key(&DST), false), None, "uplink");
    }
    assert_eq!(l2_refusal(&eth(ETH_IPV4, &[]), mac_key(&DST), true), None);
}

#[test]
fn keys_round_trip_and_short_frames_claim_nothing() {
    for ip in ["10.1.2.3", "fe80::1", "::ffff:10.1.2.3", "2001:db8::7"] {
        let a: std::net::IpAddr = ip.parse().unwrap();
        let back = key_ip(ip_key(a));
        assert_eq!(back.to_canonical(), a.to_canonical(), "{ip}");
    }
    let full = udp4([10, 0, 0, 5], 5, 6, 0);
    for n in 0..full.len() {
        // Shorter than an IPv4 header: nothing to claim, nothing refused, no panic.
        let want = if n < ETH_HDR_LEN + 20 { 0 } else { 1 };
        assert_eq!(
            inspect(&full[..n], 0, NONE).map(|c| c.len),
            Ok(want),
            "{n} bytes"
        );
        assert_eq!(announced(&full[..n]), None);
    }
}
