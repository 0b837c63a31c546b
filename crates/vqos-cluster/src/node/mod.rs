//! The aggregators wired (docs/cluster.md, "Design: aggregators"): what runs on an agent to
//! lead shards and to report to their leaders. Each piece is a task on the caller's tokio
//! runtime, so the vqosd agent and the light agents of the scale test run the same code.
//!
//! - [`follow`]: the desired state (every host's tenant vifs, the tenants), read at one
//!   revision in pages and then watched; a broken watch or connection reads it whole again
//!   after a backoff with jitter. A leader plans with it; a host takes its fallback's `N`
//!   (the hosts etcd declares in a tenant) from it.
//! - [`candidate`]: campaigns for one shard; once elected, leads it in the node's
//!   [`AggregatorService`] with a [`Leader`] of its term, plans every period with the
//!   shard's tenants, and keeps its election lease alive. When a keep-alive fails it stops
//!   granting at once (the service refuses the shard's sessions from then on, and did so
//!   already past `valid_until`), and campaigns again.
//! - [`host::Uplink`]: a host's session with one shard's leader, opened again (after a
//!   backoff) when the leader changes or the session breaks. The host knows every shard's
//!   leader from one etcd watch ([`leaders`]), and asks etcd only while that watch is off.
//!
//! ## Limitations
//! - Every reader holds every host's declarations (as the etcd agent does): a leader needs
//!   its shard's tenants only, a host its own tenants' host counts.
//! - Without TLS files ([`NodeSpec::tls`]) sessions are plain HTTP/2 and any peer may report
//!   as any host; with them a leader admits each host only as its certificate's CN.

pub mod host;
pub mod leaders;
pub mod view;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchOptions, WatchResponse};
use tokio::sync::watch;

use crate::aggregator::{shard_of, Leader};
use crate::desired::DesiredState;
use crate::election::campaign;
use crate::etcd::{self, deadline, get_prefix, EtcdError, EtcdSettings};
use crate::keys;
use crate::rpc::server::{AggregatorService, Clock, Monotonic};
use crate::rpc::tls::RpcTls;

/// The desired state as a node follows it.
#[derive(Debug, Default)]
pub struct Followed {
    /// The documents.
    pub state: DesiredState,
    /// The etcd revision they are at (0: not read yet).
    pub revision: i64,
}

/// A followed desired state, shared by the node's tasks.
#[derive(Debug, Clone, Default)]
pub struct SharedDesired(Arc<Mutex<Followed>>);

impl SharedDesired {
    /// Locked.
    pub fn lock(&self) -> MutexGuard<'_, Followed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Timing of a node's tasks.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How often a leader plans and hosts report.
    pub period: Duration,
    /// The deadline of every etcd call.
    pub timeout: Duration,
    /// The election lease.
    pub election_ttl: Duration,
    /// The grants' lease.
    pub grant_lease: Duration,
    /// The bound on the clocks' disagreement over a lease.
    pub drift: Duration,
}

impl Default for Timing {
    /// The design's: 500 ms periods, 2 s election and grant leases, 100 ms of drift.
    fn default() -> Self {
        Timing {
            period: Duration::from_millis(500),
            timeout: Duration::from_secs(1),
            election_ttl: Duration::from_secs(2),
            grant_lease: Duration::from_secs(2),
            drift: Duration::from_millis(100),
        }
    }
}

/// Returns once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, so callers' futures stay `Send`.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// Sleeps the `failures`-th backoff (from one period up to 16, at most 30 s), or returns
/// `false` at once if `stop` says so.
async fn back_off(failures: u32, period: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let cap = (period * 16).min(Duration::from_secs(30));
    let wait = etcd::backoff(failures, period, cap, etcd::entropy());
    tokio::select! {
        _ = stopped(stop) => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// Follows etcd's desired state into `shared` until `stop` turns true (module doc).
pub async fn follow(
    settings: EtcdSettings,
    timing: Timing,
    shared: SharedDesired,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0;
    loop {
        match follow_once(&settings, timing.timeout, &shared, &mut stop, &mut failures).await {
            Ok(()) => return,
            Err(e) => tracing::warn!("desired state: {e}; reading it again"),
        }
        if !back_off(failures, timing.period, &mut stop).await {
            return;
        }
        failures = failures.saturating_add(1);
    }
}

async fn follow_once(
    settings: &EtcdSettings,
    timeout: Duration,
    shared: &SharedDesired,
    stop: &mut watch::Receiver<bool>,
    failures: &mut u32,
) -> Result<(), EtcdError> {
    let c = settings.connect(timeout).await?;
    let mut kv = etcd::kv_client(&c);
    let (vifs, rev) = get_prefix(&mut kv, keys::HOSTS, 0, None, timeout).await?;
    let (tenants, _) = get_prefix(&mut kv, keys::TENANTS, rev, None, timeout).await?;
    {
        let mut f = shared.lock();
        let mut read = std::collections::BTreeSet::new();
        for kv in vifs.iter().chain(&tenants) {
            if let Ok(key) = kv.key_str() {
                f.state.put(key, kv.value());
                read.insert(key.to_string());
            }
        }
        f.state.retain(&read);
        f.revision = rev;
    }
    let watch = |prefix: &'static str| {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        let mut w = etcd::watch_client(&c);
        async move { deadline("watch", timeout, w.watch(prefix, Some(opts))).await }
    };
    let mut vifs = watch(keys::HOSTS).await?;
    let mut tenants = watch(keys::TENANTS).await?;
    *failures = 0;
    loop {
        let msg = tokio::select! {
            _ = stopped(stop) => return Ok(()),
            m = vifs.message() => m?,
            m = tenants.message() => m?,
        };
        on_watch(shared, msg)?;
    }
}

fn on_watch(shared: &SharedDesired, msg: Option<WatchResponse>) -> Result<(), EtcdError> {
    let broken = |why: String| EtcdError::Client(etcd_client::Error::WatchError(why));
    let resp = msg.ok_or_else(|| broken("watch closed".into()))?;
    if resp.canceled() {
        return Err(broken(format!(
            "watch cancelled (compacted at {}): {}",
            resp.compact_revision(),
            resp.cancel_reason()
        )));
    }
    let mut f = shared.lock();
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        if let Ok(key) = kv.key_str() {
            match ev.event_type() {
                EventType::Put => drop(f.state.put(key, kv.value())),
                EventType::Delete => drop(f.state.delete(key)),
            }
        }
        f.revision = f.revision.max(kv.mod_revision());
    }
    Ok(())
}

/// What a candidate needs.
#[derive(Debug, Clone)]
pub struct CandidateSpec {
    /// The shard.
    pub shard: u32,
    /// The number of shards (tenants are hashed over them).
    pub shards: u32,
    /// Where hosts reach this node's service (the election key's value).
    pub endpoint: String,
    /// Timing.
    pub timing: Timing,
}

/// Campaigns for `spec.shard` and leads it in `service` while elected, until `stop` turns
/// true (module doc); a stopped leader resigns, so the next candidate need not wait out its
/// lease.
pub async fn candidate(
    settings: EtcdSettings,
    spec: CandidateSpec,
    service: AggregatorService,
    clock: Arc<Monotonic>,
    desired: SharedDesired,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0;
    loop {
        let run = lead_once(
            &settings,
            &spec,
            (&service, &clock, &desired),
            &mut stop,
            &mut failures,
        );
        match run.await {
            Ok(()) => return,
            Err(e) => {
                let problem = candidacy_problem(&e);
                tracing::warn!("shard {}: {problem}; campaigning again", spec.shard);
                service.set_candidacy_problem(spec.shard, Some(problem));
            }
        }
        service.resign(spec.shard);
        if !back_off(failures, spec.timing.period, &mut stop).await {
            return;
        }
        failures = failures.saturating_add(1);
    }
}

/// A candidate's failure as the host's health says it. etcd's election service answers a
/// user its role does not let write the election prefix with "permission denied" (as gRPC's
/// Unknown, not PermissionDenied): the words name what the role lacks.
fn candidacy_problem(e: &EtcdError) -> String {
    let text = e.to_string();
    if text.contains("permission denied") {
        format!(
            "{text} (a candidate's etcd user needs to write /vqos/v1/aggregators/ as well as \
             read /vqos/v1/: docs/cluster.md, \"A role per host\")"
        )
    } else {
        text
    }
}

/// One campaign and the lead it wins: `Ok` when stopped, an error when the lead was lost.
/// Backoffs restart from the first once it led.
async fn lead_once(
    settings: &EtcdSettings,
    spec: &CandidateSpec,
    (service, clock, desired): (&AggregatorService, &Monotonic, &SharedDesired),
    stop: &mut watch::Receiver<bool>,
    failures: &mut u32,
) -> Result<(), EtcdError> {
    let t = spec.timing;
    let mut c: Client = settings.connect(t.timeout).await?;
    let mut waiter: Client = settings.connect_waiting(t.timeout).await?;
    let won = {
        let standing = campaign(
            &mut c,
            &mut waiter,
            spec.shard,
            &spec.endpoint,
            t.election_ttl,
            t.timeout,
        );
        tokio::pin!(standing);
        // A campaign still standing after a call deadline waits behind another leader: an
        // earlier failure (etcd out of reach a while) is over, and no longer the host's
        // problem. A refused one fails well within it.
        let waiting = tokio::time::sleep(t.timeout);
        tokio::pin!(waiting);
        let mut waited = false;
        loop {
            tokio::select! {
                _ = stopped(stop) => return Ok(()),
                won = &mut standing => break won?,
                _ = &mut waiting, if !waited => {
                    waited = true;
                    service.set_candidacy_problem(spec.shard, None);
                }
            }
        }
    };
    let mut elected = won;
    *failures = 0;
    service.set_candidacy_problem(spec.shard, None);
    let ns = |d: Duration| d.as_nanos() as u64;
    let leader = Leader::new(elected.term, clock.now_ns(), ns(t.grant_lease), ns(t.drift));
    service.lead(spec.shard, leader, clock.at(elected.valid_until()));
    tracing::info!(
        "shard {}: leading in term {} at {}",
        spec.shard,
        elected.term,
        spec.endpoint
    );
    let mut tick = tokio::time::interval(t.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped(stop) => {
                service.resign(spec.shard);
                let _ = elected.resign(&mut c, t.timeout).await;
                return Ok(());
            }
            _ = tick.tick() => {}
        }
        plan(service, spec, desired);
        // A failed call is tried again, on a new connection (which leaves out a member that
        // went), while the lease surely lives: the service stops granting at `valid_until`
        // by itself. A lease etcd says expired ends the lead at once.
        loop {
            match elected.keep_alive(&mut c, t.timeout).await {
                Ok(()) => {
                    service.renew(spec.shard, clock.at(elected.valid_until()));
                    break;
                }
                Err(e)
                    if !matches!(e, EtcdError::Lead(_))
                        && Instant::now() < elected.valid_until() =>
                {
                    tracing::warn!("shard {}: {e}; keeping the lease alive again", spec.shard);
                    if let Ok(again) = settings.connect(t.timeout).await {
                        c = again;
                    }
                }
                Err(e) => {
                    service.resign(spec.shard);
                    return Err(e);
                }
            }
        }
    }
}

/// Plans `spec.shard`'s leader with the desired state of the shard's tenants, and pushes the
/// decreases the plan makes.
fn plan(service: &AggregatorService, spec: &CandidateSpec, desired: &SharedDesired) {
    {
        let f = desired.lock();
        let mut limits = f.state.tenant_limits();
        limits.retain(|t, _| shard_of(t, spec.shards) == spec.shard);
        service.with_leader(spec.shard, |l| l.plan(f.state.declared(), &limits));
    }
    service.push(spec.shard);
}

/// What a node needs to lead shards.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The number of shards; the node is a candidate for every one.
    pub shards: u32,
    /// Where it serves.
    pub listen: std::net::SocketAddr,
    /// How hosts reach it (the election keys' value); `None`: `http://` and the address it
    /// bound (for a `listen` of port 0 on loopback).
    pub endpoint: Option<String>,
    /// Timing.
    pub timing: Timing,
    /// Mutual TLS on the hosts' sessions (the default endpoint is then `https://`); `None`:
    /// plain `http://`, any peer may report as any host.
    pub tls: Option<RpcTls>,
}

/// A started node.
#[derive(Debug)]
pub struct Node {
    /// Its service: the shards it leads and their views.
    pub service: AggregatorService,
    /// The address it serves on.
    pub local: std::net::SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Node {
    /// Waits, up to `limit`, until its tasks have ended after their `stop` (the candidates
    /// resign in etcd, so that the next leader need not wait out a lease).
    pub async fn stopped(self, limit: Duration) {
        let all = async {
            for t in self.tasks {
                let _ = t.await;
            }
        };
        let _ = tokio::time::timeout(limit, all).await;
    }
}

/// Starts a node on the current runtime: its gRPC server on `spec.listen`, a follower of the
/// desired state and a candidate for each shard, all ended by `stop` (the candidates resign).
pub async fn start(
    settings: EtcdSettings,
    spec: NodeSpec,
    stop: watch::Receiver<bool>,
) -> std::io::Result<Node> {
    let listener = tokio::net::TcpListener::bind(spec.listen).await?;
    let local = listener.local_addr()?;
    let scheme = if spec.tls.is_some() { "https" } else { "http" };
    let endpoint = spec
        .endpoint
        .unwrap_or_else(|| format!("{scheme}://{local}"));
    let clock = Arc::new(Monotonic::default());
    let mut service = AggregatorService::new(clock.clone());
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &spec.tls {
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        builder = builder
            .tls_config(tls.server().map_err(invalid)?)
            .map_err(|e| invalid(e.to_string()))?;
        service = service.authenticated();
    }
    let desired = SharedDesired::default();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let mut until = stop.clone();
    let server = builder
        .add_service(service.clone().into_server())
        .serve_with_incoming_shutdown(incoming, async move { stopped(&mut until).await });
    let mut tasks = vec![tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::warn!("aggregator service: {e}");
        }
    })];
    let t = spec.timing;
    tasks.push(tokio::spawn(follow(
        settings.clone(),
        t,
        desired.clone(),
        stop.clone(),
    )));
    for shard in 0..spec.shards {
        let c = CandidateSpec {
            shard,
            shards: spec.shards,
            endpoint: endpoint.clone(),
            timing: t,
        };
        tasks.push(tokio::spawn(candidate(
            settings.clone(),
            c,
            service.clone(),
            clock.clone(),
            desired.clone(),
            stop.clone(),
        )));
    }
    Ok(Node {
        service,
        local,
        tasks,
    })
}
