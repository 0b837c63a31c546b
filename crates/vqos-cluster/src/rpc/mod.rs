//! The transport between hosts and an aggregator shard's leader (docs/cluster.md, "Design:
//! aggregators"): one gRPC stream per host and shard (`proto/aggregator.proto`, `tonic`), a
//! report up and an answer down each period. This module is the wire form of
//! [`crate::aggregator::Report`] and of the leader's answers ([`HostGrant`]s), both ways:
//! [`HostCodec`] on the host, [`LeaderCodec`] on the leader; [`server`] and [`client`] carry
//! them.
//!
//! ## Behavior
//! - **Names once per session.** A report appends the vif and tenant names it has not sent
//!   before to the session's tables and names everything by index after that; the leader's
//!   answers use the same indices. A host of 100 vifs in 20 tenants then reports 1,865 bytes
//!   a period (its JSON: 10,764) and is answered in 1,858 (JSON: 7,841): `tests.rs`
//!   `a_hundred_vifs_in_twenty_tenants_take_a_fifth_of_their_json`.
//! - **Only what the split needs** travels up: each vif's rate, demand and flags, and per
//!   tenant the grant the host enforces. Weights, tenants and caps come from etcd.
//! - **The leader answers only in names the host gave.** A grant for a tenant the host did not
//!   name, or a share for a vif it did not report, is left out (the host has not started that
//!   tenant, or holds no such vif: it would not apply it).
//! - **Hostile input** (a report naming an index its tables do not have, no host in the first
//!   report, another host later, tables or names past their bounds) is refused with a
//!   [`RpcError`] that says which; the server ends that session with `InvalidArgument` and
//!   every other session goes on.

pub mod client;
pub mod server;
#[cfg(test)]
mod tests;
pub mod tls;

use std::collections::BTreeMap;

use crate::aggregator::{Enforcing, HostGrant, Report};
use crate::grants::Grant;
use crate::ids::Names;
use crate::model::{HostStatus, VifStatus};
use crate::split::Share;

/// The generated messages and service (`proto/aggregator.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("vqos.aggregator.v1");
}

/// Most names a session's table holds (vifs, and tenants, each).
pub const MAX_NAMES: usize = 1 << 16;
/// Longest name, bytes (a host, a port, a tenant).
pub const MAX_NAME_LEN: usize = 255;

/// Why a message was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RpcError {
    /// An index past the session's table.
    #[error("{kind} index {index}, but this session named {known} {kind}s")]
    UnknownIndex {
        /// "vif" or "tenant".
        kind: &'static str,
        /// The index given.
        index: u32,
        /// How many the table holds.
        known: usize,
    },
    /// The session's first report names no host, or a later one another host.
    #[error("{0}")]
    Host(String),
    /// A table or a name past its bound.
    #[error("{0}")]
    TooLarge(String),
    /// The connection failed or the peer ended the session.
    #[error("aggregator session: {0}")]
    Transport(String),
    /// A report names another host than the session's certificate (`tls`).
    #[error("{0}")]
    Identity(String),
    /// The node does not lead the session's shard (any more): look the leader up again.
    #[error("aggregator session: {0}")]
    NotLeader(String),
}

/// A session's table of names, one direction's ([`crate::ids::Names`]: index → name and
/// name → index); what the transport adds to it.
impl Names {
    /// The index of `name`, appended (and pushed to `new`, to be sent) if new.
    fn intern(&mut self, name: &str, new: &mut Vec<String>) -> u32 {
        let known = self.len();
        let i = self.id(name);
        if i as usize == known {
            new.push(name.to_string());
        }
        i
    }

    /// Appends names a peer sent, within the bounds (a name sent twice takes two indices;
    /// looking it up gives the first).
    fn append(&mut self, kind: &str, new: Vec<String>) -> Result<(), RpcError> {
        if self.len() + new.len() > MAX_NAMES {
            return Err(RpcError::TooLarge(format!(
                "{} {kind} names in one session: at most {MAX_NAMES}",
                self.len() + new.len()
            )));
        }
        for n in new {
            check_name(kind, &n)?;
            self.push(n);
        }
        Ok(())
    }

    /// The name at `index`, or an error naming the `kind` of table.
    fn named(&self, kind: &'static str, index: u32) -> Result<&str, RpcError> {
        self.try_name(index).ok_or(RpcError::UnknownIndex {
            kind,
            index,
            known: self.len(),
        })
    }
}

fn check_name(kind: &str, name: &str) -> Result<(), RpcError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(RpcError::TooLarge(format!(
            "a {kind} name of {} bytes: 1 to {MAX_NAME_LEN}",
            name.len()
        )));
    }
    Ok(())
}

/// The host's side of a session: its tables, and whether it has said who it is.
#[derive(Debug, Default)]
pub struct HostCodec {
    vifs: Names,
    tenants: Names,
    introduced: bool,
}

impl HostCodec {
    /// `r` on the wire, sent at `sent_ns` on the host's clock.
    pub fn encode(&mut self, r: &Report, sent_ns: u64) -> proto::Report {
        let mut out = proto::Report {
            host: if self.introduced {
                String::new()
            } else {
                r.host.clone()
            },
            sent_ns,
            health: r.status.health.clone(),
            period_ms: r.status.period_ms,
            ..Default::default()
        };
        self.introduced = true;
        for (name, v) in &r.status.vifs {
            let vif = self.vifs.intern(name, &mut out.new_vifs);
            out.vifs.push(proto::VifReport {
                vif,
                rate_bps: v.rate_bps,
                demand_bps: v.demand_bps,
                floor_greedy: v.floor_greedy,
                idle: v.idle,
            });
        }
        for (name, e) in &r.enforcing {
            let tenant = self.tenants.intern(name, &mut out.new_tenants);
            out.enforcing.push(proto::Enforcing {
                tenant,
                epoch: e.epoch,
                max_bps: e.max_bps,
                min_bps: e.min_bps,
            });
        }
        out
    }

    /// The leader's answer, by tenant name, with the `sent_ns` it answers.
    pub fn decode(&self, a: proto::Answer) -> Result<(u64, BTreeMap<String, HostGrant>), RpcError> {
        let mut out = BTreeMap::new();
        for g in a.grants {
            let tenant = self.tenants.named("tenant", g.tenant)?.to_string();
            let mut shares = BTreeMap::new();
            for s in g.shares {
                let share = Share {
                    min_bps: s.min_bps,
                    max_bps: s.max_bps,
                };
                shares.insert(self.vifs.named("vif", s.vif)?.to_string(), share);
            }
            let grant = Grant {
                epoch: g.epoch,
                max_bps: g.max_bps,
                min_bps: g.min_bps,
                fallback_max_bps: g.fallback_max_bps,
                fallback_min_bps: g.fallback_min_bps,
                lease_ms: g.lease_ms,
                unknown: BTreeMap::new(),
            };
            out.insert(tenant, HostGrant { grant, shares });
        }
        Ok((a.sent_ns, out))
    }
}

/// The leader's side of a session: the host's tables and name.
#[derive(Debug, Default)]
pub struct LeaderCodec {
    vifs: Names,
    tenants: Names,
    host: Option<String>,
    /// The host the session's certificate names (`tls`): every report must name it.
    peer: Option<String>,
}

impl LeaderCodec {
    /// The leader's side of a session whose peer proved to be host `peer` (its certificate's
    /// CN): a report naming another host is refused.
    pub fn for_peer(peer: String) -> LeaderCodec {
        LeaderCodec {
            peer: Some(peer),
            ..LeaderCodec::default()
        }
    }

    /// The host of this session, once its first report said.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// A report from the wire, with the `sent_ns` to echo; refused as a whole (nothing
    /// appended to the tables) when any part of it is wrong.
    pub fn decode(&mut self, r: proto::Report) -> Result<(u64, Report), RpcError> {
        let host = match (&self.host, r.host.as_str()) {
            (None, "") => return Err(RpcError::Host("the first report names no host".into())),
            (None, h) => {
                check_name("host", h)?;
                if let Some(p) = self.peer.as_deref().filter(|&p| p != h) {
                    return Err(RpcError::Identity(format!(
                        "the session's certificate is host '{p}'s; its report says '{h}'"
                    )));
                }
                h.to_string()
            }
            (Some(h), "") => h.clone(),
            (Some(h), other) if other == h => h.clone(),
            (Some(h), other) => {
                return Err(RpcError::Host(format!(
                    "this session is host '{h}'s; a report says '{other}'"
                )))
            }
        };
        let (nv, nt) = (self.vifs.len(), self.tenants.len());
        let result = self.decode_body(&host, r);
        if result.is_err() {
            // Nothing of a refused report stays.
            self.vifs.truncate(nv);
            self.tenants.truncate(nt);
        } else {
            self.host = Some(host);
        }
        result
    }

    fn decode_body(&mut self, host: &str, r: proto::Report) -> Result<(u64, Report), RpcError> {
        self.vifs.append("vif", r.new_vifs)?;
        self.tenants.append("tenant", r.new_tenants)?;
        let mut status = HostStatus {
            health: r.health,
            period_ms: r.period_ms,
            ..Default::default()
        };
        for v in r.vifs {
            let name = self.vifs.named("vif", v.vif)?.to_string();
            let vif = VifStatus {
                rate_bps: v.rate_bps,
                demand_bps: v.demand_bps,
                floor_greedy: v.floor_greedy,
                idle: v.idle,
                ..VifStatus::default()
            };
            status.vifs.insert(name, vif);
        }
        let mut enforcing = BTreeMap::new();
        for e in r.enforcing {
            let name = self.tenants.named("tenant", e.tenant)?.to_string();
            let held = Enforcing {
                epoch: e.epoch,
                max_bps: e.max_bps,
                min_bps: e.min_bps,
            };
            enforcing.insert(name, held);
        }
        let report = Report {
            host: host.to_string(),
            status,
            enforcing,
        };
        Ok((r.sent_ns, report))
    }

    /// The leader's answers on the wire, in this session's indices (see the module docs for
    /// what is left out).
    pub fn encode(&self, answers: &BTreeMap<String, HostGrant>, sent_ns: u64) -> proto::Answer {
        let grants = answers
            .iter()
            .filter_map(|(t, g)| {
                let tenant = self.tenants.get(t)?;
                let shares = g
                    .shares
                    .iter()
                    .filter_map(|(v, s)| {
                        Some(proto::VifShare {
                            vif: self.vifs.get(v)?,
                            min_bps: s.min_bps,
                            max_bps: s.max_bps,
                        })
                    })
                    .collect();
                Some(proto::TenantGrant {
                    tenant,
                    epoch: g.grant.epoch,
                    max_bps: g.grant.max_bps,
                    min_bps: g.grant.min_bps,
                    fallback_max_bps: g.grant.fallback_max_bps,
                    fallback_min_bps: g.grant.fallback_min_bps,
                    lease_ms: g.grant.lease_ms,
                    shares,
                })
            })
            .collect();
        proto::Answer { sent_ns, grants }
    }
}
