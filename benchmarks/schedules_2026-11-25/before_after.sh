#!/usr/bin/env bash
# Before/after the single executor, on 4 emulated hosts at 1 Gbit/s: each op at 64 MiB (int8,
# int4) and the 1 MiB all-gather (fixed cost). Usage: before_after.sh LABEL RUN...
# The committed results alternate the two versions run by run (each from its own venv):
#   for run in 1 2 3; do
#     (. /tmp/before-venv/bin/activate; bash before_after.sh before $run)   # commpress 75a6e3a
#     (. /work/venv/bin/activate; bash before_after.sh after $run)          # this commit
#   done
set -euo pipefail
label=$1
shift
case $label in /*) out=$label ;; *) out=$(dirname "$0")/$label ;; esac
mkdir -p "$out"
for run in "$@"; do
  for op in all_gather reduce_scatter; do
    commpress bench --hosts 4 --link 1gbit -b 64M -e 64M -n 5 -w 1 --op $op \
      --algorithm native,ring --codec int8,int4 --prefix cpba \
      --json "$out/${op}_64M_run$run.json" > "$out/${op}_64M_run$run.txt"
  done
  commpress bench --hosts 4 --link 1gbit -b 1M -e 1M -n 20 -w 2 --op all_gather \
    --algorithm native,ring --codec int8 --prefix cpba \
    --json "$out/all_gather_1M_run$run.json" > "$out/all_gather_1M_run$run.txt"
done
