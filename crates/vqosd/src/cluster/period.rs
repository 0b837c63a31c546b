//! What the agent does every period, apart from etcd: measure its vifs and write its status
//! (the shares from every host's status are `vqos_cluster::local_shares`).

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use vqos_cluster::{estimate, fit_floors, HostStatus, RateWindow, Share, VifStatus};

use super::desired::Desired;
use crate::api::Api;

/// Measures what each vif sends into the switch, from its byte counter, and keeps each vif's
/// last rates for its demand estimate (`vqos_cluster::demand`: the peak of a window).
#[derive(Debug)]
pub(super) struct Meter {
    /// The last reading per vif: bytes read from the port and when.
    last: BTreeMap<String, (u64, Instant)>,
    /// The rate over the last interval per vif, bit/s, and the window of its last rates.
    rates: BTreeMap<String, (u64, RateWindow)>,
    /// The periods a window spans.
    window: usize,
}

impl Meter {
    /// A meter whose windows span `window` periods (`vqos_cluster::window_periods`).
    pub fn new(window: usize) -> Meter {
        Meter {
            last: BTreeMap::new(),
            rates: BTreeMap::new(),
            window,
        }
    }

    /// Takes a reading of every port.
    pub fn measure(&mut self, api: &Api) {
        let now = Instant::now();
        let stats = api.stats();
        let mut last = BTreeMap::new();
        for p in stats.ports {
            let (name, bytes) = (p.stats.name, p.stats.counters.rx_bytes);
            if let Some((before, t)) = self.last.get(&name) {
                let ns = now.duration_since(*t).as_nanos();
                let bits = u128::from(bytes.saturating_sub(*before)) * 8;
                if let Some(bps) = (bits * 1_000_000_000).checked_div(ns) {
                    let bps = u64::try_from(bps).unwrap_or(u64::MAX);
                    let window = self.window;
                    let (rate, w) = self
                        .rates
                        .entry(name.clone())
                        .or_insert_with(|| (0, RateWindow::new(window)));
                    *rate = bps;
                    w.push(bps);
                }
            }
            last.insert(name, (bytes, now));
        }
        self.rates.retain(|n, _| last.contains_key(n));
        self.last = last;
    }

    /// The last measured rate of `port`, bit/s (0 before two readings).
    pub fn rate_bps(&self, port: &str) -> u64 {
        self.rates.get(port).map_or(0, |r| r.0)
    }

    /// The peak of `port`'s window of rates, bit/s (what its estimate reads).
    pub fn peak_bps(&self, port: &str) -> u64 {
        self.rates.get(port).map_or(0, |r| r.1.peak())
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
        let e = estimate(meter.peak_bps(&v.name), share, v.policy.max_bps, probe_bps);
        vifs.insert(
            v.name.clone(),
            VifStatus {
                tenant: desired.tenant_of(&v.name).map(String::from),
                weight: v.policy.weight,
                min_bps: v.policy.min_bps,
                max_bps: v.policy.max_bps,
                rate_bps: meter.rate_bps(&v.name),
                demand_bps: e.demand_bps,
                floor_greedy: e.floor_greedy,
                idle: e.idle,
                share_max_bps: share.and_then(|s| s.max_bps),
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

/// `shares` with their floors fitted to this host's capacity (`vqos_cluster::fit_floors`,
/// over the floors of the vifs' own policies), so the switch never refuses them.
pub(super) fn fit_to_host(
    api: &Api,
    mut shares: BTreeMap<String, Share>,
) -> BTreeMap<String, Share> {
    let set = api.policies();
    let own: BTreeMap<String, u64> = set
        .vifs
        .iter()
        .map(|v| (v.name.clone(), v.policy.min_bps))
        .collect();
    fit_floors(set.capacity_bps, &own, &mut shares);
    shares
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::MockBackend;
    use crate::config::Config;

    #[test]
    fn floors_above_the_hosts_capacity_are_fitted_and_the_switch_takes_them() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "capacity = \"1Gbit\"\nstate_file = \"{}/state.json\"\n\
             [[port]]\nname = \"vm1\"\npolicy = {{ min = \"100Mbit\" }}\n[[port]]\nname = \"vm2\"\n",
            dir.path().display()
        );
        let config = Config::parse(&text, |_| None).unwrap();
        let api = Api::start(&config, Arc::new(MockBackend::new())).unwrap();
        // Two tenants' splits ask this host for floors of 700 + 600 Mbit/s on a 1 Gbit/s link.
        let share = |min_bps| Share {
            min_bps,
            max_bps: None,
        };
        let asked = BTreeMap::from([
            ("vm1".to_string(), share(700_000_000)),
            ("vm2".to_string(), share(600_000_000)),
        ]);
        // As they are, the switch refuses them (and the host's shares froze, issue 24).
        assert!(api.set_cluster_shares(&asked).is_err());
        let fitted = fit_to_host(&api, asked);
        api.set_cluster_shares(&fitted).unwrap();
        // The raises above the own floors (600 + 600) scaled to the room (900): 450 each.
        assert_eq!(api.cluster_shares()["vm1"].min_bps, 550_000_000);
        assert_eq!(api.cluster_shares()["vm2"].min_bps, 450_000_000);
        let eff = api.effective_policies();
        let sum: u64 = eff.vifs.iter().map(|v| v.policy.min_bps).sum();
        assert_eq!(sum, 1_000_000_000);
    }
}
