//! Tenants isolated above layer 2 on the real switch (issue 27): vqosd with its default config,
//! three namespace VMs A, B, C on its TAPs and a router namespace on the uplink, each with the
//! kernel's own ARP, neighbour and routing tables. A forges what the audit found working
//! against the default config — gratuitous ARP for B's and the router's addresses, packets
//! from B's address, an IPv6 router advertisement, a neighbour advertisement for B's address,
//! a DHCP offer, a BPDU and a tagged frame — and nobody's tables change, B and the router keep
//! their traffic, and each forgery is counted under its own reason. Needs root and iperf3 (the
//! real-traffic lock); skips with a message otherwise.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;
use vqos_testkit::{can_run, frames, poll, Netns, PacketSocket};

/// Runs `args` inside `ns`; its stdout, whatever the exit status.
fn in_ns(ns: &Netns, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {} {args:?}: {e}", ns.name()));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mac_of(ns: &Netns, link: &str) -> [u8; 6] {
    let text = in_ns(ns, &["cat", &format!("/sys/class/net/{link}/address")]);
    let octets: Vec<u8> = text
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    octets.try_into().unwrap()
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The link-layer address `ns`'s neighbour table holds for `ip` on `link` (empty if none).
fn neighbour(ns: &Netns, ip: &str, link: &str) -> String {
    let line = in_ns(ns, &["ip", "neigh", "show", ip, "dev", link]);
    line.split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .unwrap_or("")
        .to_string()
}

/// Echo replies `ping` got.
fn pings(ns: &Netns, args: &[&str]) -> u32 {
    let mut all = vec!["ping", "-c", "3", "-i", "0.2", "-W", "2"];
    all.extend_from_slice(args);
    let text = in_ns(ns, &all);
    text.split(',')
        .find_map(|part| part.trim().strip_suffix(" received"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in {text:?}"))
}

/// Puts `frames` on `link` of `ns`, raw.
fn send(ns: &Netns, link: &str, frames: &[Vec<u8>]) {
    ns.run(|| {
        let s = PacketSocket::bind(link, 0);
        for f in frames {
            s.send(f);
        }
    });
}

/// Puts `frames` on `link` of `ns` and waits until the switch read them all from port `link`
/// (its `rx_frames`: whatever it then did with them).
fn send_through(lab: &Lab, ns: &Netns, link: &str, frames: &[Vec<u8>]) {
    let before = counter(&lab.stats(), link, "rx_frames");
    send(ns, link, frames);
    let want = before + frames.len() as u64;
    poll(Duration::from_secs(10), || {
        (counter(&lab.stats(), link, "rx_frames") >= want).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{link}: the switch did not read the {} frames",
            frames.len()
        )
    });
}

/// Port `tap`'s drops of each reason named, as counted.
fn drops_of(stats: &Value, tap: &str, reasons: &[&str]) -> Vec<u64> {
    reasons.iter().map(|r| drop_count(stats, tap, r)).collect()
}

#[test]
fn forged_arp_ip_dhcp_bpdu_and_tags_from_a_tenant_change_no_one_s_tables() {
    let Some(_serial) =
        can_run("forged_arp_ip_dhcp_bpdu_and_tags_from_a_tenant_change_no_one_s_tables")
    else {
        return;
    };
    let lab = lab(20, &[1, 1, 1]);
    let (a, b, c) = (&lab.vms[0].1, &lab.vms[1].1, &lab.vms[2].1);
    let (tap_a, tap_b, tap_c) = (lab.tap(0), lab.tap(1), lab.tap(2));
    let ip = |i: u8| format!("{}.{i}", lab.net);
    let (ip_b, router) = (ip(2), lab.sink_addr());
    // Forged ARP must be able to replace an entry at once (no 1 s lock after an update).
    for (ns, link) in [(c, tap_c), (&*lab.sink, lab.uplink.as_str())] {
        in_ns(
            ns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv4.neigh.{link}.locktime=0"),
            ],
        );
    }
    // Everyone speaks: the switch locks each VM's address, the router announces its own, and
    // C and the router learn B's.
    for (ns, dst) in [(a, &router), (b, &router), (c, &router), (c, &ip_b)] {
        assert_eq!(pings(ns, &[dst]), 3, "warm-up ping to {dst}");
    }
    assert_eq!(pings(&lab.sink, &[&ip_b]), 3);
    let (mac_a, mac_b) = (mac_of(a, tap_a), mac_of(b, tap_b));
    let mac_router = mac_of(&lab.sink, &lab.uplink);
    assert_eq!(neighbour(c, &ip_b, tap_c), mac_text(mac_b));

    let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap();
    let forged = [
        frames::garp(mac_a, v4(&ip_b)),
        frames::garp(mac_a, v4(&router)),
        frames::garp(mac_a, v4(&ip_b)),
        frames::garp(mac_a, v4(&router)),
    ];
    send_through(&lab, a, tap_a, &forged);
    let from_b = frames::udp4(mac_router, mac_a, v4(&ip_b), v4(&router), (9, 9), b"forged");
    let offer = frames::dhcp_offer(mac_a, v4(&ip(1)), v4(&ip(9)), mac_b, 0x5eed);
    let bpdu = frames::bpdu(mac_a);
    let own = frames::udp4(mac_router, mac_a, v4(&ip(1)), v4(&router), (9, 9), b"own");
    // B listens for anything that reaches it (a DHCP offer, a BPDU, a tag).
    let b_raw = b.run(|| PacketSocket::bind(tap_b, libc::ETH_P_ALL as u16));
    send_through(
        &lab,
        a,
        tap_a,
        &[from_b, offer, bpdu, frames::tagged(&own, 5)],
    );
    // Nobody's cache moved to A, and B and the router still reach each other and C.
    assert_eq!(
        neighbour(c, &ip_b, tap_c),
        mac_text(mac_b),
        "C's entry for B"
    );
    assert_eq!(
        neighbour(c, &router, tap_c),
        mac_text(mac_router),
        "C's entry for the router"
    );
    assert_eq!(
        neighbour(&lab.sink, &ip_b, &lab.uplink),
        mac_text(mac_b),
        "the router's entry for B"
    );
    assert_eq!(pings(c, &[&ip_b]), 3);
    assert_eq!(pings(&lab.sink, &[&ip_b]), 3);
    let leaked: Vec<_> = b_raw
        .drain()
        .into_iter()
        .filter(|f| {
            f.windows(6).any(|w| w == b"forged")
                || f[..6] == frames::bpdu(mac_a)[..6]
                || f[12..14] == [0x81, 0]
                || f.windows(4).any(|w| w == 0x5eedu32.to_be_bytes())
        })
        .collect();
    assert!(leaked.is_empty(), "B received forged frames: {leaked:?}");
    let reasons = [
        "arp_spoofed",
        "ip_spoofed",
        "rogue_dhcp",
        "reserved",
        "tagged",
    ];
    let stats = lab.stats();
    println!("A's drops: {}", port(&stats, tap_a)["drops"]);
    assert_eq!(drops_of(&stats, tap_a, &reasons), [4, 1, 1, 1, 1]);
}

/// Turns IPv6 on for `link` in `ns` (no duplicate address detection: usable at once).
fn enable_ipv6(ns: &Netns, link: &str) {
    for knob in ["accept_dad=0", "disable_ipv6=0"] {
        in_ns(
            ns,
            &["sysctl", "-qw", &format!("net.ipv6.conf.{link}.{knob}")],
        );
    }
}

/// `link`'s link-local address in `ns`, once it has one.
fn link_local(ns: &Netns, link: &str) -> Ipv6Addr {
    poll(Duration::from_secs(10), || {
        let out = in_ns(
            ns,
            &[
                "ip", "-6", "-o", "addr", "show", "dev", link, "scope", "link",
            ],
        );
        let addr = out
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)?;
        addr.split('/').next()?.parse().ok()
    })
    .unwrap_or_else(|| panic!("{link}: no link-local address"))
}

#[test]
fn forged_router_and_neighbour_advertisements_change_no_one_s_routes() {
    let Some(_serial) =
        can_run("forged_router_and_neighbour_advertisements_change_no_one_s_routes")
    else {
        return;
    };
    let lab = lab(21, &[1, 1, 1]);
    let (a, b, c) = (&lab.vms[0].1, &lab.vms[1].1, &lab.vms[2].1);
    let (tap_a, tap_b, tap_c) = (lab.tap(0), lab.tap(1), lab.tap(2));
    for (ns, link) in [(a, tap_a), (b, tap_b), (c, tap_c)] {
        enable_ipv6(ns, link);
    }
    in_ns(
        c,
        &[
            "sysctl",
            "-qw",
            &format!("net.ipv6.neigh.{tap_c}.locktime=0"),
        ],
    );
    let (ll_a, ll_b) = (link_local(a, tap_a), link_local(b, tap_b));
    let _ = link_local(c, tap_c);
    // B and C speak (B's address is locked to B); C learns B's.
    let to_b = format!("{ll_b}%{tap_c}");
    assert_eq!(pings(c, &["-6", &to_b]), 3);
    let mac_b = mac_of(b, tap_b);
    assert_eq!(neighbour(c, &ll_b.to_string(), tap_c), mac_text(mac_b));

    let mac_a = mac_of(a, tap_a);
    let prefix: Ipv6Addr = "2001:db8:77::".parse().unwrap();
    send_through(
        &lab,
        a,
        tap_a,
        &[
            frames::router_advertisement(mac_a, ll_a, prefix),
            frames::neighbour_advertisement(mac_a, ll_a, ll_b),
            frames::router_advertisement(mac_a, ll_a, prefix),
            frames::neighbour_advertisement(mac_a, ll_a, ll_b),
        ],
    );
    assert_eq!(
        in_ns(b, &["ip", "-6", "route", "show", "default"]).trim(),
        "",
        "B's default route"
    );
    let b_addrs = in_ns(b, &["ip", "-6", "addr", "show", "dev", tap_b]);
    assert!(
        !b_addrs.contains("2001:db8:77"),
        "B took the rogue prefix: {b_addrs}"
    );
    assert_eq!(
        neighbour(c, &ll_b.to_string(), tap_c),
        mac_text(mac_b),
        "C's entry for B"
    );
    assert_eq!(pings(c, &["-6", &to_b]), 3);
    let stats = lab.stats();
    println!("A's drops: {}", port(&stats, tap_a)["drops"]);
    assert_eq!(
        drops_of(&stats, tap_a, &["rogue_router", "nd_spoofed"]),
        [2, 2]
    );
}

#[test]
fn a_lock_taken_while_vqosd_restarts_does_not_outrank_the_owners() {
    let Some(_serial) = can_run("a_lock_taken_while_vqosd_restarts_does_not_outrank_the_owners")
    else {
        return;
    };
    let mut lab = lab(22, &[1, 1]);
    let (a, b) = (&lab.vms[0].1, &lab.vms[1].1);
    let (tap_a, tap_b) = (lab.tap(0).to_string(), lab.tap(1).to_string());
    let ip_b = format!("{}.2", lab.net);
    let router = lab.sink_addr();
    for ns in [a, b] {
        assert_eq!(pings(ns, &[&router]), 3);
    }
    // B's MAC and address are locked to it, and the daemon saves them (every second).
    let mac_b = mac_text(mac_of(b, &tap_b));
    let saved = poll(Duration::from_secs(10), || {
        let port = lab.daemon.get(&format!("/v1/ports/{tap_b}"));
        let locked = &port["locked"];
        (locked["macs"] == serde_json::json!([mac_b]) && locked["ips"] == serde_json::json!([ip_b]))
            .then_some(())
    });
    assert!(
        saved.is_some(),
        "B's locks not persisted: {}",
        lab.daemon.get("/v1/ports")
    );
    // vqosd dies; A takes B's MAC and sends from it without pause while vqosd comes back.
    lab.daemon.kill9();
    in_ns(a, &["ip", "link", "set", "dev", &tap_a, "address", &mac_b]);
    let thief = a.spawn(&["ping", "-i", "0.01", "-c", "1000", &router]);
    let socket = lab.dir.path().join("vqosd.sock");
    lab.daemon = Daemon::start(&lab.config, &socket);
    // B was away (silent) the whole time; its MAC is still its own, so the router reaches it.
    assert_eq!(pings(&lab.sink, &[&ip_b]), 3, "B lost its address to A");
    drop(thief);
    let stats = lab.stats();
    assert!(
        drop_count(&stats, &tap_a, "spoofed") > 0,
        "{}",
        port(&stats, &tap_a)
    );
    assert_eq!(
        lab.daemon.get(&format!("/v1/ports/{tap_b}"))["locked"]["macs"],
        serde_json::json!([mac_b])
    );
}
