#!/usr/bin/env bash
# The NCCL face's GPU tests (issue 25), from a tree built by `make`:
# - build/tests/nccl-gpu/nccl_gpu_test (c-tests/nccl-gpu/nccl_gpu_test.cu: through nccl.h and libnccl.so.2
#   alone: every collective and type, fp8, PreMulSum, send/receive, groups, graphs, split, shrink, revoke,
#   refusals, a killed rank shrunk out, its loop eager and in a CUDA graph) at 2 and 4 ranks (the kills at 8 too), and main with every call that sends and receives
#   can carry sent that way (MSCCLPP_COLL_ALGO=sendrecv) at 2 and 3 ranks;
# - build/tests/nccl-gpu/nccl_rma_test (c-tests/nccl-gpu/nccl_rma_test.cu: the one-sided calls: puts,
#   signals, waits, graphs, peer pointers, refusals, times, a waiter's signaller killed) at 2 and 4 ranks;
# - build/tests/nccl-gpu/nccl_grow_test (c-tests/nccl-gpu/nccl_grow_test.cu: ncclCommGetUniqueId and ncclCommGrow,
#   2 ranks grown to 4, collectives checked on the grown communicator, the parent, and a shrink back to 2);
# - python/examples/torch_zero_copy.py: PyTorch's registered memory (allocator hook, MemPool) going zero-copy;
# - python/examples/torch_suspend_window.py: a client's sleep mode from PyTorch processes (suspend, resume, a
#   symmetric window, an all-reduce, the ranks out of step) at 4 ranks with three seeds;
# - build/tests/nccl-gpu/nccl_window_suspend_test: the same steps from C, 20 cycles, at 4 and 8 ranks;
# - python/examples/torch_on_our_nccl.py: PyTorch, unchanged, on our libnccl.so.2 by LD_PRELOAD, checked
#   against gloo, at 2 and 4 ranks, then its --kill mode (a rank SIGKILLs itself; every other process must end
#   within a bounded time) at 4 ranks (skipped, and said so, where torch cannot be imported);
# - build/tests/nccl-gpu/nccl_suspend_test (ncclCommSuspend / Resume / MemStats) at 2 and 4 ranks, and
#   build/tests/nccl-gpu/pg_nccl_sequence (PyTorch's ProcessGroupNCCL calls around them, in its order);
# - the C test's main group at 2 ranks under compute-sanitizer's memcheck with the leak check (`sanitized`,
#   scripts/gpu-env.sh), after MPS is stopped: memcheck does not run under MPS (the ranks take turns on a
#   shared GPU there). Not run, and said so, where compute-sanitizer is missing or the caller's MPS is on.
# Rank r runs on GPU r % GPUs: with MSCCLPP_TEST_MIN_GPUS=1 one GPU is enough (every rank shares it), under
# MPS where nvidia-cuda-mps-control is installed (started and stopped here). c-tests/run_gpu_tests.sh runs
# this script too; alone it prints the lines of each program and ends with `nccl gpu tests: N passed, N failed`.
# Logs go to $GPU_TEST_LOG_DIR (default build/test-logs). PYTHON names the interpreter (default python3).
# GPU_TEST_PARTS (space-separated; unset or empty: every part; run_gpu_tests.sh passes it on) picks parts:
# nccl-2, nccl-4 (nccl_gpu_test main, kill_allreduces, kill_graph, kill_p2p, initall), nccl-kill-8 (the kill
# runs of all-reduces, eager and in a graph, at 8 ranks: the failure known and the shrink at that size), nccl-sendrecv-2, nccl-sendrecv-3
# (main with MSCCLPP_COLL_ALGO=sendrecv), nccl-rma-2, nccl-rma-4, nccl-suspend-2, nccl-suspend-4,
# nccl-window-suspend-4, nccl-window-suspend-8, nccl-pg-sequence, nccl-grow, nccl-collconfig-2, nccl-collconfig-4,
# nccl-torch (torch_on_our_nccl at 2 and 4 ranks, its kill run, both again on virtual hosts, torch_suspend_window
# at 4 ranks and at 4 and 8 for 20 cycles, torch_zero_copy),
# nccl-determinism-3, nccl-determinism-4, nccl-determinism-8 (reproducible reductions),
# nccl-sanitizer (the memcheck run); a word also takes every part that begins with it
# and a "-" ("nccl" all, "nccl-rma" both; "nccl-2" only itself).
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
  part "nccl-$n" || continue
  before=$failed
  # main (its own limit 1200 s: 4 ranks on one GPU take long), then the two kill runs and initall, each a
  # program of its own: a killed rank may leave the MPS daemon refusing new clients for over 30 s (docs/failures.md,
  # "A process that ends"; seen on two H200s, 3 runs in 5, after kill_last_rank_during_allreduces), so the
  # daemon is started afresh before each kill run and after the last, as c-tests/run_gpu_tests.sh does.
  run_program "nccl_gpu_test_$n" 1300 "$bin" main "$n"
  for kill in kill_allreduces kill_graph kill_p2p; do
    [ "$own_mps" = 1 ] && mps_recover
    run_program "nccl_gpu_test_${kill}_$n" 240 "$bin" "$kill" "$n"
  done
  [ "$own_mps" = 1 ] && mps_recover
  run_program "nccl_gpu_test_initall_$n" 240 "$bin" initall "$n"
  recover "$before"
done

# The all-reduces' kill runs at 8 ranks: how soon every survivor knows, and the shrink, at that size.
if part nccl-kill-8; then
  before=$failed
  for kill in kill_allreduces kill_graph; do
    [ "$own_mps" = 1 ] && mps_recover
    run_program "nccl_gpu_test_${kill}_8" 240 "$bin" "$kill" 8
  done
  [ "$own_mps" = 1 ] && mps_recover
  recover "$before"
fi

# main again with MSCCLPP_COLL_ALGO=sendrecv: every call that sends and receives can carry goes that way at
# every size (chains, the two ranks' halves, gather, scatter, all-to-all), odd rank counts and one GPU too.
for n in 2 3; do
  part "nccl-sendrecv-$n" || continue
  before=$failed
  MSCCLPP_COLL_ALGO=sendrecv run_program "nccl_gpu_test_sendrecv_$n" 1300 "$bin" main "$n"
  recover "$before"
done

for n in 2 4; do
  part "nccl-rma-$n" || continue
  before=$failed
  run_program "nccl_rma_test_$n" 1200 build/tests/nccl-gpu/nccl_rma_test all "$n"
  recover "$before"
done

# ncclCommSuspend / ncclCommResume / ncclCommMemStats (c-tests/nccl-gpu/nccl_suspend_test.cu; its timing
# case's PASS line gives the microseconds of each call), and the calls PyTorch's ProcessGroupNCCL makes around
# them, in its order (pg_nccl_sequence.cu, with ncclCommGrow from 2 to 3 ranks where it is exported).
for n in 2 4; do
  part "nccl-suspend-$n" || continue
  before=$failed
  run_program "nccl_suspend_test_$n" 700 build/tests/nccl-gpu/nccl_suspend_test "$n"
  recover "$before"
done
# Windows and suspensions together (c-tests/nccl-gpu/nccl_window_suspend_test.cu: vLLM's sleep mode before a
# symmetric all-reduce, and a window registered before a suspend and used after the resume), 20 cycles each,
# at 4 and 8 ranks (8 where want_8_ranks says so, or under MPS, where 8 ranks on fewer GPUs run side by side).
for n in 4 8; do
  part "nccl-window-suspend-$n" || continue
  if [ "$n" = 8 ] && ! want_8_ranks && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    echo "SKIP nccl_window_suspend_test_8: 8 ranks need 8 GPUs, MPS, or MSCCLPP_TEST_8_RANKS=1 ($n_gpus GPUs, no MPS)"
    continue
  fi
  before=$failed
  run_program "nccl_window_suspend_test_$n" 900 build/tests/nccl-gpu/nccl_window_suspend_test "$n"
  recover "$before"
done
# Reproducible reductions (c-tests/nccl-gpu/nccl_determinism_test.cu): with MSCCLPP_DETERMINISTIC=1 every
# element of every all-reduce, reduce-scatter and reduce, 4 KiB to 256 MiB, on plain, registered and windowed
# buffers, eager and in graphs, is the rank-order value computed on the host, by the table's algorithms and by
# each one MSCCLPP_COLL_ALGO forces; without it, the rings of MSCCLPP_COLL_ALGO=sendrecv give other bits
# somewhere (the data tells the orders apart). 8 ranks as the windows' part above.
for n in 3 4 8; do
  part "nccl-determinism-$n" || continue
  if [ "$n" = 8 ] && ! want_8_ranks && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    echo "SKIP nccl_determinism_test_8: 8 ranks need 8 GPUs, MPS, or MSCCLPP_TEST_8_RANKS=1 ($n_gpus GPUs, no MPS)"
    continue
  fi
  before=$failed
  det=build/tests/nccl-gpu/nccl_determinism_test
  MSCCLPP_DETERMINISTIC=1 run_program "nccl_determinism_test_$n" 600 "$det" "$n"
  for algo in packet copy zerocopy sendrecv; do
    MSCCLPP_DETERMINISTIC=1 MSCCLPP_COLL_ALGO=$algo run_program "nccl_determinism_test_${algo}_$n" 600 "$det" "$n" --quick
  done
  MSCCLPP_DETERMINISTIC=0 MSCCLPP_COLL_ALGO=sendrecv \
    run_program "nccl_determinism_test_default_sendrecv_$n" 600 "$det" "$n" --quick --expect-difference
  recover "$before"
done
if part nccl-pg-sequence; then
  before=$failed
  run_program pg_nccl_sequence 300 build/tests/nccl-gpu/pg_nccl_sequence
  recover "$before"
fi

# ncclCommGrow: 2 ranks grown to 4 (4 processes).
if part nccl-grow; then
  before=$failed
  run_program nccl_grow_test 600 build/tests/nccl-gpu/nccl_grow_test
  recover "$before"
fi

# The collectives with a per-call ncclCollConfig_t (2.31), a config of torch 2.15's size, the completion
# event, a graph (c-tests/nccl-gpu/nccl_collconfig_test.cu).
for n in 2 4; do
  part "nccl-collconfig-$n" || continue
  before=$failed
  run_program "nccl_collconfig_test_$n" 300 build/tests/nccl-gpu/nccl_collconfig_test "$n"
  recover "$before"
done

py=${PYTHON:-python3}
script=python/examples/torch_on_our_nccl.py
if [ ! -f "$lib" ]; then
  echo "FAIL torch_on_our_nccl: $lib is missing (not built)"
  failed=$((failed + 1))
elif ! part nccl-torch; then
  :
elif ! why=$("$py" -c 'import torch, torch.distributed' 2>&1); then
  echo "SKIP torch_on_our_nccl: torch cannot be imported by $py ($(printf '%s' "$why" | tail -n 1))"
else
  # PyTorch unchanged: our library comes first by LD_PRELOAD, so every NCCL call torch makes binds to it.
  for n in 2 4; do
    before=$failed
    run_program "torch_on_our_nccl_$n" 600 env LD_PRELOAD="$root/$lib" "$py" "$script" --nranks "$n"
    recover "$before"
  done
  # Its own program: the last rank SIGKILLs itself during all-reduces; every survivor must raise from a
  # collective or be torn down by torch's watchdog within 60 s, and the parent reaps every process.
  before=$failed
  run_program torch_on_our_nccl_kill_4 300 env LD_PRELOAD="$root/$lib" "$py" "$script" --nranks 4 --kill
  recover "$before"
  # Every rank on a virtual host of its own (a UTS namespace: the program SKIPs without root): the
  # communicators stay ours and NVIDIA's NCCL, found beside torch, carries every collective; then the kill run
  # across three hosts.
  before=$failed
  run_program torch_on_our_nccl_hosts_2 400 env LD_PRELOAD="$root/$lib" "$py" "$script" --nranks 2 --hosts
  recover "$before"
  before=$failed
  run_program torch_on_our_nccl_hosts_kill_3 300 env LD_PRELOAD="$root/$lib" "$py" "$script" --nranks 3 --hosts --kill
  recover "$before"
  # A client's sleep mode from PyTorch processes (python/examples/torch_suspend_window.py: suspend, resume, a
  # symmetric window of the caching allocator, an all-reduce, the ranks out of step), at 4 ranks, seeds 1-3,
  # and at 4 and 8 ranks for 20 cycles.
  for n in 4 8; do
    before=$failed
    run_program "torch_suspend_window_${n}_20_cycles" 300 "$py" python/examples/torch_suspend_window.py --nranks "$n" \
      --cycles 20 --seed 7
    recover "$before"
  done
  for seed in 1 2 3; do
    before=$failed
    run_program "torch_suspend_window_4_seed$seed" 200 "$py" python/examples/torch_suspend_window.py --nranks 4 --seed "$seed"
    recover "$before"
  done
  # Registered memory from PyTorch (the allocator hook, and a MemPool over ncclMemAlloc): the collectives go
  # zero-copy, which the library's INFO count at destroy shows, and their results are exact.
  before=$failed
  run_program torch_zero_copy_2 300 env LD_PRELOAD="$root/$lib" "$py" python/examples/torch_zero_copy.py --nranks 2
  recover "$before"
fi

[ "$own_mps" = 1 ] && mps_stop

# Memcheck of the main group (every collective, fp8, PreMulSum, split, shrink, revoke; the ranks free everything
# and reset their device at the end, for the leak check), outside MPS; deadlines x5 (memcheck slows every
# kernel, and the two ranks take turns on a shared GPU).
part nccl-sanitizer && sanitized nccl_gpu_test_main_memcheck_2 1800 5 "$bin" main 2

echo "nccl gpu tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
