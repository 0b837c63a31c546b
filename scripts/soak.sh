#!/usr/bin/env bash
# Soak test of the real switch (crates/vqosd/tests/soak.rs): 8 TAP ports under TCP and 64-byte
# UDP load while policies and ports churn every 100 ms; then exact frame conservation, flat
# memory and descriptors, every policy in force. As root.
#   scripts/soak.sh [MINUTES]     (default 10; CI runs it for 60 s inside ./scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
case $minutes in '' | *[!0-9]*) echo "usage: scripts/soak.sh [MINUTES]" >&2; exit 2 ;; esac
VQOS_SOAK_SECS=$((minutes * 60)) cargo test --release -p vqosd --test soak -- --nocapture
