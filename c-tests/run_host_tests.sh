#!/usr/bin/env bash
# Runs every built host test in build/tests/host/. A test with a file c-tests/host/<name>.cases runs once
# per line of that file (the line holds its arguments; '#' starts a comment); any other test runs once
# without arguments. Each run has a time limit (HOST_TEST_TIMEOUT seconds, default 300).
# Then host/cross_host_test.sh runs bootstrap_test's ranks on two "hosts" (network namespaces); each of its
# jobs counts as a test, and where namespaces cannot be made it counts as one skipped test.
# Ends with the line "host tests: N passed, N failed, N skipped" and exits non-zero if any run failed or
# none ran.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
bin_dir="${HOST_TEST_DIR:-$repo/build/tests/host}"
limit="${HOST_TEST_TIMEOUT:-300}"
passed=0
failed=0
skipped=0
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

# run NAME [ARGS...]: runs one test and prints its verdict; the output is shown when it fails.
run() {
  local name="$1"
  shift
  local label="$name${*:+ $*}"
  local start end rc
  start=$(date +%s.%N)
  timeout -k 10 "$limit" "$bin_dir/$name" "$@" </dev/null >"$out" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local took
  took=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }')
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $label (${took}s)"
  else
    failed=$((failed + 1))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "FAIL $label: no result within ${limit}s"
    else
      echo "FAIL $label: exit status $rc after ${took}s"
    fi
    sed 's/^/    /' "$out" | tail -n 60
  fi
}

shopt -s nullglob
tests=("$bin_dir"/*)
ran=0
for path in "${tests[@]}"; do
  [ -f "$path" ] && [ -x "$path" ] || continue
  name="$(basename "$path")"
  cases="$here/host/$name.cases"
  if [ -f "$cases" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
      line="${line%%#*}"
      # Split the line into arguments on white space.
      read -r -a args <<<"$line"
      [ "${#args[@]}" -eq 0 ] && continue
      run "$name" "${args[@]}"
      ran=$((ran + 1))
    done <"$cases"
  else
    run "$name"
    ran=$((ran + 1))
  fi
done

# The bootstrap across hosts. Its PASS/FAIL lines are shown as they are; its summary line is counted here.
cross_host() {
  local rc summary
  timeout -k 10 "$limit" bash "$here/host/cross_host_test.sh" "$bin_dir/bootstrap_test" </dev/null >"$out" 2>&1
  rc=$?
  grep -v '^cross-host tests: ' "$out"
  summary=$(grep '^cross-host tests: ' "$out" | tail -n 1)
  if [[ $summary =~ ^cross-host\ tests:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    ran=$((ran + BASH_REMATCH[1] + BASH_REMATCH[2]))
    # A script that reports no failure yet exits non-zero still failed.
    if [ "$rc" -ne 0 ] && [ "${BASH_REMATCH[2]}" -eq 0 ]; then
      failed=$((failed + 1))
      echo "FAIL cross_host: exit status $rc"
    fi
  elif [[ $summary =~ ^cross-host\ tests:\ skipped\ \((.*)\)$ ]] && [ "$rc" -eq 0 ]; then
    skipped=$((skipped + 1))
    echo "SKIP cross_host: ${BASH_REMATCH[1]}"
  else
    failed=$((failed + 1))
    ran=$((ran + 1))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "FAIL cross_host: no result within ${limit}s"
    else
      echo "FAIL cross_host: exit status $rc and no summary line"
    fi
  fi
}
if [ -x "$bin_dir/bootstrap_test" ]; then
  cross_host
fi

# mscclpp.h and mscclppfifo.h are C++ (as the 0.1.0 header was): included from C, each one's first error is
# its own #error saying so, not a syntax error further down.
headers_from_c() {
  local header first cc="${CC:-cc}"
  for header in mscclpp.h mscclppfifo.h; do
    if ! command -v "$cc" >/dev/null 2>&1; then
      skipped=$((skipped + 1))
      echo "SKIP $header from C: no C compiler ($cc)"
      continue
    fi
    ran=$((ran + 1))
    if printf '#include <%s>\n' "$header" | "$cc" -std=c11 -fsyntax-only -I "$repo/build/include" -x c - \
        >"$out" 2>&1; then
      failed=$((failed + 1))
      echo "FAIL $header from C: it compiled as C, though it is a C++ header"
      continue
    fi
    first=$(grep -m 1 'error' "$out")
    if [[ $first == *"#error"*"$header is a C++ header"* ]]; then
      passed=$((passed + 1))
      echo "PASS $header from C: stops at its #error ($first)"
    else
      failed=$((failed + 1))
      echo "FAIL $header from C: the first error is not the header's #error"
      sed 's/^/    /' "$out" | head -n 10
    fi
  done
}
if [ -f "$repo/build/include/mscclpp.h" ]; then
  headers_from_c
fi

if [ "$ran" -eq 0 ]; then
  echo "no host tests found in $bin_dir (build them with make first)"
fi
echo "host tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$ran" -gt 0 ]
