# Helpers shared by the namespace benchmarks (bench-dataplane.sh, bench-cpu-tc.sh): sourced,
# never run. The sourcing script sets `set -euo pipefail` and, before calling them, PIDS=() (the
# processes it started), NSS=() (the namespaces it created) and SWPID (the measured switch
# process, or empty).
# shellcheck shell=bash

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
HZ=$(getconf CLK_TCK)

# Never beside a real-traffic test or another benchmark (the tests take the same lock,
# vqos_testkit::MACHINE_LOCK): they would share the two cores. Holds it on fd 9 until exit.
machine_lock() {
    exec 9>>/run/lock/vqos-real-traffic.lock
    flock 9
}

apt_install() { # packages...: without starting any service they ship
    local made_policy=
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -e /usr/sbin/policy-rc.d ]; then # invoke-rc.d: "101 = action forbidden"
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    log "installing $*"
    apt-get install -y -q "$@" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; } || {
        [ -n "$made_policy" ] && rm -f /usr/sbin/policy-rc.d
        return 1
    }
    [ -n "$made_policy" ] && rm -f /usr/sbin/policy-rc.d
    return 0
}

install_missing() { # command[:package]...: installs the packages of the commands not found
    local a need=()
    for a; do command -v "${a%%:*}" >/dev/null || need+=("${a#*:}"); done
    [ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
}

wait_quiet() { # minutes: until the 1-minute load average is below 1.0 (exit 3 after MINUTES)
    local deadline=$(($(date +%s) + $1 * 60))
    [ "$1" -gt 0 ] || return 0
    until awk -v l="$(load1)" 'BEGIN { exit !(l < 1.0) }'; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "load average still $(load1) after $1 min: not running (the machine is busy)"
            exit 3
        fi
        log "load average $(load1) ≥ 1.0: waiting 2 min"
        sleep 120
    done
}

stop_pid() { # pid [seconds]: SIGTERM, then SIGKILL if it has not gone
    local pid=$1 n=$((${2:-5} * 10))
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; forget "$pid"; return 0; }
    while kill -0 "$pid" 2>/dev/null && [ "$n" -gt 0 ]; do
        sleep 0.1
        n=$((n - 1))
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    forget "$pid"
}
forget() { # pids...: finished and reaped, so never signalled again (their PIDs may be reused)
    local p q keep=()
    for p in "${PIDS[@]}"; do
        for q in "$@"; do [ "$p" = "$q" ] && continue 2; done
        keep+=("$p")
    done
    PIDS=("${keep[@]}")
}
wait_all() { # pids...: wait for each (their status ignored), then forget them
    local p
    for p in "$@"; do wait "$p" || true; done
    forget "$@"
}

add_ns() { # name: created (and remembered in NSS for the cleanup), loopback up
    ip netns add "$1"
    NSS+=("$1")
    ip -n "$1" link set lo up
}
wait_link() { # ns dev: until it exists (5 s)
    local n=50
    until ip -n "$1" link show dev "$2" >/dev/null 2>&1; do
        n=$((n - 1))
        [ "$n" -gt 0 ] || { log "no $2 in $1"; return 1; }
        sleep 0.1
    done
}
set_offloads() { # on|off ns:dev...: TSO, GSO and GRO of each interface
    local a
    for a in "${@:2}"; do
        ip netns exec "${a%%:*}" ethtool -K "${a#*:}" tso "$1" gso "$1" gro "$1" >/dev/null 2>&1 || true
    done
}
offload_state() { # ns dev → what the interface really does: "tso/gso/gro"
    ip netns exec "$1" ethtool -k "$2" | awk -F': ' '
        /^tcp-segmentation-offload:/ { t = $2 } /^generic-segmentation-offload:/ { g = $2 }
        /^generic-receive-offload:/ { r = $2 }
        END { sub(/ .*/, "", t); sub(/ .*/, "", g); sub(/ .*/, "", r); print t "/" g "/" r }'
}

# CPU over an interval: `snap` before and after, `cpu_pct A B` → "switch softirq all", each in
# % of one core (switch: utime+stime of SWPID, all its threads; softirq and all non-idle CPU
# of the machine from /proc/stat).
snap() { # → "t_ns switch_ticks softirq_ticks busy_ticks"
    local t p=0
    t=$(date +%s%N)
    if [ -n "${SWPID:-}" ] && [ -r "/proc/$SWPID/stat" ]; then
        p=$(sed 's/^.*) //' "/proc/$SWPID/stat" | awk '{ print $12 + $13 }')
    fi
    awk -v t="$t" -v p="$p" '/^cpu / { print t, p, $8, $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}
cpu_pct() { # snap-before snap-after → "switch_pct softirq_pct all_pct"
    awk -v a="$1" -v b="$2" -v hz="$HZ" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        dt = (y[1] - x[1]) / 1e9
        printf "%.1f %.1f %.1f\n", (y[2] - x[2]) / hz / dt * 100, (y[3] - x[3]) / hz / dt * 100,
            (y[4] - x[4]) / hz / dt * 100
    }'
}
iperf_gbps() { # iperf3 --json file → received Gbit/s, or "nan" (the error logged)
    if jq -e '.end.sum_received.bits_per_second' "$1" >/dev/null 2>&1; then
        jq -r '.end.sum_received.bits_per_second / 1e9' "$1"
    else
        log "$1: iperf3 failed: $(jq -r '.error // empty' "$1" 2>/dev/null || head -c 300 "$1")"
        echo nan
    fi
}

# --- the namespace topology: NVM "VM" namespaces → a switch namespace → one sink namespace --------
# The sourcing script sets NVM, TMP and calls `topo_names PREFIX`, then `topo_create SERVERS`.
topo_names() { # prefix: the names of this run (interface names must fit in 15 bytes)
    P="$1$(($$ % 100000))"
    NET="10.$((200 + $$ % 50)).$((($$ / 50) % 250))"
    SINK_IP="$NET.254"
    SW_NS="${P}-sw"
    SINK_NS="${P}-sink"
    SINK_DEV="${P}u"
}
vm_ns() { echo "${P}-vm$1"; }
vm_dev() { echo "${P}v$1"; } # the VM's interface, whatever the switch
topo_create() { # servers: the namespaces and SERVERS iperf3 servers in the sink (ports 5201..)
    local i ns f
    add_ns "$SW_NS"
    add_ns "$SINK_NS"
    for i in $(seq "$NVM"); do add_ns "$(vm_ns "$i")"; done
    # A pure L2 bridge: no iptables on bridged frames (per-namespace sysctls; the host's untouched).
    for f in /proc/sys/net/bridge/bridge-nf-call-{iptables,ip6tables,arptables}; do
        [ ! -e "$f" ] || ip netns exec "$SW_NS" sh -c "echo 0 > $f"
    done
    # The VMs and the sink only talk to each other: ECN as in the lab.
    for ns in "$SINK_NS" $(for i in $(seq "$NVM"); do vm_ns "$i"; done); do
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_ecn=1
    done
    # Bound to no address: they outlive each switch's links.
    for i in $(seq "$1"); do
        ip netns exec "$SINK_NS" iperf3 -s -p $((5200 + i)) >"$TMP/server$i.log" 2>&1 &
        PIDS+=("$!")
    done
}
topo_destroy() { # every process started (PIDS) and namespace made (NSS)
    local pid ns
    for pid in "${PIDS[@]}"; do stop_pid "$pid" 3; done
    for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
plug() { # dev (in the switch namespace) ns address: move into ns, address it, up
    wait_link "$SW_NS" "$1"
    ip -n "$SW_NS" link set "$1" netns "$2"
    ip -n "$2" addr add "$3/24" dev "$1"
    ip -n "$2" link set "$1" up
}
plug_all() {
    local i
    plug "$SINK_DEV" "$SINK_NS" "$SINK_IP"
    for i in $(seq "$NVM"); do plug "$(vm_dev "$i")" "$(vm_ns "$i")" "$NET.$i"; done
}
unplug_all() { # links still in the VMs/sink (a switch that did not remove them on exit)
    local i
    ip -n "$SINK_NS" link del "$SINK_DEV" 2>/dev/null || true
    for i in $(seq "$NVM"); do ip -n "$(vm_ns "$i")" link del "$(vm_dev "$i")" 2>/dev/null || true; done
}
bridge_up() { # Linux bridge ${P}br in the switch namespace, veth pairs: ${P}x toward the sink,
    # ${P}wN toward vmN (their other ends not plugged yet)
    local br="${P}br" i d
    ip -n "$SW_NS" link add "$br" type bridge
    ip -n "$SW_NS" link set "$br" up
    ip -n "$SW_NS" link add "$SINK_DEV" type veth peer name "${P}x"
    for i in $(seq "$NVM"); do ip -n "$SW_NS" link add "$(vm_dev "$i")" type veth peer name "${P}w$i"; done
    for d in "${P}x" $(for i in $(seq "$NVM"); do echo "${P}w$i"; done); do
        ip -n "$SW_NS" link set "$d" master "$br"
        ip -n "$SW_NS" link set "$d" up
    done
}
bridge_down() {
    local i
    ip -n "$SW_NS" link del "${P}x" 2>/dev/null || true
    for i in $(seq "$NVM"); do ip -n "$SW_NS" link del "${P}w$i" 2>/dev/null || true; done
    ip -n "$SW_NS" link del "${P}br" 2>/dev/null || true
}
topo_offloads() { # on|off: TSO, GSO and GRO of the VMs' and the sink's interfaces
    local devs=("$SINK_NS:$SINK_DEV") i
    for i in $(seq "$NVM"); do devs+=("$(vm_ns "$i"):$(vm_dev "$i")"); done
    set_offloads "$1" "${devs[@]}"
}
vqosd_up() { # binary config log: vqosd in the switch namespace (SWPID) until it listens
    ip netns exec "$SW_NS" "$1" --config "$2" >"$3" 2>&1 &
    SWPID=$!
    PIDS+=("$SWPID")
    for _ in $(seq 100); do
        grep -q 'listening on' "$3" && break
        kill -0 "$SWPID" 2>/dev/null || break
        sleep 0.1
    done
    grep -q 'listening on' "$3" || { cat "$3" >&2; return 1; }
}
