//! Why frames were dropped: [`DropReason`], the one list of reasons, and [`DropCounters`], one
//! counter per reason. The data plane counts into them on its hot path (an array indexed by
//! reason); the API, the metrics' `reason` label and the CLI take the names from here.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a frame was dropped. Ingress reasons are counted on the port the frame came from,
/// egress reasons (`rate_limited`, `tx_error`) on the port it was going to. A new reason is one
/// variant here (and its entry in [`DropReason::ALL`] and [`DropReason::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Shorter than the virtio-net header plus an Ethernet header.
    Truncated,
    /// Longer than 64 KiB plus headers.
    Oversized,
    /// Inconsistent virtio-net header (GSO type, flags, offsets).
    BadVnetHdr,
    /// A source MAC the port may not use: a group address, one outside its configured list
    /// or beyond its learning lock, or one that lives on another port.
    Spoofed,
    /// The engine's `admit` said drop (policers).
    Policed,
    /// Over the destination vif's maximum on the uplink→vif direction.
    RateLimited,
    /// The destination port refused the frame (ring full, link down).
    TxError,
    /// The destination was learnt on the port the frame came from.
    Hairpin,
    /// Broadcast, multicast or unknown-unicast frames beyond the port's storm-control rate.
    Storm,
    /// An IPv4 or IPv6 source address the vif may not use (another's, a group address, or
    /// the unspecified address outside DHCP and neighbour discovery).
    IpSpoofed,
    /// ARP whose sender IP the vif may not use, or whose sender hardware address is not the
    /// frame's source.
    ArpSpoofed,
    /// An IPv6 neighbour advertisement for a target address the vif may not use.
    NdSpoofed,
    /// An IPv6 router advertisement or redirect from a vif that is not a router.
    RogueRouter,
    /// A DHCPv4 or DHCPv6 server message from a vif that is not a DHCP server.
    RogueDhcp,
    /// IEEE 802.1D reserved multicast (01:80:c2:00:00:0x: STP, PAUSE, LACP, EAPOL, LLDP) or
    /// MAC control frames, which a bridge never forwards.
    Reserved,
    /// An 802.1Q or 802.1ad tagged frame from a vif (an access port).
    Tagged,
    /// The destination vif's downlink queue (or the shard's queue memory) was full.
    QueueFull,
    /// The downlink's AQM (CoDel) signalled a frame that is not ECN-capable.
    Aqm,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 18] = [
        DropReason::Truncated,
        DropReason::Oversized,
        DropReason::BadVnetHdr,
        DropReason::Spoofed,
        DropReason::Policed,
        DropReason::RateLimited,
        DropReason::TxError,
        DropReason::Hairpin,
        DropReason::Storm,
        DropReason::IpSpoofed,
        DropReason::ArpSpoofed,
        DropReason::NdSpoofed,
        DropReason::RogueRouter,
        DropReason::RogueDhcp,
        DropReason::Reserved,
        DropReason::Tagged,
        DropReason::QueueFull,
        DropReason::Aqm,
    ];

    /// The name used in the API, the metrics' `reason` label and the CLI (the serde name).
    pub const fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::Oversized => "oversized",
            DropReason::BadVnetHdr => "bad_vnet_hdr",
            DropReason::Spoofed => "spoofed",
            DropReason::Policed => "policed",
            DropReason::RateLimited => "rate_limited",
            DropReason::TxError => "tx_error",
            DropReason::Hairpin => "hairpin",
            DropReason::Storm => "storm",
            DropReason::IpSpoofed => "ip_spoofed",
            DropReason::ArpSpoofed => "arp_spoofed",
            DropReason::NdSpoofed => "nd_spoofed",
            DropReason::RogueRouter => "rogue_router",
            DropReason::RogueDhcp => "rogue_dhcp",
            DropReason::Reserved => "reserved",
            DropReason::Tagged => "tagged",
            DropReason::QueueFull => "queue_full",
            DropReason::Aqm => "aqm",
        }
    }

    /// The reason called `name` ([`DropReason::name`]).
    pub fn from_name(name: &str) -> Option<DropReason> {
        DropReason::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Frames dropped, one counter per [`DropReason`] (an array: the data plane counts into it
/// per frame).
///
/// Serialised as a map from reason name to count, every reason present, in name order (the
/// order the API has always had: it was a sorted map). Read back, a reason this version does
/// not know (from a newer daemon) is skipped and a missing one is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounters([u64; DropReason::ALL.len()]);

impl DropCounters {
    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every reason with its count, in [`DropReason::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|&r| (r, self[r]))
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &DropCounters) {
        for (n, m) in self.0.iter_mut().zip(o.0) {
            *n += m;
        }
    }
}

impl std::ops::Index<DropReason> for DropCounters {
    type Output = u64;
    #[inline]
    fn index(&self, r: DropReason) -> &u64 {
        &self.0[r as usize]
    }
}

impl std::ops::IndexMut<DropReason> for DropCounters {
    #[inline]
    fn index_mut(&mut self, r: DropReason) -> &mut u64 {
        &mut self.0[r as usize]
    }
}

impl Serialize for DropCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut by_name = DropReason::ALL;
        by_name.sort_unstable_by_key(|r| r.name());
        let mut m = s.serialize_map(Some(by_name.len()))?;
        for r in by_name {
            m.serialize_entry(r.name(), &self[r])?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for DropCounters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counts;
        impl<'de> Visitor<'de> for Counts {
            type Value = DropCounters;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map from drop reason to count")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<DropCounters, A::Error> {
                let mut out = DropCounters::default();
                while let Some(name) = m.next_key::<String>()? {
                    let n: u64 = m.next_value()?;
                    if let Some(r) = DropReason::from_name(&name) {
                        out[r] = n;
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn every_reason_has_its_serde_name_once() {
        let names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i, "ALL is in counter order");
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
            assert_eq!(DropReason::from_name(r.name()), Some(r));
        }
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    /// The JSON is what the API served when drops were a sorted map of names, byte for byte;
    /// it reads back whole, skipping a reason it does not know.
    #[test]
    fn drops_serialise_as_the_sorted_map_they_were_and_read_back() {
        let mut drops = DropCounters::default();
        let mut map = BTreeMap::new();
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            drops[r] = 100 + i as u64;
            map.insert(r.name().to_string(), 100 + i as u64);
        }
        let json = serde_json::to_string(&drops).unwrap();
        assert_eq!(json, serde_json::to_string(&map).unwrap());
        assert_eq!(serde_json::from_str::<DropCounters>(&json).unwrap(), drops);
        let newer = r#"{"spoofed": 3, "from_a_newer_daemon": 9}"#;
        let read: DropCounters = serde_json::from_str(newer).unwrap();
        assert_eq!((read[DropReason::Spoofed], read.total()), (3, 3));
    }

    #[test]
    fn add_sums_each_reason() {
        let mut a = DropCounters::default();
        let mut b = DropCounters::default();
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            a[r] = i as u64;
            b[r] = 1000 * i as u64;
        }
        a.add(&b);
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(a[r], 1001 * i as u64, "{r:?}");
        }
    }
}
