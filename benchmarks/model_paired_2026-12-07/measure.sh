#!/usr/bin/env bash
# Every algorithm and codec interleaved (sweep.py), on 2 and 4 hosts on one switch and 8
# hosts in 2 racks behind 500 Mbit/s uplinks, twice each (run 1 fits the model, run 2 is
# held out); this VM's codec speeds. Root; nothing else running. About 25 minutes.
# Usage: measure.sh [DIR] (default: this folder; another DIR for a later run).
set -euo pipefail
S=benchmarks/model_paired_2026-12-07
D=${1:-$S}
mkdir -p "$D"
commpress codecs --codec none,int8,int4 --json $D/codecs.json > $D/codecs.txt
for run in 1 2; do
  python $S/sweep.py --hosts 2 --link 1gbit --json $D/sweep_2hosts_run$run.json > $D/sweep_2hosts_run$run.md
  python $S/sweep.py --hosts 4 --link 1gbit --json $D/sweep_4hosts_run$run.json > $D/sweep_4hosts_run$run.md
  python $S/sweep.py --hosts 8 --racks 2 --link 1gbit --uplink 500mbit \
    --json $D/sweep_8racks_run$run.json > $D/sweep_8racks_run$run.md
done
