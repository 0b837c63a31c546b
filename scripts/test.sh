#!/usr/bin/env bash
# The project's test command (README, second line; .ci/run runs it).
# Formatting, lints with warnings denied, docs, every test (the network-namespace tests run for
# real as root and skip with a message otherwise), the simulator's paper scenarios, and a
# smoke run of every benchmark (and the benchmark scripts' syntax and report parsing).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s ==\n' "$*"; }

step "system packages (scripts/deps.sh test: installed as root, named otherwise)"
scripts/deps.sh test
# rustfmt and clippy, where the toolchain came without them (rustup's minimal profile).
rustup component add rustfmt clippy >/dev/null 2>&1 || true

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test"
cargo test --workspace

step "paper scenarios in the simulator (expectations checked)"
cargo build --release --quiet -p vqos-cli
for f in scenarios/*.toml; do
  ./target/release/vqos sim "$f" --check >/dev/null || { echo "FAIL: $f"; ./target/release/vqos sim "$f"; exit 1; }
  echo "ok  $f"
done

step "systemd unit and install (systemd-analyze verify, staged install)"
scripts/verify-unit.sh

step "benchmark scripts (shell syntax; the aims report's parsing, doctests)"
for f in scripts/*.sh; do bash -n "$f"; done
python3 -m doctest scripts/aims_report.py
python3 -m doctest scripts/departures.py
python3 -m doctest scripts/cost-sweep.py
echo "ok"

step "benchmark smoke run (each benchmark once, no timing)"
cargo bench --workspace --benches -- --test >/dev/null
echo "ok"
