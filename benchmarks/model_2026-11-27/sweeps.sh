#!/bin/bash
# Phase 2 of this folder: sweeps with codecs none, int8, int4 and the tuner on this folder's fit.
# Run as root from the repository root after validate.py fit: bash benchmarks/model_2026-11-27/sweeps.sh
# `sweeps.sh repeat` runs them again into repeat_*.json (phase 4), on the same fit_tuner.json.
# (The committed sweeps ran with --tune-fit $D/fit.json, before the copy was added; the same
# file. The repetition ran from a script of its own with --prefix mcg, since folded in here.)
set -euo pipefail
D=benchmarks/model_2026-11-27; F=$D/fit_tuner.json; NAME=${1:-sweep}
if [ "$NAME" = sweep ]; then
  cp $D/fit.json $F  # the fit of calib_*.json as it is now (validate.py fit rewrites fit.json later)
fi
for op in all_gather reduce_scatter; do
  A=native,ring,$([ $op = all_gather ] && echo backend || echo alltoall),auto
  commpress bench --prefix mce --hosts 2 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec none,int8,int4 --tune-fit $F --json $D/${NAME}_2hosts_$op.json
  commpress bench --prefix mce --hosts 4 --link 1gbit -b 1M -e 64M -f 4 -n 10 -w 2 --op $op \
    --algorithm $A --codec none,int8,int4 --tune-fit $F --json $D/${NAME}_4hosts_$op.json
  commpress bench --prefix mce --hosts 8 --racks 2 --link 1gbit --uplink 500mbit -b 1M -e 64M -f 4 -n 5 -w 2 \
    --op $op --algorithm $A --codec none,int8,int4 --tune-fit $F --json $D/${NAME}_8racks_$op.json
done
