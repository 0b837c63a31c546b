//! The leader's side of the hosts' sessions: a `tonic` service over one shard's [`Leader`].
//!
//! Each session is read by a task of its own: a report is decoded ([`LeaderCodec`]), given to
//! the leader at the service's clock, and its answer sent back on the session's stream. The
//! leader is shared under a mutex held for one report's bookkeeping; whoever owns the service
//! plans with the desired state through the same mutex ([`AggregatorService::leader`]).
//!
//! A report the codec refuses ends its session with `InvalidArgument` and the reason; the
//! leader keeps the host's last good report, as for a host that went quiet.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::proto::aggregator_server::{Aggregator, AggregatorServer};
use super::proto::{Answer, Report};
use super::LeaderCodec;
use crate::aggregator::Leader;

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

impl Clock for Monotonic {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// One shard's leader, served to the hosts.
#[derive(Clone)]
pub struct AggregatorService {
    leader: Arc<Mutex<Leader>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AggregatorService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregatorService").finish_non_exhaustive()
    }
}

impl AggregatorService {
    /// Serves `leader`, timing reports on `clock`.
    pub fn new(leader: Leader, clock: Arc<dyn Clock>) -> AggregatorService {
        AggregatorService {
            leader: Arc::new(Mutex::new(leader)),
            clock,
        }
    }

    /// The leader, locked (to plan with the desired state, or to read its views).
    pub fn leader(&self) -> MutexGuard<'_, Leader> {
        self.leader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The service for a `tonic` server.
    pub fn into_server(self) -> AggregatorServer<AggregatorService> {
        AggregatorServer::new(self)
    }
}

/// What a session sends back.
type Answers = Pin<Box<dyn Stream<Item = Result<Answer, Status>> + Send>>;

#[tonic::async_trait]
impl Aggregator for AggregatorService {
    type SessionStream = Answers;

    async fn session(
        &self,
        request: Request<Streaming<Report>>,
    ) -> Result<Response<Answers>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let service = self.clone();
        tokio::spawn(async move {
            let mut codec = LeaderCodec::default();
            while let Ok(Some(report)) = inbound.message().await {
                let answer = match codec.decode(report) {
                    Ok((sent_ns, report)) => {
                        let now = service.clock.now_ns();
                        let answers = service.leader().report(report, now);
                        Ok(codec.encode(&answers, sent_ns))
                    }
                    Err(e) => Err(Status::invalid_argument(e.to_string())),
                };
                let refused = answer.is_err();
                if tx.send(answer).await.is_err() || refused {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
