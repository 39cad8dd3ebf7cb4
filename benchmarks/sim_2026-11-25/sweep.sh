#!/usr/bin/env bash
# The measurements the cost model had none of: 2 hosts on one switch, and the
# point-to-point and backend algorithms on 8 hosts in 2 racks (1 Gbit/s hosts, 500 Mbit/s
# uplink). Run from the repository root as root; one sweep at a time (2 cores).
set -euo pipefail
out=benchmarks/sim_2026-11-25
common=(-b 1M -e 64M -f 4 -n 5 -w 1 --prefix cpsw)
commpress bench "${common[@]}" --hosts 2 --link 1gbit --op all_gather \
  --algorithm native,ring,ring-hop,backend --codec none,int8,int4 --json $out/bench_ag_2x1gbit.json
commpress bench "${common[@]}" --hosts 2 --link 1gbit --op reduce_scatter \
  --algorithm native,ring,ring-hop,alltoall --codec none,int8,int4 --json $out/bench_rs_2x1gbit.json
commpress bench "${common[@]}" --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --op all_gather \
  --algorithm native,ring,backend --codec int8,int4 --json $out/bench_ag_8x1gbit_racks.json
commpress bench "${common[@]}" --hosts 8 --racks 2 --link 1gbit --uplink 500mbit --op reduce_scatter \
  --algorithm native,ring,alltoall --codec int8,int4 --json $out/bench_rs_8x1gbit_racks.json
