#!/usr/bin/env bash
# The alltoall reduce-scatter's all-to-all on gloo, point to point against gloo's own,
# on 2, 4 and 8 emulated hosts at 1 Gbit/s (root, nothing else running); then the same
# for the backend all-gather on 2 hosts.
set -euo pipefail
here=$(dirname "$0")
for hosts in 2 4 8; do
    python "$here/paired.py" "$hosts" 15 1048576 4194304 16777216 67108864 \
        > "$here/paired_${hosts}hosts.md"
done
# the backend all-gather on 2 hosts (point to point there only)
python "$here/paired.py" all_gather 2 15 1048576 4194304 16777216 67108864 \
    > "$here/paired_all_gather_2hosts.md"
