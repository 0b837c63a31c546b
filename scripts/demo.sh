#!/usr/bin/env bash
# vqos demo: three namespace "VMs" and a sink behind the switch, iperf3 in each VM, policies
# changed live (weights 1:2:3 → VM3 max 150 Mbit/s → VM1 min 400 Mbit/s), per-VM rates printed.
# Run as root. Uses the vqos-dataplane demo example for now (vqosd will replace it).
#   scripts/demo.sh [phase-seconds]   (default 8)
set -euo pipefail

PHASE_SECS=${1:-8}
if [ "$(id -u)" -ne 0 ]; then
    echo "demo.sh: run as root (it creates TAPs and network namespaces)" >&2
    exit 1
fi
command -v iperf3 >/dev/null || { echo "demo.sh: install iperf3 (apt-get install -y iperf3)" >&2; exit 1; }

cd "$(dirname "$0")/.."
BIN=target/release/examples/demo
if [ ! -x "$BIN" ] || [ -n "$(find crates/vqos-dataplane crates/vqos-sched -newer "$BIN" -name '*.rs' | head -1)" ]; then
    cargo build --release -p vqos-dataplane --example demo
fi

P="vqd$(( $$ % 10000 ))"          # short prefix: interface names must fit in 15 bytes
NET="10.$(( 150 + $$ % 50 )).0"   # 10.x.0.0/24
UPLINK="${P}u"
VIFS=("${P}v1" "${P}v2" "${P}v3")
LOG=$(mktemp)
PIDS=()
NSS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -f "$LOG"
}
trap cleanup EXIT INT TERM

"$BIN" --uplink "$UPLINK" --vifs "$(IFS=,; echo "${VIFS[*]}")" --engine vqos \
    --capacity 940Mbit --phase-secs "$PHASE_SECS" >"$LOG" 2>&1 &
SWITCH=$!
PIDS+=("$SWITCH")
for _ in $(seq 100); do grep -q READY "$LOG" && break; sleep 0.1; done
grep -q READY "$LOG" || { cat "$LOG"; exit 1; }

setup_ns() { # ns link address
    ip netns add "$1"; NSS+=("$1")
    ip link set "$2" netns "$1"
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$1" link set "$2" up
    ip -n "$1" link set lo up
}
setup_ns "${P}-sink" "$UPLINK" "$NET.254"
for i in 0 1 2; do setup_ns "${P}-vm$((i + 1))" "${VIFS[$i]}" "$NET.$((i + 1))"; done

SECS=$(( 3 * PHASE_SECS + 2 ))
for i in 0 1 2; do
    ip netns exec "${P}-sink" iperf3 -s -1 -p $((5301 + i)) -B "$NET.254" >/dev/null 2>&1 &
    PIDS+=("$!")
done
sleep 0.5
for i in 0 1 2; do
    ip netns exec "${P}-vm$((i + 1))" iperf3 -c "$NET.254" -p $((5301 + i)) -t "$SECS" >/dev/null 2>&1 &
    PIDS+=("$!")
done

echo "VMs ${VIFS[*]} → sink via $UPLINK; rates in Mbit/s (ref = weighted max-min reference)"
tail -n +2 -f "$LOG" --pid "$SWITCH"
