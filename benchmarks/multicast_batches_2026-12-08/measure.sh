#!/usr/bin/env bash
# The multicast before and after 9fc9ffb (a paced root waits for a batch's worth of allowance),
# as `commpress bench` runs it, the ring beside it in the same invocation: 2 and 4 hosts on
# one switch at 1 Gbit/s, 8 hosts in 2 racks behind 500 Mbit/s uplinks; 16 and 64 MiB; none
# and int8. Each version from `git archive` of its commit, alternated, three invocations each.
# Root; nothing else running. About 12 minutes.
# Usage: measure.sh [DIR] (default: this folder).
set -euo pipefail
S=benchmarks/multicast_batches_2026-12-08
D=${1:-$S}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$D"
declare -A COMMIT=([before]=5990dd3 [after]=9fc9ffb)
for version in before after; do
  mkdir -p "$W/$version"
  git archive "${COMMIT[$version]}" src | tar -x -C "$W/$version"
done
bench() {  # version, name, options...
  local version=$1 name=$2
  shift 2
  PYTHONPATH="$W/$version/src" python -m commpress bench "$@" -b 16M -e 64M -f 4 \
    --algorithm ring,multicast --codec none,int8 -n 5 -w 1 \
    --json "$D/${name}_${version}.json" > "$D/${name}_${version}.txt"
}
for run in 1 2 3; do
  for version in before after; do
    bench $version 2hosts_run$run --hosts 2 --link 1gbit
    bench $version 4hosts_run$run --hosts 4 --link 1gbit
    bench $version 8racks_run$run --hosts 8 --racks 2 --link 1gbit --uplink 500mbit
  done
done
python benchmarks/multicast_send_2026-12-07/summarize.py "$D" > "$D/summary.md"
