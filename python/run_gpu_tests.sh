#!/usr/bin/env bash
# Runs the Python package's tests (all of python/tests: host, NVRTC, GPU and collectives) and its examples
# on a machine with 2 GPUs, torch and cupy, from a checkout whose build/ was made by `make` (no Rust needed):
# the package runs from python/ (PYTHONPATH) and loads build/lib/libmscclpp.so.0 and build/include.
# pytest is the machine's, or else installed offline from build/python-wheels (made by `make`).
#
# Prints the tests' PASS/FAIL/SKIP lines, one line per example (`PASS name (T s)` / `FAIL name (why)`,
# with its output), and ends with `python gpu: N passed, N failed, N skipped`. Logs go to
# $PY_GPU_LOG_DIR (default build/python-gpu-logs). Exits non-zero if anything failed. With fewer than 2
# GPUs it says that it skipped and exits 0. PYTHON names the interpreter (default python3).
#
# MSCCLPP_TEST_MIN_GPUS=1 lets it run on one GPU: the collectives' tests and example then run with both
# ranks on that GPU (rank r uses GPU r % GPUs); what needs two GPUs (python/tests/test_gpu.py, the
# ping-pong, put and all-gather examples) is skipped, and listed as skipped.
#
# To split the run over separate calls: PY_GPU_PARTS="tests" or "examples" (default both; a part left out
# is named in a note), and PY_GPU_TESTS the pytest paths of the tests part (default python/tests), e.g.
# PY_GPU_TESTS="python/tests/test_gpu.py".
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=../scripts/gpu-env.sh
source scripts/gpu-env.sh
# "shared": with MSCCLPP_TEST_MIN_GPUS=1, one GPU is enough (shared_gpu=1 then); a gpu-env.sh without that
# argument ignores it and keeps asking for two.
require_gpus "python gpu tests" shared
one_gpu=${shared_gpu:-0}
if [ "$one_gpu" = 1 ]; then
  echo "python gpu tests: 1 GPU and MSCCLPP_TEST_MIN_GPUS=1: the collectives run with both ranks on it;" \
    "skipped: python/tests/test_gpu.py (pytest lists it) and the examples ping_pong_cupy, ping_pong_cupy_direct," \
    "bidir_put_torch, allgather_torch_mp, allgather_torch_mp_4ranks (2 GPUs each)"
  export MSCCLPP_TEST_MIN_GPUS  # for python/tests/test_collectives_gpu.py
fi

py=${PYTHON:-python3}
log_dir="${PY_GPU_LOG_DIR:-build/python-gpu-logs}"
mkdir -p "$log_dir"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
passed=0
failed=0
skipped=0

if ! "$py" -c 'import mscclpp; print("mscclpp from", mscclpp.__file__, "library", mscclpp.library_path())'; then
  echo "FAIL the package does not import (is build/lib/libmscclpp.so.0 there? run make where Rust is)"
  echo "python gpu: 0 passed, 1 failed, 0 skipped"
  exit 1
fi
"$py" - <<'PY'
import importlib
for name in ("torch", "cupy", "pytest"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{name}: not importable ({e})")
PY

if ! "$py" -c 'import pytest' 2>/dev/null; then
  target=build/python-gpu-lib
  if "$py" -m pip install --quiet --disable-pip-version-check --no-index --find-links build/python-wheels \
    --target "$target" pytest >"$log_dir/pip.log" 2>&1; then
    export PYTHONPATH="$PYTHONPATH:$root/$target"
    echo "pytest installed from build/python-wheels into $target"
  else
    echo "FAIL cannot install pytest from build/python-wheels (see $log_dir/pip.log; run make where there is network)"
    failed=$((failed + 1))
  fi
fi

parts=${PY_GPU_PARTS:-tests examples}
has_part() { [[ " $parts " == *" $1 "* ]]; }
for p in $parts; do
  [[ $p == tests || $p == examples ]] || { echo "FAIL PY_GPU_PARTS: '$p' is not tests or examples"; exit 2; }
done
for p in tests examples; do has_part "$p" || echo "note: part $p not run (PY_GPU_PARTS=$parts)"; done
read -r -a test_paths <<<"${PY_GPU_TESTS:-python/tests}"

# 1. The tests. -v lists every test's outcome, --durations the slowest; the conftest prints
# "python tests: N passed, N failed, N skipped".
if has_part tests && { "$py" -c 'import pytest' 2>/dev/null || [ -d build/python-gpu-lib ]; }; then
  log="$log_dir/pytest.log"
  echo "== pytest ${test_paths[*]} (log $log)"
  timeout -k 10 1500 "$py" -m pytest "${test_paths[@]}" -v -rs --durations=12 -p no:cacheprovider >"$log" 2>&1
  rc=$?
  grep -E '(PASSED|FAILED|SKIPPED|ERROR)' "$log" | grep -E '::' | sed -E 's/ +\[ *[0-9]+%\]//'
  grep -E '^SKIPPED' "$log"
  # The slowest tests (--durations), so that the tier's time can be planned.
  sed -n '/slowest [0-9]* durations/,/^$/p' "$log" | head -n 14
  line=$(grep -E '^python tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log" | tail -n 1)
  if [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    skipped=$((skipped + BASH_REMATCH[3]))
    if [ "$rc" -ne 0 ] && [ "${BASH_REMATCH[2]}" -eq 0 ]; then
      echo "FAIL pytest exited with $rc"
      failed=$((failed + 1))
    fi
  else
    echo "FAIL pytest ended without its summary (exit $rc); last lines:"
    tail -n 40 "$log" | sed 's/^/   /'
    failed=$((failed + 1))
  fi
  if [ "$rc" -ne 0 ]; then
    echo "-- failures (from $log):"
    sed -n '/= FAILURES =/,/short test summary/p' "$log" | tail -n 150 | sed 's/^/   /'
  fi
fi

# 2. The examples: each passes when it exits with 0 and printed "Succeed!". Each prints its timings.
base_port=${PY_EXAMPLE_BASE_PORT:-$((21000 + ($$ % 100) * 10))}
run_example() {
  local name=$1 limit=$2
  shift 2
  local log="$log_dir/$name.log" t0 t1 rc
  t0=$(date +%s.%N)
  { echo "\$ $*"; timeout -k 10 "$limit" "$@"; } >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local took
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 0 ] && grep -q '^Succeed!$' "$log"; then
    echo "PASS example $name (${took} s)"
    passed=$((passed + 1))
  else
    echo "FAIL example $name (exit $rc after ${took} s)"
    failed=$((failed + 1))
  fi
  sed 's/^/   /' "$log" | tail -n 40
}
# An example that needs 2 GPUs, on a machine that has one (MSCCLPP_TEST_MIN_GPUS=1): skipped, saying so.
run_2gpu_example() {
  if [ "$one_gpu" = 1 ]; then
    echo "SKIP example $1 (needs 2 GPUs; this machine has 1)"
    skipped=$((skipped + 1))
    return
  fi
  run_example "$@"
}
if has_part examples; then
  run_2gpu_example ping_pong_cupy 120 "$py" python/examples/ping_pong_cupy.py --port "$base_port"
  run_2gpu_example ping_pong_cupy_direct 120 "$py" python/examples/ping_pong_cupy.py --port "$((base_port + 1))" --direct
  run_2gpu_example bidir_put_torch 600 "$py" python/examples/bidir_put_torch.py --port "$((base_port + 2))"
  run_2gpu_example allgather_torch_mp 300 "$py" python/examples/allgather_torch_mp.py
  run_2gpu_example allgather_torch_mp_4ranks 300 "$py" python/examples/allgather_torch_mp.py --nranks 4 --iters 20
  # Two ranks, one per GPU or both on one (where NCCL cannot take part: the example says so and runs mscclpp).
  run_example allreduce_from_torch_distributed 300 "$py" python/examples/allreduce_from_torch_distributed.py \
    --port "$((base_port + 3))"
fi

echo "python gpu: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
