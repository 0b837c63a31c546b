//! `SEND_RARP` through a real switch (epoll readiness, an in-memory uplink): the announce
//! reaches the uplink and teaches the switch the guest's port; a hostile frontend's announce
//! of another guest's MAC is refused and counted; the destination's announce completes a
//! `port migrate` hand-over.

use vqos_sched::VifPolicy;

use super::features::OFFERED_FEATURES as ALL;
use super::test_frontend::*;
use super::*;
use crate::frame::{build_frame, VnetHdr, VNET_HDR_LEN};
use crate::{DropReason, MemPort, MemPortPeer, PortSpec, SwitchConfig, SwitchHandle};

const MAC_U: u64 = 0x02_00_00_00_00_01;
const MAC_A: u64 = 0x02_00_00_00_00_0a;
const MAC_B: u64 = 0x02_00_00_00_00_0b;

fn frame(dst: u64, src: u64, tag: u8) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, src, 0x88b5, &[tag; 60])
}

fn mac(k: u64) -> [u8; 6] {
    k.to_be_bytes()[2..].try_into().unwrap()
}

/// A switch with an in-memory uplink and vhost-user vifs `names`, each with a connected
/// frontend (and its raw connection) that posted receive buffers.
struct Rig {
    sw: SwitchHandle,
    u: MemPortPeer,
    guests: Vec<(
        TestFrontend,
        std::os::unix::net::UnixStream,
        VhostUserHandle,
    )>,
    _dirs: Vec<tempfile::TempDir>,
}

fn rig(names: &[&str]) -> Rig {
    let (up, u) = MemPort::pair("up", 10_000);
    let sw = SwitchHandle::start(SwitchConfig::new(PortSpec::custom(Box::new(up)))).unwrap();
    let mut guests = Vec::new();
    let mut dirs = Vec::new();
    for name in names {
        let (dir, path) = socket_path();
        let port = VhostUserPort::server(name, &path).unwrap();
        let h = port.handle();
        sw.add_port(PortSpec::custom(Box::new(port)), VifPolicy::default())
            .unwrap();
        let (mut fe, raw) = TestFrontend::connect_raw(&path, ALL);
        wait_ready(&h);
        fe.post_rx(64, 2048);
        guests.push((fe, raw, h));
        dirs.push(dir);
    }
    Rig {
        sw,
        u,
        guests,
        _dirs: dirs,
    }
}

/// Waits until the uplink got `n` frames and returns them.
fn at_uplink(u: &MemPortPeer, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    wait_until(&format!("{n} frames at the uplink"), || {
        got.extend(u.take_sent());
        got.len() >= n
    });
    got
}

/// Sends a frame from the uplink to `dst` and waits until guest `i` receives it.
fn reaches(r: &mut Rig, dst: u64, i: usize, tag: u8) {
    r.u.inject(frame(dst, MAC_U, tag));
    let fe = &mut r.guests[i].0;
    let mut got = Vec::new();
    wait_until("the frame at the guest", || {
        got.extend(fe.received());
        !got.is_empty()
    });
    assert_eq!(got[0][VNET_HDR_LEN + 14], tag);
}

fn spoofed(r: &Rig, port: &str) -> u64 {
    r.sw.stats()
        .port(port)
        .map_or(0, |p| p.counters.drops[DropReason::Spoofed])
}

#[test]
fn send_rarp_announces_the_guest_to_the_uplink_and_the_switch_learns_it() {
    let mut r = rig(&["vm1"]);
    assert_eq!(send_rarp(&mut r.guests[0].1, mac(MAC_A)), 0);
    let f = at_uplink(&r.u, 1).remove(0);
    let eth = &f[VNET_HDR_LEN..];
    assert_eq!(&eth[..6], &[0xff; 6], "broadcast");
    assert_eq!(&eth[6..12], &mac(MAC_A));
    assert_eq!(&eth[12..14], &[0x80, 0x35], "RARP");
    reaches(&mut r, MAC_A, 0, 7);
    // A group MAC is refused by the port, and answered so.
    assert_eq!(send_rarp(&mut r.guests[0].1, [0xff; 6]), 1);
    let c = r.guests[0].2.counters();
    assert_eq!((c.rarp_announces, c.rarp_refused), (1, 1));
    assert!(r.u.take_sent().is_empty());
}

#[test]
fn a_hostile_send_rarp_for_another_guests_mac_is_refused_and_counted() {
    let mut r = rig(&["vm1", "vm2"]);
    // vm2's guest speaks from its MAC: locked to vm2.
    r.guests[1].0.send(&frame(MAC_U, MAC_B, 1));
    at_uplink(&r.u, 1);
    // vm1's frontend announces vm2's guest: the port passes it on, the switch refuses it.
    assert_eq!(send_rarp(&mut r.guests[0].1, mac(MAC_B)), 0);
    wait_until("the announce counted as spoofed", || {
        spoofed(&r, "vm1") == 1
    });
    assert!(r.u.take_sent().is_empty(), "nothing reached the uplink");
    assert!(r.guests[1].0.received().is_empty(), "nor vm2");
    assert_eq!(r.guests[0].2.counters().rarp_announces, 1);
    // vm2's guest is still found on vm2.
    reaches(&mut r, MAC_B, 1, 2);
}

#[test]
fn the_destinations_send_rarp_completes_a_migration() {
    let mut r = rig(&["vma", "vmb"]);
    r.guests[0].0.send(&frame(MAC_U, MAC_A, 1));
    at_uplink(&r.u, 1);
    r.sw.migrate_port("vma", "vmb").unwrap();
    // The migration completes: the destination's QEMU asks for the announce.
    assert_eq!(send_rarp(&mut r.guests[1].1, mac(MAC_A)), 0);
    let f = at_uplink(&r.u, 1).remove(0);
    assert_eq!(&f[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12], &mac(MAC_A));
    reaches(&mut r, MAC_A, 1, 3);
    wait_until("the hand-over complete in the stats", || {
        r.sw.stats()
            .port("vma")
            .and_then(|p| p.handover.clone())
            .is_some_and(|h| h.to == "vmb" && h.complete)
    });
    // The source can no longer speak from it.
    r.guests[0].0.send(&frame(MAC_U, MAC_A, 4));
    wait_until("the source's frame refused", || spoofed(&r, "vma") == 1);
    assert!(r.u.take_sent().is_empty());
}
