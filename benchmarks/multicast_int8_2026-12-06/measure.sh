#!/usr/bin/env bash
# Issue 13's int8 rows on 2 racks again after the kernels of fd5ace8, as measure.sh of
# ../multicast_rerun_2026-12-06/ ran them (three invocations each; medians by its
# summarize.py, given this folder). Run as root from the repository root.
set -euo pipefail
here=benchmarks/multicast_int8_2026-12-06
bench() {  # NAME, then commpress bench arguments
  local name=$1; shift
  echo "== $name: commpress bench $*" >&2
  commpress bench --prefix mcb --op all_gather -w 1 -n 5 --algorithm ring,multicast \
    --codec int8 --json "$here/$name.json" "$@" > "$here/$name.txt"
}
for run in 1 2 3; do
  bench "racks_1g_500m_mtu1500_run$run" --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --mtu 1500 -b 4M -e 64M -f 2
  bench "racks_1g_500m_mtu9000_run$run" --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --mtu 9000 -b 4M -e 64M -f 2
done
