#!/usr/bin/env bash
# The aims of issue 9 in one run: every benchmark an aim needs, one after the other, then one
# table with a row per aim (aim | measured | baseline measured in the same run | met? | the
# sub-command), the sub-benchmarks' own tables appended.
#
#   vhost      scripts/bench-vhost.sh -s vqos-rr,vqos-8,ovs: 64- and 1518-byte frames, one
#              switch core, vqosd against OVS-DPDK (Mpps, Gbit/s, cycles/packet)
#   dataplane  scripts/bench-dataplane.sh -n 4 -s rr,rr-uring,ovs -U tap,afpacket: TAP ports,
#              offloads on and off; `rr` (one system call per frame) against its io_uring and
#              AF_PACKET-uplink variants, and CPU per Gbit/s against OVS userspace
#   cpu-tc     scripts/bench-cpu-tc.sh: 1:2:3 at 1 Gbit/s on three vifs, vqosd against HTB
#   engines    cargo bench -p vqos-sched --bench engines, the `rr` and `vqos` decisions at 8
#              and 64 backlogged vifs (criterion)
# Ratios and verdicts come from scripts/aims_report.py (doctested in scripts/test.sh). A
# sub-benchmark that fails leaves its rows "not measured" with its exit status; the others run.
#
# Run as root:  scripts/bench-aims.sh [-o DIR] [-t SECONDS] [-r ROUNDS]
#   -o  output directory (default lab-out/, gitignored): DIR/aims-DATE.md, the sub-benchmarks'
#       CSVs, tables and logs in DIR/aims-DATE/
#   -t  seconds per run of every sub-benchmark (default 8; ≥ 3)
#   -r  rounds of bench-cpu-tc.sh, whose CPU shares at 1 Gbit/s are small and noisy (default 3)
# On this 2-core machine the whole takes about 15 minutes with the defaults (plus builds, and
# waits for the machine-wide real-traffic lock that every sub-benchmark takes). The machine must be otherwise idle: every number is
# machine-wide CPU or throughput on shared cores.
# It installs what the sub-benchmarks need through them (apt-get), runs each in a process group
# of its own and, when interrupted, stops only that group (each sub-benchmark removes its own
# namespaces, processes, mounts and hugepages on exit).
set -euo pipefail
cd "$(dirname "$0")/.."

OUTDIR=lab-out
SECS=8
ROUNDS=3
usage() {
    sed -n '/^# Run as root/,/^# It installs/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while getopts 'o:t:r:h' opt; do
    case $opt in
        o) OUTDIR=$OPTARG ;;
        t) SECS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        *) usage ;;
    esac
done
[ $OPTIND -gt $# ] || { echo "unexpected argument '${!OPTIND}'" >&2; usage; }
for n in "$SECS" "$ROUNDS"; do case $n in '' | *[!0-9]*) usage ;; esac; done
if [ "$SECS" -lt 3 ] || [ "$ROUNDS" -lt 1 ]; then usage; fi
if [ "$(id -u)" -ne 0 ]; then
    echo "bench-aims.sh: run as root (the sub-benchmarks make namespaces, TAPs, hugepages)" >&2
    exit 1
fi
command -v python3 >/dev/null || { echo "bench-aims.sh: needs python3" >&2; exit 1; }
command -v cargo >/dev/null || PATH="$HOME/.cargo/bin:$PATH"
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

STAMP=$(date -u +%Y%m%d-%H%M%S)
RAW="$OUTDIR/aims-$STAMP"
MD="$OUTDIR/aims-$STAMP.md"
mkdir -p "$RAW"
CHILD= # the running sub-benchmark: a session (and process group) leader
stop_child() {
    [ -n "$CHILD" ] || return 0
    log "stopping the running sub-benchmark (process group $CHILD); no report written"
    kill -TERM -- "-$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
    CHILD=
}
trap stop_child EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

FAILED=() # KIND=WHY for aims_report.py
CMDS=()   # KIND=COMMAND
shell_words() { # args... → one line a shell reads back as the same words
    local a out=()
    for a; do
        if [[ $a =~ ^[A-Za-z0-9_./,=:+-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
    done
    echo "${out[*]}"
}
run_sub() { # kind command...: in a session of its own, its output in RAW/KIND.log
    local kind=$1 rc=0
    shift
    CMDS+=("$kind=$(shell_words "$@")")
    log "$kind: $(shell_words "$@") (log: $RAW/$kind.log)"
    setsid -w "$@" >"$RAW/$kind.log" 2>&1 &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=
    if [ "$rc" -ne 0 ]; then
        log "$kind failed (exit $rc):"
        tail -n 15 "$RAW/$kind.log" >&2
        FAILED+=("$kind=exit $rc, see aims-$STAMP/$kind.log")
    fi
}
newest() { # dir prefix → the last DIR/PREFIX-*.csv (the run's directory is new: one at most)
    local f last=
    for f in "$1/$2"-*.csv; do [ -e "$f" ] && last=$f; done
    echo "$last"
}

START_INFO="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
log "$START_INFO; ${SECS} s per run; results in $RAW"

# The binaries of this checkout (the sub-benchmarks build them only when missing; the report
# names the commit).
log "building vqosd and vqos (release)"
cargo build --release -q -p vqosd -p vqos-cli >"$RAW/build.log" 2>&1 ||
    { tail -n 15 "$RAW/build.log" >&2; exit 1; }

run_sub vhost scripts/bench-vhost.sh -t "$SECS" -s vqos-rr,vqos-8,ovs -o "$RAW"
run_sub dataplane scripts/bench-dataplane.sh -t "$SECS" -n 4 -s rr,rr-uring,ovs -U tap,afpacket -o "$RAW"
run_sub cpu-tc scripts/bench-cpu-tc.sh -t "$SECS" -r "$ROUNDS" -o "$RAW"
# The criterion bench: built first (without the lock: compiling is not measured), then run
# under the machine-wide lock like the traffic benchmarks (flock(1) holds it for the command).
log "engines: building the criterion bench"
cargo bench -q -p vqos-sched --bench engines --no-run >"$RAW/engines-build.log" 2>&1 ||
    { log "engines: build failed"; tail -n 15 "$RAW/engines-build.log" >&2; }
run_sub engines flock /run/lock/vqos-real-traffic.lock cargo bench -q -p vqos-sched --bench engines -- \
    '^decision/(rr|vqos)/(8|64)$' --warm-up-time 1 --measurement-time 3
END_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

VHOST_CSV=$(newest "$RAW" bench-vhost)
DP_CSV=$(newest "$RAW" bench-dataplane)
TC_CSV=$(newest "$RAW" bench-cpu-tc)
args=(report --title "Aims of issue 9: run of $STAMP (UTC)")
[ -z "$VHOST_CSV" ] || args+=(--vhost "$VHOST_CSV")
[ -z "$DP_CSV" ] || args+=(--dataplane "$DP_CSV")
[ -z "$TC_CSV" ] || args+=(--cpu-tc "$TC_CSV")
[ ! -s "$RAW/engines.log" ] || args+=(--engines "$RAW/engines.log")
for c in "${CMDS[@]}"; do args+=(--cmd "$c"); done
for f in "${FAILED[@]}"; do args+=(--failed "$f"); done
{
    python3 scripts/aims_report.py "${args[@]}"
    echo
    echo "Command: \`scripts/bench-aims.sh -o $OUTDIR -t $SECS -r $ROUNDS\` (as root). $START_INFO;"
    echo "$END_LOAD at the end; $(nproc) cores, kernel $(uname -r)."
    echo
    echo "## Raw results"
    for f in "$VHOST_CSV" "$DP_CSV" "$TC_CSV"; do
        [ -n "$f" ] || continue
        echo
        echo "### $(basename "${f%.csv}") ([csv](aims-$STAMP/$(basename "$f")))"
        echo
        cat "${f%.csv}.md" 2>/dev/null || echo "(no table)"
    done
    if [ -s "$RAW/engines.log" ]; then
        echo
        echo "### criterion, \`decision/\` ([log](aims-$STAMP/engines.log))"
        echo
        echo '```'
        grep -E '^[^ ]|time:' "$RAW/engines.log" | grep -v '^Benchmarking' || true
        echo '```'
    fi
} >"$MD"
echo
cat "$MD"
log "aims: $MD; raw results and logs: $RAW"
[ ${#FAILED[@]} -eq 0 ] || exit 1
