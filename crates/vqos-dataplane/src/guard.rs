//! Guards above layer 2: what a frame from a vif claims or does that a tenant may not.
//!
//! ## Behavior
//! [`l2_refusal`] looks at the Ethernet header alone, for every port: IEEE 802.1D reserved
//! multicast (01:80:c2:00:00:00–0f: STP BPDUs, PAUSE, LACP, EAPOL, LLDP, …) and MAC control
//! frames (EtherType 0x8808) are never forwarded by a bridge (`reserved`), and a guarded
//! vif's 802.1Q / 802.1ad tagged frames are refused (`tagged`: a vif is an access port).
//!
//! [`inspect`] reads a guarded vif's frame and returns what it [`Claims`]: the addresses the
//! frame asserts as its sender's (the IPv4 or IPv6 source, an ARP sender, the target of a
//! neighbour advertisement), each to be checked against the vif's allowed or locked
//! addresses by the caller, or a refusal outright:
//! - ARP whose sender hardware address is not the frame's source MAC (`arp_spoofed`);
//! - ICMPv6 router advertisements (134) and redirects (137) from a vif that is not a router
//!   (`rogue_router`), also behind IPv6 extension headers (RFC 7113: a first fragment whose
//!   header chain does not reach the upper layer is refused the same way);
//! - DHCPv4 server or relay messages (UDP source port 67) and DHCPv6 server or relay messages
//!   (UDP source port 547) from a vif that is not a DHCP server (`rogue_dhcp`).
//!
//! The unspecified address claims nothing where a host legitimately uses it before it has an
//! address (DHCPv4 discover from 0.0.0.0, ARP probes, IPv6 duplicate address detection and
//! MLD from ::). A multicast or broadcast source address is refused (`ip_spoofed`).
//!
//! [`announced`] reads an uplink frame for the on-link address its sender announces (an ARP
//! sender, a neighbour advertisement's target), which the switch records as living on the
//! network so that no vif can claim the gateway's address.
//!
//! ## Limitations
//! Parsed by hand rather than with a general packet library: the loop reads the EtherType and
//! at most a few fixed offsets per frame, where a full header slice would validate every
//! layer of every frame on the hot path. Everything read is bounds-checked, and the
//! `frame` fuzz target drives these functions. Non-first IPv4 fragments are not matched by
//! port (they carry no UDP header); a DHCP server message needs its first fragment, which is.

use crate::frame::{MacKey, ETH_HDR_LEN};
use crate::stats::DropReason;

/// An IP address as one key: IPv4 as an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
pub type IpKey = u128;

const V4_MAPPED: u128 = 0xffff << 32;

/// The key of IPv4 address `a` (its four octets, network order).
pub fn ipv4_key(a: [u8; 4]) -> IpKey {
    V4_MAPPED | u128::from(u32::from_be_bytes(a))
}

/// True for a key made by [`ipv4_key`].
pub fn is_ipv4_key(k: IpKey) -> bool {
    k >> 32 == 0xffff
}

/// The key of `ip`.
pub fn ip_key(ip: std::net::IpAddr) -> IpKey {
    match ip {
        std::net::IpAddr::V4(a) => ipv4_key(a.octets()),
        std::net::IpAddr::V6(a) => u128::from_be_bytes(a.octets()),
    }
}

/// The address of key `k`.
pub fn key_ip(k: IpKey) -> std::net::IpAddr {
    if is_ipv4_key(k) {
        std::net::IpAddr::V4(std::net::Ipv4Addr::from(k as u32))
    } else {
        std::net::IpAddr::V6(std::net::Ipv6Addr::from(k))
    }
}

/// True for a group (multicast or broadcast) address, which no station sends from.
pub fn is_group_ip(k: IpKey) -> bool {
    if is_ipv4_key(k) {
        let a = k as u32;
        a >> 28 == 0xe || a == u32::MAX
    } else {
        k >> 120 == 0xff
    }
}

/// What a vif may do beyond sending from its own addresses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Services {
    /// May send IPv6 router advertisements and redirects.
    pub router: bool,
    /// May send DHCPv4 and DHCPv6 server (and relay) messages.
    pub dhcp_server: bool,
}

/// The addresses a frame asserts as its sender's, each with the counter a refusal goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claims {
    /// Up to two claims (an IPv6 neighbour advertisement claims its source and its target).
    pub addrs: [(IpKey, DropReason); 2],
    /// How many of `addrs` are set.
    pub len: u8,
}

impl Default for Claims {
    fn default() -> Self {
        Claims {
            addrs: [(0, DropReason::IpSpoofed); 2],
            len: 0,
        }
    }
}

impl Claims {
    fn push(&mut self, addr: IpKey, reason: DropReason) {
        self.addrs[usize::from(self.len)] = (addr, reason);
        self.len += 1;
    }

    /// The claims, in order.
    pub fn iter(&self) -> impl Iterator<Item = (IpKey, DropReason)> + '_ {
        self.addrs[..usize::from(self.len)].iter().copied()
    }
}

const ETH_IPV4: u16 = 0x0800;
const ETH_ARP: u16 = 0x0806;
const ETH_IPV6: u16 = 0x86dd;
const ETH_MAC_CONTROL: u16 = 0x8808;
/// 802.1Q, 802.1ad and the pre-standard QinQ tag.
const ETH_TAGS: [u16; 3] = [0x8100, 0x88a8, 0x9100];
/// 01:80:c2:00:00:00, the first of the sixteen 802.1D reserved group addresses.
const RESERVED_BASE: MacKey = 0x01_80_c2_00_00_00;

const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;

#[inline]
fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(off)?, *b.get(off + 1)?]))
}

/// The Ethernet-level refusal of frame `eth` (no virtio-net header) with destination
/// `dst_mac`, if any: `reserved` for every port, `tagged` where `access_port` (a guarded vif).
#[inline]
pub fn l2_refusal(eth: &[u8], dst_mac: MacKey, access_port: bool) -> Option<DropReason> {
    let ethertype = be16(eth, 12)?;
    if dst_mac & !0xf == RESERVED_BASE || ethertype == ETH_MAC_CONTROL {
        return Some(DropReason::Reserved);
    }
    (access_port && ETH_TAGS.contains(&ethertype)).then_some(DropReason::Tagged)
}

/// What the guarded vif's frame `eth` claims, or why it is refused. `src_mac` is the frame's
/// source MAC; `services` what the vif may serve.
///
/// Inlined into the per-frame path: returned through memory, `Claims` (written field by
/// field, then copied whole) cost a store-forwarding stall per frame, measured as about a
/// sixth of a 64-byte frame's cycles on null ports.
#[inline]
pub fn inspect(eth: &[u8], src_mac: MacKey, services: Services) -> Result<Claims, DropReason> {
    let mut c = Claims::default();
    let Some(ethertype) = be16(eth, 12) else {
        return Ok(c);
    };
    let l3 = &eth[ETH_HDR_LEN..];
    match ethertype {
        ETH_ARP => arp(l3, src_mac, &mut c)?,
        ETH_IPV4 => ipv4(l3, services, &mut c)?,
        ETH_IPV6 => ipv6(l3, services, &mut c)?,
        _ => {}
    }
    Ok(c)
}

/// ARP for IPv4 over Ethernet: the sender hardware address must be the frame's source, the
/// sender IP (unless 0.0.0.0, a probe) is claimed. Other ARP shapes claim nothing.
#[inline]
fn arp(a: &[u8], src_mac: MacKey, c: &mut Claims) -> Result<(), DropReason> {
    // htype 1, ptype 0x0800, hlen 6, plen 4; sha at 8, spa at 14.
    if a.len() < 28 || a[..6] != [0, 1, 8, 0, 6, 4] {
        return Ok(());
    }
    if crate::frame::mac_key(&a[8..14]) != src_mac {
        return Err(DropReason::ArpSpoofed);
    }
    let spa = [a[14], a[15], a[16], a[17]];
    if spa != [0; 4] {
        c.push(ipv4_key(spa), DropReason::ArpSpoofed);
    }
    Ok(())
}

#[inline]
fn ipv4(ip: &[u8], services: Services, c: &mut Claims) -> Result<(), DropReason> {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Ok(());
    }
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let src = [ip[12], ip[13], ip[14], ip[15]];
    let first_fragment = be16(ip, 6).is_some_and(|f| f & 0x1fff == 0);
    let sport = if ip[9] == IPPROTO_UDP && first_fragment {
        be16(ip, ihl)
    } else {
        None
    };
    if sport == Some(67) && !services.dhcp_server {
        return Err(DropReason::RogueDhcp);
    }
    if src == [0; 4] {
        // Only a DHCP client speaks before it has an address.
        return if sport == Some(68) {
            Ok(())
        } else {
            Err(DropReason::IpSpoofed)
        };
    }
    c.push(ipv4_key(src), DropReason::IpSpoofed);
    Ok(())
}

#[inline]
fn ipv6(ip: &[u8], services: Services, c: &mut Claims) -> Result<(), DropReason> {
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Ok(());
    }
    let src = u128::from_be_bytes(ip[8..24].try_into().unwrap_or_default());
    let (proto, l4) = match upper_layer(ip) {
        Upper::Found(proto, off) => (proto, &ip[off..]),
        Upper::NotFirstFragment => (0, &ip[ip.len()..]),
        Upper::Unreached => {
            // RFC 7113: the first fragment must hold the whole header chain, or the packet
            // could hide a router advertisement from the guard.
            return Err(DropReason::RogueRouter);
        }
    };
    let icmp_type = (proto == IPPROTO_ICMPV6)
        .then(|| l4.first().copied())
        .flatten();
    if matches!(icmp_type, Some(134 | 137)) && !services.router {
        return Err(DropReason::RogueRouter);
    }
    if proto == IPPROTO_UDP && be16(l4, 0) == Some(547) && !services.dhcp_server {
        return Err(DropReason::RogueDhcp);
    }
    if src == 0 {
        // Duplicate address detection (NS) and MLD reports come from :: before an address is
        // valid; nothing else may.
        return if icmp_type.is_some() {
            Ok(())
        } else {
            Err(DropReason::IpSpoofed)
        };
    }
    c.push(src, DropReason::IpSpoofed);
    // A neighbour advertisement also claims its target.
    if icmp_type == Some(136) && l4.len() >= 24 {
        let target = u128::from_be_bytes(l4[8..24].try_into().unwrap_or_default());
        c.push(target, DropReason::NdSpoofed);
    }
    Ok(())
}

enum Upper {
    /// The upper-layer protocol and its offset in the IPv6 packet.
    Found(u8, usize),
    /// A fragment other than the first: no upper-layer header in it.
    NotFirstFragment,
    /// The chain runs past the packet (or is longer than any real one).
    Unreached,
}

/// Walks IPv6 extension headers (hop-by-hop, routing, fragment, destination options) to the
/// upper layer.
fn upper_layer(ip: &[u8]) -> Upper {
    let mut next = ip[6];
    let mut off = 40;
    // Eight headers are more than any real packet carries (RFC 8200 names six kinds).
    for _ in 0..8 {
        match next {
            0 | 43 | 60 => {
                let (Some(&nh), Some(&len)) = (ip.get(off), ip.get(off + 1)) else {
                    return Upper::Unreached;
                };
                next = nh;
                off += 8 + 8 * usize::from(len);
            }
            44 => {
                let (Some(&nh), Some(frag)) = (ip.get(off), be16(ip, off + 2)) else {
                    return Upper::Unreached;
                };
                if frag & 0xfff8 != 0 {
                    return Upper::NotFirstFragment;
                }
                next = nh;
                off += 8;
            }
            // No next header: nothing above.
            59 => return Upper::Found(59, ip.len()),
            proto if off < ip.len() => return Upper::Found(proto, off),
            // An ICMPv6 or UDP header the chain points past: what it hides cannot be seen.
            IPPROTO_ICMPV6 | IPPROTO_UDP => return Upper::Unreached,
            proto => return Upper::Found(proto, ip.len()),
        }
    }
    Upper::Unreached
}

/// The on-link address the sender of uplink frame `eth` announces, if any: an ARP sender IP
/// (not 0.0.0.0), or the target of an IPv6 neighbour advertisement.
pub fn announced(eth: &[u8]) -> Option<IpKey> {
    let l3 = eth.get(ETH_HDR_LEN..)?;
    match be16(eth, 12)? {
        ETH_ARP if l3.len() >= 28 && l3[..6] == [0, 1, 8, 0, 6, 4] => {
            let spa = [l3[14], l3[15], l3[16], l3[17]];
            (spa != [0; 4]).then(|| ipv4_key(spa))
        }
        ETH_IPV6 if l3.len() >= 40 && l3[0] >> 4 == 6 => match upper_layer(l3) {
            Upper::Found(IPPROTO_ICMPV6, off) if l3.len() >= off + 24 && l3[off] == 136 => Some(
                u128::from_be_bytes(l3[off + 8..off + 24].try_into().unwrap_or_default()),
            ),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
