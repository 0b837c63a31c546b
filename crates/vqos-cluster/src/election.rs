//! Who leads each aggregator shard, and in which term (docs/cluster.md, "Design:
//! aggregators"): etcd's election API on `/vqos/v1/aggregators/<shard>/leader`, under a lease of the
//! candidate's own, and a term counter beside it.
//!
//! ## Behavior
//! - **Campaign** ([`campaign`]): a candidate takes a lease of `ttl`, keeps it alive, and
//!   campaigns with its endpoint (where hosts reach its gRPC service) as the value; etcd
//!   answers when it leads (a campaign waits while another candidate leads).
//! - **Term**: once elected, the candidate increments `/vqos/v1/aggregators/<shard>/term` in a
//!   transaction that succeeds only while its own election key still exists and the counter
//!   is as it read it, so two candidates never get the same term and a leader that lost its
//!   key before counting gets none. The term goes into the high 32 bits of every epoch the
//!   leader grants ([`crate::aggregator::Leader::new`]): a grant of an earlier term is never
//!   taken for one of this term.
//! - **Knowing when to stop** ([`Elected::valid_until`]): a leader may grant only while its
//!   lease surely lives, counted on its own clock from the last keep-alive etcd confirmed:
//!   `confirmed + ttl × 2/3`. Past that it stops answering; etcd drops its key at the latest
//!   `ttl` after the last keep-alive, so a new leader's term never overlaps a grant of this
//!   one (the hosts' leases and the new leader's hold cover the grants already sent).
//! - **Finding the leader** ([`leader_of`]): the current leader's endpoint and its election
//!   key's revision, or none.
//! - **Resign** ([`Elected::resign`]): the key and the lease go at once, so the next candidate
//!   need not wait out the lease.

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, LeaderKey, ResignOptions, Txn, TxnOp};

use crate::etcd::{deadline, kv_client, EtcdError};
use crate::keys;

/// `/vqos/v1/aggregators/<shard>/leader`: the election of a shard's leader (etcd keeps each
/// candidate's key under it: nothing else may live under that prefix, or a campaign would
/// wait for it to go).
pub fn election(shard: u32) -> String {
    format!("{}{shard}/leader", keys::AGGREGATORS)
}

/// `/vqos/v1/aggregators/<shard>/term`: how many terms the shard has had.
pub fn term_key(shard: u32) -> String {
    format!("{}{shard}/term", keys::AGGREGATORS)
}

/// A candidate that leads its shard.
#[derive(Debug)]
pub struct Elected {
    /// The shard.
    pub shard: u32,
    /// Its term (1 for the shard's first leader).
    pub term: u32,
    /// Its election key, for resigning.
    pub key: LeaderKey,
    /// Its lease.
    pub lease: i64,
    /// The lease's time to live.
    pub ttl: Duration,
    /// When etcd last confirmed the lease alive, on this host's clock.
    pub confirmed: Instant,
}

impl Elected {
    /// Until when it may grant: two thirds of the lease after etcd last confirmed it.
    pub fn valid_until(&self) -> Instant {
        self.confirmed + self.ttl * 2 / 3
    }

    /// Keeps the lease alive once; on success moves [`Elected::confirmed`] to when the call
    /// was made (not when it returned: the lease was renewed no earlier than that).
    pub async fn keep_alive(
        &mut self,
        client: &mut Client,
        timeout: Duration,
    ) -> Result<(), EtcdError> {
        let asked = Instant::now();
        let expired = || {
            let shard = self.shard;
            EtcdError::Lead(format!("the lease of shard {shard}'s leader has expired"))
        };
        let gone = |e: EtcdError| match e {
            EtcdError::Client(c) if c.to_string().contains("lease not found") => expired(),
            e => e,
        };
        let (mut keeper, mut stream) = deadline(
            "lease keep-alive",
            timeout,
            client.lease_keep_alive(self.lease),
        )
        .await
        .map_err(gone)?;
        let once = async {
            keeper.keep_alive().await?;
            stream.message().await
        };
        match deadline("lease keep-alive", timeout, once)
            .await
            .map_err(gone)?
        {
            Some(r) if r.ttl() > 0 => {
                self.confirmed = asked;
                Ok(())
            }
            _ => Err(expired()),
        }
    }

    /// Gives up the lead: the election key and the lease go at once.
    pub async fn resign(self, client: &mut Client, timeout: Duration) -> Result<(), EtcdError> {
        let opts = ResignOptions::new().with_leader(self.key);
        deadline("resign", timeout, client.resign(Some(opts))).await?;
        deadline("lease revoke", timeout, client.lease_revoke(self.lease)).await?;
        Ok(())
    }
}

/// Campaigns for shard `shard` with `endpoint` under a lease of `ttl`; returns when elected
/// and counted (module docs). Each etcd call has `timeout`; the campaign itself waits as long
/// as another candidate leads, on `waiter`, a client whose calls have no deadline
/// ([`crate::EtcdSettings::connect_waiting`]).
pub async fn campaign(
    client: &mut Client,
    waiter: &mut Client,
    shard: u32,
    endpoint: &str,
    ttl: Duration,
    timeout: Duration,
) -> Result<Elected, EtcdError> {
    let secs = ttl.as_secs().max(1) as i64;
    let granted = deadline("lease grant", timeout, client.lease_grant(secs, None)).await?;
    let lease = granted.id();
    let mut confirmed = Instant::now();
    // The lease is kept alive while the campaign waits for another leader to go.
    let (mut keeper, mut acks) =
        deadline("lease keep-alive", timeout, client.lease_keep_alive(lease)).await?;
    let campaign = waiter.campaign(election(shard), endpoint, lease);
    tokio::pin!(campaign);
    let mut tick = tokio::time::interval(Duration::from_secs(secs as u64) / 3);
    let won = loop {
        tokio::select! {
            won = &mut campaign => break won?,
            _ = tick.tick() => {
                let asked = Instant::now();
                let alive = async {
                    deadline("lease keep-alive", timeout, keeper.keep_alive()).await?;
                    deadline("lease keep-alive", timeout, acks.message()).await
                };
                match alive.await {
                    Ok(Some(r)) if r.ttl() > 0 => confirmed = asked,
                    // A failed call (a member gone, a raft election) is tried again at the
                    // next tick while the lease surely lives.
                    Err(e) if asked < confirmed + ttl * 2 / 3 => {
                        tracing::warn!("shard {shard}: {e}; the candidate tries again");
                    }
                    Err(e) => return Err(e),
                    Ok(_) => return Err(EtcdError::Lead(format!(
                        "shard {shard}: the candidate's lease expired while it waited"
                    ))),
                }
            }
        }
    };
    let key = won
        .leader()
        .cloned()
        .ok_or_else(|| EtcdError::Lead(format!("shard {shard}: a campaign without a key")))?;
    let mut elected = Elected {
        shard,
        term: 0,
        key,
        lease,
        ttl: Duration::from_secs(secs as u64),
        confirmed,
    };
    elected.keep_alive(client, timeout).await?;
    elected.term = count_term(client, &elected, timeout).await?;
    Ok(elected)
}

/// Increments the shard's term while `elected`'s key still exists; the new term.
async fn count_term(
    client: &mut Client,
    elected: &Elected,
    timeout: Duration,
) -> Result<u32, EtcdError> {
    let mut kv = kv_client(client);
    let key = term_key(elected.shard);
    loop {
        let got = deadline("term read", timeout, kv.get(key.clone(), None)).await?;
        let (seen, version) = got.kvs().first().map_or((0, 0), |kv| {
            let n = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|s| s.parse::<u32>().ok());
            (n.unwrap_or(0), kv.version())
        });
        let next = seen.checked_add(1).ok_or_else(|| {
            EtcdError::Lead(format!("shard {}: the term counter is full", elected.shard))
        })?;
        let txn = Txn::new()
            .when([
                Compare::version(elected.key.key().to_vec(), CompareOp::Greater, 0),
                Compare::version(key.clone(), CompareOp::Equal, version),
            ])
            .and_then([TxnOp::put(key.clone(), next.to_string(), None)]);
        if deadline("term count", timeout, kv.txn(txn))
            .await?
            .succeeded()
        {
            return Ok(next);
        }
        // Either the counter moved (read it again) or the key is gone (no term for us).
        let ours = deadline(
            "election key",
            timeout,
            kv.get(elected.key.key().to_vec(), None),
        )
        .await?;
        if ours.kvs().is_empty() {
            return Err(EtcdError::Lead(format!(
                "shard {}: the lead was lost before its term was counted",
                elected.shard
            )));
        }
    }
}

/// The current leader of shard `shard`: its endpoint and its election key's create revision,
/// or `None` when no candidate leads.
pub async fn leader_of(
    client: &mut Client,
    shard: u32,
    timeout: Duration,
) -> Result<Option<(String, i64)>, EtcdError> {
    match deadline("leader", timeout, client.leader(election(shard))).await {
        Ok(r) => Ok(r.kv().map(|kv| {
            let endpoint = String::from_utf8_lossy(kv.value()).into_owned();
            (endpoint, kv.create_revision())
        })),
        // etcd says "election: no leader" as an error.
        Err(EtcdError::Client(e)) if e.to_string().contains("no leader") => Ok(None),
        Err(e) => Err(e),
    }
}
