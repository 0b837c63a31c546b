//! The leaders' side of the hosts' sessions: one `tonic` service per node, over the shards
//! the node leads ([`Leader`] each, with the time until which it may grant).
//!
//! Each session names its shard in the [`SHARD_HEADER`] request header and is read by a task
//! of its own: a report is decoded ([`LeaderCodec`]), given to the shard's leader at the
//! service's clock, and its answer sent back on the session's stream. The answers the leader
//! pushes then (`crate::aggregator`'s `push`: raises released by this report, decreases after
//! a plan through [`AggregatorService::push`]) go to the other hosts' sessions of the shard,
//! each sent between that host's answers with its latest report's `sent_ns`. The leaders are shared
//! under one mutex, held for one report's bookkeeping; whoever owns the service starts and
//! stops leading shards and plans through it ([`AggregatorService::lead`],
//! [`AggregatorService::with_leader`]).
//!
//! - A report the codec refuses ends its session with `InvalidArgument` and the reason; the
//!   leader keeps the host's last good report, as for a host that went quiet.
//! - A report for a shard this node does not lead, or no longer may grant for (past its
//!   `valid_until`: its election lease may be gone), ends the session with `Unavailable`
//!   ("this node does not lead shard 3"): the host looks the leader up again. A session
//!   without the header is refused with `InvalidArgument`.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::proto::aggregator_server::{Aggregator, AggregatorServer};
use super::proto::{Answer, HostView, Report, ViewQuery, ViewReply};
use super::tls::peer_host;
use super::{LeaderCodec, RpcError};
use crate::aggregator::{HostGrant, Leader};

/// The leader's monotonic clock, ns (its leases and hold are counted on it).
pub trait Clock: Send + Sync {
    /// Now, ns since some fixed start.
    fn now_ns(&self) -> u64;
}

/// The process's monotonic clock from when it was made.
#[derive(Debug)]
pub struct Monotonic(Instant);

impl Default for Monotonic {
    fn default() -> Self {
        Monotonic(Instant::now())
    }
}

impl Monotonic {
    /// `t` on this clock, ns (0 for an instant before its start).
    pub fn at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.0).as_nanos() as u64
    }
}

impl Clock for Monotonic {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// The request header that names a session's shard (its number, in decimal).
pub const SHARD_HEADER: &str = "vqos-shard";

/// What a node knows of a shard it leads ([`AggregatorService::summary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSummary {
    /// The shard.
    pub shard: u32,
    /// The leader's term.
    pub term: u32,
    /// Per tenant of the latest plan, each declared host's target and count.
    pub tenants: Vec<(String, Vec<crate::aggregator::HostView>)>,
}

/// A shard this node leads.
struct Lead {
    leader: Leader,
    /// Until when it may grant, on the service's clock.
    valid_until_ns: u64,
}

/// Grants by tenant, as the leader decides them for one host.
type Grants = BTreeMap<String, HostGrant>;

/// The open sessions by shard and host, each with its number (a host's newer session
/// replaces an older one) and where its pushed answers go.
type Sessions = HashMap<(u32, String), (u64, mpsc::Sender<Grants>)>;

/// The shards a node leads, served to the hosts.
#[derive(Clone)]
pub struct AggregatorService {
    leads: Arc<Mutex<BTreeMap<u32, Lead>>>,
    /// The sessions pushed answers are sent on.
    sessions: Arc<Mutex<Sessions>>,
    /// The number of the next session.
    next_session: Arc<AtomicU64>,
    /// Why a shard's candidate last failed to stand or lead, until it is elected again.
    candidacy: Arc<Mutex<BTreeMap<u32, String>>>,
    clock: Arc<dyn Clock>,
    /// Sessions must show a certificate, and report as the host it names (`super::tls`).
    authenticated: bool,
}

impl std::fmt::Debug for AggregatorService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregatorService").finish_non_exhaustive()
    }
}

impl AggregatorService {
    /// A service that leads no shard yet, timing reports on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> AggregatorService {
        AggregatorService {
            leads: Arc::new(Mutex::new(BTreeMap::new())),
            sessions: Arc::new(Mutex::new(HashMap::new())),
            next_session: Arc::new(AtomicU64::new(0)),
            candidacy: Arc::new(Mutex::new(BTreeMap::new())),
            clock,
            authenticated: false,
        }
    }

    /// The same service, admitting a session only from a peer with a certificate (served
    /// over mutual TLS: [`super::tls::RpcTls::server`]), whose reports must name the host its
    /// certificate's CN names.
    pub fn authenticated(mut self) -> AggregatorService {
        self.authenticated = true;
        self
    }

    fn leads(&self) -> MutexGuard<'_, BTreeMap<u32, Lead>> {
        self.leads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The service's clock, ns.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Leads `shard` with `leader`, granting until `valid_until_ns` (replaces a lead of it).
    pub fn lead(&self, shard: u32, leader: Leader, valid_until_ns: u64) {
        let lead = Lead {
            leader,
            valid_until_ns,
        };
        self.leads().insert(shard, lead);
    }

    /// Moves the end of `shard`'s grants to `valid_until_ns` (its election lease was kept
    /// alive); whether it leads the shard.
    pub fn renew(&self, shard: u32, valid_until_ns: u64) -> bool {
        match self.leads().get_mut(&shard) {
            Some(l) => {
                l.valid_until_ns = valid_until_ns;
                true
            }
            None => false,
        }
    }

    /// Stops leading `shard`: its sessions end at their next report. Returns its leader.
    pub fn resign(&self, shard: u32) -> Option<Leader> {
        self.leads().remove(&shard).map(|l| l.leader)
    }

    /// Records why `shard`'s candidate failed (`Some`), or that it was elected (`None`).
    pub fn set_candidacy_problem(&self, shard: u32, problem: Option<String>) {
        let mut c = self.candidacy.lock().unwrap_or_else(|p| p.into_inner());
        match problem {
            Some(p) => c.insert(shard, p),
            None => c.remove(&shard),
        };
    }

    /// Why candidates of this node failed since they last led, one line per shard
    /// ("shard 0: …"), for the host's health.
    pub fn candidacy_problems(&self) -> Vec<String> {
        let c = self.candidacy.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().map(|(s, p)| format!("shard {s}: {p}")).collect()
    }

    /// The shards it leads.
    pub fn leading(&self) -> Vec<u32> {
        self.leads().keys().copied().collect()
    }

    /// Runs `f` on `shard`'s leader (to plan with the desired state, or to read its views);
    /// `None` when it does not lead the shard.
    pub fn with_leader<R>(&self, shard: u32, f: impl FnOnce(&mut Leader) -> R) -> Option<R> {
        self.leads().get_mut(&shard).map(|l| f(&mut l.leader))
    }

    /// What each shard it leads knows, at the service's clock: per shard its term and, per
    /// tenant, every declared host's view (the leaders' metrics).
    pub fn summary(&self) -> Vec<ShardSummary> {
        let now = self.clock.now_ns();
        let leads = self.leads();
        leads
            .iter()
            .map(|(&shard, lead)| {
                let l = &lead.leader;
                let tenants = l
                    .tenants()
                    .into_iter()
                    .map(|t| {
                        let v = l.tenant_view(&t, now);
                        (t, v)
                    })
                    .collect();
                ShardSummary {
                    shard,
                    term: l.term(),
                    tenants,
                }
            })
            .collect()
    }

    /// The service for a `tonic` server.
    pub fn into_server(self) -> AggregatorServer<AggregatorService> {
        AggregatorServer::new(self)
    }

    /// Answers `report` for `shard`, or says why this node cannot; with the answers the
    /// leader pushes to other hosts after it.
    fn answer(
        &self,
        shard: u32,
        codec: &mut LeaderCodec,
        report: Report,
    ) -> Result<(Answer, Vec<(String, Grants)>), Status> {
        let (sent_ns, report) = codec.decode(report).map_err(|e| match e {
            RpcError::Identity(m) => Status::permission_denied(m),
            e => Status::invalid_argument(e.to_string()),
        })?;
        let now = self.clock.now_ns();
        let mut leads = self.leads();
        match leads.get_mut(&shard) {
            Some(l) if now < l.valid_until_ns => {
                let answers = l.leader.report(report, now);
                let pushed = l.leader.push(now);
                Ok((codec.encode(&answers, sent_ns), pushed))
            }
            _ => Err(Status::unavailable(format!(
                "this node does not lead shard {shard}"
            ))),
        }
    }

    /// Sends what `shard`'s leader has to push (after a plan: its decreases) on the hosts'
    /// sessions, if this node may still grant for the shard.
    pub fn push(&self, shard: u32) {
        let now = self.clock.now_ns();
        let pushed = match self.leads().get_mut(&shard) {
            Some(l) if now < l.valid_until_ns => l.leader.push(now),
            _ => return,
        };
        self.deliver(shard, pushed);
    }

    /// Hands each pushed answer to its host's session of `shard`. One that finds no session,
    /// or a session whose queue is full, is dropped: a lost answer, which the leader counts
    /// for its lease (a later raise, never an excess).
    fn deliver(&self, shard: u32, pushed: Vec<(String, Grants)>) {
        if pushed.is_empty() {
            return;
        }
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for (host, grants) in pushed {
            if let Some((_, to)) = sessions.get(&(shard, host)) {
                let _ = to.try_send(grants);
            }
        }
    }

    /// Registers session `id` of `host` on `shard` for pushed answers.
    fn register(&self, shard: u32, host: &str, id: u64, to: mpsc::Sender<Grants>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.insert((shard, host.to_string()), (id, to));
    }

    /// Forgets session `id` of `host` on `shard`, unless a newer one replaced it.
    fn unregister(&self, shard: u32, host: &str, id: u64) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let key = (shard, host.to_string());
        if sessions.get(&key).is_some_and(|(i, _)| *i == id) {
            sessions.remove(&key);
        }
    }
}

/// Serves one session: each report answered in turn, and the answers pushed to this host sent
/// between them, leased from its latest report (`sent_ns` echoed).
async fn serve(
    service: AggregatorService,
    shard: u32,
    mut codec: LeaderCodec,
    mut inbound: Streaming<Report>,
    tx: mpsc::Sender<Result<Answer, Status>>,
) {
    let id = service.next_session.fetch_add(1, Ordering::Relaxed);
    let (push_tx, mut pushes) = mpsc::channel::<Grants>(4);
    let mut latest: Option<u64> = None;
    loop {
        let answer = tokio::select! {
            report = inbound.message() => {
                let Ok(Some(report)) = report else { break };
                match service.answer(shard, &mut codec, report) {
                    Ok((answer, pushed)) => {
                        if latest.is_none() {
                            if let Some(host) = codec.host() {
                                service.register(shard, host, id, push_tx.clone());
                            }
                        }
                        latest = Some(answer.sent_ns);
                        service.deliver(shard, pushed);
                        Ok(answer)
                    }
                    Err(status) => Err(status),
                }
            }
            Some(grants) = pushes.recv() => match latest {
                Some(sent_ns) => Ok(codec.encode(&grants, sent_ns)),
                None => continue,
            },
        };
        let refused = answer.is_err();
        if tx.send(answer).await.is_err() || refused {
            break;
        }
    }
    if let Some(host) = codec.host() {
        service.unregister(shard, host, id);
    }
}

/// The shard a session's request names.
fn shard_of_request<T>(request: &Request<T>) -> Result<u32, Status> {
    let value = request.metadata().get(SHARD_HEADER);
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "a session names its shard in the `{SHARD_HEADER}` header (a number)"
            ))
        })
}

/// What a session sends back.
type Answers = Pin<Box<dyn Stream<Item = Result<Answer, Status>> + Send>>;

#[tonic::async_trait]
impl Aggregator for AggregatorService {
    type SessionStream = Answers;

    async fn view(&self, request: Request<ViewQuery>) -> Result<Response<ViewReply>, Status> {
        let shard = shard_of_request(&request)?;
        let tenant = request.into_inner().tenant;
        let now = self.clock.now_ns();
        let mut leads = self.leads();
        let lead = leads
            .get_mut(&shard)
            .filter(|l| now < l.valid_until_ns)
            .ok_or_else(|| Status::unavailable(format!("this node does not lead shard {shard}")))?;
        let l = &lead.leader;
        let hosts = l
            .tenant_view(&tenant, now)
            .into_iter()
            .map(|v| HostView {
                host: v.host,
                target_max_bps: v.target.0,
                target_min_bps: v.target.1,
                counted_max_bps: v.counted.0,
                counted_min_bps: v.counted.1,
            })
            .collect();
        Ok(Response::new(ViewReply {
            term: l.term(),
            holding: l.holding(now),
            hosts,
        }))
    }

    async fn session(
        &self,
        request: Request<Streaming<Report>>,
    ) -> Result<Response<Answers>, Status> {
        let shard = shard_of_request(&request)?;
        let codec = match self.authenticated {
            false => LeaderCodec::default(),
            true => {
                let certs = request.peer_certs().ok_or_else(|| {
                    Status::unauthenticated("this leader admits only hosts with a certificate")
                })?;
                LeaderCodec::for_peer(peer_host(&certs).map_err(Status::unauthenticated)?)
            }
        };
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(serve(self.clone(), shard, codec, inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
