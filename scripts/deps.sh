#!/usr/bin/env bash
# What vqos needs from the system, in one place: the README's two commands (demo.sh, test.sh)
# and CI (.ci/run, through test.sh) all install from these lists, so a fresh machine of the
# stock kind (Debian packages and Rust) runs them without a manual step.
#
#   scripts/deps.sh build   # to compile: a C toolchain, protoc and its well-known types
#   scripts/deps.sh demo    # build + iperf3, iproute2 (scripts/demo.sh)
#   scripts/deps.sh test    # demo + everything the tests start for real (scripts/test.sh)
#
# As root, missing packages are installed with apt-get (no service they ship is started: a
# policy-rc.d that forbids it is in place for the install). As another user nothing is
# installed: a missing build dependency is an error naming the apt-get command, a missing test
# dependency a note (those tests skip with a message).
#
# Why a system protoc rather than a vendored one: the etcd-client crate compiles etcd's .proto
# files in its build script, which reads only `PROTOC` or the PATH. A crate such as
# protoc-bin-vendored cannot set another crate's build environment, and checking a protoc
# binary into the tree would ship an unaudited executable; Debian's package is one apt-get.
set -euo pipefail

# command:package pairs (a path instead of a command is tested with -e).
BUILD=(cc:build-essential protoc:protobuf-compiler
    /usr/include/google/protobuf/descriptor.proto:libprotobuf-dev)
DEMO=(iperf3:iperf3 ip:iproute2)
TEST=(ping:iputils-ping
    # DPDK's testpmd: the stand-in VM of the vhost-user tests (virtio-user, no hugepages).
    dpdk-testpmd:dpdk-dev
    # systemd-analyze verify checks the unit (scripts/verify-unit.sh); no systemd as PID 1.
    systemd-analyze:systemd
    # QEMU guests on vhost-user ports (TCG) and the guest image (scripts/guest-image.sh): a
    # static busybox and depmod; the kernel package is downloaded by the script itself.
    qemu-system-x86_64:qemu-system-x86 depmod:kmod
    # The lab's ovs baseline (a private ovsdb-server and ovs-vswitchd, userspace datapath).
    /usr/sbin/ovs-vswitchd:openvswitch-switch
    # OVS-DPDK, the C2QoS baseline of scripts/lab-c2qos-real.sh and its end-to-end test.
    /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk:openvswitch-switch-dpdk
    # A real etcd for the cluster agent's tests (started on loopback ports by the tests).
    etcd:etcd-server etcdctl:etcd-client
    # The CA and server certificate of the TLS etcd test.
    openssl:openssl
    # Real libvirt for crates/vqosd/tests/libvirt (a libvirtd of the test's own, private
    # directories) and virsh. libvirt-daemon-system, not just libvirt-daemon: Debian's libvirtd
    # runs QEMU as libvirt-qemu and refuses to start without that user, which it creates (its
    # services are not started: policy-rc.d, apt_install).
    /etc/libvirt/qemu.conf:libvirt-daemon-system virsh:libvirt-clients
    # promtool, which lints a real /metrics scrape (crates/vqosd/tests/metrics_doc.rs); the
    # package's prometheus service is not started (policy-rc.d, apt_install).
    promtool:prometheus
    # C2QoS Fig. 6(f)-(g)'s applications in the lab's VMs (crates/vqos-lab/src/app.rs): an FTP
    # server and nginx, each started by the lab in a VM's namespace with a config of its own
    # (the packages' services are not started: policy-rc.d), and wrk, the paper's load
    # generator; curl is the FTP client.
    /usr/sbin/vsftpd:vsftpd /usr/sbin/nginx:nginx-light wrk:wrk curl:curl)

have() { # command or path
    case $1 in
    /*) [ -e "$1" ] ;;
    *) command -v "$1" >/dev/null ;;
    esac
}

missing() { # command:package...: the packages of what is not here
    local a
    for a; do have "${a%%:*}" || printf '%s\n' "${a#*:}"; done
    # A dynamically linked busybox cannot run in the guest's initramfs.
    if [ "${WANT_STATIC_BUSYBOX:-}" = 1 ]; then
        { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || echo busybox-static
    fi
}

apt_install() { # packages...: without starting any service they ship
    local made_policy= rc=0
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -e /usr/sbin/policy-rc.d ]; then # invoke-rc.d: "101 = action forbidden"
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    echo "deps.sh: installing $*" >&2
    apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null; } ||
        rc=$?
    [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
    return "$rc"
}

main() {
    local want=() need=()
    case ${1:-} in
    build) want=("${BUILD[@]}") ;;
    demo) want=("${BUILD[@]}" "${DEMO[@]}") ;;
    test) want=("${BUILD[@]}" "${DEMO[@]}" "${TEST[@]}"); WANT_STATIC_BUSYBOX=1 ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; return 0 ;;
    *) echo "usage: $0 build|demo|test" >&2; return 2 ;;
    esac
    mapfile -t need < <(missing "${want[@]}")
    [ ${#need[@]} -gt 0 ] || return 0
    if [ "$(id -u)" -eq 0 ]; then
        apt_install "${need[@]}"
        return
    fi
    local build_need=()
    mapfile -t build_need < <(WANT_STATIC_BUSYBOX= missing "${BUILD[@]}")
    if [ ${#build_need[@]} -gt 0 ]; then
        echo "deps.sh: missing to build: ${build_need[*]}" >&2
        echo "deps.sh: run as root, or: sudo apt-get install ${build_need[*]}" >&2
        return 1
    fi
    echo "deps.sh: not root, not installing ${need[*]} (the tests that need them skip)" >&2
}

main "$@"
