//! A change to a vif's policy, field by field ([`PolicyChange`]): the one definition of what
//! each field means when someone sets it. The API's patch (typed fields), the cluster's vif
//! documents and the CLI's `key=value` lists (text) each build one and apply it to a policy.
//!
//! ## Fields
//! | field | text | meaning |
//! |---|---|---|
//! | `weight` | a whole number | proportional share (validated later: > 0) |
//! | `min` | a rate | guaranteed minimum; `unlimited` is refused |
//! | `max` (also `max_out`) | a rate or `unlimited` | hard maximum of what the vif sends |
//! | `max_in` | a rate or `unlimited` | hard maximum of what it receives; `unlimited`: none, whatever `max` is |
//! | `priority` | 0..=7 | latency priority (validated later) |
//! | `burst` | a size | bytes it may send above `max` after idling |
//!
//! The result is not validated ([`VifPolicy::validate`] and the set's checks are the caller's).

use thiserror::Error;

use crate::policy::{VifPolicy, UNLIMITED_IN_BPS};
use crate::units::{parse_bytes, parse_rate};

/// Why a field could not be set or a change applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChangeError {
    /// `min` was given as `unlimited`.
    #[error("min cannot be unlimited")]
    UnlimitedMin,
    /// A field's text does not parse.
    #[error("{field}: {message}")]
    BadValue {
        /// The field.
        field: &'static str,
        /// Why.
        message: String,
    },
    /// Not a policy field.
    #[error("unknown policy field '{0}' (expected weight, min, max, max_in, priority or burst)")]
    UnknownField(String),
}

/// What to change in a policy; fields left `None` keep their value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyChange {
    /// The weight.
    pub weight: Option<u32>,
    /// The min (`Some(None)`: "unlimited", refused by [`PolicyChange::apply`]).
    pub min_bps: Option<Option<u64>>,
    /// The max (`Some(None)`: no max).
    pub max_bps: Option<Option<u64>>,
    /// The priority.
    pub priority: Option<u8>,
    /// The inbound max as [`VifPolicy::max_in_bps`] holds it (`Some(None)`: the same as the
    /// max); see [`PolicyChange::max_in`].
    pub max_in_bps: Option<Option<u64>>,
    /// The burst (`Some(None)`: the engine's default).
    pub burst_bytes: Option<Option<u64>>,
}

impl PolicyChange {
    /// The inbound max for a rate (`None`: unlimited, whatever the max is).
    pub fn max_in(rate: Option<u64>) -> u64 {
        rate.unwrap_or(UNLIMITED_IN_BPS)
    }

    /// Sets `field` from its text (see the module docs).
    pub fn set(&mut self, field: &str, text: &str) -> Result<(), ChangeError> {
        let rate = |field: &'static str| {
            parse_rate(text).map_err(|e| ChangeError::BadValue {
                field,
                message: e.to_string(),
            })
        };
        match field {
            "weight" => {
                self.weight = Some(text.trim().parse().map_err(|_| ChangeError::BadValue {
                    field: "weight",
                    message: format!("'{text}' is not a whole number"),
                })?)
            }
            "min" => self.min_bps = Some(rate("min")?),
            "max" | "max_out" => self.max_bps = Some(rate("max")?),
            "max_in" => self.max_in_bps = Some(Some(Self::max_in(rate("max_in")?))),
            "priority" => {
                self.priority = Some(text.trim().parse().map_err(|_| ChangeError::BadValue {
                    field: "priority",
                    message: format!("'{text}' is not a number 0..=7"),
                })?)
            }
            "burst" => {
                self.burst_bytes = Some(Some(parse_bytes(text).map_err(|e| {
                    ChangeError::BadValue {
                        field: "burst",
                        message: e.to_string(),
                    }
                })?))
            }
            other => return Err(ChangeError::UnknownField(other.to_string())),
        }
        Ok(())
    }

    /// `base` with this change's fields replaced (not validated).
    pub fn apply(&self, base: &VifPolicy) -> Result<VifPolicy, ChangeError> {
        let mut p = base.clone();
        if let Some(w) = self.weight {
            p.weight = w;
        }
        if let Some(min) = self.min_bps {
            p.min_bps = min.ok_or(ChangeError::UnlimitedMin)?;
        }
        if let Some(max) = self.max_bps {
            p.max_bps = max;
        }
        if let Some(prio) = self.priority {
            p.priority = prio;
        }
        if let Some(max_in) = self.max_in_bps {
            p.max_in_bps = max_in;
        }
        if let Some(burst) = self.burst_bytes {
            p.burst_bytes = burst;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<VifPolicy, ChangeError> {
        let mut c = PolicyChange::default();
        for (k, v) in pairs {
            c.set(k, v)?;
        }
        c.apply(&VifPolicy::default())
    }

    #[test]
    fn every_field_is_set_from_its_text() {
        let p = from(&[
            ("weight", "3"),
            ("min", "200Mbit"),
            ("max", "1Gbit"),
            ("max_in", "unlimited"),
            ("priority", "1"),
            ("burst", "64KiB"),
        ])
        .unwrap();
        assert_eq!(
            (p.weight, p.min_bps, p.max_bps, p.max_in_bps, p.priority),
            (
                3,
                200_000_000,
                Some(1_000_000_000),
                Some(UNLIMITED_IN_BPS),
                1
            )
        );
        assert_eq!(p.burst_bytes, Some(65_536));
        assert_eq!(
            from(&[("max_out", "5Mbit")]).unwrap().max_bps,
            Some(5_000_000)
        );
        assert_eq!(from(&[("max", "unlimited")]).unwrap().max_bps, None);
        assert_eq!(
            from(&[("max_in", "7Mbit")]).unwrap().max_in_bps,
            Some(7_000_000)
        );
    }

    #[test]
    fn fields_left_out_keep_their_value_and_bad_ones_are_named() {
        let base = VifPolicy {
            weight: 4,
            max_bps: Some(9),
            ..VifPolicy::default()
        };
        let c = PolicyChange {
            priority: Some(2),
            ..PolicyChange::default()
        };
        let p = c.apply(&base).unwrap();
        assert_eq!((p.weight, p.max_bps, p.priority), (4, Some(9), 2));
        assert_eq!(
            from(&[("min", "unlimited")]),
            Err(ChangeError::UnlimitedMin)
        );
        let e = from(&[("weight", "x")]).unwrap_err();
        assert_eq!(e.to_string(), "weight: 'x' is not a whole number");
        assert!(matches!(
            from(&[("max", "fast")]),
            Err(ChangeError::BadValue { field: "max", .. })
        ));
        assert_eq!(
            from(&[("colour", "red")]),
            Err(ChangeError::UnknownField("colour".into()))
        );
    }
}
