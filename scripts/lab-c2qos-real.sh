#!/usr/bin/env bash
# C2QoS Fig. 6 on a real load (no [emulate]): VM1's rate and latency when its three neighbours
# flood the switch's one core with 64-byte frames, under vqosd `tcm` (the byte policer at each
# purchase), vqosd `c2qos` (C2TB cycle buckets; `c2qos-hbs`: VM1 at priority 1) and OVS-DPDK
# with an ingress policer at each purchase (`ovs-policer`, the paper's baseline).
#
# The layout (docs/experiments.md, "C2QoS Fig. 6", "On a real load"):
#   CPU 1  the switch alone: vqosd (whole process, busy_poll) or OVS-DPDK's one PMD thread
#   CPU 0  the neighbours vm2..vm4: one dpdk-testpmd, three virtio_user ports (DPDK's virtio
#          PMD over vhost-user) in txonly mode, greedy, 1514-byte then 64-byte frames to a
#          MAC nobody owns (so the switch sends them to the uplink);
#          VM1: a network namespace with a paced UDP sender (`vqos-probe flood`, 1514-byte
#          frames at VM1's purchase, nice -10) — vqosd: on a TAP vif; OVS: on a veth whose peer
#          is a PMD-polled DPDK af_packet port (a netdev-linux port would be served by OVS's
#          main thread on CPU 0, not by the PMD the floods load);
#          the sink: a namespace holding the uplink (vqosd's uplink TAP, OVS's bridge port, a
#          TAP too), where VM1's datagrams are counted by the kernel (Udp NoPorts) and the
#          floods, addressed to nobody, are dropped at L2. Writing a frame to a TAP is a system
#          call per frame on the switch's core, for both switches: a real per-frame cost.
# Phases (each: 1 s settle, then -t seconds measured): 1 VM1 alone; 2 the neighbours send
# 1514-byte frames; 3 they send 64-byte frames. testpmd cannot pace, so the neighbours are
# greedy in phases 2 and 3: the switch holds them to their purchases (the policers in bytes,
# C2TB in cycles). VM1's loss in a phase = 1 − datagrams the sink got / datagrams VM1's
# kernel took; "kept" = VM1's delivered rate in the phase / in phase 1.
# Latency runs (-l): VM1 carries only a 64-byte UDP probe at 1000/s (`vqos-probe client`, at
# SCHED_FIFO, against `vqos-probe server` in the sink); p50/p99 per phase.
#
# Run as root:  scripts/lab-c2qos-real.sh [-t SECONDS] [-s SWITCHES] [-l SWITCHES] [-o DIR]
#                                         [-c CAPACITY_MBIT] [-p P1,P2,P3,P4] [-f PERCENT]
#                                         [-H TSC_HZ]
#               scripts/lab-c2qos-real.sh -n DIR   (write the configs only, no root needed)
#   -t  seconds measured per phase (default 10)
#   -s  rate runs, in this order (default tcm,c2qos,ovs-policer; "" for none)
#   -l  latency runs (default tcm,c2qos-hbs; "" for none)
#   -c  the switch's capacity in Mbit/s (default 1000)
#   -p  purchases of vm1..vm4 in Mbit/s (default 400,400,100,100: the paper's 4/4/1/1 of 10)
#   -f  VM1 sends this % of its purchase (default 95: a paced sender on a shared CPU catches up
#       in bursts, and a policer with a 10 ms bucket at exactly the rate drops the bursts)
#   -H  the switch core's cycles per second for C2TB (default: the TSC's from the kernel log)
#   -o  output directory (default lab-out/)
#   -n  dry run: write vqosd-<switch>.toml and ovs-<switch>.sh for every switch into DIR
# It installs dpdk-dev and openvswitch-switch-dpdk with apt-get if missing (no service is
# started), builds target/release/{vqosd,vqos,vqos-probe} if missing, reserves 1024 2-MiB
# hugepages for OVS-DPDK and gives them back, and removes every process (by PID), namespace,
# socket, mount and directory it made, on failure too. The binaries can be named in the
# environment instead: VQOSD=... VQOS=... PROBE=... (the end-to-end test uses its debug build).
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=10
RATE_RUNS=tcm,c2qos,ovs-policer
LAT_RUNS=tcm,c2qos-hbs
CAP_MBIT=1000
PURCHASES=400,400,100,100
VM1_PCT=95
TSC_HZ=
OUTDIR=lab-out
DRY=
usage() {
    sed -n '/^# Run as root/,/^# It installs/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while getopts 't:s:l:c:p:f:H:o:n:h' opt; do
    case $opt in
        t) SECS=$OPTARG ;;
        s) RATE_RUNS=$OPTARG ;;
        l) LAT_RUNS=$OPTARG ;;
        c) CAP_MBIT=$OPTARG ;;
        p) PURCHASES=$OPTARG ;;
        f) VM1_PCT=$OPTARG ;;
        H) TSC_HZ=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        n) DRY=$OPTARG ;;
        *) usage ;;
    esac
done
for n in "$SECS" "$CAP_MBIT" "$VM1_PCT" ${TSC_HZ:+"$TSC_HZ"}; do case $n in '' | *[!0-9]*) usage ;; esac; done
IFS=, read -r -a BUY <<<"$PURCHASES"
[ ${#BUY[@]} -eq 4 ] || { echo "-p needs four purchases" >&2; usage; }
for n in "${BUY[@]}"; do case $n in '' | *[!0-9]*) usage ;; esac; done
[ $((BUY[0] + BUY[1] + BUY[2] + BUY[3])) -le "$CAP_MBIT" ] ||
    { echo "the purchases add up to more than the capacity (c2qos refuses an oversold core)" >&2; exit 2; }
IFS=, read -r -a RATE_LIST <<<"$RATE_RUNS"
IFS=, read -r -a LAT_LIST <<<"$LAT_RUNS"
for s in "${RATE_LIST[@]}" "${LAT_LIST[@]}"; do
    case $s in tcm | c2qos | c2qos-hbs | ovs-policer) ;; *) echo "unknown switch '$s'" >&2; usage ;; esac
done
# log, machine_lock, apt_install (policy-rc.d made and removed even when apt-get fails).
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

# The TSC's frequency: C2TB's cycle budget (vqosd's busy cycles are TSC cycles).
tsc_hz() {
    local mhz
    mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Refined TSC clocksource calibration: \([0-9.]*\) MHz.*/\1/p' | tail -1)
    [ -n "$mhz" ] || mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Detected \([0-9.]*\) MHz processor.*/\1/p' | tail -1)
    [ -n "$mhz" ] || mhz=$(awk -F': ' '/^cpu MHz/ { print $2; exit }' /proc/cpuinfo)
    awk -v m="$mhz" 'BEGIN { printf "%.0f", m * 1e6 }'
}
[ -n "$TSC_HZ" ] || TSC_HZ=$(tsc_hz)

TMP=${DRY:-$(mktemp -d /tmp/vqos-c2qos-real.XXXXXX)}
mkdir -p "$TMP"
TAG=$$
VM1_IF=vqc2v$TAG    # VM1's interface, in NS_VM1 (vqosd's TAP; OVS: a veth end)
VM1_PEER=vqc2a$TAG  # OVS only: the veth's switch end, an af_packet DPDK port
UPLINK=vqc2u$TAG    # vqosd's uplink TAP, in NS_SINK
BR=vqc2b$TAG        # OVS's bridge; its own port (a TAP) is the uplink, in NS_SINK
NS_VM1=vqc2v$TAG
NS_SINK=vqc2s$TAG
VM1_IP=10.251.0.1
SINK_IP=10.251.0.2
FLOOD_DST=02:00:00:00:00:ee # nobody's MAC: frames go to the uplink, the sink drops them at L2

# --- configuration (also written by -n) -------------------------------------------------------
# vqosd_config SWITCH → the daemon's TOML on stdout
vqosd_config() {
    local sw=$1 i prio engine cost
    case $sw in
        tcm) engine=tcm cost=bytes ;;
        c2qos | c2qos-hbs) engine=c2qos cost=cycles ;;
        *) return 1 ;;
    esac
    cat <<EOF
# Generated by scripts/lab-c2qos-real.sh ($sw): purchases ${PURCHASES} Mbit/s of ${CAP_MBIT}.
capacity = "${CAP_MBIT}Mbit"
engine = "$engine"
cost = "$cost"
cycles_per_sec = $TSC_HZ
busy_poll = true
storm_pps = 0
remove_taps_on_exit = true
state_file = "$TMP/state-$sw.json"

[api]
socket = "$TMP/vqosd.sock"

[uplink]
name = "$UPLINK"
create = true

[[port]]
name = "$VM1_IF"
create = true
EOF
    prio=0
    [ "$sw" = c2qos-hbs ] && prio=1
    echo "policy = { max = \"${BUY[0]}Mbit\", priority = $prio }"
    for i in 2 3 4; do
        prio=0
        [ "$sw" = c2qos-hbs ] && prio=7
        # One testpmd sends for all three (txonly, one source IP): generators, not hosts, so
        # without the guards above layer 2 (port_security = false).
        printf '\n[[port]]\nname = "vm%s"\nkind = "vhost-user"\nsocket = "%s"\nport_security = false\npolicy = { max = "%sMbit", priority = %s }\n' \
            "$i" "$TMP/vm$i.sock" "${BUY[$((i - 1))]}" "$prio"
    done
}
# ovs_policing MBIT → "ingress_policing_rate=KBPS ingress_policing_burst=KBITS" (OVS's kbps and
# kilobits; the burst is max(64 KiB, 10 ms of the rate), the default buckets of vqosd's tcm)
ovs_policing() {
    awk -v m="$1" 'BEGIN { r = m * 1000; b = r / 100; if (b < 524) b = 524
        printf "ingress_policing_rate=%d ingress_policing_burst=%d", r, b }'
}
# ovs_config → the ovs-vsctl/ovs-ofctl commands that build the bridge (on stdout; $V and $O are
# the private instance's ovs-vsctl and ovs-ofctl)
ovs_config() {
    local i
    echo "# Generated by scripts/lab-c2qos-real.sh (ovs-policer): purchases ${PURCHASES} Mbit/s."
    echo "\$V add-br $BR -- set bridge $BR datapath_type=netdev"
    echo "\$V add-port $BR vm1 -- set Interface vm1 type=dpdk options:dpdk-devargs=net_af_packet0,iface=$VM1_PEER,qpairs=1 ofport_request=1"
    for i in 2 3 4; do
        echo "\$V add-port $BR vm$i -- set Interface vm$i type=dpdkvhostuserclient options:vhost-server-path=$TMP/vm$i.sock ofport_request=$i"
    done
    for i in 1 2 3 4; do
        echo "\$V set Interface vm$i $(ovs_policing "${BUY[$((i - 1))]}")"
    done
    echo "\$O del-flows $BR"
    for i in 1 2 3 4; do echo "\$O add-flow $BR in_port=$i,actions=LOCAL"; done
    echo "\$O add-flow $BR in_port=LOCAL,actions=output:1"
}

if [ -n "$DRY" ]; then
    for s in tcm c2qos c2qos-hbs; do vqosd_config "$s" >"$DRY/vqosd-$s.toml"; done
    ovs_config >"$DRY/ovs-ovs-policer.sh"
    exit 0
fi

# --- set-up -----------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || { echo "lab-c2qos-real.sh: run as root" >&2; exit 1; }
# Never beside a real-traffic test or another benchmark (vqos_testkit::MACHINE_LOCK).
machine_lock

need=()
command -v dpdk-testpmd >/dev/null || need+=(dpdk-dev)
command -v jq >/dev/null || need+=(jq)
[ -x /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk ] || need+=(openvswitch-switch-dpdk)
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
VQOSD=${VQOSD:-target/release/vqosd}
VQOS=${VQOS:-target/release/vqos}
PROBE=${PROBE:-target/release/vqos-probe}
if [ ! -x "$VQOSD" ] || [ ! -x "$VQOS" ] || [ ! -x "$PROBE" ]; then
    log "building vqosd, vqos and vqos-probe (release)"
    cargo build --release -q -p vqosd -p vqos-cli -p vqos-probe
fi

HUGE=$TMP/huge
PIDS=()
HUGE_BEFORE=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)
log "2-MiB hugepages reserved before: $HUGE_BEFORE (given back to that at exit)"
cleanup() {
    # Every step runs, whatever the one before it did (errexit would end the trap early and
    # leave hugepages reserved or directories behind).
    set +e
    local p
    for p in "${PIDS[@]:-}"; do if [ -n "$p" ]; then kill "$p" 2>/dev/null; fi; done
    sleep 0.5
    for p in "${PIDS[@]:-}"; do if [ -n "$p" ]; then kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; fi; done
    if [ -n "${OVSDIR:-}" ] && [ -d "$OVSDIR" ]; then
        timeout 5 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    fi
    ip netns del "$NS_VM1" 2>/dev/null || true
    ip netns del "$NS_SINK" 2>/dev/null || true
    ip link del "$VM1_PEER" 2>/dev/null || true
    # OVS's hugepage files go with its process; a mount still busy is detached lazily.
    mountpoint -q "$HUGE" && { umount "$HUGE" || umount -l "$HUGE"; }
    echo "$HUGE_BEFORE" >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    rm -rf "/var/run/dpdk/vqc2-$TAG" "/var/run/dpdk/vqc2-ovs-$TAG" "$TMP"
}
trap cleanup EXIT
trap 'log "failed (status $?) at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM
# A testpmd that died makes a write to its FIFO fail (EPIPE), not end this script by SIGPIPE.
trap '' PIPE
set -E # the ERR trap above also in functions (run_one), with their failing line

fresh_netns() {
    ip netns del "$NS_VM1" 2>/dev/null || true
    ip netns del "$NS_SINK" 2>/dev/null || true
    ip netns add "$NS_VM1"
    ip netns add "$NS_SINK"
    ip -n "$NS_VM1" link set lo up
    ip -n "$NS_SINK" link set lo up
}
vm1_up() { # the VM1 interface is in NS_VM1
    ip -n "$NS_VM1" addr add "$VM1_IP/24" dev "$VM1_IF"
    ip -n "$NS_VM1" link set "$VM1_IF" up
}
sink_up() { # dev: the uplink, already in NS_SINK
    ip -n "$NS_SINK" addr add "$SINK_IP/24" dev "$1"
    ip -n "$NS_SINK" link set "$1" up
    SINK_DEV=$1
}

# --- the neighbours: testpmd, three virtio_user ports, txonly ---------------------------------
start_testpmd() { # server(0|1)
    local extra='' i vdevs=()
    [ "$1" = 1 ] && extra=",server=1"
    for i in 2 3 4; do
        vdevs+=(--vdev "net_virtio_user$((i - 2)),path=$TMP/vm$i.sock,queues=1,queue_size=1024,mac=02:00:00:00:00:a$i$extra")
    done
    TP_IN=$TMP/tp.in TP_OUT=$TMP/tp.out
    rm -f "$TP_IN"; mkfifo "$TP_IN"
    stdbuf -oL dpdk-testpmd --lcores 0@0,1@0 --no-pci --no-huge -m 1024 \
        --file-prefix "vqc2-$TAG" --log-level lib.eal:error "${vdevs[@]}" \
        -- -i --forward-mode=txonly --txpkts=1514 --total-num-mbufs=65536 --nb-cores=1 \
        --eth-peer=0,$FLOOD_DST --eth-peer=1,$FLOOD_DST --eth-peer=2,$FLOOD_DST \
        <"$TP_IN" >"$TP_OUT" 2>&1 &
    TP_PID=$!
    PIDS+=("$TP_PID")
    exec 8>"$TP_IN"
}
tp() { echo "$*" >&8; }
stop_testpmd() {
    tp quit || true
    exec 8>&-
    stop_pid "$TP_PID"
}

# --- vqosd ------------------------------------------------------------------------------------
start_vqosd() { # switch
    local cfg=$TMP/vqosd-$1.toml
    vqosd_config "$1" >"$cfg"
    rm -f "$TMP"/vm*.sock
    # Plain priority. (OVS-DPDK runs its PMD threads at nice -20 of its own accord: on a quiet
    # machine, where CPU 1 is the switch's alone, that changes nothing; on a loaded one it
    # gives OVS a larger share of CPU 1 than vqosd gets. Giving vqosd -20 as well starved
    # everything else on CPU 1 here, this script's own commands included.)
    taskset -c 1 "$VQOSD" --config "$cfg" >"$TMP/vqosd.log" 2>&1 &
    SW_PID=$!
    PIDS+=("$SW_PID")
    for _ in $(seq 100); do [ -S "$TMP/vqosd.sock" ] && [ -S "$TMP/vm4.sock" ] && break; sleep 0.1; done
    [ -S "$TMP/vqosd.sock" ] || { cat "$TMP/vqosd.log" >&2; return 1; }
    ip link set "$VM1_IF" netns "$NS_VM1"
    ip link set "$UPLINK" netns "$NS_SINK"
    vm1_up
    sink_up "$UPLINK"
}
vqosd_ports() { # → "name rx_frames drops" per port
    "$VQOS" stats --json --socket "$TMP/vqosd.sock" 2>>"$TMP/vqos-stats.err" |
        jq -r '.ports[] | "\(.name) \(.rx_frames) \([.drops[]] | add // 0)"'
}

# --- OVS-DPDK ---------------------------------------------------------------------------------
start_ovs() {
    OVSDIR=$TMP/ovs
    mkdir -p "$OVSDIR" "$HUGE"
    mountpoint -q "$HUGE" || mount -t hugetlbfs -o pagesize=2M nodev "$HUGE"
    # 1024 pages more than were reserved before (given back by the cleanup): another user's
    # reservation is neither shrunk nor counted on.
    echo $((HUGE_BEFORE + 1024)) >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    export OVS_RUNDIR=$OVSDIR OVS_LOGDIR=$OVSDIR OVS_DBDIR=$OVSDIR OVS_SYSCONFDIR=$OVSDIR
    ovsdb-tool create "$OVSDIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ovsdb-server "$OVSDIR/conf.db" --remote="punix:$OVSDIR/db.sock" --pidfile="$OVSDIR/ovsdb-server.pid" \
        --unixctl="$OVSDIR/ovsdb-server.ctl" --log-file="$OVSDIR/ovsdb-server.log" -vconsole:off --detach --no-chdir
    OVSDB_PID=$(cat "$OVSDIR/ovsdb-server.pid")
    PIDS+=("$OVSDB_PID")
    V="ovs-vsctl --db=unix:$OVSDIR/db.sock --timeout=60"
    O="ovs-ofctl"
    $V --no-wait init
    $V --no-wait set Open_vSwitch . other_config:dpdk-init=true \
        other_config:dpdk-extra="--no-pci --file-prefix=vqc2-ovs-$TAG" \
        other_config:dpdk-hugepage-dir="$HUGE" other_config:dpdk-socket-mem=1024 \
        other_config:dpdk-socket-limit=1024 other_config:dpdk-lcore-mask=0x1 other_config:pmd-cpu-mask=0x2
    # VM1's veth: its switch end stays in the sink namespace, where ovs-vswitchd runs (the
    # bridge's own port, the uplink, is created there too).
    ip link add "$VM1_PEER" type veth peer name "$VM1_IF"
    ip link set "$VM1_IF" netns "$NS_VM1"
    ip link set "$VM1_PEER" netns "$NS_SINK"
    ip -n "$NS_SINK" link set "$VM1_PEER" up
    vm1_up
    ip netns exec "$NS_SINK" /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk "unix:$OVSDIR/db.sock" \
        --pidfile="$OVSDIR/ovs-vswitchd.pid" --unixctl="$OVSDIR/ovs-vswitchd.ctl" \
        --log-file="$OVSDIR/ovs-vswitchd.log" -vconsole:off --detach --no-chdir
    SW_PID=$(cat "$OVSDIR/ovs-vswitchd.pid")
    PIDS+=("$SW_PID")
    ovs_config >"$OVSDIR/build.sh"
    # ovs-ofctl finds the bridge's management socket under OVS_RUNDIR (exported above).
    V=$V O=$O bash -e "$OVSDIR/build.sh"
    sink_up "$BR"
}
stop_ovs() {
    timeout 10 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    stop_pid "$SW_PID"
    timeout 5 ovs-appctl -t "$OVSDIR/ovsdb-server.ctl" exit >/dev/null 2>&1 || true
    stop_pid "$OVSDB_PID"
    unset OVS_RUNDIR OVS_DBDIR OVS_LOGDIR OVS_SYSCONFDIR
    rm -rf "$OVSDIR" "/var/run/dpdk/vqc2-ovs-$TAG"
    OVSDIR=
    # OVS's hugepage files go with its process; a mount still busy is detached lazily.
    mountpoint -q "$HUGE" && { umount "$HUGE" || umount -l "$HUGE"; }
    echo "$HUGE_BEFORE" >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
}
ovs_ports() { # → "name rx_packets drops" per VM port, live (the Interface table's statistics
    # lag by up to 5 s); drops: the port's rx drops, its ingress policer's included
    ovs-ofctl dump-ports "$BR" | awk '$1 == "port" && $2 ~ /^[1-4]:$/ {
        n = $2; sub(":", "", n); p = $4; d = $6; sub("pkts=", "", p); sub(",", "", p)
        sub("drop=", "", d); sub(",", "", d); print "vm" n, p + 0, d + 0 }'
}

# --- counters ---------------------------------------------------------------------------------
sink_udp() { # datagrams that reached the sink's UDP layer (to a closed port: NoPorts)
    # shellcheck disable=SC2016 # an awk program
    ip netns exec "$NS_SINK" awk '/^Udp:/ { if (!h) { for (i = 2; i <= NF; i++) k[i] = $i; h = 1; next }
        for (i = 2; i <= NF; i++) if (k[i] == "InDatagrams" || k[i] == "NoPorts" || k[i] == "InErrors") s += $i; print s }' /proc/net/snmp
}
sink_frames() { # frames the switch wrote to the uplink (a TAP: what its owner writes is received)
    ip netns exec "$NS_SINK" cat "/sys/class/net/$SINK_DEV/statistics/rx_packets"
}
switch_ports() { case $1 in ovs-*) ovs_ports ;; *) vqosd_ports ;; esac; }
# switch_cycles SWITCH → "busy idle frames": the forwarding core's own cycle counters (vqosd:
# its loop's rdtsc busy/idle cycles and the frames read from all ports; OVS: pmd-stats-show's
# processing/idle cycles and packets received)
switch_cycles() {
    case $1 in
        ovs-*)
            ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" dpif-netdev/pmd-stats-show | awk '
                /^pmd thread/ { p = 1; next } /^[^ ]/ { p = 0 }
                p && /packets received:/ { f = $3 } p && /idle cycles:/ { i = $3 }
                p && /processing cycles:/ { b = $3 }
                END { print b + 0, i + 0, f + 0 }'
            ;;
        *)
            "$VQOS" stats --json --socket "$TMP/vqosd.sock" 2>>"$TMP/vqos-stats.err" |
                jq -r '"\(.loops[0].busy_cycles) \(.loops[0].idle_cycles) \([.ports[].rx_frames] | add)"'
            ;;
    esac
}
cpu_ticks() { # pid → "utime+stime in clock ticks (all threads) now_ns"
    printf '%s %s\n' "$(awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0)" "$(date +%s%N)"
}

# --- one run ----------------------------------------------------------------------------------
ROWS=()
LROWS=()
# row_json KIND SWITCH PHASE [KEY VALUE]... → one JSON object per line into $TMP/rows.jsonl,
# with the phase's common numbers (nb, busy, cpf, cpu of the caller); a value that is not a
# number ("nan") becomes null. `vqos lab paper c2qos-fig6 --baseline ovs-dpdk` reads them.
row_json() {
    local args=(--arg kind "$1" --arg switch "$2" --arg phase "$3" --arg neighbours_mpps "$nb"
        --arg core_busy_pct "$busy" --arg cycles_per_frame "$cpf" --arg switch_cpu_pct "$cpu")
    local keys='"neighbours_mpps","core_busy_pct","cycles_per_frame","switch_cpu_pct"'
    shift 3
    while [ $# -ge 2 ]; do
        args+=(--arg "$1" "$2")
        keys+=",\"$1\""
        shift 2
    done
    jq -nc "${args[@]}" "{kind: \$kind, switch: \$switch, phase: (\$phase | tonumber)}
        + ([$keys] | map({key: ., value: (\$ARGS.named[.] | tonumber? // null)}) | from_entries)" \
        >>"$TMP/rows.jsonl"
}
set_phase() { # 1 | 2 | 3
    case $1 in
        1) ;;
        2) tp "set txpkts 1514"; tp start ;;
        3) tp stop; sleep 0.3; tp "set txpkts 64"; tp start ;;
    esac
}
run_one() { # kind(rate|latency) switch
    local kind=$1 sw=$2 ph u0 u1 f0 f1 fl kept sent got loss p1rate rate nb out t0 t1 ports0 ports1 c0 c1 cpu y0 y1 busy cpf
    log "$kind run: $sw"
    fresh_netns
    case $sw in
        ovs-*) start_testpmd 1; sleep 2; start_ovs ;;
        *) start_vqosd "$sw"; start_testpmd 0 ;;
    esac
    sleep 4 # vhost-user sessions and ARP
    if [ "$kind" = latency ]; then
        ip netns exec "$NS_SINK" taskset -c 0 chrt -f 10 "$PROBE" server --bind "$SINK_IP:7000" >"$TMP/probe-server.log" 2>&1 &
        SRV_PID=$!
        PIDS+=("$SRV_PID")
        sleep 0.5
    fi
    ip netns exec "$NS_VM1" ping -c 1 -W 2 "$SINK_IP" >/dev/null || log "$sw: VM1 cannot reach the sink"
    p1rate=
    for ph in 1 2 3; do
        set_phase "$ph"
        sleep 1
        u0=$(sink_udp); f0=$(sink_frames); ports0=$(switch_ports "$sw"); c0=$(cpu_ticks "$SW_PID"); y0=$(switch_cycles "$sw")
        t0=$(date +%s%N)
        if [ "$kind" = rate ]; then
            out=$(ip netns exec "$NS_VM1" taskset -c 0 nice -n -10 "$PROBE" flood --to "$SINK_IP:9" \
                --frame 1514 --rate "$((BUY[0] * VM1_PCT * 10))kbit" --duration "${SECS}s" --json)
        else
            out=$(ip netns exec "$NS_VM1" taskset -c 0 chrt -f 10 "$PROBE" client --to "$SINK_IP:7000" \
                --rate 1000/s --duration "${SECS}s" --json)
        fi
        t1=$(date +%s%N)
        sleep 0.2 # the last frames through
        u1=$(sink_udp); f1=$(sink_frames); ports1=$(switch_ports "$sw"); c1=$(cpu_ticks "$SW_PID"); y1=$(switch_cycles "$sw")
        cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$(getconf CLK_TCK)" \
            'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.0f", (y[1] - x[1]) / hz / ((y[2] - x[2]) / 1e9) * 100 }')
        # The core's busy share and busy cycles per frame read, from its own counters.
        read -r busy cpf < <(awk -v a="$y0" -v b="$y1" 'BEGIN { split(a, x, " "); split(b, y, " ")
            db = y[1] - x[1]; di = y[2] - x[2]; df = y[3] - x[3]
            printf "%s %s\n", (db + di > 0 ? sprintf("%.0f", db / (db + di) * 100) : "nan"), (df > 0 ? sprintf("%.0f", db / df) : "nan") }')
        # Neighbours' frames forwarded = uplink frames − VM1's datagrams (ARP/ICMP: a few).
        nb=$(awk -v f0="$f0" -v f1="$f1" -v u0="$u0" -v u1="$u1" -v t0="$t0" -v t1="$t1" \
            'BEGIN { printf "%.3f", ((f1 - f0) - (u1 - u0)) / ((t1 - t0) / 1e9) / 1e6 }')
        # The switch's reading of its ports: frames read and dropped, vm1 and the neighbours.
        fl=$(join <(echo "$ports0" | sort) <(echo "$ports1" | sort) |
            awk '$1 !~ /^vqc2u/ { printf "%s %d/%d ", ($1 ~ /^vqc2v/ ? "vm1" : $1), $4 - $2, $5 - $3 }')
        if [ "$kind" = rate ]; then
            sent=$(echo "$out" | jq -r .sent_frames)
            got=$((u1 - u0))
            loss=$(awk -v s="$sent" -v g="$got" 'BEGIN { if (s > 0) printf "%.1f", (1 - g / s) * 100; else print "nan" }')
            rate=$(awk -v g="$got" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.1f", g * 1514 * 8 / ((t1 - t0) / 1e9) / 1e6 }')
            [ "$ph" = 1 ] && p1rate=$rate
            kept=$(awk -v a="$rate" -v b="$p1rate" 'BEGIN { if (b > 0) printf "%.1f", a / b * 100; else print "nan" }')
            ROWS+=("| $sw | $ph | $(echo "$out" | jq -r '.sent_bps / 1e6 | . * 10 | round / 10') | $rate | $loss | $kept | $nb | ${fl% } | $busy | $cpf | $cpu | $(cut -d' ' -f1 /proc/loadavg) |")
            row_json rate "$sw" "$ph" sent_mbit "$(echo "$out" | jq -r '.sent_bps / 1e6')" \
                delivered_mbit "$rate" loss_pct "$loss" kept_pct "$kept"
            log "$sw phase $ph: VM1 sent $sent, sink got $got (loss $loss %, kept $kept %), neighbours $nb Mpps; switch read/dropped: $fl; core busy $busy %, $cpf cycles/frame; switch CPU $cpu %"
        else
            LROWS+=("| $sw | $ph | $(echo "$out" | jq -r '"\(.samples) | \(.lost) | \(.p50_us // "-" | tostring | .[0:6]) | \(.p99_us // "-" | tostring | .[0:6]) | \(.p999_us // "-" | tostring | .[0:7])"') | $nb | $busy | $cpu | $(cut -d' ' -f1 /proc/loadavg) |")
            row_json latency "$sw" "$ph" samples "$(echo "$out" | jq -r .samples)" \
                lost "$(echo "$out" | jq -r .lost)" p50_us "$(echo "$out" | jq -r '.p50_us // "nan"')" \
                p99_us "$(echo "$out" | jq -r '.p99_us // "nan"')" p999_us "$(echo "$out" | jq -r '.p999_us // "nan"')"
            log "$sw phase $ph latency: $(echo "$out" | jq -c '{samples, lost, p50_us, p99_us}'); neighbours $nb Mpps"
        fi
    done
    [ -z "${SRV_PID:-}" ] || stop_pid "$SRV_PID"
    SRV_PID=
    tp stop
    stop_testpmd
    case $sw in ovs-*) stop_ovs ;; *) stop_pid "$SW_PID" ;; esac
}

mkdir -p "$OUTDIR"
STAMP=$(date +%Y%m%d-%H%M%S)
log "$(uptime | sed 's/^ *//'); ${SECS} s per phase; purchases $PURCHASES of $CAP_MBIT Mbit/s; TSC $TSC_HZ Hz"
for sw in "${RATE_LIST[@]}"; do run_one rate "$sw"; done
for sw in "${LAT_LIST[@]}"; do run_one latency "$sw"; done
MD=$OUTDIR/lab-c2qos-real-$STAMP.md
touch "$TMP/rows.jsonl"
jq -s --arg date "$(date -u '+%Y-%m-%d %H:%M UTC')" --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg command "scripts/lab-c2qos-real.sh -t $SECS -s '$RATE_RUNS' -l '$LAT_RUNS' -c $CAP_MBIT -p $PURCHASES -f $VM1_PCT -H $TSC_HZ" \
    --arg purchases "$PURCHASES" --arg capacity "$CAP_MBIT" \
    '{date: $date, commit: $commit, command: $command, capacity_mbit: ($capacity | tonumber),
      purchases_mbit: ($purchases | split(",") | map(tonumber)), rows: .}' \
    "$TMP/rows.jsonl" >"${MD%.md}.json"
{
    echo "# C2QoS Fig. 6 on a real load, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "\`scripts/lab-c2qos-real.sh -t $SECS -s '$RATE_RUNS' -l '$LAT_RUNS' -c $CAP_MBIT -p $PURCHASES -f $VM1_PCT -H $TSC_HZ\`;"
    echo "$(nproc) CPUs, load before: $(cut -d' ' -f1-3 /proc/loadavg). Phase 1: VM1 alone; 2: neighbours greedy 1514 B; 3: greedy 64 B."
    if [ ${#ROWS[@]} -gt 0 ]; then
        echo
        echo "| switch | phase | VM1 sent Mbit/s | VM1 delivered Mbit/s | VM1 loss % | kept % of phase 1 | neighbours forwarded Mpps | switch read/dropped frames per port | core busy % | busy cycles/frame | switch CPU % | load |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
        printf '%s\n' "${ROWS[@]}"
    fi
    if [ ${#LROWS[@]} -gt 0 ]; then
        echo
        echo "| switch | phase | probe samples | lost | p50 µs | p99 µs | p99.9 µs | neighbours forwarded Mpps | core busy % | switch CPU % | load |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|"
        printf '%s\n' "${LROWS[@]}"
    fi
} >"$MD"
echo
cat "$MD"
log "Markdown: $MD; JSON: ${MD%.md}.json"
