//! Which reading of the papers the engines and controllers follow.
//!
//! vqos departs from three published algorithms where a measurement showed the letter of the
//! paper failing in a batch-driven switch. Each departure is documented, with the measurement
//! that motivated it, beside its code. [`Variant::Paper`] switches every one of them back to
//! the paper's text, so that the departure's cost or gain can be measured in the same
//! scenario, on the same simulator or lab, instead of asserted:
//!
//! | where | [`Variant::Vqos`] (default) | [`Variant::Paper`] |
//! |---|---|---|
//! | ANCS accounting (`engines::ancs`) | arrears kept up to CreditPeak, the rest dropped | CreditLeft (§3.4): `RemainCredit > CreditPeak` ⇒ `RemainCredit − CreditFair` goes to the vifs after it, `RemainCredit = CreditFair` |
//! | fairness adjuster (`controllers::fairness`) | one-sided test with a relative tolerance, partial keeps, a second look, back-off, relax probes | Algorithm 1: every strong vif cut once, kept only if `\|ΔBW_weak − ΔBW\| < ξ`, otherwise given back whole; cut again while `RBW_i > fair_i + ΔBW`; weak vifs released ("enough credits") |
//! | PID-ECN marking (data plane, simulator) | the data a vif sends *and* receives | only what a vif receives |
//!
//! ## Limitations
//! - The paper variants keep every other choice of ours: what the papers leave open (ANCS's
//!   order of visits, Algorithm 1's ΔBW), and the departures that are not the papers' letter
//!   but the switch's (ANCS's grant size, the arrears cut). One departure at a time is what a
//!   comparison can attribute.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which reading of the papers the engines and controllers follow. See the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The papers with vqos's measured departures (the default).
    #[default]
    Vqos,
    /// The papers as written, where vqos departs from them.
    Paper,
}

impl Variant {
    /// Both variants, the default first.
    pub const ALL: [Variant; 2] = [Variant::Vqos, Variant::Paper];

    /// The name used in configs and scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Vqos => "vqos",
            Variant::Paper => "paper",
        }
    }

    /// True for the papers as written.
    pub fn is_paper(self) -> bool {
        self == Variant::Paper
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("Unknown variant '{s}' (expected \"vqos\" or \"paper\")"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>(), Ok(v));
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.name()));
            assert_eq!(serde_json::from_str::<Variant>(&json).unwrap(), v);
        }
        let e = "literal".parse::<Variant>().unwrap_err();
        assert!(e.contains("literal") && e.contains("paper"), "{e}");
        assert_eq!(Variant::default(), Variant::Vqos);
    }
}
