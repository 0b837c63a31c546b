//! The JSON documents stored in etcd.
//!
//! Rates are strings in the units the rest of vqos uses (`"300Mbit"`, `"1.5Gbit"`,
//! `"unlimited"`); absent fields take their defaults (weight 1, no min, no max, the default
//! priority). Unknown fields are kept aside ([`VifDoc::unknown`], [`TenantDoc::unknown`]) and
//! the document is used without them: a field a newer CLI writes must not make this agent drop
//! the tenant's cap. The agent reports them as a problem naming the key and the fields, so a
//! typo is still seen; and they are written back as they were by a read-modify-write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use vqos_sched::change::{ChangeError, PolicyChange};
use vqos_sched::units::{format_rate, parse_rate};
use vqos_sched::{PolicyError, VifPolicy};

use crate::split::TenantLimits;

/// Why a document is refused.
#[derive(Debug, Error)]
pub enum ModelError {
    /// Not JSON of the expected shape.
    #[error("Invalid JSON: {0}")]
    Json(String),
    /// A rate that does not parse.
    #[error("Invalid {field}: {message}")]
    Rate {
        /// The field.
        field: &'static str,
        /// The units parser's message.
        message: String,
    },
    /// A min without a value.
    #[error("Invalid min: must be a rate, not unlimited")]
    UnlimitedMin,
    /// The policy on its own is not valid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A tenant's min above its max.
    #[error("Tenant min {min} is above its max {max}")]
    TenantMinAboveMax {
        /// The min.
        min: String,
        /// The max.
        max: String,
    },
    /// A tenant name that cannot be a key.
    #[error("{0}")]
    Name(String),
}

/// A policy change's error as the model reports it.
fn change_error(e: ChangeError) -> ModelError {
    match e {
        ChangeError::UnlimitedMin => ModelError::UnlimitedMin,
        ChangeError::BadValue { field, message } => ModelError::Rate { field, message },
        // The document's fields are named by the struct: none is unknown.
        ChangeError::UnknownField(f) => ModelError::Json(format!("unknown field {f}")),
    }
}

fn rate(field: &'static str, text: &Option<String>) -> Result<Option<Option<u64>>, ModelError> {
    text.as_deref()
        .map(|t| {
            parse_rate(t).map_err(|e| ModelError::Rate {
                field,
                message: e.to_string(),
            })
        })
        .transpose()
}

/// `/vqos/v1/hosts/<host>/vifs/<port>`: the desired policy of one port of one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VifDoc {
    /// Proportional share (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Guaranteed minimum, e.g. `"100Mbit"` (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<String>,
    /// Hard maximum, e.g. `"300Mbit"` or `"unlimited"` (default unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Latency priority 0 ..= 7 (default: the daemon's default priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Inbound maximum, e.g. `"200Mbit"`, or `"unlimited"` (default: the same as `max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in: Option<String>,
    /// Bytes the vif may send above its max after idling, e.g. `"256KiB"` (default: the
    /// engine's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<String>,
    /// The tenant the vif belongs to; its share of the tenant's max and min is computed across
    /// hosts (none: the vif's own policy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Fields this version does not know (a newer writer's, or a typo), kept as written.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// The names of `unknown`, as the agent reports them: `` `a`, `b` ``.
pub fn field_list(unknown: &BTreeMap<String, serde_json::Value>) -> String {
    let names: Vec<String> = unknown.keys().map(|k| format!("`{k}`")).collect();
    names.join(", ")
}

impl VifDoc {
    /// Parses a stored value.
    pub fn parse(bytes: &[u8]) -> Result<VifDoc, ModelError> {
        let doc: VifDoc =
            serde_json::from_slice(bytes).map_err(|e| ModelError::Json(e.to_string()))?;
        if let Some(t) = &doc.tenant {
            crate::keys::check_name("tenant", t).map_err(ModelError::Name)?;
        }
        Ok(doc)
    }

    /// The vif's own policy (validated on its own; `port` names it in errors).
    pub fn policy(&self, port: &str) -> Result<VifPolicy, ModelError> {
        let mut change = PolicyChange {
            weight: self.weight,
            priority: self.priority,
            ..PolicyChange::default()
        };
        let text = [
            ("min", &self.min),
            ("max", &self.max),
            ("max_in", &self.max_in),
            ("burst", &self.burst),
        ];
        for (field, value) in text {
            if let Some(v) = value {
                change.set(field, v).map_err(change_error)?;
            }
        }
        let p = change.apply(&VifPolicy::default()).map_err(change_error)?;
        p.validate(port)?;
        Ok(p)
    }

    /// What the tenant split takes from this document ([`crate::Declared`]): its tenant,
    /// weight and own cap. `None` for a vif without a tenant; an error when the policy is not
    /// valid.
    pub fn declared(&self, port: &str) -> Result<Option<crate::Declared>, ModelError> {
        let p = self.policy(port)?;
        Ok(self.tenant.clone().map(|tenant| crate::Declared {
            tenant,
            weight: p.weight,
            max_bps: p.max_bps,
        }))
    }
}

/// `/vqos/v1/tenants/<tenant>`: a tenant's limits, cluster-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantDoc {
    /// The floor of the tenant's aggregate where it has demand, e.g. `"200Mbit"` (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<String>,
    /// The cap of the tenant's aggregate over all hosts, e.g. `"1Gbit"` (default unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Fields this version does not know (a newer writer's, or a typo), kept as written.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl TenantDoc {
    /// Parses a stored value.
    pub fn parse(bytes: &[u8]) -> Result<TenantDoc, ModelError> {
        serde_json::from_slice(bytes).map_err(|e| ModelError::Json(e.to_string()))
    }

    /// The tenant's limits, checked (min ≤ max).
    pub fn limits(&self) -> Result<TenantLimits, ModelError> {
        let min_bps = match rate("min", &self.min)? {
            Some(m) => m.ok_or(ModelError::UnlimitedMin)?,
            None => 0,
        };
        let max_bps = rate("max", &self.max)?.flatten();
        if let Some(max) = max_bps {
            if min_bps > max {
                return Err(ModelError::TenantMinAboveMax {
                    min: format_rate(Some(min_bps)),
                    max: format_rate(Some(max)),
                });
            }
        }
        Ok(TenantLimits { min_bps, max_bps })
    }
}

/// One vif in a host's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VifStatus {
    /// The vif's tenant, if etcd names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The vif's own weight.
    pub weight: u32,
    /// The vif's own floor, bit/s.
    pub min_bps: u64,
    /// The vif's own cap, bit/s (`null`: unlimited).
    pub max_bps: Option<u64>,
    /// Measured rate the VM sent into the switch over the last period, bit/s.
    pub rate_bps: u64,
    /// Estimated demand, bit/s (`null`: it uses all it is given and wants more).
    pub demand_bps: Option<u64>,
    /// It uses (nearly) all of its floor share: the floor split counts it greedy
    /// ([`crate::fills_floor`]). Absent: `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub floor_greedy: bool,
    /// It sent (nearly) nothing: its demand is the probe ([`crate::is_idle`]); the split holds
    /// the idle vifs to a small pool. Absent: `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// The tenant share in force: the effective max, bit/s (absent: no tenant share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_max_bps: Option<u64>,
    /// The tenant share in force: the effective min, bit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_min_bps: Option<u64>,
}

/// `/vqos/v1/status/<host>`: a host's status, written every period under the host's lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStatus {
    /// `"ok"`, or why the host is unhealthy (its forwarding loop).
    pub health: String,
    /// When the agent wrote this, milliseconds since the Unix epoch (the writer's clock).
    pub updated_unix_ms: u64,
    /// The agent's period, ms.
    pub period_ms: u64,
    /// The vifs etcd names for this host that exist here, by port name.
    pub vifs: BTreeMap<String, VifStatus>,
    /// Problems with the desired state: keys that do not parse, ports that do not exist,
    /// policies the switch refused, tenants without a policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vif_doc_becomes_a_policy_with_defaults() {
        let d = VifDoc::parse(br#"{"weight": 2, "max": "300Mbit", "tenant": "acme"}"#).unwrap();
        let p = d.policy("vm3").unwrap();
        assert_eq!(p.weight, 2);
        assert_eq!(p.max_bps, Some(300_000_000));
        assert_eq!(p.min_bps, 0);
        assert_eq!(p.priority, VifPolicy::default().priority);
        assert_eq!(d.tenant.as_deref(), Some("acme"));
        assert_eq!(
            VifDoc::parse(b"{}").unwrap().policy("x").unwrap(),
            VifPolicy::default()
        );
    }

    #[test]
    fn a_vif_doc_carries_the_inbound_max_and_the_burst() {
        let d = VifDoc::parse(br#"{"max": "300Mbit", "max_in": "100Mbit", "burst": "256KiB"}"#)
            .unwrap();
        let p = d.policy("vm3").unwrap();
        assert_eq!(p.max_in_bps, Some(100_000_000));
        assert_eq!(p.burst_bytes, Some(256 * 1024));
        let d = VifDoc::parse(br#"{"max": "300Mbit", "max_in": "unlimited"}"#).unwrap();
        assert_eq!(
            d.policy("vm3").unwrap().max_in_bps,
            Some(vqos_sched::policy::UNLIMITED_IN_BPS)
        );
        let e = |t: &str| {
            VifDoc::parse(t.as_bytes())
                .unwrap()
                .policy("vm3")
                .unwrap_err()
                .to_string()
        };
        assert!(e(r#"{"burst": "10Kbit"}"#).starts_with("Invalid burst"));
        assert!(e(r#"{"max_in": "fast"}"#).starts_with("Invalid max_in"));
        assert!(e(r#"{"max": "1Mbit", "burst": "0"}"#).contains("vm3"));
    }

    #[test]
    fn bad_vif_docs_are_refused_with_the_reason() {
        let e = |t: &str| match VifDoc::parse(t.as_bytes()) {
            Ok(d) => d.policy("vm3").unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(e(r#"{"max": "fast"}"#).starts_with("Invalid max"));
        assert!(e(r#"{"min": "unlimited"}"#).contains("not unlimited"));
        assert!(e(r#"{"weight": 0}"#).contains("vm3"));
        assert!(e(r#"{"min": "2Gbit", "max": "1Gbit"}"#).contains("vm3"));
        assert!(e(r#"{"tenant": "a/b"}"#).contains("Invalid tenant name"));
        assert!(e("not json").starts_with("Invalid JSON"));
    }

    #[test]
    fn unknown_fields_are_kept_aside_and_the_rest_is_used() {
        // A newer CLI's field: the tenant's cap is still read (issue 24: it was refused, and
        // the tenant's vifs lost their shares).
        let t = TenantDoc::parse(br#"{"max":"100Mbit","added_by_a_newer_cli":true}"#).unwrap();
        assert_eq!(t.limits().unwrap().max_bps, Some(100_000_000));
        assert_eq!(field_list(&t.unknown), "`added_by_a_newer_cli`");
        // Written back as read (the CLI's read-modify-write keeps the newer field).
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"max":"100Mbit","added_by_a_newer_cli":true}"#);
        let v = VifDoc::parse(br#"{"wieght": 2, "max": "1Gbit", "later": {"x": 1}}"#).unwrap();
        assert_eq!(v.policy("vm3").unwrap().max_bps, Some(1_000_000_000));
        assert_eq!(v.policy("vm3").unwrap().weight, 1);
        assert_eq!(field_list(&v.unknown), "`later`, `wieght`");
        // A known field of the wrong type is still refused.
        assert!(TenantDoc::parse(br#"{"max": 100, "new": 1}"#).is_err());
    }

    #[test]
    fn tenant_limits_are_checked() {
        let t = TenantDoc::parse(br#"{"min": "200Mbit", "max": "1Gbit"}"#).unwrap();
        assert_eq!(
            t.limits().unwrap(),
            TenantLimits {
                min_bps: 200_000_000,
                max_bps: Some(1_000_000_000)
            }
        );
        let bad = TenantDoc::parse(br#"{"min": "2Gbit", "max": "1Gbit"}"#).unwrap();
        assert_eq!(
            bad.limits().unwrap_err().to_string(),
            "Tenant min 2Gbit is above its max 1Gbit"
        );
        assert_eq!(
            TenantDoc::default().limits().unwrap(),
            TenantLimits {
                min_bps: 0,
                max_bps: None
            }
        );
    }

    #[test]
    fn status_round_trips() {
        let mut s = HostStatus {
            health: "ok".into(),
            period_ms: 500,
            ..Default::default()
        };
        s.vifs.insert(
            "vm1".into(),
            VifStatus {
                tenant: Some("acme".into()),
                weight: 1,
                rate_bps: 5,
                demand_bps: None,
                ..Default::default()
            },
        );
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<HostStatus>(&text).unwrap(), s);
    }
}
