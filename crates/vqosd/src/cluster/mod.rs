//! The etcd agent (docs/cluster.md): with a `[cluster]` section, vqosd reads its desired vif
//! policies from etcd, applies them through the API's own path, publishes its status under a
//! lease, and holds its tenants' vifs to their share of the tenant's cluster-wide max and min.
//!
//! ## Behavior
//! - One thread runs the agent on a single-threaded tokio runtime. A session connects, grants
//!   the status lease, reads the host's vif keys and the tenants at one revision, applies them,
//!   and watches both prefixes from the next revision; every period it measures its vifs,
//!   publishes its status, reads every host's status and applies the tenant shares.
//! - Any etcd failure (a call past its deadline, a broken watch, a lost lease, a compacted
//!   revision) ends the session: the agent is fail-static (the policies and shares last applied
//!   stay in force, forwarding goes on), `/v1/health` says `degraded`, and it reconnects every
//!   period and reads the whole desired state again, so no update is lost.
//! - etcd wins for the vifs it names: the local API answers 409 to a change of such a vif.
//!   A deleted key hands the vif back to the local API with its last policy.
//!
//! ## Limitations
//! - etcd sets policies of ports that exist; it does not create or delete ports.
//! - TLS and authentication settings are passed to the client but not tested here.

mod agent;
mod config;
mod desired;
mod period;

pub use agent::{spawn, Agent};
pub use config::{ClusterConfig, RawCluster};
