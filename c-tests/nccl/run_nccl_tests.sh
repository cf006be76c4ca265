#!/usr/bin/env bash
# The NCCL face's tests that need no GPU (after `make`):
# - nccl.h compiles alone, warnings as errors, as C11 and C17 (gcc) and as C++11, 14, 17 and 20 (g++);
# - libnccl.so.2's soname, and its exported names: exactly nccl.h's functions and ncclDevCommCreate/Destroy,
#   each with its pnccl twin (which covers the 38 names PyTorch links), nothing named mscclpp*;
# - the functions that torch, vLLM, sglang, nccl4py, cupy and JAX use, and NVIDIA's nccl.h and libnccl.so.2
#   declare and export, from the lists in c-tests/nccl/names/ (check_wheel_names.sh);
# - every program built from c-tests/nccl/*.cpp (build/tests/nccl/), which counts its own checks.
# Ends with "nccl tests: N passed, N failed".
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
include="$repo/build/include"
lib="$repo/build/lib/nccl/libnccl.so.2"
passed=0
failed=0
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

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

# 1. The header alone, in every language standard.
for std in c11 c17; do
  msg=$(gcc -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c - <<<'#include <nccl.h>' 2>&1)
  verdict "nccl.h compiles as $std" $? "$msg"
done
for std in c++11 c++14 c++17 c++20; do
  msg=$(g++ -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$include" -x c++ - <<<'#include <nccl.h>
ncclConfig_t config = NCCL_CONFIG_INITIALIZER; ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;' 2>&1)
  verdict "nccl.h compiles as $std" $? "$msg"
done

# 2. The library's name and exports.
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libnccl.so.2 ]
verdict "libnccl.so.2's soname is libnccl.so.2 (got '$soname')" $?

functions="ncclMemAlloc ncclMemFree ncclGetVersion ncclGetUniqueId ncclCommInitRankConfig ncclCommInitRank
ncclCommInitAll ncclCommInitRankScalable ncclCommFinalize ncclCommDestroy ncclCommAbort ncclCommRevoke
ncclCommSplit ncclCommShrink ncclGetErrorString ncclGetLastError ncclCommGetAsyncError ncclCommCount
ncclCommCuDevice ncclCommUserRank ncclCommRegister ncclCommDeregister ncclCommWindowRegister
ncclCommWindowDeregister ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclBcast ncclBroadcast
ncclAllReduce ncclReduceScatter ncclAllGather ncclAlltoAll ncclGather ncclScatter ncclSend ncclRecv
ncclGroupStart ncclGroupEnd ncclGroupSimulateEnd ncclDevCommCreate ncclDevCommDestroy"
pytorch="ncclAllGather ncclAllReduce ncclAlltoAll ncclBcast ncclBroadcast ncclCommAbort ncclCommCount
ncclCommDeregister ncclCommDestroy ncclCommFinalize ncclCommGetAsyncError ncclCommInitAll ncclCommInitRank
ncclCommInitRankConfig ncclCommInitRankScalable ncclCommRegister ncclCommShrink ncclCommSplit ncclCommUserRank
ncclCommWindowDeregister ncclCommWindowRegister ncclDevCommCreate ncclDevCommDestroy ncclGetErrorString
ncclGetLastError ncclGetUniqueId ncclGetVersion ncclGroupEnd ncclGroupSimulateEnd ncclGroupStart ncclMemAlloc
ncclMemFree ncclRecv ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclReduceScatter ncclSend"
expected=$(for f in $functions; do echo "$f"; echo "p$f"; done | sort)
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sort)
diffs=$(diff <(echo "$expected") <(echo "$exported"))
verdict "libnccl.so.2 exports exactly nccl.h's functions and their pnccl twins ($(echo "$exported" | wc -l) names)" \
  $([ -z "$diffs" ] && echo 0 || echo 1) "$diffs"
missing=$(for f in $pytorch; do grep -qx "$f" <<<"$exported" || echo "$f"; done)
verdict "libnccl.so.2 defines the $(echo $pytorch | wc -w) names PyTorch links" $([ -z "$missing" ] && echo 0 || echo 1) "$missing"
ours=$(grep -i mscclpp <<<"$exported")
verdict "libnccl.so.2 exports nothing named mscclpp*" $([ -z "$ours" ] && echo 0 || echo 1) "$ours"
theirs=$(nm -D --defined-only "$repo/build/lib/libmscclpp.so.0.1.0" | awk '{print $NF}' | grep -i nccl)
verdict "libmscclpp.so exports nothing named nccl*" $([ -z "$theirs" ] && echo 0 || echo 1) "$theirs"

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

echo "nccl tests: $passed passed, $failed failed"
((failed == 0))
