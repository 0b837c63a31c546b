//! What the agent does every period, apart from etcd: measure its vifs, write its status,
//! compute its tenant vifs' shares from every host's status.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use vqos_cluster::{estimate_demand, split, HostStatus, Member, Share, TenantLimits, VifStatus};

use super::desired::Desired;
use crate::api::Api;

/// Measures what each vif sends into the switch, from its byte counter.
#[derive(Debug, Default)]
pub(super) struct Meter {
    /// The last reading per vif: bytes read from the port and when.
    last: BTreeMap<String, (u64, Instant)>,
    /// The rate over the last interval per vif, bit/s.
    rates_bps: BTreeMap<String, u64>,
}

impl Meter {
    /// Takes a reading of every port.
    pub fn measure(&mut self, api: &Api) {
        let now = Instant::now();
        let stats = api.stats();
        let mut last = BTreeMap::new();
        for p in stats.ports {
            let (name, bytes) = (p.stats.name, p.stats.rx_bytes);
            if let Some((before, t)) = self.last.get(&name) {
                let ns = now.duration_since(*t).as_nanos();
                let bits = u128::from(bytes.saturating_sub(*before)) * 8;
                if let Some(bps) = (bits * 1_000_000_000).checked_div(ns) {
                    self.rates_bps
                        .insert(name.clone(), u64::try_from(bps).unwrap_or(u64::MAX));
                }
            }
            last.insert(name, (bytes, now));
        }
        self.rates_bps.retain(|n, _| last.contains_key(n));
        self.last = last;
    }

    /// The last measured rate of `port`, bit/s (0 before two readings).
    pub fn rate_bps(&self, port: &str) -> u64 {
        self.rates_bps.get(port).copied().unwrap_or(0)
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// This host's status: every vif etcd names that exists here, with its own policy, measured
/// rate, demand estimate and the share in force.
pub(super) fn own_status(
    api: &Api,
    desired: &Desired,
    meter: &Meter,
    probe_bps: u64,
    period_ms: u64,
) -> HostStatus {
    let policies = api.policies();
    let shares = api.cluster_shares();
    let mut vifs = BTreeMap::new();
    for v in &policies.vifs {
        if !desired.vifs.contains_key(&v.name) {
            continue;
        }
        let share = shares.get(&v.name);
        let rate_bps = meter.rate_bps(&v.name);
        let share_max = share.and_then(|s| s.max_bps);
        vifs.insert(
            v.name.clone(),
            VifStatus {
                tenant: desired.tenant_of(&v.name).map(String::from),
                weight: v.policy.weight,
                min_bps: v.policy.min_bps,
                max_bps: v.policy.max_bps,
                rate_bps,
                demand_bps: estimate_demand(rate_bps, share_max.or(v.policy.max_bps), probe_bps),
                share_max_bps: share_max,
                share_min_bps: share.map(|s| s.min_bps),
            },
        );
    }
    HostStatus {
        health: api
            .backend()
            .loop_health()
            .problem()
            .unwrap_or_else(|| "ok".to_string()),
        updated_unix_ms: now_ms(),
        period_ms,
        vifs,
        errors: desired.problems.clone(),
    }
}

/// The shares of `host`'s tenant vifs: for each tenant with a vif here, the split of its
/// limits among its vifs on every host of `all` (by host, then port: every agent orders them
/// alike). Vifs without a tenant, or whose tenant has no valid policy, get none.
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
    for t in mine {
        let Some(limits) = tenants.get(t) else {
            continue;
        };
        let mut who = Vec::new();
        let mut members = Vec::new();
        for (h, s) in all {
            for (port, v) in &s.vifs {
                if v.tenant.as_deref() == Some(t) {
                    who.push((h.as_str(), port.as_str()));
                    members.push(Member {
                        weight: v.weight,
                        max_bps: v.max_bps,
                        demand_bps: v.demand_bps,
                    });
                }
            }
        }
        for ((h, port), share) in who.into_iter().zip(split(limits, &members)) {
            if h == host {
                out.insert(port.to_string(), share);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // When h1's status expires, h2 takes the whole max.
        let alone = BTreeMap::from([("h2".to_string(), all["h2"].clone())]);
        assert_eq!(
            local_shares("h2", &alone, &tenants)["vm2"].max_bps,
            Some(900)
        );
    }
}
