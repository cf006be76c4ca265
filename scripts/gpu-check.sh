#!/usr/bin/env bash
# Runs everything that needs GPUs from a build/ made beforehand (`make` on any machine with cargo): the
# GPU tests, the examples and the benchmarks. Needs no cargo, no make and no compiler.
#
#   scripts/gpu-check.sh [LOG_DIR] [tests] [examples] [bench] [python]   (default: the first three)
#
# python: the Python package's tests and examples (python/run_gpu_tests.sh; needs torch and cupy).
#
# Ends with the summary line of each part; full logs go under LOG_DIR (default build/gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
logdir=${1:-build/gpu-logs}
shift || true
parts=${*:-tests examples bench}
mkdir -p "$logdir"
export GPU_TEST_LOG_DIR=$logdir/tests EXAMPLE_LOG_DIR=$logdir/examples BENCH_LOG_DIR=$logdir/bench \
  PY_GPU_LOG_DIR=$logdir/python
{
  date -u
  nvidia-smi -L
  nvidia-smi topo -m
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
} >"$logdir/machine.txt" 2>&1
head -n 3 "$logdir/machine.txt"

summaries=()
for part in $parts; do
  case $part in
    tests) script=c-tests/run_gpu_tests.sh ;;
    examples) script=examples-c/run_examples.sh ;;
    bench) script=examples-c/bench/run_bench.sh ;;
    python) script=python/run_gpu_tests.sh ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "=== $part: $script"
  start=$(date +%s)
  bash "$script" 2>&1 | tee "$logdir/$part.log"
  rc=${PIPESTATUS[0]}
  summaries+=("$part (exit $rc, $(($(date +%s) - start)) s): $(grep -E '[0-9]+ passed, [0-9]+ failed' "$logdir/$part.log" | tail -n 1)")
done
echo "=== summary"
printf '%s\n' "${summaries[@]}"
