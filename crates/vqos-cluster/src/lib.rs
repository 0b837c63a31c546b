//! # vqos-cluster
//!
//! vqos across hosts, on etcd (docs/cluster.md): the [`keys`] of the layout under `/vqos/v1/`,
//! the JSON documents stored there ([`model`]: a vif's policy, a tenant's policy, a host's
//! status), the tenant split ([`mod@split`]: a tenant's max and min divided among its vifs on every
//! host with the reference allocator, demand-aware), and the connection to etcd ([`etcd`]).
//!
//! The vqosd agent (crates/vqosd/src/cluster/) and the `vqos cluster` commands both use this
//! crate; it links neither the daemon nor the data plane.
#![deny(missing_docs)]

pub mod etcd;
pub mod keys;
pub mod model;
pub mod split;

pub use etcd::{EtcdError, EtcdSettings};
/// The etcd client this crate connects with, for its users' calls.
pub use etcd_client;
pub use model::{HostStatus, ModelError, TenantDoc, VifDoc, VifStatus};
pub use split::{estimate_demand, split, Member, Share, TenantLimits};
