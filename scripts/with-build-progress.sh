#!/usr/bin/env bash
# Runs a command (the Makefile's cargo builds) and shows build.rs's progress lines on standard error as they
# are written: cargo shows a build script's output only with -vv, so build.rs appends its lines (the CUDA
# kernels' compile: one per unit, and one at least every 20 s) to the file LIBMSCCLPP_BUILD_PROGRESS names,
# which this script prints as it grows. Exits with the command's status.
# Usage: scripts/with-build-progress.sh COMMAND [ARGS...]
set -u

file=$(mktemp "${TMPDIR:-/tmp}/libmscclpp-build-progress.XXXXXX") || exec "$@"
cmd=
tailer=
cleanup() {
  [[ -n $cmd ]] && kill "$cmd" 2>/dev/null
  [[ -n $tailer ]] && kill "$tailer" 2>/dev/null
  rm -f "$file"
}
trap 'cleanup; exit 130' INT TERM
trap 'rm -f "$file"' EXIT

LIBMSCCLPP_BUILD_PROGRESS=$file "$@" &
cmd=$!
# --pid: tail reads what is left and ends once the command has ended.
tail -n +1 -s 1 -f --pid="$cmd" "$file" >&2 &
tailer=$!
wait "$cmd"
rc=$?
cmd=
wait "$tailer" 2>/dev/null
tailer=
exit "$rc"
