#!/bin/bash
# Phase 4 of this folder: sweeps.sh's sweeps once more (repeat_*.json), tuner on fit_tuner.json,
# to see how far each row moves between invocations and whether the model errs less against
# the mean of two. Run as root from the repository root: bash benchmarks/model_2026-11-27/repeat.sh
set -euo pipefail
D=benchmarks/model_2026-11-27; F=$D/fit_tuner.json
for op in all_gather reduce_scatter; do
  A=native,ring,$([ $op = all_gather ] && echo backend || echo alltoall),auto
  commpress bench --prefix mcg --hosts 2 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec none,int8,int4 --tune-fit $F --json $D/repeat_2hosts_$op.json
  commpress bench --prefix mcg --hosts 4 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec none,int8,int4 --tune-fit $F --json $D/repeat_4hosts_$op.json
  commpress bench --prefix mcg --hosts 8 --racks 2 --link 1gbit --uplink 500mbit -b 1M -e 64M -f 4 -n 5 -w 2 \
    --op $op --algorithm $A --codec none,int8,int4 --tune-fit $F --json $D/repeat_8racks_$op.json
done
