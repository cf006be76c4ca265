#!/usr/bin/env bash
# Runs the two-GPU benchmarks (built into build/bench) and prints their results as markdown tables for
# docs/PERFORMANCE.md. Full logs go to $BENCH_LOG_DIR (default build/bench-logs). Every benchmark checks
# its data word by word before timing; a result whose check failed is marked as such.
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 1
bin_dir="${BENCH_BIN_DIR:-build/bench}"
log_dir="${BENCH_LOG_DIR:-build/bench-logs}"

# shellcheck source=../../scripts/gpu-env.sh
source scripts/gpu-env.sh
require_gpus "benchmarks"
mkdir -p "$log_dir"

status=0
# run_bench NAME LIMIT_SECONDS: runs $bin_dir/NAME with 2 ranks, log in $log_dir/NAME.log
run_bench() {
  local name=$1 limit=$2
  local log="$log_dir/$name.log"
  if [ ! -x "$bin_dir/$name" ]; then
    echo "FAIL $name: $bin_dir/$name is missing (not built)"
    status=1
    return
  fi
  echo "== $name (limit ${limit}s, log $log)" >&2
  local t0 rc
  t0=$(date +%s)
  timeout -k 10 "$limit" "$bin_dir/$name" 2 >"$log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] || grep -q '^FAIL ' "$log"; then
    echo "FAIL $name: exit code $rc; failed cases:"
    grep '^FAIL ' "$log" | sed 's/^/   /'
    tail -n 15 "$log" | sed 's/^/   | /'
    status=1
  fi
  echo "-- $name: exit code $rc, $(($(date +%s) - t0))s" >&2
}

run_bench pingpong 60
run_bench bidir_put 90
# The same two programs compiled against the 0.1.0 header (its device code, our library): built only
# where that header was found (make legacy-abi).
legacy=0
if [ -x "$bin_dir/legacy/pingpong" ] && [ -x "$bin_dir/legacy/bidir_put" ]; then
  legacy=1
  mkdir -p "$log_dir/legacy"
  run_bench legacy/pingpong 60
  run_bench legacy/bidir_put 90
else
  echo "legacy-header builds of pingpong/bidir_put not found in $bin_dir/legacy: their column is left out" >&2
fi
run_bench allgather_bench 150
run_bench direct_bench 90
run_bench peer_copy_ceiling 60
run_bench graph_floor 60
run_bench proxy_floor 120

# Our collectives against NCCL (examples-c/bench/compare_collectives.py: collectives_bench, then
# nccl_collectives.py through torch), unless BENCH_COLLECTIVES=0. Its table is printed with the others below;
# its logs go to $log_dir/collectives. Without torch it measures ours from C only and says so.
coll_table=""
if [ "${BENCH_COLLECTIVES:-1}" != 0 ]; then
  py=${PYTHON:-python3}
  if command -v "$py" >/dev/null 2>&1; then
    mkdir -p "$log_dir/collectives"
    coll_table="$log_dir/collectives/table.md"
    echo "== compare_collectives (logs in $log_dir/collectives)" >&2
    t0=$(date +%s)
    PYTHON="$py" timeout -k 10 3300 "$py" examples-c/bench/compare_collectives.py --log-dir "$log_dir/collectives" \
      >"$coll_table" 2>"$log_dir/collectives/driver.log"
    rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "FAIL compare_collectives: exit code $rc; failed cases:"
      grep '^FAIL' "$coll_table" "$log_dir"/collectives/*.log 2>/dev/null | sed 's/^/   /' | head -n 20
      status=1
    fi
    echo "-- compare_collectives: exit code $rc, $(($(date +%s) - t0))s" >&2
  else
    echo "compare_collectives: skipped ($py not found)" >&2
  fi
fi

# value KEY LINE: the value of KEY=... in a BENCH line
value() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
size_name() {
  local b=$1
  if [ $((b % 1073741824)) -eq 0 ]; then echo "$((b / 1073741824)) GiB"
  elif [ $((b % 1048576)) -eq 0 ]; then echo "$((b / 1048576)) MiB"
  elif [ $((b % 1024)) -eq 0 ]; then echo "$((b / 1024)) KiB"
  else echo "$b B"; fi
}
mark() { [ "$1" = "1" ] || echo " (data check FAILED)"; }

echo
echo "Measured $(date -u '+%Y-%m-%d') on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//; s/ / x /' | tr '\n' ' ')(two processes, one GPU each)."
echo
echo "### Two-GPU microbenchmarks (one thread per GPU, median of 5 repeats)"
echo
# md_rows: "a|b|c" lines as markdown table rows
md_rows() { awk -F'|' '{ s = "|"; for (i = 1; i <= NF; i++) s = s " " $i " |"; print s }'; }
# micro_rows DIR: "measure|figure" lines from the pingpong and bidir_put logs in DIR
micro_rows() {
  local dir=$1 line b
  line=$(grep '^BENCH pingpong ' "$dir/pingpong.log" 2>/dev/null | tail -n 1)
  if [ -n "$line" ]; then
    echo "ping-pong, one way|$(value one_way_us "$line") us"
  else
    echo "ping-pong, one way|n/a (failed, see $dir/pingpong.log)"
  fi
  local bidir
  bidir=$(grep '^BENCH bidir_put ' "$dir/bidir_put.log" 2>/dev/null)
  if [ -n "$bidir" ]; then
    while read -r line; do
      b=$(value bytes "$line")
      echo "bidirectional putWithSignal, $(size_name "$b")|$(value us_per_iter "$line") us per iteration, $(value GBps_per_direction "$line") GB/s per direction$(mark "$(value checked "$line")")"
    done <<<"$bidir"
  else
    echo "bidirectional putWithSignal|n/a (failed, see $dir/bidir_put.log)"
  fi
}
if [ "$legacy" = 1 ]; then
  echo "| measure | ours | legacy 0.1.0 device code (its header), our library |"
  echo "| --- | --- | --- |"
  paste -d'|' <(micro_rows "$log_dir") <(micro_rows "$log_dir/legacy" | cut -d'|' -f2) | md_rows
else
  echo "| measure | ours |"
  echo "| --- | --- |"
  micro_rows "$log_dir" | md_rows
fi

echo
echo "### All-gather (2 ranks; a CUDA graph of 10 kernels launched 10 times, 100 times up to 16 MiB; median of 5 repeats; algBW = whole buffer / time per kernel)"
echo
echo "| buffer | kernel 0 time | kernel 0 algBW | kernel 1 time | kernel 1 algBW |"
echo "| --- | --- | --- | --- | --- |"
ag=$(grep '^BENCH allgather ' "$log_dir/allgather_bench.log" 2>/dev/null)
if [ -n "$ag" ]; then
  for b in $(echo "$ag" | tr ' ' '\n' | sed -n 's/^bytes=//p' | sort -n | uniq); do
    row="| $(size_name "$b") |"
    for k in 0 1; do
      line=$(echo "$ag" | grep " kernel=$k bytes=$b " | tail -n 1)
      if [ -n "$line" ]; then
        row="$row $(value time_us "$line") us$(mark "$(value checked "$line")") | $(value algbw_GBps "$line") GB/s |"
      else
        row="$row n/a | n/a |"
      fi
    done
    echo "$row"
  done
else
  echo "| n/a (failed, see $log_dir/allgather_bench.log) | | | | |"
fi

echo
echo "### Proxy-free device methods (extension; one thread signals)"
echo
echo "| measure | ours |"
echo "| --- | --- |"
# bench_rows LOG PREFIX ROW_FN FAIL_ROW: ROW_FN LINE for each "BENCH PREFIX..." line of LOG, else FAIL_ROW
bench_rows() {
  local lines line
  lines=$(grep "^BENCH $2" "$1" 2>/dev/null)
  if [ -z "$lines" ]; then
    echo "$4"
    return
  fi
  while read -r line; do "$3" "$line"; done <<<"$lines"
}
direct_row() {
  case $1 in
    "BENCH direct_pingpong "*) echo "| ping-pong one way, $(value mode "$1") | $(value one_way_us "$1") us |" ;;
    "BENCH direct_copy "*) echo "| directPutBlock $( [ "$(value directions "$1")" = 1 ] && echo "one way" || echo "both ways at once"), $(size_name "$(value bytes "$1")"), $(value blocks "$1") blocks of $(value threads "$1") | $(value time_us "$1") us, $(value gbps_per_direction "$1") GB/s per direction |" ;;
  esac
}
bench_rows "$log_dir/direct_bench.log" direct_ direct_row "| proxy-free methods | n/a (failed, see $log_dir/direct_bench.log) |"

echo
echo "### The link's ceilings, without this library (1 GiB, one process driving both GPUs, median of 5 repeats)"
echo
echo "| copied by | directions | GB/s per direction |"
echo "| --- | --- | --- |"
ceiling_row() {
  local how
  how=$(value method "$1" | sed 's/copy_engine/copy engine/; s/sm_write/SM writes/; s/sm_read/SM reads/; s/+/ + /')
  case $how in *" + "*) how="$how ($(awk -v s="$(value sm_share "$1")" 'BEGIN { printf "%d%%", s * 100 }') by SMs)" ;; esac
  [ "$(value blocks "$1")" = 0 ] || how="$how, $(value blocks "$1") blocks"
  echo "| $how | $(value directions "$1") | $(value gbps_per_direction "$1")$(mark "$(value checked "$1")") |"
}
bench_rows "$log_dir/peer_copy_ceiling.log" "peer_copy " ceiling_row "| n/a (failed, see $log_dir/peer_copy_ceiling.log) | | |"

echo
echo "### The floor of a host proxy, without this library (proxy_floor: one put and its flag each way per iteration, median of 5 repeats)"
echo
echo "| memory | way | size | time per iteration | GB/s per direction | CPU per request |"
echo "| --- | --- | --- | --- | --- | --- |"
floor_row() {
  echo "| $(value mode "$1") | $(value way "$1") | $(size_name "$(value bytes "$1")") | $(value us_per_iter "$1") us | $(value GBps_per_direction "$1")$(mark "$(value checked "$1")") | $(value cpu_us_per_request "$1") us |"
}
bench_rows "$log_dir/proxy_floor.log" "proxy_floor " floor_row "| n/a (failed, see $log_dir/proxy_floor.log) | | | | | |"

echo
echo "### The floor of a small collective in a CUDA graph, without this library (graph_floor: us per kernel, median of 5)"
echo
grep -E '^(graph_floor|SKIP graph_floor)' "$log_dir/graph_floor.log" 2>/dev/null || echo "n/a (failed, see $log_dir/graph_floor.log)"

if [ -n "$coll_table" ]; then
  if [ -s "$coll_table" ]; then
    cat "$coll_table"
  else
    echo
    echo "### Collectives against NCCL"
    echo
    echo "n/a (failed, see $log_dir/collectives/driver.log)"
  fi
fi
exit "$status"
