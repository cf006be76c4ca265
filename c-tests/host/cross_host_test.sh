#!/usr/bin/env bash
# The TCP bootstrap across hosts: the ranks of one job run in two Linux network namespaces, "host A" and
# "host B", joined by a veth pair, each with its own address (10.211.X.1 and 10.211.X.2) and its own
# loopback. Rank 0, and so the root, is on A. Each job passes only if every rank passes bootstrap_test's
# checks (all-gathers of several sizes with verified content, barriers, destroy) and the debug log shows
# every rank listening at its own host's address, the root seeing B's ranks arrive from B's address.
# The interleaved layouts make ranks on A connect to listeners on B, so B must advertise an address that
# A can reach. Nothing leaves the machine: the addresses exist only inside the namespaces.
#
# Needs root and iproute2 (ip netns, veth); without them it prints "cross-host tests: skipped (why)" and
# exits 0. Otherwise it prints a PASS/FAIL line per job and ends with "cross-host tests: N passed, N failed".
#
#   cross_host_test.sh [path/to/bootstrap_test]    (default: build/tests/host/bootstrap_test)
# CROSS_HOST_TIMEOUT bounds each invocation of bootstrap_test (seconds, default 30).
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$(dirname "$here")")"
bin="${1:-${HOST_TEST_DIR:-$repo/build/tests/host}/bootstrap_test}"
limit="${CROSS_HOST_TIMEOUT:-30}"
# The test picks the interface and the log destination itself.
unset MSCCLPP_SOCKET_IFNAME MSCCLPP_DEBUG_FILE

skip() {
  echo "cross-host tests: skipped ($*)"
  exit 0
}

if [ ! -x "$bin" ]; then
  echo "FAIL cross_host: $bin is not built"
  echo "cross-host tests: 0 passed, 1 failed"
  exit 1
fi
[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null 2>&1 || skip "no ip command; iproute2 is not installed"

# Names unique to this run; interface names must stay within 15 characters.
tag="$$"
ns_a="mscclpp-xh-$tag-a"
ns_b="mscclpp-xh-$tag-b"
veth_a="xh${tag}a"
veth_b="xh${tag}b"
subnet="10.211.$((tag % 250 + 1))"
ip_a="$subnet.1"
ip_b="$subnet.2"
tmp="$(mktemp -d)"
jobs_running=()

cleanup() {
  local pid
  for pid in "${jobs_running[@]}"; do
    kill "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  # Deleting a namespace deletes its end of the veth pair; the pair goes with the first.
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Both hosts, their link and their addresses; any failure here is the machine's, so the run is skipped.
setup() {
  ip netns add "$ns_a" && ip netns add "$ns_b" &&
    ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" &&
    ip -n "$ns_a" addr add "$ip_a/24" dev "$veth_a" &&
    ip -n "$ns_b" addr add "$ip_b/24" dev "$veth_b" &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
    ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up &&
    ip netns exec "$ns_a" true
}
if ! why="$(setup 2>&1)"; then
  skip "cannot set up network namespaces: $(echo "$why" | tr '\n' ' ' | sed 's/ *$//')"
fi
# The link is usable once both ends report a carrier.
for _ in $(seq 50); do
  ip -n "$ns_a" link show "$veth_a" | grep -q LOWER_UP && ip -n "$ns_b" link show "$veth_b" | grep -q LOWER_UP && break
  sleep 0.1
done

passed=0
failed=0
job_no=0
port_base=$((20000 + RANDOM % 20000))

# The debug line of a rank's listen address, and the root's line of a rank's arrival (see src/bootstrap).
listens_at() { grep -qE "rank $1 BOOTSTRAP: joined the root at [^;]*; listening at ${2//./\\.}:[0-9]+" "$3"; }
arrived_from() { grep -qE "rank $1 joined from ${2//./\\.}:[0-9]+" "$3"; }

# job N addr|id PART...: one job of N ranks; each PART is HOST:FIRST:COUNT (HOST a or b), one invocation
# of bootstrap_test running ranks FIRST..FIRST+COUNT-1 in that host's namespace.
job() {
  local n=$1 mode=$2
  shift 2
  job_no=$((job_no + 1))
  local verb target
  if [ "$mode" = addr ]; then
    verb=join
    target="$ip_a:$((port_base + job_no))"
  else
    verb=join-id
    target="$tmp/id.$job_no"
  fi
  local parts=() logs=() hosts=() firsts=() counts=() desc="" part host first count ns log i
  for part in "$@"; do
    IFS=: read -r host first count <<<"$part"
    hosts+=("$host")
    firsts+=("$first")
    counts+=("$count")
    desc+="${desc:+, }${host^^}: $first-$((first + count - 1))"
  done
  local label="cross_host $n $mode ($desc)"
  # "ranks F-L on H" for part i, in messages.
  where() { echo "ranks ${firsts[$1]}-$((firsts[$1] + counts[$1] - 1)) on ${hosts[$1]^^}"; }
  local start end
  start=$(date +%s.%N)
  jobs_running=()
  for i in "${!hosts[@]}"; do
    ns=$ns_a
    [ "${hosts[$i]}" = b ] && ns=$ns_b
    log="$tmp/job$job_no.part$i.log"
    logs+=("$log")
    MSCCLPP_DEBUG=DEBUG timeout -k 5 "$limit" ip netns exec "$ns" \
      "$bin" "$verb" "$n" "$target" "${firsts[$i]}" "${counts[$i]}" </dev/null >"$log" 2>&1 &
    jobs_running+=($!)
  done
  local problems=() rc
  for i in "${!jobs_running[@]}"; do
    wait "${jobs_running[$i]}"
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      problems+=("$(where "$i"): no result within ${limit}s")
    elif [ "$rc" -ne 0 ]; then
      problems+=("$(where "$i"): exit status $rc")
    fi
  done
  jobs_running=()
  end=$(date +%s.%N)
  if [ "${#problems[@]}" -eq 0 ]; then
    # Every rank listened at its own host's address, and the root (with rank 0) saw B's ranks from B.
    local root_log="" r ip
    for i in "${!hosts[@]}"; do
      [ "${firsts[$i]}" -eq 0 ] && root_log=${logs[$i]}
    done
    for i in "${!hosts[@]}"; do
      ip=$ip_a
      [ "${hosts[$i]}" = b ] && ip=$ip_b
      for ((r = firsts[i]; r < firsts[i] + counts[i]; r++)); do
        listens_at "$r" "$ip" "${logs[$i]}" || problems+=("rank $r on ${hosts[$i]^^}: no log line of it listening at $ip")
        if [ "${hosts[$i]}" = b ]; then
          arrived_from "$r" "$ip_b" "$root_log" || problems+=("the root: no log line of rank $r joining from $ip_b")
        fi
      done
    done
  fi
  local took
  took=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }')
  if [ "${#problems[@]}" -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $label (${took}s)"
  else
    failed=$((failed + 1))
    echo "FAIL $label after ${took}s:"
    printf '    %s\n' "${problems[@]}"
    for i in "${!logs[@]}"; do
      echo "    -- $(where "$i"):"
      grep -v ' TRACE ' "${logs[$i]}" | tail -n 25 | sed 's/^/      /'
    done
  fi
}

for mode in addr id; do
  job 2 "$mode" a:0:1 b:1:1
  job 8 "$mode" a:0:3 b:3:5
  # Ranks on A above ranks on B: they connect to B's listeners.
  job 8 "$mode" a:0:2 b:2:2 a:4:2 b:6:2
done

echo "cross-host tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
