#!/usr/bin/env bash
# The quick GPU tier (`make gpu-test-quick`): every GPU test program once, in its smallest meaningful
# configuration, on a machine with 2 GPUs, from a build/ made elsewhere (no compiler, no Rust needed). For a
# change's GPU check; `make gpu-test` (c-tests/run_gpu_tests.sh, which can be split into parts with
# GPU_TEST_PARTS: see its header) stays the full run.
#
# What runs (2 ranks, rank r on GPU r; no memcheck runs, no 4-, 8- or 16-rank runs, no kill modes but one
# rank_failure case), with each run's limit and the time it took on two H200s (the whole run: 59 s, MPS included):
#
#   run                                                 limit     took
#   p2p_methods 2 --quick                                 15 s      1 s
#   allgather_test 2 --quick (1 KiB, 1 MiB, 16 MiB)       15 s      1 s
#   bad_triggers 2                                        20 s      0 s
#   legacy_allgather 2 (where built)                      15 s      1 s
#   same_process_test (two_gpus, same_gpu)                20 s      1 s
#   rank_failure kill_pingpong 2                          15 s      3 s
#   legacy/rank_failure kill_pingpong 2 (where built)     15 s      3 s
#   -- under MPS from here (as in the full run), restarted after a failure --
#   collectives_test matrix_small 2                       15 s      1 s
#   collectives_test zerocopy_small 2                     15 s      0 s
#   nccl_gpu_test main 2                                  45 s     26 s
#   nccl_rma_test main 2                                  25 s      1 s
#   nccl_suspend_test 2                                   20 s      1 s
#   pg_nccl_sequence (2 ranks, grown to 3)                15 s      0 s
#   nccl_grow_test (2 ranks grown to 4)                   20 s      1 s
#   nccl_collconfig_test 2                                15 s      1 s
#   torch_on_our_nccl.py --nranks 2 (where torch imports) 60 s     14 s
#                                                        ------   ------
#                                                        345 s     55 s
#
# The limits sum to 345 s, so that even a run where every program hits its limit ends within 6 minutes
# (plus MPS's start and stop, and up to 10 s for a program that ignores the limit's SIGTERM). The limits are
# several times the times taken, so that a slower machine or a loaded one does not fail a run; the slowest,
# nccl_gpu_test main (121 cases), took 26 of its 45 s.
#
# Prints each program's PASS/FAIL/SKIP lines (run_program, scripts/gpu-env.sh) and ends with exactly
# `gpu quick tests: N passed, N failed` (N counts test cases, as the full runners do). A program of
# build/tests/gpu/ or build/tests/nccl-gpu/ missing from the list above is a failure (so that a new program
# is added here); a missing program of the list is one too, but for the legacy-header builds (made only
# where the 0.1.0 header was found) and torch (not installed), each a SKIP line. With fewer than 2 GPUs it
# says that it skipped and exits 0, counting nothing as passed. Logs go to $GPU_TEST_LOG_DIR (default
# build/test-logs/quick). PYTHON names the interpreter for torch (default python3).
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
log_dir="${GPU_TEST_LOG_DIR:-build/test-logs/quick}"

# shellcheck source=../scripts/gpu-env.sh
source scripts/gpu-env.sh
require_gpus "gpu quick tests"

mkdir -p "$log_dir"
passed=0
failed=0
start_all=$(date +%s)

# The programs, one line each: label, limit in seconds, program (under build/), its arguments. The first list
# runs with a GPU per rank and no MPS, the second under MPS. "legacy/" programs are built only where the 0.1.0
# header was found: a SKIP line where they are missing.
plain=(
  "p2p_methods_quick_2 15 tests/gpu/p2p_methods 2 --quick"
  "allgather_test_quick_2 15 tests/gpu/allgather_test 2 --quick"
  "bad_triggers_2 20 tests/gpu/bad_triggers 2"
  "legacy_allgather_2 15 tests/gpu/legacy_allgather 2"
  "same_process 20 tests/gpu/same_process_test two_gpus same_gpu"
  "rank_failure_kill_pingpong_2 15 tests/gpu/rank_failure kill_pingpong 2"
  "legacy_rank_failure_kill_pingpong_2 15 tests/gpu/legacy/rank_failure kill_pingpong 2"
)
under_mps=(
  "collectives_matrix_small_2 15 tests/gpu/collectives_test matrix_small 2"
  "collectives_zerocopy_small_2 15 tests/gpu/collectives_test zerocopy_small 2"
  "nccl_gpu_test_main_2 45 tests/nccl-gpu/nccl_gpu_test main 2"
  "nccl_rma_test_main_2 25 tests/nccl-gpu/nccl_rma_test main 2"
  "nccl_suspend_test_2 20 tests/nccl-gpu/nccl_suspend_test 2"
  "pg_nccl_sequence 15 tests/nccl-gpu/pg_nccl_sequence"
  "nccl_grow_test 20 tests/nccl-gpu/nccl_grow_test"
  "nccl_collconfig_test_2 15 tests/nccl-gpu/nccl_collconfig_test 2"
)
torch_limit=60

budget=$torch_limit
for line in "${plain[@]}" "${under_mps[@]}"; do
  read -r _ limit _ <<<"$line"
  budget=$((budget + limit))
done
echo "note: the quick tier: every GPU test program once, 2 ranks; limits sum to ${budget}s (the whole run took 59 s on two H200s)"

declare -A listed=()
run_line() {
  local label limit prog args
  read -r label limit prog args <<<"$1"
  listed["build/$prog"]=1
  if [[ "$prog" == */legacy* ]] && [ ! -x "build/$prog" ]; then
    echo "SKIP $label: build/$prog not built (the 0.1.0 header was not found at build time)"
    return
  fi
  # shellcheck disable=SC2086 # the arguments are words without spaces
  run_program "$label" "$limit" "build/$prog" $args
}

for line in "${plain[@]}"; do
  run_line "$line"
done

# The collectives and the NCCL face under MPS, as the full runners run them (two ranks have a GPU each here,
# but nccl_grow_test's four processes and pg_nccl_sequence's third share them). A failed program may leave
# the daemon refusing clients for a moment: it is started afresh then (mps_recover).
mps_start "the collectives and the NCCL face's programs"
for line in "${under_mps[@]}"; do
  before=$failed
  run_line "$line"
  [ "$failed" -eq "$before" ] || mps_recover
done

# PyTorch, unchanged, on our libnccl.so.2 by LD_PRELOAD (python/examples/torch_on_our_nccl.py), at 2 ranks; its
# own --timeout ends its ranks before this limit does.
py=${PYTHON:-python3}
lib=build/lib/nccl/libnccl.so.2
if [ ! -f "$lib" ]; then
  echo "FAIL torch_on_our_nccl_2: $lib is missing (not built)"
  failed=$((failed + 1))
elif ! why=$("$py" -c 'import torch, torch.distributed' 2>&1); then
  echo "SKIP torch_on_our_nccl_2: torch cannot be imported by $py ($(printf '%s' "$why" | tail -n 1))"
else
  run_program torch_on_our_nccl_2 "$torch_limit" env LD_PRELOAD="$root/$lib" "$py" \
    python/examples/torch_on_our_nccl.py --nranks 2 --timeout $((torch_limit - 10))
fi
mps_stop

# Every GPU test program built must be in the lists above.
while IFS= read -r prog; do
  if [ -z "${listed[$prog]:-}" ]; then
    echo "FAIL quick_coverage: $prog is not in c-tests/run_gpu_quick.sh's lists (add it in its smallest configuration)"
    failed=$((failed + 1))
  fi
done < <(find build/tests/gpu build/tests/nccl-gpu -maxdepth 2 -type f -perm -u+x 2>/dev/null | sort)

echo "-- the quick GPU tests took $(($(date +%s) - start_all))s (limits ${budget}s); logs in $log_dir"
echo "gpu quick tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
