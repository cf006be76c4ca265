#!/usr/bin/env bash
# `make install` and `make uninstall` (run from the Makefile, after `make lib`):
#   scripts/install.sh install   DESTDIR PREFIX
#   scripts/install.sh uninstall DESTDIR PREFIX
# Everything goes under DESTDIR + PREFIX (DESTDIR empty: straight into PREFIX; set, for packaging into a
# staging tree: the files there still name PREFIX). What is installed, relative to PREFIX:
#   include/mscclpp.h, include/mscclppfifo.h
#   lib/libmscclpp.so.$VERSION, links lib/libmscclpp.so.$SOVERSION and lib/libmscclpp.so, lib/libmscclpp.a
#   lib/pkgconfig/mscclpp.pc
#   include/mscclpp-nccl/nccl.h (and include/mscclpp-nccl/nccl_device/*.h where include/nccl_device/ has some)
#   lib/mscclpp-nccl/libnccl.so.2, link lib/mscclpp-nccl/libnccl.so, lib/mscclpp-nccl/pkgconfig/nccl.pc (the
#     thin library over lib/libmscclpp.so.0, which it finds one folder up through its run path $ORIGIN/..)
#   lib/.debug/*.debug, lib/mscclpp-nccl/.debug/*.debug: the shared libraries' debug information (gdb finds it
#     through the .gnu_debuglink of the stripped library)
#   share/mscclpp/install-manifest.txt: every file, link and directory this created
# NCCL's face lives in folders of its own, so that it never shadows NVIDIA's nccl.h or libnccl.so on the
# compiler's or the loader's default path; a build finds it through its nccl.pc
# (PKG_CONFIG_PATH=PREFIX/lib/mscclpp-nccl/pkgconfig pkg-config --cflags --libs nccl).
# The shared libraries are stripped (strip --strip-unneeded) after their debug information is copied into
# the .debug files (objcopy --only-keep-debug, then --add-gnu-debuglink); the static library loses its debug
# information (strip --strip-debug): a program that links it statically and needs it builds from source.
# Uninstall removes exactly the manifest's files and links, then the directories install created, where
# they are empty (nothing else is touched).
set -euo pipefail

action=${1:-}
destdir=${2:-}
prefix=${3:-/usr/local}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

case $prefix in
/*) ;;
*) echo "install: PREFIX must be an absolute path (got '$prefix')" >&2; exit 2 ;;
esac
base="$destdir$prefix"
manifest_rel=share/mscclpp/install-manifest.txt
manifest="$base/$manifest_rel"

# The entries of the manifest, relative to PREFIX: "file PATH", "link PATH" or "dir PATH"; and "prefix PATH"
# for a folder of PREFIX itself that install created (PATH absolute, below DESTDIR).
entries=()

# mkdir -p that records every directory it creates (parents first), so that uninstall removes only those.
make_dir() {
  local rel=$1 path="" part
  local IFS=/
  for part in $rel; do
    path=${path:+$path/}$part
    if [[ ! -d $base/$path ]]; then
      mkdir -m 755 "$base/$path"
      entries+=("dir $path")
    fi
  done
}

put() { # put MODE SOURCE REL: copies a file
  make_dir "$(dirname "$3")"
  install -m "$1" "$2" "$base/$3"
  entries+=("file $3")
}

put_link() { # put_link TARGET REL
  make_dir "$(dirname "$2")"
  ln -sfn "$1" "$base/$2"
  entries+=("link $2")
}

# put_shared SOURCE REL: a shared library, stripped, its debug information beside it in .debug/.
put_shared() {
  local dir name
  dir=$(dirname "$2")
  name=$(basename "$2")
  make_dir "$dir/.debug"
  objcopy --only-keep-debug "$1" "$base/$dir/.debug/$name.debug"
  chmod 644 "$base/$dir/.debug/$name.debug"
  entries+=("file $dir/.debug/$name.debug")
  put 755 "$1" "$2"
  strip --strip-unneeded "$base/$2"
  # The link is looked for by the .debug file's name, in the library's folder and its .debug/ (gdb).
  (cd "$base/$dir/.debug" && objcopy --add-gnu-debuglink="$name.debug" "$base/$2")
}

# subst_pc TEMPLATE: the .pc template with PREFIX, the version and the static libraries filled in.
subst_pc() {
  sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$2|" -e "s|@LIBS_PRIVATE@|${LIBS_PRIVATE:-}|" "$1"
}

install_all() {
  local version=${VERSION:?} soversion=${SOVERSION:?}
  local need
  for need in build/include/mscclpp.h build/include/mscclppfifo.h "build/lib/libmscclpp.so.$version" \
    build/lib/libmscclpp.a build/include/nccl.h build/lib/nccl/libnccl.so.2; do
    [[ -f $need ]] || { echo "install: $need is missing (run make lib first)" >&2; exit 1; }
  done
  for need in objcopy strip; do
    command -v $need >/dev/null 2>&1 || { echo "install: $need not found (binutils)" >&2; exit 1; }
  done
  # A second install over the first keeps the first one's record of the directories it created.
  local old=()
  [[ -f $manifest ]] && mapfile -t old < <(grep -E '^(dir|prefix) ' "$manifest")
  local path="" part
  if [[ -n $destdir && ! -d $destdir ]]; then
    mkdir -p "$destdir"
    entries+=("prefix ")  # DESTDIR itself
  fi
  for part in ${prefix//\// }; do
    path=$path/$part
    if [[ ! -d $destdir$path ]]; then
      mkdir -m 755 "$destdir$path"
      entries+=("prefix $path")
    fi
  done

  put 644 build/include/mscclpp.h include/mscclpp.h
  put 644 build/include/mscclppfifo.h include/mscclppfifo.h
  put_shared "build/lib/libmscclpp.so.$version" "lib/libmscclpp.so.$version"
  put_link "libmscclpp.so.$version" "lib/libmscclpp.so.$soversion"
  put_link "libmscclpp.so.$soversion" lib/libmscclpp.so
  put 644 build/lib/libmscclpp.a lib/libmscclpp.a
  strip --strip-debug "$base/lib/libmscclpp.a"
  make_dir lib/pkgconfig
  subst_pc mscclpp.pc.in "$version" >"$base/lib/pkgconfig/mscclpp.pc"
  entries+=("file lib/pkgconfig/mscclpp.pc")

  put 644 build/include/nccl.h include/mscclpp-nccl/nccl.h
  local h
  for h in include/nccl_device/*.h; do
    [[ -f $h ]] && put 644 "$h" "include/mscclpp-nccl/nccl_device/$(basename "$h")"
  done
  put_shared build/lib/nccl/libnccl.so.2 lib/mscclpp-nccl/libnccl.so.2
  put_link libnccl.so.2 lib/mscclpp-nccl/libnccl.so
  local nccl_version
  nccl_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) / { v[$2] = $3 }
    END { printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"] }' build/include/nccl.h)
  make_dir lib/mscclpp-nccl/pkgconfig
  subst_pc nccl.pc.in "$nccl_version" >"$base/lib/mscclpp-nccl/pkgconfig/nccl.pc"
  entries+=("file lib/mscclpp-nccl/pkgconfig/nccl.pc")

  make_dir "$(dirname "$manifest_rel")"
  entries+=("file $manifest_rel")
  { printf '%s\n' "${old[@]+"${old[@]}"}" "${entries[@]}" | grep -v '^$' | awk '!seen[$0]++'; } >"$manifest"
  echo "installed into $base: $(grep -c '^file\|^link' "$manifest") files and links (listed in $manifest)"
  echo "  NCCL's face: PKG_CONFIG_PATH=$prefix/lib/mscclpp-nccl/pkgconfig pkg-config --cflags --libs nccl"
}

uninstall_all() {
  if [[ ! -f $manifest ]]; then
    echo "uninstall: no manifest at $manifest: nothing installed there by make install"
    return 0
  fi
  local kind rel removed=0
  local dirs=()
  while read -r kind rel; do
    case $kind in
    file | link)
      if [[ -e $base/$rel || -L $base/$rel ]]; then
        rm -f "$base/$rel"
        removed=$((removed + 1))
      fi
      ;;
    dir) dirs+=("$base/$rel") ;;
    prefix) dirs+=("$destdir${rel:-}") ;;
    esac
  done <"$manifest"
  # Deepest first; only the directories install created, and only where nothing else is in them.
  local d
  while read -r d; do
    [[ -n $d ]] && rmdir "$d" 2>/dev/null || true
  done < <(printf '%s\n' "${dirs[@]+"${dirs[@]}"}" | awk '{ print gsub("/", "/") "\t" $0 }' | sort -rn | cut -f2-)
  echo "uninstalled from $base: $removed files and links"
}

case $action in
install) install_all ;;
uninstall) uninstall_all ;;
*) echo "usage: scripts/install.sh install|uninstall DESTDIR PREFIX" >&2; exit 2 ;;
esac
