#!/bin/bash
# The 2-host all-gather of torch under other queue settings of each host's sending shaper (tbf
# latency 50 ms = the default, 5 ms, 10 ms) and with TCP buffers of 32 MB (big); every
# variant on the same cluster, alternated. Run as root from the repository root:
#   bash benchmarks/two_ranks_2026-11-27/queue_variants.sh 2 2097152 2 q50 q5 q10 big
# usage: queue_variants.sh HOSTS NUMEL ROUNDS VARIANTS...  (cluster prefix qx; the commpress
# CLI on PATH)
set -u
H=$1; N=$2; R=$3; shift 3
commpress cluster up --hosts $H --link 1gbit --prefix qx >/dev/null
trap 'commpress cluster down --prefix qx >/dev/null' EXIT
setv() {
  case $1 in
    q50) lat=50ms; wmem="4096 16384 4194304"; rmem="4096 131072 6291456";;
    q5) lat=5ms; wmem="4096 16384 4194304"; rmem="4096 131072 6291456";;
    q10) lat=10ms; wmem="4096 16384 4194304"; rmem="4096 131072 6291456";;
    big) lat=50ms; wmem="4096 16384 33554432"; rmem="4096 131072 33554432";;
  esac
  for h in $(seq 0 $((H-1))); do
    tc -n qx-h$h qdisc change dev eth0 root handle 1: tbf rate 1000000000bit burst 125000 latency $lat
    ip netns exec qx-h$h sysctl -q -w net.ipv4.tcp_wmem="$wmem" net.ipv4.tcp_rmem="$rmem"
  done
}
for r in $(seq 1 $R); do
  for v in "$@"; do
    setv $v
    echo "== round $r variant $v: $(NUMEL=$N commpress launch --prefix qx -- python benchmarks/tuner_2026-11-26/two_hosts_transfer.py 2>&1 | grep -E ' ms$|Tcp' | sed 's/h.r.| //' | tr '\n' ' ')"
  done
done
