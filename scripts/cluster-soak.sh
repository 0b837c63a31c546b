#!/usr/bin/env bash
# The aggregators on a real 3-member etcd for minutes (issue 24; docs/cluster.md, "Ten minutes
# on a real etcd"): HOSTS mock-switch vqosd agents (default 100) for SECS seconds (default
# 600), a leader and an etcd member killed on the way. Prints etcd's requests a second, its
# database size, the failover time and the largest excess over a tenant's max (must be 0).
#
#   scripts/cluster-soak.sh [-n HOSTS] [-s SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=100 secs=600
while getopts "n:s:h" o; do
    case $o in
        n) hosts=$OPTARG ;;
        s) secs=$OPTARG ;;
        *) sed -n '2,7p' "$0"; exit 2 ;;
    esac
done
command -v etcd >/dev/null || { echo "etcd not installed (apt-get install -y etcd-server)" >&2; exit 1; }
# Each daemon holds a few descriptors for its etcd connections, gRPC sessions and API.
ulimit -n "$(( $(ulimit -n) > 65536 ? $(ulimit -n) : 65536 ))" 2>/dev/null || true
VQOS_SOAK_HOSTS=$hosts VQOS_SOAK_SECS=$secs cargo test --release -p vqosd --test cluster_soak \
    -- --ignored --nocapture --test-threads 1
