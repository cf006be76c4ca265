#!/usr/bin/env bash
# The NCCL face's tests that need no GPU (after `make`):
# - nccl.h compiles alone, warnings as errors, as C11 and C17 (gcc) and as C++11, 14, 17 and 20 (g++);
# - nccl_device/host.h (the device API's host side) compiles alone and after nccl.h;
# - libnccl.so.2's soname, and its exported names: exactly those of NVIDIA's libnccl.so.2 2.32.3 (nccl.h's
#   functions and the device API's host side, each with its pnccl twin), nothing named mscclpp*;
# - libnccl.so.2 is thin: its functions are, one for one, those the core (libmscclpp.so.0) exports under the
#   prefix mscclpp_nccl_face_; it needs the core alone, finds it one folder up ($ORIGIN/..), binds at load,
#   and holds no kernel; the core exports no nccl* name (a program that loads it beside NVIDIA's NCCL keeps
#   NVIDIA's);
# - the functions that torch, vLLM, sglang, nccl4py, cupy and JAX use, and NVIDIA's nccl.h and libnccl.so.2
#   declare and export, from the lists in c-tests/nccl/names/ (check_wheel_names.sh);
# - every program built from c-tests/nccl/*.cpp (build/tests/nccl/), which counts its own checks, but
#   control_plane_bench;
# - control_plane_bench (the control plane with host-only processes: init, a SIGKILLed rank, detection,
#   shrink) at 256 ranks, a size this 2-core CI carries (about a second), and at 64 ranks with the last
#   rank stopped (SIGSTOP, found by its silence after MSCCLPP_PEER_TIMEOUT=1): one verdict each, PASS when
#   every rank initialised, every survivor learned of the failure and every survivor's shrink made a
#   communicator of the right size and ranks; its figures are the verdict's note, never asserted; and at 16
#   ranks beside a CUDA driver that sees no device (build/tests/nccl/fake-cuda: cuInit fails), as a GPU
#   machine's ranks with CUDA_VISIBLE_DEVICES= are.
# Ends with "nccl tests: N passed, N failed".
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
include="$repo/build/include"
lib="$repo/build/lib/nccl/libnccl.so.2"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# shellcheck source=verdict.sh
source "$here/verdict.sh"

# 1. The header alone, in every language standard.
for std in c11 c17; do
  msg=$(gcc -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c - <<<'#include <nccl.h>' 2>&1)
  verdict "nccl.h compiles as $std" $? "$msg"
done
for std in c++11 c++14 c++17 c++20; do
  msg=$(g++ -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c++ - <<<'#include <nccl.h>
ncclConfig_t config = NCCL_CONFIG_INITIALIZER; ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
ncclCollConfig_t coll = NCCL_COLLCONFIG_INITIALIZER; ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;' 2>&1)
  verdict "nccl.h compiles as $std" $? "$msg"
done
# The device API's host side, alone and after nccl.h.
for std in c11 c17; do
  msg=$(gcc -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c - <<<'#include <nccl_device/host.h>' 2>&1)
  verdict "nccl_device/host.h compiles as $std" $? "$msg"
done
for std in c++11 c++20; do
  msg=$(g++ -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c++ - <<<'#include <nccl.h>
#include <nccl_device/host.h>
ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;' 2>&1)
  verdict "nccl_device/host.h compiles as $std" $? "$msg"
done

# 2. The library's name and exports.
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libnccl.so.2 ]
verdict "libnccl.so.2's soname is libnccl.so.2 (got '$soname')" $?

# Exactly the names NVIDIA's libnccl.so.2 of the version we claim exports (c-tests/nccl/names/): nccl.h's
# functions, the host side of its device API (nccl_device/host.h), each with its pnccl twin, and
# ncclResetDebugInitInternal.
expected=$(grep -v '^#' "$here/names/nccl-2.32.3-exports.txt" | sort)
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sort)
diffs=$(diff <(echo "$expected") <(echo "$exported"))
verdict "libnccl.so.2 exports exactly NVIDIA 2.32.3's names ($(echo "$exported" | wc -l) names)" \
  $([ -z "$diffs" ] && echo 0 || echo 1) "$diffs"
ours=$(grep -i mscclpp <<<"$exported")
verdict "libnccl.so.2 exports nothing named mscclpp*" $([ -z "$ours" ] && echo 0 || echo 1) "$ours"

# The thin library over the core.
core="$repo/build/lib/libmscclpp.so.0.1.0"
core_exports=$(nm -D --defined-only "$core" | awk '{print $NF}' | sort)
theirs=$(grep -E '^p?nccl' <<<"$core_exports")
verdict "libmscclpp.so exports no nccl* or pnccl* name" $([ -z "$theirs" ] && echo 0 || echo 1) "$theirs"
faces=$(sed -n 's/^mscclpp_nccl_face_//p' <<<"$core_exports" | sort)
diffs=$(diff <(echo "$faces") <(echo "$exported"))
verdict "libnccl.so.2's functions are the core's mscclpp_nccl_face_* ($(echo "$faces" | wc -l)), one for one" \
  $([ -n "$faces" ] && [ -z "$diffs" ] && echo 0 || echo 1) "$diffs"
dynamic=$(readelf -d "$lib" 2>&1)
needed=$(sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p' <<<"$dynamic" | xargs)
runpath=$(sed -n 's/.*(RUNPATH).*Library runpath: \[\(.*\)\]/\1/p' <<<"$dynamic")
[ "$needed" = libmscclpp.so.0 ] && [ "$runpath" = '$ORIGIN/..' ] && grep -q 'Flags:.*NOW' <<<"$dynamic"
verdict "libnccl.so.2 needs libmscclpp.so.0 alone (got '$needed'), run path \$ORIGIN/.. (got '$runpath'), binds now" $? \
  "$dynamic"
loads=$(env -u LD_LIBRARY_PATH ldd "$lib" 2>&1 | awk '$1 == "libmscclpp.so.0" { print $3 }')
[ -n "$loads" ] && [ "$(readlink -f "$loads")" = "$(readlink -f "$core")" ]
verdict "libnccl.so.2 loads build/lib's libmscclpp.so.0 (got '$loads')" $?
size=$(stat -c %s "$lib")
# A CUDA fatbin starts with the magic 0xBA55ED50 (little-endian): the core holds the kernels, and only it.
fatbins=$(LC_ALL=C grep -c -a $'\x50\xed\x55\xba' "$lib")
[ "$size" -lt 1000000 ] && [ "$fatbins" -eq 0 ] && [ "$(LC_ALL=C grep -c -a $'\x50\xed\x55\xba' "$core")" -gt 0 ]
verdict "libnccl.so.2 holds no kernel, and is $size bytes (under 1 MB); the core holds them" $?

# 3. The functions that pinned wheels use, and NVIDIA's own API (c-tests/nccl/names/): one verdict per list.
log=$(bash "$here/check_wheel_names.sh" "$lib" "$include" 2>&1)
rc=$?
if [[ $(tail -n 1 <<<"$log") =~ ^wheel\ names:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
  sed '$d' <<<"$log"
else
  verdict "check_wheel_names.sh (exit status $rc)" 1 "$log"
fi

# 4. The programs.
for program in "$repo"/build/tests/nccl/*; do
  [ -f "$program" ] && [ -x "$program" ] || continue
  name=$(basename "$program")
  [ "$name" = control_plane_bench ] && continue # below, with its size
  timeout -k 10 300 "$program" </dev/null >"$out/$name.log" 2>&1
  rc=$?
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$out/$name.log" | tail -n 1)
  if [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    ((rc == 0 || BASH_REMATCH[2] > 0)) || failed=$((failed + 1))
    grep -E '^(PASS|FAIL)' "$out/$name.log" | sed "s/^/$name: /" | grep -E ': FAIL' || true
    echo "$name: $line"
  else
    verdict "$name (exit status $rc)" "$rc" "$(tail -n 40 "$out/$name.log")"
  fi
  ((rc == 0)) || sed 's/^/    /' "$out/$name.log" | tail -n 80
done

# 5. The control plane's benchmark at 256 ranks, killed, and at 64, stopped (a few seconds together here; its
#    own deadline bounds every step, and a failure ends within about 45 s, the bootstrap's 30 s timeout
#    included).
bench="$repo/build/tests/nccl/control_plane_bench"
if [ -x "$bench" ]; then
  for run in "256" "64 --stop"; do
    ranks=${run%% *}
    how=killed
    [ "$run" = "$ranks" ] || how=stopped
    log="$out/control_plane_bench.$ranks.log"
    # shellcheck disable=SC2086 # the run's words are the options
    timeout -k 10 150 "$bench" --timeout 90 $run </dev/null >"$log" 2>&1
    rc=$?
    figures=$(sed -n "s/^ranks $ranks: //p" "$log" | tail -n 1)
    verdict "control_plane_bench, $ranks host-only ranks, the last $how: ${figures:-no figures (exit status $rc)}" \
      "$rc" "$(tail -n 40 "$log")"
  done
  # With a CUDA driver that sees no device, as on a GPU machine with CUDA_VISIBLE_DEVICES= (the fake's cuInit
  # fails with CUDA_ERROR_NO_DEVICE): every rank initialises host-only, and none waits on itself naming the
  # driver's error.
  log="$out/control_plane_bench.no-device.log"
  LD_LIBRARY_PATH="$repo/build/tests/nccl/fake-cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout -k 10 120 "$bench" --timeout 60 16 </dev/null >"$log" 2>&1
  rc=$?
  figures=$(sed -n "s/^ranks 16: //p" "$log" | tail -n 1)
  verdict "control_plane_bench, 16 ranks beside a CUDA driver that sees no device: ${figures:-no figures (exit status $rc)}" \
    "$rc" "$(tail -n 40 "$log")"
else
  verdict "control_plane_bench was built" 1 "$bench is missing: run make"
fi

echo "nccl tests: $passed passed, $failed failed"
((failed == 0))
