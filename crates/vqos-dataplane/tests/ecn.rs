//! CE marking with each vif's PID-ECN probability, on both of its directions: frames from the
//! uplink to the vif, and frames the vif sends to the uplink. Stepped in virtual time on
//! in-memory ports ([`common::VRig`]); probabilities 0 and 1 make every count exact.

mod common;

use common::*;
use vqos_dataplane::frame::ipv4_checksum;
use vqos_dataplane::{MemPort, PortSpec, VNET_HDR_LEN};
use vqos_sched::VifPolicy;

#[test]
fn ecn_probability_marks_uplink_to_vif_frames() {
    let mut r = VRig::new();
    r.u.inject(frame(BCAST, MAC_U, 1));
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.b.inject(frame(MAC_U, MAC_B, 1));
    r.run();
    for p in [&r.u, &r.a, &r.b] {
        p.take_sent();
    }
    let e = r.sw.set_ecn_probabilities(&named(&[("zz", 1.0)]), r.now);
    assert_eq!(e.unwrap_err().to_string(), "Unknown port 'zz'");
    let e =
        r.sw.set_ecn_probabilities(&named(&[("b", 0.0), ("a", 1.5)]), r.now);
    assert_eq!(
        e.unwrap_err().to_string(),
        "Vif 'a': ECN probability 1.5 is outside 0..=1"
    );
    let e = r.sw.set_ecn_probabilities(&named(&[("up", 0.5)]), r.now);
    assert!(e.is_err(), "the uplink has none");
    assert_eq!(r.sw.ecn_probability("b"), Some(0.0), "refused");
    assert_eq!(r.sw.ecn_probability("up"), None);
    r.sw.set_ecn_probabilities(&named(&[("a", 1.0)]), r.now)
        .unwrap();
    assert_eq!(r.sw.ecn_probability("a"), Some(1.0));
    for _ in 0..10 {
        r.u.inject(ect_frame(MAC_A, MAC_U));
        r.u.inject(ect_frame(MAC_B, MAC_U));
    }
    r.run();
    let to_a = r.a.take_sent();
    let to_b = r.b.take_sent();
    assert_eq!((to_a.len(), to_b.len()), (10, 10));
    for f in &to_a {
        let ip = &f[VNET_HDR_LEN + 14..VNET_HDR_LEN + 34];
        assert_eq!(ip[1] & 3, 3, "CE set");
        assert_eq!(ipv4_checksum(ip), 0, "checksum fixed");
    }
    for f in &to_b {
        assert_eq!(f[VNET_HDR_LEN + 15] & 3, 2, "b not marked");
    }
    assert_eq!(r.stats().port("a").unwrap().counters.ecn_marked, 10);
    // Not-ECT frames chosen for marking are left alone and counted.
    for _ in 0..3 {
        r.u.inject(frame(MAC_A, MAC_U, 9));
    }
    r.run();
    let got = r.a.take_sent();
    assert_eq!(got.len(), 3);
    for f in got {
        assert_eq!(f, frame(MAC_A, MAC_U, 9), "unchanged");
    }
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.ecn_not_ect, 3);
    assert_eq!(s.port("a").unwrap().counters.ecn_marked, 10);
}

#[test]
fn ecn_probability_marks_what_a_vif_sends_to_the_uplink() {
    let mut r = VRig::new();
    // Learn every address, so the frames below are unicast.
    r.u.inject(frame(BCAST, MAC_U, 1));
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.b.inject(frame(MAC_U, MAC_B, 1));
    r.run();
    for p in [&r.u, &r.a, &r.b] {
        p.take_sent();
    }
    r.sw.set_ecn_probabilities(&named(&[("a", 1.0), ("b", 0.0)]), r.now)
        .unwrap();
    // a (probability 1) sends 10 ECT frames to the uplink and 4 to b; b (0) sends 10.
    for _ in 0..10 {
        r.a.inject(ect_frame(MAC_U, MAC_A));
        r.b.inject(ect_frame(MAC_U, MAC_B));
    }
    for _ in 0..4 {
        r.a.inject(ect_frame(MAC_B, MAC_A));
    }
    r.run();
    let up = r.u.take_sent();
    assert_eq!(up.len(), 20);
    let ce = |f: &Vec<u8>| f[VNET_HDR_LEN + 15] & 3 == 3;
    let from =
        |f: &Vec<u8>, mac: u64| f[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12] == mac.to_be_bytes()[2..];
    for f in &up {
        if from(f, MAC_A) {
            assert!(ce(f), "a's frame to the uplink marked");
            assert_eq!(ipv4_checksum(&f[VNET_HDR_LEN + 14..VNET_HDR_LEN + 34]), 0);
        } else {
            assert_eq!(f[VNET_HDR_LEN + 15] & 3, 2, "b's frame left ECT(0)");
        }
    }
    // vif → vif is not a vif's data toward the outside: a's frames to b are not marked.
    let to_b = r.b.take_sent();
    assert_eq!(to_b.len(), 4);
    assert!(to_b.iter().all(|f| !ce(f)));
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.ecn_marked, 10);
    assert_eq!(s.port("b").unwrap().counters.ecn_marked, 0);
    // Not-ECT frames chosen for marking are left alone and counted.
    for _ in 0..3 {
        r.a.inject(frame(MAC_U, MAC_A, 9));
    }
    r.run();
    let got = r.u.take_sent();
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|f| *f == frame(MAC_U, MAC_A, 9)),
        "unchanged"
    );
    let s = r.stats();
    assert_eq!(s.port("a").unwrap().counters.ecn_not_ect, 3);
    assert_eq!(s.port("a").unwrap().counters.ecn_marked, 10);
    // Probability 0 again: nothing more is marked.
    r.sw.set_ecn_probabilities(&[], r.now).unwrap();
    for _ in 0..5 {
        r.a.inject(ect_frame(MAC_U, MAC_A));
    }
    r.run();
    assert!(r.u.take_sent().iter().all(|f| !ce(f)));
    assert_eq!(r.stats().port("a").unwrap().counters.ecn_marked, 10);
}

/// The PID-ECN controller computes its probabilities for the vifs it knows, then the switch
/// applies them: a port removed and another added in between (the vif count unchanged) must
/// not move a probability to another vif. (Given by position in the policy order, as they
/// once were, b's went to c.)
#[test]
fn ecn_probabilities_stay_with_their_vifs_when_ports_change_before_they_apply() {
    let mut r = VRig::new();
    let probabilities: Vec<(String, f64)> = (r.sw.policies().vifs.iter())
        .map(|v| (v.name.clone(), if v.name == "b" { 1.0 } else { 0.0 }))
        .collect();
    r.sw.remove_port("a", r.now).unwrap();
    let (pc, _c) = MemPort::pair("c", 10_000);
    (r.sw
        .add_port(PortSpec::custom(Box::new(pc)), VifPolicy::default(), r.now))
    .unwrap();
    let e = r.sw.set_ecn_probabilities(&probabilities, r.now);
    assert_eq!(e.unwrap_err().to_string(), "Unknown port 'a'", "a is gone");
    let still: Vec<(String, f64)> = probabilities
        .into_iter()
        .filter(|(n, _)| n != "a")
        .collect();
    r.sw.set_ecn_probabilities(&still, r.now).unwrap();
    assert_eq!(r.sw.ecn_probability("b"), Some(1.0), "b keeps its own");
    assert_eq!(r.sw.ecn_probability("c"), Some(0.0), "c gets none");
}

/// Probabilities by vif name.
fn named(p: &[(&str, f64)]) -> Vec<(String, f64)> {
    p.iter().map(|&(n, p)| (n.to_string(), p)).collect()
}

#[test]
fn the_paper_variant_marks_only_what_a_vif_receives() {
    let mut r = VRig::with(
        |c| c.variant = vqos_sched::Variant::Paper,
        Default::default(),
    );
    r.u.inject(frame(BCAST, MAC_U, 1));
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.run();
    for p in [&r.u, &r.a, &r.b] {
        p.take_sent();
    }
    r.sw.set_ecn_probabilities(&named(&[("a", 1.0)]), r.now)
        .unwrap();
    for _ in 0..10 {
        r.a.inject(ect_frame(MAC_U, MAC_A));
        r.u.inject(ect_frame(MAC_A, MAC_U));
    }
    r.run();
    let ce = |f: &Vec<u8>| f[VNET_HDR_LEN + 15] & 3 == 3;
    let (up, to_a) = (r.u.take_sent(), r.a.take_sent());
    assert_eq!((up.len(), to_a.len()), (10, 10));
    assert!(up.iter().all(|f| !ce(f)), "what a sends is not marked");
    assert!(to_a.iter().all(ce), "what a receives is marked");
    assert_eq!(r.stats().port("a").unwrap().counters.ecn_marked, 10);
}
