//! # vqos-probe
//!
//! A small latency probe of our own, so the lab measures round-trip times everywhere it runs
//! (Debian's sockperf/qperf may be absent): a server that echoes small request/response messages
//! over UDP or TCP, and a client that sends timestamped requests at a fixed rate and reports
//! count, losses and min/mean/p50/p99/p99.9/max RTT in microseconds.
//!
//! ```no_run
//! use std::time::Duration;
//! use vqos_probe::{run_client, spawn_server, ClientConfig, Protocol, ServerConfig};
//!
//! let server = spawn_server(ServerConfig::new("127.0.0.1:0".parse()?, Protocol::Udp))?;
//! let mut cfg = ClientConfig::new(server.local_addr(), Protocol::Udp);
//! cfg.duration = Duration::from_secs(2);
//! let summary = run_client(cfg)?;
//! println!("{}", serde_json::to_string(&summary)?);
//! server.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Behavior
//! - **Messages** ([`wire`]): a 24-byte header (magic, kind, session id, sequence number, send
//!   time in ns on the client's monotonic clock) padded with zeros to `size` bytes (default 64,
//!   24..=65507). UDP sends one message per datagram; TCP prefixes each with its length (u32 LE)
//!   and sets `TCP_NODELAY` on both ends.
//! - **Server** ([`spawn_server`]): echoes every valid request with only the kind byte changed.
//!   Anything else — short, oversized, foreign magic, a response, garbage — is ignored and
//!   counted in [`ServerStats::ignored`]; over TCP a frame with a bad body is skipped, a bad
//!   length prefix (stream cannot be resynchronised) closes that connection. TCP serves each
//!   connection on its own thread. [`ServerHandle::stop`] (or dropping the handle) stops all
//!   threads within ~100 ms.
//! - **Client** ([`run_client`]): open loop. A sender thread sends request `i` at
//!   `start + i·interval` (absolute schedule, so no drift; if it falls behind it sends at once)
//!   for `duration`, i.e. ⌈duration/interval⌉ requests; a receiver thread matches responses by
//!   sequence number, so reordering is harmless (and counted). The RTT is the receive time minus
//!   the send time carried in the echo, both from the same monotonic clock. A response not back
//!   within `timeout` (default 1 s) is lost; if it arrives later it is counted as `late` (and
//!   lost), not sampled. After the last request the client waits until every response is in or
//!   the timeout of the last request has passed. Duplicates, messages of another run (session
//!   id), wrong sizes and garbage are ignored and counted. UDP uses a connected socket, so only
//!   datagrams from the server's address are seen; an ICMP "port unreachable" just means loss.
//! - **Percentiles** ([`stats`]): exact, from all recorded samples (sorted), nearest-rank
//!   definition: the p-th percentile is the sample of rank ⌈p/100 · N⌉.
//! - **Output**: [`Summary`] serialises to JSON with `samples`, `lost`, `min_us`, `p50_us`,
//!   `p99_us`, `p999_us`, `max_us`, `mean_us` (µs with ns resolution; `null` when no response),
//!   then `sent`, `late`, `reordered`, `duplicates`, `foreign`, `send_failures`, `protocol`, `size`,
//!   `interval_us`, `elapsed_s`.
//!
//! ## Limitations
//! - The pacing sleeps (no busy-wait, to leave the CPU to the switch under test), so at high
//!   rates (≳ 10 000/s) the actual rate may fall short and requests leave in small bursts; the
//!   RTT of each request is still exact because its send time is stamped when it leaves.
//! - All samples are kept in memory (8 bytes each: 80 kB for 1000/s × 10 s); rates are capped
//!   at 1 000 000/s and runs should stay well under an hour.
//! - TCP over one connection: a lost segment delays all later responses (head-of-line
//!   blocking), which is what TCP_RR measures too; TCP never reports loss unless a response
//!   takes longer than the timeout. A connection closed by the server ends the run with
//!   [`ProbeError::ConnectionClosed`].
//! - The RTT includes both hosts' stacks and the scheduling of the probe's threads; there is no
//!   warm-up phase, so the first samples may include ARP/neighbour resolution.
//! - The server has no authentication and echoes to whoever asks (as UDP echo does): run it only
//!   inside the lab's namespaces.
#![deny(missing_docs)]

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

pub mod client;
pub mod flood;
mod pace;
pub mod parse;
pub mod server;
pub mod stats;
pub mod wire;

pub use client::{run_client, ClientConfig};
pub use flood::{run_flood, FloodConfig, FloodSummary};
pub use server::{spawn_server, ServerConfig, ServerHandle, ServerStats};
pub use stats::{nearest_rank, RttStats, Summary};

/// Transport of the probe's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// One message per datagram.
    Udp,
    /// Length-prefixed messages on one connection, `TCP_NODELAY`.
    Tcp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
        })
    }
}

/// Errors of the probe's library. The I/O cause, when there is one, is the error's
/// [`source`](std::error::Error::source) (print the chain, e.g. anyhow's `{:#}`).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A configuration value or command-line argument is out of range or malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server could not bind its socket.
    #[error("cannot bind {protocol} {addr}")]
    Bind {
        /// Transport.
        protocol: Protocol,
        /// Requested address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The client could not connect (TCP) or set up its socket (UDP).
    #[error("cannot connect {protocol} to {addr}")]
    Connect {
        /// Transport.
        protocol: Protocol,
        /// Server address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The TCP server closed the connection (or sent an unparseable length) during the run.
    #[error("connection to {0} closed by the server during the run")]
    ConnectionClosed(SocketAddr),
    /// Another I/O error during the run.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// Cause.
        source: std::io::Error,
    },
}

/// Maximum request rate (per second) accepted; also bounds the smallest interval (1 µs).
pub const MAX_RATE: f64 = 1_000_000.0;
/// Smallest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_micros(1);
