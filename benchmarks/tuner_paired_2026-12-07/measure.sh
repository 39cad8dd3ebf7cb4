#!/usr/bin/env bash
# The tuner's choices against every algorithm, interleaved (issue 14): this VM's codec
# speeds and calibration rows, the fit, then the paired runs on 4 hosts (one switch) and
# 8 hosts in 2 racks, each twice. Root; nothing else running. About 30 minutes.
# Usage: measure.sh [DIR] (default: this folder; another DIR for a later run).
set -euo pipefail
S=benchmarks/tuner_paired_2026-12-07
D=${1:-$S}
mkdir -p "$D"
commpress codecs --codec none,int8 --json $D/codecs.json > $D/codecs.txt
C="--prefix cptc -b 1M -e 64M -f 4 -n 10 -w 2"
commpress bench $C --hosts 4 --link 1gbit --op all_gather --algorithm native,ring,backend \
  --codec int8 --json $D/calib_4hosts_all_gather.json > $D/calib_4hosts_all_gather.txt
commpress bench $C --hosts 4 --link 1gbit --op reduce_scatter --algorithm native,ring,alltoall \
  --codec int8 --json $D/calib_4hosts_reduce_scatter.json > $D/calib_4hosts_reduce_scatter.txt
R="--hosts 8 --racks 2 --link 1gbit --uplink 500mbit"
commpress bench $C -n 5 $R --op all_gather --algorithm native,ring,backend \
  --codec int8 --json $D/calib_8racks_all_gather.json > $D/calib_8racks_all_gather.txt
commpress bench $C -n 5 $R --op reduce_scatter --algorithm native,ring,alltoall \
  --codec int8 --json $D/calib_8racks_reduce_scatter.json > $D/calib_8racks_reduce_scatter.txt
commpress sim --calibrate $D/calib_*.json --codec-speeds $D/codecs.json --save-fit $D/fit.json \
  > $D/fit.txt
for run in 1 2; do
  python $S/paired.py --hosts 4 --link 1gbit --rounds 20 --tune-fit $D/fit.json \
    --json $D/paired_4hosts_run$run.json > $D/paired_4hosts_run$run.md
  python $S/paired.py $R --rounds 12 --tune-fit $D/fit.json \
    --json $D/paired_8racks_run$run.json > $D/paired_8racks_run$run.md
done
