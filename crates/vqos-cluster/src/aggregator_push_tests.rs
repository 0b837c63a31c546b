//! Tests of the pushed answers (`aggregator_push.rs`): decisions alone, time stepped. The
//! bound with pushes is the property test of the parent module (`run(.., push)`).

use super::*;

fn shift_to_greedy_h0() -> (
    Leader,
    [Enforcing; 2],
    u64,
    Declarations,
    BTreeMap<String, TenantLimits>,
) {
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 0))]);
    let decl = declared(&[1, 1]);
    let (mut l, held, now) = settled(110, 890, &tenants);
    // h0 turns greedy: the split says 500 each.
    l.reports
        .insert("h0".into(), report(0, None, held[0]).status);
    (l, held, now, decl, tenants)
}

#[test]
fn a_decrease_is_pushed_at_the_plan_and_a_confirmed_release_to_the_host_short_of_it() {
    let (mut l, mut held, mut now, decl, tenants) = shift_to_greedy_h0();
    l.plan(&decl, &tenants);
    // At the plan: h1's target fell below the 890 it was sent; it is told at once.
    let pushed = l.push(now);
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    assert_eq!(pushed[0].0, "h1");
    assert_eq!(mbit(holds(&pushed[0].1["t"])), 500);
    held[1] = holds(&pushed[0].1["t"]);
    // h0 reports: h1 has not confirmed, so h0 keeps 110 and is short.
    let g0 = l.report(report(0, None, held[0]), now);
    assert_eq!(mbit(holds(&g0["t"])), 110);
    held[0] = holds(&g0["t"]);
    assert!(l.push(now).is_empty(), "nothing released yet");
    // h1 reports holding the pushed 500: the release is confirmed, and h0 gets its raise
    // without reporting.
    now += 30 * MS;
    l.report(report(1, Some(890), held[1]), now);
    let pushed = l.push(now);
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    assert_eq!(pushed[0].0, "h0");
    let g = &pushed[0].1["t"];
    assert_eq!(mbit(holds(g)), 500);
    assert_eq!(g.shares["vm"].max_bps, Some(500 * M));
    assert!(g.grant.epoch > held[0].epoch, "a newer grant");
    // Said once: no release since.
    assert!(l.push(now).is_empty());
}

#[test]
fn without_a_push_the_raise_waits_for_the_short_hosts_report() {
    let (mut l, mut held, mut now, decl, tenants) = shift_to_greedy_h0();
    l.plan(&decl, &tenants);
    // Pushes not taken: h1 hears of its decrease only when it reports.
    let g1 = l.report(report(1, Some(890), held[1]), now);
    held[1] = holds(&g1["t"]);
    let g0 = l.report(report(0, None, held[0]), now);
    assert_eq!(mbit(holds(&g0["t"])), 110);
    now += 100 * MS;
    l.report(report(1, Some(890), held[1]), now);
    // The release is confirmed; a push would carry h0's raise, and a report does too.
    let g0 = l.report(report(0, None, held[0]), now);
    assert_eq!(mbit(holds(&g0["t"])), 500);
    // h0 was answered in full: nobody short, nothing to push.
    assert!(l.push(now).is_empty());
}

#[test]
fn nothing_is_pushed_in_a_new_leaders_hold() {
    let tenants = BTreeMap::from([("t".to_string(), limits(1000, 0))]);
    let decl = declared(&[1, 1]);
    // A leader of term 2 starting at 1 s, h1 reporting the 890 of term 1's grant.
    let start = 1_000 * MS;
    let mut l = Leader::new(2, start, LEASE, DRIFT);
    let old = Enforcing {
        epoch: (1 << 32) | 7,
        max_bps: Some(890 * M),
        min_bps: 0,
    };
    l.reports
        .insert("h0".into(), report(0, None, nothing()).status);
    l.reports
        .insert("h1".into(), report(1, Some(100), old).status);
    l.plan(&decl, &tenants);
    let g0 = l.report(report(0, None, nothing()), start);
    assert_eq!(
        mbit(holds(&g0["t"])),
        0,
        "nobody above what they hold in the hold"
    );
    l.report(report(1, Some(100), old), start + MS);
    assert!(l.push(start + MS).is_empty());
}
