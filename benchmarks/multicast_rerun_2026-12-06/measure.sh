#!/usr/bin/env bash
# Issue 13's time rows again, three invocations each (medians by summarize.py): 8 hosts in
# 2 racks at 1 Gbit/s behind 500 Mbit/s uplinks (MTU 1500 and 9000), and one switch with
# every rank a root at once (4 and 8 hosts, MTU 9000). Run as root from the repository root.
set -euo pipefail
here=benchmarks/multicast_rerun_2026-12-06
bench() {  # NAME, then commpress bench arguments
  local name=$1; shift
  echo "== $name: commpress bench $*" >&2
  commpress bench --prefix mcb --op all_gather -w 1 -n 5 --algorithm ring,multicast \
    --codec none,int8 --json "$here/$name.json" "$@" > "$here/$name.txt"
}
for run in 1 2 3; do
  bench "racks_1g_500m_mtu1500_run$run" --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --mtu 1500 -b 4M -e 64M -f 2
  bench "racks_1g_500m_mtu9000_run$run" --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --mtu 9000 -b 4M -e 64M -f 2
  bench "switch4_1g_mtu9000_roots4_run$run" --hosts 4 --link 1gbit --mtu 9000 -b 4M -e 64M -f 4 --roots 4
  bench "switch8_1g_mtu9000_roots8_run$run" --hosts 8 --link 1gbit --mtu 9000 -b 4M -e 64M -f 4 --roots 8
done
