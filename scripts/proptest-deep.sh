#!/usr/bin/env bash
# Explores new property-test cases: CI runs a fixed seed and case count (see
# crates/vqos-sched/src/proptest_config.rs); this runs every property test with a random seed
# (or SEED) and many cases (CASES, default 2000 per test).
#   scripts/proptest-deep.sh [CASES] [SEED]
# A failure is shrunk and saved by proptest in the committed regression files, which every
# later run (CI included) replays first. Commit them, with the fix or the documented narrowing.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=${1:-2000}
seed=${2:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}
echo "proptest-deep: PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed"
# The regression files before the run, to tell which ones this run added to.
snapshot() { find crates -path '*proptest-regressions*' -type f -exec md5sum {} + 2>/dev/null | sort; }
before=$(snapshot)
rc=0
# Every crate with property tests (grep -rl 'proptest!' crates): the engines' and the cluster
# split's.
PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed \
  cargo test -p vqos-sched --lib --test properties -- --test-threads 1 || rc=$?
PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed \
  cargo test -p vqos-cluster --lib split:: -- --test-threads 1 || rc=$?
after=$(snapshot)
if [[ $before != "$after" ]]; then
  echo
  echo "proptest-deep: new failing cases were saved in:"
  diff <(echo "$before") <(echo "$after") | sed -n 's/^> [0-9a-f]*  /  /p'
  echo "Commit them (CI replays them first on every run), with the fix or a documented narrowing:"
  echo "  git add crates/*/proptest-regressions crates/*/tests/*.proptest-regressions"
fi
if ((rc != 0)); then
  echo "proptest-deep: FAILED with seed $seed (rerun: scripts/proptest-deep.sh $cases $seed)"
  exit "$rc"
fi
echo "proptest-deep: ok ($cases cases per test, seed $seed)"
