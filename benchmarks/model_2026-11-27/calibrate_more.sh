#!/bin/bash
# Phase 3 of this folder: calibration (int8) and sweeps (none, int8, int4) of the algorithms
# the first phases left out: ring-hop (both ops) and multicast (all-gather).
# Run as root from the repository root: bash benchmarks/model_2026-11-27/calibrate_more.sh calib|sweep
set -euo pipefail
D=benchmarks/model_2026-11-27
if [ "$1" = calib ]; then codecs=int8; name=calib; else codecs=none,int8,int4; name=sweep; fi
for op in all_gather reduce_scatter; do
  A=ring-hop$([ $op = all_gather ] && echo ,multicast || true)
  commpress bench --prefix mcf --hosts 2 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec $codecs --json $D/${name}_more_2hosts_$op.json
  commpress bench --prefix mcf --hosts 4 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec $codecs --json $D/${name}_more_4hosts_$op.json
  commpress bench --prefix mcf --hosts 8 --racks 2 --link 1gbit --uplink 500mbit -b 1M -e 64M -f 4 -n 5 -w 2 \
    --op $op --algorithm $A --codec $codecs --json $D/${name}_more_8racks_$op.json
done
