#!/usr/bin/env bash
# The sources of the thin libnccl.so.2, from the core it forwards to (the Makefile runs it after building
# the core, then links the thin library):
#   scripts/nccl-face.sh CORE OUT_DIR
# writes, each file only when its text changes:
#   OUT_DIR/trampolines.S  one trampoline per function CORE exports as mscclpp_nccl_face_<name>: a function
#                          <name> whose one instruction jumps to it (x86-64: through its GOT entry, which the
#                          loader fills at load time, -z now; AArch64: b, through the PLT), and CORE's build
#                          commit tag (`libmscclpp build commit <hash>;`), which a benchmark reads from the
#                          libnccl.so.2 it loads;
#   OUT_DIR/exports.map    the version script that exports those names and nothing else.
# The names are CORE's own dynamic symbols (nm -D), which src/nccl/mod.rs's nccl_export! gives their prefix:
# no list of names is kept anywhere else.
set -euo pipefail
if (($# != 2)); then
  echo "usage: scripts/nccl-face.sh CORE OUT_DIR" >&2
  exit 2
fi
core=$1
out=$2
prefix=mscclpp_nccl_face_

names=$(nm -D --defined-only --format=posix "$core" |
  awk -v p="$prefix" '$2 ~ /^[TW]$/ { sub(/@.*/, "", $1); if (index($1, p) == 1) print substr($1, length(p) + 1) }' |
  LC_ALL=C sort -u)
if [[ -z $names ]]; then
  echo "scripts/nccl-face.sh: $core exports no function named $prefix*" >&2
  exit 1
fi
bad=$(grep -v -E '^p?nccl[A-Za-z0-9_]+$' <<<"$names" || true)
if [[ -n $bad ]]; then
  echo "scripts/nccl-face.sh: $core exports names under $prefix that are no NCCL function's: $bad" >&2
  exit 1
fi
tag=$(grep -a -o -m 1 'libmscclpp build commit [0-9a-z]*;' "$core" | head -n 1 || true)

# write_if_changed FILE: stdin into FILE, unless FILE holds that text already (so make relinks only then).
write_if_changed() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

mkdir -p "$out"
{
  cat <<'HEAD'
/* Written by scripts/nccl-face.sh from the core's exports: NCCL's functions, each a jump to the core's. */
#if defined(__x86_64__)
        .macro trampoline name
        .globl \name
        .type \name, @function
        .p2align 4
\name:
        .cfi_startproc
        jmp *mscclpp_nccl_face_\name\()@GOTPCREL(%rip)
        .cfi_endproc
        .size \name, . - \name
        .endm
#elif defined(__aarch64__)
        .macro trampoline name
        .globl \name
        .type \name, %function
        .p2align 2
\name:
        .cfi_startproc
        b mscclpp_nccl_face_\name
        .cfi_endproc
        .size \name, . - \name
        .endm
#else
#error "the thin libnccl.so.2's trampolines are written for x86-64 and AArch64"
#endif
        .text
HEAD
  sed 's/^/        trampoline /' <<<"$names"
  if [[ -n $tag ]]; then
    printf '        .section .rodata\n        .ascii "%s"\n' "$tag"
  fi
  printf '        .section .note.GNU-stack, "", %%progbits\n'
} | write_if_changed "$out/trampolines.S"
{
  echo "{"
  echo "  global:"
  sed 's/.*/    &;/' <<<"$names"
  echo "  local: *;"
  echo "};"
} | write_if_changed "$out/exports.map"
