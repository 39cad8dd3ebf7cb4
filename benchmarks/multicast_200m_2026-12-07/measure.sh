#!/usr/bin/env bash
# Issue 13's time rows at the rate the issue names for when 8 receivers on our 2 cores
# cannot keep up with 1 Gbit/s: 8 hosts in 2 racks, hosts 200 Mbit/s, uplinks 100 Mbit/s,
# MTU 1500 and 9000, three invocations each (medians by
# benchmarks/multicast_rerun_2026-12-06/summarize.py). Run as root from the repository root.
set -euo pipefail
here=benchmarks/multicast_200m_2026-12-07
bench() {  # NAME, then commpress bench arguments
  local name=$1; shift
  echo "== $name: commpress bench $*" >&2
  commpress bench --prefix mcb --op all_gather -w 1 -n 5 --algorithm ring,multicast \
    --codec none,int8 --json "$here/$name.json" "$@" > "$here/$name.txt"
}
for run in 1 2 3; do
  for mtu in 1500 9000; do
    bench "racks_200m_100m_mtu${mtu}_run$run" --hosts 8 --racks 2 --link 200mbit --uplink 100mbit --mtu $mtu -b 4M -e 64M -f 4
  done
done
