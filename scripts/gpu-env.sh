# Sourced by the GPU runners (c-tests/run_gpu_tests.sh, c-tests/run_nccl_gpu_tests.sh, examples-c/run_examples.sh,
# examples-c/bench/run_bench.sh, python/run_gpu_tests.sh), from the repository root.

# visible_gpus: how many GPUs CUDA_VISIBLE_DEVICES names (indices or UUIDs, comma-separated).
visible_gpus() {
  tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
}

# require_gpus LABEL [shared]: sets n_gpus and shared_gpu; with fewer than two GPUs, says LABEL was skipped and
# why, and exits 0 (counting nothing as passed).
#
# A runner that passes "shared" can also run on one GPU, with MSCCLPP_TEST_MIN_GPUS=1: it then gets shared_gpu=1,
# and runs only the programs that put several ranks on one GPU, saying which it skipped and why. (Runners that
# do not pass it, the examples and benchmarks, keep needing two GPUs: their timings assume a GPU per rank.)
require_gpus() {
  n_gpus=0
  shared_gpu=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  fi
  # nvidia-smi lists every GPU; the programs see those CUDA_VISIBLE_DEVICES names, where it is set.
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$n_gpus" -gt 0 ]; then
    local visible
    visible=$(visible_gpus)
    [ "$visible" -lt "$n_gpus" ] && n_gpus=$visible
  fi
  local need=2 hint=""
  if [ "${2:-}" = shared ]; then
    case "${MSCCLPP_TEST_MIN_GPUS:-2}" in
      1) need=1 ;;
      2) hint="; MSCCLPP_TEST_MIN_GPUS=1 runs what can share one GPU" ;;
      *) echo "$1: MSCCLPP_TEST_MIN_GPUS=$MSCCLPP_TEST_MIN_GPUS is neither 1 nor 2; using 2" ;;
    esac
  fi
  if [ "$n_gpus" -lt "$need" ]; then
    echo "$1: skipped ($n_gpus GPUs found by nvidia-smi -L, $need needed$hint)"
    exit 0
  fi
  if [ "$n_gpus" -lt 2 ]; then
    shared_gpu=1
  fi
}

# want_8_ranks: whether to run the eight-rank programs: on 8 GPUs (one rank each), or on fewer when
# MSCCLPP_TEST_8_RANKS=1 (several processes per GPU: the logic is checked, timings mean nothing).
want_8_ranks() {
  [ "${n_gpus:-0}" -ge 8 ] || [ "${MSCCLPP_TEST_8_RANKS:-0}" = 1 ]
}

# The programs find libcudart.so.13 next to libmscclpp in build/lib; without that copy, the system's.
if [ ! -e build/lib/libcudart.so.13 ] && [ -d /usr/local/cuda/lib64 ]; then
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# mps_start LABEL: starts NVIDIA's MPS daemon for the runs that follow, so that the kernels of ranks sharing a
# GPU run side by side, as on a GPU per rank (without it they take turns in time slices, and kernels that
# wait on each other's are never resident together). Sets mps_on=1 where it started one, and says why not
# otherwise (no nvidia-cuda-mps-control, or it failed). mps_stop stops the one mps_start started.
mps_on=0
mps_start() {
  mps_on=0
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "note: $1 without MPS (nvidia-cuda-mps-control not found): ranks sharing a GPU take turns"
    return
  fi
  export CUDA_MPS_PIPE_DIRECTORY="${TMPDIR:-/tmp}/mscclpp-mps-pipe.$$"
  export CUDA_MPS_LOG_DIRECTORY="${TMPDIR:-/tmp}/mscclpp-mps-log.$$"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    mps_on=1
    echo "note: $1 under MPS (daemon started; pipes in $CUDA_MPS_PIPE_DIRECTORY): the ranks' kernels run side by side"
    # The daemon keeps the caller's CUDA_VISIBLE_DEVICES, and its server numbers those GPUs from 0; a
    # client's CUDA_VISIBLE_DEVICES then counts within them (clients asking for GPUs 2,3 of a daemon started
    # on 2,3 found "no CUDA-capable device"). So the clients get 0..n-1 while MPS is on; mps_stop gives the
    # caller's list back.
    mps_caller_visible=${CUDA_VISIBLE_DEVICES-}
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(($(visible_gpus) - 1)))
      export CUDA_VISIBLE_DEVICES
      echo "note: MPS clients use CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES (the server's numbering of $mps_caller_visible)"
    fi
  else
    echo "note: $1 without MPS (nvidia-cuda-mps-control -d failed): ranks sharing a GPU take turns"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}

mps_stop() {
  [ "$mps_on" = 1 ] || return 0
  echo quit | nvidia-cuda-mps-control
  # The daemon ends once its clients have; later programs must not find its pipes.
  for _ in $(seq 50); do pgrep -f "nvidia-cuda-mps-(control|server)" >/dev/null 2>&1 || break; sleep 0.2; done
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  [ -n "${mps_caller_visible:-}" ] && export CUDA_VISIBLE_DEVICES="$mps_caller_visible"
  mps_on=0
}

# mps_recover: after a program failed under MPS, a fault may leave the daemon refusing new clients for a
# while ("busy or unavailable"): starts it afresh.
mps_recover() {
  [ "$mps_on" = 1 ] || return 0
  mps_stop
  sleep 1
  mps_start "the next programs"
}

# run_program LABEL LIMIT_SECONDS COMMAND...: runs a test program with a time limit, its output in
# $log_dir/LABEL.log; prints its PASS/FAIL/SKIP lines and adds them to the caller's `passed` and `failed`; a
# missing program, a timeout or a non-zero exit without a FAIL line is one failure.
run_program() {
  local label=$1 limit=$2
  shift 2
  local log="$log_dir/$label.log" rc p f t0
  if [[ "$1" == */* ]] && [ ! -x "$1" ]; then
    echo "FAIL $label: $1 is missing (not built)"
    failed=$((failed + 1))
    return
  fi
  echo "== $label: $* (limit ${limit}s, log $log)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  p=$(grep -c '^PASS ' "$log")
  f=$(grep -c '^FAIL ' "$log")
  grep -E '^(PASS|FAIL|SKIP) ' "$log" | sed -E "s/^(PASS|FAIL|SKIP) /\1 $label: /"
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "FAIL $label: timed out after ${limit}s"
    else
      echo "FAIL $label: exit code $rc without a FAIL line"
    fi
    failed=$((failed + 1))
  fi
  if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then
    echo "-- last lines of $log:"
    tail -n 30 "$log" | sed 's/^/   /'
  fi
  echo "-- $label: exit code $rc, $p passed, $f failed, $(($(date +%s) - t0))s"
}

# compute-sanitizer, for `sanitized` (empty where it is not installed).
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
fi

# sanitized LABEL LIMIT TIMEOUT_SCALE PROGRAM ARGS...: runs a GPU test program under compute-sanitizer's memcheck
# with the leak check (every process, each rank resetting its device at the end) and counts one test in the
# caller's `passed` and `failed` (its log in $log_dir/LABEL.log): it passes when the program passes, every
# process reports, and none reports an error or a leak. Not counted, and said so, where compute-sanitizer is not
# installed, the program was not built, or MPS is on (memcheck does not run under MPS: call it after mps_stop).
sanitized() {
  local label=$1 limit=$2 scale=$3
  shift 3
  if [ -z "$sanitizer" ] || [ ! -x "$1" ]; then
    echo "note: $label not run (compute-sanitizer or $1 missing; not counted)"
    return
  fi
  if [ "$mps_on" = 1 ] || [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    echo "note: $label not run (MPS is on, and compute-sanitizer does not run under it; not counted)"
    return
  fi
  local log="$log_dir/$label.log" t0 rc summaries bad_summaries leaks case_failures
  echo "== $label: $sanitizer --tool memcheck --leak-check full ... $* (limit ${limit}s, log $log)"
  t0=$(date +%s)
  MSCCLPP_TEST_TIMEOUT_SCALE=$scale timeout -k 10 "$limit" "$sanitizer" --tool memcheck --leak-check full \
    --target-processes all --report-api-errors no "$@" >"$log" 2>&1
  rc=$?
  summaries=$(grep -c 'ERROR SUMMARY:' "$log")
  bad_summaries=$(grep -E 'ERROR SUMMARY: [1-9]' "$log" | head -n 3 | tr '\n' ' ')
  leaks=$(grep -E 'Leaked [0-9]+ bytes|LEAK SUMMARY: [1-9]' "$log" | head -n 5 | tr '\n' ' ')
  case_failures=$(grep -c '^FAIL ' "$log")
  if [ "$rc" -eq 0 ] && [ "$summaries" -ge 1 ] && [ -z "$bad_summaries" ] && [ -z "$leaks" ] && [ "$case_failures" -eq 0 ]; then
    echo "PASS $label: $(basename "$1") ${*:2} under memcheck: $summaries process reports, no errors, no leaks"
    passed=$((passed + 1))
  else
    echo "FAIL $label: exit code $rc, $summaries process reports, $case_failures failed cases; ${bad_summaries}${leaks}"
    failed=$((failed + 1))
    echo "-- last lines of $log:"
    tail -n 40 "$log" | sed 's/^/   /'
  fi
  echo "-- $label: exit code $rc, $(($(date +%s) - t0))s"
}

# part NAME: whether the runners should run part NAME of the GPU tests. GPU_TEST_PARTS (space-separated)
# picks parts, so that a run too long for one sitting can be split (the names: the headers of
# c-tests/run_gpu_tests.sh and c-tests/run_nccl_gpu_tests.sh); a word without its suffix takes every part it
# begins ("collectives", "nccl", "nccl-rma"). Unset or empty: every part. The runners say which parts they
# left out.
part() {
  [ -z "${GPU_TEST_PARTS:-}" ] && return 0
  local w
  for w in $GPU_TEST_PARTS; do
    [ "$w" = "$1" ] || [ "${1#"$w"-}" != "$1" ] && return 0
  done
  echo "note: part $1 not run (GPU_TEST_PARTS=$GPU_TEST_PARTS)"
  return 1
}
