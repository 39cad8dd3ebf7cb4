#!/usr/bin/env bash
# The multicast before and after 9fc9ffb (a paced root waits for a batch's worth of
# allowance), as `commpress bench` runs it, the ring beside it in the same invocation: 2 and
# 4 hosts on one switch at 1 Gbit/s, 8 hosts in 2 racks behind 500 Mbit/s uplinks; 16 and
# 64 MiB; none and int8. Each version from `git archive` of its commit, alternated, three
# invocations each (the script of multicast_send_2026-12-07 with these commits). Root;
# nothing else running. About 12 minutes. Usage: measure.sh [DIR] (default: this folder).
set -euo pipefail
D=${1:-benchmarks/multicast_batches_2026-12-08}
BEFORE=5990dd3 AFTER=9fc9ffb FIRST=16M bash benchmarks/multicast_send_2026-12-07/measure.sh "$D"
