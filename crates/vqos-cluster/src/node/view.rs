//! The operators' view of a tenant on the aggregators: its shard's leader, found in etcd, asked
//! what it knows (`vqos cluster status --tenant T --shards N`).

use std::time::Duration;

use etcd_client::Client;

use crate::aggregator::shard_of;
use crate::election::leader_of;
use crate::rpc::client::tenant_view;
use crate::rpc::proto::ViewReply;
use crate::rpc::tls::{self, RpcTls};

/// What a tenant's leader says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderView {
    /// The tenant's shard.
    pub shard: u32,
    /// Where its leader serves.
    pub endpoint: String,
    /// Its answer.
    pub reply: ViewReply,
}

/// Asks the leader of `tenant`'s shard (of `shards`) what it knows of it, over mutual TLS with
/// `tls`; an error says which step failed (no leader, not reachable, not the leader any more).
pub async fn leader_view(
    etcd: &mut Client,
    shards: u32,
    tenant: &str,
    tls: Option<&RpcTls>,
    timeout: Duration,
) -> Result<LeaderView, String> {
    let shard = shard_of(tenant, shards.max(1));
    let found = leader_of(etcd, shard, timeout)
        .await
        .map_err(|e| format!("shard {shard}'s leader: {e}"))?;
    let (endpoint, _) = found.ok_or_else(|| format!("shard {shard} has no leader"))?;
    let channel = tls::connect(&endpoint, tls, timeout)
        .await
        .map_err(|e| format!("shard {shard}'s leader: {e}"))?;
    let at = |e: String| format!("shard {shard}'s leader at {endpoint}: {e}");
    let reply = tokio::time::timeout(timeout, tenant_view(channel, shard, tenant))
        .await
        .map_err(|_| at(format!("no answer within {timeout:?}")))?
        .map_err(|e| at(e.to_string()))?;
    Ok(LeaderView {
        shard,
        endpoint,
        reply,
    })
}
