#!/usr/bin/env bash
# The second run of the session, after the fixes the first found: every gpu-marked test
# again (two-rank gloo tests added), the two-rank table, the codecs' bits on CUDA against
# the CPU's, and the CPU-only unit and distributed tests under the machine's torch.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
here=benchmarks/gpu_2026-11-27
timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -p no:benchmark -n 12 -q -rfE \
  --timeout 150 --continue-on-collection-errors tests --junitxml "$OUT/gpu_tests2.xml" \
  > "$OUT/gpu_tests2.log" 2>&1
tail -n 25 "$OUT/gpu_tests2.log"
for probe in gloo_cuda:70 decode_bits:50; do
  limit=${probe#*:}; probe=${probe%:*}
  timeout "$limit" python3 "$here/probe.py" $probe > "$OUT/probe2_$probe.md" 2>&1
  cat "$OUT/probe2_$probe.md" | grep -v "^| ring\|^| backend\|^| alltoall" ; grep -c True "$OUT/probe2_$probe.md"
done
timeout 150 python3 -m pytest -m "not gpu" -p no:cacheprovider -p no:benchmark -n 14 -q \
  --timeout 100 tests/unit tests/distributed > "$OUT/cpu_suite_torch2_11.log" 2>&1
tail -n 25 "$OUT/cpu_suite_torch2_11.log"
