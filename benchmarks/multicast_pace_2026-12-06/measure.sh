#!/usr/bin/env bash
# The multicast all-gather with --roots 3 on 4 hosts, before (b5c73b8: every root paced at
# rate/min(K, N-1) for the whole call) and after (each round's roots paced for themselves),
# and --roots 2 after as the reference; three invocations of each, interleaved. Root; run
# from anywhere; the "before" tree is a git worktree at /tmp/wt-before.
set -u
cd "$(dirname "$0")/../.."
out=benchmarks/multicast_pace_2026-12-06
[ -d /tmp/wt-before ] || git worktree add /tmp/wt-before b5c73b8 --detach -q
for i in 1 2 3; do
  for variant in before-k3 after-k3 after-k2; do
    tree=$PWD; [ "${variant%%-*}" = before ] && tree=/tmp/wt-before
    roots=${variant##*-k}
    PYTHONPATH=$tree/src python -m commpress.cli bench --prefix pcb --hosts 4 --link 200mbit --mtu 9000 \
      --op all_gather --algorithm multicast,ring --codec none -b 4M -e 64M -f 4 -w 1 -n 5 --roots "$roots" \
      --json "$out/pace_${variant}_$i.json" > "$out/pace_${variant}_$i.txt" 2>&1
    echo "$variant $i rc=$?"
  done
done
