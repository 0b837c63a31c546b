#!/usr/bin/env bash
# Data-plane benchmark: unshaped throughput and CPU per Gbit/s of four switches, side by side in
# one run, on the same namespace topology: N "VM" namespaces → switch → one sink namespace.
#
#   bridge  Linux bridge, veth pairs (bridge-nf-call-* off in the switch namespace)
#   rr      vqosd, engine rr, capacity unlimited, TAP ports
#   vqos    vqosd, engine vqos enforcing 8 vifs' policies that do not bind the measured flows
#           (weights 1..8, floors of 100 Mbit/s on vm5..vm8, caps of 30 Gbit/s on the measured
#           vm1..vm4 and 1–2 Gbit/s on the others, priorities 0..7), capacity unlimited
#           (-C RATE: a capacity for this variant, e.g. 40Gbit, so the uplink bucket runs too)
#   rr-base, vqos-base  the same two with another vqosd binary (-B PATH): a build before a
#           change, side by side with the current one in one run; env BASE_UPLINK adds
#           [uplink] lines to these two only (e.g. BASE_UPLINK='queues = 1' -B the same binary)
#   rr-uring, vqos-uring  the same two with tap_io = "uring" (batched TAP reads and writes on
#           an io_uring instead of one system call per frame)
#   rr+afp, vqos+afp, rr-uring+afp, vqos-uring+afp  with -U afpacket: the same vqosd
#           switches with the uplink on an existing interface (`[uplink] kind = "af-packet"`:
#           one end of a veth pair in the switch namespace, attached through AF_PACKET, the other
#           end in the sink) instead of a TAP the switch makes and moves into the sink
#   ovs     Open vSwitch userspace datapath: ovs-vswitchd, datapath_type=netdev,
#           other_config:userspace-tso-enable=true, ports of type "tap"
#
# Cases, each with offloads on (TSO/GSO/GRO, the default) and off (`ethtool -K DEV tso off
# gso off gro off` on the VMs' and the sink's interfaces: 1514-byte frames through the switch):
#   1 stream      iperf3 -c SINK from vm1
#   4 streams     iperf3 -c SINK -P 4 from vm1
#   4 VMs         one iperf3 stream from each of vm1..vm4 at once (4 ready vifs)
# Per run: Gbit/s on the receiver side (iperf3 --json, end.sum_received, summed over clients),
# TCP retransmissions, and over the run's middle (from 1 s after the start to 1 s before the
# end): CPU of the switch process (utime+stime of /proc/PID/stat, all threads), softirq and
# all non-idle CPU of the machine (/proc/stat), in % of one core; and (switch + softirq) % of a
# core per Gbit/s. For the bridge there is no switch process: its work is in softirq and in the
# senders' system time (counted in "all CPUs").
#
# Run as root:  scripts/bench-dataplane.sh [-t SECONDS] [-n VMS] [-s bridge,rr,vqos,ovs]
#                                          [-U tap,afpacket] [-C CAPACITY] [-B VQOSD]
#                                          [-w MINUTES] [-o DIR]
#   -t  seconds per iperf3 run (default 8; ≥ 3)
#   -n  VM namespaces (default 8; ≥ 4: the vqos variant has one vif per VM)
#   -s  the switches to run, in this order (default bridge,rr,vqos,ovs)
#   -U  the uplinks of the vqosd switches (rr, vqos, rr-uring, vqos-uring), each run once per
#       uplink, side by side: tap (default) and/or afpacket (the switch named SWITCH+afp)
#   -C  capacity of the vqos variant (default unlimited)
#   -B  the vqosd binary of the rr-base and vqos-base switches (e.g. a copy built before a change)
#   -w  first wait until the 1-minute load average is below 1.0, re-checking every 2 minutes,
#       for at most MINUTES (then exit with status 3 without measuring)
#   -o  output directory (default lab-out/, gitignored): bench-dataplane-DATE.csv and .md, and
#       beside them vqosd's final `vqos stats --json` per engine and ovs-vswitchd's log
# VQOSD=PATH in the environment: the vqosd binary to measure (default target/release/vqosd).
# It installs iperf3, ethtool, jq and openvswitch-switch with apt-get if missing (without
# starting the system's OVS service), builds target/release/vqosd if missing, and runs every
# switch inside a namespace of its own: OVS with its database, sockets, pid and log files in a
# temporary directory, not the system service. On exit it kills only the processes it started
# (by PID), deletes its namespaces (and with them every link it made) and its temporary files.
set -euo pipefail

SECS=8
NVM=8
SWITCHES=bridge,rr,vqos,ovs
VQOS_CAPACITY=unlimited
WAIT_MIN=0
cd "$(dirname "$0")/.."
OUTDIR=lab-out
usage() {
    sed -n '/^# Run as root/,/^# It installs/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
BASE_VQOSD=
UPLINKS=tap
while getopts 't:n:s:U:C:B:w:o:h' opt; do
    case $opt in
        t) SECS=$OPTARG ;;
        n) NVM=$OPTARG ;;
        s) SWITCHES=$OPTARG ;;
        U) UPLINKS=$OPTARG ;;
        C) VQOS_CAPACITY=$OPTARG ;;
        B) BASE_VQOSD=$OPTARG ;;
        w) WAIT_MIN=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        *) usage ;;
    esac
done
case $SECS in '' | *[!0-9]*) usage ;; esac
case $NVM in '' | *[!0-9]*) usage ;; esac
case $WAIT_MIN in '' | *[!0-9]*) usage ;; esac
[ "$SECS" -ge 3 ] && [ "$NVM" -ge 4 ] && [ "$NVM" -le 99 ] || usage
IFS=, read -r -a SWITCH_LIST <<<"$SWITCHES"
IFS=, read -r -a UPLINK_LIST <<<"$UPLINKS"
for u in "${UPLINK_LIST[@]}"; do
    case $u in tap | afpacket) ;; *) echo "unknown uplink '$u'" >&2; usage ;; esac
done
# Every vqosd switch once per uplink, in the order given.
expanded=()
for s in "${SWITCH_LIST[@]}"; do
    case $s in
        rr | vqos | rr-uring | vqos-uring)
            for u in "${UPLINK_LIST[@]}"; do
                if [ "$u" = tap ]; then expanded+=("$s"); else expanded+=("$s+afp"); fi
            done
            ;;
        *) expanded+=("$s") ;;
    esac
done
SWITCH_LIST=("${expanded[@]}")
SWITCHES=$(IFS=,; echo "${SWITCH_LIST[*]}")
for s in "${SWITCH_LIST[@]}"; do
    case $s in
        bridge | rr | vqos | ovs | rr-uring | vqos-uring) ;;
        rr+afp | vqos+afp | rr-uring+afp | vqos-uring+afp) ;;
        rr-base | vqos-base)
            [ -x "$BASE_VQOSD" ] || { echo "switch '$s' needs -B with an executable vqosd" >&2; usage; }
            ;;
        *) echo "unknown switch '$s'" >&2; usage ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "bench-dataplane.sh: run as root (namespaces, TAPs, bridges)" >&2
    exit 1
fi

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
machine_lock

# --- tools -----------------------------------------------------------------------------------
tools=(iperf3 ethtool jq)
[[ ",$SWITCHES," != *,ovs,* ]] || tools+=(ovs-vswitchd:openvswitch-switch)
install_missing "${tools[@]}"

VQOSD=${VQOSD:-target/release/vqosd}
case ",$SWITCHES," in
    *,rr* | *,vqos*)
        if [ ! -x "$VQOSD" ]; then
            command -v cargo >/dev/null || PATH="$HOME/.cargo/bin:$PATH"
            log "building vqosd (release)"
            cargo build --release -q -p vqosd -p vqos-cli
        fi
        ;;
esac

# --- waiting for a quiet machine -------------------------------------------------------------
wait_quiet "$WAIT_MIN"

# --- names and cleanup -----------------------------------------------------------------------
topo_names vqb # unique per run
AFP_DEV="${P}a" # the switch's end of the veth pair of an AF_PACKET uplink (in SW_NS)
TMP=$(mktemp -d /tmp/vqos-bench-dp.XXXXXX)
PIDS=() # every process this script started, by PID
NSS=()  # every namespace it created
SWPID=  # the running switch's process (CPU measured), if any
OVSDB_PID=
SW_KIND=

cleanup() {
    trap - EXIT INT TERM
    if [ -S "$TMP/ovs/ovs-vswitchd.ctl" ]; then
        timeout 10 ovs-appctl -t "$TMP/ovs/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    fi
    topo_destroy
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One iperf3 server per concurrent client, for the whole run.
topo_create 4

# --- the switches ----------------------------------------------------------------------------
start_bridge() {
    bridge_up
    plug_all
    SWPID=
}

start_vqosd() { # rr | vqos | rr-base | vqos-base | rr-uring | vqos-uring, each maybe +afp
    local tag=$1 kind=${1%+afp} engine bin=$VQOSD cfg="$TMP/vqosd-$1.toml" i pol capacity=unlimited
    local uplink=tap
    [ "$kind" = "$tag" ] || uplink=afpacket
    engine=${kind%-base}
    [ "$kind" = "$engine" ] || bin=$BASE_VQOSD
    engine=${engine%-uring}
    [ "$kind" = "$engine-uring" ] && bin=$VQOSD
    [ "$engine" = vqos ] && capacity=$VQOS_CAPACITY
    {
        echo "capacity = \"$capacity\""
        echo "engine = \"$engine\""
        [ "$kind" = "$engine-uring" ] && echo 'tap_io = "uring"'
        echo "state_file = \"$TMP/state-$tag.json\""
        # The current build's TAPs would outlive it (a -B build may not know the key).
        [ "$bin" = "$VQOSD" ] && echo 'remove_taps_on_exit = true'
        echo '[api]'
        echo "socket = \"$TMP/vqosd-$tag.sock\""
        echo '[uplink]'
        if [ "$uplink" = afpacket ]; then
            echo "name = \"$AFP_DEV\""
            echo 'kind = "af-packet"'
        else
            echo "name = \"$SINK_DEV\""
            # BASE_UPLINK: [uplink] lines of the -base variants (e.g. 'queues = 1' beside the
            # default steered 4, with -B the same binary).
            case $kind in *-base) [ -z "${BASE_UPLINK:-}" ] || echo "$BASE_UPLINK" ;; esac
        fi
        for i in $(seq "$NVM"); do
            if [ "$engine" != vqos ]; then
                pol='{ weight = 1 }'
            elif [ "$i" -le 4 ]; then # the measured vifs: caps far above what they reach
                pol="{ weight = $i, max = \"30Gbit\", priority = $((i - 1)) }"
            else # the idle ones: a floor and a cap each
                pol="{ weight = $i, min = \"100Mbit\", max = \"$((1 + i % 2))Gbit\", priority = $(((i - 1) % 8)) }"
            fi
            printf '[[port]]\nname = "%s"\npolicy = %s\n' "$(vm_dev "$i")" "$pol"
        done
    } >"$cfg"
    if [ "$uplink" = afpacket ]; then
        # The sink's end ($SINK_DEV) is plugged into the sink below, like the TAP it replaces.
        ip -n "$SW_NS" link add "$AFP_DEV" type veth peer name "$SINK_DEV"
        ip netns exec "$SW_NS" sysctl -qw "net.ipv6.conf.$AFP_DEV.disable_ipv6=1"
    fi
    vqosd_up "$bin" "$cfg" "$TMP/vqosd-$tag.log"
    plug_all
}
stop_vqosd() { # SIGTERM: vqosd closes its TAPs (they vanish from the VMs)
    # Its counters (drops by reason, loop cycles) beside the results.
    [ -x target/release/vqos ] && target/release/vqos stats --json \
        --socket "$TMP/vqosd-$SW_KIND.sock" >"$OUTDIR/bench-dataplane-$STAMP-vqosd-$SW_KIND-stats.json" 2>&1 || true
    stop_pid "$SWPID" 10
    unplug_all
    ip -n "$SW_NS" link del "$AFP_DEV" 2>/dev/null || true
}

OVSDIR="$TMP/ovs"
vsctl() { ovs-vsctl --db="unix:$OVSDIR/db.sock" --timeout=30 "$@"; }
start_ovs() {
    local i dev n
    mkdir -p "$OVSDIR"
    # Everything of this OVS lives in $OVSDIR; the system's /etc/openvswitch, /var/run and
    # /var/log are not touched (the environment covers the defaults the options do not).
    export OVS_RUNDIR="$OVSDIR" OVS_DBDIR="$OVSDIR" OVS_LOGDIR="$OVSDIR" OVS_SYSCONFDIR="$OVSDIR"
    ovsdb-tool create "$OVSDIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ip netns exec "$SW_NS" ovsdb-server "$OVSDIR/conf.db" \
        --remote="punix:$OVSDIR/db.sock" \
        --pidfile="$OVSDIR/ovsdb-server.pid" --unixctl="$OVSDIR/ovsdb-server.ctl" \
        --log-file="$OVSDIR/ovsdb-server.log" >/dev/null 2>&1 &
    OVSDB_PID=$!
    PIDS+=("$OVSDB_PID")
    n=100
    until [ -S "$OVSDIR/db.sock" ]; do
        n=$((n - 1))
        [ "$n" -gt 0 ] || { log "ovsdb-server did not start"; cat "$OVSDIR/ovsdb-server.log" >&2; return 1; }
        sleep 0.1
    done
    vsctl --no-wait init
    # Read once at start: set before ovs-vswitchd runs.
    vsctl --no-wait set Open_vSwitch . other_config:userspace-tso-enable=true
    ip netns exec "$SW_NS" ovs-vswitchd "unix:$OVSDIR/db.sock" \
        --pidfile="$OVSDIR/ovs-vswitchd.pid" --unixctl="$OVSDIR/ovs-vswitchd.ctl" \
        --log-file="$OVSDIR/ovs-vswitchd.log" >/dev/null 2>&1 &
    SWPID=$!
    PIDS+=("$SWPID")
    vsctl add-br "${P}o" -- set bridge "${P}o" datapath_type=netdev
    for dev in "$SINK_DEV" $(for i in $(seq "$NVM"); do vm_dev "$i"; done); do
        vsctl add-port "${P}o" "$dev" -- set interface "$dev" type=tap
    done
    plug_all
    log "ovs: $(ovs-vswitchd --version | head -1), userspace TSO: $(grep -o 'Userspace TCP Segmentation Offloading support enabled' "$OVSDIR/ovs-vswitchd.log" >/dev/null && echo enabled || echo 'NOT enabled')"
}
stop_ovs() {
    timeout 10 ovs-appctl -t "$OVSDIR/ovs-vswitchd.ctl" exit --cleanup >/dev/null 2>&1 || true
    stop_pid "$SWPID" 5
    timeout 5 ovs-appctl -t "$OVSDIR/ovsdb-server.ctl" exit >/dev/null 2>&1 || true
    stop_pid "$OVSDB_PID" 5
    unset OVS_RUNDIR OVS_DBDIR OVS_LOGDIR OVS_SYSCONFDIR
    unplug_all
    ip -n "$SW_NS" link del "${P}o" 2>/dev/null || true
    ip -n "$SW_NS" link del ovs-netdev 2>/dev/null || true
    cp "$OVSDIR/ovs-vswitchd.log" "$OUTDIR/bench-dataplane-$STAMP-ovs-vswitchd.log" 2>/dev/null || true
    rm -rf "$OVSDIR"
}

start_switch() {
    SW_KIND=$1
    case $1 in
        bridge) start_bridge ;;
        rr | vqos | rr-base | vqos-base | rr-uring | vqos-uring | *+afp) start_vqosd "$1" ;;
        ovs) start_ovs ;;
    esac
}
stop_switch() {
    case $SW_KIND in
        bridge) bridge_down ;;
        rr | vqos | rr-base | vqos-base | rr-uring | vqos-uring | *+afp) stop_vqosd ;;
        ovs) stop_ovs ;;
    esac
    SWPID=
    SW_KIND=
}

# --- one measurement -------------------------------------------------------------------------
CLIENT_PIDS=()
clients() { # mode secs tag: start the iperf3 clients of a case (PIDs in CLIENT_PIDS)
    local mode=$1 secs=$2 tag=$3 k
    CLIENT_PIDS=()
    case $mode in
        1stream | 4streams)
            local par=1
            [ "$mode" = 4streams ] && par=4
            ip netns exec "$(vm_ns 1)" iperf3 -c "$SINK_IP" -p 5201 -P "$par" -t "$secs" -J \
                >"$TMP/$tag-1.json" 2>&1 &
            CLIENT_PIDS+=("$!")
            ;;
        4vms)
            for k in 1 2 3 4; do
                ip netns exec "$(vm_ns "$k")" iperf3 -c "$SINK_IP" -p $((5200 + k)) -t "$secs" -J \
                    >"$TMP/$tag-$k.json" 2>&1 &
                CLIENT_PIDS+=("$!")
            done
            ;;
    esac
}
warm_up() { # every VM's path learnt, ARP resolved, OVS flows installed
    local pid ok=1
    clients 4vms 1 warm
    PIDS+=("${CLIENT_PIDS[@]}")
    for pid in "${CLIENT_PIDS[@]}"; do wait "$pid" || ok=0; done
    forget "${CLIENT_PIDS[@]}"
    [ "$ok" = 1 ] || { log "warm-up failed on $SW_KIND:"; cat "$TMP"/warm-*.json >&2; return 1; }
}

CSV_HEADER="switch,case,offloads,tso_gso_gro,gbps,retransmits,switch_cpu_pct,softirq_pct,all_cpu_pct,switch_softirq_pct_per_gbps,all_cpu_pct_per_gbps,load1_before,seconds"
ROWS=()
measure() { # mode offloads(on|off)
    local mode=$1 off=$2 tag="$SW_KIND-$1-$2" pid a b gbps retr state f l1
    topo_offloads "$off"
    state=$(offload_state "$(vm_ns 1)" "$(vm_dev 1)")
    l1=$(load1)
    sleep 1
    clients "$mode" "$SECS" "$tag"
    PIDS+=("${CLIENT_PIDS[@]}")
    sleep 1
    a=$(snap)
    sleep $((SECS - 2))
    b=$(snap)
    for pid in "${CLIENT_PIDS[@]}"; do wait "$pid" || true; done
    forget "${CLIENT_PIDS[@]}"
    gbps=0
    retr=0
    for f in "$TMP/$tag"-*.json; do
        if ! jq -e '.end.sum_received.bits_per_second' "$f" >/dev/null 2>&1; then
            log "$tag: iperf3 failed: $(jq -r '.error // empty' "$f" 2>/dev/null || head -c 300 "$f")"
            gbps=nan
            continue
        fi
        [ "$gbps" = nan ] && continue
        gbps=$(jq -r --arg g "$gbps" '($g | tonumber) + .end.sum_received.bits_per_second / 1e9' "$f")
        retr=$(jq -r --arg r "$retr" '($r | tonumber) + (.end.sum_sent.retransmits // 0)' "$f")
    done
    local row
    row=$(awk -v a="$a" -v b="$b" -v hz="$HZ" -v g="$gbps" -v sw="$SW_KIND" -v m="$mode" \
        -v o="$off" -v st="$state" -v r="$retr" -v l1="$l1" -v has="${SWPID:+1}" -v secs="$SECS" '
        BEGIN {
            split(a, x, " "); split(b, y, " ")
            dt = (y[1] - x[1]) / 1e9
            pc = (y[2] - x[2]) / hz / dt * 100; si = (y[3] - x[3]) / hz / dt * 100
            all = (y[4] - x[4]) / hz / dt * 100
            swc = has ? sprintf("%.1f", pc) : "-"
            per = (g == "nan" || g <= 0) ? "nan" : sprintf("%.1f", ((has ? pc : 0) + si) / g)
            pall = (g == "nan" || g <= 0) ? "nan" : sprintf("%.1f", all / g)
            gs = (g == "nan") ? "nan" : sprintf("%.2f", g)
            printf "%s,%s,%s,%s,%s,%d,%s,%.1f,%.1f,%s,%s,%s,%d\n", sw, m, o, st, gs, r, swc, si, all, per, pall, l1, secs
        }')
    ROWS+=("$row")
    log "  $row"
}

# --- the run ---------------------------------------------------------------------------------
mkdir -p "$OUTDIR"
STAMP=$(date +%Y%m%d-%H%M%S)
CSV="$OUTDIR/bench-dataplane-$STAMP.csv"
MD="$OUTDIR/bench-dataplane-$STAMP.md"
log "$(uptime | sed 's/^ *//')"
log "$NVM VMs → switch → sink, ${SECS} s per run; switches: $SWITCHES; files in $TMP"
for sw in "${SWITCH_LIST[@]}"; do
    log "== $sw"
    start_switch "$sw"
    if warm_up; then
        for off in on off; do
            for mode in 1stream 4streams 4vms; do measure "$mode" "$off"; done
        done
    else
        for off in on off; do
            for mode in 1stream 4streams 4vms; do
                ROWS+=("$sw,$mode,$off,-,nan,0,-,-,-,nan,nan,$(load1),$SECS")
            done
        done
    fi
    stop_switch
done

{
    echo "$CSV_HEADER"
    printf '%s\n' "${ROWS[@]}"
} >"$CSV"

# Markdown: the runs, then the ratios the aims are about.
printf '%s\n' "${ROWS[@]}" | awk -F, -v cap="$VQOS_CAPACITY" '
    function label(s) {
        if (s == "bridge") return "Linux bridge"
        if (s == "rr") return "vqosd `rr`"
        if (s == "vqos") return "vqosd `vqos`, 8 policies" (cap == "unlimited" ? "" : ", " cap)
        if (s == "rr-base") return "vqosd `rr` (-B build)"
        if (s == "vqos-base") return "vqosd `vqos`, 8 policies (-B build)" (cap == "unlimited" ? "" : ", " cap)
        if (s == "ovs") return "OVS userspace (netdev, TSO)"
        if (s ~ /\+afp$/) { b = s; sub(/\+afp$/, "", b); return label(b) ", AF_PACKET uplink" }
        if (s ~ /-uring$/) { b = s; sub(/-uring$/, "", b); return label(b) ", io_uring TAP I/O" }
        return s
    }
    function cname(m) { return m == "1stream" ? "1 stream" : m == "4streams" ? "4 streams (-P 4)" : "4 VMs × 1 stream" }
    function ratio(a, b) { return (a == "" || b == "" || a == "nan" || b == "nan" || b == 0) ? "–" : sprintf("%.2f", a / b) }
    {
        n++; sw[n] = $1; m[n] = $2; o[n] = $3; st[n] = $4; g[n] = $5; rt[n] = $6; pc[n] = $7
        si[n] = $8; all[n] = $9; per[n] = $10; pall[n] = $11
        G[$1, $2, $3] = $5
        if (!($2 SUBSEP $3 in seen)) { seen[$2, $3] = 1; nc++; cm[nc] = $2; co[nc] = $3 }
    }
    END {
        print "| switch | case | offloads | Gbit/s | switch CPU % | softirq % | all CPUs % | (switch+softirq) % per Gbit/s | all CPU % per Gbit/s | retransmits |"
        print "|---|---|---|---|---|---|---|---|---|---|"
        for (i = 1; i <= n; i++)
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(sw[i]), cname(m[i]),
                (o[i] == "on" ? "on (TSO/GSO/GRO)" : "off (1514-byte frames)"), g[i], pc[i], si[i], all[i], per[i], pall[i], rt[i]
        print ""
        print "| case | offloads | rr / bridge | rr / OVS | vqos 8 policies / rr | rr / rr (-B build) | vqos / vqos (-B build) | rr AF_PACKET / TAP uplink | vqos AF_PACKET / TAP uplink |"
        print "|---|---|---|---|---|---|---|---|---|"
        for (i = 1; i <= nc; i++) {
            k = cm[i] SUBSEP co[i]
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", cname(cm[i]), co[i],
                ratio(G["rr", cm[i], co[i]], G["bridge", cm[i], co[i]]),
                ratio(G["rr", cm[i], co[i]], G["ovs", cm[i], co[i]]),
                ratio(G["vqos", cm[i], co[i]], G["rr", cm[i], co[i]]),
                ratio(G["rr", cm[i], co[i]], G["rr-base", cm[i], co[i]]),
                ratio(G["vqos", cm[i], co[i]], G["vqos-base", cm[i], co[i]]),
                ratio(G["rr+afp", cm[i], co[i]], G["rr", cm[i], co[i]]),
                ratio(G["vqos+afp", cm[i], co[i]], G["vqos", cm[i], co[i]])
        }
    }' >"$MD"
echo
cat "$MD"
echo
log "CSV: $CSV; Markdown: $MD; $(uptime | sed 's/^ *//')"
