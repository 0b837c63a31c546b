//! The etcd agent (docs/cluster.md): with a `[cluster]` section, vqosd reads its desired vif
//! policies from etcd, applies them through the API's own path, publishes its status under a
//! lease, and holds its tenants' vifs to their share of the tenant's cluster-wide max and min.
//!
//! ## Behavior
//! - One thread runs the agent on a single-threaded tokio runtime. A session connects, grants
//!   the status lease, reads the host's vif keys and the tenants at one revision, applies them,
//!   and watches both prefixes from the next revision; every period it measures its vifs,
//!   publishes its status, reads every host's status and applies the tenant shares.
//! - Never above a tenant's max, even in transit (`grants`): per tenant the agent publishes the
//!   total it enforces (`/vqos/v1/grants/<tenant>/<host>`), lowers at once and publishes after,
//!   raises only out of what the other hosts' published grants leave, by a transaction on the
//!   tenant's raise count, and once its view lapses (no period completed for `lease_ttl`, on
//!   its monotonic clock) holds each tenant to its grant's fallback, `min(grant, max / N)`.
//! - Any etcd failure (a call past its deadline, a broken watch, a lost lease, a compacted
//!   revision) ends the session: the agent is fail-static (the policies and shares last applied
//!   stay in force, the shares until the view's lease lapses, forwarding goes on), `/v1/health` says `degraded`, and it reconnects every
//!   period and reads the whole desired state again, so no update is lost.
//! - etcd wins for the vifs it names: the local API answers 409 to a change of such a vif.
//!   A deleted key hands the vif back to the local API with its last policy.
//! - A tenant vif's membership, weight and own cap come from etcd's vif documents (every
//!   host's are read and watched), never from a host's status. A document that cannot be read
//!   keeps its last valid version in force; unknown fields are reported and ignored.
//! - The shares in force and their fallbacks are saved next to the state file; the fallbacks
//!   are put in force at start, before etcd answers. Floors above the host's capacity are scaled down to fit it.
//! - Reads of a prefix are paginated; the live host of the lowest name compacts etcd every
//!   `compact_every`; sessions are retried with exponential backoff and jitter.
//!
//! ## Limitations
//! - etcd sets policies of ports that exist; it does not create or delete ports.
//! - TLS, mutual TLS and authentication by certificate are tested, but etcd's roles cannot
//!   confine a host to its own keys with this key layout (docs/cluster.md, "Security").
//! - Every agent holds every host's tenant vif declarations: memory and the first read grow
//!   with the cluster's vifs (docs/cluster.md, "Where it stops scaling"); it reads every
//!   status and every grant each period.
//! - A dead host's fallback stays counted while etcd declares its vifs (it cannot be told from
//!   a host cut off from etcd).

mod agent;
mod aggregated;
mod config;
mod desired;
mod grants;
mod period;
mod saved;

pub use agent::{spawn, Agent};
pub use config::{ClusterConfig, RawCluster};
