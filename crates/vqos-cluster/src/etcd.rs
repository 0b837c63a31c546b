//! The connection to etcd: endpoints, credentials, TLS, and a deadline on every call; reads
//! of a prefix in pages at one revision ([`get_prefix`]) with the client's reply limit raised
//! ([`REPLY_LIMIT_BYTES`]); compaction ([`Compactor`], [`compact`]); and the agents' backoff
//! between sessions ([`backoff`]).
//!
//! ## Behavior
//! - etcd-client decodes at most 4 MiB per reply by default: one read of every host's status
//!   failed for everyone past about 24,000 vifs, or as soon as one host published a 1.5 MiB
//!   status. The clients of [`kv_client`] and [`watch_client`] decode up to
//!   [`REPLY_LIMIT_BYTES`], and [`get_prefix`] asks for [`PAGE_KEYS`] keys per request: a page
//!   overflows only if its keys average more than 256 KiB (etcd refuses a put above its
//!   `--max-request-bytes`, 1.5 MiB by default).
//! - etcd keeps every revision until it is compacted, and each agent writes its status every
//!   period: without compaction the database reaches its quota (2 GiB by default) and etcd
//!   refuses every write. As kube-apiserver does, one agent compacts every
//!   [`COMPACT_EVERY`] (the agent's `compact_every`) to the
//!   revision it saw one interval before, so the last interval of history stays for watches
//!   that lag.
//!
//! ## Limitations
//! - Compaction frees revisions, not disk: etcd's own defragmentation (`etcdctl defrag`) is
//!   still the operator's.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, KeyValue, KvClient, TlsOptions,
    WatchClient,
};
use serde::Deserialize;
use thiserror::Error;

/// Why etcd could not be used.
#[derive(Debug, Error)]
pub enum EtcdError {
    /// Settings that cannot work.
    #[error("Invalid etcd settings: {0}")]
    Settings(String),
    /// A credentials or certificate file that cannot be read.
    #[error("Cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// What the client or the server said.
    #[error("etcd: {}", client_message(.0))]
    Client(#[from] etcd_client::Error),
    /// An aggregator shard's lead was lost or cannot be counted ([`crate::election`]).
    #[error("{0}")]
    Lead(String),
    /// No answer in time.
    #[error("etcd: no answer to {what} within {ms} ms")]
    Timeout {
        /// The call.
        what: &'static str,
        /// The deadline.
        ms: u128,
    },
}

/// What the etcd client said, as a sentence: a gRPC status's meaning and message, then its
/// causes (the client's own `Display` writes them as Rust debug text: `source: Some(...)`,
/// `Os { code: 111, ... }`), each said once.
fn client_message(e: &etcd_client::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut say = |s: String| {
        let s = s.trim().to_string();
        if !s.is_empty() && !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            say(status.code().description().to_string());
            say(status.message().to_string());
            std::error::Error::source(status)
        }
        etcd_client::Error::TransportError(t) => Some(t),
        other => {
            say(other.to_string());
            None
        }
    };
    while let Some(c) = cause {
        say(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// How to reach etcd (the `[cluster]` section of vqosd's config, the CLI's flags).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSettings {
    /// Client URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// User name, when etcd has authentication enabled.
    #[serde(default)]
    pub user: Option<String>,
    /// A file holding the user's password (first line); only with `user`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the servers' certificates; enables TLS.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; with `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM); with `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// How often an etcd connection with open streams pings the member: twice etcd's default
/// least interval (`--grpc-keepalive-min-time`, 5 s).
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// How long a ping may wait for its answer before the connection is given up.
pub const KEEP_ALIVE_WAIT: Duration = Duration::from_secs(5);

fn read(path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The endpoints of `all` whose host and port accept a TCP connection within `timeout`, tried
/// at once; `all` itself when there is one, or when none answers (the client's error then
/// says why).
async fn live_endpoints(all: &[String], timeout: Duration) -> Vec<String> {
    if all.len() < 2 {
        return all.to_vec();
    }
    let probes = all.iter().map(|e| {
        let authority = e
            .split("://")
            .nth(1)
            .unwrap_or(e)
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(authority);
            matches!(tokio::time::timeout(timeout, tcp).await, Ok(Ok(_)))
        })
    });
    let mut live = Vec::new();
    for (e, probe) in all.iter().zip(probes.collect::<Vec<_>>()) {
        if probe.await.unwrap_or(false) {
            live.push(e.clone());
        }
    }
    if live.is_empty() {
        all.to_vec()
    } else {
        live
    }
}

/// Runs `fut` with a deadline of `limit`.
pub async fn deadline<T>(
    what: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(EtcdError::from),
        Err(_) => Err(EtcdError::Timeout {
            what,
            ms: limit.as_millis(),
        }),
    }
}

impl EtcdSettings {
    /// Settings with only these endpoints (a comma-separated list), checked: plain `http://`
    /// ones (TLS needs [`EtcdSettings::endpoints`] and the certificate fields).
    pub fn from_list(list: &str) -> Result<EtcdSettings, EtcdError> {
        let s = EtcdSettings {
            endpoints: EtcdSettings::endpoints(list),
            ..Default::default()
        };
        s.validate()?;
        Ok(s)
    }

    /// The URLs of a comma-separated list (blanks trimmed, empty items dropped), unchecked.
    pub fn endpoints(list: &str) -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect()
    }

    /// Checks the settings on their own (files are read at connect).
    pub fn validate(&self) -> Result<(), EtcdError> {
        let bad = |m: String| Err(EtcdError::Settings(m));
        if self.endpoints.is_empty() {
            return bad("no endpoints (give URLs such as http://127.0.0.1:2379)".into());
        }
        let tls = self.ca_file.is_some() || self.cert_file.is_some();
        for e in &self.endpoints {
            let https = e.starts_with("https://");
            if !https && !e.starts_with("http://") {
                return bad(format!("endpoint '{e}' is not an http:// or https:// URL"));
            }
            if https != tls {
                return bad(format!(
                    "endpoint '{e}': https:// needs ca_file, and ca_file or cert_file needs \
                     https:// endpoints"
                ));
            }
        }
        if self.password_file.is_some() && self.user.is_none() {
            return bad("password_file without user".into());
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("cert_file and key_file go together".into());
        }
        Ok(())
    }

    fn options(&self, timeout: Duration, per_call: bool) -> Result<ConnectOptions, EtcdError> {
        // HTTP/2 keep-alive pings find a connection that died without a word (a member cut
        // off), which a watch alone would wait on forever. Every KEEP_ALIVE, not every call
        // deadline: etcd closes a connection whose client pings more often than its
        // `--grpc-keepalive-min-time` (5 s by default; GOAWAY "too_many_pings"), and with
        // pings every second every agent's session, its lease and its watches broke every
        // 4 s (measured: docs/cluster.md, "Ten minutes on a real etcd").
        let mut o = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(KEEP_ALIVE, KEEP_ALIVE_WAIT);
        if per_call {
            o = o.with_timeout(timeout);
        }
        if let Some(user) = &self.user {
            let password = match &self.password_file {
                Some(p) => String::from_utf8_lossy(&read(p)?)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
                None => std::env::var("VQOS_ETCD_PASSWORD").unwrap_or_default(),
            };
            o = o.with_user(user.clone(), password);
        }
        if self.ca_file.is_some() || self.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(c), Some(k)) = (&self.cert_file, &self.key_file) {
                tls = tls.identity(Identity::from_pem(read(c)?, read(k)?));
            }
            o = o.with_tls(tls);
        }
        Ok(o)
    }

    /// What to check when `e` came from etcd under these settings, for an operator's eyes: a
    /// TLS connection ended by the server while no client certificate is set (etcd with
    /// `--client-cert-auth` closes the handshake and the client sees only a broken
    /// connection), or a user etcd refuses (authentication on, a role without vqos's keys).
    pub fn hint(&self, e: &EtcdError) -> Option<&'static str> {
        let EtcdError::Client(c) = e else {
            return None;
        };
        // gRPC's codes: CANCELLED 1, UNKNOWN 2, PERMISSION_DENIED 7, UNAVAILABLE 14
        // (etcd-client does not re-export tonic's `Code`). The connection's end comes as a
        // transport error or, on a call, as one of 1, 2 or 14 around it.
        let code = match c {
            etcd_client::Error::GRpcStatus(s) => Some(i32::from(s.code())),
            _ => None,
        };
        let broken =
            matches!(c, etcd_client::Error::TransportError(_)) || matches!(code, Some(1 | 2 | 14));
        if broken && self.ca_file.is_some() && self.cert_file.is_none() {
            Some(
                "an etcd that asks for client certificates (--client-cert-auth) needs cert_file \
                 and key_file (the CLI's --cert-file and --key-file)",
            )
        } else if code == Some(7) {
            Some(
                "the etcd user needs to read /vqos/v1/ and write /vqos/v1/status/, grants/ and \
                 raises/ (on the aggregators: its own status key, and a candidate \
                 /vqos/v1/aggregators/; docs/cluster.md, \"Security\")",
            )
        } else {
            None
        }
    }

    /// Connects, every call of the client bounded by `timeout`. With several endpoints, only
    /// those that accept a TCP connection within `timeout` are used (all of them if none
    /// does): etcd-client balances over its endpoints without skipping one that is down, so a
    /// call sent to a dead member fails, where etcd's Go client would try the next one
    /// (etcdv3/etcd-client#39). A caller whose calls fail connects again, and leaves a member
    /// that died meanwhile out.
    pub async fn connect(&self, timeout: Duration) -> Result<Client, EtcdError> {
        self.connect_with(timeout, true).await
    }

    /// Connects as [`EtcdSettings::connect`] does, but the client's calls have no deadline of
    /// their own: for a call that waits as long as etcd makes it, an election's campaign
    /// behind another leader (with the per-call deadline every waiting candidate was cut off
    /// and stood again every few seconds, a new lease each time). A dead connection is still
    /// found by the HTTP/2 pings ([`KEEP_ALIVE`]).
    pub async fn connect_waiting(&self, timeout: Duration) -> Result<Client, EtcdError> {
        self.connect_with(timeout, false).await
    }

    async fn connect_with(&self, timeout: Duration, per_call: bool) -> Result<Client, EtcdError> {
        self.validate()?;
        let options = self.options(timeout, per_call)?;
        let live = live_endpoints(&self.endpoints, timeout).await;
        deadline("connect", timeout, Client::connect(&live, Some(options))).await
    }
}

/// The largest reply the clients of [`kv_client`] and [`watch_client`] decode: 64 MiB
/// (etcd-client's default is 4 MiB). A page of [`PAGE_KEYS`] keys reaches it only if they
/// average 256 KiB.
pub const REPLY_LIMIT_BYTES: usize = 64 << 20;

/// Keys per range request of [`get_prefix`].
pub const PAGE_KEYS: i64 = 256;

/// How often the agents compact etcd by default: kube-apiserver's interval.
pub const COMPACT_EVERY: Duration = Duration::from_secs(300);

/// `c`'s key-value client, decoding replies up to [`REPLY_LIMIT_BYTES`].
pub fn kv_client(c: &Client) -> KvClient {
    c.kv_client().max_decoding_message_size(REPLY_LIMIT_BYTES)
}

/// `c`'s watch client, decoding replies up to [`REPLY_LIMIT_BYTES`].
pub fn watch_client(c: &Client) -> WatchClient {
    c.watch_client()
        .max_decoding_message_size(REPLY_LIMIT_BYTES)
}

/// The end of the range of the keys that start with `prefix` (etcd's prefix end: the last byte
/// below 0xff incremented, what comes after it dropped; `\0` for all keys).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Every key under `prefix`, read [`PAGE_KEYS`] (or `page_keys`, when given) per request,
/// each request within `timeout`, all at one revision: `revision`, or when it is 0 the newest
/// at the first page. Returns the keys in order and that revision.
pub async fn get_prefix(
    kv: &mut KvClient,
    prefix: &str,
    revision: i64,
    page_keys: Option<i64>,
    timeout: Duration,
) -> Result<(Vec<KeyValue>, i64), EtcdError> {
    let end = prefix_end(prefix.as_bytes());
    let limit = page_keys.unwrap_or(PAGE_KEYS).max(1);
    let mut from = prefix.as_bytes().to_vec();
    let mut rev = revision;
    let mut out = Vec::new();
    loop {
        let opts = GetOptions::new()
            .with_range(end.clone())
            .with_limit(limit)
            .with_revision(rev);
        let mut resp = deadline("get", timeout, kv.get(from.clone(), Some(opts))).await?;
        if rev <= 0 {
            rev = resp.header().map_or(0, |h| h.revision());
        }
        let more = resp.more();
        let kvs = resp.take_kvs();
        // The next page starts just after the last key of this one.
        match kvs.last() {
            Some(last) if more => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => {
                out.extend(kvs);
                return Ok((out, rev));
            }
        }
        out.extend(kvs);
    }
}

/// When to compact, kept by every agent (the one that compacts may change): every `every`, the
/// revision seen one interval before. Time is an input.
#[derive(Debug, Clone)]
pub struct Compactor {
    /// The interval.
    every: Duration,
    /// When the next compaction is due and the revision it compacts to (seen when it was set).
    next: Option<(Instant, i64)>,
}

impl Compactor {
    /// A compactor of interval `every`.
    pub fn new(every: Duration) -> Compactor {
        Compactor { every, next: None }
    }

    /// Called with etcd's `revision` at `now`: the revision to compact to when due (the one
    /// seen an interval ago), `None` otherwise. The first call only records.
    pub fn tick(&mut self, now: Instant, revision: i64) -> Option<i64> {
        match self.next {
            Some((at, old)) if now >= at => {
                self.next = Some((now + self.every, revision));
                (old > 0).then_some(old)
            }
            Some(_) => None,
            None => {
                self.next = Some((now + self.every, revision));
                None
            }
        }
    }
}

/// Compacts etcd's history up to `revision`. `Ok(false)`: it already was (another agent did).
pub async fn compact(
    kv: &mut KvClient,
    revision: i64,
    timeout: Duration,
) -> Result<bool, EtcdError> {
    match deadline("compact", timeout, kv.compact(revision, None)).await {
        Ok(_) => Ok(true),
        Err(EtcdError::Client(etcd_client::Error::GRpcStatus(s)))
            if s.message().contains("required revision has been compacted") =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// How long to wait before session `failures + 1` after `failures` failed ones in a row:
/// `base × 2^failures`, at most `cap`, of which the second half is random ("equal jitter": at
/// least half the backoff, so a fleet that lost etcd together does not come back together).
/// `entropy` is any random number ([`entropy`]); the function itself is deterministic.
pub fn backoff(failures: u32, base: Duration, cap: Duration, entropy: u64) -> Duration {
    let ceiling = base
        .checked_mul(1u32 << failures.min(20))
        .unwrap_or(cap)
        .min(cap)
        .max(base.min(cap));
    let half = ceiling / 2;
    let span_ns = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(entropy % span_ns.max(1))
}

/// A random number for [`backoff`]'s jitter (std's per-instance random hash keys; no
/// dependency).
pub fn entropy() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_end_is_the_next_key_after_every_key_under_it() {
        assert_eq!(prefix_end(b"/vqos/v1/status/"), b"/vqos/v1/status0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn compaction_is_due_every_interval_to_the_revision_of_the_one_before() {
        let t0 = Instant::now();
        let min = Duration::from_secs(60);
        let mut c = Compactor::new(5 * min);
        assert_eq!(c.tick(t0, 100), None);
        assert_eq!(c.tick(t0 + min, 160), None);
        // Five minutes on: compact to what was seen five minutes ago, and remember now's.
        assert_eq!(c.tick(t0 + 5 * min, 400), Some(100));
        assert_eq!(c.tick(t0 + 6 * min, 460), None);
        assert_eq!(c.tick(t0 + 10 * min, 700), Some(400));
        // A late call (the agent was disconnected) compacts once, to the last recorded.
        assert_eq!(c.tick(t0 + 60 * min, 900), Some(700));
        assert_eq!(c.tick(t0 + 61 * min, 910), None);
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_half_of_it_random() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        let ms = |f, e| backoff(f, base, cap, e).as_millis();
        // No randomness: the lower half; the most randomness: just under the ceiling.
        assert_eq!(
            [ms(0, 0), ms(1, 0), ms(2, 0), ms(4, 0)],
            [50, 100, 200, 800]
        );
        assert_eq!(ms(5, 0), 1000);
        assert_eq!(ms(30, 0), 1000);
        assert_eq!(ms(3, 399_999_999), 799);
        assert_eq!(ms(3, 400_000_000), 400);
        assert!((0..1000u64).all(|e| {
            let d = backoff(40, base, cap, e.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            d >= cap / 2 && d < cap
        }));
        // Two calls of entropy differ (std's random keys).
        assert_ne!(entropy(), entropy());
    }

    #[test]
    fn settings_are_checked() {
        let s = EtcdSettings::from_list("http://127.0.0.1:2379, http://127.0.0.1:22379").unwrap();
        assert_eq!(s.endpoints.len(), 2);
        let err = |s: EtcdSettings| s.validate().unwrap_err().to_string();
        assert!(EtcdSettings::from_list(" , ")
            .unwrap_err()
            .to_string()
            .contains("no endpoints"));
        assert!(EtcdSettings::from_list("127.0.0.1:2379")
            .unwrap_err()
            .to_string()
            .contains("not an http://"));
        let https = EtcdSettings::from_list("http://a:1").map(|mut s| {
            s.endpoints = vec!["https://a:1".into()];
            s
        });
        assert!(err(https.unwrap()).contains("needs ca_file"));
        let mut s = EtcdSettings::from_list("http://a:1").unwrap();
        s.password_file = Some("/p".into());
        assert!(err(s.clone()).contains("without user"));
        s.user = Some("u".into());
        assert!(s.validate().is_ok());
        s.endpoints = vec!["https://a:1".into()];
        s.ca_file = Some("/ca".into());
        s.cert_file = Some("/c".into());
        assert!(err(s).contains("go together"));
    }
}
