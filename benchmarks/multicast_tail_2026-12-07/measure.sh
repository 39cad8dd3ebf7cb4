#!/bin/bash
# The multicast's tail speed-up (roots pace for the roots not yet done once they are K or
# fewer), A/B against the code before it, alternating invocation by invocation.
# usage (root, repository root): BEFORE=/path/to/worktree/of/the/base/src bash benchmarks/multicast_tail_2026-12-07/measure.sh [NETWORK...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${BEFORE:?set BEFORE to the src folder of a worktree of the commit before the change}"
declare -A networks=(
  [switch8_200m_roots8]="--hosts 8 --link 200mbit --roots 8"
  [switch4_200m_roots4]="--hosts 4 --link 200mbit --roots 4"
  [racks_1g_500m]="--hosts 8 --racks 2 --link 1gbit --uplink 500mbit -e 16M"
)
[ $# -gt 0 ] || set -- switch8_200m_roots8 switch4_200m_roots4
for net in "$@"; do
  for run in 1 2 3; do
    for variant in before after; do
      src=$([ "$variant" = before ] && echo "$BEFORE" || echo "$PWD/src")
      # shellcheck disable=SC2086
      PYTHONPATH=$src python -m commpress.cli bench --prefix mct --op all_gather -w 1 -n 5 \
        --mtu 9000 -b 4M -e 64M -f 4 --algorithm ring,multicast --codec none,int8 \
        ${networks[$net]} --json "$here/${net}_${variant}_$run.json" > "$here/${net}_${variant}_$run.txt" 2>&1
    done
  done
done
