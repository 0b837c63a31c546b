#!/usr/bin/env bash
# vhost-user benchmark: one switch core between two "VMs", side by side in one run.
#
#   vqos-rr    vqosd, engine rr, busy polling, two vhost-user ports (vqosd listens)
#   vqos-8     vqosd, engine vqos enforcing 8 vifs' policies that do not bind (weights 1..8,
#              floors on the idle six, caps far above the measured two), busy polling
#   ovs        OVS-DPDK 3.1 (ovs-vswitchd-dpdk, private instance), dpdkvhostuserclient ports,
#              one PMD thread, flows in_port=1→2 and 2→1
#   ovs-trtcm  the same with a trtcm policer on both ports that does not bind (the C2QoS
#              paper's baseline)
#
# The "VMs": one dpdk-testpmd on CPU 0 with two virtio_user ports (DPDK's virtio PMD) in `mac`
# forwarding: `start tx_first BURSTS` puts BURSTS×32 frames per port in flight and each port
# sends what it receives to the other's MAC, so the frames circulate through the switch and
# the loop runs as fast as the slower of testpmd and the switch (testpmd back to back through
# DPDK's own vhost PMD does 9.6–23 Mpps here: ../shared/vhost-user-notes.md). The switch's
# forwarding thread runs alone on CPU 1 (vqosd: the whole process pinned; OVS: pmd-cpu-mask).
# Frames of 64 and 1518 bytes (testpmd --txpkts; mac forwarding keeps their size).
#
# Per run: Mpps and Gbit/s (frames and bytes testpmd received, both ports, over the run),
# and the switch's cycles per packet: vqosd's own rdtsc busy cycles per frame read
# (`vqos stats --json`, loops[0].busy_cycles), OVS's `pmd-stats-show` "avg processing cycles
# per packet". Results: lab-out/bench-vhost-DATE.md and .csv (and -ovs.log: OVS's own log).
#
# Run as root:  scripts/bench-vhost.sh [-t SECONDS] [-s vqos-rr,vqos-8,ovs,ovs-trtcm]
#                                      [-b BURSTS] [-r ROUNDS] [-o DIR] [-p]
#   -t  seconds per run (default 8)
#   -s  switches, in this order within each round (default all four)
#   -b  tx_first bursts per port (default 16: 512 frames per port in flight)
#   -r  rounds: the list is run this many times, interleaved (default 1)
#   -o  output directory (default lab-out/)
#   -p  packed rings: testpmd's virtio_user ports offer VIRTIO_F_RING_PACKED (packed_vq=1);
#       a switch that does not offer it serves split rings as without -p
# It installs dpdk-dev and openvswitch-switch-dpdk with apt-get if missing (no service is
# started), builds target/release/vqosd if missing, reserves 1024 2-MiB hugepages for OVS-DPDK
# and gives them back, and removes every process (by PID), socket, mount and directory it made.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=8
SWITCHES=vqos-rr,vqos-8,ovs,ovs-trtcm
BURSTS=16
ROUNDS=1
OUTDIR=lab-out
PACKED=0
usage() {
    sed -n '/^# Run as root/,/^# It installs/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while getopts 't:s:b:r:o:ph' opt; do
    case $opt in
        t) SECS=$OPTARG ;;
        s) SWITCHES=$OPTARG ;;
        b) BURSTS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        p) PACKED=1 ;;
        *) usage ;;
    esac
done
for n in "$SECS" "$BURSTS" "$ROUNDS"; do case $n in '' | *[!0-9]*) usage ;; esac; done
IFS=, read -r -a SWITCH_LIST <<<"$SWITCHES"
for s in "${SWITCH_LIST[@]}"; do
    case $s in vqos-rr | vqos-8 | ovs | ovs-trtcm) ;; *) echo "unknown switch '$s'" >&2; usage ;; esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-vhost.sh: run as root" >&2; exit 1; }
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

# Never beside a real-traffic test or another benchmark (vqos_testkit::MACHINE_LOCK).
exec 9>>/run/lock/vqos-real-traffic.lock
flock 9

need=()
command -v dpdk-testpmd >/dev/null || need+=(dpdk-dev)
command -v jq >/dev/null || need+=(jq)
[ -x /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk ] || need+=(openvswitch-switch-dpdk)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    own_policy=
    [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; own_policy=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null || {
        apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
    }
    [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
fi
VQOSD=${VQOSD:-target/release/vqosd}
VQOS=target/release/vqos
if [ ! -x "$VQOSD" ] || [ ! -x "$VQOS" ]; then
    log "building vqosd and vqos (release)"
    cargo build --release -q -p vqosd -p vqos-cli
fi

TMP=$(mktemp -d /tmp/vqos-bench-vhost.XXXXXX)
HUGE=$TMP/huge
PIDS=()
HUGE_BEFORE=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)
UPLINK_NS=vqbv$$
BR=vqbv$$br
cleanup() {
    local p
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    if [ -n "${OVSDIR:-}" ] && [ -d "$OVSDIR" ]; then
        timeout 5 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    fi
    ip netns del "$UPLINK_NS" 2>/dev/null || true
    mountpoint -q "$HUGE" && umount "$HUGE"
    echo "$HUGE_BEFORE" >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    rm -rf /var/run/dpdk/vqbv-* "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ip netns add "$UPLINK_NS"

stop_pid() { # pid: TERM, then KILL after 5 s
    local p=$1 i
    kill "$p" 2>/dev/null || return 0
    for i in $(seq 50); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
}

# --- testpmd (the two VMs) --------------------------------------------------------------------
# start_testpmd SOCK1 SOCK2 SERVER(0|1) FRAME_BYTES → TP_PID, TP_IN (fifo), TP_OUT (file)
start_testpmd() {
    local s1=$1 s2=$2 server=$3 bytes=$4 extra=
    [ "$server" = 1 ] && extra=",server=1"
    [ "$PACKED" = 1 ] && extra="$extra,packed_vq=1"
    TP_IN=$TMP/tp.in TP_OUT=$TMP/tp.out
    rm -f "$TP_IN"; mkfifo "$TP_IN"
    stdbuf -oL dpdk-testpmd --lcores 0@0,1@0 --no-pci --no-huge -m 1024 \
        --file-prefix "vqbv-$$" --log-level lib.eal:error \
        --vdev "net_virtio_user0,path=$s1,queues=1,queue_size=1024,mac=02:00:00:00:00:a1$extra" \
        --vdev "net_virtio_user1,path=$s2,queues=1,queue_size=1024,mac=02:00:00:00:00:a2$extra" \
        -- -i --forward-mode=mac --txpkts="$bytes" --total-num-mbufs=65536 --nb-cores=1 \
        --eth-peer=0,02:00:00:00:00:a2 --eth-peer=1,02:00:00:00:00:a1 \
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
# The last "Accumulated forward statistics": RX-packets and RX-bytes summed from the per-port
# blocks of `show port stats all`, which `measure` prints before and after.
port_rx() { # → "packets bytes" of both ports, from the last `show port stats all`
    awk '/NIC statistics for port/ { n++ } /RX-packets:/ { p[n] = $2; b[n] = $6 }
         END { print p[n-1] + p[n], b[n-1] + b[n] }' "$TP_OUT"
}

# --- vqosd ------------------------------------------------------------------------------------
start_vqosd() { # engine: rr | vqos → SW_PID, VQ_SOCK
    local engine=$1 cfg=$TMP/vqosd.toml i pol
    VQ_SOCK=$TMP/vqosd.sock
    {
        echo 'capacity = "unlimited"'
        echo "engine = \"$engine\""
        echo 'busy_poll = true'
        echo 'remove_taps_on_exit = true'
        echo "state_file = \"$TMP/state-$engine.json\""
        [ -z "${VQOSD_EXTRA:-}" ] || printf '%b\n' "$VQOSD_EXTRA"
        echo '[api]'
        echo "socket = \"$VQ_SOCK\""
        echo '[uplink]'
        echo "name = \"vqbv$$u\""
        for i in $(seq 8); do
            if [ "$engine" != vqos ]; then
                [ "$i" -le 2 ] || continue
                pol='{ weight = 1 }'
            elif [ "$i" -le 2 ]; then # the measured two: caps far above what they reach
                pol="{ weight = $i, max = \"400Gbit\", priority = $((i - 1)) }"
            else # idle ones, never connected: a floor and a cap each
                pol="{ weight = $i, min = \"100Mbit\", max = \"$((1 + i % 2))Gbit\", priority = $(((i - 1) % 8)) }"
            fi
            # testpmd forwards (mac mode): both ports send from one source IP, as a VNF does,
            # so they run without the guards above layer 2 (port_security = false).
            printf '[[port]]\nname = "vm%s"\nkind = "vhost-user"\nsocket = "%s"\nport_security = false\npolicy = %s\n' \
                "$i" "$TMP/vm$i.sock" "$pol"
        done
    } >"$cfg"
    rm -f "$TMP"/vm*.sock
    taskset -c 1 "$VQOSD" --config "$cfg" >"$TMP/vqosd.log" 2>&1 &
    SW_PID=$!
    PIDS+=("$SW_PID")
    for _ in $(seq 100); do [ -S "$VQ_SOCK" ] && [ -S "$TMP/vm2.sock" ] && break; sleep 0.1; done
    [ -S "$VQ_SOCK" ] || { cat "$TMP/vqosd.log" >&2; return 1; }
    ip link set "vqbv$$u" netns "$UPLINK_NS" 2>/dev/null || true
}
vqosd_cycles() { # → "busy_cycles frames_read" of the loop
    "$VQOS" stats --json --socket "$VQ_SOCK" 2>>"$TMP/vqos-stats.err" |
        jq -r '"\(.loops[0].busy_cycles) \([.ports[] | .rx_frames] | add)"' 2>>"$TMP/vqos-stats.err" ||
        { log "vqos stats failed: $(tail -2 "$TMP/vqos-stats.err")"; echo "0 0"; }
}

# --- OVS-DPDK ---------------------------------------------------------------------------------
start_ovs() { # trtcm: 0|1 → SW_PID, OVSDIR
    local trtcm=$1 vs
    OVSDIR=$TMP/ovs
    mkdir -p "$OVSDIR" "$HUGE"
    mountpoint -q "$HUGE" || mount -t hugetlbfs -o pagesize=2M nodev "$HUGE"
    echo 1024 >/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
    export OVS_RUNDIR=$OVSDIR OVS_LOGDIR=$OVSDIR OVS_DBDIR=$OVSDIR OVS_SYSCONFDIR=$OVSDIR
    ovsdb-tool create "$OVSDIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ovsdb-server "$OVSDIR/conf.db" --remote="punix:$OVSDIR/db.sock" --pidfile="$OVSDIR/ovsdb-server.pid" \
        --unixctl="$OVSDIR/ovsdb-server.ctl" --log-file="$OVSDIR/ovsdb-server.log" --detach --no-chdir
    PIDS+=("$(cat "$OVSDIR/ovsdb-server.pid")")
    vs() { ovs-vsctl --db="unix:$OVSDIR/db.sock" --timeout=60 "$@"; }
    vs --no-wait init
    vs --no-wait set Open_vSwitch . other_config:dpdk-init=true \
        other_config:dpdk-extra="--no-pci --file-prefix=vqbv-ovs-$$" \
        other_config:dpdk-hugepage-dir="$HUGE" other_config:dpdk-socket-mem=1024 \
        other_config:dpdk-socket-limit=1024 other_config:dpdk-lcore-mask=0x1 other_config:pmd-cpu-mask=0x2
    # In a namespace of its own: the netdev datapath's own TAPs (ovs-netdev, the bridge's
    # internal port) vanish with it. The vhost-user sockets are files: not affected.
    ip netns exec "$UPLINK_NS" /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk "unix:$OVSDIR/db.sock" --pidfile="$OVSDIR/ovs-vswitchd.pid" \
        --unixctl="$OVSDIR/ovs-vswitchd.ctl" --log-file="$OVSDIR/ovs-vswitchd.log" --detach --no-chdir
    SW_PID=$(cat "$OVSDIR/ovs-vswitchd.pid")
    PIDS+=("$SW_PID")
    vs add-br "$BR" -- set bridge "$BR" datapath_type=netdev
    vs add-port "$BR" vhu1 -- set Interface vhu1 type=dpdkvhostuserclient \
        options:vhost-server-path="$TMP/vm1.sock" ofport_request=1
    vs add-port "$BR" vhu2 -- set Interface vhu2 type=dpdkvhostuserclient \
        options:vhost-server-path="$TMP/vm2.sock" ofport_request=2
    if [ "$trtcm" = 1 ]; then # cir/eir in bytes/s, far above what one core forwards
        for p in vhu1 vhu2; do
            vs set port "$p" qos=@q -- --id=@q create qos type=trtcm-policer \
                other-config:cir=50000000000 other-config:cbs=2048000 \
                other-config:eir=50000000000 other-config:ebs=2048000 >/dev/null
        done
    fi
    ovs-ofctl del-flows "$BR"
    ovs-ofctl add-flow "$BR" in_port=1,actions=output:2
    ovs-ofctl add-flow "$BR" in_port=2,actions=output:1
}
stop_ovs() {
    timeout 10 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    stop_pid "$SW_PID"
    # Its log says which virtio features each port negotiated (VHOST_CONFIG lines).
    cat "$OVSDIR/ovs-vswitchd.log" >>"$OUTDIR/bench-vhost-$STAMP-ovs.log" 2>/dev/null || true
    timeout 5 ovs-appctl -t "$OVSDIR/ovsdb-server.ctl" exit >/dev/null 2>&1 || true
    unset OVS_RUNDIR OVS_DBDIR OVS_LOGDIR OVS_SYSCONFDIR
    rm -rf "$OVSDIR" /var/run/dpdk/vqbv-ovs-*
    OVSDIR=
}
ovs_cycles() { # → avg processing cycles per packet of the PMD
    ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" dpif-netdev/pmd-stats-show |
        awk -F: '/avg processing cycles per packet/ { gsub(/[^0-9.]/, "", $2); print $2; exit }'
}

# --- one measurement --------------------------------------------------------------------------
ROWS=()
measure() { # switch frame_bytes
    local sw=$1 bytes=$2 rx0 rx1 p b mpps gbps cpp c0 c1
    case $sw in
        vqos-rr) start_vqosd rr; start_testpmd "$TMP/vm1.sock" "$TMP/vm2.sock" 0 "$bytes" ;;
        vqos-8) start_vqosd vqos; start_testpmd "$TMP/vm1.sock" "$TMP/vm2.sock" 0 "$bytes" ;;
        ovs | ovs-trtcm)
            start_testpmd "$TMP/vm1.sock" "$TMP/vm2.sock" 1 "$bytes"
            sleep 2
            start_ovs "$([ "$sw" = ovs-trtcm ] && echo 1 || echo 0)"
            ;;
    esac
    sleep 4 # sessions up
    tp "start tx_first $BURSTS"
    sleep 2 # warm
    tp "show port stats all"; sleep 0.5
    rx0=$(port_rx)
    case $sw in vqos-*) c0=$(vqosd_cycles) ;; *) ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" dpif-netdev/pmd-stats-clear >/dev/null ;; esac
    local t0 t1
    t0=$(date +%s%N)
    sleep "$SECS"
    tp "show port stats all"; sleep 0.5
    t1=$(date +%s%N)
    rx1=$(port_rx)
    case $sw in
        vqos-*)
            c1=$(vqosd_cycles)
            cpp=$(awk -v a="$c0" -v b="$c1" 'BEGIN { split(a, x, " "); split(b, y, " ");
                f = y[2] - x[2]; if (f > 0) printf "%.0f", (y[1] - x[1]) / f }')
            ;;
        *) cpp=$(ovs_cycles | awk '{ printf "%.0f", $1 }') ;;
    esac
    read -r p b < <(awk -v a="$rx0" -v c="$rx1" 'BEGIN { split(a, x, " "); split(c, y, " "); print y[1] - x[1], y[2] - x[2] }')
    mpps=$(awk -v p="$p" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.2f", p / ((t1 - t0) / 1e9) / 1e6 }')
    # On-wire Gbit/s of the frames (testpmd's byte counters exclude the FCS: add 4 per frame).
    gbps=$(awk -v p="$p" -v b="$b" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.2f", (b + 4 * p) * 8 / ((t1 - t0) / 1e9) / 1e9 }')
    tp stop
    stop_testpmd
    case $sw in vqos-*) stop_pid "$SW_PID" ;; *) stop_ovs ;; esac
    ROWS+=("$sw,$bytes,$mpps,$gbps,${cpp:-nan},$(cut -d' ' -f1 /proc/loadavg)")
    log "$sw ${bytes}B: $mpps Mpps, $gbps Gbit/s, ${cpp:-?} cycles/packet"
}

mkdir -p "$OUTDIR"
STAMP=$(date +%Y%m%d-%H%M%S)
log "$(uptime | sed 's/^ *//'); ${SECS} s per run, $BURSTS bursts in flight per port, $ROUNDS round(s), $([ "$PACKED" = 1 ] && echo packed || echo split) rings offered"
for r in $(seq "$ROUNDS"); do
    for bytes in 64 1518; do
        for sw in "${SWITCH_LIST[@]}"; do measure "$sw" "$bytes"; done
    done
done
CSV=$OUTDIR/bench-vhost-$STAMP.csv
MD=$OUTDIR/bench-vhost-$STAMP.md
{ echo "switch,frame_bytes,mpps,gbps,cycles_per_packet,load1"; printf '%s\n' "${ROWS[@]}"; } >"$CSV"
printf '%s\n' "${ROWS[@]}" | awk -F, '
    function ratio(a, b, f) {
        if (!N[a, f] || !N[b, f] || M[b, f] <= 0) return "–"
        return sprintf("%.2f", (M[a, f] / N[a, f]) / (M[b, f] / N[b, f]))
    }
    { n++; sw[n] = $1; fb[n] = $2; m[n] = $3; g[n] = $4; c[n] = $5; l[n] = $6
      M[$1, $2] += $3; N[$1, $2]++ }
    END {
        print "| switch | frame | Mpps | Gbit/s | cycles/packet | load |"
        print "|---|---|---|---|---|---|"
        for (i = 1; i <= n; i++) printf "| %s | %s B | %s | %s | %s | %s |\n", sw[i], fb[i], m[i], g[i], c[i], l[i]
        print ""
        print "| frame | vqos-rr / ovs | vqos-8 / vqos-rr | ovs-trtcm / ovs | (mean Mpps of the rounds) |"
        print "|---|---|---|---|---|"
        split("64 1518", F, " ")
        for (k = 1; k <= 2; k++) {
            f = F[k]
            r = ratio("vqos-rr", "ovs", f); q = ratio("vqos-8", "vqos-rr", f); o = ratio("ovs-trtcm", "ovs", f)
            printf "| %s B | %s | %s | %s | |\n", f, r, q, o
        }
    }' >"$MD"
echo
cat "$MD"
log "CSV: $CSV; Markdown: $MD"
