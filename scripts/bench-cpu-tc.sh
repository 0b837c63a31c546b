#!/usr/bin/env bash
# CPU against `tc`: the same 1:2:3 policy at 1 Gbit/s on three vifs, enforced by vqosd and by
# Linux HTB, side by side in one run (issue 9, "CPU against tc"). Topology: three "VM"
# namespaces → switch (a namespace of its own) → one sink namespace; iperf3, one greedy TCP
# stream from each VM to the sink at once.
#
#   vqos    vqosd, engine vqos, capacity 1Gbit, TAP ports with weights 1, 2, 3 (no floors, no
#           caps), its uplink a TAP moved into the sink
#   htb     Linux bridge (veth pairs), HTB on the port toward the sink: parent class at 1gbit,
#           one class per VM (u32 match on its source address) with rate 1/6, 2/6, 3/6 of
#           1 Gbit/s, ceil 1gbit and quantum 64 KiB × weight: 1:2:3 from the rates alone
#   bridge  the reference: the same bridge with a 1 Gbit/s tbf toward the sink, no per-VM policy
#           (what forwarding at the capacity costs without any scheduler)
#
# Each switch with offloads on (TSO/GSO/GRO, the default) and off (`ethtool -K DEV tso off gso
# off gro off` on the VMs' and the sink's interfaces: 1514-byte frames through the switch).
# Per run: Gbit/s received per VM (iperf3 --json, end.sum_received) and their split normalised
# to vm1 (with a check that each VM's share is within 10 % of its weight's, not for the bridge),
# and over the run's middle (1 s after the start to 1 s before the end), in % of one core: the
# switch process (utime+stime of /proc/PID/stat, all threads; none for bridge and htb), softirq
# and all non-idle CPU of the machine (/proc/stat), and "switch + softirq", the aim's measure.
# Softirq is machine-wide: the machine must be otherwise idle.
#
# Run as root:  scripts/bench-cpu-tc.sh [-t SECONDS] [-r ROUNDS] [-s vqos,htb,bridge] [-o DIR]
#   -t  seconds per iperf3 run (default 10; ≥ 3)
#   -r  rounds: every switch once per round, in the order given, both offload settings each
#       (default 1)
#   -s  the switches (default vqos,htb,bridge)
#   -o  output directory (default lab-out/, gitignored): bench-cpu-tc-DATE.csv and .md
# VQOSD=PATH in the environment: the vqosd binary (default target/release/vqosd).
# It installs iperf3, ethtool and jq with apt-get if missing, builds target/release/vqosd if
# missing, takes the machine-wide real-traffic lock, and on exit kills only the processes it
# started (by PID), deletes its namespaces (and with them every link and qdisc it made) and its
# temporary files.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=10
ROUNDS=1
SWITCHES=vqos,htb,bridge
OUTDIR=lab-out
WEIGHTS=(1 2 3)
CAP_KBIT=1000000 # 1 Gbit/s
usage() {
    sed -n '/^# Run as root/,/^# It installs/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while getopts 't:r:s:o:h' opt; do
    case $opt in
        t) SECS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        s) SWITCHES=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        *) usage ;;
    esac
done
[ $OPTIND -gt $# ] || { echo "unexpected argument '${!OPTIND}'" >&2; usage; }
for n in "$SECS" "$ROUNDS"; do case $n in '' | *[!0-9]*) usage ;; esac; done
if [ "$SECS" -lt 3 ] || [ "$ROUNDS" -lt 1 ]; then usage; fi
IFS=, read -r -a SWITCH_LIST <<<"$SWITCHES"
for s in "${SWITCH_LIST[@]}"; do
    case $s in vqos | htb | bridge) ;; *) echo "unknown switch '$s'" >&2; usage ;; esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "bench-cpu-tc.sh: run as root (namespaces, TAPs, qdiscs)" >&2
    exit 1
fi
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
machine_lock

install_missing iperf3 ethtool jq
VQOSD=${VQOSD:-target/release/vqosd}
if [[ ",$SWITCHES," == *,vqos,* ]] && [ ! -x "$VQOSD" ]; then
    command -v cargo >/dev/null || PATH="$HOME/.cargo/bin:$PATH"
    log "building vqosd (release)"
    cargo build --release -q -p vqosd
fi

# --- names and cleanup -----------------------------------------------------------------------
NVM=${#WEIGHTS[@]}
topo_names vqc # unique per run
TMP=$(mktemp -d /tmp/vqos-bench-cputc.XXXXXX)
PIDS=() # every process this script started, by PID
NSS=()  # every namespace it created
SWPID=  # the running vqosd, if any
SW_KIND=
cleanup() {
    trap - EXIT INT TERM
    topo_destroy
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

topo_create "$NVM" # one iperf3 server per VM, for the whole run

# --- the switches ----------------------------------------------------------------------------
start_bridge() { # bridge | htb: veth pairs into a bridge; the qdisc toward the sink
    local up="${P}x" i w sum=0
    bridge_up
    if [ "$1" = bridge ]; then # burst: two 64 KiB super-frames
        tc -n "$SW_NS" qdisc replace dev "$up" root tbf rate "${CAP_KBIT}kbit" burst 131072 limit 1514000
    else
        for w in "${WEIGHTS[@]}"; do sum=$((sum + w)); done
        tc -n "$SW_NS" qdisc replace dev "$up" root handle 1: htb
        tc -n "$SW_NS" class add dev "$up" parent 1: classid 1:1 htb rate "${CAP_KBIT}kbit" \
            ceil "${CAP_KBIT}kbit" burst 128k cburst 128k quantum 65536 # (inner: unused, quiets tc)
        for i in $(seq "$NVM"); do
            w=${WEIGHTS[$((i - 1))]}
            tc -n "$SW_NS" class add dev "$up" parent 1:1 classid "1:$((10 + i))" htb \
                rate "$((CAP_KBIT * w / sum))kbit" ceil "${CAP_KBIT}kbit" quantum $((65536 * w)) \
                burst 64k cburst 64k
            tc -n "$SW_NS" filter add dev "$up" parent 1: protocol ip prio 1 u32 \
                match ip src "$NET.$i/32" flowid "1:$((10 + i))"
        done
    fi
    plug_all
    SWPID=
}
start_vqosd() {
    local cfg="$TMP/vqosd.toml" i
    {
        echo "capacity = \"${CAP_KBIT}kbit\""
        echo 'engine = "vqos"'
        echo "state_file = \"$TMP/state.json\""
        echo 'remove_taps_on_exit = true'
        echo '[api]'
        echo "socket = \"$TMP/vqosd.sock\""
        echo '[uplink]'
        echo "name = \"$SINK_DEV\""
        for i in $(seq "$NVM"); do
            printf '[[port]]\nname = "%s"\npolicy = { weight = %s }\n' "$(vm_dev "$i")" "${WEIGHTS[$((i - 1))]}"
        done
    } >"$cfg"
    vqosd_up "$VQOSD" "$cfg" "$TMP/vqosd.log"
    plug_all
}
start_switch() {
    SW_KIND=$1
    case $1 in
        vqos) start_vqosd ;;
        htb | bridge) start_bridge "$1" ;;
    esac
}
stop_switch() {
    case $SW_KIND in
        vqos) stop_pid "$SWPID" 10; unplug_all ;;
        htb | bridge) bridge_down ;;
    esac
    SWPID=
    SW_KIND=
}

# --- one measurement -------------------------------------------------------------------------
clients() { # secs tag: one iperf3 stream from every VM at once → CLIENT_PIDS
    local i
    CLIENT_PIDS=()
    for i in $(seq "$NVM"); do
        ip netns exec "$(vm_ns "$i")" iperf3 -c "$SINK_IP" -p $((5200 + i)) -t "$1" -J >"$TMP/$2-$i.json" 2>&1 &
        CLIENT_PIDS+=("$!")
    done
    PIDS+=("${CLIENT_PIDS[@]}")
}
warm_up() { # every VM's path learnt, ARP resolved
    local i ok=1
    clients 1 warm
    for i in "${CLIENT_PIDS[@]}"; do wait "$i" || ok=0; done
    forget "${CLIENT_PIDS[@]}"
    [ "$ok" = 1 ] || { log "warm-up failed on $SW_KIND:"; cat "$TMP"/warm-*.json >&2; return 1; }
}

WEIGHT_LIST=$(IFS=,; echo "${WEIGHTS[*]}")
CSV_HEADER="switch,offloads,tso_gso_gro,round,$(for i in $(seq "$NVM"); do printf 'gbps_vm%s,' "$i"; done)gbps_total,split,split_ok,switch_cpu_pct,softirq_pct,switch_softirq_pct,all_cpu_pct,load1_before,seconds"
ROWS=()
measure() { # round offloads(on|off)
    local round=$1 off=$2 tag="$SW_KIND-$1-$2" a b state l1 i g gs=() cpu split sc si all
    topo_offloads "$off"
    state=$(offload_state "$(vm_ns 1)" "$(vm_dev 1)")
    l1=$(load1)
    sleep 1
    clients "$SECS" "$tag"
    sleep 1
    a=$(snap)
    sleep $((SECS - 2))
    b=$(snap)
    wait_all "${CLIENT_PIDS[@]}"
    for i in $(seq "$NVM"); do
        g=$(iperf_gbps "$TMP/$tag-$i.json")
        gs+=("$g")
    done
    # The split against the weights (not expected from the bridge: no policy there).
    if [ "$SW_KIND" = bridge ]; then
        split=$(python3 scripts/aims_report.py split "$WEIGHT_LIST" "${gs[@]}" | cut -d' ' -f1)",n/a"
    else
        split=$(python3 scripts/aims_report.py split "$WEIGHT_LIST" "${gs[@]}" | tr ' ' ,)
    fi
    read -r sc si all < <(cpu_pct "$a" "$b")
    [ -n "$SWPID" ] || sc=-
    cpu=$(awk -v sc="$sc" -v si="$si" 'BEGIN { printf "%.1f", (sc == "-" ? 0 : sc) + si }')
    local row
    row="$SW_KIND,$off,$state,$round,$(printf '%s,' "${gs[@]}" | awk -F, '{
        t = 0; bad = 0
        for (i = 1; i < NF; i++) { if ($i == "nan") bad = 1; else t += $i; printf "%.3f,", $i }
        if (bad) printf "nan"; else printf "%.3f", t }'),$split,$sc,$si,$cpu,$all,$l1,$SECS"
    ROWS+=("$row")
    log "  $row"
}

# --- the run ---------------------------------------------------------------------------------
mkdir -p "$OUTDIR"
STAMP=$(date +%Y%m%d-%H%M%S)
CSV="$OUTDIR/bench-cpu-tc-$STAMP.csv"
MD="$OUTDIR/bench-cpu-tc-$STAMP.md"
log "$(uptime | sed 's/^ *//')"
log "$NVM VMs (weights ${WEIGHTS[*]}) → switch at 1 Gbit/s → sink, ${SECS} s per run, $ROUNDS round(s); switches: $SWITCHES"
for round in $(seq "$ROUNDS"); do
    for sw in "${SWITCH_LIST[@]}"; do
        log "== round $round: $sw"
        start_switch "$sw"
        if warm_up; then
            for off in on off; do measure "$round" "$off"; done
        else
            for off in on off; do
                ROWS+=("$sw,$off,-,$round,$(for _ in $(seq "$NVM"); do printf 'nan,'; done)nan,-,-,-,-,-,-,$(load1),$SECS")
            done
        fi
        stop_switch
    done
done
{
    echo "$CSV_HEADER"
    printf '%s\n' "${ROWS[@]}"
} >"$CSV"
python3 scripts/aims_report.py cpu-tc-table "$CSV" >"$MD"
echo
cat "$MD"
echo
log "CSV: $CSV; Markdown: $MD; $(uptime | sed 's/^ *//')"
