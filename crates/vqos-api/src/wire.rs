//! The JSON (and TOML) shapes of the control API: policy patches, port requests, and the views
//! the daemon answers with.
//!
//! Rates are accepted as strings (`"200Mbit"`, `"1.5Gbit"`, `"unlimited"`) or as plain numbers
//! of bits per second, and are answered both ways (`"min": "200Mbit", "min_bps": 200000000`).

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use vqos_sched::change::PolicyChange;
use vqos_sched::policy::{PRIORITY_LEVELS, UNLIMITED_IN_BPS};
use vqos_sched::units::{format_bytes, format_rate, parse_bytes, parse_rate};
use vqos_sched::VifPolicy;

pub use crate::access::{Account, FileMode};
pub use crate::migrate::HandoverView;
pub use crate::port::{
    LockedAddrs, NoOtherFields, PortConfig, PortId, PortKind, PortRequest, PortState, PortView,
    Service, VhostUserRole,
};
use crate::stats::{LoopStats, PortStats};

/// Why a request body or a config entry could not be turned into a policy or a port.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// `min` was given as `unlimited`.
    #[error("Vif '{0}': min cannot be unlimited")]
    UnlimitedMin(String),
    /// A MAC address that is not six hex bytes separated by colons.
    #[error("Invalid MAC address '{0}': expected six hex bytes like 02:00:00:00:00:01")]
    BadMac(String),
    /// A port name the kernel would refuse for an interface.
    #[error("Invalid port name '{0}': expected 1 to 15 characters among A-Z a-z 0-9 . _ -")]
    BadPortName(String),
}

/// A rate as written by a client: `Some(bps)` or `None` for unlimited. Sent as a number of
/// bit/s or `"unlimited"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate(pub Option<u64>);

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(bps) => s.serialize_u64(bps),
            None => s.serialize_str("unlimited"),
        }
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct RateVisitor;
        impl Visitor<'_> for RateVisitor {
            type Value = Rate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate such as \"200Mbit\", \"unlimited\" or a number of bit/s")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Rate, E> {
                parse_rate(v).map(Rate).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Rate, E> {
                Ok(Rate(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Rate, E> {
                u64::try_from(v)
                    .map(|v| Rate(Some(v)))
                    .map_err(|_| E::custom(format!("Invalid rate {v}: must not be negative")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Rate, E> {
                Err(E::custom(format!(
                    "Invalid rate {v}: use whole bit/s or a string like \"1.5Mbit\""
                )))
            }
        }
        d.deserialize_any(RateVisitor)
    }
}

/// A size in bytes as written by a client: `"64KiB"`, `"1500B"` or a plain number of bytes
/// (sent as a number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64KiB\" or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                parse_bytes(v).map(Size).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("Invalid size {v}: must not be negative")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(format!(
                    "Invalid size {v}: use whole bytes or a string like \"1.5KB\""
                )))
            }
        }
        d.deserialize_any(SizeVisitor)
    }
}

/// Deserializes a present field (even `null`) as `Some(inner)`, so that an absent field
/// (`None`) and `"max": null` (`Some(None)`, unlimited) differ.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A partial policy: fields left out keep their current value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPatch {
    /// Proportional share (> 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Guaranteed minimum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<Rate>,
    /// Hard maximum of what the vif sends (also spelt `max_out`); `"unlimited"` or `null`
    /// removes it.
    #[serde(
        default,
        deserialize_with = "present",
        alias = "max_out",
        skip_serializing_if = "Option::is_none"
    )]
    pub max: Option<Option<Rate>>,
    /// Latency priority 0 (most urgent) ..= 7.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Hard maximum of what the vif receives from the uplink; `"unlimited"`: none, whatever
    /// `max` is; `null`: the same as `max` (the default).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_in: Option<Option<Rate>>,
    /// Bytes the vif may send above `max` after idling (`"64KiB"`, 1..=1GiB); `null`: the
    /// engine's default.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub burst: Option<Option<Size>>,
}

impl PolicyPatch {
    /// `base` with the fields of this patch replaced; `vif` names the vif in errors. The result
    /// is not validated (the daemon validates the whole set).
    pub fn apply(&self, base: &VifPolicy, vif: &str) -> Result<VifPolicy, WireError> {
        self.change()
            .apply(base)
            .map_err(|_| WireError::UnlimitedMin(vif.to_string()))
    }

    /// The change this patch makes ([`PolicyChange`], where each field's meaning is defined
    /// once for the API, the cluster's documents and the CLI).
    pub fn change(&self) -> PolicyChange {
        PolicyChange {
            weight: self.weight,
            min_bps: self.min.map(|r| r.0),
            max_bps: self.max.map(|m| m.and_then(|r| r.0)),
            priority: self.priority,
            max_in_bps: self.max_in.map(|m| m.map(|r| PolicyChange::max_in(r.0))),
            burst_bytes: self.burst.map(|b| b.map(|s| s.0)),
        }
    }

    /// True when the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == PolicyPatch::default()
    }
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = WireError;
    fn from_str(s: &str) -> Result<Self, WireError> {
        let bad = || WireError::BadMac(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// Checks that `name` can be a network interface name (Linux: at most 15 bytes).
pub fn check_port_name(name: &str) -> Result<(), WireError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(WireError::BadPortName(name.to_string()))
    }
}

/// A policy as the daemon reports it: human rates and exact numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    /// Proportional share.
    pub weight: u32,
    /// Guaranteed minimum, e.g. `"200Mbit"` (`"0bit"` = none).
    pub min: String,
    /// Hard maximum, e.g. `"500Mbit"` or `"unlimited"`.
    pub max: String,
    /// Guaranteed minimum in bit/s.
    pub min_bps: u64,
    /// Hard maximum in bit/s; `null` = unlimited.
    pub max_bps: Option<u64>,
    /// Latency priority 0..=7.
    pub priority: u8,
    /// Inbound maximum, e.g. `"100Mbit"` or `"unlimited"`; absent: the same as `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in: Option<String>,
    /// Inbound maximum in bit/s; absent when unlimited or the same as `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_bps: Option<u64>,
    /// Burst above `max`, e.g. `"64KiB"`; absent: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<String>,
    /// Burst above `max` in bytes; absent: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_bytes: Option<u64>,
    /// What the switch enforces instead of `min` and `max`, when a cluster share or a
    /// controller's limit changes them; absent when it enforces the policy as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced: Option<EnforcedView>,
}

/// The minimum and maximum the switch enforces for a vif, and what set them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnforcedView {
    /// Guaranteed minimum in force, e.g. `"150Mbit"`.
    pub min: String,
    /// Maximum in force, e.g. `"300Mbit"` or `"unlimited"`.
    pub max: String,
    /// Guaranteed minimum in force, bit/s.
    pub min_bps: u64,
    /// Maximum in force, bit/s; `null` = unlimited.
    pub max_bps: Option<u64>,
    /// What changed them: `"cluster"` (the tenant's share from etcd), `"controller"` (the
    /// fairness adjuster's limit).
    pub by: Vec<String>,
}

impl EnforcedView {
    /// The view of `enforced` (the policy the switch is given) for a vif whose own policy is
    /// `own`, changed by `by`; `None` when its min and max are the vif's own.
    pub fn of(own: &VifPolicy, enforced: &VifPolicy, by: Vec<String>) -> Option<EnforcedView> {
        (own.min_bps != enforced.min_bps || own.max_bps != enforced.max_bps).then(|| EnforcedView {
            min: format_rate(Some(enforced.min_bps)),
            max: format_rate(enforced.max_bps),
            min_bps: enforced.min_bps,
            max_bps: enforced.max_bps,
            by,
        })
    }
}

impl From<&VifPolicy> for PolicyView {
    fn from(p: &VifPolicy) -> Self {
        let max_in_bps = p.max_in_bps.filter(|&m| m != UNLIMITED_IN_BPS);
        PolicyView {
            weight: p.weight,
            min: format_rate(Some(p.min_bps)),
            max: format_rate(p.max_bps),
            min_bps: p.min_bps,
            max_bps: p.max_bps,
            priority: p.priority,
            max_in: p.max_in_bps.map(|_| format_rate(max_in_bps)),
            max_in_bps,
            burst: p.burst_bytes.map(format_bytes),
            burst_bytes: p.burst_bytes,
            enforced: None,
        }
    }
}

/// The view of the default policy (weight 1, no min, no max, priority 7).
impl Default for PolicyView {
    fn default() -> Self {
        PolicyView::from(&VifPolicy::default())
    }
}

impl From<&PolicyView> for VifPolicy {
    fn from(v: &PolicyView) -> Self {
        VifPolicy {
            weight: v.weight,
            min_bps: v.min_bps,
            max_bps: v.max_bps,
            priority: v.priority,
            max_in_bps: v
                .max_in_bps
                .or_else(|| v.max_in.as_ref().map(|_| UNLIMITED_IN_BPS)),
            burst_bytes: v.burst_bytes,
        }
    }
}

/// The answer of `DELETE /v1/ports/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedView {
    /// The port removed.
    pub removed: String,
}

/// The answer of `POST /v1/reload`: what re-reading the config file changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadView {
    /// Ports added (new `[[port]]` entries).
    pub added: Vec<String>,
    /// Ports removed (entries gone from the file).
    pub removed: Vec<String>,
    /// Vifs whose policy was set from the file (their entry's policy changed).
    pub policies: Vec<String>,
    /// The new capacity, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
    /// The new `max_ports`, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ports: Option<usize>,
}

impl ReloadView {
    /// True when the reload changed nothing.
    pub fn is_empty(&self) -> bool {
        *self == ReloadView::default()
    }
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, naming the field, vif or endpoint.
    pub error: String,
}

/// One port in `GET /v1/stats`: its counters, its role and (for vifs) its policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortStatsView {
    /// Counters and gauges from the switch.
    #[serde(flatten)]
    pub stats: PortStats,
    /// `"vif"` or `"uplink"`.
    pub role: String,
    /// The vif's port id ([`PortId`]; absent for the uplink).
    #[serde(default, skip_serializing_if = "is_no_id")]
    pub id: PortId,
    /// The vif's policy as the user set it (`null` for the uplink).
    pub policy: Option<PolicyView>,
    /// The fairness adjuster's current limit on the vif, bit/s (`null`: none). The switch
    /// enforces `min(policy max, this)`, never below the policy's minimum.
    #[serde(default)]
    pub controller_limit_bps: Option<u64>,
    /// The PID-ECN controller's CE-marking probability for the vif's frames, to it and from it
    /// to the uplink (`null` for the uplink; 0 without the controller).
    #[serde(default)]
    pub ecn_probability: Option<f64>,
}

fn is_no_id(id: &PortId) -> bool {
    !id.is_given()
}

/// The body of `GET /v1/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsView {
    /// The scheduling engine.
    pub engine: String,
    /// Uplink capacity in bit/s; `null` = unlimited.
    pub capacity_bps: Option<u64>,
    /// Per port (vifs and the uplink).
    pub ports: Vec<PortStatsView>,
    /// Per poll loop.
    pub loops: Vec<LoopStats>,
    /// Learnt MAC addresses.
    #[serde(default)]
    pub mac_entries: u64,
    /// How purchases are priced in cycles (as `GET /v1/cost-model`, without the samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<crate::cost::CostModelView>,
}

/// How the forwarding loop is doing, in `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopView {
    /// The loop thread is alive.
    pub running: bool,
    /// Time since the loop last published its stats, ms.
    pub stats_age_ms: u64,
    /// Beyond this age the loop counts as dead, ms.
    pub stale_after_ms: u64,
}

/// The body of `GET /v1/health` (status 200 when healthy, 503 when not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthView {
    /// `"ok"` or `"unhealthy"`.
    pub status: String,
    /// Why the daemon is unhealthy (absent when healthy); named `error` so clients show it as
    /// any error answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The daemon's version.
    pub version: String,
    /// The scheduling engine.
    pub engine: String,
    /// Uplink capacity, e.g. `"940Mbit"`.
    pub capacity: String,
    /// Number of vif ports.
    pub ports: usize,
    /// Seconds since the daemon started.
    pub uptime_s: u64,
    /// The forwarding loop.
    #[serde(rename = "loop")]
    pub forwarding: LoopView,
    /// The etcd agent (absent unless the config has a `[cluster]` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterHealthView>,
}

/// The etcd agent in `GET /v1/health` (docs/cluster.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterHealthView {
    /// This host's name in etcd.
    pub host: String,
    /// `"connected"`, `"connecting"` (not yet synced) or `"disconnected"` (fail-static: the last
    /// applied policies and shares stay in force).
    pub state: String,
    /// Why etcd cannot be used (absent while connected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The etcd revision of the desired state last applied (0 before the first sync).
    pub revision: i64,
    /// Vifs whose policy etcd sets (the local API refuses to change them).
    pub managed_vifs: usize,
    /// Milliseconds since the last successful period (status published, shares computed);
    /// absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_age_ms: Option<u64>,
    /// Times the agent (re)connected and resynced.
    pub syncs: u64,
    /// Watch events applied.
    pub events: u64,
    /// Problems with the desired state (keys that do not parse, ports that do not exist,
    /// policies refused, tenants without a policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// The agent's view lapsed (no period completed for `lease_ttl`): every tenant share is
    /// held to its grant's fallback until a period completes (docs/cluster.md, "Never above
    /// the max"). Absent while false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback_held: bool,
}

/// Highest valid priority, re-exported for the CLI's help text.
pub const MAX_PRIORITY: u8 = (PRIORITY_LEVELS - 1) as u8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_keeps_absent_fields_and_tells_null_from_absent() {
        let base = VifPolicy {
            weight: 3,
            min_bps: 10,
            max_bps: Some(100),
            priority: 2,
            ..Default::default()
        };
        let p: PolicyPatch = serde_json::from_str(r#"{"min":"1Kbit"}"#).unwrap();
        let got = p.apply(&base, "a").unwrap();
        assert_eq!(got.min_bps, 1000);
        assert_eq!((got.weight, got.max_bps, got.priority), (3, Some(100), 2));
        let p: PolicyPatch = serde_json::from_str(r#"{"max":null}"#).unwrap();
        assert_eq!(p.apply(&base, "a").unwrap().max_bps, None);
        let p: PolicyPatch = serde_json::from_str(r#"{"max":"unlimited","weight":5}"#).unwrap();
        let got = p.apply(&base, "a").unwrap();
        assert_eq!((got.max_bps, got.weight), (None, 5));
        let p: PolicyPatch = serde_json::from_str(r#"{"max":250000000}"#).unwrap();
        assert_eq!(p.apply(&base, "a").unwrap().max_bps, Some(250_000_000));
        let p: PolicyPatch = serde_json::from_str(r#"{"min":"unlimited"}"#).unwrap();
        assert_eq!(
            p.apply(&base, "a").unwrap_err().to_string(),
            "Vif 'a': min cannot be unlimited"
        );
    }

    #[test]
    fn patch_sets_max_in_max_out_and_burst_and_views_round_trip() {
        let base = VifPolicy::default();
        let p: PolicyPatch =
            serde_json::from_str(r#"{"max_out":"200Mbit","max_in":"100Mbit","burst":"64KiB"}"#)
                .unwrap();
        let got = p.apply(&base, "a").unwrap();
        assert_eq!(
            (got.max_bps, got.max_in_bps, got.burst_bytes),
            (Some(200_000_000), Some(100_000_000), Some(65_536))
        );
        let v = PolicyView::from(&got);
        assert_eq!(
            (v.max_in.as_deref(), v.burst.as_deref()),
            (Some("100Mbit"), Some("64KiB"))
        );
        assert_eq!(VifPolicy::from(&v), got);
        let json = serde_json::to_string(&v).unwrap();
        let back: PolicyView = serde_json::from_str(&json).unwrap();
        assert_eq!(VifPolicy::from(&back), got);
        // Unlimited inbound is not "the same as max", and survives the view.
        let p: PolicyPatch = serde_json::from_str(r#"{"max_in":"unlimited"}"#).unwrap();
        let unl = p.apply(&got, "a").unwrap();
        assert_eq!(unl.max_in_bps, Some(UNLIMITED_IN_BPS));
        let v = PolicyView::from(&unl);
        assert_eq!(
            (v.max_in.as_deref(), v.max_in_bps),
            (Some("unlimited"), None)
        );
        assert_eq!(VifPolicy::from(&v), unl);
        // null: back to the defaults (max_in follows max, the engine's burst).
        let p: PolicyPatch = serde_json::from_str(r#"{"max_in":null,"burst":null}"#).unwrap();
        let reset = p.apply(&unl, "a").unwrap();
        assert_eq!((reset.max_in_bps, reset.burst_bytes), (None, None));
        let v = serde_json::to_value(PolicyView::from(&reset)).unwrap();
        assert!(v.get("max_in").is_none() && v.get("burst").is_none(), "{v}");
        // A plain number of bytes.
        let p: PolicyPatch = serde_json::from_str(r#"{"burst":1500}"#).unwrap();
        assert_eq!(p.apply(&base, "a").unwrap().burst_bytes, Some(1500));
    }

    #[test]
    fn patch_refuses_bad_fields() {
        let e = serde_json::from_str::<PolicyPatch>(r#"{"burst":"64Kbit"}"#).unwrap_err();
        assert!(e.to_string().contains("Invalid size '64Kbit'"), "{e}");
        let e = serde_json::from_str::<PolicyPatch>(r#"{"burst":-1}"#).unwrap_err();
        assert!(e.to_string().contains("must not be negative"), "{e}");
        let e = serde_json::from_str::<PolicyPatch>(r#"{"max":"1Mbit","max_out":"2Mbit"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("duplicate field `max`"), "{e}");
        let e = serde_json::from_str::<PolicyPatch>(r#"{"wieght":1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `wieght`"), "{e}");
        let e = serde_json::from_str::<PolicyPatch>(r#"{"min":"5Mbyte"}"#).unwrap_err();
        assert!(e.to_string().contains("Invalid rate '5Mbyte'"), "{e}");
        let e = serde_json::from_str::<PolicyPatch>(r#"{"min":-5}"#).unwrap_err();
        assert!(e.to_string().contains("must not be negative"), "{e}");
        let e = serde_json::from_str::<PolicyPatch>(r#"{"max":1.5}"#).unwrap_err();
        assert!(e.to_string().contains("Invalid rate 1.5"), "{e}");
    }

    #[test]
    fn macs_and_names() {
        let m: MacAddr = "02:00:0A:ff:00:01".parse().unwrap();
        assert_eq!(m.to_string(), "02:00:0a:ff:00:01");
        for bad in [
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "2:00:00:00:00:01",
            "zz:00:00:00:00:01",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
        assert!(check_port_name("vm1-tap.0").is_ok());
        for bad in ["", "a/b", "..", "sixteen-chars-xx", "a b"] {
            assert!(check_port_name(bad).is_err(), "{bad:?}");
        }
    }
}
