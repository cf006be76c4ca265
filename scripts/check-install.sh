#!/usr/bin/env bash
# `make test`'s check of `make install` and `make uninstall` (after `make`), into a staging tree:
#   make install DESTDIR=<temporary folder> PREFIX=/usr/local, then make uninstall with the same.
# Checks that install
# - puts no nccl.h and no libnccl* where they would shadow NVIDIA's (include/, lib/, lib/pkgconfig/), and our
#   nccl.h (with include/nccl_device/'s headers), libnccl.so.2 and nccl.pc under the prefix of their own;
# - installs the shared libraries stripped, each linked to a .debug file that holds its debug information,
#   exporting the same names as the libraries in build/, and the static library without debug information;
# - installs the thin libnccl.so.2 where it finds the installed core, libmscclpp.so.0, one folder up;
# - writes .pc files that name PREFIX, through which a program of each API compiles, links and runs
#   (each one's run path included);
# and that uninstall leaves the staging tree exactly as it was before install (files put there beforehand,
# as a user's, stay).
# Ends with "install tests: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
prefix=/usr/local
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dest=$stage/root
base=$dest$prefix
passed=0
failed=0

check() { # check NAME COMMAND...: a PASS or FAIL line for the command's status
  local name=$1
  shift
  if "$@" >"$stage/out" 2>&1; then
    passed=$((passed + 1))
    echo "PASS $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    sed 's/^/    /' "$stage/out" | tail -n 20
  fi
}

# A .pc file's field (Cflags, Libs, Libs.private, Version) with its variables expanded, the prefix read as
# `root` + its prefix (what pkg-config's PKG_CONFIG_SYSROOT_DIR does for -I and -L), without needing pkg-config.
pc_field() { # pc_field FILE FIELD ROOT
  awk -v field="$2" -v root="$3" '
    function expand(s,   name) {
      while (match(s, /\$\{[A-Za-z_]+\}/)) { name = substr(s, RSTART + 2, RLENGTH - 3); s = substr(s, 1, RSTART - 1) var[name] substr(s, RSTART + RLENGTH) }
      return s
    }
    /^[A-Za-z_]+=/ { i = index($0, "="); var[substr($0, 1, i - 1)] = expand(substr($0, i + 1)); if (substr($0, 1, i - 1) == "prefix") var["prefix"] = root var["prefix"] }
    index($0, field ": ") == 1 { print expand(substr($0, length(field) + 3)) }' "$1"
}

has_debug_info() { readelf -S "$1" 2>/dev/null | grep -q '\.debug_info'; }
exports() { nm -D --defined-only "$1" | awk '{ print $NF }' | sort; }

# Things of a user's in the staging tree beforehand, which neither install nor uninstall may touch.
mkdir -p "$base/include" "$base/lib/pkgconfig"
echo "/* someone else's */" >"$base/include/theirs.h"
echo "Name: theirs" >"$base/lib/pkgconfig/theirs.pc"
before=$(cd "$stage" && find . | sort)

if ! make --no-print-directory -s install DESTDIR="$dest" PREFIX="$prefix" >"$stage/install.log" 2>&1; then
  echo "FAIL make install DESTDIR=... PREFIX=$prefix"
  sed 's/^/    /' "$stage/install.log" | tail -n 30
  echo "install tests: 0 passed, 1 failed"
  exit 1
fi
check "make install DESTDIR=... PREFIX=$prefix" true

# Where things are.
check "no nccl.h directly in include/ (it would shadow NVIDIA's)" test ! -e "$base/include/nccl.h"
check "no libnccl* or nccl.pc in lib/ or lib/pkgconfig/" \
  bash -c "! ls '$base'/lib/libnccl* '$base'/lib/pkgconfig/nccl.pc 2>/dev/null | grep ."
check "include/mscclpp.h and mscclppfifo.h are build/include's" \
  bash -c "cmp build/include/mscclpp.h '$base/include/mscclpp.h' && cmp build/include/mscclppfifo.h '$base/include/mscclppfifo.h'"
check "include/mscclpp-nccl/nccl.h is build/include's (ours)" \
  bash -c "cmp build/include/nccl.h '$base/include/mscclpp-nccl/nccl.h' && grep -q NCCL_LIBMSCCLPP build/include/nccl.h"
device_headers=$(cd include && ls nccl_device/*.h 2>/dev/null)
check "include/mscclpp-nccl/ has every header of include/nccl_device/ ($(echo $device_headers | wc -w))" \
  bash -c "for h in $(echo $device_headers); do cmp include/\$h '$base/include/mscclpp-nccl/'\$h || exit 1; done"
check "lib/libmscclpp.so and .so.0 link to libmscclpp.so.0.1.0" \
  bash -c "[[ \$(readlink '$base/lib/libmscclpp.so') == libmscclpp.so.0 && \$(readlink '$base/lib/libmscclpp.so.0') == libmscclpp.so.0.1.0 ]]"
check "lib/mscclpp-nccl/libnccl.so links to libnccl.so.2" \
  bash -c "[[ \$(readlink '$base/lib/mscclpp-nccl/libnccl.so') == libnccl.so.2 ]]"

# Stripped, with the debug information beside.
for lib in lib/libmscclpp.so.0.1.0 lib/mscclpp-nccl/libnccl.so.2; do
  name=$(basename "$lib")
  built=build/$lib
  [[ $lib == lib/mscclpp-nccl/* ]] && built=build/lib/nccl/$name
  check "$lib is stripped (no .debug_info, no .symtab)" \
    bash -c "! readelf -S '$base/$lib' | grep -E '\.debug_info|\.symtab'"
  check "$lib names its debug file $(dirname "$lib")/.debug/$name.debug (.gnu_debuglink)" \
    bash -c "readelf --string-dump=.gnu_debuglink '$base/$lib' | grep -q '$name.debug' && test -s '$base/$(dirname "$lib")/.debug/$name.debug'"
  if has_debug_info "$built"; then
    check "$(dirname "$lib")/.debug/$name.debug holds the debug information" has_debug_info "$base/$(dirname "$lib")/.debug/$name.debug"
  fi
  check "$lib exports what $built does" diff <(exports "$built") <(exports "$base/$lib")
done
check "lib/libmscclpp.a has no debug information" bash -c "! readelf -S '$base/lib/libmscclpp.a' | grep -q '\.debug_info'"
check "lib/mscclpp-nccl/libnccl.so.2 loads the installed lib/libmscclpp.so.0 (its run path \$ORIGIN/..)" \
  bash -c "[[ \$(readlink -f \"\$(env -u LD_LIBRARY_PATH ldd '$base/lib/mscclpp-nccl/libnccl.so.2' | awk '\$1 == \"libmscclpp.so.0\" { print \$3 }')\") == '$base/lib/libmscclpp.so.0.1.0' ]]"
ls -l "$base/lib/libmscclpp.so.0.1.0" "$base/lib/libmscclpp.a" "$base/lib/mscclpp-nccl/libnccl.so.2" \
  build/lib/libmscclpp.so.0.1.0 build/lib/libmscclpp.a build/lib/nccl/libnccl.so.2 |
  awk '{ printf "     %s: %s\n", $NF, ($5 >= 1e6 ? sprintf("%.1f MB", $5 / 1e6) : sprintf("%.0f kB", $5 / 1e3)) }'

# The .pc files.
mscclpp_pc=$base/lib/pkgconfig/mscclpp.pc
nccl_pc=$base/lib/mscclpp-nccl/pkgconfig/nccl.pc
check "mscclpp.pc names PREFIX" grep -qx "prefix=$prefix" "$mscclpp_pc"
check "nccl.pc is in lib/mscclpp-nccl/pkgconfig/ and names PREFIX" grep -qx "prefix=$prefix" "$nccl_pc"
nccl_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) / { printf "%s%s", sep, $3; sep = "." }' build/include/nccl.h)
check "nccl.pc's version is nccl.h's ($nccl_version)" bash -c "[[ '$(pc_field "$nccl_pc" Version "")' == '$nccl_version' ]]"
if command -v pkg-config >/dev/null 2>&1; then
  check "pkg-config reads nccl.pc as this test does" bash -c "[[ \"\$(PKG_CONFIG_SYSROOT_DIR='$dest' PKG_CONFIG_PATH='$base/lib/mscclpp-nccl/pkgconfig' PKG_CONFIG_LIBDIR=/nonexistent pkg-config --cflags --libs nccl | xargs)\" == \"\$(echo $(pc_field "$nccl_pc" Cflags "$dest") $(pc_field "$nccl_pc" Libs "$dest") | xargs)\" ]]"
fi

# Programs built through the .pc files, against the installed tree only.
cat >"$stage/nccl_app.cpp" <<'EOF'
#include <nccl.h>
#include <cstdio>
#ifndef NCCL_LIBMSCCLPP
#error "not our nccl.h"
#endif
int main() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE) return 1;
  printf("ncclGetVersion: %d\n", v);
  return 0;
}
EOF
cat >"$stage/mscclpp_app.cpp" <<'EOF'
#include <mscclpp.h>
#include <cstdio>
#include <cstring>
int main() {
  mscclppUniqueId id;
  if (mscclppGetUniqueId(&id) != mscclppSuccess) return 1;
  mscclppComm_t comm = nullptr;
  int rank = -1;
  if (mscclppCommInitRankFromId(&comm, 1, id, 0) != mscclppSuccess || mscclppCommRank(comm, &rank) != mscclppSuccess ||
      rank != 0 || mscclppCommDestroy(comm) != mscclppSuccess)
    return 1;
  printf("%s\n", mscclppGetErrorString(mscclppInvalidUsage));
  return 0;
}
EOF
# shellcheck disable=SC2046
check "a program of NCCL's API builds through nccl.pc alone" \
  g++ -std=c++11 -Wall -Werror $(pc_field "$nccl_pc" Cflags "$dest") "$stage/nccl_app.cpp" -o "$stage/nccl_app" \
  $(pc_field "$nccl_pc" Libs "$dest")
check "nccl.pc's Libs set the run path to PREFIX/lib/mscclpp-nccl" \
  bash -c "[[ ' $(pc_field "$nccl_pc" Libs "") ' == *' -Wl,-rpath,$prefix/lib/mscclpp-nccl '* ]]"
# (Read with the staging tree as the root, that run path is the staging tree's folder.)
check "the program runs on the installed libnccl.so.2, found through that run path alone" \
  bash -c "env -u LD_LIBRARY_PATH '$stage/nccl_app' && env -u LD_LIBRARY_PATH ldd '$stage/nccl_app' | grep -q '=> $base/lib/mscclpp-nccl/libnccl.so.2'"
# shellcheck disable=SC2046
check "a program of mscclpp.h builds through mscclpp.pc" \
  bash -c "g++ -std=c++11 -Wall -Werror $(pc_field "$mscclpp_pc" Cflags "$dest") '$stage/mscclpp_app.cpp' -o '$stage/mscclpp_app' $(pc_field "$mscclpp_pc" Libs "$dest")"
check "mscclpp.pc's Libs set the run path to PREFIX/lib" \
  bash -c "[[ ' $(pc_field "$mscclpp_pc" Libs "") ' == *' -Wl,-rpath,$prefix/lib '* ]]"
check "the program runs on the installed libmscclpp.so.0, found through that run path alone" \
  bash -c "env -u LD_LIBRARY_PATH '$stage/mscclpp_app' && env -u LD_LIBRARY_PATH ldd '$stage/mscclpp_app' | grep -q '=> $base/lib/libmscclpp.so.0'"
# shellcheck disable=SC2046
check "and statically, with libmscclpp.a and mscclpp.pc's Libs.private" \
  bash -c "g++ -std=c++11 $(pc_field "$mscclpp_pc" Cflags "$dest") '$stage/mscclpp_app.cpp' -o '$stage/mscclpp_static' '$base/lib/libmscclpp.a' $(pc_field "$mscclpp_pc" Libs.private "$dest") && ! readelf -d '$stage/mscclpp_static' | grep -q libmscclpp && '$stage/mscclpp_static'"

# Uninstall: exactly the tree of before.
if make --no-print-directory -s uninstall DESTDIR="$dest" PREFIX="$prefix" >"$stage/uninstall.log" 2>&1; then
  after=$(cd "$stage" && find . | sort | grep -v -e '^\./nccl_app' -e '^\./mscclpp_' -e '^\./out$' -e '\.log$')
  check "make uninstall leaves the staging tree as it was before make install" \
    diff <(echo "$before") <(echo "$after")
else
  check "make uninstall" false
  sed 's/^/    /' "$stage/uninstall.log" | tail -n 20
fi

echo "install tests: $passed passed, $failed failed"
((failed == 0))
