#!/usr/bin/env bash
# The one row measure.sh left in doubt (4 hosts, 4 MiB, int8: 10.4 -> 12.9 ms, each
# invocation's median of 5 calls), again: six invocations a version of 30 calls each,
# alternated. Root; nothing else running. About 4 minutes. Usage: repeat.sh [DIR].
set -euo pipefail
S=benchmarks/multicast_send_2026-12-07
D=${1:-$S}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
declare -A COMMIT=([before]=cf32bc6 [after]=eb93221)
for version in before after; do
  mkdir -p "$W/$version"
  git archive "${COMMIT[$version]}" src | tar -x -C "$W/$version"
done
for run in 1 2 3 4 5 6; do
  for version in before after; do
    PYTHONPATH="$W/$version/src" python -m commpress bench --hosts 4 --link 1gbit -b 4M -e 4M \
      --algorithm ring,multicast --codec int8 -n 30 -w 2 \
      --json "$D/repeat_4hosts_4MiB_run${run}_${version}.json" > /dev/null 2>&1
  done
done
python - "$D" <<'PY'
import json, statistics, sys
from pathlib import Path
for version in ("before", "after"):
    times = {}
    for path in sorted(Path(sys.argv[1]).glob(f"repeat_4hosts_4MiB_run*_{version}.json")):
        for row in json.loads(path.read_text())["rows"]:
            times.setdefault(row["algorithm"], []).append(row["time_us"] / 1e3)
    print(version, {a: f"{statistics.median(t):.2f} ms of {[round(x, 2) for x in t]}" for a, t in times.items()})
PY
