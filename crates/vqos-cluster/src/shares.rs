//! Every tenant's split over the hosts' published statuses: which vifs belong to which tenant,
//! in the order every agent uses (by host, then port), and the shares of one host's vifs.
//!
//! **Who says what.** A vif's tenant, weight and own cap are what etcd's desired state says
//! ([`Declarations`], from the `/vqos/v1/hosts/<host>/vifs/<port>` documents the operator
//! writes), never what a host publishes: a host's status gives only its measurements (the
//! demand estimate, `floor_greedy`, `idle`) and that it is alive. A compromised host that
//! publishes `weight: 4294967295` or claims another tenant gains nothing; it can at most
//! claim to be greedy, and so take its vifs' weighted share of what the others leave.
//!
//! The agent runs [`local_shares`] every period; the scale simulation (vqos-sim's `cluster`)
//! runs [`all_shares`], the same grouping and the same split for every host at once.
//! [`fit_floors`] then bounds one host's floors by its capacity.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::model::HostStatus;
use crate::split::{split, Member, Share, TenantLimits};

/// What etcd's desired state says of a tenant vif: the only source of its membership, weight
/// and own cap in the split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declared {
    /// Its tenant.
    pub tenant: String,
    /// Its weight (0 is read as 1 by the split).
    pub weight: u32,
    /// Its own cap, bit/s (`None`: unlimited).
    pub max_bps: Option<u64>,
}

/// The tenant vifs of every host as etcd declares them: by host, then port.
pub type Declarations = BTreeMap<String, BTreeMap<String, Declared>>;

/// The declarations the statuses of `all` claim for themselves. Only for a simulation of
/// honest hosts (vqos-sim); an agent takes its declarations from etcd's desired state.
pub fn declared_by_statuses(all: &BTreeMap<String, HostStatus>) -> Declarations {
    all.iter()
        .map(|(h, s)| {
            let vifs = s
                .vifs
                .iter()
                .filter_map(|(port, v)| {
                    let tenant = v.tenant.clone()?;
                    let d = Declared {
                        tenant,
                        weight: v.weight,
                        max_bps: v.max_bps,
                    };
                    Some((port.clone(), d))
                })
                .collect();
            (h.clone(), vifs)
        })
        .collect()
}

/// One tenant's vifs on every host: who (host, port) and what they published, in order.
#[derive(Debug, Default)]
pub struct TenantMembers<'a> {
    /// (host, port) of each member.
    pub who: Vec<(&'a str, &'a str)>,
    /// Its weight and own cap, as declared; its demand, as published.
    pub members: Vec<Member>,
}

/// The members of every tenant: the vifs of `all` (the live hosts' statuses) that `declared`
/// names, with the declared tenant, weight and cap and the published measurements (one pass
/// over every host's vifs, by host, then port: every agent orders them alike, so they compute
/// the same split). A published vif etcd does not declare is no member, whatever it claims.
///
/// Both maps are in the same order (by host, then port), so they are walked side by side
/// rather than one looked up in the other: a leader groups every vif of its shard each period,
/// and the lookups by name were most of that (docs/benchmarks.md, "The aggregator leader's
/// state by tenant").
pub fn group<'a>(
    all: &'a BTreeMap<String, HostStatus>,
    declared: &'a Declarations,
) -> BTreeMap<&'a str, TenantMembers<'a>> {
    let mut out: HashMap<&str, TenantMembers<'_>> = HashMap::new();
    for (h, s, host_decl) in join(all, declared) {
        for (port, v, d) in join(&s.vifs, host_decl) {
            let e = out.entry(d.tenant.as_str()).or_default();
            e.who.push((h.as_str(), port.as_str()));
            e.members.push(Member {
                weight: d.weight,
                max_bps: d.max_bps,
                demand_bps: v.demand_bps,
                floor_greedy: v.floor_greedy,
                idle: v.idle,
            });
        }
    }
    out.into_iter().collect()
}

/// The keys of `a` that `b` has too, with both values, in order: the two sorted maps walked
/// side by side.
fn join<'a, A, B>(
    a: &'a BTreeMap<String, A>,
    b: &'a BTreeMap<String, B>,
) -> impl Iterator<Item = (&'a String, &'a A, &'a B)> {
    let mut b = b.iter().peekable();
    a.iter().filter_map(move |(k, va)| {
        while b.next_if(|(kb, _)| *kb < k).is_some() {}
        let (_, vb) = b.next_if(|(kb, _)| *kb == k)?;
        Some((k, va, vb))
    })
}

/// The shares of `host`'s tenant vifs: for each tenant with a vif here, the split of its
/// limits among its vifs on every host of `all`. Vifs without a tenant, or whose tenant has no
/// valid policy, get none.
pub fn local_shares(
    host: &str,
    all: &BTreeMap<String, HostStatus>,
    declared: &Declarations,
    tenants: &BTreeMap<String, TenantLimits>,
) -> BTreeMap<String, Share> {
    let mut out = BTreeMap::new();
    if !all.contains_key(host) {
        return out;
    }
    let mine: std::collections::BTreeSet<&str> = declared
        .get(host)
        .into_iter()
        .flat_map(|vifs| vifs.values().map(|d| d.tenant.as_str()))
        .collect();
    for (t, m) in group(all, declared) {
        let Some(limits) = tenants.get(t).filter(|_| mine.contains(t)) else {
            continue;
        };
        for ((h, port), share) in m.who.into_iter().zip(split(limits, &m.members)) {
            if h == host {
                out.insert(port.to_string(), share);
            }
        }
    }
    out
}

/// The shares of every tenant vif of every host, by (host, port): what all the agents
/// together apply.
pub fn all_shares(
    all: &BTreeMap<String, HostStatus>,
    declared: &Declarations,
    tenants: &BTreeMap<String, TenantLimits>,
) -> BTreeMap<(String, String), Share> {
    let mut out = BTreeMap::new();
    for (t, m) in group(all, declared) {
        let Some(limits) = tenants.get(t) else {
            continue;
        };
        for ((h, port), share) in m.who.into_iter().zip(split(limits, &m.members)) {
            out.insert((h.to_string(), port.to_string()), share);
        }
    }
    out
}

/// Bounds one host's tenant floors by its capacity, so the switch never refuses the set (it
/// refuses floors that add up above the link, and the host's shares would then freeze).
///
/// `own_min_bps` is every vif of the host with the floor of its own policy (the policy set the
/// switch holds, which fits the capacity by itself). A share raises a vif's floor by
/// `e_i = share_min_i − own_min_i` (when positive). When `Σ own + Σ e` is above
/// `capacity_bps`, every such raise is scaled by the same factor, `room / Σ e` with
/// `room = capacity − Σ own`, rounded down: each tenant vif keeps the same part of its raise,
/// so the host's floors are given out in proportion to what the tenants' splits asked of it.
/// Caps (`max_bps`) are untouched. A host without a finite capacity needs no bound.
pub fn fit_floors(
    capacity_bps: Option<u64>,
    own_min_bps: &BTreeMap<String, u64>,
    shares: &mut BTreeMap<String, Share>,
) {
    let Some(cap) = capacity_bps else {
        return;
    };
    let own = |n: &str| own_min_bps.get(n).copied().unwrap_or(0);
    // u128: at most 2^64 vifs' worth of u64 rates each, no overflow.
    let base: u128 = own_min_bps.values().map(|&m| u128::from(m)).sum();
    let raise: u128 = shares
        .iter()
        .map(|(n, s)| u128::from(s.min_bps.saturating_sub(own(n))))
        .sum();
    let room = u128::from(cap).saturating_sub(base);
    if raise <= room {
        return;
    }
    for (n, s) in shares.iter_mut() {
        let o = own(n);
        let e = u128::from(s.min_bps.saturating_sub(o));
        if e > 0 {
            // e × room / raise ≤ e (room < raise), so the result fits in u64.
            let scaled = u64::try_from(e * room / raise).unwrap_or(u64::MAX);
            s.min_bps = o.saturating_add(scaled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VifStatus;

    #[test]
    fn the_join_keeps_the_keys_both_maps_have_in_order() {
        // Keys drawn from a small alphabet so that the maps overlap in every way: only in a,
        // only in b, in both, at either end, runs of misses on each side.
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for _ in 0..200 {
            let a: BTreeMap<String, u32> = (0..next() % 12)
                .map(|_| (format!("k{}", next() % 16), next()))
                .collect();
            let b: BTreeMap<String, u32> = (0..next() % 12)
                .map(|_| (format!("k{}", next() % 16), next()))
                .collect();
            let joined: Vec<(&String, &u32, &u32)> = join(&a, &b).collect();
            let looked_up: Vec<(&String, &u32, &u32)> = a
                .iter()
                .filter_map(|(k, va)| Some((k, va, b.get(k)?)))
                .collect();
            assert_eq!(joined, looked_up, "{a:?} {b:?}");
        }
    }

    fn vif(tenant: &str, demand: Option<u64>) -> VifStatus {
        VifStatus {
            tenant: Some(tenant.into()),
            weight: 1,
            demand_bps: demand,
            ..Default::default()
        }
    }

    fn host(vifs: &[(&str, VifStatus)]) -> HostStatus {
        HostStatus {
            health: "ok".into(),
            vifs: vifs
                .iter()
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn each_host_takes_its_part_of_the_same_split() {
        let all = BTreeMap::from([
            ("h1".to_string(), host(&[("vm1", vif("acme", None))])),
            (
                "h2".to_string(),
                host(&[
                    ("vm2", vif("acme", None)),
                    ("vm3", vif("acme", Some(100))),
                    ("vm4", vif("other", None)),
                ]),
            ),
        ]);
        let tenants = BTreeMap::from([(
            "acme".to_string(),
            TenantLimits {
                min_bps: 0,
                max_bps: Some(1000),
            },
        )]);
        let declared = declared_by_statuses(&all);
        let h1 = local_shares("h1", &all, &declared, &tenants);
        let h2 = local_shares("h2", &all, &declared, &tenants);
        assert_eq!(h1["vm1"].max_bps, Some(450));
        assert_eq!(h2["vm2"].max_bps, Some(450));
        assert_eq!(h2["vm3"].max_bps, Some(100));
        // A tenant without a policy gives no share; an absent host none either.
        assert!(!h2.contains_key("vm4"));
        assert!(local_shares("h3", &all, &declared, &tenants).is_empty());
        // The view of all the agents at once is each one's.
        let every = all_shares(&all, &declared, &tenants);
        assert_eq!(every.len(), 3);
        assert_eq!(every[&("h1".into(), "vm1".into())], h1["vm1"]);
        assert_eq!(every[&("h2".into(), "vm3".into())], h2["vm3"]);
        // When h1's status expires, h2 takes the whole max.
        let alone = BTreeMap::from([("h2".to_string(), all["h2"].clone())]);
        assert_eq!(
            local_shares("h2", &alone, &declared, &tenants)["vm2"].max_bps,
            Some(900)
        );
    }

    fn acme(max: u64) -> BTreeMap<String, TenantLimits> {
        BTreeMap::from([(
            "acme".to_string(),
            TenantLimits {
                min_bps: max / 2,
                max_bps: Some(max),
            },
        )])
    }

    fn declare(weight: u32) -> Declared {
        Declared {
            tenant: "acme".into(),
            weight,
            max_bps: None,
        }
    }

    #[test]
    fn a_host_gains_nothing_by_publishing_a_weight_or_a_tenant() {
        // etcd says: h1/vm1 and h2/vm2 of acme, weight 1 each; h2/vm3 has no tenant.
        let declared: Declarations = BTreeMap::from([
            ("h1".into(), BTreeMap::from([("vm1".into(), declare(1))])),
            ("h2".into(), BTreeMap::from([("vm2".into(), declare(1))])),
        ]);
        // h2 is compromised: it publishes the largest weight and an own cap of none for vm2,
        // and vm3 as a greedy vif of acme too.
        let mut liar = vif("acme", None);
        liar.weight = u32::MAX;
        let all = BTreeMap::from([
            ("h1".to_string(), host(&[("vm1", vif("acme", None))])),
            (
                "h2".to_string(),
                host(&[("vm2", liar.clone()), ("vm3", liar)]),
            ),
        ]);
        let tenants = acme(1000);
        let h1 = local_shares("h1", &all, &declared, &tenants);
        let h2 = local_shares("h2", &all, &declared, &tenants);
        // Weights as declared: 500 + 500 of the max, 250 + 250 of the floor; vm3 is no member.
        assert_eq!(h1["vm1"].max_bps, Some(500));
        assert_eq!(h2["vm2"].max_bps, Some(500));
        assert_eq!((h1["vm1"].min_bps, h2["vm2"].min_bps), (250, 250));
        assert!(!h2.contains_key("vm3"));
        // The same statuses, trusted, would have given h2 nearly everything.
        let trusting = local_shares("h1", &all, &declared_by_statuses(&all), &tenants);
        assert!(trusting["vm1"].max_bps < Some(2), "{trusting:?}");
        // A host etcd declares nothing for gets nothing, whatever its status says.
        assert!(local_shares("h3", &all, &declared, &tenants).is_empty());
    }

    fn share(min_bps: u64) -> Share {
        Share {
            min_bps,
            max_bps: None,
        }
    }

    #[test]
    fn floors_above_a_hosts_capacity_are_scaled_down_alike() {
        // Capacity 1000; vm9 has an own floor of 200; two tenant vifs with own floors 0 and
        // 100 are given floors of 600 and 500: they raise the host's floors by 600 + 400 where
        // 1000 − 300 = 700 is room. Each raise is scaled by 700 / 1000.
        let own = BTreeMap::from([
            ("vm1".to_string(), 0),
            ("vm2".to_string(), 100),
            ("vm9".to_string(), 200),
        ]);
        let mut shares = BTreeMap::from([
            ("vm1".to_string(), share(600)),
            ("vm2".to_string(), share(500)),
        ]);
        fit_floors(Some(1000), &own, &mut shares);
        assert_eq!((shares["vm1"].min_bps, shares["vm2"].min_bps), (420, 380));
        // The switch's floors: 420 + max(100, 380) + 200, the whole capacity and no more.
        assert_eq!(shares["vm1"].min_bps + shares["vm2"].min_bps + 200, 1000);
        // Floors that fit, or no finite capacity: untouched.
        let mut fits = BTreeMap::from([("vm1".to_string(), share(700))]);
        fit_floors(Some(1000), &own, &mut fits);
        assert_eq!(fits["vm1"].min_bps, 700);
        let mut unbounded = BTreeMap::from([("vm1".to_string(), share(u64::MAX))]);
        fit_floors(None, &own, &mut unbounded);
        assert_eq!(unbounded["vm1"].min_bps, u64::MAX);
        // A share below the vif's own floor is no raise (the own floor is in force anyway).
        let mut below = BTreeMap::from([
            ("vm2".to_string(), share(50)),
            ("vm1".to_string(), share(u64::MAX)),
        ]);
        fit_floors(Some(1000), &own, &mut below);
        assert_eq!(below["vm2"].min_bps, 50);
        assert_eq!(below["vm1"].min_bps, 700);
    }
}
