//! The agent's thread: sessions with etcd, fail-static between them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use vqos_api::wire::ClusterHealthView;
use vqos_cluster::etcd::{self, deadline, get_prefix, Compactor};
use vqos_cluster::etcd_client::{
    Client, EventType, KvClient, PutOptions, WatchOptions, WatchResponse, WatchStream,
};
use vqos_cluster::{etcd_client, keys, window_periods, EtcdError, HostStatus};

use super::aggregated::{start_node, Aggregated};
use super::config::ClusterConfig;
use super::desired::Desired;
use super::grants::{self, Grants, PeriodInput};
use super::period::{own_status, Meter};
use super::saved::SavedShares;
use crate::api::Api;

/// On the aggregators: how often the status is written, and its lease's least time to live.
const STATUS_EVERY: Duration = Duration::from_secs(30);
const STATUS_TTL_S: i64 = 60;

/// The running agent; [`Agent::stop`] (or drop) ends it and revokes its lease.
pub struct Agent {
    /// Tells the thread to stop.
    stop: watch::Sender<bool>,
    /// The thread.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    /// Stops the agent and waits for it (at most a call's deadline, to revoke the lease).
    pub fn stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the agent for `api`.
pub fn spawn(config: ClusterConfig, api: Arc<Api>) -> std::io::Result<Agent> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("vqos-cluster".into())
        .spawn(move || {
            let mut state = State::new(config, api);
            state.restore_shares();
            runtime.block_on(async {
                let mut node = None;
                let dog = match state.agg.clone() {
                    Some(agg) => {
                        let a = state
                            .config
                            .aggregators
                            .clone()
                            .expect("agg is built from it");
                        match start_node(&state.config, &a, &agg, &state.api, stopped.clone()).await
                        {
                            Ok(n) => node = n,
                            Err(e) => tracing::warn!("Cluster agent: no aggregator node: {e}"),
                        }
                        tokio::spawn(agg.watchdog(state.api.clone()))
                    }
                    None => tokio::spawn(grants::watchdog(state.grants.clone(), state.api.clone())),
                };
                state.run(stopped).await;
                dog.abort();
                // The node's candidates resign before the runtime goes.
                if let Some(n) = node {
                    n.stopped(state.config.timeout * 2).await;
                }
            });
        })?;
    Ok(Agent {
        stop,
        thread: Some(thread),
    })
}

/// Why a session ended.
enum End {
    /// Asked to stop.
    Stop,
    /// etcd failed: fail-static until the next session.
    Failed(EtcdError),
}

impl From<EtcdError> for End {
    fn from(e: EtcdError) -> End {
        End::Failed(e)
    }
}

impl From<etcd_client::Error> for End {
    fn from(e: etcd_client::Error) -> End {
        End::Failed(e.into())
    }
}

fn broken(what: &str) -> End {
    End::Failed(EtcdError::Client(etcd_client::Error::WatchError(
        what.to_string(),
    )))
}

/// A session's connection, lease and watches.
struct Session {
    /// The client.
    client: Client,
    /// Its key-value client, with the reply limit raised (`etcd::kv_client`).
    kv: KvClient,
    /// The status lease.
    lease: i64,
    /// Sends the lease's keep-alives.
    keeper: etcd_client::LeaseKeeper,
    /// The keep-alives' answers.
    alive: etcd_client::LeaseKeepAliveStream,
    /// The watch of every host's vif keys.
    vifs: WatchStream,
    /// The watch of the tenants.
    tenants: WatchStream,
}

/// What the agent keeps across sessions.
struct State {
    /// The settings.
    config: ClusterConfig,
    /// The daemon's API.
    api: Arc<Api>,
    /// The desired state last read.
    desired: Desired,
    /// The vifs' rates.
    meter: Meter,
    /// What `/v1/health` shows.
    health: ClusterHealthView,
    /// When the last period succeeded.
    last_ok: Option<Instant>,
    /// The shares' file, and what it holds.
    saved: SavedShares,
    /// When to compact etcd (done by the live host of the lowest name).
    compactor: Compactor,
    /// Sessions failed in a row (the backoff before the next one).
    failures: u32,
    /// The grants: what this host publishes it enforces of each tenant, and its lease.
    grants: Grants,
    /// With `[cluster.aggregators]`: the host's side of the aggregators (the grants above
    /// are then unused).
    agg: Option<Aggregated>,
    /// Periods run (when to write the status on the aggregators).
    periods: u64,
}

impl State {
    fn new(config: ClusterConfig, api: Arc<Api>) -> State {
        let health = ClusterHealthView {
            host: config.host.clone(),
            state: "connecting".into(),
            ..Default::default()
        };
        api.set_cluster_health(health.clone());
        // The others wait a call's deadline and a period beyond this host's lease before they
        // count its fallback: its last status may be written that long after its period began.
        let lease = Duration::from_secs(config.lease_ttl_s as u64);
        let grants = Grants::new(&config.host, lease, config.timeout + config.period);
        let meter = Meter::new(window_periods(
            config.period.as_millis() as u64,
            config.probe_bps,
        ));
        let agg = config
            .aggregators
            .as_ref()
            .map(|a| Aggregated::new(&config, a));
        State {
            agg,
            periods: 0,
            grants,
            saved: SavedShares::new(api.cluster_shares_file()),
            compactor: Compactor::new(config.compact_every),
            config,
            api,
            desired: Desired::default(),
            meter,
            health,
            last_ok: None,
            failures: 0,
        }
    }

    /// Puts the fallbacks of the shares saved by the last run in force, before etcd answers: a
    /// restart while etcd is unreachable keeps every cap, within what the others count for
    /// this host once its lease has surely expired.
    fn restore_shares(&mut self) {
        match self.saved.load() {
            Ok(Some(shares)) => match self.api.set_cluster_shares(&shares) {
                Ok(()) => tracing::info!(
                    "Cluster agent: {} saved tenant share(s) in force until etcd answers ({})",
                    shares.len(),
                    self.saved.path().display()
                ),
                Err(e) => tracing::warn!("Cluster agent: saved tenant shares refused: {e}"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!("Cluster agent: {e}"),
        }
    }

    /// Every how many periods the status is written: every period for the etcd grants (the
    /// others read it), every 30 s on the aggregators (nobody's shares depend on it).
    fn status_every(&self) -> u64 {
        match self.agg {
            None => 1,
            Some(_) => {
                (STATUS_EVERY.as_millis() / self.config.period.as_millis().max(1)).max(1) as u64
            }
        }
    }

    /// The status lease's time to live, s: `lease_ttl`, or on the aggregators at least 60 s
    /// (kept alive every third of it), so that a host costs etcd a request every 12 s or so
    /// (docs/cluster.md, "The agent on the aggregators").
    fn status_ttl_s(&self) -> i64 {
        match self.agg {
            None => self.config.lease_ttl_s,
            Some(_) => self.config.lease_ttl_s.max(STATUS_TTL_S),
        }
    }

    fn publish_health(&mut self) {
        self.health.managed_vifs = self.api.managed().len();
        self.health.last_sync_age_ms = self.last_ok.map(|t| t.elapsed().as_millis() as u64);
        self.health.problems = self.desired.problems.clone();
        self.health.fallback_held = self.grants.lock().fallen;
        self.api.set_cluster_health(self.health.clone());
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let end = self.session(&mut stop).await;
            match end {
                End::Stop => return,
                End::Failed(e) => {
                    let msg = match self.config.etcd.hint(&e) {
                        Some(hint) => format!("{e} ({hint})"),
                        None => e.to_string(),
                    };
                    if self.health.error.as_deref() != Some(&msg) {
                        tracing::warn!("Cluster agent fail-static: {msg}");
                    }
                    self.health.state = if self.health.syncs == 0 {
                        "connecting".into()
                    } else {
                        "disconnected".into()
                    };
                    self.health.error = Some(msg);
                    self.publish_health();
                }
            }
            // Backoff with jitter: from half a period up to 16 periods (at most 30 s), so a
            // fleet that lost etcd together does not come back together.
            let cap = (self.config.period * 16).min(Duration::from_secs(30));
            let wait = etcd::backoff(self.failures, self.config.period, cap, etcd::entropy());
            self.failures = self.failures.saturating_add(1);
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn watch_from(&self, c: &Client, prefix: &str, rev: i64) -> Result<WatchStream, End> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        let mut w = etcd::watch_client(c);
        Ok(deadline("watch", self.config.timeout, w.watch(prefix, Some(opts))).await?)
    }

    async fn session(&mut self, stop: &mut watch::Receiver<bool>) -> End {
        match self.session_inner(stop).await {
            Ok(()) => End::Stop,
            Err(e) => e,
        }
    }

    /// Connects, grants the lease, reads and applies the desired state, starts the watches,
    /// runs the first period.
    async fn setup(&mut self) -> Result<Session, End> {
        let t = self.config.timeout;
        let host = self.config.host.clone();
        let mut c = self.config.etcd.connect(t).await?;
        let lease = deadline("lease grant", t, c.lease_grant(self.status_ttl_s(), None))
            .await?
            .id();
        let (keeper, alive) = deadline("lease keep-alive", t, c.lease_keep_alive(lease)).await?;
        // Every host's vifs (the declared tenant members) and the tenants at one revision, in
        // pages, then the watches from the next.
        let mut kv = etcd::kv_client(&c);
        let (vifs, rev) = get_prefix(&mut kv, keys::HOSTS, 0, None, t).await?;
        let (tenants, _) = get_prefix(&mut kv, keys::TENANTS, rev, None, t).await?;
        let mut read = std::collections::BTreeSet::new();
        for kv in vifs.iter().chain(&tenants) {
            if let Ok(key) = kv.key_str() {
                self.desired.put(&host, key, kv.value());
                read.insert(key.to_string());
            }
        }
        // Keys deleted while away go; the last valid version of a key now unreadable stays.
        self.desired.retain(&read);
        self.desired.apply(&self.api);
        let wv = self.watch_from(&c, keys::HOSTS, rev).await?;
        let wt = self.watch_from(&c, keys::TENANTS, rev).await?;
        self.health.revision = rev;
        self.health.syncs += 1;
        tracing::info!(
            "Cluster agent synced at revision {rev}: {} vif key(s)",
            self.desired.vifs.len()
        );
        self.period(&mut kv, lease).await?;
        self.failures = 0;
        Ok(Session {
            client: c,
            kv,
            lease,
            keeper,
            alive,
            vifs: wv,
            tenants: wt,
        })
    }

    async fn session_inner(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), End> {
        // A stop while setting up ends the session where it waits (each call has a deadline,
        // but there are several); once running, the loop revokes the lease first.
        let Session {
            client: mut c,
            mut kv,
            lease,
            mut keeper,
            mut alive,
            vifs: mut wv,
            tenants: mut wt,
        } = tokio::select! {
            s = self.setup() => s?,
            _ = stop.changed() => return Ok(()),
        };
        let t = self.config.timeout;
        let mut ticker = tokio::time::interval(self.config.period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticker.tick().await;
        let ttl = Duration::from_secs(self.status_ttl_s() as u64);
        let mut keep = tokio::time::interval(ttl / 3);
        keep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.changed() => {
                    // Best effort: the status goes now rather than at the lease's end.
                    let _ = deadline("lease revoke", t, c.lease_revoke(lease)).await;
                    return Ok(());
                }
                m = wv.message() => self.on_watch(m?)?,
                m = wt.message() => self.on_watch(m?)?,
                _ = ticker.tick() => self.period(&mut kv, lease).await?,
                _ = keep.tick() => deadline("lease keep-alive", t, keeper.keep_alive()).await?,
                r = alive.message() => match r? {
                    Some(resp) if resp.ttl() > 0 => {}
                    _ => return Err(broken("status lease lost")),
                },
            }
        }
    }

    fn on_watch(&mut self, msg: Option<WatchResponse>) -> Result<(), End> {
        let Some(resp) = msg else {
            return Err(broken("watch closed"));
        };
        if resp.canceled() {
            return Err(broken(&format!(
                "watch cancelled (compacted at {}): {}",
                resp.compact_revision(),
                resp.cancel_reason()
            )));
        }
        if resp.events().is_empty() {
            return Ok(());
        }
        for ev in resp.events() {
            if let Some(kv) = ev.kv() {
                if let Ok(key) = kv.key_str() {
                    match ev.event_type() {
                        EventType::Put => self.desired.put(&self.config.host, key, kv.value()),
                        EventType::Delete => self.desired.delete(&self.config.host, key),
                    }
                }
                self.health.revision = self.health.revision.max(kv.mod_revision());
            }
            self.health.events += 1;
        }
        self.desired.apply(&self.api);
        self.publish_health();
        Ok(())
    }

    /// Measure, publish the status, read every host's, apply the shares; compact when due.
    async fn period(&mut self, kv: &mut KvClient, lease: i64) -> Result<(), End> {
        let t = self.config.timeout;
        let host = self.config.host.clone();
        // The view this period confirms starts before its status is written.
        let start_ns = self.grants.ns(Instant::now());
        // A port added since the last event gets its etcd policy now.
        self.desired.apply(&self.api);
        self.meter.measure(&self.api);
        let period_ms = self.config.period.as_millis() as u64;
        let own = own_status(
            &self.api,
            &self.desired,
            &self.meter,
            self.config.probe_bps,
            period_ms,
        );
        // The status is written every period, or on the aggregators every `status_every`
        // periods (it is then the operators' view only), saying how often in `period_ms`.
        let every = self.status_every();
        let mut put_rev = self.health.revision;
        if self.periods.is_multiple_of(every) {
            let mut written = own.clone();
            written.period_ms = period_ms * every;
            let body = serde_json::to_vec(&written).unwrap_or_default();
            let opts = PutOptions::new().with_lease(lease);
            let put = deadline("put", t, kv.put(keys::status(&host), body, Some(opts))).await?;
            put_rev = put_rev.max(put.header().map_or(0, |h| h.revision()));
        }
        self.periods = self.periods.wrapping_add(1);
        let (rev, compacts) = match self.agg.clone() {
            Some(agg) => {
                let problems = agg.period(&self.api, &self.desired.state, &own).await;
                self.desired.problems.extend(problems);
                let shares = self.api.cluster_shares();
                let fallback = agg.fallback(&shares).await;
                if let Err(e) = self.saved.save(&shares, &fallback) {
                    tracing::warn!("Cluster agent: {e}");
                }
                // No host reads the others' statuses: the leader of shard 0 compacts.
                (put_rev, agg.leads_shard_zero())
            }
            None => {
                let (rev, lowest) = self.etcd_shares(kv, own, start_ns).await?;
                (put_rev.max(rev), lowest)
            }
        };
        // Compaction: every agent keeps the schedule, one of them acts.
        if let Some(to) = self.compactor.tick(Instant::now(), rev) {
            if compacts {
                // A failed compaction is retried at the next interval; it ends no session.
                match etcd::compact(kv, to, t).await {
                    Ok(true) => tracing::info!("Cluster agent compacted etcd to revision {to}"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("Cluster agent: compaction to {to} failed: {e}"),
                }
            }
        }
        self.last_ok = Some(Instant::now());
        self.health.state = "connected".into();
        self.health.error = None;
        self.publish_health();
        Ok(())
    }

    /// The etcd grants' period (without `[cluster.aggregators]`): reads every host's status
    /// and the grants, applies this host's shares and publishes its grants. The revision read
    /// and whether this host is the live one of the lowest name (it compacts).
    async fn etcd_shares(
        &mut self,
        kv: &mut KvClient,
        own: HostStatus,
        start_ns: u64,
    ) -> Result<(i64, bool), End> {
        let t = self.config.timeout;
        let host = self.config.host.clone();
        let (all, rev) = get_prefix(kv, keys::STATUS, 0, None, t).await?;
        let mut statuses = BTreeMap::new();
        // Each live host's heartbeat: its status key's revision.
        let mut beats = BTreeMap::new();
        for kv in &all {
            let Ok(key) = kv.key_str() else { continue };
            let Some(h) = keys::name_under(keys::STATUS, key) else {
                continue;
            };
            beats.insert(h.to_string(), kv.mod_revision().max(0) as u64);
            // A status that does not parse counts as a host without vifs.
            if let Ok(s) = serde_json::from_slice::<HostStatus>(kv.value()) {
                statuses.insert(h.to_string(), s);
            }
        }
        statuses.insert(host.clone(), own);
        let mut problems = Vec::new();
        let view = grants::read_view(&self.grants, &host, kv, rev, beats, t, &mut problems).await?;
        let input = PeriodInput {
            host: &host,
            api: &self.api,
            desired: &self.desired,
            statuses: &statuses,
            view: &view,
            start_ns,
            timeout: t,
        };
        problems.extend(grants::run_period(&self.grants, kv, &input).await?);
        self.desired.problems.extend(problems);
        let shares = self.api.cluster_shares();
        if let Err(e) = self.saved.save(&shares, &self.grants.fallback(&shares)) {
            tracing::warn!("Cluster agent: {e}");
        }
        Ok((rev, statuses.keys().next() == Some(&host)))
    }
}
