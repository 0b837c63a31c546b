//! Tests of a host's side of the aggregators: which answers it applies and when it falls back.

use std::collections::BTreeMap;

use super::*;
use crate::grants::Grant;

const M: u64 = 1_000_000;
const MS: u64 = 1_000_000;

fn share(max: Option<u64>, min: u64) -> Share {
    Share {
        min_bps: min * M,
        max_bps: max.map(|m| m * M),
    }
}

/// Two vifs, `a` capped at 300 Mbit/s with a 50 Mbit/s floor and `b` unlimited.
fn vifs() -> BTreeMap<String, Share> {
    BTreeMap::from([
        ("a".to_string(), share(Some(300), 50)),
        ("b".to_string(), share(None, 0)),
    ])
}

/// An answer for tenant `t`: epoch, totals, fallback, a 300 ms lease, shares `a`/`b`.
fn answer(epoch: u64, max: u64, fallback: u64, a: u64, b: u64) -> BTreeMap<String, HostGrant> {
    let grant = Grant {
        epoch,
        max_bps: Some(max * M),
        min_bps: 0,
        fallback_max_bps: Some(fallback * M),
        fallback_min_bps: 0,
        lease_ms: 300,
        unknown: BTreeMap::new(),
    };
    let shares = BTreeMap::from([
        ("a".to_string(), share(Some(a), 0)),
        ("b".to_string(), share(Some(b), 0)),
    ]);
    BTreeMap::from([("t".to_string(), HostGrant { grant, shares })])
}

fn max_of(h: &Holder) -> u64 {
    h.enforcing()["t"].max_bps.unwrap_or(u64::MAX) / M
}

#[test]
fn before_any_grant_the_host_holds_the_fallback_cap_over_its_vifs() {
    let mut h = Holder::default();
    assert!(h.start("t", (Some(200 * M), 20 * M), &vifs()));
    // Water-filled: both want more than 100, so each gets 100; the floors fit into 20.
    let held = h.get("t").unwrap();
    assert_eq!(held.shares["a"], share(Some(100), 20));
    assert_eq!(held.shares["b"], share(Some(100), 0));
    let e = h.enforcing()["t"];
    assert_eq!((e.epoch, e.max_bps, e.min_bps), (0, Some(200 * M), 20 * M));
    // Starting again keeps what it holds.
    assert!(!h.start("t", (Some(900 * M), 0), &vifs()));
    assert_eq!(max_of(&h), 200);
}

#[test]
fn only_a_newer_epoch_within_its_lease_is_applied() {
    let mut h = Holder::default();
    h.start("t", (Some(200 * M), 0), &vifs());
    // Sent at 1 s, answered 50 ms later: applied.
    let sent = 1_000 * MS;
    assert_eq!(
        h.apply(&answer(5, 400, 100, 150, 250), sent, sent + 50 * MS),
        ["t"]
    );
    assert_eq!(max_of(&h), 400);
    // An older epoch arriving late (an earlier answer, or an earlier leader's) is ignored.
    assert!(h
        .apply(&answer(4, 900, 100, 450, 450), sent, sent + 60 * MS)
        .is_empty());
    assert_eq!(h.get("t").unwrap().epoch, 5);
    // A newer answer that arrives after its lease (timed from its report's sending) ran out
    // is ignored: the leader may already count it as lapsed.
    assert!(h
        .apply(&answer(6, 900, 100, 450, 450), sent, sent + 300 * MS)
        .is_empty());
    assert_eq!(max_of(&h), 400);
    // One tenant the host has no vifs in is not taken up.
    let mut other = answer(7, 900, 100, 450, 450);
    let g = other.remove("t").unwrap();
    other.insert("u".to_string(), g);
    assert!(h.apply(&other, sent, sent + 10 * MS).is_empty());
    assert!(h.get("u").is_none());
}

#[test]
fn a_lapsed_lease_falls_back_until_a_newer_grant() {
    let mut h = Holder::default();
    h.start("t", (Some(200 * M), 0), &vifs());
    let sent = 10 * MS;
    h.apply(&answer(3, 400, 100, 150, 250), sent, sent + 20 * MS);
    assert_eq!(h.next_lapse_ns(), Some(sent + 300 * MS));
    assert!(h.lapse(sent + 300 * MS - 1).is_empty());
    assert_eq!(h.lapse(sent + 300 * MS), ["t"]);
    // Water-filled into the fallback: 50 each.
    let held = h.get("t").unwrap();
    assert_eq!(held.shares["a"], share(Some(50), 0));
    assert_eq!(held.shares["b"], share(Some(50), 0));
    assert!(held.lapsed);
    assert_eq!(h.next_lapse_ns(), None);
    // It reports the epoch it last had with the totals in force, so the leader can tell.
    let e = h.enforcing()["t"];
    assert_eq!((e.epoch, e.max_bps), (3, Some(100 * M)));
    h.apply(
        &answer(4, 600, 100, 300, 300),
        sent + 400 * MS,
        sent + 410 * MS,
    );
    assert_eq!(max_of(&h), 600);
}

#[test]
fn shares_above_the_grant_are_fitted_into_it() {
    // A wrong answer (shares summing above its own totals) cannot take the host above what it
    // acknowledges enforcing.
    let mut h = Holder::default();
    h.start("t", (Some(200 * M), 0), &vifs());
    h.apply(&answer(2, 300, 100, 400, 400), 0, MS);
    assert_eq!(max_of(&h), 300);
    h.forget("t");
    assert!(h.enforcing().is_empty());
}
