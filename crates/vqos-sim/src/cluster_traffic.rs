//! The etcd traffic of one period of the cluster simulation: as implemented (every agent reads
//! every status) and projected for the sharded and hierarchical layouts.

use std::collections::BTreeMap;

use serde::Serialize;
use vqos_cluster::{HostStatus, VifStatus};

/// Keys and bytes in etcd per period: as implemented, and sharded per tenant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Traffic {
    /// Status keys written per period (one per host).
    pub keys_written: u64,
    /// Bytes written per period (keys and JSON values).
    pub bytes_written: u64,
    /// Bytes each agent reads per period: every status (the whole prefix).
    pub bytes_read_per_agent: u64,
    /// Bytes etcd serves per period, all agents together.
    pub bytes_read_total: u128,
    /// Sharded per tenant (`/vqos/v1/demand/<tenant>/<host>`, read by the tenant's hosts
    /// only): keys written per period.
    pub sharded_keys_written: u64,
    /// Sharded: the mean bytes an agent reads per period.
    pub sharded_read_per_agent_mean: u64,
    /// Sharded: the most an agent reads per period.
    pub sharded_read_per_agent_max: u64,
    /// Sharded: bytes etcd serves per period, all agents together.
    pub sharded_read_total: u128,
    /// Two levels (projected): each host publishes one aggregate per tenant (the sum of its
    /// vifs' weights and demands) and the agents split the tenant among hosts, then each host
    /// among its vifs: the mean bytes an agent reads per period.
    pub aggregate_read_per_agent_mean: u64,
    /// Two levels: the most an agent reads per period.
    pub aggregate_read_per_agent_max: u64,
    /// Two levels: bytes etcd serves per period, all agents together.
    pub aggregate_read_total: u128,
    /// With a per-tenant aggregator (projected): one process per tenant reads that tenant's
    /// per-host aggregates and writes each host one key of its shares; bytes it reads per
    /// period, all tenants together (each agent then reads its own shares key only).
    pub aggregator_read_total: u64,
}

/// The etcd traffic of `all` (the statuses of one period).
pub fn traffic(all: &BTreeMap<String, HostStatus>) -> Traffic {
    let mut written = 0u64;
    // Sharded: per (tenant, host), the host's vifs of that tenant.
    let mut shard: BTreeMap<(&str, &str), BTreeMap<&str, &VifStatus>> = BTreeMap::new();
    for (h, s) in all {
        let value = serde_json::to_vec(s).map(|v| v.len()).unwrap_or(0);
        written += (vqos_cluster::keys::status(h).len() + value) as u64;
        for (port, v) in &s.vifs {
            if let Some(t) = v.tenant.as_deref() {
                shard
                    .entry((t, h.as_str()))
                    .or_default()
                    .insert(port.as_str(), v);
            }
        }
    }
    // Per tenant: the bytes of its sharded keys, and of its per-host aggregates.
    let mut per_tenant: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut tenants_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for ((t, h), vifs) in &shard {
        let key = format!("/vqos/v1/demand/{t}/{h}").len();
        let value = serde_json::to_vec(vifs).map(|v| v.len()).unwrap_or(0);
        let weight: u64 = vifs.values().map(|v| u64::from(v.weight)).sum();
        let demand: Option<u64> = vifs.values().map(|v| v.demand_bps).sum();
        let max: Option<u64> = vifs.values().map(|v| v.max_bps).sum();
        let aggregate = serde_json::json!({"weight": weight, "max_bps": max, "demand_bps": demand});
        let e = per_tenant.entry(t).or_default();
        e.0 += (key + value) as u64;
        e.1 += (key + aggregate.to_string().len()) as u64;
        tenants_of.entry(h).or_default().push(t);
    }
    let read = |pick: fn(&(u64, u64)) -> u64| -> Vec<u64> {
        all.keys()
            .map(|h| {
                tenants_of
                    .get(h.as_str())
                    .map_or(0, |ts| ts.iter().map(|t| pick(&per_tenant[t])).sum())
            })
            .collect()
    };
    let reads = read(|e| e.0);
    let aggregates = read(|e| e.1);
    let hosts = all.len().max(1) as u64;
    Traffic {
        keys_written: all.len() as u64,
        bytes_written: written,
        bytes_read_per_agent: written,
        bytes_read_total: u128::from(written) * u128::from(hosts),
        sharded_keys_written: shard.len() as u64,
        sharded_read_per_agent_mean: reads.iter().sum::<u64>() / hosts,
        sharded_read_per_agent_max: reads.iter().copied().max().unwrap_or(0),
        sharded_read_total: reads.iter().map(|&r| u128::from(r)).sum(),
        aggregate_read_per_agent_mean: aggregates.iter().sum::<u64>() / hosts,
        aggregate_read_per_agent_max: aggregates.iter().copied().max().unwrap_or(0),
        aggregate_read_total: aggregates.iter().map(|&r| u128::from(r)).sum(),
        aggregator_read_total: per_tenant.values().map(|e| e.1).sum(),
    }
}
