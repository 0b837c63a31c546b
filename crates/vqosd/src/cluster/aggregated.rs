//! The agent on the aggregators (`[cluster.aggregators]`, docs/cluster.md, "The agent on the
//! aggregators"): the tenant shares come from each shard's elected leader instead of every
//! host reading every other host's status, and a host with `listen` is a candidate for every
//! shard and serves the ones it leads.
//!
//! - **Each period** (run by the agent's etcd session, after its status is written) the host's
//!   side (`vqos_cluster::node::host::HostSide`) starts the tenants etcd declares it in,
//!   lapses what ran out, reports to each shard's leader and applies the answers; the shares
//!   it then holds are fitted to the host's capacity and put in force.
//! - **A watchdog**, every quarter period, puts in force the answers the leaders pushed
//!   since (a raise released by another host, a decrease after a plan: docs/cluster.md,
//!   "Pushed raises"), and lapses the grants on time while no period runs (etcd down, the
//!   session reconnecting), so a host cut off from everything holds its fallbacks one grant
//!   lease after its last answer: what the leaders count for it.
//! - **The node** (with `listen`): a gRPC server, a follower of the desired state and a
//!   candidate per shard on the agent's runtime; it stops (and resigns) with the agent.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use vqos_cluster::desired::DesiredState;
use vqos_cluster::grants::fit;
use vqos_cluster::node::host::HostSide;
use vqos_cluster::node::{self, NodeSpec, Timing};
use vqos_cluster::rpc::server::AggregatorService;
use vqos_cluster::{HostStatus, Share};

use super::config::{AggregatorsConfig, ClusterConfig};
use super::period::fit_to_host;
use crate::api::Api;

/// The host's side, shared by the periods and the watchdog.
#[derive(Clone)]
pub(super) struct Aggregated {
    side: Arc<Mutex<HostSide>>,
    timing: Timing,
    /// The node's service, once started (with `listen`).
    node: Arc<OnceLock<AggregatorService>>,
}

/// The node's timing from the agent's settings: its period and call deadline; grants leased
/// for the status lease's time to live; a 2 s election lease (the design's).
fn timing(config: &ClusterConfig) -> Timing {
    Timing {
        period: config.period,
        timeout: config.timeout,
        election_ttl: Duration::from_secs(2),
        grant_lease: Duration::from_secs(config.lease_ttl_s as u64),
        drift: Duration::from_millis(100),
    }
}

/// Puts `shares` (fitted to the host) in force; a problem if the switch refuses them.
fn enforce(api: &Api, shares: BTreeMap<String, Share>) -> Option<String> {
    let shares = fit_to_host(api, shares);
    api.set_cluster_shares(&shares)
        .err()
        .map(|e| format!("Tenant shares refused by the switch: {e}"))
}

impl Aggregated {
    pub fn new(config: &ClusterConfig, agg: &AggregatorsConfig) -> Aggregated {
        let side =
            HostSide::new(&config.host, agg.shards, config.etcd.clone()).with_tls(agg.tls.clone());
        Aggregated {
            side: Arc::new(Mutex::new(side)),
            timing: timing(config),
            node: Arc::new(OnceLock::new()),
        }
    }

    /// What `shares` fall back to: each tenant's fitted into its grant's fallback (saved, so
    /// that a restart without etcd holds them).
    pub async fn fallback(&self, shares: &BTreeMap<String, Share>) -> BTreeMap<String, Share> {
        let side = self.side.lock().await;
        let mut out = BTreeMap::new();
        for (_, held) in side.holder.iter() {
            let mine = shares
                .iter()
                .filter(|(p, _)| held.shares.contains_key(*p))
                .map(|(p, s)| (p.clone(), *s))
                .collect();
            out.extend(fit(&mine, held.fallback));
        }
        out
    }

    /// Whether this host's node leads shard 0 (it compacts etcd).
    pub fn leads_shard_zero(&self) -> bool {
        self.node.get().is_some_and(|s| s.leading().contains(&0))
    }

    /// One period: report `status`, apply the answers; the problems (leaders not reached,
    /// this host's candidates failing).
    pub async fn period(
        &self,
        api: &Api,
        desired: &DesiredState,
        status: &HostStatus,
    ) -> Vec<String> {
        let t = self.timing;
        let mut side = self.side.lock().await;
        let failed = side.period(desired, status, t.period / 2, t.period).await;
        let mut problems: Vec<String> = failed.iter().map(|e| e.to_string()).collect();
        problems.extend(enforce(api, side.shares()));
        // This host's candidates: a role that cannot stand for election is the operator's to
        // mend, and shows nowhere else.
        if let Some(node) = self.node.get() {
            problems.extend(node.candidacy_problems());
        }
        problems
    }

    /// Applies pushed answers and lapses the grants on time between periods (module doc).
    pub async fn watchdog(self, api: Arc<Api>) {
        let mut tick = tokio::time::interval(self.timing.period / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A period in progress lapses them itself.
            let Ok(mut side) = self.side.try_lock() else {
                continue;
            };
            let pushed = side.take_pushed();
            let lapsed = side.lapse();
            if !lapsed.is_empty() {
                tracing::warn!(
                    "Cluster agent: a tenant grant's lease ran out; its shares held to their fallback"
                );
            }
            if !pushed.is_empty() || !lapsed.is_empty() {
                if let Some(p) = enforce(&api, side.shares()) {
                    tracing::warn!("Cluster agent: {p}");
                }
            }
        }
    }
}

/// Starts the node of `listen` on the current runtime (`vqos_cluster::node::start`), ended
/// by `stop`.
pub(super) async fn start_node(
    config: &ClusterConfig,
    agg: &AggregatorsConfig,
    into: &Aggregated,
    api: &Api,
    stop: watch::Receiver<bool>,
) -> std::io::Result<Option<node::Node>> {
    let Some(listen) = agg.listen else {
        return Ok(None);
    };
    let spec = NodeSpec {
        shards: agg.shards,
        listen,
        endpoint: agg.advertise.clone(),
        timing: timing(config),
        tls: agg.tls.clone(),
    };
    if agg.tls.is_none() {
        tracing::warn!(
            "Cluster agent: aggregator sessions on {listen} are plain http://: any peer that \
             reaches it can report as any host (give [cluster.aggregators] ca_file, cert_file \
             and key_file)"
        );
    }
    let started = node::start(config.etcd.clone(), spec, stop).await?;
    let _ = into.node.set(started.service.clone());
    api.set_aggregator(started.service.clone());
    tracing::info!(
        "Cluster agent: candidate for {} aggregator shard(s), serving on {}",
        agg.shards,
        started.local
    );
    Ok(Some(started))
}
