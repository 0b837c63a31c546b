#!/bin/bash
# Shows the kernel tbf behaviour behind the 15 s router stall (docs/experiments.md, fairness
# under policer): a frame queued under a burst B1 stays at the head for good after
# `tc qdisc change` shrinks the burst below its size, and everything behind it waits, until a
# change raises the burst again. Root; creates and removes two namespaces named after its PID.
set -e
A=lmA$$; B=lmB$$
trap 'ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null' EXIT
ip netns add $A; ip netns add $B
ip -n $A link add a0 type veth peer name b0 netns $B
ip -n $A link set a0 mtu 40000 up; ip -n $B link set b0 mtu 40000 up
ip -n $A addr add 10.9.9.1/24 dev a0; ip -n $B addr add 10.9.9.2/24 dev b0
ip netns exec $A ping -c1 -W1 10.9.9.2 >/dev/null   # ARP
tc -n $A qdisc add dev a0 root tbf rate 2mbit burst 45000 limit 200000
# 3 datagrams of 35 000 bytes: the first passes on the full bucket, the others queue.
for i in 1 2 3; do ip netns exec $A ping -c1 -W0.01 -s 35000 10.9.9.2 >/dev/null 2>&1 & done; sleep 0.05
echo "queued:"; tc -n $A -s qdisc show dev a0 | sed -n 2,3p
tc -n $A qdisc change dev a0 root tbf rate 2mbit burst 30000 limit 200000
sleep ${WAIT:-3}
echo "after change to burst 30000 and ${WAIT:-3} s (35 kB needs 140 ms at 2 Mbit/s):"; tc -n $A -s qdisc show dev a0 | sed -n 2,3p
tc -n $A qdisc change dev a0 root tbf rate 2mbit burst 45000 limit 200000
sleep 0.5
echo "after change back to burst 45000:"; tc -n $A -s qdisc show dev a0 | sed -n 2,3p
