#!/usr/bin/env bash
# The whole GPU session in one command (device time is scarce): environment, the
# gpu-marked tests, then the probes. Every log goes to $OUT.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
here=benchmarks/gpu_2026-11-25
{ nvidia-smi -L; python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'numpy', numpy.__version__)"; uname -r; nproc; } 2>&1 | tee "$OUT/env.txt"
timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -n 8 -q -rA --timeout 240 \
  tests/gpu tests/unit/test_codec_kernels.py tests/distributed/test_lowrank.py \
  --junitxml "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
for probe in codecs fixed two_ranks; do
  timeout 80 python3 "$here/probe.py" $probe 2>&1 | tee "$OUT/probe_$probe.md" | tail -30
done
