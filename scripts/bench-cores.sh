#!/usr/bin/env bash
# Per-core forwarding on zero-cost ports (issue 21): the switch alone, no kernel, no guest.
#
#   vqos-1     vqosd, engine rr, busy polling, two null vifs (64-byte IPv4/UDP frames, port
#              security and address guards on, as by default) → a null uplink; one thread
#   vqos-2     the same with threads = 2 (shards), pinned to CPUs 0 and 1: one vif per thread,
#              both sending to the null uplink (each thread on a transmit queue of its own)
#   vqos-1u    vqos-1 with port_security = false on the vifs (no source checks, no address
#              guards): like for like with OVS's in_port→output flows, which check nothing
#   vqos-1q    one null vif (one queue) → the null uplink, one thread: one VM on one core
#   vqos-2q    one null vif with queues = 2 on threads = 2: its second queue read by the other
#              thread (a multiqueue VM on two cores; its policy divided between them)
#   vqos-d1    downloads: the null uplink sends 64-byte frames to two null vifs that only
#              receive (frame_len = 0), one after the other, through the scheduled downlink
#              (engine rr, weights equal); one thread
#   vqos-d2    the same on threads = 2: every thread reads a queue of the uplink (as the
#              AF_PACKET uplink's fanout) and the vifs are one per thread
#   ovs-1      OVS-DPDK 3.1 (ovs-vswitchd-dpdk, private instance), two net_null ports
#              (size=64), flows in_port=1→2 and 2→1, one PMD (pmd-cpu-mask 0x2)
#   ovs-2      the same with two PMDs (pmd-cpu-mask 0x3): OVS's own scaling from 1 to 2 cores
#
# Both forward what two zero-cost ports generate, as fast as one core (or two) can. vqosd is
# pinned to CPU 1 (the whole process; with two threads, CPUs 0 and 1); OVS's PMDs to CPU 1
# (and 0). Per run: Mpps forwarded (vqosd: frames its uplink was sent, or for downloads the
# frames its vifs were sent; OVS: packets its two ports transmitted), and cycles per packet
# (vqosd's own rdtsc busy cycles, every loop's, per frame read; OVS's "avg processing cycles
# per packet"). The download rows read as many frames as the loops ask for and drop what the
# vifs' queues cannot take, so their cycles per packet count the dropped frames' reads too.
# Results: lab-out/bench-cores-DATE.md and .csv.
#
# Run as root:  scripts/bench-cores.sh [-t SECONDS] [-s vqos-1,ovs-1,ovs-2] [-r ROUNDS] [-o DIR]
#   -t  seconds per run (default 8)
#   -s  switches, in this order within each round (default vqos-1,vqos-2,ovs-1,ovs-2;
#       vqos-1u, vqos-1q, vqos-2q, vqos-d1 and vqos-d2 on request)
#   -r  rounds: the list is run this many times, interleaved (default 1)
#   -o  output directory (default lab-out/)
# VQOSD=PATH runs another vqosd build (default target/release/vqosd; a relative path is from
# the repository's root), to compare two builds in alternating runs; ENGINE=KIND another
# engine than rr (the cost of scheduling against round robin); VIFS=N that many null vifs
# instead of two (the upload runs: vqos-1, vqos-1u, vqos-2);
# CAPACITY=RATE instead of "unlimited" and VIF_POLICY='max = "3Gbit"' (an inline table's
# body) on every vif, so that an engine's buckets work (C2QoS's overhead, docs/experiments.md).
# It installs openvswitch-switch-dpdk and jq with apt-get if missing (no service is started),
# builds target/release/vqosd if missing, reserves 1024 2-MiB hugepages for OVS-DPDK and gives
# them back, and removes every process (by PID), socket, mount and directory it made.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=8
SWITCHES=vqos-1,vqos-2,ovs-1,ovs-2
ROUNDS=1
OUTDIR=lab-out
usage() {
    sed -n '/^# Run as root/,/^# It installs/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while getopts 't:s:r:o:h' opt; do
    case $opt in
        t) SECS=$OPTARG ;;
        s) SWITCHES=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        *) usage ;;
    esac
done
for n in "$SECS" "$ROUNDS"; do case $n in '' | *[!0-9]* | 0) usage ;; esac; done
IFS=, read -r -a SWITCH_LIST <<<"$SWITCHES"
for s in "${SWITCH_LIST[@]}"; do
    case $s in vqos-1 | vqos-2 | vqos-1u | vqos-1q | vqos-2q | vqos-d1 | vqos-d2 | ovs-1 | ovs-2) ;; *) echo "unknown switch '$s'" >&2; usage ;; esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-cores.sh: run as root" >&2; exit 1; }
PIDS=()
NSS=()
SWPID=
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
machine_lock
install_missing jq:jq /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk:openvswitch-switch-dpdk
VQOSD=${VQOSD:-target/release/vqosd}
ENGINE=${ENGINE:-rr}
VIFS=${VIFS:-2}
CAPACITY=${CAPACITY:-unlimited}
VIF_POLICY=${VIF_POLICY:-}
case $VIFS in '' | *[!0-9]* | 0 | 1) echo "VIFS: a number of vifs, 2 or more" >&2; exit 2 ;; esac
VQOS=target/release/vqos
if [ "$VQOSD" != target/release/vqosd ] && [ ! -x "$VQOSD" ]; then
    echo "bench-cores.sh: VQOSD=$VQOSD is not an executable" >&2
    exit 2
fi
if [ ! -x "$VQOSD" ] || [ ! -x "$VQOS" ]; then
    log "building vqosd and vqos (release)"
    cargo build --release -q -p vqosd -p vqos-cli
fi

TMP=$(mktemp -d /tmp/vqos-bench-cores.XXXXXX)
HUGE=$TMP/huge
HUGE_BEFORE=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)
OVS_NS=vqbc$$
cleanup() {
    set +e
    [ -n "${OVSDIR:-}" ] && timeout 5 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && stop_pid "$p" 2; done
    ip netns del "$OVS_NS" 2>/dev/null
    mountpoint -q "$HUGE" && umount -l "$HUGE"
    echo "$HUGE_BEFORE" >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    rm -rf /var/run/dpdk/vqbc-* "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- vqosd on null ports ----------------------------------------------------------------------
vif_policy() { # config file: VIF_POLICY on the [[port]] just written
    if [ -n "$VIF_POLICY" ]; then echo "policy = { $VIF_POLICY }" >>"$1"; fi
}
start_vqosd() { # threads [port_security [one vif's queues | "dl"]] → SWPID, VQ_SOCK
    local threads=$1 security=${2:-true} queues=${3:-} cpus=1 cfg=$TMP/vqosd.toml up=
    local len=64
    if [ "$queues" = dl ]; then # downloads: the uplink sends, the vifs only receive
        up=$(printf 'to = ["vqbc%sa", "vqbc%sb"]\nframe_len = 64' "$$" "$$")
        queues= len=0
    fi
    [ "$threads" -eq 2 ] && cpus=0,1
    VQ_SOCK=$TMP/vqosd.sock
    cat >"$cfg" <<EOF
capacity = "$CAPACITY"
engine = "$ENGINE"
busy_poll = true
threads = $threads
cpus = [$cpus]
storm_pps = 0
state_file = "$TMP/state.json"
[api]
socket = "$VQ_SOCK"
[uplink]
name = "vqbc$$u"
kind = "null"
$up
[[port]]
name = "vqbc$$a"
kind = "null"
frame_len = $len
port_security = $security
EOF
    vif_policy "$cfg"
    if [ -n "$queues" ]; then
        echo "queues = $queues" >>"$cfg"
    else
        printf '[[port]]\nname = "vqbc%sb"\nkind = "null"\nframe_len = %s\nport_security = %s\n' \
            "$$" "$len" "$security" >>"$cfg"
        vif_policy "$cfg"
        if [ -z "$up" ]; then
            for i in $(seq 3 "$VIFS"); do
                printf '[[port]]\nname = "vqbc%sv%s"\nkind = "null"\nframe_len = %s\nport_security = %s\n' \
                    "$$" "$i" "$len" "$security" >>"$cfg"
                vif_policy "$cfg"
            done
        fi
    fi
    rm -f "$TMP/state.json"
    log "vqosd: engine $ENGINE, $(grep -c '^\[\[port\]\]' "$cfg") vifs, $threads thread(s)"
    taskset -c "$cpus" "$VQOSD" --config "$cfg" >"$TMP/vqosd.log" 2>&1 &
    SWPID=$!
    PIDS+=("$SWPID")
    for _ in $(seq 100); do [ -S "$VQ_SOCK" ] && break; sleep 0.1; done
    [ -S "$VQ_SOCK" ] || { cat "$TMP/vqosd.log" >&2; return 1; }
}
vqosd_sample() { # → "frames_forwarded busy_cycles frames_read" (forwarded: to the uplink, or
    # with "dl" to the vifs)
    local to='select(.name == $up)'
    [ "${1:-}" = dl ] && to='select(.name != $up)'
    "$VQOS" stats --json --socket "$VQ_SOCK" |
        jq -r --arg up "vqbc$$u" '"\([.ports[] | '"$to"' | .tx_frames] | add) \([.loops[].busy_cycles] | add) \([.ports[] | .rx_frames] | add)"'
}

# --- OVS-DPDK on net_null ports ---------------------------------------------------------------
start_ovs() { # pmd_mask → SWPID, OVSDIR
    local mask=$1
    OVSDIR=$TMP/ovs
    mkdir -p "$OVSDIR" "$HUGE"
    mountpoint -q "$HUGE" || mount -t hugetlbfs -o pagesize=2M nodev "$HUGE"
    echo $((HUGE_BEFORE + 1024)) >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    export OVS_RUNDIR=$OVSDIR OVS_LOGDIR=$OVSDIR OVS_DBDIR=$OVSDIR OVS_SYSCONFDIR=$OVSDIR
    ovsdb-tool create "$OVSDIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ovsdb-server "$OVSDIR/conf.db" --remote="punix:$OVSDIR/db.sock" --pidfile="$OVSDIR/ovsdb-server.pid" \
        --unixctl="$OVSDIR/ovsdb-server.ctl" --log-file="$OVSDIR/ovsdb-server.log" --detach --no-chdir
    PIDS+=("$(cat "$OVSDIR/ovsdb-server.pid")")
    vs() { ovs-vsctl --db="unix:$OVSDIR/db.sock" --timeout=60 "$@"; }
    vs --no-wait init
    vs --no-wait set Open_vSwitch . other_config:dpdk-init=true \
        other_config:dpdk-extra="--no-pci --file-prefix=vqbc-ovs-$$" \
        other_config:dpdk-hugepage-dir="$HUGE" other_config:dpdk-socket-mem=1024 \
        other_config:dpdk-socket-limit=1024 other_config:dpdk-lcore-mask=0x1 \
        other_config:pmd-cpu-mask="$mask"
    ip netns list | grep -qx "$OVS_NS" || { ip netns add "$OVS_NS"; NSS+=("$OVS_NS"); }
    ip netns exec "$OVS_NS" /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk "unix:$OVSDIR/db.sock" \
        --pidfile="$OVSDIR/ovs-vswitchd.pid" --unixctl="$OVSDIR/ovs-vswitchd.ctl" \
        --log-file="$OVSDIR/ovs-vswitchd.log" --detach --no-chdir
    SWPID=$(cat "$OVSDIR/ovs-vswitchd.pid")
    PIDS+=("$SWPID")
    vs add-br br0 -- set bridge br0 datapath_type=netdev
    # One rx queue per port; with two PMDs each port's queue goes to its own PMD.
    vs add-port br0 null0 -- set Interface null0 type=dpdk \
        options:dpdk-devargs="net_null0,size=64" options:n_rxq=1 ofport_request=1
    vs add-port br0 null1 -- set Interface null1 type=dpdk \
        options:dpdk-devargs="net_null1,size=64" options:n_rxq=1 ofport_request=2
    ovs-ofctl del-flows br0
    ovs-ofctl add-flow br0 in_port=1,actions=output:2
    ovs-ofctl add-flow br0 in_port=2,actions=output:1
}
stop_ovs() {
    timeout 10 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    stop_pid "$SWPID" 5
    timeout 5 ovs-appctl -t "$OVSDIR/ovsdb-server.ctl" exit >/dev/null 2>&1 || true
    unset OVS_RUNDIR OVS_DBDIR OVS_LOGDIR OVS_SYSCONFDIR
    rm -rf "$OVSDIR" /var/run/dpdk/vqbc-ovs-*
    OVSDIR=
}
ovs_tx() { # → packets both ports transmitted
    local n=0 p v
    for p in null0 null1; do
        v=$(ovs-vsctl --db="unix:$OVSDIR/db.sock" get interface "$p" statistics:tx_packets 2>/dev/null || echo 0)
        n=$((n + v))
    done
    echo "$n"
}
ovs_cycles() { # → avg processing cycles per packet over the PMDs that worked
    ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" dpif-netdev/pmd-stats-show |
        awk -F: '/avg processing cycles per packet/ { gsub(/[^0-9.]/, "", $2); if ($2 > 0) { s += $2; n++ } }
                 END { if (n) printf "%.0f", s / n; else print "nan" }'
}

# --- one measurement --------------------------------------------------------------------------
ROWS=()
measure() { # switch
    local sw=$1 a b t0 t1 mpps cpp
    case $sw in
        vqos-1) start_vqosd 1 ;;
        vqos-2) start_vqosd 2 ;;
        vqos-1u) start_vqosd 1 false ;;
        vqos-1q) start_vqosd 1 true 1 ;;
        vqos-2q) start_vqosd 2 true 2 ;;
        vqos-d1) start_vqosd 1 true dl ;;
        vqos-d2) start_vqosd 2 true dl ;;
        ovs-1) start_ovs 0x2 ;;
        ovs-2) start_ovs 0x3 ;;
    esac
    sleep 3 # warm
    local dir=
    case $sw in vqos-d*) dir=dl ;; esac
    case $sw in
        vqos-*) a=$(vqosd_sample $dir) ;;
        *) ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" dpif-netdev/pmd-stats-clear >/dev/null; a=$(ovs_tx) ;;
    esac
    t0=$(date +%s%N)
    sleep "$SECS"
    t1=$(date +%s%N)
    case $sw in
        vqos-*)
            b=$(vqosd_sample $dir)
            read -r mpps cpp < <(awk -v a="$a" -v b="$b" -v t0="$t0" -v t1="$t1" 'BEGIN {
                split(a, x, " "); split(b, y, " "); f = y[3] - x[3]
                printf "%.2f %s\n", (y[1] - x[1]) / ((t1 - t0) / 1e9) / 1e6,
                    (f > 0 ? sprintf("%.0f", (y[2] - x[2]) / f) : "nan") }')
            stop_pid "$SWPID" 5
            ;;
        *)
            b=$(ovs_tx)
            cpp=$(ovs_cycles)
            mpps=$(awk -v a="$a" -v b="$b" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.2f", (b - a) / ((t1 - t0) / 1e9) / 1e6 }')
            stop_ovs
            ;;
    esac
    ROWS+=("$sw,$mpps,$cpp,$(load1)")
    log "$sw: $mpps Mpps, $cpp cycles/packet"
}

mkdir -p "$OUTDIR"
STAMP=$(date +%Y%m%d-%H%M%S)
log "$(uptime | sed 's/^ *//'); ${SECS} s per run, $ROUNDS round(s)"
for _ in $(seq "$ROUNDS"); do
    for sw in "${SWITCH_LIST[@]}"; do measure "$sw"; done
done
CSV=$OUTDIR/bench-cores-$STAMP.csv
MD=$OUTDIR/bench-cores-$STAMP.md
{ echo "switch,mpps,cycles_per_packet,load1"; printf '%s\n' "${ROWS[@]}"; } >"$CSV"
printf '%s\n' "${ROWS[@]}" | awk -F, '
    function mean(s) { return N[s] ? M[s] / N[s] : 0 }
    function ratio(a, b) { return (mean(a) > 0 && mean(b) > 0) ? sprintf("%.2f", mean(a) / mean(b)) : "–" }
    { n++; r[n] = $0; M[$1] += $2; N[$1]++ }
    END {
        print "| switch | Mpps | cycles/packet | load |"
        print "|---|---|---|---|"
        for (i = 1; i <= n; i++) { split(r[i], f, ","); printf "| %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4] }
        print ""
        print "| vqos-1 / ovs-1 (per core) | vqos-1u / ovs-1 (no guards) | vqos-2 / vqos-1 (vqos scaling) | ovs-2 / ovs-1 (OVS scaling) | vqos-2 / ovs-2 | vqos-2q / vqos-1q (one VM, 2 threads) | vqos-d2 / vqos-d1 (downloads, 2 threads) | (mean Mpps of the rounds) |"
        print "|---|---|---|---|---|---|---|---|"
        printf "| %s | %s | %s | %s | %s | %s | %s | |\n", ratio("vqos-1", "ovs-1"), ratio("vqos-1u", "ovs-1"), ratio("vqos-2", "vqos-1"), ratio("ovs-2", "ovs-1"), ratio("vqos-2", "ovs-2"), ratio("vqos-2q", "vqos-1q"), ratio("vqos-d2", "vqos-d1")
    }' >"$MD"
echo
cat "$MD"
log "CSV: $CSV; Markdown: $MD"
