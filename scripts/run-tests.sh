#!/usr/bin/env bash
# `make test`: runs every test that can run on this machine (after `make` has built everything).
#
# It prints one line per group of tests, and at the end the groups' skipped tests with the reasons, then
#   summary: N passed, N failed, N skipped
# A group's whole output goes to build/test-logs/<group>.log: the WARN and ERROR lines that tests provoke on
# purpose stay there. A group that fails also prints its FAIL lines (or, where it has none, its last lines).
#
# Counts: each Rust test, each check of the layout test, each C, Python, documentation, install and legacy-ABI test
# as its runner reports it (a runner's last "N passed, N failed[, N skipped]" line; a runner that prints none
# counts as one test, by its exit status). GPU tests need two GPUs; here they are only compiled (by `make`),
# and counted as skipped when fewer than two are present. The legacy-ABI test needs MSCCL++ 0.1.0's header
# (LEGACY_HEADER, which `make test` passes on; CONTRIBUTING.md says where it comes from); without it, it is
# counted as skipped.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
LEGACY_HEADER=${LEGACY_HEADER:-.legacy/mscclpp-0.1.0.h}
logs=build/test-logs
mkdir -p "$logs"
passed=0
failed=0
skipped=0
failures=()
skip_notes=()

# Reads the last "N passed, N failed[, N skipped]" line of a log into counted_{passed,failed,skipped};
# returns 1 if there is none.
counted_passed=0
counted_failed=0
counted_skipped=0
count_from_log() {
  local line
  line=$(grep -E '(^|: )[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1) || return 1
  [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]] || return 1
  counted_passed=${BASH_REMATCH[1]}
  counted_failed=${BASH_REMATCH[2]}
  counted_skipped=${BASH_REMATCH[4]:-0}
}

# The reasons a log gives for its skips: its "SKIP name: reason" or "SKIPPED what: reason" lines (the C
# runners'), or pytest's "SKIPPED [n] file:line: reason" lines, each reason once.
skip_reasons() {
  sed -nE -e 's/^SKIPPED \[[0-9]+\] [^ ]+: (.*)$/\1/p;t' -e 's/^SKIP(PED)? (.*)$/\2/p' "$1" | awk '!seen[$0]++'
}

# note_skips NAME COUNT REASONS: one entry of the final list of what was skipped and why.
note_skips() {
  local n
  n=$(printf '%s' "$3" | grep -c .)
  if ((n == 0)); then
    skip_notes+=("$1: $2 skipped (the reasons are in its log)")
  elif ((n == 1)); then
    skip_notes+=("$1: $2 skipped: $3")
  else
    local more=""
    ((n > 4)) && more=$'\n      ... and '$((n - 4))' more reasons in its log'
    # Each reason whole, wrapped at spaces (never cut inside a word), its further lines indented deeper.
    local reasons="" reason
    while IFS= read -r reason; do
      reasons+=$'\n'"$(printf '%s\n' "$reason" | fold -s -w 104 | sed -e 's/ *$//' -e '1s/^/      /' -e '2,$s/^/        /')"
    done < <(printf '%s\n' "$3" | head -n 4)
    skip_notes+=("$1: $2 skipped:$reasons$more")
  fi
}

# report NAME VERDICT COUNTS SECONDS LOG: the group's line, and for a failed group its FAIL lines.
report() {
  local name=$1 verdict=$2 counts=$3 took=$4 log=$5
  printf '%s %s: %s (%s s; log %s)\n' "$verdict" "$name" "$counts" "$took" "$log"
  if [[ $verdict == FAIL ]]; then
    local pattern='(^|: | )FAIL(ED)?( |:|$)|panicked at'
    if grep -qE "$pattern" "$log"; then
      grep -E "$pattern" "$log" | head -n 40 | sed 's/^/    /'
    else
      tail -n 30 "$log" | sed 's/^/    /'
    fi
  fi
}

# run_group NAME COMMAND...: runs one group, its output into build/test-logs/NAME.log; counts its own summary
# line, or it as one test.
run_group() {
  local name=$1 log="$logs/${1// /-}.log" start rc took
  shift
  start=$(date +%s.%N)
  "$@" >"$log" 2>&1 </dev/null
  rc=$?
  took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  local p=0 f=0 s=0
  if count_from_log "$log"; then
    p=$counted_passed f=$counted_failed s=$counted_skipped
    # A runner that reports no failure yet exits non-zero still failed.
    ((rc == 0 || f > 0)) || f=$((f + 1))
  elif ((rc == 0)); then
    p=1
  else
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + s))
  ((s == 0)) || note_skips "$name" "$s" "$(skip_reasons "$log")"
  local counts="$p passed, $f failed"
  ((s > 0)) && counts+=", $s skipped"
  if ((rc == 0 && f == 0)); then
    report "$name" PASS "$counts" "$took" "$log"
  else
    report "$name" FAIL "$counts, exit status $rc" "$took" "$log"
    failures+=("$name")
  fi
}

# skip_group NAME COUNT REASON
skip_group() {
  skipped=$((skipped + $2))
  note_skips "$1" "$2" "$3"
  echo "SKIP $1: $2 skipped: $3"
}

# 1. Rust: every unit, integration and doc test (its "test result: ok. N passed; N failed; N ignored" lines).
run_cargo() {
  local log
  log=$(mktemp)
  "$CARGO" test >"$log" 2>&1
  local rc=$?
  cat "$log"
  local p=0 f=0 i=0 a b c
  while read -r a b c; do
    p=$((p + a)) f=$((f + b)) i=$((i + c))
  done < <(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed; ([0-9]+) ignored.*/\1 \2 \3/p' "$log")
  rm -f "$log"
  ((i == 0)) || echo "SKIP $i Rust tests marked #[ignore] (their reasons are in the source)"
  # No result line at all: it did not get as far as running (a build error).
  ((rc == 0 || f > 0)) || f=1
  echo "cargo test: $p passed, $f failed, $i skipped"
  return $rc
}
run_group "cargo test" run_cargo

# 2. The header against the legacy layout, as g++ (shared and static library) and as nvcc compile it.
for program in build/tests/layout/layout_test{,_static,_cuda}; do
  if [[ -x $program ]]; then
    run_group "$(basename "$program")" "$program"
  else
    echo "FAIL $(basename "$program"): not built (run make first)"
    failed=$((failed + 1))
    failures+=("$(basename "$program") (not built)")
  fi
done

# 3. Host tests of the C interface.
run_group "host tests" bash c-tests/run_host_tests.sh

# 4. NCCL's API without a GPU: nccl.h, libnccl.so.2's exports, and the host programs of c-tests/nccl/.
run_group "nccl tests" bash c-tests/nccl/run_nccl_tests.sh

# 5. The legacy ABI: a program compiled against MSCCL++ 0.1.0's own header, linked with our library.
if [[ -f $LEGACY_HEADER ]]; then
  if [[ -x build/tests/legacy/legacy_host ]]; then
    run_group "legacy-abi" build/tests/legacy/legacy_host
  else
    echo "FAIL legacy-abi: build/tests/legacy/legacy_host not built, though $LEGACY_HEADER exists (run make)"
    failed=$((failed + 1))
    failures+=("legacy-abi (not built)")
  fi
else
  skip_group legacy-abi 1 "no MSCCL++ 0.1.0 mscclpp.h at LEGACY_HEADER=$LEGACY_HEADER (not part of this repository; CONTRIBUTING.md, \"The legacy header\", says where to get one)"
fi

# 6. The Python package's tests (pytest in build/python-venv, against the package installed there by make);
# its conftest prints "python tests: N passed, N failed, N skipped". GPU cases say why they were skipped.
if [[ -x build/python-venv/bin/python ]]; then
  run_group "python tests" build/python-venv/bin/python -m pytest python/tests -q -rs -p no:cacheprovider
else
  echo "FAIL python tests: build/python-venv is missing (run make first)"
  failed=$((failed + 1))
  failures+=("python tests (not built)")
fi

# 7. What the documents promise (files, run bits, links, make targets, settings, the wheel's tag), the source tree's
# layers (scripts/check-layers.py: no import from the core to a face, none between the faces, no loop), and
# make install.
run_group "readme" python3 scripts/check-readme.py
run_group "layers" python3 scripts/check-layers.py
run_group "install" bash scripts/check-install.sh

# 8. GPU tests: compiled by make; run by `make gpu-test` on a machine with two GPUs.
gpu_tests=0
for program in build/tests/gpu/*; do
  [[ -f $program && -x $program ]] && gpu_tests=$((gpu_tests + 1))
done
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || gpus=0
fi
if ((gpus < 2)); then
  skip_group "GPU tests" "$gpu_tests" "compiled, not run: they need 2 GPUs and this machine has $gpus (make gpu-test)"
else
  echo "NOTE GPU tests: $gpu_tests compiled; this machine has $gpus GPUs: run them with make gpu-test"
fi

if ((${#skip_notes[@]})); then
  echo "skipped:"
  printf '  %s\n' "${skip_notes[@]}"
fi
if ((${#failures[@]})); then
  echo "failed: ${failures[*]} (logs in $logs/)"
fi
echo "summary: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
