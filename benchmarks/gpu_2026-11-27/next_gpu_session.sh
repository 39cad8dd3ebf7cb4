#!/usr/bin/env bash
# For the next session lent a GPU (about 5 minutes of device time, at most 8 by its
# timeouts, plus the machine's start; give the call a limit of 500 s): what changed after
# this session's last run and has not run on a GPU. Uses pytest-xdist and pytest-timeout
# where the device image has them (the last image had them in /opt/torch/.venv); without
# them the tests run one at a time under the shell's `timeout` alone. Every gpu-marked
# test (the rewritten two-rank stream tests and their broken variants, the FSDP2 adapters
# called synchronously, the corrected CUDA codec check, the codecs' compiled twins, the
# low-rank scheduler's hand-over, the multicast on CUDA where `ip` is; added 2026-12-06:
# checkpoints of a CUDA run loaded with map_location="cpu"/"cuda", the low-rank
# reducer's and the rounding streams', and bf16's saturation of fp16 on CUDA), then the per-call
# probes to compare with run 1 (run1_probe_codec_calls.md, run1_probe_fixed.md: same card
# kind for a comparison).
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
here=benchmarks/gpu_2026-11-27
# "-n K" and "--timeout S" only where their plugins are installed
workers() { python3 -c "import xdist" 2>/dev/null && echo "-n $1"; }
per_test() { python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout $1"; }
{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python3 -c "import xdist" && echo "pytest-xdist: yes"
  python3 -c "import pytest_timeout" && echo "pytest-timeout: yes"
  # tests/cluster/test_multicast_cuda.py runs only as root with ip and tc (else skipped)
  echo "uid $(id -u); ip: $(command -v ip || echo none); tc: $(command -v tc || echo none)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -p no:benchmark $(workers 12) -q -rfE \
  $(per_test 180) --continue-on-collection-errors tests --junitxml "$OUT/gpu_tests.xml" \
  > "$OUT/gpu_tests.log" 2>&1
tail -n 25 "$OUT/gpu_tests.log"
# the FSDP2 tests with a GPU visible (17 items of test_fsdp.py errored in their fixtures
# in run2_cpu_suite_torch2_11.log: the default mesh put the model on the GPU; they, the
# other FSDP tests and `commpress train` now name a CPU mesh)
timeout 120 python3 -m pytest -p no:cacheprovider $(workers 8) -q -rfE $(per_test 100) \
  tests/distributed/test_fsdp.py tests/distributed/test_fsdp_groups.py tests/distributed/test_wire_bytes.py \
  tests/unit/test_torch_private.py "tests/distributed/test_train.py::test_the_fsdp_demo_stays_on_the_cpu_where_a_gpu_is_visible" \
  > "$OUT/fsdp_gpu_visible.log" 2>&1
tail -n 15 "$OUT/fsdp_gpu_visible.log"
timeout 75 python3 "$here/probe.py" codec_calls > "$OUT/probe_codec_calls.md" 2>&1
cat "$OUT/probe_codec_calls.md"
timeout 45 python3 benchmarks/gpu_2026-11-25/probe.py fixed > "$OUT/probe_fixed.md" 2>&1
cat "$OUT/probe_fixed.md"
