//! A host's side of the aggregators, wired: its [`Holder`] and one [`Uplink`] per shard it has
//! tenants in. Every period ([`HostSide::period`]) it starts the tenants etcd declares it in
//! (their fallback, `limits / N`, before any grant), lapses the grants whose lease ran out,
//! and reports to each shard's leader its vifs of the shard's tenants with what it enforces of
//! them, applying each answer as it comes. Between periods [`HostSide::take_pushed`] applies
//! the answers the leaders pushed (a decrease after a plan, a raise another host's release
//! made room for; docs/cluster.md, "Pushed raises").
//!
//! An uplink opens a session to its shard's leader as the host's one etcd watch of the
//! leaders last said it (`super::leaders`), and keeps it while it answers, etcd reachable or
//! not. A broken session, a leader that says it no longer leads, or an answer later than the
//! period's wait drops the session; the next attempt waits out a backoff with jitter and
//! opens one to the leader the watch then names. Meanwhile the host holds what it holds until its
//! lease lapses, then the fallback: the leader's bound does not depend on the host reaching it.
//!
//! The shards are reported to one after another, each within `wait`: a shard whose leader is
//! gone costs the others at most `wait` in that period.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use etcd_client::Client;

use crate::aggregator::{shard_of, Report};
use crate::etcd::{self, EtcdError, EtcdSettings};
use crate::holder::Holder;
use crate::model::HostStatus;
use crate::rpc::client::{HostSession, TakenAnswer};
use crate::rpc::server::{Clock, Monotonic};
use crate::rpc::tls::{self, RpcTls};
use crate::rpc::RpcError;
use crate::split::Share;

use super::leaders::LeaderWatch;
use crate::desired::DesiredState;

/// Why an exchange with a shard's leader did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// etcd could not be reached at all, or the leaders' watch broke (for no one shard).
    #[error("etcd: {0}")]
    NoEtcd(EtcdError),
    /// Nobody leads the shard.
    #[error("shard {0} has no leader")]
    NoLeader(u32),
    /// The leader could not be reached, ended the session or no longer leads.
    #[error("shard {0}: {1}")]
    Rpc(u32, RpcError),
    /// No answer within the period's wait.
    #[error("shard {0}: no answer within {1:?}")]
    Late(u32, Duration),
    /// Waiting out the backoff after a failure.
    #[error("shard {0}: waiting before trying again")]
    Waiting(u32),
}

/// A host's session with one shard's leader (module doc).
#[derive(Debug)]
pub struct Uplink {
    shard: u32,
    session: Option<HostSession>,
    /// The endpoint the session is open to.
    endpoint: Option<String>,
    failures: u32,
    retry_at: Option<Instant>,
    /// Mutual TLS to the leaders (`None`: plain `http://`).
    tls: Option<RpcTls>,
}

impl Uplink {
    /// No session yet; sessions over mutual TLS with `tls`.
    pub fn new(shard: u32, tls: Option<RpcTls>) -> Uplink {
        Uplink {
            shard,
            session: None,
            endpoint: None,
            failures: 0,
            retry_at: None,
            tls,
        }
    }

    /// The leader's endpoint the session is open to, if one is.
    pub fn endpoint(&self) -> Option<&str> {
        self.session.as_ref().and(self.endpoint.as_deref())
    }

    /// Opens a session to `leader` (the watch's; `None`: nobody leads, as far as it knows).
    async fn open(&mut self, leader: Option<String>, timeout: Duration) -> Result<(), UplinkError> {
        let shard = self.shard;
        let endpoint = leader.ok_or(UplinkError::NoLeader(shard))?;
        let rpc = |e: String| UplinkError::Rpc(shard, RpcError::Transport(e));
        let channel = tls::connect(&endpoint, self.tls.as_ref(), timeout)
            .await
            .map_err(rpc)?;
        let session = HostSession::open(channel, shard)
            .await
            .map_err(|e| UplinkError::Rpc(shard, e))?;
        self.session = Some(session);
        self.endpoint = Some(endpoint);
        Ok(())
    }

    /// Sends `r` (made at `sent_ns`) and waits up to `wait` for its answer, opening a session
    /// to `leader` first if there is none; every answer read, in order, its own last (each
    /// with the `sent_ns` it is leased from). A failure drops the session and starts a
    /// backoff (from `period`) before the next attempt.
    pub async fn exchange(
        &mut self,
        leader: Option<String>,
        r: &Report,
        sent_ns: u64,
        wait: Duration,
        period: Duration,
    ) -> Result<Answers, UplinkError> {
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return Err(UplinkError::Waiting(self.shard));
        }
        let got = self.try_exchange(leader, r, sent_ns, wait).await;
        match &got {
            Ok(_) => {
                self.failures = 0;
                self.retry_at = None;
            }
            Err(_) => {
                self.session = None;
                // At most four periods: a failover's election takes about one election lease,
                // and a longer wait would add to it (each host looks the leader up again once
                // per wait, spread by the jitter).
                let cap = period * 4;
                let wait = etcd::backoff(self.failures, period / 2, cap, etcd::entropy());
                self.failures = self.failures.saturating_add(1);
                self.retry_at = Some(Instant::now() + wait);
            }
        }
        got
    }

    async fn try_exchange(
        &mut self,
        leader: Option<String>,
        r: &Report,
        sent_ns: u64,
        wait: Duration,
    ) -> Result<Answers, UplinkError> {
        let shard = self.shard;
        if self.session.is_none() {
            self.open(leader, wait).await?;
        }
        let session = self.session.as_mut().expect("opened above");
        let rpc = |e| UplinkError::Rpc(shard, e);
        session.send(r, sent_ns).await.map_err(rpc)?;
        // Answers pushed since the last period, and answers to earlier reports that came
        // late, are read first and applied too: the holder keeps only a newer epoch, timed
        // from the report each is leased from.
        let until = tokio::time::Instant::now() + wait;
        let mut got = Vec::new();
        loop {
            match tokio::time::timeout_at(until, session.answer()).await {
                Ok(answer) => {
                    let answer = answer.map_err(rpc)?;
                    let ours = answer.0 == sent_ns;
                    got.push(answer);
                    if ours {
                        return Ok(got);
                    }
                }
                Err(_) => return Err(UplinkError::Late(shard, wait)),
            }
        }
    }

    /// The answers the leader pushed since they were last taken, without waiting; a broken
    /// session is dropped (the next period opens one, after the backoff).
    pub fn pushed(&mut self) -> Answers {
        let mut got = Vec::new();
        while let Some(answer) = self.session.as_mut().and_then(HostSession::try_answer) {
            match answer {
                Ok(a) => got.push(a),
                Err(_) => self.session = None,
            }
        }
        got
    }
}

/// Answers read from a session, in order.
pub type Answers = Vec<TakenAnswer>;

/// A host's holdings and uplinks (module doc).
pub struct HostSide {
    /// The host's name.
    pub host: String,
    /// The number of shards.
    pub shards: u32,
    /// What it holds of each tenant.
    pub holder: Holder,
    uplinks: BTreeMap<u32, Uplink>,
    clock: Monotonic,
    settings: EtcdSettings,
    /// The connection to etcd (made again after a failed call: see `EtcdSettings::connect`).
    etcd: Option<Client>,
    /// Mutual TLS to the leaders ([`HostSide::with_tls`]).
    tls: Option<RpcTls>,
    /// Every shard's leader, from one watch (`leaders.rs`).
    pub leaders: LeaderWatch,
}

impl std::fmt::Debug for HostSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSide")
            .field("host", &self.host)
            .field("holder", &self.holder)
            .field("uplinks", &self.uplinks)
            .finish_non_exhaustive()
    }
}

impl HostSide {
    /// A host that holds nothing yet, finding the leaders through the etcd of `settings`.
    pub fn new(host: &str, shards: u32, settings: EtcdSettings) -> HostSide {
        HostSide {
            host: host.to_string(),
            shards: shards.max(1),
            holder: Holder::default(),
            uplinks: BTreeMap::new(),
            clock: Monotonic::default(),
            settings,
            etcd: None,
            tls: None,
            leaders: LeaderWatch::default(),
        }
    }

    /// The same host, reaching the leaders over mutual TLS with `tls` (`None`: plain
    /// `http://`).
    pub fn with_tls(mut self, tls: Option<RpcTls>) -> HostSide {
        self.tls = tls;
        self
    }

    /// Lapses the grants whose lease ran out (their shares fitted into their fallbacks); the
    /// tenants that changed. [`HostSide::period`] does it too.
    pub fn lapse(&mut self) -> Vec<String> {
        self.holder.lapse(self.clock.now_ns())
    }

    /// Applies the answers the leaders pushed since the last period or call (the agent calls
    /// it between periods, docs/cluster.md, "Pushed raises"); the tenants that changed.
    pub fn take_pushed(&mut self) -> Vec<String> {
        let mut changed = BTreeSet::new();
        for uplink in self.uplinks.values_mut() {
            for (sent_ns, grants) in uplink.pushed() {
                changed.extend(self.holder.apply(&grants, sent_ns, self.clock.now_ns()));
            }
        }
        changed.into_iter().collect()
    }

    /// The shares it holds of every tenant, by vif.
    pub fn shares(&self) -> BTreeMap<String, Share> {
        let held = self.holder.iter().flat_map(|(_, h)| h.shares.iter());
        held.map(|(p, s)| (p.clone(), *s)).collect()
    }

    /// The uplink of `shard`, if the host has tenants there.
    pub fn uplink(&self, shard: u32) -> Option<&Uplink> {
        self.uplinks.get(&shard)
    }

    /// Starts the tenants etcd declares this host in (at `limits / N` over their vifs' own
    /// caps) and forgets the others; its tenants by shard.
    pub fn start_tenants(&mut self, d: &DesiredState) -> BTreeMap<u32, BTreeSet<String>> {
        let limits = d.tenant_limits();
        let mut own: BTreeMap<&str, BTreeMap<String, Share>> = BTreeMap::new();
        for (port, v) in d.declared().get(&self.host).into_iter().flatten() {
            if limits.contains_key(&v.tenant) {
                let s = Share {
                    min_bps: 0,
                    max_bps: v.max_bps,
                };
                own.entry(v.tenant.as_str())
                    .or_default()
                    .insert(port.clone(), s);
            }
        }
        let gone: Vec<String> = self
            .holder
            .iter()
            .map(|(t, _)| t.clone())
            .filter(|t| !own.contains_key(t.as_str()))
            .collect();
        gone.iter().for_each(|t| self.holder.forget(t));
        let mut by_shard: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for (t, vifs) in &own {
            let n = d.hosts_in(t).max(1) as u64;
            let l = limits[*t];
            let cap = (l.max_bps.map(|m| m / n), l.min_bps / n);
            self.holder.start(t, cap, vifs);
            by_shard
                .entry(shard_of(t, self.shards))
                .or_default()
                .insert(t.to_string());
        }
        self.uplinks.retain(|s, _| by_shard.contains_key(s));
        for s in by_shard.keys() {
            let tls = &self.tls;
            let new = || Uplink::new(*s, tls.clone());
            self.uplinks.entry(*s).or_insert_with(new);
        }
        by_shard
    }

    /// One period: starts and forgets tenants, lapses leases, reports `status` (the host's
    /// vifs' measurements) to each shard's leader and applies the answers. The failed
    /// exchanges, by shard.
    pub async fn period(
        &mut self,
        desired: &DesiredState,
        status: &HostStatus,
        wait: Duration,
        period: Duration,
    ) -> Vec<UplinkError> {
        let tenant_of: BTreeMap<&str, &str> = desired
            .declared()
            .get(&self.host)
            .into_iter()
            .flatten()
            .map(|(port, v)| (port.as_str(), v.tenant.as_str()))
            .collect();
        let by_shard = self.start_tenants(desired);
        self.lapse();
        let mut failed = Vec::new();
        if self.etcd.is_none() {
            match self.settings.connect(wait).await {
                Ok(c) => self.etcd = Some(c),
                Err(e) => failed.push(UplinkError::NoEtcd(e)),
            }
        }
        if let Some(c) = &self.etcd {
            if let Err(e) = self.leaders.refresh(c, wait).await {
                // Looked up as before until the watch is back; connected again next period
                // (the watch may have broken with the connection).
                self.etcd = None;
                failed.push(UplinkError::NoEtcd(e));
            }
        }
        for (shard, tenants) in by_shard {
            let mut mine = status.clone();
            mine.vifs.retain(|port, _| {
                tenant_of
                    .get(port.as_str())
                    .is_some_and(|t| tenants.contains(*t))
            });
            let r = Report {
                host: self.host.clone(),
                status: mine,
                enforcing: self
                    .holder
                    .enforcing()
                    .into_iter()
                    .filter(|(t, _)| tenants.contains(t))
                    .collect(),
            };
            let sent = self.clock.now_ns();
            let uplink = self.uplinks.get_mut(&shard).expect("made by start_tenants");
            let leader = self.leaders.leader(shard).map(str::to_string);
            match uplink.exchange(leader, &r, sent, wait, period).await {
                Ok(answers) => {
                    for (sent_ns, grants) in answers {
                        self.holder.apply(&grants, sent_ns, self.clock.now_ns());
                    }
                }
                Err(e) => failed.push(e),
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an operator reads in `/v1/health` names the shard only when there is one.
    #[test]
    fn an_unreachable_etcd_is_not_named_as_a_shard() {
        let e = || EtcdError::Settings("no endpoints".into());
        let none = UplinkError::NoEtcd(e()).to_string();
        assert!(
            none.starts_with("etcd: ") && !none.contains("shard"),
            "{none}"
        );
        let one = UplinkError::NoLeader(3).to_string();
        assert!(one.starts_with("shard 3 "), "{one}");
    }
}
