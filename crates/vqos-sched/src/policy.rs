//! What a tenant bought: the per-vif policy, the set of vifs on one uplink, and validation.
//!
//! A [`PolicySet`] is immutable once built: the data plane and the simulator receive a new one
//! (a snapshot) when anything changes, and engines re-derive their state from it between batches.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cost::{CostError, Pricing};
use crate::units::{format_bytes, format_rate};
use crate::variant::Variant;

/// Index of a vif in its [`PolicySet`] (dense, `0..len`).
pub type VifId = usize;

/// Number of latency priorities (0 = most urgent .. 7 = least), as C2QoS's HBS.
pub const PRIORITY_LEVELS: usize = 8;

/// Default priority of a vif that states none: the lowest.
pub const DEFAULT_PRIORITY: u8 = 7;

/// What a vif is charged for what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CostModel {
    /// Bytes on the wire (ANCS, the token-bucket baselines): the link is the scarce resource.
    #[default]
    Bytes,
    /// CPU cycles the switch spent on the vif's batches (C2QoS): the forwarding core is scarce.
    Cycles,
}

/// Largest burst a policy may state: 1 GiB (about 8.6 s at 1 Gbit/s). A larger bucket is
/// almost certainly a unit mistake, and it would let one vif hold the link for seconds.
pub const MAX_BURST_BYTES: u64 = 1 << 30;

/// `max_in_bps` meaning "unlimited inbound" (rather than `None`, "the same as `max_bps`").
pub const UNLIMITED_IN_BPS: u64 = u64::MAX;

/// One vif's policy. Rates are bits per second.
///
/// The directions are the vif's: *outbound* is what the vif sends (vif→uplink and vif→vif,
/// what the engines schedule), *inbound* is what it receives (from the uplink and from other
/// vifs: the data plane's downlink engine, [`PolicySet::downlink`]). `weight`, `min_bps`, `priority` and
/// `burst_bytes` act on both directions; `max_bps` is outbound, `max_in_bps` inbound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VifPolicy {
    /// Proportional share; must be > 0.
    pub weight: u32,
    /// Guaranteed minimum (reservation) of what the vif sends, and of what it receives
    /// (capped there by the inbound max), bits/s; 0 = none.
    pub min_bps: u64,
    /// Hard maximum (limit) of what the vif sends (`max_out`), bits/s; `None` = unlimited.
    pub max_bps: Option<u64>,
    /// Latency priority, 0 (most urgent) ..= 7.
    pub priority: u8,
    /// Hard maximum of what the vif receives from the uplink (`max_in`), bits/s; `None` = the
    /// downlink follows `max_bps` (when the switch's `downlink_max` is on), as before this
    /// field existed; [`UNLIMITED_IN_BPS`] = no inbound limit whatever `max_bps` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_bps: Option<u64>,
    /// Bytes the vif may send above `max_bps` after idling (the depth of its cap bucket), in
    /// `1..=MAX_BURST_BYTES`; `None` = the engine's own default depth. Has no effect without
    /// `max_bps`, and never changes long-run shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_bytes: Option<u64>,
}

impl Default for VifPolicy {
    fn default() -> Self {
        VifPolicy {
            weight: 1,
            min_bps: 0,
            max_bps: None,
            priority: DEFAULT_PRIORITY,
            max_in_bps: None,
            burst_bytes: None,
        }
    }
}

impl VifPolicy {
    /// The limit on what the vif receives, bits/s (`None` = unlimited): `max_in_bps` when
    /// stated, else `max_bps` if `follow_max` (the data plane's `downlink_max`).
    pub fn inbound_max_bps(&self, follow_max: bool) -> Option<u64> {
        match self.max_in_bps {
            Some(UNLIMITED_IN_BPS) => None,
            Some(m) => Some(m),
            None => self.max_bps.filter(|_| follow_max),
        }
    }

    /// The guaranteed minimum of what the vif receives: `min_bps`, capped by the inbound max
    /// (a floor above what the vif may receive cannot be given).
    pub fn inbound_min_bps(&self, follow_max: bool) -> u64 {
        self.inbound_max_bps(follow_max)
            .map_or(self.min_bps, |m| m.min(self.min_bps))
    }

    /// The policy of the inbound direction: the same weight, priority and burst, the max
    /// [`VifPolicy::inbound_max_bps`], the min [`VifPolicy::inbound_min_bps`].
    pub fn inbound(&self, follow_max: bool) -> VifPolicy {
        VifPolicy {
            min_bps: self.inbound_min_bps(follow_max),
            max_bps: self.inbound_max_bps(follow_max),
            max_in_bps: None,
            ..self.clone()
        }
    }

    /// Checks the policy on its own (not against the others sharing the link).
    pub fn validate(&self, name: &str) -> Result<(), PolicyError> {
        if self.weight == 0 {
            return Err(PolicyError::ZeroWeight(name.to_string()));
        }
        if let Some(max) = self.max_bps {
            if self.min_bps > max {
                return Err(PolicyError::MinAboveMax {
                    vif: name.to_string(),
                    min: format_rate(Some(self.min_bps)),
                    max: format_rate(Some(max)),
                });
            }
        }
        if usize::from(self.priority) >= PRIORITY_LEVELS {
            return Err(PolicyError::BadPriority {
                vif: name.to_string(),
                priority: self.priority,
            });
        }
        if let Some(burst) = self.burst_bytes {
            if burst == 0 || burst > MAX_BURST_BYTES {
                return Err(PolicyError::BadBurst {
                    vif: name.to_string(),
                    burst: format_bytes(burst),
                });
            }
        }
        // max_in is not checked against min: the minimum guarantees what the vif sends, and
        // max_in limits what it receives.
        Ok(())
    }
}

/// A named vif and its policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VifSpec {
    /// Unique name (the port name in the switch, the VM name in a scenario).
    pub name: String,
    /// What the tenant bought.
    #[serde(flatten)]
    pub policy: VifPolicy,
}

/// Why a policy or a policy change was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// Weight 0 would give the vif nothing and divide by zero.
    #[error("Vif '{0}': weight must be greater than 0")]
    ZeroWeight(String),
    /// The floor is above the cap.
    #[error("Vif '{vif}': min {min} is above max {max}")]
    MinAboveMax {
        /// The vif.
        vif: String,
        /// Its minimum.
        min: String,
        /// Its maximum.
        max: String,
    },
    /// The reservations cannot all be honoured on this link.
    #[error("Sum of minimums {sum} exceeds capacity {capacity}")]
    MinsOverCapacity {
        /// Σ min.
        sum: String,
        /// The link's capacity.
        capacity: String,
    },
    /// The reservations cannot all be honoured on the downlink (what the vifs receive).
    #[error("Sum of minimums {sum} exceeds the downlink capacity (capacity_in) {capacity}")]
    MinsOverDownlink {
        /// Σ min in the inbound direction.
        sum: String,
        /// The downlink's capacity.
        capacity: String,
    },
    /// Priority out of 0..=7.
    #[error("Vif '{vif}': priority {priority} is out of range 0..=7")]
    BadPriority {
        /// The vif.
        vif: String,
        /// The priority given.
        priority: u8,
    },
    /// A burst of 0 bytes or above [`MAX_BURST_BYTES`].
    #[error("Vif '{vif}': burst {burst} is out of range 1B..=1GiB")]
    BadBurst {
        /// The vif.
        vif: String,
        /// The burst given.
        burst: String,
    },
    /// No vif of that name.
    #[error("Unknown vif '{0}'")]
    UnknownVif(String),
    /// Two vifs with one name.
    #[error("Duplicate vif '{0}'")]
    DuplicateVif(String),
    /// A capacity of zero bits per second.
    #[error("Capacity must be greater than 0")]
    ZeroCapacity,
    /// The engine needs a finite capacity (ANCS credit per period).
    #[error("Engine '{0}' needs a finite capacity")]
    NeedsCapacity(&'static str),
    /// The cycle cost model needs a cycle budget.
    #[error("The cycles cost model needs cycles_per_sec > 0")]
    NeedsCycleBudget,
    /// The pricing of purchases in cycles is not valid.
    #[error(transparent)]
    Pricing(#[from] CostError),
    /// The guarantees the engine gives need more of the core (or link) than may be sold.
    #[error("Purchases need {sold}, more than the {budget} the switch may sell ({engine})")]
    Oversold {
        /// The engine whose guarantees were priced.
        engine: String,
        /// Σ of the guarantees, priced.
        sold: String,
        /// What may be sold.
        budget: String,
    },
}

/// All vifs sharing one uplink, with the link's capacity and the cost model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySet {
    /// Uplink capacity in bits/s; `None` = unlimited (the NIC's own speed).
    pub capacity_bps: Option<u64>,
    /// What vifs are charged in.
    pub cost: CostModel,
    /// Cycles per second the forwarding core can spend (used by the cycles cost model).
    pub cycles_per_sec: u64,
    /// How the cycles cost model prices purchases ([`crate::cost`]); the default prices them
    /// as their share of the capacity.
    #[serde(default)]
    pub pricing: Pricing,
    /// Under the bytes cost model, the `vqos` engine's shares (weights) also count the core's
    /// time: a vif's virtual tag advances by its batch's dominant resource, the link's bytes
    /// or the cycles it took (priced at the capacity per `cycles_per_sec`), so sending small
    /// frames does not buy more of the core than a weight's share (DRFQ). Caps and floors stay
    /// in bytes. `false` here (the library's default); vqosd turns it on by default.
    #[serde(default)]
    pub cpu_fair: bool,
    /// Capacity of the downlink (what the vifs receive, scheduled by the data plane's
    /// downlink engine), bits/s: `None` = the same as `capacity_bps`; [`UNLIMITED_IN_BPS`] =
    /// unlimited whatever `capacity_bps` is. See [`PolicySet::downlink`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_in_bps: Option<u64>,
    /// Which reading of the papers the engines follow ([`crate::variant`]): vqos's measured
    /// departures (the default) or the papers as written.
    #[serde(default)]
    pub variant: Variant,
    /// The vifs; a vif's [`VifId`] is its index here.
    pub vifs: Vec<VifSpec>,
}

impl PolicySet {
    /// An empty, valid set on a link of `capacity_bps`, charging bytes.
    pub fn new(capacity_bps: Option<u64>) -> Self {
        PolicySet {
            capacity_bps,
            cost: CostModel::Bytes,
            cycles_per_sec: 2_000_000_000,
            pricing: Pricing::default(),
            cpu_fair: false,
            capacity_in_bps: None,
            variant: Variant::Vqos,
            vifs: Vec::new(),
        }
    }

    /// Adds a vif (builder style); call [`PolicySet::validate`] when done.
    pub fn with_vif(mut self, name: &str, policy: VifPolicy) -> Self {
        self.vifs.push(VifSpec {
            name: name.to_string(),
            policy,
        });
        self
    }

    /// Number of vifs.
    pub fn len(&self) -> usize {
        self.vifs.len()
    }

    /// True when no vif is configured.
    pub fn is_empty(&self) -> bool {
        self.vifs.is_empty()
    }

    /// The id of the vif called `name`.
    pub fn id(&self, name: &str) -> Result<VifId, PolicyError> {
        self.vifs
            .iter()
            .position(|v| v.name == name)
            .ok_or_else(|| PolicyError::UnknownVif(name.to_string()))
    }

    /// The policy of vif `id`.
    pub fn policy(&self, id: VifId) -> &VifPolicy {
        &self.vifs[id].policy
    }

    /// Checks every vif and the set as a whole.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.capacity_bps == Some(0) {
            return Err(PolicyError::ZeroCapacity);
        }
        if self.cost == CostModel::Cycles && self.cycles_per_sec == 0 {
            return Err(PolicyError::NeedsCycleBudget);
        }
        self.pricing.validate()?;
        // Linear in the vifs: the data plane validates every snapshot on its forwarding thread.
        let mut seen = std::collections::HashSet::with_capacity(self.vifs.len());
        for v in &self.vifs {
            v.policy.validate(&v.name)?;
            if !seen.insert(v.name.as_str()) {
                return Err(PolicyError::DuplicateVif(v.name.clone()));
            }
        }
        if self.capacity_in_bps == Some(0) {
            return Err(PolicyError::ZeroCapacity);
        }
        let over = |cap: Option<u64>, mins: &mut dyn Iterator<Item = u64>| {
            let cap = cap?;
            let sum: u128 = mins.map(u128::from).sum();
            (sum > u128::from(cap)).then(|| {
                (
                    format_rate(Some(u64::try_from(sum).unwrap_or(u64::MAX))),
                    format_rate(Some(cap)),
                )
            })
        };
        if let Some((sum, capacity)) = over(
            self.capacity_bps,
            &mut self.vifs.iter().map(|v| v.policy.min_bps),
        ) {
            return Err(PolicyError::MinsOverCapacity { sum, capacity });
        }
        // The downlink's floors (capped by each vif's inbound max) on its capacity; the
        // inbound max is taken as stated (`downlink_max` may make it lower, never higher).
        if let Some((sum, capacity)) = over(
            self.downlink_capacity_bps(),
            &mut self.vifs.iter().map(|v| v.policy.inbound_min_bps(false)),
        ) {
            return Err(PolicyError::MinsOverDownlink { sum, capacity });
        }
        Ok(())
    }

    /// The downlink's capacity, bits/s (`None`: unlimited): `capacity_in_bps` when stated,
    /// else `capacity_bps`.
    pub fn downlink_capacity_bps(&self) -> Option<u64> {
        match self.capacity_in_bps {
            Some(UNLIMITED_IN_BPS) => None,
            Some(c) => Some(c),
            None => self.capacity_bps,
        }
    }

    /// The set the data plane's downlink engine runs (what the vifs receive): the same vifs,
    /// cost model and pricing on [`PolicySet::downlink_capacity_bps`], each vif's policy
    /// turned inbound: the same weight, priority and burst, its max the inbound one
    /// ([`VifPolicy::inbound_max_bps`] with `follow_max`, the switch's `downlink_max`), its
    /// min capped by that max ([`VifPolicy::inbound_min_bps`]). One policy for both
    /// directions, `max_in` the one override (docs/design.md, "The scheduled downlink").
    pub fn downlink(&self, follow_max: bool) -> PolicySet {
        PolicySet {
            capacity_bps: self.downlink_capacity_bps(),
            capacity_in_bps: None,
            vifs: self
                .vifs
                .iter()
                .map(|v| VifSpec {
                    name: v.name.clone(),
                    policy: v.policy.inbound(follow_max),
                })
                .collect(),
            ..self.clone()
        }
    }

    /// A copy with vif `name`'s policy replaced, validated as a whole; `self` is untouched on error.
    pub fn with_policy(&self, name: &str, policy: VifPolicy) -> Result<PolicySet, PolicyError> {
        let id = self.id(name)?;
        let mut next = self.clone();
        next.vifs[id].policy = policy;
        next.validate()?;
        Ok(next)
    }

    /// Cost units per second that a rate of `bps` is worth under this set's cost model.
    ///
    /// Bytes: `bps / 8`. Cycles with a frame cost model ([`Pricing::model`]): the frames per
    /// second `bps` is at the reference frame size times what one such frame costs,
    /// `bps / (8·S) · (base_cycles + cycles_per_byte·S)` (C2QoS §III-B: purchased bandwidth
    /// priced under the reference traffic). Cycles without a model: the share of the core that
    /// the rate is of the capacity (a tenant who bought a quarter of the link gets a quarter of
    /// the core's cycles); with no finite capacity either, 1 cycle per bit as a documented
    /// fallback.
    pub fn cost_per_sec(&self, bps: u64) -> u64 {
        match self.cost {
            CostModel::Bytes => bps / 8,
            CostModel::Cycles => match (self.pricing.model, self.capacity_bps) {
                (Some(m), _) => m.cycles_per_sec(bps, self.pricing.frame_bytes),
                // bps <= 2^64 and cycles_per_sec <= 2^64: the product fits in u128.
                (None, Some(cap)) if cap > 0 => {
                    let v = u128::from(bps) * u128::from(self.cycles_per_sec) / u128::from(cap);
                    u64::try_from(v).unwrap_or(u64::MAX)
                }
                _ => bps,
            },
        }
    }

    /// Cost units that sending `bytes` at once is worth (a burst), priced as rates are: bytes
    /// under the bytes model, the matching share of a second of the core under cycles.
    pub fn burst_cost(&self, bytes: u64) -> u64 {
        self.cost_per_sec(bytes.saturating_mul(8))
    }

    /// Cost units per second of the whole resource being shared (link bytes or core cycles);
    /// `None` when the link is unlimited and bytes are charged.
    pub fn capacity_cost_per_sec(&self) -> Option<u64> {
        match self.cost {
            CostModel::Bytes => self.capacity_bps.map(|c| c / 8),
            CostModel::Cycles => Some(self.cycles_per_sec),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> PolicySet {
        PolicySet::new(Some(1_000_000_000))
            .with_vif("a", VifPolicy::default())
            .with_vif("b", VifPolicy::default())
    }

    #[test]
    fn validation_names_the_problem() {
        assert!(set().validate().is_ok());
        let zero = VifPolicy {
            weight: 0,
            ..Default::default()
        };
        assert_eq!(
            set().with_policy("a", zero).unwrap_err().to_string(),
            "Vif 'a': weight must be greater than 0"
        );
        let inverted = VifPolicy {
            min_bps: 300_000_000,
            max_bps: Some(200_000_000),
            ..Default::default()
        };
        assert_eq!(
            set().with_policy("b", inverted).unwrap_err().to_string(),
            "Vif 'b': min 300Mbit is above max 200Mbit"
        );
        let big = VifPolicy {
            min_bps: 600_000_000,
            ..Default::default()
        };
        let s = set().with_policy("a", big.clone()).unwrap();
        assert_eq!(
            s.with_policy("b", big).unwrap_err().to_string(),
            "Sum of minimums 1.2Gbit exceeds capacity 1Gbit"
        );
        assert_eq!(
            set().with_policy("zz", VifPolicy::default()).unwrap_err(),
            PolicyError::UnknownVif("zz".into())
        );
        let prio = VifPolicy {
            priority: 8,
            ..Default::default()
        };
        assert!(matches!(
            set().with_policy("a", prio),
            Err(PolicyError::BadPriority { .. })
        ));
        for (burst, msg) in [
            (0, "Vif 'a': burst 0B is out of range 1B..=1GiB"),
            (
                MAX_BURST_BYTES + 1,
                "Vif 'a': burst 1073741825B is out of range 1B..=1GiB",
            ),
        ] {
            let p = VifPolicy {
                burst_bytes: Some(burst),
                max_bps: Some(1_000_000),
                ..Default::default()
            };
            assert_eq!(set().with_policy("a", p).unwrap_err().to_string(), msg);
        }
        let edge = VifPolicy {
            burst_bytes: Some(MAX_BURST_BYTES),
            // A max_in below the (sending) minimum is fine: they limit different directions.
            min_bps: 10_000_000,
            max_in_bps: Some(1_000_000),
            ..Default::default()
        };
        assert!(set().with_policy("a", edge).is_ok());
        let dup = set().with_vif("a", VifPolicy::default());
        assert_eq!(dup.validate(), Err(PolicyError::DuplicateVif("a".into())));
    }

    #[test]
    fn inbound_max_follows_max_unless_stated() {
        let mut p = VifPolicy {
            max_bps: Some(5),
            ..Default::default()
        };
        assert_eq!(p.inbound_max_bps(true), Some(5));
        assert_eq!(p.inbound_max_bps(false), None);
        p.max_in_bps = Some(7);
        assert_eq!(p.inbound_max_bps(false), Some(7));
        p.max_in_bps = Some(UNLIMITED_IN_BPS);
        assert_eq!(p.inbound_max_bps(true), None);
    }

    #[test]
    fn the_downlink_set_is_the_inbound_policy_on_the_downlink_capacity() {
        let mut s = PolicySet::new(Some(1_000_000_000))
            .with_vif(
                "a",
                VifPolicy {
                    weight: 3,
                    min_bps: 200,
                    max_bps: Some(500),
                    priority: 2,
                    ..Default::default()
                },
            )
            .with_vif(
                "b",
                VifPolicy {
                    min_bps: 300,
                    max_in_bps: Some(100),
                    ..Default::default()
                },
            );
        assert_eq!(s.validate(), Ok(()));
        let d = s.downlink(true);
        assert_eq!(d.capacity_bps, Some(1_000_000_000));
        let a = d.policy(0);
        assert_eq!(
            (a.weight, a.min_bps, a.max_bps, a.priority),
            (3, 200, Some(500), 2)
        );
        // b's floor is capped by what it may receive; max_in becomes the max.
        let b = d.policy(1);
        assert_eq!((b.min_bps, b.max_bps, b.max_in_bps), (100, Some(100), None));
        assert_eq!(d.validate(), Ok(()));
        // Without downlink_max, a's max does not act inbound.
        assert_eq!(s.downlink(false).policy(0).max_bps, None);
        // The downlink's own capacity; unlimited; too small for the inbound floors (300).
        s.capacity_in_bps = Some(400);
        assert_eq!(s.downlink(true).capacity_bps, Some(400));
        assert_eq!(s.validate(), Ok(()));
        s.capacity_in_bps = Some(UNLIMITED_IN_BPS);
        assert_eq!(s.downlink(true).capacity_bps, None);
        s.capacity_in_bps = Some(299);
        assert!(matches!(
            s.validate(),
            Err(PolicyError::MinsOverDownlink { .. })
        ));
        s.capacity_in_bps = Some(0);
        assert_eq!(s.validate(), Err(PolicyError::ZeroCapacity));
    }

    #[test]
    fn cost_conversion() {
        let mut s = set();
        assert_eq!(s.cost_per_sec(800), 100);
        s.cost = CostModel::Cycles;
        s.cycles_per_sec = 2_000_000_000;
        // A quarter of the link is a quarter of the core.
        assert_eq!(s.cost_per_sec(250_000_000), 500_000_000);
        assert_eq!(s.capacity_cost_per_sec(), Some(2_000_000_000));
    }
}
