//! Every tenant's split over the hosts' published statuses: which vifs belong to which tenant,
//! in the order every agent uses (by host, then port), and the shares of one host's vifs.
//!
//! The agent runs [`local_shares`] every period; the scale simulation (vqos-sim's `cluster`)
//! runs [`all_shares`], the same grouping and the same split for every host at once.

use std::collections::BTreeMap;

use crate::model::HostStatus;
use crate::split::{split, Member, Share, TenantLimits};

/// One tenant's vifs on every host: who (host, port) and what they published, in order.
#[derive(Debug, Default)]
pub struct TenantMembers<'a> {
    /// (host, port) of each member.
    pub who: Vec<(&'a str, &'a str)>,
    /// Its weight, own cap and demand, as published.
    pub members: Vec<Member>,
}

/// The members of every tenant named in `all` (one pass over every host's vifs, by host, then
/// port: every agent orders them alike, so they compute the same split).
pub fn group(all: &BTreeMap<String, HostStatus>) -> BTreeMap<&str, TenantMembers<'_>> {
    let mut out: BTreeMap<&str, TenantMembers<'_>> = BTreeMap::new();
    for (h, s) in all {
        for (port, v) in &s.vifs {
            let Some(t) = v.tenant.as_deref() else {
                continue;
            };
            let e = out.entry(t).or_default();
            e.who.push((h.as_str(), port.as_str()));
            e.members.push(Member {
                weight: v.weight,
                max_bps: v.max_bps,
                demand_bps: v.demand_bps,
                floor_greedy: v.floor_greedy,
            });
        }
    }
    out
}

/// The shares of `host`'s tenant vifs: for each tenant with a vif here, the split of its
/// limits among its vifs on every host of `all`. Vifs without a tenant, or whose tenant has no
/// valid policy, get none.
pub fn local_shares(
    host: &str,
    all: &BTreeMap<String, HostStatus>,
    tenants: &BTreeMap<String, TenantLimits>,
) -> BTreeMap<String, Share> {
    let mut out = BTreeMap::new();
    let Some(own) = all.get(host) else {
        return out;
    };
    let mine: std::collections::BTreeSet<&str> = own
        .vifs
        .values()
        .filter_map(|v| v.tenant.as_deref())
        .collect();
    for (t, m) in group(all) {
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
    tenants: &BTreeMap<String, TenantLimits>,
) -> BTreeMap<(String, String), Share> {
    let mut out = BTreeMap::new();
    for (t, m) in group(all) {
        let Some(limits) = tenants.get(t) else {
            continue;
        };
        for ((h, port), share) in m.who.into_iter().zip(split(limits, &m.members)) {
            out.insert((h.to_string(), port.to_string()), share);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VifStatus;

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
        let h1 = local_shares("h1", &all, &tenants);
        let h2 = local_shares("h2", &all, &tenants);
        assert_eq!(h1["vm1"].max_bps, Some(450));
        assert_eq!(h2["vm2"].max_bps, Some(450));
        assert_eq!(h2["vm3"].max_bps, Some(100));
        // A tenant without a policy gives no share; an absent host none either.
        assert!(!h2.contains_key("vm4"));
        assert!(local_shares("h3", &all, &tenants).is_empty());
        // The view of all the agents at once is each one's.
        let every = all_shares(&all, &tenants);
        assert_eq!(every.len(), 3);
        assert_eq!(every[&("h1".into(), "vm1".into())], h1["vm1"]);
        assert_eq!(every[&("h2".into(), "vm3".into())], h2["vm3"]);
        // When h1's status expires, h2 takes the whole max.
        let alone = BTreeMap::from([("h2".to_string(), all["h2"].clone())]);
        assert_eq!(
            local_shares("h2", &alone, &tenants)["vm2"].max_bps,
            Some(900)
        );
    }
}
