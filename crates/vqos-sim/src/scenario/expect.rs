//! `[[expect]]`: what a scenario states must hold, checked by the report.

use super::raw::RawExpect;
use super::{invalid, Scenario, ScenarioError};

/// A check the report evaluates.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// The VM's mean is within this percentage of the reference allocation.
    NearReference(f64),
    /// The aggregate is at least this fraction of the tightest link.
    AggregateAtLeast(f64),
    /// The VM keeps at least this fraction of its rate in phase `of_phase`.
    KeepsAtLeast(f64, usize),
    /// The VM loses at least this fraction of its rate in phase `of_phase`.
    LosesAtLeast(f64, usize),
    /// The VM gets at least this fraction of its max (what its tenant bought) in the phase.
    MaxAtLeast(f64),
    /// Unfairness index at most this.
    UnfairnessAtMost(f64),
    /// Unfairness index at least this.
    UnfairnessAtLeast(f64),
    /// Ratio of the largest to the smallest rate among `vms` (or all active) at most this.
    RatioAtMost(f64),
    /// The same ratio at least this.
    RatioAtLeast(f64),
}

/// An expectation of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    /// Phase number, 1-based; 0 for a whole-run expectation (`whole_run = true`: the means
    /// over the whole run after the first settle, as a paper gives its whole-run figures).
    pub phase: usize,
    /// The VM it is about (for per-VM checks).
    pub vm: Option<usize>,
    /// VMs a ratio is taken over (empty = all active).
    pub vms: Vec<usize>,
    /// The ratio is directional (`ordered = true`): the first of `vms` over the second, not
    /// the largest over the smallest, so a check that one VM gets more fails when the other
    /// does.
    pub ordered: bool,
    /// The check.
    pub check: Check,
    /// Checked only on real traffic (`lab_only = true`): it is about something the simulator
    /// does not model (a VM's CPU), so the simulator's report leaves it out and warns.
    pub lab_only: bool,
    /// The id of the paper's claim it checks (`claim = "id"`, a key of the file's `[claims]`);
    /// `None`: a check of ours, not a claim of the paper (verdict tables leave it out).
    pub claim: Option<String>,
}

impl Expectation {
    /// Where it applies, as reports say it: "whole run" or "phase N".
    pub fn phase_label(&self) -> String {
        phase_label(self.phase)
    }
}

/// "whole run" for phase 0 (whole-run expectations), "phase N" otherwise.
pub fn phase_label(phase: usize) -> String {
    match phase {
        0 => "whole run".to_string(),
        n => format!("phase {n}"),
    }
}

impl Scenario {
    /// The text of claim `id` of `[claims]`.
    pub fn claim_text(&self, id: &str) -> Option<&str> {
        self.claims.get(id).map(String::as_str)
    }

    /// Every claim of `[claims]` is checked by an `[[expect]]` or a `[[probe]]` (`claim =
    /// "id"`; a probe's is validated by the lab, which runs probes): a claim nothing checks
    /// would read as checked in a verdict table.
    pub(super) fn check_claims_used(&self, probe_claims: &[String]) -> Result<(), ScenarioError> {
        for (id, text) in &self.claims {
            if id.is_empty() || text.trim().is_empty() {
                return Err(invalid("claims: an id and its claim must not be empty"));
            }
            let by_expect = self
                .expectations
                .iter()
                .any(|x| x.claim.as_deref() == Some(id));
            let by_probe = probe_claims.contains(id);
            if !(by_expect || by_probe) {
                return Err(invalid(format!(
                    "claims: `{id}` is checked by no [[expect]] or [[probe]] (claim = \"{id}\")"
                )));
            }
        }
        Ok(())
    }

    /// The span a whole-run figure covers, `(from, to)` in ns: from the first settle (at most
    /// half the run) to the end, as a paper averages a whole run after its start-up.
    pub fn whole_run_span(&self) -> (u64, u64) {
        (self.settle_ns.min(self.duration_ns / 2), self.duration_ns)
    }

    /// VM `i`'s active time within [`Scenario::whole_run_span`], if any.
    pub fn whole_run_active(&self, i: usize) -> Option<(u64, u64)> {
        let (from, to) = self.whole_run_span();
        let vm = &self.vms[i];
        let (start, stop) = (vm.start_ns.max(from), vm.stop_ns.min(to));
        (start < stop).then_some((start, stop))
    }

    /// Whether an expectation or a `[[paper]]` number is about the whole run (phase 0): reports
    /// then carry the whole run as one more phase.
    pub fn wants_whole_run(&self) -> bool {
        self.expectations.iter().any(|x| x.phase == 0) || self.paper.iter().any(|p| p.phase == 0)
    }

    pub(super) fn vm_index(&self, name: &str, what: &str) -> Result<usize, ScenarioError> {
        self.vms
            .iter()
            .position(|v| v.name == name)
            .ok_or_else(|| invalid(format!("{what}: unknown vm '{name}'")))
    }

    pub(super) fn expectation(&self, x: &RawExpect) -> Result<Expectation, ScenarioError> {
        let whole = x.whole_run.unwrap_or(false);
        // Not `phase_label`: a phase of 0 without whole_run is an error, named as written.
        let what = match whole {
            true => "expect (whole run)".to_string(),
            false => format!("expect (phase {})", x.phase),
        };
        let nphases = self.phases().len();
        if whole && x.phase != 0 {
            return Err(invalid(format!(
                "{what}: give either phase or whole_run = true, not both"
            )));
        }
        if !whole && (x.phase == 0 || x.phase > nphases) {
            return Err(invalid(format!(
                "{what}: phase must be 1..={nphases} (the scenario has {nphases} phases)"
            )));
        }
        let mut checks = Vec::new();
        let of = x.of_phase.unwrap_or(1);
        if of == 0 || of > nphases {
            return Err(invalid(format!("{what}: of_phase must be 1..={nphases}")));
        }
        if let Some(v) = x.near_reference_pct {
            checks.push((Check::NearReference(v), true));
        }
        if let Some(v) = x.aggregate_at_least {
            checks.push((Check::AggregateAtLeast(v), false));
        }
        if let Some(v) = x.keeps_at_least {
            checks.push((Check::KeepsAtLeast(v, of), true));
        }
        if let Some(v) = x.loses_at_least {
            checks.push((Check::LosesAtLeast(v, of), true));
        }
        if let Some(v) = x.max_at_least {
            checks.push((Check::MaxAtLeast(v), true));
        }
        if let Some(v) = x.unfairness_at_most {
            checks.push((Check::UnfairnessAtMost(v), false));
        }
        if let Some(v) = x.unfairness_at_least {
            checks.push((Check::UnfairnessAtLeast(v), false));
        }
        if let Some(v) = x.ratio_at_most {
            checks.push((Check::RatioAtMost(v), false));
        }
        if let Some(v) = x.ratio_at_least {
            checks.push((Check::RatioAtLeast(v), false));
        }
        if checks.len() != 1 {
            return Err(invalid(format!(
                "{what}: give exactly one check (near_reference_pct, aggregate_at_least, keeps_at_least, loses_at_least, max_at_least, unfairness_at_most, unfairness_at_least, ratio_at_most, ratio_at_least)"
            )));
        }
        let (check, needs_vm) = checks.remove(0);
        let over_vms = matches!(
            check,
            Check::UnfairnessAtMost(_)
                | Check::UnfairnessAtLeast(_)
                | Check::RatioAtMost(_)
                | Check::RatioAtLeast(_)
        );
        if whole && !over_vms {
            return Err(invalid(format!(
                "{what}: a whole-run expectation takes unfairness_at_most, unfairness_at_least, \
                 ratio_at_most or ratio_at_least"
            )));
        }
        let vm = match &x.vm {
            Some(n) => Some(self.vm_index(n, &what)?),
            None if needs_vm => return Err(invalid(format!("{what}: this check needs a vm"))),
            None => None,
        };
        let vms: Vec<usize> = x
            .vms
            .iter()
            .flatten()
            .map(|n| self.vm_index(n, &what))
            .collect::<Result<_, _>>()?;
        let ordered = x.ordered.unwrap_or(false);
        if ordered && !matches!(check, Check::RatioAtMost(_) | Check::RatioAtLeast(_)) {
            return Err(invalid(format!(
                "{what}: ordered = true goes with ratio_at_most or ratio_at_least"
            )));
        }
        if ordered && vms.len() != 2 {
            return Err(invalid(format!(
                "{what}: ordered = true takes two vms, the first over the second (got {})",
                vms.len()
            )));
        }
        if let Some(c) = &x.claim {
            self.claim_text(c)
                .ok_or_else(|| invalid(format!("{what}: claim `{c}` is not a key of [claims]")))?;
        }
        Ok(Expectation {
            phase: x.phase,
            vm,
            vms,
            ordered,
            check,
            lab_only: x.lab_only.unwrap_or(false),
            claim: x.claim.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::Scenario;

    const HEAD: &str = "name = \"c\"\nduration = \"10s\"\ncapacity = \"100Mbit\"\n\
                        [[vm]]\nname = \"vm1\"\n";

    fn parse(rest: &str) -> Result<Scenario, String> {
        Scenario::parse(&format!("{HEAD}{rest}")).map_err(|e| e.to_string())
    }

    #[test]
    fn an_expectation_names_a_claim_of_the_file() {
        let s = parse(
            "[claims]\nshare = \"Fig. 1: the link\"\n\
             [[expect]]\nclaim = \"share\"\nphase = 1\nvm = \"vm1\"\nnear_reference_pct = 3\n\
             [[expect]]\nphase = 1\naggregate_at_least = 0.9\n",
        )
        .unwrap();
        assert_eq!(s.expectations[0].claim.as_deref(), Some("share"));
        assert_eq!(s.expectations[1].claim, None);
        assert_eq!(s.claim_text("share"), Some("Fig. 1: the link"));
    }

    #[test]
    fn a_claim_that_is_not_defined_or_not_checked_is_refused() {
        let e = parse("[[expect]]\nclaim = \"nope\"\nphase = 1\naggregate_at_least = 0.9\n")
            .unwrap_err();
        assert!(e.contains("claim `nope` is not a key of [claims]"), "{e}");
        let e =
            parse("[claims]\nlost = \"Fig. 9\"\n[[expect]]\nphase = 1\naggregate_at_least = 0.9\n")
                .unwrap_err();
        assert!(
            e.contains("`lost` is checked by no [[expect]] or [[probe]]"),
            "{e}"
        );
        let e = parse("[claims]\nempty = \" \"\n[[expect]]\nclaim = \"empty\"\nphase = 1\naggregate_at_least = 0.9\n")
            .unwrap_err();
        assert!(e.contains("must not be empty"), "{e}");
        // A claim only a lab probe checks is accepted here (the lab validates the probe).
        parse("[claims]\nlat = \"Fig. 6(e)\"\n[[probe]]\nvm = \"vm1\"\nclaim = \"lat\"\n").unwrap();
    }
}
