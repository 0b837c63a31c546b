#!/usr/bin/env bash
# The dirty log's cost on the forwarding path (issue 26's aim): one vhost-user port's data path
# over in-process guest memory forwards 16-frame bursts from the guest's TX ring back into its
# RX ring, with the log of a live migration on (every write marked) and off, alternating, at
# 64 and 1518 bytes. The runs are crates/vqos-dataplane/src/vhost_user/bench_log.rs (an ignored
# test: it needs the crate's in-process guest). No root, no guest, no switch.
#
#   scripts/bench-dirty-log.sh [-r ROUNDS] [-o DIR]
#   -r  alternating pairs per frame size (default 5)
#   -o  output directory (default lab-out/); writes bench-dirty-log-DATE.csv
# Prints the median Mpps of each mode and their ratio (on / off) per frame size.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=5
OUT=lab-out
while getopts "r:o:h" o; do
    case $o in
    r) ROUNDS=$OPTARG ;;
    o) OUT=$OPTARG ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
    esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench-dirty-log: -r wants a positive number" >&2; exit 2; }
mkdir -p "$OUT"
csv=$OUT/bench-dirty-log-$(date -u +%Y%m%dT%H%M%SZ).csv
out=$(VQOS_BENCH_ROUNDS=$ROUNDS cargo test --release -q -p vqos-dataplane --lib \
    bench_dirty_log -- --ignored --nocapture --test-threads 1 2>&1) || {
    echo "$out" | tail -20 >&2
    exit 1
}
echo "len,round,log,mpps" >"$csv"
echo "$out" | sed -n 's/^DIRTYLOG len=\([0-9]*\) round=\([0-9]*\) log=\([a-z]*\) mpps=\([0-9.]*\)$/\1,\2,\3,\4/p' >>"$csv"
python3 - "$csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for size in sorted({int(r["len"]) for r in rows}):
    med = {m: statistics.median(float(r["mpps"]) for r in rows
                                if int(r["len"]) == size and r["log"] == m)
           for m in ("off", "on")}
    print(f"{size:5d} B  log off {med['off']:.3f} Mpps  on {med['on']:.3f} Mpps  "
          f"on/off {med['on'] / med['off']:.3f}")
PY
echo "results: $csv"
