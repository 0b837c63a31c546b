#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/, see docs/reliability.md) for SECONDS each (default 60),
# one at a time on one core, from the committed seeds (fuzz/seeds/TARGET) plus the local
# corpus (fuzz/corpus/TARGET, not committed). Installs cargo-fuzz and the nightly toolchain if
# missing. Prints executions per target; a crash leaves its input in fuzz/artifacts/TARGET/
# and makes the script fail after the other targets ran.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (FUZZ_SEED=N: a fixed libFuzzer seed, as in CI)
# FUZZ_RUNS_FILE=FILE (CI: fuzz/ci-runs.txt, lines "TARGET EXECUTIONS"): each target runs that
# many executions instead of SECONDS, so that with FUZZ_SEED the inputs tried do not depend on
# the machine's speed (SECONDS × 4 still bounds the time; a run cut short tries a prefix).
# The local corpus is left out then: new inputs go to a scratch directory, so every checkout
# tries the same inputs.
set -euo pipefail
runs_file=${FUZZ_RUNS_FILE:+$(realpath "$FUZZ_RUNS_FILE")}
cd "$(dirname "$0")/../fuzz"

secs=${1:-60}
shift || true
export PATH="$HOME/.cargo/bin:$PATH"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

targets=("$@")
((${#targets[@]})) || mapfile -t targets < <(cargo +nightly fuzz list)

# -a: debug assertions, so arithmetic overflow panics too.
cargo +nightly fuzz build -a
failed=()
summary=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "seeds/$t"
  log=$(mktemp)
  rc=0
  # FUZZ_SEED (CI sets it): libFuzzer's random seed, so that a run explores a fixed sequence
  # of inputs (how far it gets depends on the machine's speed, unless FUZZ_RUNS_FILE is set).
  seed_arg=()
  [[ -z ${FUZZ_SEED:-} ]] || seed_arg=(-seed="$FUZZ_SEED")
  limit=(-max_total_time="$secs")
  corpus="corpus/$t"
  if [[ -n $runs_file ]]; then
    corpus=$(mktemp -d)
    n=$(awk -v t="$t" '$1 == t { print $2 }' "$runs_file")
    [[ $n =~ ^[0-9]+$ ]] || { echo "fuzz.sh: no execution count for $t in $runs_file" >&2; exit 2; }
    limit=(-runs="$n" -max_total_time=$((secs * 4)))
  fi
  cargo +nightly fuzz run -a "$t" "$corpus" "seeds/$t" -- "${seed_arg[@]}" \
    "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if ((rc == 0)); then
    summary+=("$(printf '%-16s %12s executions  ok' "$t" "${execs:-?}")")
  else
    failed+=("$t")
    summary+=("$(printf '%-16s %12s executions  CRASH (exit %d)' "$t" "${execs:-?}" "$rc")")
    grep -m1 -A12 -E "panicked|ERROR: libFuzzer|SUMMARY" "$log" || tail -20 "$log"
    ls -t "artifacts/$t" 2>/dev/null | head -3 | sed "s|^|  reproducer: fuzz/artifacts/$t/|"
  fi
  rm -f "$log"
  [[ $corpus == "corpus/$t" ]] || rm -rf "$corpus"
done
if [[ -n $runs_file ]]; then
  printf '\nfuzz: executions per target from %s\n' "$runs_file"
else
  printf '\nfuzz: %ss per target\n' "$secs"
fi
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: crashes in: ${failed[*]} (reproduce: cd fuzz && cargo +nightly fuzz run -a TARGET ARTIFACT)"
  exit 1
fi
