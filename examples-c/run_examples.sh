#!/usr/bin/env bash
# Runs every example (built into build/examples by `make examples`) on a machine with at least 2 GPUs.
# Prints one line per example, `PASS name (T s)` or `FAIL name (why; log)`, and ends with exactly
# `examples: N passed, N failed`. Full output of each example goes to $EXAMPLE_LOG_DIR (default
# build/example-logs). With fewer than 2 GPUs it says that the examples were skipped and exits 0.
# An example passes when it exits with 0 and printed "Succeed!".
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
bin_dir="${EXAMPLE_BIN_DIR:-build/examples}"
log_dir="${EXAMPLE_LOG_DIR:-build/example-logs}"

# shellcheck source=../scripts/gpu-env.sh
source scripts/gpu-env.sh
require_gpus "examples"

mkdir -p "$log_dir"

# A fresh bootstrap port per run: a port used a moment ago may still be in TIME_WAIT. The base is below
# the kernel's ephemeral range and differs between invocations of this script.
base_port=${EXAMPLE_BASE_PORT:-$((20000 + ($$ % 120) * 100))}

passed=0
failed=0

# run_example NAME LIMIT_SECONDS COMMAND...
run_example() {
  local name=$1 limit=$2
  shift 2
  local log="$log_dir/$name.log"
  if [ ! -x "$1" ]; then
    echo "FAIL $name ($1 is not built; run make examples)"
    failed=$((failed + 1))
    return
  fi
  local t0 t1 rc
  t0=$(date +%s.%N)
  { echo "\$ $*"; timeout -k 10 "$limit" "$@"; } >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  if [ "$rc" -eq 0 ] && grep -q '^Succeed!$' "$log"; then
    echo "PASS $name ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s)"
    passed=$((passed + 1))
    return
  fi
  local why
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why="timed out after ${limit}s"
  elif [ "$rc" -ne 0 ]; then
    why="exit code $rc"
  else
    why="exit code 0 but no \"Succeed!\""
  fi
  echo "FAIL $name ($why; log $log)"
  failed=$((failed + 1))
}

run_example ping_pong 80 "$bin_dir/01-ping-pong/gpu_ping_pong" --port $((base_port + 1))
run_example ping_pong_same_gpu 80 "$bin_dir/01-ping-pong/gpu_ping_pong" --same-gpu --port $((base_port + 2))
run_example ping_pong_mp 90 "$bin_dir/02-bootstrap/gpu_ping_pong_mp" --port $((base_port + 3))
run_example ping_pong_mp_unique_id 90 "$bin_dir/02-bootstrap/gpu_ping_pong_mp" --unique-id
run_example bidir_put 120 "$bin_dir/03-bidir-put/bidir_put" --port $((base_port + 4))
run_example mesh_2 90 "$bin_dir/mesh/mesh" 2 --port $((base_port + 5))
run_example mesh_4 90 "$bin_dir/mesh/mesh" 4 --port $((base_port + 6))
if want_8_ranks; then
  run_example mesh_8 90 "$bin_dir/mesh/mesh" 8 --port $((base_port + 7))
else
  echo "SKIP mesh_8 (8 GPUs needed, $n_gpus found; MSCCLPP_TEST_8_RANKS=1 runs it anyway)"
fi

echo "examples: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
