//! Ports re-placed when ports go (`crate::rehome`), on shards stepped in virtual time: a
//! port moves from the most loaded shard to one emptied by removals, with the frames that
//! waited for it, its counters, its policy and its first-come locks; ports an operator placed
//! stay where they are. A vif read on several shards moves queue by queue: tests/spread.rs.

mod common;

use common::*;
use vqos_dataplane::{DropReason, MacPolicy, MemPort, MemPortPeer, PortSpec, Shards, SwitchConfig};
use vqos_sched::VifPolicy;

const MAC_C: u64 = 0x02_00_00_00_00_0c;
const MAC_D: u64 = 0x02_00_00_00_00_0d;

fn two_shards() -> (Shards, MemPortPeer) {
    let (up, u) = MemPort::pair("up", 1 << 20);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.threads = 2;
    (Shards::new(cfg, 0).unwrap(), u)
}

/// Adds a one-queue MemPort vif `name` (first-come lock of one MAC), read by `home` or, with
/// `None`, by the least loaded shard.
fn add(sh: &mut Shards, name: &str, home: Option<usize>) -> MemPortPeer {
    let (p, peer) = MemPort::pair(name, 1 << 20);
    let spec = PortSpec::custom(Box::new(p)).with_mac_policy(MacPolicy::Learn { max: 1 });
    sh.add_port(spec, VifPolicy::default(), home, 0).unwrap();
    peer
}

fn shard_of(sh: &mut Shards, name: &str) -> usize {
    sh.stats(0).port(name).unwrap().shard
}

#[test]
fn a_port_moves_to_a_shard_its_neighbours_left_with_everything_it_had() {
    let (mut sh, u) = two_shards();
    let a = add(&mut sh, "a", None);
    let _b = add(&mut sh, "b", None);
    let c = add(&mut sh, "c", None);
    let _e = add(&mut sh, "e", None);
    let homes = ["a", "b", "c", "e"].map(|n| shard_of(&mut sh, n));
    assert_eq!(homes, [0, 1, 0, 1], "placed round-robin as they came");
    // c locks its one address; the uplink's station is learnt.
    c.inject(frame(BCAST, MAC_C, 0));
    u.inject(frame(BCAST, MAC_U, 0));
    run_switch(&mut sh, 1);
    for p in [&u, &a, &c] {
        p.take_sent();
    }
    // Frames wait in c's queue and in the uplink's for c while its neighbours go; the first
    // claims a second address, which its lock (learn 1, full) must refuse on its new shard.
    c.inject(frame(MAC_U, MAC_D, 200));
    for i in 0..100u8 {
        c.inject(frame(MAC_U, MAC_C, i));
    }
    for i in 0..50u8 {
        u.inject(frame(MAC_C, MAC_U, i));
    }
    let epoch = sh.policies().clone();
    sh.remove_port("b", 2).unwrap();
    assert_eq!(shard_of(&mut sh, "c"), 0, "1 against 2: nothing moves yet");
    sh.remove_port("e", 2).unwrap();
    // Shard 1 read nothing, shard 0 two: the newer port, c, moved.
    let s = sh.stats(2);
    assert_eq!(
        (s.port("a").unwrap().shard, s.port("c").unwrap().shard),
        (0, 1)
    );
    assert_eq!(s.port("c").unwrap().readers, [1]);
    assert_eq!(
        sh.policies().vifs.iter().find(|v| v.name == "c"),
        epoch.vifs.iter().find(|v| v.name == "c"),
        "its policy with it"
    );
    run_switch(&mut sh, 3);
    // Every frame that waited is delivered once: c's read by shard 1's engine.
    assert_eq!(u.take_sent().len(), 100);
    assert_eq!(c.take_sent().len(), 50);
    let s = sh.stats(3);
    let pc = &s.port("c").unwrap().counters;
    assert_eq!(pc.rx_frames, 102, "read before the move and after, summed");
    assert_eq!(pc.drops[DropReason::Spoofed], 1, "its lock moved with it");
    assert_eq!(pc.tx_frames, 51, "the uplink's broadcast, then its 50");
    assert!(s.loops[1].burst_frames >= 100, "shard 1 read them");
    // Its first address is still its own against a neighbour.
    a.inject(frame(MAC_U, MAC_C, 2));
    c.inject(frame(MAC_U, MAC_C, 3));
    run_switch(&mut sh, 4);
    assert_eq!(tags(&u.take_sent()), vec![3]);
    let s = sh.stats(4);
    assert_eq!(s.port("a").unwrap().counters.drops[DropReason::Spoofed], 1);
    let mac_c = MAC_C.to_be_bytes();
    let want = vqos_api::wire::MacAddr(mac_c[2..].try_into().unwrap());
    assert_eq!(s.port("c").unwrap().locked.macs, vec![want]);
    // It is sent to from both shards, and removed like any other port.
    sh.remove_port("c", 5).unwrap();
    assert_eq!(sh.policies().len(), 1);
}

#[test]
fn ports_an_operator_placed_stay_where_they_are() {
    let (mut sh, _u) = two_shards();
    let _a = add(&mut sh, "a", Some(0));
    let _b = add(&mut sh, "b", None);
    let _c = add(&mut sh, "c", Some(0));
    let _e = add(&mut sh, "e", None);
    assert_eq!(
        ["a", "b", "c", "e"].map(|n| shard_of(&mut sh, n)),
        [0, 1, 0, 1]
    );
    sh.remove_port("b", 1).unwrap();
    sh.remove_port("e", 1).unwrap();
    assert_eq!(["a", "c"].map(|n| shard_of(&mut sh, n)), [0, 0]);
}
