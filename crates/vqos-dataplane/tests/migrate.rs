//! `vqos port migrate`: one vif's identity handed over to another, in virtual time on
//! in-memory ports. A third port never gets the guest's MAC or IP address at any step (before,
//! during, at the destination's first frame, after the source's removal), the destination
//! takes the policy and, with the source's removal, the counters; refusals change nothing;
//! with two shards the source's shard sees the completion.

mod common;

use std::net::Ipv4Addr;

use common::*;
use vqos_api::wire::MacAddr;
use vqos_dataplane::frame::VnetHdr;
use vqos_dataplane::{
    DropReason, MemPort, MemPortPeer, PortSpec, Shards, SwitchConfig, SwitchError, SwitchStats,
    VNET_HDR_LEN,
};
use vqos_sched::VifPolicy;
use vqos_testkit::frames;

const MAC_C: u64 = 0x02_00_00_00_00_0c;
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 10);
const GW: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);

fn mac(k: u64) -> [u8; 6] {
    k.to_be_bytes()[2..].try_into().unwrap()
}

/// A UDP frame from `src_mac` claiming `src`, to the uplink's station, as a port reads it.
fn udp(src_mac: u64, src: Ipv4Addr) -> Vec<u8> {
    let eth = frames::udp4(mac(MAC_U), mac(src_mac), src, GW, (5000, 5001), b"x");
    let mut f = vec![0; VNET_HDR_LEN];
    VnetHdr::default().write(&mut f);
    f.extend_from_slice(&eth);
    f
}

/// The guest's policy: what the destination must take.
fn guest_policy() -> VifPolicy {
    VifPolicy {
        weight: 3,
        max_bps: Some(8_000_000),
        ..VifPolicy::default()
    }
}

/// Two shards: the guest's port `a` on shard 0, the destination `b` and a third port `c` on
/// shard 1 (`threads = 1`: all on shard 0).
fn rig(threads: usize) -> (Shards, MemPortPeer, [MemPortPeer; 3]) {
    let (up, u) = MemPort::pair("up", 10_000);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = threads;
    let mut sh = Shards::new(cfg, 0).unwrap();
    let mut peers = Vec::new();
    for (name, home, policy) in [
        ("a", 0, guest_policy()),
        ("b", 1, VifPolicy::default()),
        ("c", 1, VifPolicy::default()),
    ] {
        let (p, peer) = MemPort::pair(name, 10_000);
        let home = Some(home % threads);
        sh.add_port(PortSpec::custom(Box::new(p)), policy, home, 0)
            .unwrap();
        peers.push(peer);
    }
    let [a, b, c] = peers.try_into().ok().unwrap();
    (sh, u, [a, b, c])
}

fn drops(s: &SwitchStats, port: &str, reason: DropReason) -> u64 {
    s.port(port).unwrap().counters.drops[reason]
}

/// Port `c` (a third port, its own MAC `own`) tries the guest's MAC and IP: refused both
/// times, and nothing of it reaches anyone.
fn third_tries(
    sh: &mut Shards,
    u: &MemPortPeer,
    (c, own): (&MemPortPeer, u64),
    now: u64,
    step: &str,
) {
    let name = if own == MAC_C { "c" } else { "b" };
    let before = sh.stats(now);
    c.inject(frame(MAC_U, MAC_A, 9));
    c.inject(udp(own, IP_A));
    run_switch(sh, now);
    let after = sh.stats(now);
    assert_eq!(
        drops(&after, name, DropReason::Spoofed) - drops(&before, name, DropReason::Spoofed),
        1,
        "{step}: the guest's MAC from c"
    );
    assert_eq!(
        drops(&after, name, DropReason::IpSpoofed) - drops(&before, name, DropReason::IpSpoofed),
        1,
        "{step}: the guest's IP from c"
    );
    assert!(u.take_sent().is_empty(), "{step}: nothing of c's passed");
}

fn the_guest_moves(threads: usize) {
    let (mut sh, u, [a, b, c]) = rig(threads);
    // The guest speaks from a: its MAC and IP are locked there first come.
    a.inject(udp(MAC_A, IP_A));
    run_switch(&mut sh, 1);
    assert_eq!(u.take_sent().len(), 1);
    third_tries(&mut sh, &u, (&c, MAC_C), 2, "before");
    sh.migrate_port("a", "b", 3).unwrap();
    let s = sh.stats(3);
    let policy = |name: &str| {
        sh.policies()
            .policy(sh.policies().id(name).unwrap())
            .clone()
    };
    assert_eq!(policy("b"), guest_policy());
    assert_eq!(policy("a"), guest_policy(), "kept");
    let handover = s.port("a").unwrap().handover.clone().unwrap();
    assert_eq!((handover.to.as_str(), handover.complete), ("b", false));
    third_tries(&mut sh, &u, (&c, MAC_C), 4, "during");
    // The source still speaks, and frames to the guest still go there.
    a.inject(udp(MAC_A, IP_A));
    u.inject(frame(MAC_A, MAC_U, 1));
    run_switch(&mut sh, 5);
    assert_eq!(u.take_sent().len(), 1);
    assert_eq!(tags(&a.take_sent()), vec![1]);
    assert!(b.take_sent().is_empty());
    third_tries(&mut sh, &u, (&c, MAC_C), 6, "source spoke");
    // The destination's first frame: everything is its own from now on.
    b.inject(udp(MAC_A, IP_A));
    run_switch(&mut sh, 7);
    assert_eq!(u.take_sent().len(), 1, "the destination's frame passed");
    u.inject(frame(MAC_A, MAC_U, 2));
    run_switch(&mut sh, 8);
    assert_eq!(tags(&b.take_sent()), vec![2], "frames to the guest go to b");
    assert!(a.take_sent().is_empty());
    let s = sh.stats(8);
    assert!(s.port("a").unwrap().handover.as_ref().unwrap().complete);
    assert!(
        s.port("a").unwrap().locked.is_empty(),
        "the source lost them"
    );
    assert_eq!(s.port("b").unwrap().locked.macs, vec![MacAddr(mac(MAC_A))]);
    third_tries(&mut sh, &u, (&c, MAC_C), 9, "completed");
    // The source can claim nothing any more, MAC or IP.
    let spoofed = drops(&s, "a", DropReason::Spoofed);
    a.inject(udp(MAC_A, IP_A));
    a.inject(udp(MAC_C, IP_A));
    run_switch(&mut sh, 10);
    assert!(u.take_sent().is_empty());
    assert_eq!(drops(&sh.stats(10), "a", DropReason::Spoofed), spoofed + 2);
    // The source goes: its counters continue on the destination.
    let before = sh.stats(10);
    let (ra, rb) = (
        before.port("a").unwrap().counters,
        before.port("b").unwrap().counters,
    );
    sh.remove_port("a", 11).unwrap();
    let after = sh.stats(11);
    let b_now = after.port("b").unwrap().counters;
    assert_eq!(b_now.rx_frames, ra.rx_frames + rb.rx_frames);
    assert_eq!(b_now.tx_frames, ra.tx_frames + rb.tx_frames);
    assert_eq!(
        b_now.drops[DropReason::Spoofed],
        ra.drops[DropReason::Spoofed] + rb.drops[DropReason::Spoofed]
    );
    third_tries(&mut sh, &u, (&c, MAC_C), 12, "source removed");
}

#[test]
fn a_third_port_never_claims_the_guest_and_the_destination_takes_it_all() {
    the_guest_moves(1);
}

#[test]
fn the_hand_over_crosses_shards() {
    the_guest_moves(2);
}

#[test]
fn removing_the_source_completes_and_removing_the_destination_cancels() {
    let (mut sh, u, [a, b, c]) = rig(2);
    a.inject(udp(MAC_A, IP_A));
    run_switch(&mut sh, 1);
    u.take_sent();
    sh.migrate_port("a", "b", 2).unwrap();
    // Cancelled: the destination goes, the source keeps everything.
    sh.remove_port("b", 3).unwrap();
    assert!(sh.stats(3).port("a").unwrap().handover.is_none());
    // c tries the guest's MAC (and locks nothing, to stay a fit destination).
    c.inject(frame(MAC_U, MAC_A, 9));
    run_switch(&mut sh, 4);
    assert_eq!(drops(&sh.stats(4), "c", DropReason::Spoofed), 1);
    assert!(u.take_sent().is_empty());
    a.inject(udp(MAC_A, IP_A));
    run_switch(&mut sh, 5);
    assert_eq!(u.take_sent().len(), 1, "the source still speaks");
    // Again to c, and the source goes before c said anything: c has it all.
    sh.migrate_port("a", "c", 6).unwrap();
    sh.remove_port("a", 7).unwrap();
    c.inject(udp(MAC_A, IP_A));
    u.inject(frame(MAC_A, MAC_U, 3));
    run_switch(&mut sh, 8);
    assert_eq!(u.take_sent().len(), 1);
    assert_eq!(tags(&c.take_sent()), vec![3]);
    drop(b);
}

#[test]
fn refusals_change_nothing() {
    let (mut sh, u, [a, b, _c]) = rig(2);
    a.inject(udp(MAC_A, IP_A));
    b.inject(frame(MAC_U, MAC_B, 1));
    run_switch(&mut sh, 1);
    u.take_sent();
    let policies = sh.policies().clone();
    let cases: [(&str, &str, &str); 6] = [
        ("zz", "b", "Unknown port 'zz'"),
        ("a", "zz", "Unknown port 'zz'"),
        ("up", "b", "The uplink 'up' cannot be changed this way"),
        ("a", "up", "The uplink 'up' cannot be changed this way"),
        (
            "a",
            "a",
            "Cannot migrate 'a' to 'a': a port cannot be migrated to itself",
        ),
        (
            "a",
            "b",
            "Cannot migrate 'a' to 'b': 'b' owns MAC address 02:00:00:00:00:0b (the \
             destination must own no address: it takes the source's)",
        ),
    ];
    for (src, dst, want) in cases {
        let e = sh.migrate_port(src, dst, 2).unwrap_err();
        assert_eq!(e.to_string(), want);
        assert_eq!(
            sh.policies(),
            &policies,
            "{src} → {dst}: policies unchanged"
        );
        let s = sh.stats(2);
        assert!(s.ports.iter().all(|p| p.handover.is_none()));
    }
    // A port already migrating is refused as either side.
    sh.migrate_port("a", "c", 3).unwrap();
    let e = sh.migrate_port("a", "b", 3).unwrap_err();
    assert!(matches!(e, SwitchError::Migrate { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "Cannot migrate 'a' to 'b': 'a' is already migrating"
    );
    let e = sh.migrate_port("b", "c", 3).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Cannot migrate 'b' to 'c': 'c' is already migrating"
    );
    // Still the guest's (c is its heir now: b tries), and b's own address is b's.
    third_tries(&mut sh, &u, (&b, MAC_B), 4, "after refusals");
    b.inject(frame(MAC_U, MAC_B, 2));
    run_switch(&mut sh, 5);
    assert_eq!(tags(&u.take_sent()), vec![2]);
}
