#!/usr/bin/env bash
# Issue 21's aims in one dated run, one after the other on a quiet machine:
#   1. zero-cost ports, 64 B: vqosd on 1 and 2 threads against OVS-DPDK on 1 and 2 PMDs
#      (scripts/bench-cores.sh, interleaved rounds);
#   2. vhost-user, one core, 64 and 1518 B: vqosd `rr` against OVS-DPDK (scripts/bench-vhost.sh);
#   3. a paper scenario on real traffic with 1 and 2 forwarding threads (`vqos lab run
#      scenarios/ancs-fig5.toml [--threads 2]`): the same per-VM rates within 1 %.
# Everything lands in one directory, with the commit and the times, for docs/benchmarks.md.
#
# Run as root:  scripts/bench-shards.sh [-r ROUNDS] [-t SECONDS] [-o DIR]
#   -r  rounds of each benchmark, interleaved (default 3)
#   -t  seconds per benchmark run (default 8)
#   -o  output directory (default lab-out/bench-shards-DATE)
# Builds the release binaries if missing. Each benchmark cleans up after itself (its own
# script's rules: processes by PID, hugepages given back, namespaces removed).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
SECS=8
OUT=lab-out/bench-shards-$(date -u +%Y%m%d-%H%M%S)
while getopts "r:t:o:h" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        t) SECS=$OPTARG ;;
        o) OUT=$OPTARG ;;
        *) sed -n '2,15p' "$0"; exit 2 ;;
    esac
done
case $ROUNDS$SECS in *[!0-9]*) echo "bench-shards: -r and -t take whole numbers" >&2; exit 2 ;; esac
if [ "$(id -u)" != 0 ]; then
    echo "bench-shards: run as root (namespaces, hugepages, OVS-DPDK)" >&2
    exit 2
fi
[ -x target/release/vqos ] && [ -x target/release/vqosd ] \
    || cargo build --release -p vqosd -p vqos-cli
mkdir -p "$OUT"
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT/run.log"; }
log "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (dirty)'), load $(cut -d' ' -f1-3 /proc/loadavg)"
log "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) online"
# Time the hypervisor ran others on our CPUs (steal, /proc/stat's 8th field) over a step:
# on a shared host it spreads every result, and a lab cell's rates with it.
cpu_times() { head -1 /proc/stat | cut -d' ' -f3-; }
steal_since() {
    local before=$1 after
    after=$(cpu_times)
    awk -v a="$before" -v b="$after" 'BEGIN {
        n = split(a, x, " "); split(b, y, " "); t = 0
        for (i = 1; i <= n; i++) t += y[i] - x[i]
        printf "%.0f %%", (t > 0 ? 100 * (y[8] - x[8]) / t : 0) }'
}

log "1/3 zero-cost ports: scripts/bench-cores.sh -r $ROUNDS -t $SECS -o $OUT/cores"
t0=$(cpu_times)
scripts/bench-cores.sh -r "$ROUNDS" -t "$SECS" -o "$OUT/cores" > "$OUT/cores.log" 2>&1
log "   steal $(steal_since "$t0") of the CPU time"
log "2/3 vhost-user: scripts/bench-vhost.sh -r $ROUNDS -t $SECS -s vqos-rr,ovs -o $OUT/vhost"
t0=$(cpu_times)
scripts/bench-vhost.sh -r "$ROUNDS" -t "$SECS" -s vqos-rr,ovs -o "$OUT/vhost" > "$OUT/vhost.log" 2>&1
log "   steal $(steal_since "$t0") of the CPU time"
for threads in 1 2; do
    log "3/3 ancs-fig5 on $threads thread(s): vqos lab run scenarios/ancs-fig5.toml --threads $threads"
    t0=$(cpu_times)
    target/release/vqos lab run scenarios/ancs-fig5.toml --threads "$threads" \
        --out "$OUT/fig5-t$threads" > "$OUT/fig5-t$threads.log" 2>&1
    log "   steal $(steal_since "$t0") of the CPU time"
done
log "done: $OUT"
