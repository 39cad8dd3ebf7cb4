#!/usr/bin/env bash
# The third run: the FSDP2-related tests on the GPU machine's torch (2.11) after the fix of
# its parameter-group attribute, on the CPU (no GPU visible: the tests build CPU targets).
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
timeout 140 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -q --timeout 100 \
  -k "not zfp" tests/unit/test_torch_private.py tests/distributed/test_fsdp.py \
  tests/distributed/test_fsdp_groups.py tests/distributed/test_refusals.py \
  tests/distributed/test_wire_bytes.py > "$OUT/fsdp_torch2_11.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/fsdp_torch2_11.log" | cut -c1-250 | tail -30
