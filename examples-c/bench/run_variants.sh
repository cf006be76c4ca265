#!/usr/bin/env bash
# Runs one two-GPU benchmark under several environment settings, one after the other on this machine, so
# that their figures compare (machines of one model differ more than most changes do). Prints each
# setting's BENCH lines; full logs go to $BENCH_LOG_DIR (default build/bench-logs).
#
#   examples-c/bench/run_variants.sh BENCH_NAME "SETTING" ["SETTING" ...]
#   e.g. run_variants.sh bidir_put "" "MSCCLPP_P2P_FLAG=write" "MSCCLPP_PROXY_CPUS=0-7"
#
# A setting is a space-separated list of VAR=value ("" for the defaults).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 1
# shellcheck source=../../scripts/gpu-env.sh
source scripts/gpu-env.sh
require_gpus "benchmarks"
[ $# -ge 2 ] || { echo "usage: $0 BENCH_NAME SETTING [SETTING...]" >&2; exit 2; }
name=$1
shift
bin="${BENCH_BIN_DIR:-build/bench}/$name"
log_dir="${BENCH_LOG_DIR:-build/bench-logs}"
mkdir -p "$log_dir"
[ -x "$bin" ] || { echo "FAIL $name: $bin is missing (not built)"; exit 1; }
status=0
i=0
for setting in "$@"; do
  i=$((i + 1))
  log="$log_dir/$name.variant$i.log"
  mkdir -p "$(dirname "$log")"
  # shellcheck disable=SC2086 # the setting is a list of words on purpose
  env $setting MSCCLPP_DEBUG="${MSCCLPP_DEBUG:-INFO}" timeout -k 10 150 "$bin" 2 >"$log" 2>&1
  rc=$?
  echo "## ${setting:-defaults} (exit $rc, log $log)"
  grep '^BENCH ' "$log"
  grep -h "time to serve a trigger" "$log" | sed 's/.*proxy stopped/  proxy stopped/' | head -n 2
  if [ "$rc" -ne 0 ] || grep -q '^FAIL ' "$log"; then status=1; grep '^FAIL ' "$log" | head -n 5; fi
done
exit "$status"
