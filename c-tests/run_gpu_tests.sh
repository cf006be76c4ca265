#!/usr/bin/env bash
# Runs the GPU test programs (built into build/tests/gpu) on a machine with at least 2 GPUs.
# Prints one line per test case (`PASS program: case ...` / `FAIL program: case: reason`) and ends with
# exactly `gpu tests: N passed, N failed`. Full logs go to $GPU_TEST_LOG_DIR (default build/test-logs).
# With fewer than 2 GPUs it prints that it skipped and exits 0 without counting anything as passed; with one
# GPU and MSCCLPP_TEST_MIN_GPUS=1 it runs the programs whose ranks may all share that GPU (collectives_test)
# and says which it skipped and why; then c-tests/run_nccl_gpu_tests.sh (NCCL's API). The collectives run
# under MPS, which this script starts and stops itself
# where nvidia-cuda-mps-control is installed (and says so where it is not).
#
# GPU_TEST_PARTS (space-separated; unset or empty: every part) runs some parts only, so that the full run can
# be split over separate calls, e.g. `make gpu-test GPU_TEST_PARTS="two-gpu exit-endless"`, then
# "collectives", "sanitizer", "nccl-2 nccl-4 nccl-sendrecv nccl-rma nccl-suspend nccl-pg-sequence nccl-grow
# nccl-collconfig", "nccl-torch nccl-sanitizer" (the parts' times have not been measured apart). The parts:
#   two-gpu          p2p_methods 2 and 4 (and 8), allgather_test 2 (and 8), bad_triggers 2, legacy_allgather 2,
#                    same_process_test, rank_failure all 2 and 4 on both headers, memcheck of p2p_methods 2
#                    --quick and of rank_failure all 2
#   collectives-2, collectives-4, collectives-8, collectives-16
#                    collectives_test's groups at that many ranks, under MPS
#   exit-endless     rank_failure exit_endless at 2 and 4 ranks, on both headers
#   sanitizer        collectives_test's small groups under memcheck (matrix_small, zerocopy_small,
#                    copyengine_small at 2 to 8 ranks)
#   nccl-...         the parts of c-tests/run_nccl_gpu_tests.sh (listed in its header): it runs when a word
#                    begins with "nccl"
# A word also takes every part that begins with it and a "-": "collectives" the four, "nccl" every NCCL part.
# Each part left out is named in a note; a word that names no part runs nothing (and fails nothing).
# c-tests/run_gpu_quick.sh (make gpu-test-quick) is the short tier: every program once, under 6 minutes.
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
bin_dir="${GPU_TEST_BIN_DIR:-build/tests/gpu}"
log_dir="${GPU_TEST_LOG_DIR:-build/test-logs}"

# shellcheck source=../scripts/gpu-env.sh
source scripts/gpu-env.sh
require_gpus "gpu tests" shared

mkdir -p "$log_dir"

passed=0
failed=0
start_all=$(date +%s)
# run_program, sanitized (compute-sanitizer's memcheck, outside MPS), mps_start and mps_stop: scripts/gpu-env.sh.

if [ "$shared_gpu" = 1 ]; then
  echo "note: $n_gpus GPU, MSCCLPP_TEST_MIN_GPUS=1: only programs whose ranks may all share one GPU run"
  echo "SKIP p2p_methods, allgather_test, bad_triggers, legacy_allgather, same_process, rank_failure (both builds)" \
    "and their compute-sanitizer runs: written and timed for a GPU per rank (2 GPUs), never run with every rank on one GPU"
elif part two-gpu; then
  run_program p2p_methods_2 130 "$bin_dir/p2p_methods" 2
  run_program allgather_test_2 130 "$bin_dir/allgather_test" 2
  run_program bad_triggers_2 110 "$bin_dir/bad_triggers" 2
  run_program legacy_allgather_2 90 "$bin_dir/legacy_allgather" 2
  run_program p2p_methods_4 180 "$bin_dir/p2p_methods" 4
  run_program same_process 120 "$bin_dir/same_process_test"
  # A rank killed, stopped or aborted, and a stuck wait: built on this header, and on the 0.1.0 header.
  run_program rank_failure_2 300 "$bin_dir/rank_failure" all 2
  run_program rank_failure_4 300 "$bin_dir/rank_failure" all 4
  if [ -x "$bin_dir/legacy/rank_failure" ]; then
    run_program legacy_rank_failure_2 300 "$bin_dir/legacy/rank_failure" all 2
    run_program legacy_rank_failure_4 300 "$bin_dir/legacy/rank_failure" all 4
  else
    echo "SKIP legacy_rank_failure (not built: the 0.1.0 header was not found at build time)"
  fi
  # Eight ranks (see want_8_ranks in scripts/gpu-env.sh).
  if want_8_ranks; then
    run_program p2p_methods_8 300 "$bin_dir/p2p_methods" 8
    run_program allgather_test_8 300 "$bin_dir/allgather_test" 8
  else
    echo "SKIP p2p_methods_8, allgather_test_8 (8 GPUs needed, $n_gpus found; MSCCLPP_TEST_8_RANKS=1 runs them anyway)"
  fi

  # Leak check of a short run under compute-sanitizer, when it is installed. Any leaked allocation or
  # memory error in either rank fails it (the program frees everything and resets its device).
  sanitized sanitizer_leak_check 150 1.5 "$bin_dir/p2p_methods" 2 --quick

  # Teardown after each failure case (a kill, rank 0 killed, a stop, an abort, a stuck wait), under the leak
  # check: every survivor frees everything it made (each resets its device once its kernel has ended).
  sanitized sanitizer_rank_failure 150 1 "$bin_dir/rank_failure" all 2
fi # two GPUs or more

# Collectives, at 2, 4, 8 and 16 ranks (rank r on GPU r % GPUs), under MPS where it can be started, so that
# the kernels of ranks sharing a GPU run side by side as on a GPU each (the grids are sized so that every
# rank's blocks are resident together). Each group of cases inside has its own, smaller limit; these are the
# sums, with a margin.
collective_ranks=""
for n in 2 4 8 16; do part "collectives-$n" && collective_ranks="$collective_ranks $n"; done
[ -n "$collective_ranks" ] && mps_start "the collectives"
run_collectives() {
  local before=$failed
  run_program "$@"
  # A fault under MPS can leave the daemon refusing clients for a moment.
  [ "$failed" -eq "$before" ] || mps_recover
}
# Measured on one H100 under MPS at 16 ranks: matrix 185 s, large 27 s, sizes 24 s, kill 5 s, exit 11 s,
# args 5 s; the limits grow with the ranks as collectives_test's own do (x n/4 above 4 ranks).
for n in $collective_ranks; do
  k=$(( n > 4 ? n / 4 : 1 ))
  run_collectives "collectives_matrix_$n" $((480 * k)) "$bin_dir/collectives_test" matrix "$n"
  run_collectives "collectives_large_$n" $((330 * k)) "$bin_dir/collectives_test" large "$n"
  run_collectives "collectives_graph_$n" $((150 * k)) "$bin_dir/collectives_test" graph "$n"
  run_collectives "collectives_sizes_$n" $((120 * k)) "$bin_dir/collectives_test" sizes "$n"
  run_collectives "collectives_zerocopy_$n" $((360 * k)) "$bin_dir/collectives_test" zerocopy "$n"
  run_collectives "collectives_copyengine_$n" $((360 * k)) "$bin_dir/collectives_test" copyengine "$n"
  run_collectives "collectives_kill_$n" 180 "$bin_dir/collectives_test" kill "$n"
  # Each exit case ends processes with kernels running: under MPS the server may then refuse new clients
  # (cudaErrorInitializationError) for longer than a case waits (seen: over 30 s at 4 ranks and more), so
  # each case gets a fresh server (docs/failures.md, "A process that ends").
  for c in exit_in_flight exit_after_kill exit_after_fault; do
    mps_recover >/dev/null
    run_collectives "collectives_${c}_$n" 150 "$bin_dir/collectives_test" "$c" "$n"
  done
  mps_recover >/dev/null
  run_collectives "collectives_args_$n" $((120 * k)) "$bin_dir/collectives_test" args "$n"
done
[ -n "$collective_ranks" ] && mps_stop

# MSCCLPP_ABORT_EXIT_TIMEOUT: a kernel that loops through the proxy forever and never looks at aborted() (as
# every program on the 0.1.0 header) ends with its process once the peer is killed, on both headers. Not
# in rank_failure's "all": a process the library ends would read as leaks under the sanitizer's run of it.
# Several ranks per GPU are fine here (the kernels only wait through the proxy).
part exit-endless && for n in 2 4; do
  run_program "rank_failure_exit_endless_$n" 90 "$bin_dir/rank_failure" exit_endless "$n"
  if [ -x "$bin_dir/legacy/rank_failure" ]; then
    run_program "legacy_rank_failure_exit_endless_$n" 90 "$bin_dir/legacy/rank_failure" exit_endless "$n"
  fi
done

# Every collective (both algorithms, 4 types, unaligned buffers, partial units) under compute-sanitizer's
# memcheck, with the leak check: no out-of-bounds access in the library's kernels or the peers' scratch, and
# everything freed (each rank destroys its communicator and resets its device).
# compute-sanitizer does not run under MPS: the ranks take turns on a shared GPU here.
if part sanitizer; then
  sanitized sanitizer_collectives 500 5 "$bin_dir/collectives_test" matrix_small 2
  sanitized sanitizer_collectives_8 500 5 "$bin_dir/collectives_test" matrix_small 8
  # Zero-copy: the peers' registered buffers read through their mappings, on registered pools.
  sanitized sanitizer_zerocopy 500 5 "$bin_dir/collectives_test" zerocopy_small 2
  sanitized sanitizer_zerocopy_4 500 5 "$bin_dir/collectives_test" zerocopy_small 4
  sanitized sanitizer_zerocopy_8 500 5 "$bin_dir/collectives_test" zerocopy_small 8
  # The copy engine's fences and copies (eager all-gathers and broadcasts) on registered pools.
  sanitized sanitizer_copyengine 500 5 "$bin_dir/collectives_test" copyengine_small 2
  sanitized sanitizer_copyengine_8 500 5 "$bin_dir/collectives_test" copyengine_small 8
fi

# NCCL's API (build/lib/nccl/libnccl.so.2): its own runner (the C test at 2 and 4 ranks and its main group under
# memcheck, PyTorch on it at 2 and 4 ranks and with a rank killed), counted here; no summary line from it is a
# failure. MPS is off here: the runner starts its own, and stops it before its memcheck run.
nccl_log="$log_dir/nccl_gpu_tests.log"
if [ -n "${GPU_TEST_PARTS:-}" ] && ! [[ " $GPU_TEST_PARTS " == *" nccl"* ]]; then
  echo "note: the NCCL face's parts not run (GPU_TEST_PARTS=$GPU_TEST_PARTS)"
  echo "nccl gpu tests: 0 passed, 0 failed" >"$nccl_log"
else
  GPU_TEST_LOG_DIR="$log_dir" bash c-tests/run_nccl_gpu_tests.sh 2>&1 | tee "$nccl_log"
fi
nccl_summary=$(grep -E '^nccl gpu tests: [0-9]+ passed, [0-9]+ failed$' "$nccl_log" | tail -n 1)
if [ -n "$nccl_summary" ]; then
  read -r nccl_p nccl_f < <(sed -E 's/^nccl gpu tests: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/' <<<"$nccl_summary")
  passed=$((passed + nccl_p))
  failed=$((failed + nccl_f))
else
  echo "FAIL nccl_gpu_tests: c-tests/run_nccl_gpu_tests.sh ended without its summary line (log $nccl_log)"
  failed=$((failed + 1))
fi

echo "-- all GPU tests took $(($(date +%s) - start_all))s; logs in $log_dir"
echo "gpu tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
