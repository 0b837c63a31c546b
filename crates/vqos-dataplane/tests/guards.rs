//! The guards above layer 2 on the switch, in virtual time on in-memory ports: a vif cannot
//! claim another's IP address (as a source, an ARP sender, a neighbour advertisement's target)
//! nor the gateway's once the network announced it, cannot act as a router or DHCP server
//! unless allowed, and cannot send reserved or tagged frames; each refusal has its counter and
//! nothing else is lost. Every attack here went through before the guards existed.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::*;
use vqos_api::wire::MacAddr;
use vqos_dataplane::frame::VnetHdr;
use vqos_dataplane::guard::ip_key;
use vqos_dataplane::{
    DropReason, IpAddrs, IpPolicy, Locks, MemPort, PortSecurity, PortSpec, Services, Switch,
    SwitchConfig, SwitchError, VNET_HDR_LEN,
};
use vqos_sched::VifPolicy;
use vqos_testkit::frames;

fn mac(k: u64) -> [u8; 6] {
    k.to_be_bytes()[2..].try_into().unwrap()
}

/// `eth` as a port reads it (with the virtio-net header).
fn wire(eth: &[u8]) -> Vec<u8> {
    let mut f = vec![0; VNET_HDR_LEN];
    VnetHdr::default().write(&mut f);
    f.extend_from_slice(eth);
    f
}

const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 10);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 11);
const GW: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);

fn udp(src_mac: u64, src: Ipv4Addr) -> Vec<u8> {
    wire(&frames::udp4(
        mac(MAC_U),
        mac(src_mac),
        src,
        GW,
        (5000, 5001),
        b"x",
    ))
}

fn drops(r: &mut VRig, port: &str, reason: DropReason) -> u64 {
    r.stats().port(port).unwrap().counters.drops[reason]
}

/// b and a each speak from their own address; the gateway announces itself on the uplink.
fn settled() -> VRig {
    let mut r = VRig::new();
    r.u.inject(wire(&frames::garp(mac(MAC_U), GW)));
    r.a.inject(udp(MAC_A, IP_A));
    r.b.inject(udp(MAC_B, IP_B));
    r.run();
    assert_eq!(r.u.take_sent().len(), 2, "a's and b's own traffic passes");
    r.a.take_sent();
    r.b.take_sent();
    r
}

#[test]
fn a_vif_cannot_send_from_or_announce_another_stations_ipv4_address() {
    let mut r = settled();
    // IP source spoofing, and gratuitous ARP for b's and for the gateway's address.
    r.a.inject(udp(MAC_A, IP_B));
    r.a.inject(wire(&frames::garp(mac(MAC_A), IP_B)));
    r.a.inject(wire(&frames::garp(mac(MAC_A), GW)));
    // ARP naming another station's hardware address.
    let forged = frames::arp_reply(frames::BROADCAST, mac(MAC_B), IP_A, frames::BROADCAST, IP_A);
    let mut forged = wire(&forged);
    forged[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12].copy_from_slice(&mac(MAC_A));
    r.a.inject(forged);
    r.run();
    assert!(r.u.take_sent().is_empty(), "a spoofed frame left");
    assert!(r.b.take_sent().is_empty(), "a spoofed frame reached b");
    assert_eq!(drops(&mut r, "a", DropReason::IpSpoofed), 1);
    assert_eq!(drops(&mut r, "a", DropReason::ArpSpoofed), 3);
    // a's own ARP and b's traffic still pass.
    r.a.inject(wire(&frames::garp(mac(MAC_A), IP_A)));
    r.b.inject(udp(MAC_B, IP_B));
    r.run();
    assert_eq!(r.u.take_sent().len(), 2);
    assert_eq!(r.b.take_sent().len(), 1, "a's own broadcast ARP reaches b");
}

#[test]
fn learning_stops_at_the_lock_and_the_unspecified_address_is_for_dhcp_only() {
    let mut r = settled();
    // a locks a second IPv4 address (DEFAULT_LEARN_IPV4 = 2), not a third.
    r.a.inject(udp(MAC_A, Ipv4Addr::new(10, 9, 0, 20)));
    r.a.inject(udp(MAC_A, Ipv4Addr::new(10, 9, 0, 21)));
    r.a.inject(udp(MAC_A, Ipv4Addr::UNSPECIFIED));
    let discover = frames::udp4(
        frames::BROADCAST,
        mac(MAC_A),
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        (68, 67),
        &[1; 240],
    );
    r.a.inject(wire(&discover));
    r.run();
    assert_eq!(
        r.u.take_sent().len(),
        2,
        "the second address and the DHCP discover"
    );
    assert_eq!(drops(&mut r, "a", DropReason::IpSpoofed), 2);
}

#[test]
fn router_advertisements_dhcp_offers_and_neighbour_advertisements_need_the_right() {
    let mut r = settled();
    let ll_a: Ipv6Addr = "fe80::a".parse().unwrap();
    let ll_b: Ipv6Addr = "fe80::b".parse().unwrap();
    // b claims its link-local address first.
    r.b.inject(wire(&frames::neighbour_advertisement(
        mac(MAC_B),
        ll_b,
        ll_b,
    )));
    r.run();
    assert_eq!(r.a.take_sent().len(), 1);
    r.u.take_sent();
    let prefix: Ipv6Addr = "2001:db8:77::".parse().unwrap();
    r.a.inject(wire(&frames::router_advertisement(
        mac(MAC_A),
        ll_a,
        prefix,
    )));
    r.a.inject(wire(&frames::neighbour_advertisement(
        mac(MAC_A),
        ll_a,
        ll_b,
    )));
    r.a.inject(wire(&frames::dhcp_offer(
        mac(MAC_A),
        IP_A,
        IP_B,
        mac(MAC_B),
        7,
    )));
    r.run();
    assert!(r.b.take_sent().is_empty(), "an attack reached b");
    assert!(r.u.take_sent().is_empty(), "an attack left by the uplink");
    assert_eq!(drops(&mut r, "a", DropReason::RogueRouter), 1);
    assert_eq!(drops(&mut r, "a", DropReason::NdSpoofed), 1);
    assert_eq!(drops(&mut r, "a", DropReason::RogueDhcp), 1);
}

#[test]
fn reserved_multicast_and_tags_stop_at_the_switch() {
    let mut r = settled();
    r.a.inject(wire(&frames::bpdu(mac(MAC_A))));
    r.a.inject(wire(&frames::tagged(
        &frames::udp4(mac(MAC_U), mac(MAC_A), IP_A, GW, (1, 2), b""),
        7,
    )));
    r.u.inject(wire(&frames::bpdu(mac(MAC_U))));
    r.run();
    for p in [&r.u, &r.a, &r.b] {
        assert!(p.take_sent().is_empty());
    }
    assert_eq!(drops(&mut r, "a", DropReason::Reserved), 1);
    assert_eq!(drops(&mut r, "a", DropReason::Tagged), 1);
    assert_eq!(drops(&mut r, "up", DropReason::Reserved), 1);
}

#[test]
fn configured_addresses_and_services_and_the_opt_out() {
    let mut r = settled();
    // c may use only 10.9.0.30 and serves DHCP; b's address cannot be configured on d.
    let (pc, c) = MemPort::pair("c", 100);
    let policy = IpPolicy {
        addrs: IpAddrs::Fixed(vec![ip_key(Ipv4Addr::new(10, 9, 0, 30).into())]),
        services: Services {
            router: false,
            dhcp_server: true,
        },
    };
    let spec = PortSpec::custom(Box::new(pc)).with_ip_policy(Some(policy));
    r.sw.add_port(spec, VifPolicy::default(), r.now).unwrap();
    let (pd, _d) = MemPort::pair("d", 100);
    let fixed_b = IpPolicy {
        addrs: IpAddrs::Fixed(vec![ip_key(Ipv4Addr::new(10, 9, 0, 30).into())]),
        services: Services::default(),
    };
    let spec = PortSpec::custom(Box::new(pd)).with_ip_policy(Some(fixed_b));
    let err =
        r.sw.add_port(spec, VifPolicy::default(), r.now)
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "IP address 10.9.0.30 is in use by port 'c'"
    );
    assert!(matches!(err, SwitchError::MacInUse { kind: "IP", .. }));
    let mac_c = 0x02_00_00_00_00_0c;
    c.inject(wire(&frames::dhcp_offer(
        mac(mac_c),
        Ipv4Addr::new(10, 9, 0, 30),
        IP_B,
        mac(MAC_B),
        1,
    )));
    c.inject(udp(mac_c, Ipv4Addr::new(10, 9, 0, 31)));
    r.run();
    assert_eq!(r.b.take_sent().len(), 1, "the allowed server's offer");
    assert_eq!(r.u.take_sent().len(), 1, "the offer, broadcast");
    let c_stats = r.stats();
    assert_eq!(
        c_stats.port("c").unwrap().counters.drops[DropReason::IpSpoofed],
        1
    );
    // Without guards (port security off) a VNF forwards others' packets, tagged ones too;
    // reserved multicast stops at the switch whatever the port.
    let (pe, e) = MemPort::pair("e", 100);
    let spec = PortSpec::custom(Box::new(pe)).with_ip_policy(None);
    r.sw.add_port(spec, VifPolicy::default(), r.now).unwrap();
    let mac_e = mac(0x02_00_00_00_00_0e);
    let routed = frames::udp4(
        mac(MAC_U),
        mac_e,
        Ipv4Addr::new(192, 0, 2, 1),
        GW,
        (1, 2),
        b"",
    );
    e.inject(wire(&routed));
    e.inject(wire(&frames::tagged(&routed, 3)));
    e.inject(wire(&frames::bpdu(mac_e)));
    r.run();
    assert_eq!(
        r.u.take_sent().len(),
        2,
        "e's routed packet and its tagged copy"
    );
    let e_drops = r.stats().port("e").unwrap().counters.drops;
    assert_eq!((e_drops.total(), e_drops[DropReason::Reserved]), (1, 1));
}

#[test]
fn a_persisted_lock_outranks_one_taken_while_its_owner_was_away() {
    // The first run: b locks its MAC and address; the daemon persists what stats report.
    let mut r = settled();
    let b_locks = r.stats().port("b").unwrap().locked.clone();
    assert_eq!(b_locks.macs, vec![MacAddr(mac(MAC_B))]);
    assert_eq!(b_locks.ips, vec![std::net::IpAddr::from(IP_B)]);
    // The next run: a is back first and takes b's MAC and address while b is not.
    let (up, u) = MemPort::pair("up", 100);
    let mut sw = Switch::new(SwitchConfig::new(PortSpec::custom(Box::new(up))), 0).unwrap();
    let (pa, a) = MemPort::pair("a", 100);
    sw.add_port(PortSpec::custom(Box::new(pa)), VifPolicy::default(), 0)
        .unwrap();
    a.inject(udp(MAC_B, IP_B));
    run_switch(&mut sw, 0);
    assert_eq!(u.take_sent().len(), 1, "a holds b's addresses for now");
    let stolen = sw.stats(0).port("a").unwrap().locked.clone();
    assert_eq!((stolen.macs.len(), stolen.ips.len()), (1, 1));
    // b comes back with its persisted locks: they are b's again, a's grab is forgotten.
    let (pb, b) = MemPort::pair("b", 100);
    let security = PortSecurity {
        restored: Locks::from_addrs(&b_locks),
        ..PortSecurity::default()
    };
    let spec = PortSpec::custom(Box::new(pb)).with_security(PortSecurity {
        ips: Some(IpPolicy::default()),
        ..security
    });
    sw.add_port(spec, VifPolicy::default(), 0).unwrap();
    a.inject(udp(MAC_B, IP_B));
    b.inject(udp(MAC_B, IP_B));
    u.inject(udp(MAC_U, GW));
    let to_b = frames::udp4(mac(MAC_B), mac(MAC_U), GW, IP_B, (1, 2), b"for b");
    u.inject(wire(&to_b));
    run_switch(&mut sw, 0);
    assert_eq!(u.take_sent().len(), 1, "only b's own frame left");
    assert_eq!(b.take_sent().len(), 1, "the frame for b reached b");
    assert!(a.take_sent().iter().all(|f| f != &wire(&to_b)));
    let s = sw.stats(0);
    assert_eq!(s.port("b").unwrap().locked, b_locks);
    assert!(
        s.port("a").unwrap().locked.is_empty(),
        "a's grab is forgotten"
    );
    assert_eq!(s.port("a").unwrap().counters.drops[DropReason::Spoofed], 1);
}

#[test]
fn frames_the_switch_throws_away_are_paid_for_by_their_sender() {
    // a is capped at 8 Mbit/s (1 MB/s); it floods 64-byte frames to its own MAC (hairpin) and
    // from b's (spoofed). Every one it sends is dropped; the loop may read no more of them
    // than a's cap pays for.
    let mut r = VRig::with(
        |c| c.engine = vqos_sched::EngineKind::Vqos,
        Default::default(),
    );
    r.a.inject(udp(MAC_A, IP_A));
    r.b.inject(udp(MAC_B, IP_B));
    r.run();
    let cap = VifPolicy {
        max_bps: Some(8_000_000),
        ..VifPolicy::default()
    };
    r.sw.set_policy("a", cap, r.now).unwrap();
    let before = r.stats().port("a").unwrap().counters;
    for k in 0..40_000u32 {
        let junk = if k % 2 == 0 {
            (MAC_A, MAC_A)
        } else {
            (MAC_U, MAC_B)
        };
        r.a.inject(wire(&frames::eth(
            mac(junk.0),
            mac(junk.1),
            0x88b5,
            &k.to_be_bytes(),
        )));
    }
    // One virtual second, in 1 ms steps.
    for _ in 0..1_000 {
        r.advance(1_000_000);
    }
    let after = r.stats().port("a").unwrap().counters;
    let read = after.rx_bytes - before.rx_bytes;
    let dropped = after.drops.total() - before.drops.total();
    assert_eq!(
        after.rx_frames - before.rx_frames,
        dropped,
        "every frame read was dropped"
    );
    // 1 MB in the second, plus at most the cap's burst and one batch of debt.
    assert!(
        read <= 1_000_000 + 200_000,
        "a's junk cost it nothing: {read} bytes read in 1 s"
    );
    assert!(read >= 900_000, "a was held below its cap: {read} bytes");
}
