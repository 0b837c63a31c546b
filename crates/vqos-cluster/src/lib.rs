//! # vqos-cluster
//!
//! vqos across hosts, on etcd (docs/cluster.md): the [`keys`] of the layout under `/vqos/v1/`,
//! the JSON documents stored there ([`model`]: a vif's policy, a tenant's policy, a host's
//! status), the tenant split ([`mod@split`]: a tenant's max and min divided among its vifs on every
//! host with the reference allocator, demand-aware, over the demands of [`demand`]; [`shares`]: every tenant's split over the
//! hosts' statuses), the grants that keep the hosts' shares in force within each tenant's max
//! while demands move and hosts are cut off ([`grants`], [`guard`]), the aggregator shard
//! leader's bookkeeping that is to replace the per-host reads ([`aggregator`]: pure; the host's
//! side [`holder`]), the desired state as every reader keeps it ([`desired`]), the connection
//! to etcd (`etcd`, with the default feature `etcd`), and with the default feature `rpc` the
//! aggregators' gRPC transport (`rpc`), their elections (`election`) and the nodes that run
//! them all (`node`: a shard's candidate and leader, a host's uplinks).
//!
//! The vqosd agent (crates/vqosd/src/cluster/) and the `vqos cluster` commands both use this
//! crate; it links neither the daemon nor the data plane. The scale simulation (vqos-sim) uses
//! it without the `etcd` feature: the same split, without the etcd client.
#![deny(missing_docs)]

pub mod aggregator;
pub mod demand;
pub mod desired;
#[cfg(feature = "etcd")]
pub mod election;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod grants;
pub mod guard;
pub mod holder;
mod ids;
pub mod keys;
pub mod model;
#[cfg(all(feature = "etcd", feature = "rpc"))]
pub mod node;
#[cfg(feature = "rpc")]
pub mod rpc;
pub mod shares;
pub mod split;

pub use demand::{
    estimate, estimate_demand, fills_floor, is_idle, window_periods, Estimate, RateWindow,
};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdError, EtcdSettings};
/// The etcd client this crate connects with, for its users' calls.
#[cfg(feature = "etcd")]
pub use etcd_client;
pub use grants::Grant;
pub use guard::{Guard, Ledger, View};
pub use model::{HostStatus, ModelError, TenantDoc, VifDoc, VifStatus};
pub use shares::{all_shares, fit_floors, local_shares, Declarations, Declared};
pub use split::{split, Member, Share, TenantLimits};
