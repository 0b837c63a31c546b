#!/usr/bin/env bash
# Live migration's network downtime (issue 26's aim): a TCG QEMU guest pinging its peer at
# 100/s migrates between two vqosd vhost-user ports, beside the same guest migrating on QEMU's
# built-in user network (slirp) as the reference, alternating, ROUNDS pairs. The runs are
# crates/vqosd/tests/migration/bench.rs (an ignored test: it shares the migration test's rig).
#
# Per migration: QEMU's total time and the guest's pause (`query-migrate`), the guest's pings
# sent and answered, the longest run of unanswered ones and the longest round trip, and (on
# vhost-user) the sink's longest wait between two answers to its own 100/s pings of the guest,
# before the migration (TCG's own pace) and overall.
#
# Run as root:  scripts/bench-migration.sh [-r ROUNDS] [-o DIR]
#   -r  pairs of migrations (default 3)
#   -o  output directory (default lab-out/); writes bench-migration-DATE.csv and .log
# Needs qemu-system-x86_64, iperf3 and the guest image (scripts/guest-image.sh, built on first
# use); takes the real-traffic lock, so it never runs beside a test or another benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
OUT=lab-out
while getopts "r:o:h" o; do
    case $o in
    r) ROUNDS=$OPTARG ;;
    o) OUT=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
    esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench-migration: -r wants a positive number" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "bench-migration: run as root (QEMU, namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
log=$OUT/bench-migration-$stamp.log
csv=$OUT/bench-migration-$stamp.csv

VQOS_BENCH_ROUNDS=$ROUNDS cargo test --release -q -p vqosd --test migration \
    bench_migration_downtime -- --ignored --nocapture --test-threads 1 >"$log" 2>&1 || {
    echo "bench-migration: the runs failed; see $log" >&2
    tail -20 "$log" >&2
    exit 1
}
if grep -q "^SKIP" "$log"; then
    grep "^SKIP" "$log" >&2
    exit 2
fi
# DOWNTIME net=… round=… key=value… → CSV with the keys as the header.
grep '^DOWNTIME ' "$log" | sed 's/^DOWNTIME //' | awk '
    NR == 1 { for (i = 1; i <= NF; i++) { split($i, kv, "="); h = h (i > 1 ? "," : "") kv[1] }
              print h }
    { r = ""; for (i = 1; i <= NF; i++) { split($i, kv, "="); r = r (i > 1 ? "," : "") kv[2] }
      print r }' >"$csv"
column -s, -t "$csv"
echo "results: $csv (log: $log)"
