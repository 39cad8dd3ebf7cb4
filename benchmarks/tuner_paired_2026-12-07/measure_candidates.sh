#!/usr/bin/env bash
# The tuner with every algorithm a candidate (ring-hop and multicast added to its defaults),
# on the fit of ../model_paired_2026-12-07 (which has rows of all of them), against every
# candidate interleaved: 4 hosts on one switch and 8 hosts in 2 racks, twice each. Root;
# nothing else running. About 15 minutes.
# Usage: measure_candidates.sh [DIR FIT] (default: this folder and that fit).
set -euo pipefail
S=benchmarks/tuner_paired_2026-12-07
D=${1:-$S}
F=${2:-benchmarks/model_paired_2026-12-07/fit.json}
mkdir -p "$D"
A=ring,ring-hop,backend,alltoall,multicast
for run in 1 2; do
  python $S/paired.py --hosts 4 --link 1gbit --rounds 12 --tune-fit $F --candidates $A \
    --json $D/every_4hosts_run$run.json > $D/every_4hosts_run$run.md
  python $S/paired.py --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --rounds 12 \
    --tune-fit $F --candidates $A --json $D/every_8racks_run$run.json > $D/every_8racks_run$run.md
done
