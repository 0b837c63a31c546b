//! The runs of a paper experiment's scenario file: a switch (baseline) and, under `vqos`, the
//! engine vqosd runs — the scenario's own, or another one the paper enforced with.
//!
//! ## Behavior
//! - [`variants`] lists, for a file and the requested baselines, each baseline once in the
//!   order given and, right after `vqos`, one run per engine of [`ENGINE_VARIANTS`] for that
//!   file: vqosd *and* the simulator's prediction then use that engine instead of the
//!   scenario's ([`crate::LabOptions::engine`]), so the summary can set them side by side.
//! - The fairness paper enforced its adjuster's limits with Xen's vif credit limiter
//!   (rate@window), our `policer` engine; its scenarios name `vqos`, so the controlled
//!   fairness files also run under `policer`. Their uncontrolled twins have no controller and
//!   no limits, so the engine changes nothing there and they are not repeated.
//! - [`Variant::suffix`] names the run's directory and plot: `<file>` for the scenario's
//!   engine under `vqos`, `<file>-<engine>` for another engine, `<file>-<baseline>` for a
//!   kernel baseline (engine and baseline names do not collide: checked by a test).
//!
//! ## Limitations
//! - The kernel baselines have no engine: an engine variant exists only under `vqos`.

use vqos_sched::EngineKind;

use crate::topo::Baseline;

/// Engines a scenario file also runs under (beside its own), by file name.
pub const ENGINE_VARIANTS: &[(&str, &[EngineKind])] = &[
    ("fairness-static.toml", &[EngineKind::Policer]),
    ("fairness-fluctuating.toml", &[EngineKind::Policer]),
];

/// One run of a scenario file: the switch and, under `vqos`, an engine override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The switch.
    pub baseline: Baseline,
    /// vqosd's engine instead of the scenario's (`None`: the scenario's); only under `vqos`.
    pub engine: Option<EngineKind>,
}

impl Variant {
    /// The baseline with the scenario's engine.
    pub fn plain(baseline: Baseline) -> Variant {
        Variant {
            baseline,
            engine: None,
        }
    }

    /// What follows the file's stem in the run's directory and plot names: empty, `-<engine>`
    /// or `-<baseline>`.
    pub fn suffix(&self) -> String {
        match (self.baseline, self.engine) {
            (Baseline::Vqos, None) => String::new(),
            (Baseline::Vqos, Some(e)) => format!("-{e}"),
            (b, _) => format!("-{b}"),
        }
    }

    /// How summaries name the run: `vqos`, `vqos, engine policer`, `htb`.
    pub fn label(&self) -> String {
        match (self.baseline, self.engine) {
            (Baseline::Vqos, Some(e)) => format!("vqos, engine {e}"),
            (b, _) => b.to_string(),
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

/// The runs of `file` under `baselines`: each baseline in order, the engine variants right
/// after `vqos`.
pub fn variants(file: &str, baselines: &[Baseline]) -> Vec<Variant> {
    let mut out = Vec::new();
    for &b in baselines {
        out.push(Variant::plain(b));
        if b == Baseline::Vqos {
            out.extend(engine_variants(file).iter().map(|&e| Variant {
                baseline: b,
                engine: Some(e),
            }));
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
        for f in ["fairness-static.toml", "fairness-fluctuating.toml"] {
            let v = variants(f, &[Baseline::Vqos]);
            assert_eq!(
                v,
                [
                    Variant::plain(Baseline::Vqos),
                    Variant {
                        baseline: Baseline::Vqos,
                        engine: Some(EngineKind::Policer)
                    }
                ],
                "{f}"
            );
            assert_eq!(v[1].suffix(), "-policer");
            assert_eq!(v[1].label(), "vqos, engine policer");
        }
        // No controller, no limits: the engine would change nothing.
        let v = variants("fairness-static-uncontrolled.toml", &[Baseline::Vqos]);
        assert_eq!(v, [Variant::plain(Baseline::Vqos)]);
    }

    #[test]
    fn engine_variants_follow_vqos_and_never_a_kernel_baseline() {
        let v = variants("fairness-static.toml", &[Baseline::Htb, Baseline::Vqos]);
        let names: Vec<String> = v.iter().map(Variant::label).collect();
        assert_eq!(names, ["htb", "vqos", "vqos, engine policer"]);
        assert!(variants("fairness-static.toml", &[Baseline::Bridge])
            .iter()
            .all(|v| v.engine.is_none()));
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
                baseline: Baseline::Vqos,
                engine: Some(e),
            };
            assert!(seen.insert(v.suffix()), "{e}");
        }
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
