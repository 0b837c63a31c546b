//! `[[paper]]`: what the paper the scenario reproduces reports, carried beside the scenario so
//! reports can print it next to their own numbers. The simulator never uses it.

use serde::Deserialize;

use super::{invalid, Scenario, ScenarioError};

/// Which quantity of a phase the paper reports.
#[derive(Debug, Clone, PartialEq)]
pub enum PaperQuantity {
    /// One VM's rate (index into [`Scenario::vms`]).
    Vm(usize),
    /// The sum of the VMs' rates.
    Aggregate,
    /// Largest / smallest rate among these VMs (empty: all active VMs).
    Ratio(Vec<usize>),
    /// The unfairness index of the phase (a fraction: 0.81 = 81 %).
    Unfairness,
}

/// One number (or statement) of a paper for one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperValue {
    /// Where the paper reports it, e.g. "ANCS Fig. 5".
    pub figure: String,
    /// Phase number, 1-based; 0 for a figure over the whole run (`whole_run = true`: the
    /// paper's own average over its run, set beside the report's whole-run means).
    pub phase: usize,
    /// What it is.
    pub quantity: PaperQuantity,
    /// The number: bits/s for a VM or the aggregate, a plain number for a ratio or the
    /// unfairness; `None` when the paper states it only in words (then `note` says them).
    pub value: Option<f64>,
    /// The paper's words or a qualifier ("up to", "average over 600 s").
    pub note: String,
}

impl PaperValue {
    /// The number as printed: Mbit/s for rates (86.4), two decimals for a ratio, a
    /// percentage for the unfairness; `None` when the paper gives only words.
    pub fn number(&self) -> Option<String> {
        self.value.map(|v| match self.quantity {
            PaperQuantity::Vm(_) | PaperQuantity::Aggregate => trim(v / 1e6),
            PaperQuantity::Ratio(_) => format!("{v:.2}"),
            PaperQuantity::Unfairness => format!("{} %", trim(v * 100.0)),
        })
    }

    /// The value as a table cell: [`PaperValue::number`], the note after it (or alone).
    pub fn cell(&self) -> String {
        match (self.number(), self.note.is_empty()) {
            (Some(v), true) => v,
            (Some(v), false) => format!("{v} ({})", self.note),
            (None, _) => self.note.clone(),
        }
    }
}

/// A number without trailing zeros (86.40 → 86.4, 940.0 → 940).
fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPaper {
    figure: String,
    #[serde(default)]
    phase: usize,
    whole_run: Option<bool>,
    vm: Option<String>,
    #[serde(default)]
    aggregate: bool,
    #[serde(default)]
    ratio: bool,
    #[serde(default)]
    unfairness: bool,
    vms: Option<Vec<String>>,
    mbit: Option<f64>,
    value: Option<f64>,
    #[serde(default)]
    note: String,
}

impl Scenario {
    pub(super) fn paper_value(&self, x: &RawPaper) -> Result<PaperValue, ScenarioError> {
        let whole = x.whole_run.unwrap_or(false);
        let what = match whole {
            true => format!("paper ({}, whole run)", x.figure),
            false => format!("paper ({}, phase {})", x.figure, x.phase),
        };
        if x.figure.trim().is_empty() {
            return Err(invalid(
                "paper: figure must name the paper's figure or table",
            ));
        }
        let nphases = self.phases().len();
        if whole && x.phase != 0 {
            return Err(invalid(format!(
                "{what}: give either phase or whole_run = true, not both"
            )));
        }
        if !whole && (x.phase == 0 || x.phase > nphases) {
            return Err(invalid(format!(
                "{what}: phase must be 1..={nphases} (the scenario has {nphases} phases), or \
                 whole_run = true"
            )));
        }
        let kinds = [x.vm.is_some(), x.aggregate, x.ratio, x.unfairness];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(invalid(format!(
                "{what}: give exactly one of vm, aggregate = true, ratio = true, unfairness = true"
            )));
        }
        if x.vms.is_some() && !x.ratio {
            return Err(invalid(format!("{what}: vms goes with ratio = true")));
        }
        let quantity = if let Some(n) = &x.vm {
            PaperQuantity::Vm(self.vm_index(n, &what)?)
        } else if x.aggregate {
            PaperQuantity::Aggregate
        } else if x.ratio {
            let vms = x
                .vms
                .iter()
                .flatten()
                .map(|n| self.vm_index(n, &what))
                .collect::<Result<_, _>>()?;
            PaperQuantity::Ratio(vms)
        } else {
            PaperQuantity::Unfairness
        };
        let is_rate = matches!(quantity, PaperQuantity::Vm(_) | PaperQuantity::Aggregate);
        let value = if is_rate {
            if x.value.is_some() {
                return Err(invalid(format!("{what}: a rate takes mbit, not value")));
            }
            x.mbit.map(|m| m * 1e6)
        } else {
            if x.mbit.is_some() {
                return Err(invalid(format!(
                    "{what}: mbit is for a vm or the aggregate; a ratio or unfairness takes value"
                )));
            }
            x.value
        };
        if let Some(v) = value {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(format!(
                    "{what}: the number must be finite and ≥ 0"
                )));
            }
        } else if x.note.trim().is_empty() {
            return Err(invalid(format!(
                "{what}: give the paper's number (mbit or value) or its words (note)"
            )));
        }
        Ok(PaperValue {
            figure: x.figure.clone(),
            phase: x.phase,
            quantity,
            value,
            note: x.note.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name = \"t\"\nduration = \"20s\"\ncapacity = \"940Mbit\"\n\
        [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n";

    fn parse(paper: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(&format!("{BASE}[[paper]]\n{paper}"))
    }

    #[test]
    fn rates_ratios_and_words_are_carried() {
        let s = parse("figure = \"F 4\"\nphase = 2\nvm = \"vm2\"\nmbit = 8.63\n").unwrap();
        assert_eq!(s.paper.len(), 1);
        let p = &s.paper[0];
        assert_eq!(p.quantity, PaperQuantity::Vm(1));
        assert_eq!(p.value, Some(8.63e6));
        assert_eq!(p.cell(), "8.63");
        let s = parse(
            "figure = \"F 5\"\nphase = 2\nratio = true\nvms = [\"vm2\", \"vm1\"]\nvalue = 2.66\n\
             note = \"249 vs 662\"\n",
        )
        .unwrap();
        assert_eq!(s.paper[0].quantity, PaperQuantity::Ratio(vec![1, 0]));
        assert_eq!(s.paper[0].cell(), "2.66 (249 vs 662)");
        let s = parse("figure = \"F\"\nphase = 1\nunfairness = true\nvalue = 0.81\n").unwrap();
        assert_eq!(s.paper[0].cell(), "81 %");
        let s =
            parse("figure = \"F\"\nphase = 1\naggregate = true\nnote = \"link full\"\n").unwrap();
        assert_eq!(s.paper[0].value, None);
        assert_eq!(s.paper[0].cell(), "link full");
    }

    #[test]
    fn a_whole_run_number_is_phase_zero_and_asks_for_the_whole_run() {
        let s =
            parse("figure = \"F\"\nwhole_run = true\nunfairness = true\nvalue = 0.64\n").unwrap();
        assert_eq!(s.paper[0].phase, 0);
        assert!(s.wants_whole_run());
        let s = parse("figure = \"F\"\nphase = 1\nunfairness = true\nvalue = 0.64\n").unwrap();
        assert!(!s.wants_whole_run());
        for (paper, needle) in [
            (
                "figure = \"F\"\nphase = 1\nwhole_run = true\nvm = \"vm1\"\nmbit = 1\n",
                "not both",
            ),
            (
                "figure = \"F\"\nwhole_run = false\nvm = \"vm1\"\nmbit = 1\n",
                "or whole_run = true",
            ),
        ] {
            let e = parse(paper).unwrap_err().to_string();
            assert!(e.contains(needle), "{paper}: {e}");
        }
    }

    #[test]
    fn the_simulation_ignores_it() {
        let with = parse("figure = \"F\"\nphase = 1\nvm = \"vm1\"\nmbit = 1\n").unwrap();
        let mut without = Scenario::parse(BASE).unwrap();
        assert!(without.paper.is_empty());
        without.paper = with.paper.clone();
        assert_eq!(with, without);
    }

    #[test]
    fn refuses_what_cannot_be_meant() {
        for (paper, needle) in [
            (
                "figure = \"F\"\nphase = 3\nvm = \"vm1\"\nmbit = 1\n",
                "phase must be 1..=2",
            ),
            (
                "figure = \"F\"\nphase = 1\nvm = \"vm9\"\nmbit = 1\n",
                "unknown vm 'vm9'",
            ),
            ("figure = \"F\"\nphase = 1\nmbit = 1\n", "exactly one of"),
            (
                "figure = \"F\"\nphase = 1\nvm = \"vm1\"\naggregate = true\nmbit = 1\n",
                "exactly one of",
            ),
            (
                "figure = \"F\"\nphase = 1\nvm = \"vm1\"\nvalue = 1\n",
                "takes mbit",
            ),
            (
                "figure = \"F\"\nphase = 1\nratio = true\nmbit = 1\n",
                "takes value",
            ),
            ("figure = \"F\"\nphase = 1\nvm = \"vm1\"\n", "or its words"),
            (
                "figure = \"F\"\nphase = 1\nvm = \"vm1\"\nmbit = -1\n",
                "finite",
            ),
            (
                "figure = \"F\"\nphase = 1\nvm = \"vm1\"\nvms = [\"vm1\"]\nmbit = 1\n",
                "vms goes",
            ),
            (
                "figure = \" \"\nphase = 1\nvm = \"vm1\"\nmbit = 1\n",
                "figure must",
            ),
            (
                "figure = \"F\"\nphase = 1\nvm = \"vm1\"\nmbits = 1\n",
                "mbits",
            ),
        ] {
            let e = parse(paper).unwrap_err().to_string();
            assert!(e.contains(needle), "{paper}: {e}");
        }
    }
}
