//! The property tests' configuration (unit tests and `tests/properties.rs` share this file).
//!
//! CI runs the same cases every time: a fixed RNG seed and algorithm and a fixed case count per
//! test, so a property test fails only when the code changes, never because a run drew a new
//! case. Failures proptest finds are kept in the committed regression files next to the tests
//! (`proptest-regressions/`, `tests/*.proptest-regressions`) and replayed first on every run.
//! `scripts/proptest-deep.sh` explores new cases: it sets `PROPTEST_RNG_SEED` (random) and
//! `PROPTEST_CASES` (many), which override the fixed values here.

use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, RngSeed};

/// The committed seed CI runs.
pub const CI_SEED: u64 = 0x7651_05ee_d011_2026;

#[allow(dead_code)]
/// `cases` cases from [`CI_SEED`], unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise.
pub fn config(cases: u32) -> Config {
    let env = Config::default();
    let set = |var: &str| std::env::var_os(var).is_some();
    Config {
        cases: if set("PROPTEST_CASES") {
            env.cases
        } else {
            cases
        },
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: if set("PROPTEST_RNG_SEED") {
            env.rng_seed
        } else {
            RngSeed::Fixed(CI_SEED)
        },
        ..env
    }
}

/// [`config`] for an integration test: its failures are kept beside it, in
/// `tests/NAME.proptest-regressions` (the default looks for a `lib.rs` to mirror).
#[allow(dead_code)]
pub fn config_beside_source(cases: u32) -> Config {
    Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..config(cases)
    }
}
