#!/bin/bash
# Phase 1 of this folder: codec speeds and calibration sweeps on this VM (issue 14).
# Run as root from the repository root: bash benchmarks/model_2026-11-27/calibrate.sh
set -euo pipefail
D=benchmarks/model_2026-11-27
commpress codecs --json $D/codecs.json --markdown $D/codecs.md
for op in all_gather reduce_scatter; do
  A=native,ring,$([ $op = all_gather ] && echo backend || echo alltoall)
  commpress bench --prefix mcd --hosts 2 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec int8 --json $D/calib_2hosts_$op.json
  commpress bench --prefix mcd --hosts 4 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec int8 --json $D/calib_4hosts_$op.json
  commpress bench --prefix mcd --hosts 8 --racks 2 --link 1gbit --uplink 500mbit -b 1M -e 64M -f 4 -n 5 -w 2 \
    --op $op --algorithm $A --codec int8 --json $D/calib_8racks_$op.json
done
