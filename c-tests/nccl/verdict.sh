# Sourced by the NCCL face's host-test scripts: the passed/failed counts and one PASS or FAIL line per check.
passed=0
failed=0

verdict() { # verdict NAME STATUS [DETAILS]
  if [ "$2" -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $1"
  else
    failed=$((failed + 1))
    echo "FAIL $1"
    [ -n "${3:-}" ] && printf '%s\n' "$3" | sed 's/^/    /'
  fi
}
