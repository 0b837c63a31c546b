#!/usr/bin/env bash
# vqos demo: vqosd switches three namespace "VMs" to a sink on its uplink (940 Mbit/s, engine
# vqos); each VM runs one greedy iperf3 TCP stream while the policies change live through the
# `vqos` CLI: equal weights → weights 1:2:3 → VM3 max 150Mbit → VM1 min 400Mbit. Every second
# it prints what each VM sent through the switch beside the reference allocation (`vqos alloc`
# of the policies vqosd reports).
#
# Run as root:  scripts/demo.sh [phase-seconds]   (default 7: about 30 s in all)
# It installs what it needs with apt-get if missing (scripts/deps.sh demo), builds the release
# binaries if needed, and removes everything it created on exit (its processes by PID,
# namespaces, temporary files).
set -euo pipefail

PHASE_SECS=${1:-7}
case $PHASE_SECS in
    '' | *[!0-9]* | 0) echo "usage: $0 [phase-seconds ≥ 1]" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
    echo "demo.sh: run as root (vqosd creates TAPs; the VMs are network namespaces)" >&2
    exit 1
fi
cd "$(dirname "$0")/.."
scripts/deps.sh demo   # protoc to build, iperf3 and iproute2 to run (apt-get, if missing)
VQOSD=target/release/vqosd
VQOS=target/release/vqos
stale() { # true when a binary is missing or older than a source it is built from
    [ ! -x "$1" ] && return 0
    [ -n "$(find crates/vqosd crates/vqos-cli crates/vqos-dataplane crates/vqos-sched Cargo.lock \
        -newer "$1" \( -name '*.rs' -o -name Cargo.toml -o -name Cargo.lock \) -print -quit)" ]
}
if stale "$VQOSD" || stale "$VQOS"; then
    command -v cargo >/dev/null || PATH="$HOME/.cargo/bin:$PATH"
    echo "demo.sh: building vqosd and vqos (release)"
    cargo build --release -q -p vqosd -p vqos-cli
fi

P="vqd$(( $$ % 100000 ))"          # unique per run; interface names must fit in 15 bytes
NET="10.$(( 150 + $$ % 50 )).$(( ($$ / 50) % 250 ))"   # the VMs' /24
UPLINK="${P}u"
N=3
VIFS=()
for i in $(seq $N); do VIFS+=("${P}v$i"); done
TMP=$(mktemp -d /tmp/vqos-demo.XXXXXX)
SOCK="$TMP/vqosd.sock"
PIDS=()      # processes this script started (killed by PID)
NSS=()       # namespaces it created
VQOSD_PID=

cleanup() {
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "$VQOSD_PID" ]; then # SIGTERM: vqosd removes its TAPs and socket
        kill "$VQOSD_PID" 2>/dev/null || true
        wait "$VQOSD_PID" 2>/dev/null || true
    fi
    for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

{
    echo 'capacity = "940Mbit"'
    echo 'engine = "vqos"'
    echo "state_file = \"$TMP/state.json\""
    echo 'remove_taps_on_exit = true   # the demo leaves nothing behind'
    echo '[api]'
    echo "socket = \"$SOCK\""
    echo '[uplink]'
    echo "name = \"$UPLINK\""
    for v in "${VIFS[@]}"; do
        printf '[[port]]\nname = "%s"\npolicy = { weight = 1 }\n' "$v"
    done
} >"$TMP/vqosd.toml"

"$VQOSD" --config "$TMP/vqosd.toml" >"$TMP/vqosd.log" 2>&1 &
VQOSD_PID=$!
for _ in $(seq 100); do
    grep -q 'listening on' "$TMP/vqosd.log" && break
    kill -0 "$VQOSD_PID" 2>/dev/null || break
    sleep 0.1
done
grep -q 'listening on' "$TMP/vqosd.log" || { cat "$TMP/vqosd.log" >&2; exit 1; }
vqos() { VQOS_SOCKET="$SOCK" "$VQOS" "$@"; }

setup_ns() { # namespace link address
    ip netns add "$1"
    NSS+=("$1")
    ip -n "$1" link set lo up
    ip link set "$2" netns "$1"
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$1" link set "$2" up
}
setup_ns "${P}-sink" "$UPLINK" "$NET.254"
for i in $(seq $N); do setup_ns "${P}-vm$i" "${VIFS[$((i - 1))]}" "$NET.$i"; done

PHASES=4
SECS=$(( PHASES * PHASE_SECS + 2 ))
for i in $(seq $N); do
    ip netns exec "${P}-sink" iperf3 -s -1 -p $((5200 + i)) -B "$NET.254" >/dev/null 2>&1 &
    PIDS+=("$!")
done
sleep 0.5
for i in $(seq $N); do
    ip netns exec "${P}-vm$i" iperf3 -c "$NET.254" -p $((5200 + i)) -t "$SECS" >/dev/null 2>&1 &
    PIDS+=("$!")
done

# `vqos stats --json` → "name rx_bytes weight min_bps max_bps" per vif.
vif_lines() {
    vqos stats --json | tr -d ' \n' | awk -v RS='"name":"' '
        function num(key) {
            if (!match($0, "\"" key "\":[0-9]+")) return "-"
            return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
        }
        NR > 1 && /"role":"vif"/ {
            name = substr($0, 1, index($0, "\"") - 1)
            print name, num("rx_bytes"), num("weight"), num("min_bps"), num("max_bps")
        }'
}

# The reference allocation of the policies vqosd reports now, into REF[vif] (bit/s).
declare -A REF PREV
set_ref() {
    local args=() name rx w min max bps
    while read -r name rx w min max; do
        [ "$max" = - ] && max=unlimited || max="${max}bit"
        args+=(--vif "$name:weight=$w,min=${min}bit,max=$max")
    done < <(vif_lines)
    while read -r name bps; do REF[$name]=$bps; done < <(
        "$VQOS" alloc --capacity 940Mbit --json "${args[@]}" | awk -F'"' '
            /"name"/ { name = $4 } /"rate_bps"/ { gsub(/[^0-9]/, "", $3); print name, $3 }')
}

T0=$(date +%s%N)
PREV_NS=0
sample() { # phase-label: one row of rates since the previous sample
    local now name rx w min max mbit total=0 ref_total=0 row
    now=$(date +%s%N)
    row=$(printf '%3ds  %-20s' "$(( (now - T0) / 1000000000 ))" "$1")
    while read -r name rx w min max; do
        if [ "$PREV_NS" -gt 0 ]; then   # bytes·8 / ns = Gbit/s; ·1000 = Mbit/s
            mbit=$(( (rx - ${PREV[$name]:-$rx}) * 8000 / (now - PREV_NS) ))
            total=$(( total + mbit ))
            ref_total=$(( ref_total + REF[$name] ))
            row+=$(printf '%7d (%4d)' "$mbit" "$(( REF[$name] / 1000000 ))")
        fi
        PREV[$name]=$rx
    done < <(vif_lines)
    [ "$PREV_NS" -gt 0 ] && printf '%s%8d (%4d)\n' "$row" "$total" "$(( ref_total / 1000000 ))"
    PREV_NS=$now
}

pset() { # vif options...: a live policy change through the CLI
    printf '      $ vqos policy set %s\n      ' "$*"
    vqos policy set "$@"
}

phase() { # label: a row every second for PHASE_SECS seconds
    set_ref
    for _ in $(seq "$PHASE_SECS"); do
        sleep 1
        sample "$1"
    done
}

echo "vqosd: ${VIFS[*]} → sink via $UPLINK, capacity 940Mbit, engine vqos (files in $TMP)"
echo "Mbit/s each VM sends through the switch, every second (reference: weighted max-min of the policies)"
printf '%-26s' "  t  phase"
for i in $(seq $N); do printf '%13s' "VM$i (ref)"; done
printf '%14s\n' "total (ref)"
sample start
phase "weights 1:1:1"
pset "${VIFS[1]}" --weight 2
pset "${VIFS[2]}" --weight 3
phase "weights 1:2:3"
pset "${VIFS[2]}" --max 150Mbit
phase "+ VM3 max 150Mbit"
pset "${VIFS[0]}" --min 400Mbit
phase "+ VM1 min 400Mbit"
echo
vqos stats
