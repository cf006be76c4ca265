#!/usr/bin/env bash
# The NCCL face's GPU tests (issue 25), from a tree built by `make`:
# - build/tests/nccl-gpu/nccl_gpu_test (c-tests/nccl-gpu/nccl_gpu_test.cu: through nccl.h and libnccl.so.2
#   alone: every collective, send/receive, groups, graphs, refusals, a killed rank) at 2 and 4 ranks;
# - python/examples/torch_on_our_nccl.py: PyTorch, unchanged, on our libnccl.so.2 by LD_PRELOAD, 2 ranks,
#   checked against gloo (skipped, and said so, where torch cannot be imported).
# Rank r runs on GPU r % GPUs: with MSCCLPP_TEST_MIN_GPUS=1 one GPU is enough (every rank shares it), under
# MPS where nvidia-cuda-mps-control is installed (started and stopped here). c-tests/run_gpu_tests.sh runs
# this script too; alone it prints the lines of each program and ends with `nccl gpu tests: N passed, N failed`.
# Logs go to $GPU_TEST_LOG_DIR (default build/test-logs). PYTHON names the interpreter (default python3).
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
log_dir="${GPU_TEST_LOG_DIR:-build/test-logs}"
bin=build/tests/nccl-gpu/nccl_gpu_test
lib=build/lib/nccl/libnccl.so.2

# shellcheck source=../scripts/gpu-env.sh
source scripts/gpu-env.sh
require_gpus "nccl gpu tests" shared
mkdir -p "$log_dir"

passed=0
failed=0

# The caller (run_gpu_tests.sh) may have started MPS already; otherwise start it for these runs.
own_mps=0
if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
  mps_start "the NCCL face's tests"
  own_mps=$mps_on
fi
# A failed program may leave the daemon refusing clients for a moment (see mps_recover).
recover() { [ "$own_mps" = 1 ] && [ "$failed" -ne "$1" ] && mps_recover; }

for n in 2 4; do
  before=$failed
  # main (up to 900 s at 4 ranks on one GPU), then the two kill runs and initall.
  run_program "nccl_gpu_test_$n" 1500 "$bin" all "$n"
  recover "$before"
done

py=${PYTHON:-python3}
script=python/examples/torch_on_our_nccl.py
if [ ! -f "$lib" ]; then
  echo "FAIL torch_on_our_nccl: $lib is missing (not built)"
  failed=$((failed + 1))
elif ! why=$("$py" -c 'import torch, torch.distributed' 2>&1); then
  echo "SKIP torch_on_our_nccl: torch cannot be imported by $py ($(printf '%s' "$why" | tail -n 1))"
else
  # PyTorch unchanged: our library comes first by LD_PRELOAD, so NVIDIA's libnccl.so.2 is never loaded.
  run_program torch_on_our_nccl_2 300 env LD_PRELOAD="$root/$lib" "$py" "$script" --nranks 2
fi

[ "$own_mps" = 1 ] && mps_stop
echo "nccl gpu tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
