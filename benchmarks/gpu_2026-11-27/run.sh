#!/usr/bin/env bash
# The second GPU session in one command (device time is scarce): environment, every
# gpu-marked test, then the probes. Every log goes to $OUT (seven files).
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
here=benchmarks/gpu_2026-11-27
{
  nvidia-smi -L
  python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'numpy', numpy.__version__)"
  uname -r; nproc; cc --version | head -1
  ip netns add cpgpuprobe && ip netns del cpgpuprobe && echo "network namespaces: yes"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 270 python3 -m pytest -m gpu -p no:cacheprovider -p no:benchmark -n 12 -q -rfE \
  --timeout 200 --continue-on-collection-errors tests --junitxml "$OUT/gpu_tests.xml" \
  > "$OUT/gpu_tests.log" 2>&1
tail -n 30 "$OUT/gpu_tests.log"
for probe in gloo_cuda:120 codec_calls:90 profile:60; do
  limit=${probe#*:}; probe=${probe%:*}
  timeout "$limit" python3 "$here/probe.py" $probe > "$OUT/probe_$probe.md" 2>&1
  tail -n 12 "$OUT/probe_$probe.md"
done
timeout 50 python3 benchmarks/gpu_2026-11-25/probe.py fixed > "$OUT/probe_fixed.md" 2>&1
cat "$OUT/probe_fixed.md"
