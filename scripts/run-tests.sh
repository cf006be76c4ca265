#!/usr/bin/env bash
# `make test`: runs every test that can run on this machine (after `make` has built everything) and ends
# with one line "summary: N passed, N failed, N skipped". Full logs go to build/test-logs/.
#
# Counts: each Rust test, each check of the layout test, each C and Python test as its runner reports it (a
# runner that prints no "N passed, N failed" line counts as one test, by its exit status). GPU tests need
# two GPUs; here they are only compiled (by `make`), and counted as skipped when fewer than two are present.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
logs=build/test-logs
mkdir -p "$logs"
passed=0
failed=0
skipped=0
failures=()

# Adds the last "N passed, N failed[, N skipped]" line of a log to the totals and sets reported_failed;
# returns 1 if there is no such line.
reported_failed=0
count_from_log() {
  local line
  line=$(grep -E '(^|: )[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1) || return 1
  [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]] || return 1
  passed=$((passed + BASH_REMATCH[1]))
  reported_failed=${BASH_REMATCH[2]}
  failed=$((failed + reported_failed))
  skipped=$((skipped + ${BASH_REMATCH[4]:-0}))
}

# Runs one test program, logging it; counts its own summary line, or it as one test.
run_one() {
  local name=$1 log="$logs/$1.log"
  shift
  echo "== $name"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if count_from_log "$log"; then
    # A runner that reports no failure yet exits non-zero still failed.
    ((rc == 0 || reported_failed > 0)) || failed=$((failed + 1))
  elif ((rc == 0)); then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  ((rc == 0)) || failures+=("$name (exit $rc)")
}

# 1. Rust: every unit, integration and doc test.
echo "== cargo test"
"$CARGO" test 2>&1 | tee "$logs/cargo-test.log"
rc=${PIPESTATUS[0]}
rust_passed=0
rust_failed=0
while read -r p f; do
  rust_passed=$((rust_passed + p))
  rust_failed=$((rust_failed + f))
done < <(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' "$logs/cargo-test.log")
if ((rc != 0 && rust_failed == 0)); then
  rust_failed=1 # it did not get as far as running (a build error)
fi
passed=$((passed + rust_passed))
failed=$((failed + rust_failed))
((rc == 0)) || failures+=("cargo test (exit $rc)")

# 2. The header against the legacy layout, as g++ (shared and static library) and as nvcc compile it.
for program in build/tests/layout/layout_test{,_static,_cuda}; do
  if [[ -x $program ]]; then
    run_one "$(basename "$program")" "$program"
  else
    echo "== $(basename "$program"): not built (run make first)"
    failed=$((failed + 1))
    failures+=("$(basename "$program") (not built)")
  fi
done

# 3. Host tests of the C interface.
if [[ -f c-tests/run_host_tests.sh ]]; then
  run_one host-tests bash c-tests/run_host_tests.sh
else
  echo "== host tests: c-tests/run_host_tests.sh is not there yet"
fi

# 3b. NCCL's API without a GPU: nccl.h, libnccl.so.2's exports, and the host programs of c-tests/nccl/.
if [[ -f c-tests/nccl/run_nccl_tests.sh ]]; then
  run_one nccl-tests bash c-tests/nccl/run_nccl_tests.sh
fi

# 4. The Python package's tests (pytest in build/python-venv, against the package installed there by make);
# its conftest prints "python tests: N passed, N failed, N skipped". GPU cases say why they were skipped.
if [[ -x build/python-venv/bin/python ]]; then
  run_one python-tests build/python-venv/bin/python -m pytest python/tests -q -rs -p no:cacheprovider
else
  echo "== python tests: build/python-venv is missing (run make first)"
  failed=$((failed + 1))
  failures+=("python tests (not built)")
fi

# 5. GPU tests: compiled by make; run by `make gpu-test` on a machine with two GPUs.
gpu_tests=0
for program in build/tests/gpu/*; do
  [[ -f $program && -x $program ]] && gpu_tests=$((gpu_tests + 1))
done
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || gpus=0
fi
if ((gpus < 2)); then
  echo "== GPU tests: SKIPPED $gpu_tests compiled GPU test program(s): they need 2 GPUs and this machine has $gpus"
  skipped=$((skipped + gpu_tests))
else
  echo "== GPU tests: $gpu_tests compiled; this machine has $gpus GPUs: run them with make gpu-test"
fi

if ((${#failures[@]})); then
  echo "failed: ${failures[*]} (logs in $logs/)"
fi
echo "summary: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
