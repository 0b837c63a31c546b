//! The runs of a paper experiment's scenario file: a switch (baseline) and, under `vqos`, the
//! engine vqosd runs — the scenario's own, or another one the paper enforced with — and the
//! papers' algorithms as written where vqos departs from them.
//!
//! ## Behavior
//! - [`variants`] lists, for a file and the requested baselines, each baseline once in the
//!   order given and, right after `vqos`, the file's other runs under vqosd
//!   ([`vqos_variants`]): one per engine of [`ENGINE_VARIANTS`] for that file (vqosd *and* the
//!   simulator's prediction then use that engine instead of the scenario's,
//!   [`crate::LabOptions::engine`]), then, for the files of [`PAPER_ALGORITHM_FILES`], one
//!   with `variant = "paper"` ([`crate::LabOptions::algorithms`]), so the summary can set them
//!   side by side.
//! - The fairness paper enforced its adjuster's limits with Xen's vif credit limiter
//!   (rate@window), our `policer` engine; its scenarios name `vqos`, so the controlled
//!   fairness files also run under `policer`. Their uncontrolled twins have no controller and
//!   no limits, so the engine changes nothing there and they are not repeated.
//! - The paper-algorithm runs measure vqos's departures from the papers
//!   ([`vqos_sched::variant`]): the ANCS, controlled fairness and PID-ECN files where a
//!   departure acts on what the file measures.
//! - [`Variant::suffix`] names the run's directory and plot: `<file>` for the scenario's
//!   engine under `vqos`, `<file>-<engine>` for another engine, `<file>-paper` for the papers'
//!   algorithms, `<file>-<baseline>` for a kernel baseline (engine, `paper` and baseline names
//!   do not collide: checked by a test).
//!
//! ## Limitations
//! - The kernel baselines have no engine: an engine or algorithm variant exists only under
//!   `vqos`.

use vqos_sched::{EngineKind, Variant as Algorithms};
use vqos_sim::Scenario;

use crate::topo::Baseline;

/// Engines a scenario file also runs under (beside its own), by file name.
pub const ENGINE_VARIANTS: &[(&str, &[EngineKind])] = &[
    ("fairness-static.toml", &[EngineKind::Policer]),
    ("fairness-fluctuating.toml", &[EngineKind::Policer]),
    ("fairness-path.toml", &[EngineKind::Policer]),
];

/// Files that also run with the papers' algorithms as written (`variant = "paper"`): those
/// where a departure of ours acts (ANCS's CreditLeft, Algorithm 1, PID-ECN's marking of what a
/// VM sends) and that are not already the paper-literal case in the simulator alone.
pub const PAPER_ALGORITHM_FILES: &[&str] = &[
    "ancs-fig5.toml",
    "fairness-static.toml",
    "fairness-fluctuating.toml",
    "fairness-path.toml",
    "pid-ecn-mixed.toml",
    "pid-ecn-upload-download.toml",
];

/// One run of a scenario file: the switch and, under `vqos`, an engine or algorithm change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The switch.
    pub baseline: Baseline,
    /// vqosd's engine instead of the scenario's (`None`: the scenario's); only under `vqos`.
    pub engine: Option<EngineKind>,
    /// The papers' algorithms as written ([`Algorithms::Paper`]) or the scenario's own
    /// choice ([`Algorithms::Vqos`]: the file's `variant`, vqos's departures by default).
    pub algorithms: Algorithms,
}

impl Variant {
    /// The baseline with the scenario's engine.
    pub fn plain(baseline: Baseline) -> Variant {
        Variant {
            baseline,
            engine: None,
            algorithms: Algorithms::Vqos,
        }
    }

    /// What follows the file's stem in the run's directory and plot names: empty, `-<engine>`,
    /// `-paper` or `-<baseline>`.
    pub fn suffix(&self) -> String {
        match (self.baseline, self.engine) {
            (Baseline::Vqos, e) => {
                let engine = e.map_or(String::new(), |e| format!("-{e}"));
                let paper = if self.algorithms.is_paper() {
                    "-paper"
                } else {
                    ""
                };
                format!("{engine}{paper}")
            }
            (b, _) => format!("-{b}"),
        }
    }

    /// How summaries name the run: `vqos`, `vqos, engine policer`, `vqos, the papers'
    /// algorithms`, `htb`.
    pub fn label(&self) -> String {
        match (self.baseline, self.engine, self.algorithms) {
            (Baseline::Vqos, Some(e), _) => format!("vqos, engine {e}"),
            (Baseline::Vqos, None, Algorithms::Paper) => "vqos, the papers' algorithms".into(),
            (b, _, _) => b.to_string(),
        }
    }

    /// `sc` as this variant runs it: its engine and algorithms replaced where it changes them.
    pub fn apply(&self, sc: &mut Scenario) {
        if let Some(e) = self.engine {
            sc.engine = e;
        }
        if self.algorithms.is_paper() {
            sc.variant = Algorithms::Paper;
        }
    }
}

/// The engines `file` (a scenario file's name, `fairness-static.toml`) also runs under.
pub fn engine_variants(file: &str) -> &'static [EngineKind] {
    ENGINE_VARIANTS
        .iter()
        .find(|(f, _)| *f == file)
        .map_or(&[], |(_, e)| e)
}

/// The runs of `file` under vqosd: the scenario as written, each engine variant, then the
/// papers' algorithms where [`PAPER_ALGORITHM_FILES`] lists the file.
pub fn vqos_variants(file: &str) -> Vec<Variant> {
    let mut out = vec![Variant::plain(Baseline::Vqos)];
    out.extend(engine_variants(file).iter().map(|&e| Variant {
        engine: Some(e),
        ..Variant::plain(Baseline::Vqos)
    }));
    if PAPER_ALGORITHM_FILES.contains(&file) {
        out.push(Variant {
            algorithms: Algorithms::Paper,
            ..Variant::plain(Baseline::Vqos)
        });
    }
    out
}

/// The runs of `file` under `baselines`: each baseline in order, the vqos variants right
/// after `vqos`.
pub fn variants(file: &str, baselines: &[Baseline]) -> Vec<Variant> {
    let mut out = Vec::new();
    for &b in baselines {
        match b {
            Baseline::Vqos => out.extend(vqos_variants(file)),
            _ => out.push(Variant::plain(b)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use vqos_sim::Scenario;

    #[test]
    fn the_controlled_fairness_files_also_run_under_the_policer() {
        for f in [
            "fairness-static.toml",
            "fairness-fluctuating.toml",
            "fairness-path.toml",
        ] {
            let v = variants(f, &[Baseline::Vqos]);
            let policer = Variant {
                engine: Some(EngineKind::Policer),
                ..Variant::plain(Baseline::Vqos)
            };
            let paper = Variant {
                algorithms: Algorithms::Paper,
                ..Variant::plain(Baseline::Vqos)
            };
            assert_eq!(v, [Variant::plain(Baseline::Vqos), policer, paper], "{f}");
            assert_eq!(v[1].suffix(), "-policer");
            assert_eq!(v[1].label(), "vqos, engine policer");
            assert_eq!(v[2].suffix(), "-paper");
            assert_eq!(v[2].label(), "vqos, the papers' algorithms");
        }
        // No controller, no limits: the engine would change nothing.
        let v = variants("fairness-static-uncontrolled.toml", &[Baseline::Vqos]);
        assert_eq!(v, [Variant::plain(Baseline::Vqos)]);
    }

    #[test]
    fn engine_variants_follow_vqos_and_never_a_kernel_baseline() {
        let v = variants("fairness-static.toml", &[Baseline::Htb, Baseline::Vqos]);
        let names: Vec<String> = v.iter().map(Variant::label).collect();
        assert_eq!(
            names,
            [
                "htb",
                "vqos",
                "vqos, engine policer",
                "vqos, the papers' algorithms"
            ]
        );
        assert!(variants("fairness-static.toml", &[Baseline::Bridge])
            .iter()
            .all(|v| v.engine.is_none() && !v.algorithms.is_paper()));
        assert_eq!(Variant::plain(Baseline::Htb).suffix(), "-htb");
        assert_eq!(Variant::plain(Baseline::Vqos).suffix(), "");
    }

    #[test]
    fn suffixes_of_engines_and_baselines_never_collide() {
        let baselines: Vec<Baseline> = ["vqos", "bridge", "htb", "tbf", "ovs"]
            .iter()
            .map(|b| b.parse().unwrap())
            .collect();
        let mut seen = std::collections::HashSet::new();
        for &b in &baselines {
            assert!(seen.insert(Variant::plain(b).suffix()), "{b}");
        }
        for e in EngineKind::ALL {
            let v = Variant {
                engine: Some(e),
                ..Variant::plain(Baseline::Vqos)
            };
            assert!(seen.insert(v.suffix()), "{e}");
        }
        let paper = Variant {
            algorithms: Algorithms::Paper,
            ..Variant::plain(Baseline::Vqos)
        };
        assert!(seen.insert(paper.suffix()), "paper");
    }

    #[test]
    fn a_variant_engine_differs_from_its_files_own() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        for (f, engines) in ENGINE_VARIANTS {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            let sc = Scenario::parse(&text).unwrap();
            assert!(
                !engines.contains(&sc.engine),
                "{f} already runs {}",
                sc.engine
            );
            assert!(
                crate::PAPERS.iter().any(|(_, files)| files.contains(f)),
                "{f} is no experiment's file"
            );
        }
    }

    #[test]
    fn the_paper_algorithm_files_are_experiment_files_written_for_vqos_departures() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        for f in PAPER_ALGORITHM_FILES {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            let mut sc = Scenario::parse(&text).unwrap();
            // Not already paper-literal: the variant run would repeat the file's own.
            assert_eq!(sc.variant, Algorithms::Vqos, "{f}");
            let v = Variant {
                algorithms: Algorithms::Paper,
                ..Variant::plain(Baseline::Vqos)
            };
            v.apply(&mut sc);
            assert_eq!(sc.policies_at(0).variant, Algorithms::Paper, "{f}");
            assert!(
                crate::PAPERS.iter().any(|(_, files)| files.contains(f)),
                "{f} is no experiment's file"
            );
        }
    }

    /// What the `policer` variant relies on: vqosd turns an adjuster's limit into the vif's
    /// maximum in the policy set it installs (`effective_policy`), and the `policer` engine
    /// the switch builds from that set gives the vif one window's credit of it: Xen's
    /// rate@window, 40 Mbit/s @ 50 ms = 250 000 bytes. A vif without a limit stays unlimited.
    #[test]
    fn a_controller_limit_becomes_the_policers_credit_per_window() {
        use vqos_sched::{PolicySet, VifPolicy};
        let user = VifPolicy::default();
        let limited = vqosd::api::effective_policy(&user, Some(40_000_000));
        assert_eq!(limited.max_bps, Some(40_000_000));
        let set = PolicySet::new(Some(940_000_000))
            .with_vif("vm1", limited)
            .with_vif("vm2", vqosd::api::effective_policy(&user, None));
        let e = vqos_sched::build(EngineKind::Policer, &set, 0).unwrap();
        assert_eq!(e.vif_state(0).credit_per_period, 250_000);
        assert_eq!(e.vif_state(1).credit_per_period, 0);
        assert!(!e.vif_state(1).throttled);
    }
}
