# Sourced by the GPU runners (c-tests/run_gpu_tests.sh, examples-c/run_examples.sh,
# examples-c/bench/run_bench.sh), from the repository root.

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
