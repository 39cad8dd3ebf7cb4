#!/usr/bin/env bash
# The multicast all-gather before and after eb93221 (a root sends at most its bucket, then
# reads its socket again), as `commpress bench` runs it, with the ring beside it in the same
# invocation: 2 and 4 hosts on one switch at 1 Gbit/s, 8 hosts in 2 racks behind 500 Mbit/s
# uplinks; 4, 16 and 64 MiB; none and int8. Each version from `git archive` of its commit,
# alternated, three invocations each. Root; nothing else running. About 15 minutes.
# Usage: measure.sh [DIR] (default: this folder). Another pair of commits and the first
# size from the environment: BEFORE=C1 AFTER=C2 FIRST=16M measure.sh DIR.
set -euo pipefail
S=benchmarks/multicast_send_2026-12-07
D=${1:-$S}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$D"
declare -A COMMIT=([before]=${BEFORE:-cf32bc6} [after]=${AFTER:-eb93221})
for version in before after; do
  mkdir -p "$W/$version"
  git archive "${COMMIT[$version]}" src | tar -x -C "$W/$version"
done
bench() {  # version, name, options...
  local version=$1 name=$2
  shift 2
  PYTHONPATH="$W/$version/src" python -m commpress bench "$@" -b ${FIRST:-4M} -e 64M -f 4 \
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
python $S/summarize.py "$D" > "$D/summary.md"
