//! Tenants isolated by default (issue: "tenants isolated"), in virtual time on in-memory
//! ports: a vif cannot take another's (or the gateway's) traffic by sending from its address,
//! port security locks a vif to its first addresses or to its configured ones, flooded copies
//! obey each receiver's maximum, storm control bounds what a port may flood, and unknown
//! unicast from a tenant reaches the uplink only — also when the uplink's MAC table is full.
//! Each of these failed on the switch before port security and the flooding rules existed.

mod common;

use common::*;
use vqos_dataplane::frame::{build_frame, VnetHdr};
use vqos_dataplane::{DropReason, MacPolicy, MemPort, PortSpec, SwitchError, DEFAULT_LEARN_MACS};
use vqos_sched::VifPolicy;

const MAC_C: u64 = 0x02_00_00_00_00_0c;

#[test]
fn a_vif_sending_from_another_vifs_address_takes_none_of_its_traffic() {
    let mut r = VRig::new();
    r.b.inject(frame(MAC_U, MAC_B, 1));
    r.run();
    r.u.take_sent();
    // One frame from a with b's source address...
    r.a.inject(frame(MAC_U, MAC_B, 2));
    r.run();
    assert!(r.u.take_sent().is_empty(), "the spoofed frame went out");
    // ...and the next ten frames for b still go to b.
    for t in 0..10 {
        r.u.inject(frame(MAC_B, MAC_U, t));
    }
    r.run();
    assert_eq!(r.b.take_sent().len(), 10);
    assert!(r.a.take_sent().is_empty(), "a got b's traffic");
    assert_eq!(
        r.stats().port("a").unwrap().counters.drops[DropReason::Spoofed],
        1
    );
}

#[test]
fn a_vif_cannot_claim_the_gateways_address_nor_the_network_a_vifs() {
    let mut r = VRig::new();
    // The gateway (on the uplink) and b speak first.
    r.u.inject(frame(BCAST, MAC_U, 1));
    r.b.inject(frame(MAC_U, MAC_B, 1));
    r.run();
    for p in [&r.u, &r.a, &r.b] {
        p.take_sent();
    }
    // a pretends to be the gateway: refused; b's frames for the gateway still leave by the
    // uplink and never reach a.
    r.a.inject(frame(BCAST, MAC_U, 2));
    r.b.inject(frame(MAC_U, MAC_B, 3));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![3]);
    assert!(r.a.take_sent().is_empty());
    // Someone on the network pretends to be b: refused on the uplink; a reaches b.
    r.u.inject(frame(BCAST, MAC_B, 4));
    r.a.inject(frame(MAC_B, MAC_A, 5));
    r.run();
    assert_eq!(tags(&r.b.take_sent()), vec![5]);
    assert!(
        r.u.take_sent().is_empty(),
        "a's frame for b left by the uplink"
    );
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.drops[DropReason::Spoofed], 1);
    assert_eq!(s.port("up").unwrap().counters.drops[DropReason::Spoofed], 1);
}

#[test]
fn port_security_locks_a_vif_to_its_first_addresses_unless_opted_out() {
    let mut r = VRig::new();
    for m in 0..6u64 {
        r.a.inject(frame(MAC_U, 0x02_00_00_00_10_00 + m, m as u8));
    }
    r.run();
    let first: Vec<u8> = (0..DEFAULT_LEARN_MACS as u8).collect();
    assert_eq!(tags(&r.u.take_sent()), first);
    assert_eq!(
        r.stats().port("a").unwrap().counters.drops[DropReason::Spoofed],
        2
    );
    // A locked address keeps working.
    r.a.inject(frame(MAC_U, 0x02_00_00_00_10_00, 9));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![9]);
    // A router behind a port (opt-out) may use any address nobody else owns.
    let (pc, c) = MemPort::pair("c", 100);
    let spec = PortSpec::custom(Box::new(pc)).with_mac_policy(MacPolicy::Any);
    r.sw.add_port(spec, VifPolicy::default(), r.now).unwrap();
    for m in 0..6u64 {
        c.inject(frame(MAC_U, 0x02_00_00_00_20_00 + m, m as u8));
    }
    c.inject(frame(MAC_U, 0x02_00_00_00_10_00, 7)); // a's
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(
        r.stats().port("c").unwrap().counters.drops[DropReason::Spoofed],
        1
    );
}

#[test]
fn configured_addresses_belong_to_their_port_before_it_speaks_and_to_no_other() {
    let mut r = VRig::new();
    // The network used the address first (learnt on the uplink): the configuration wins.
    r.u.inject(frame(BCAST, MAC_C, 1));
    r.run();
    for p in [&r.a, &r.b] {
        p.take_sent();
    }
    let (pc, c) = MemPort::pair("c", 100);
    let spec = PortSpec::custom(Box::new(pc)).with_allowed_macs(vec![MAC_C]);
    r.sw.add_port(spec, VifPolicy::default(), r.now).unwrap();
    // c has sent nothing, yet frames for it are unicast to it, not flooded.
    r.u.inject(frame(MAC_C, MAC_U, 2));
    r.run();
    assert_eq!(tags(&c.take_sent()), vec![2]);
    assert!(r.a.take_sent().is_empty() && r.b.take_sent().is_empty());
    // A second port configured with the same address is refused, and changes nothing.
    let (pd, _d) = MemPort::pair("d", 100);
    let spec = PortSpec::custom(Box::new(pd)).with_allowed_macs(vec![MAC_C]);
    let err =
        r.sw.add_port(spec, VifPolicy::default(), r.now)
            .unwrap_err();
    assert!(
        matches!(&err, SwitchError::MacInUse { owner: Some(o), .. } if o == "c"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "MAC address 02:00:00:00:00:0c is in use by port 'c'"
    );
    assert_eq!(r.sw.policies().len(), 3);
    r.u.inject(frame(MAC_C, MAC_U, 3));
    r.run();
    assert_eq!(tags(&c.take_sent()), vec![3]);
}

#[test]
fn flooded_copies_obey_each_receivers_downlink_max() {
    let mut r = VRig::with(|c| c.storm_pps = 0, MacPolicy::default());
    let capped = VifPolicy {
        max_bps: Some(1_000_000), // 125 kB/s, depth 131 072 bytes
        ..Default::default()
    };
    r.sw.set_policy("a", capped, r.now).unwrap();
    let big = build_frame(VnetHdr::default(), BCAST, MAC_U, 0x0800, &[0; 1000]);
    for _ in 0..2000 {
        r.u.inject(big.clone());
    }
    r.run();
    // a's bucket passes frames while positive: 129 × 1014 = 130 806 leaves 266, the 130th
    // takes it into debt; b, uncapped, gets every copy.
    let s = r.stats();
    let a = s.port("a").unwrap();
    assert_eq!(
        (
            a.counters.tx_frames,
            a.counters.drops[DropReason::RateLimited]
        ),
        (130, 1870)
    );
    assert_eq!(s.port("b").unwrap().counters.tx_frames, 2000);
}

#[test]
fn storm_control_bounds_what_a_port_floods_per_second() {
    let mut r = VRig::with(|c| c.storm_pps = 100, MacPolicy::default());
    for _ in 0..500 {
        r.b.inject(frame(BCAST, MAC_B, 1));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 100, "one second's burst");
    assert_eq!(r.a.take_sent().len(), 100);
    // Known unicast is not storm-limited.
    r.u.inject(frame(BCAST, MAC_U, 2));
    r.run();
    r.a.take_sent();
    r.b.take_sent();
    for _ in 0..300 {
        r.b.inject(frame(MAC_U, MAC_B, 3));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 300);
    // Half a second later, fifty more broadcasts may go.
    for _ in 0..100 {
        r.b.inject(frame(BCAST, MAC_B, 4));
    }
    r.advance(500_000_000);
    assert_eq!(r.u.take_sent().len(), 50);
    assert_eq!(
        r.stats().port("b").unwrap().counters.drops[DropReason::Storm],
        450
    );
}

#[test]
fn unknown_unicast_floods_to_the_vifs_only_when_configured() {
    let mut r = VRig::with(|c| c.flood_unknown_to_vifs = true, MacPolicy::default());
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![1]);
    assert_eq!(tags(&r.b.take_sent()), vec![1]);
}

#[test]
fn a_full_uplink_mac_table_does_not_leak_a_tenants_frames_to_another() {
    // The uplink may learn half of 64 addresses.
    let mut r = VRig::with(
        |c| {
            c.mac_capacity = 64;
            c.storm_pps = 0;
        },
        MacPolicy::default(),
    );
    // An outside sender fills the uplink's share from 32 addresses.
    for m in 0..32u64 {
        r.u.inject(frame(BCAST, 0x02_00_00_00_30_00 + m, 0));
    }
    r.run();
    r.a.take_sent();
    r.b.take_sent();
    // The gateway speaks now, but cannot be learnt; a's frames for it go to the uplink only.
    r.u.inject(frame(BCAST, MAC_U, 1));
    r.run();
    r.a.take_sent();
    r.b.take_sent();
    for t in 0..10 {
        r.a.inject(frame(MAC_U, MAC_A, t));
    }
    r.run();
    assert_eq!(r.u.take_sent().len(), 10);
    assert!(
        r.b.take_sent().is_empty(),
        "a's frames for the gateway reached b"
    );
    assert_eq!(r.stats().port("up").unwrap().counters.mac_learn_refused, 1);
}
