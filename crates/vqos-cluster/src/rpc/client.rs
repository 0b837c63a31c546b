//! The host's side of a session with one shard's leader: reports go up the stream as they are
//! made, answers come down as the leader decides them (one per report, and the raises and
//! decreases it pushes between reports).

use std::collections::BTreeMap;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use super::proto::aggregator_client::AggregatorClient;
use super::proto::{Answer, Report as WireReport};
use super::server::SHARD_HEADER;
use super::{HostCodec, RpcError};
use crate::aggregator::{HostGrant, Report};

/// One host's open session with a shard's leader.
///
/// The answers stream is read by a task of its own as they come, so that an answer the
/// leader pushes between the host's reports (`crate::aggregator`'s `push`) waits in the
/// session until the host takes it ([`HostSession::try_answer`]), not in the transport.
#[derive(Debug)]
pub struct HostSession {
    codec: HostCodec,
    up: mpsc::Sender<WireReport>,
    down: mpsc::Receiver<Result<Answer, tonic::Status>>,
}

/// An answer: the `sent_ns` it is leased from, and the grants by tenant.
pub type TakenAnswer = (u64, BTreeMap<String, HostGrant>);

/// Answers read ahead of the host (a few periods' pushes; the task waits when they are not
/// taken).
const READ_AHEAD: usize = 16;

/// Forwards `stream`'s answers to `to` until either ends.
async fn forward(mut stream: Streaming<Answer>, to: mpsc::Sender<Result<Answer, tonic::Status>>) {
    loop {
        let next = match stream.message().await {
            Ok(Some(a)) => Ok(a),
            Ok(None) => return,
            Err(status) => Err(status),
        };
        let last = next.is_err();
        if to.send(next).await.is_err() || last {
            return;
        }
    }
}

fn transport(e: impl std::fmt::Display) -> RpcError {
    RpcError::Transport(e.to_string())
}

impl HostSession {
    /// Opens a session with shard `shard`'s leader on `channel` (a connection to it).
    pub async fn open(channel: Channel, shard: u32) -> Result<HostSession, RpcError> {
        let (up, rx) = mpsc::channel(4);
        let mut client = AggregatorClient::new(channel);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request
            .metadata_mut()
            .insert(SHARD_HEADER, tonic::metadata::MetadataValue::from(shard));
        let stream = client
            .session(request)
            .await
            .map_err(transport)?
            .into_inner();
        let (to, down) = mpsc::channel(READ_AHEAD);
        tokio::spawn(forward(stream, to));
        Ok(HostSession {
            codec: HostCodec::default(),
            up,
            down,
        })
    }

    /// Sends `r`, made at `sent_ns` on the host's monotonic clock.
    pub async fn send(&mut self, r: &Report, sent_ns: u64) -> Result<(), RpcError> {
        let wire = self.codec.encode(r, sent_ns);
        self.up.send(wire).await.map_err(transport)
    }

    /// The next answer: the `sent_ns` of the report it answers (of a pushed answer: the
    /// latest report the leader had), and the grants by tenant.
    /// An error ends the session (open a new one: its tables start empty).
    pub async fn answer(&mut self) -> Result<TakenAnswer, RpcError> {
        let next = self.down.recv().await;
        self.decode(next)
    }

    /// The next answer if one has come (a pushed one, or a late one), without waiting.
    pub fn try_answer(&mut self) -> Option<Result<TakenAnswer, RpcError>> {
        use mpsc::error::TryRecvError;
        match self.down.try_recv() {
            Ok(a) => Some(self.decode(Some(a))),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(self.decode(None)),
        }
    }

    fn decode(&self, next: Option<Result<Answer, tonic::Status>>) -> Result<TakenAnswer, RpcError> {
        match next {
            Some(Ok(a)) => self.codec.decode(a),
            None => Err(RpcError::Transport("the leader ended the session".into())),
            Some(Err(status)) => Err(from_status(&status)),
        }
    }
}

/// What shard `shard`'s leader on `channel` knows of `tenant` (its term, whether it holds,
/// and each declared host's target and count).
pub async fn tenant_view(
    channel: Channel,
    shard: u32,
    tenant: &str,
) -> Result<super::proto::ViewReply, RpcError> {
    let mut client = AggregatorClient::new(channel);
    let mut request = tonic::Request::new(super::proto::ViewQuery {
        tenant: tenant.to_string(),
    });
    request
        .metadata_mut()
        .insert(SHARD_HEADER, tonic::metadata::MetadataValue::from(shard));
    match client.view(request).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => Err(from_status(&s)),
    }
}

/// What a leader's refusal means to the host.
fn from_status(s: &tonic::Status) -> RpcError {
    let m = s.message().to_string();
    match s.code() {
        tonic::Code::Unavailable => RpcError::NotLeader(m),
        tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => RpcError::Identity(m),
        _ => RpcError::Transport(m),
    }
}
