#!/usr/bin/env bash
# NVIDIA's nccl-tests, the same binaries, on NVIDIA's libnccl.so.2 and on ours (build/lib/nccl), side by
# side: the table of record of docs/PERFORMANCE.md ("nccl-tests: the table of record"). Run it on a GPU
# machine over a built tree (`make` built build/lib/nccl/libnccl.so.2); `--help` says how.
#
# It builds nccl-tests out of tree (a copy of NCCL_TESTS_SRC under build/nccl-tests/; the source is left
# untouched) with MPI=1 against NVIDIA's nccl.h, runs every *_perf under mpirun once per library, mode
# (eager, CUDA graph) and registration (-R), keeps every raw output in OUT, then
# examples-c/bench/nccl_tests_table.py prints one table per collective and mode and writes OUT/table.md.
#
# Devices: nccl-tests (src/common.cu, run()) puts each process on CUDA device
#   localRank * nThreads * nGpus + i   (localRank: its rank among the MPI processes of its host)
# with no modulo, or on $NCCL_TESTS_DEVICE + i where that is set; a local rank past the last GPU stops with
# "Invalid number of GPUs". So with more ranks than GPUs this script starts each rank through a small
# wrapper that sets NCCL_TESTS_DEVICE to (local rank % GPUs), under MPS where nvidia-cuda-mps-control
# exists, and runs our library alone: NVIDIA's refuses two ranks on one GPU.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: NCCL_TESTS_SRC=DIR examples-c/bench/nccl_tests.sh [options]

Builds NVIDIA's nccl-tests (MPI=1, against NVIDIA's nccl.h) under build/nccl-tests/, runs every *_perf
with mpirun on NVIDIA's libnccl.so.2 and on ours (build/lib/nccl), the same binaries, one run after the
other for each collective, and prints one side-by-side table per collective and mode: time of each (us),
the ratio ours/NVIDIA (below 1: ours faster), algBW of each and #wrong of each, out-of-place and in-place.
The markdown version goes to OUT/table.md, every raw output to OUT. NCCL_NVLS_ENABLE=0 is always set.

Environment:
  NCCL_TESTS_SRC  required: a checkout of https://github.com/NVIDIA/nccl-tests (left untouched)
  NCCL_TESTS_BUILD
                  where the copy is built (default build/nccl-tests)
  NCCL_HOME       NVIDIA's NCCL, holding include/nccl.h and lib/libnccl.so.2 (default: the nvidia-nccl
                  wheel beside torch: python3's nvidia/nccl)
  CUDA_HOME       default /usr/local/cuda
  MPI_HOME        default: from `mpicc -showme`, else the folder above the one holding mpirun (Open MPI)
  NVCC_GENCODE    default: the GPUs' own architectures (nvidia-smi), e.g. -gencode=arch=compute_90,code=sm_90

Options:
  --ranks N        MPI ranks (default: the number of GPUs). With more ranks than GPUs, rank r runs on GPU
                   r % GPUs, under MPS where available, on our library alone (NVIDIA's refuses to share a GPU)
  --colls LIST     comma-separated (default all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall,
                   sendrecv,gather,scatter,hypercube; alltoallv is built too)
  --modes LIST     eager,graph (default both)
  --reg LIST       -R values: 0 (default), 1 (local registration), 2 (symmetric), e.g. 0,1,2
  --sizes "ARGS"   default "-b 1K -e 1G -f 4" (11 sizes)
  --eager "ARGS"   the eager mode's arguments (default "-n 20 -w 5")
  --graph "ARGS"   the graph mode's arguments (default "-G 10 -n 50 -w 5")
  --check N        -c N (default 1: check the results)
  --libs LIST      nvidia,ours (default both)
  --lib NAME=DIR   one more library to run after those: the libnccl.so.2 in DIR (another build of ours, its
                   core libmscclpp.so.0 one folder up as in build/lib/nccl, to compare builds in one lease),
                   shown as NAME (lower-case letters, digits, _); repeatable
  --with NAME=VAR=VALUE[,VAR=VALUE...]
                   ours once more, shown as NAME, with those MSCCLPP_* or NCCL_* settings (e.g.
                   --with rings=MSCCLPP_COLL_ALGO=sendrecv: an algorithm against the table's choice in one
                   lease); repeatable
  --rounds N       run every library N times, in turn for each collective (A B A B ...), so that the
                   tables show each run's spread; later rounds are shown as NAME-r2, NAME-r3, ... (default 1)
  --extra "ARGS"   passed to every *_perf, e.g. --extra "-d all -o all"
  --quick          a short smoke run for correctness: -b 1K -e 1M -f 4, eager -n 5 -w 2, graph -G 2 -n 5 -w 2
                   (options given explicitly still win)
  --out DIR        logs, runs.tsv and table.md (default build/nccl-tests-logs)
  --timeout S      limit of one mpirun, in seconds (default 300)
  --rebuild        build nccl-tests afresh
  --build-only     build nccl-tests, run nothing
  --table-only     only print the tables again from OUT's logs (runs.tsv)
  -h, --help       this text

Exit status: 0 when every run completed with no wrong result; 1 when a run failed, was cut short or had
#wrong != 0 (said loudly); 2 when the setup is wrong (no NCCL_TESTS_SRC, no MPI, no nvcc, ...).
EOF
}

die() {
  echo "nccl_tests.sh: $*" >&2
  exit 2
}

caller_dir=$PWD
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
# A relative path given by the caller (--out, NCCL_TESTS_SRC, ...) is relative to the caller's folder.
from_caller() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$caller_dir/$1" ;; esac; }
cmdline="examples-c/bench/nccl_tests.sh"
for a in "$@"; do
  if [[ $a =~ ^[A-Za-z0-9_.,:/=+-]+$ ]]; then cmdline+=" $a"; else cmdline+=" '${a//\'/\'\\\'\'}'"; fi
done

all_colls="all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall,sendrecv,gather,scatter,hypercube"
ranks=""
colls="$all_colls"
modes="eager,graph"
regs="0"
sizes=""
eager_args=""
graph_args=""
check=1
libs="nvidia,ours"
more_libs=()
more_with=()
rounds=1
extra=""
quick=0
out="$root/build/nccl-tests-logs"
run_timeout=300
rebuild=0
build_only=0
table_only=0

need_arg() { [ $# -ge 2 ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --ranks) need_arg "$@"; ranks=$2; shift ;;
    --colls) need_arg "$@"; colls=$2; shift ;;
    --modes) need_arg "$@"; modes=$2; shift ;;
    --reg) need_arg "$@"; regs=$2; shift ;;
    --sizes) need_arg "$@"; sizes=$2; shift ;;
    --eager) need_arg "$@"; eager_args=$2; shift ;;
    --graph) need_arg "$@"; graph_args=$2; shift ;;
    --check) need_arg "$@"; check=$2; shift ;;
    --libs) need_arg "$@"; libs=$2; shift ;;
    --lib) need_arg "$@"; more_libs+=("$2"); shift ;;
    --with) need_arg "$@"; more_with+=("$2"); shift ;;
    --rounds) need_arg "$@"; rounds=$2; shift ;;
    --extra) need_arg "$@"; extra=$2; shift ;;
    --quick) quick=1 ;;
    --out) need_arg "$@"; out=$(from_caller "$2"); shift ;;
    --timeout) need_arg "$@"; run_timeout=$2; shift ;;
    --rebuild) rebuild=1 ;;
    --build-only) build_only=1 ;;
    --table-only) table_only=1 ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
  shift
done

if [ "$quick" = 1 ]; then
  : "${sizes:=-b 1K -e 1M -f 4}" "${eager_args:=-n 5 -w 2}" "${graph_args:=-G 2 -n 5 -w 2}"
fi
: "${sizes:=-b 1K -e 1G -f 4}" "${eager_args:=-n 20 -w 5}" "${graph_args:=-G 10 -n 50 -w 5}"

table() { python3 "$root/examples-c/bench/nccl_tests_table.py" --out "$out"; }

if [ "$table_only" = 1 ]; then
  [ -f "$out/runs.tsv" ] || die "$out/runs.tsv is missing: nothing to tabulate"
  table
  exit $?
fi

# Checks of the options, before anything is built.
[[ $check =~ ^[0-9]+$ ]] || die "--check takes a number, not '$check'"
[[ $run_timeout =~ ^[0-9]+$ ]] || die "--timeout takes seconds, not '$run_timeout'"
[ -z "$ranks" ] || [[ $ranks =~ ^[1-9][0-9]*$ ]] || die "--ranks takes a positive number, not '$ranks'"
IFS=, read -r -a coll_list <<<"$colls"
IFS=, read -r -a mode_list <<<"$modes"
IFS=, read -r -a reg_list <<<"$regs"
IFS=, read -r -a lib_list <<<"$libs"
for i in "${!coll_list[@]}"; do
  c=${coll_list[$i]%_perf}
  [[ $c =~ ^[a-z_]+$ ]] || die "bad collective name '${coll_list[$i]}'"
  coll_list[i]=$c
done
for m in "${mode_list[@]}"; do [[ $m == eager || $m == graph ]] || die "--modes: '$m' is neither eager nor graph"; done
for r in "${reg_list[@]}"; do [[ $r == 0 || $r == 1 || $r == 2 ]] || die "--reg: '$r' is not 0, 1 or 2"; done
for l in "${lib_list[@]}"; do [[ $l == nvidia || $l == ours ]] || die "--libs: '$l' is neither nvidia nor ours"; done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds takes a positive number, not '$rounds'"
declare -A more_dir=()
for spec in "${more_libs[@]}"; do
  name=${spec%%=*}
  dir=${spec#*=}
  [[ $spec == *=* && $name =~ ^[a-z][a-z0-9_]*$ ]] ||
    die "--lib takes NAME=DIR with NAME of lower-case letters, digits and _, not '$spec'"
  [[ $name != nvidia && $name != ours && -z ${more_dir[$name]:-} ]] || die "--lib: the name '$name' is taken"
  dir=$(from_caller "$dir")
  [ -f "$dir/libnccl.so.2" ] || die "--lib $name: no libnccl.so.2 in $dir"
  # Ours is a thin library over the core beside its folder, which it needs.
  if grep -q -a 'libmscclpp\.so\.0' "$dir/libnccl.so.2" && [ ! -e "$dir/../libmscclpp.so.0" ]; then
    die "--lib $name: $dir/libnccl.so.2 needs libmscclpp.so.0, which $dir/.. lacks (carry the build's lib/ whole)"
  fi
  more_dir[$name]=$dir
  lib_list+=("$name")
done
# Ours again with settings of its own: NAME -> "VAR=VALUE,VAR=VALUE".
declare -A more_env=()
for spec in "${more_with[@]}"; do
  name=${spec%%=*}
  settings=${spec#*=}
  [[ $spec == *=*=* && $name =~ ^[a-z][a-z0-9_]*$ ]] ||
    die "--with takes NAME=VAR=VALUE[,VAR=VALUE...] with NAME of lower-case letters, digits and _, not '$spec'"
  [[ $name != nvidia && $name != ours && -z ${more_dir[$name]:-} && -z ${more_env[$name]:-} ]] ||
    die "--with: the name '$name' is taken"
  IFS=, read -r -a pairs <<<"$settings"
  for pair in "${pairs[@]}"; do
    [[ $pair =~ ^(MSCCLPP|NCCL)_[A-Z0-9_]+=.+$ ]] ||
      die "--with $name: '$pair' is not VAR=VALUE of an MSCCLPP_* or NCCL_* setting"
  done
  more_env[$name]=$settings
  lib_list+=("$name")
done
((${#coll_list[@]} && ${#mode_list[@]} && ${#reg_list[@]} && ${#lib_list[@]})) || die "an empty list of collectives, modes, -R values or libraries"
mkdir -p "$out" || die "cannot create $out"
out="$(cd "$out" && pwd)"

# --- What the build needs -------------------------------------------------------------------------------
if [ -z "${NCCL_TESTS_SRC:-}" ]; then
  usage >&2
  die "NCCL_TESTS_SRC is not set: point it at a checkout of https://github.com/NVIDIA/nccl-tests"
fi
[ -f "$(from_caller "$NCCL_TESTS_SRC")/src/common.cu" ] && [ -f "$(from_caller "$NCCL_TESTS_SRC")/Makefile" ] ||
  die "NCCL_TESTS_SRC=$NCCL_TESTS_SRC does not look like nccl-tests (no src/common.cu, Makefile)"
src="$(cd "$(from_caller "$NCCL_TESTS_SRC")" && pwd)"

cuda_home=$(from_caller "${CUDA_HOME:-/usr/local/cuda}")
[ -x "$cuda_home/bin/nvcc" ] || die "no nvcc in CUDA_HOME=$cuda_home (set CUDA_HOME)"

# NVIDIA's NCCL: NCCL_HOME, else the nvidia-nccl wheel torch depends on.
find_nccl_home() {
  python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
def ok(d):
    return d and os.path.isfile(os.path.join(d, "include", "nccl.h")) and os.path.isfile(os.path.join(d, "lib", "libnccl.so.2"))
cands = []
try:
    import nvidia.nccl as m
    if getattr(m, "__file__", None):
        cands.append(os.path.dirname(m.__file__))
    cands += list(getattr(m, "__path__", []))
except Exception:
    pass
roots = []
try:
    import torch
    roots.append(os.path.dirname(os.path.dirname(torch.__file__)))
except Exception:
    pass
roots += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
try:
    roots += site.getsitepackages()
except Exception:
    pass
for r in roots:
    cands.append(os.path.join(r, "nvidia", "nccl"))
    cands += [os.path.dirname(os.path.dirname(h)) for h in sorted(glob.glob(os.path.join(r, "nvidia", "*", "include", "nccl.h")))]
for d in cands:
    if ok(d):
        print(os.path.realpath(d))
        break
EOF
}
if [ -n "${NCCL_HOME:-}" ]; then nccl_home=$(from_caller "$NCCL_HOME"); else nccl_home=$(find_nccl_home); fi
[ -n "$nccl_home" ] || die "NVIDIA's NCCL not found: set NCCL_HOME (a folder with include/nccl.h and lib/libnccl.so.2), or install torch's nvidia-nccl wheel"
[ -f "$nccl_home/include/nccl.h" ] || die "NCCL_HOME=$nccl_home has no include/nccl.h"
nvidia_lib=$nccl_home/lib
[ -e "$nvidia_lib/libnccl.so.2" ] || die "NCCL_HOME=$nccl_home has no lib/libnccl.so.2"
nccl_h_version=$(awk '$1 == "#define" && $2 ~ /^NCCL_(MAJOR|MINOR|PATCH)$/ { v[$2] = $3 }
  END { if (v["NCCL_MAJOR"] != "") printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"] }' "$nccl_home/include/nccl.h")

ours_lib=$root/build/lib/nccl
[ -e "$ours_lib/libnccl.so.2" ] && [ -e "$root/build/lib/libmscclpp.so.0" ] ||
  die "$ours_lib/libnccl.so.2 or the core it needs, build/lib/libmscclpp.so.0, is missing: run make first (or carry build/lib)"

# MPI: MPI_HOME, else mpicc -showme's include folder, else the folder above mpirun's.
mpi_home=${MPI_HOME:+$(from_caller "$MPI_HOME")}
if [ -z "$mpi_home" ] && command -v mpicc >/dev/null 2>&1; then
  for w in $(mpicc -showme 2>/dev/null); do
    case "$w" in -I*/include) mpi_home=$(dirname "${w#-I}"); break ;; esac
  done
fi
if [ -z "$mpi_home" ] && command -v mpirun >/dev/null 2>&1; then
  mpi_home=$(dirname "$(dirname "$(readlink -f "$(command -v mpirun)")")")
fi
[ -n "$mpi_home" ] && [ -f "$mpi_home/include/mpi.h" ] ||
  die "MPI not found (MPI_HOME='$mpi_home' has no include/mpi.h): install Open MPI or set MPI_HOME"
mpirun=$mpi_home/bin/mpirun
[ -x "$mpirun" ] || mpirun=$(command -v mpirun) || die "no mpirun in $mpi_home/bin nor on the PATH"
mpi_lib=$mpi_home/lib
[ -d "$mpi_home/lib64" ] && mpi_lib+=":$mpi_home/lib64"
"$mpirun" --version 2>&1 | grep -q "Open MPI" ||
  echo "note: $mpirun is not Open MPI's; its options here (--allow-run-as-root, --oversubscribe, -x) are Open MPI's"

# GPUs: CUDA_VISIBLE_DEVICES's list where set, else nvidia-smi's.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  gpus=${#visible[@]}
fi
[ "$build_only" = 1 ] || [ "$gpus" -gt 0 ] || die "no GPU found (nvidia-smi -L)"
ranks=${ranks:-$gpus}

if [ -z "${NVCC_GENCODE:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  for cap in $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u); do
    [[ $cap =~ ^[0-9]+$ ]] && NVCC_GENCODE+="${NVCC_GENCODE:+ }-gencode=arch=compute_$cap,code=sm_$cap"
  done
fi
gencode=${NVCC_GENCODE:-}

# --- The build: a copy of the source under build/nccl-tests/src, binaries in build/nccl-tests/bin --------
nt=$(from_caller "${NCCL_TESTS_BUILD:-$root/build/nccl-tests}")
shim=$nt/nccl-home # NVIDIA's include/ and lib/libnccl.so (the wheel has only libnccl.so.2, -lnccl needs it)
build_log=$out/build.log
tree_sum=$(cd "$src" && find . \( -path ./build -o -path ./.git \) -prune -o -type f -print0 | sort -z |
  xargs -0 cksum | cksum)
stamp="src=$src
nccl_home=$nccl_home
cuda_home=$cuda_home
mpi_home=$mpi_home
gencode=$gencode
tree=$tree_sum"
if [ "$rebuild" = 1 ] || [ ! -f "$nt/stamp" ] || [ "$(cat "$nt/stamp")" != "$stamp" ]; then
  echo "nccl-tests: copying $src to $nt/src (a fresh build)"
  rm -rf "${nt:?}/src" "${nt:?}/bin" "${nt:?}/stamp" "${shim:?}"
  mkdir -p "$nt/src" "$shim/lib" || die "cannot create $nt"
  tar -C "$src" --exclude=./build --exclude=./.git -cf - . | tar -C "$nt/src" -xf - || die "cannot copy $src"
  ln -s "$nccl_home/include" "$shim/include"
  ln -s "$nvidia_lib/libnccl.so.2" "$shim/lib/libnccl.so"
fi
jobs=$(nproc 2>/dev/null || echo 8)
echo "nccl-tests: building (make -j$jobs MPI=1, nccl.h ${nccl_h_version:-?} of $nccl_home, MPI $mpi_home, ${gencode:-the default archs of nccl-tests}); log $build_log"
build_start=$(date +%s)
make_args=(-C "$nt/src" -j"$jobs" MPI=1 MPI_HOME="$mpi_home" CUDA_HOME="$cuda_home" NCCL_HOME="$shim" BUILDDIR="$nt/bin")
[ -z "$gencode" ] || make_args+=(NVCC_GENCODE="$gencode")
if ! make "${make_args[@]}" >"$build_log" 2>&1; then
  tail -n 30 "$build_log" >&2
  die "the nccl-tests build failed (log $build_log)"
fi
printf '%s\n' "$stamp" >"$nt/stamp"
echo "nccl-tests: built in $(($(date +%s) - build_start)) s: $nt/bin"
[ "$build_only" = 1 ] && exit 0

for c in "${coll_list[@]}"; do
  [ -x "$nt/bin/${c}_perf" ] || die "no $nt/bin/${c}_perf (collectives: $all_colls, alltoallv)"
done

# --- The runs ---------------------------------------------------------------------------------------------
export NCCL_NVLS_ENABLE=0 # never NVLink multicast, on either library
sysdirs="$mpi_lib:$cuda_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
declare -A libdir=([nvidia]="$nvidia_lib" [ours]="$ours_lib")
for name in "${!more_dir[@]}"; do libdir[$name]=${more_dir[$name]}; done
for name in "${!more_env[@]}"; do libdir[$name]=$ours_lib; done

# Which file each library's runs load (the binaries carry no rpath: LD_LIBRARY_PATH decides).
for l in "${lib_list[@]}"; do
  got=$(LD_LIBRARY_PATH="${libdir[$l]}:$sysdirs" ldd "$nt/bin/${coll_list[0]}_perf" 2>/dev/null |
    awk '$1 == "libnccl.so.2" { print $3 }')
  want=$(readlink -f "${libdir[$l]}/libnccl.so.2")
  [ "$(readlink -f "${got:-/nonexistent}")" = "$want" ] ||
    die "$l: the binaries load '${got:-nothing}' for libnccl.so.2, not $want"
  echo "libnccl.so.2 for $l: $want"
done

shared=0
if [ "$ranks" -gt "$gpus" ]; then
  shared=1
  echo "note: $ranks ranks on $gpus GPUs: rank r on GPU r % $gpus (NCCL_TESTS_DEVICE); NVIDIA's library is not run (it refuses two ranks on one GPU)"
  # shellcheck source=scripts/gpu-env.sh
  source "$root/scripts/gpu-env.sh"
  mps_start "the shared-GPU runs" # exports CUDA_MPS_PIPE_DIRECTORY, forwarded below
  trap 'mps_stop' EXIT
fi

# Settings that reach every rank: ours and NCCL's, CUDA's (CUDA_VISIBLE_DEVICES, MPS pipes), nccl-tests'.
fwd=()
while read -r v; do
  case "$v" in NCCL_NVLS_ENABLE | NCCL_HOME | NCCL_TESTS_SRC | CUDA_HOME) continue ;; esac
  fwd+=(-x "$v")
done < <(compgen -e | grep -E '^(NCCL_|MSCCLPP_|CUDA_|TORCH_SYMM_MEM_|NVSHMEM_)')

machine="unknown GPUs"
if command -v nvidia-smi >/dev/null 2>&1; then
  machine=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
    awk '{ n = $1; $1 = ""; sub(/^ /, ""); printf "%s%d x %s", (NR > 1 ? ", " : ""), n, $0 }')
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  machine+="${driver:+ (driver $driver)}"
  # The same model measures differently from host to host (docs/PERFORMANCE.md): the clocks and power limit
  # the GPUs run under go into the table's header, each distinct set once.
  limits=$(nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader,nounits 2>/dev/null |
    sort -u | awk -F', *' 'NF == 3 { printf "%s%s MHz SM, %s MHz memory, %s W", (NR > 1 ? "; " : ""), $1, $2, $3 }')
  # And which GPUs these were (the start of each UUID), to match a table with others from the same host.
  uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | cut -c1-12 | paste -sd ' ' -)
fi
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit+=" (with local changes)"
fi

# The commit each of our libraries was built from, as it keeps it (src/lib.rs, BUILD_COMMIT_TAG): the tree's
# commit above need not be the build's (a library carried from elsewhere, or built before the last commit).
built=""
tree_head=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || true)
for l in "${lib_list[@]}"; do
  [[ $l == nvidia || -n ${more_env[$l]:-} ]] && continue
  b=$(grep -a -o -m 1 'libmscclpp build commit [0-9a-z]*;' "${libdir[$l]}/libnccl.so.2" 2>/dev/null | head -n 1)
  b=${b#libmscclpp build commit }
  b=${b%;}
  built+="${built:+, }$l ${b:-unknown}"
  # build/lib/nccl built from another commit than the tree's is measured as it is, but said: a table of
  # record should come from a build of the commit it names.
  if [[ $l == ours && -n $tree_head && $b != "$tree_head" ]]; then
    echo "note: ours ($ours_lib) was built from commit ${b:-unknown}, the tree is at ${tree_head:0:7}: run make to measure the tree"
  fi
done

manifest=$out/runs.tsv
{
  printf 'meta\tmachine\t%s\n' "$machine"
  printf 'meta\tlimits\t%s\n' "${limits:-}"
  printf 'meta\tuuids\t%s\n' "${uuids:-}"
  printf 'meta\tdate\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
  printf 'meta\tcommit\t%s\n' "$commit"
  printf 'meta\tbuilt\t%s\n' "$built"
  printf 'meta\tcommand\t%s\n' "$cmdline"
  printf 'meta\tranks\t%s\n' "$ranks"
  printf 'meta\tgpus\t%s\n' "$gpus"
  printf 'meta\tnccl_h\t%s\n' "${nccl_h_version:-unknown}"
  printf 'meta\tsizes\t%s\n' "$sizes"
  printf 'meta\tcheck\t%s\n' "$check"
  printf 'meta\textra\t%s\n' "$extra"
} >"$manifest"

failed=0
runs_start=$(date +%s)
for reg in "${reg_list[@]}"; do
  for mode in "${mode_list[@]}"; do
    if [ "$mode" = eager ]; then margs=$eager_args; else margs=$graph_args; fi
    for coll in "${coll_list[@]}"; do
      for round in $(seq 1 "$rounds"); do
        for lib in "${lib_list[@]}"; do
          # A later round's runs are their own column of the tables: NAME-rN.
          label=$lib
          [ "$round" = 1 ] || label="$lib-r$round"
          log_name="$coll.$mode.R$reg.$label.log"
          log=$out/$log_name
          if [ "$lib" = nvidia ] && [ "$shared" = 1 ]; then
            printf 'run\t%s\t%s\t%s\t%s\tskip\t0\t\t%s\t%s\n' "$coll" "$mode" "$reg" "$label" "$margs" \
              "not run: $ranks ranks on $gpus GPUs, and NVIDIA's NCCL refuses two ranks on one GPU" >>"$manifest"
            continue
          fi
          # shellcheck disable=SC2206 # the argument strings are lists of words on purpose
          args=($sizes $margs -c "$check" -R "$reg" $extra)
          cmd=(timeout -k 10 "$run_timeout" "$mpirun" -np "$ranks" --allow-run-as-root --oversubscribe --bind-to none
            -x "LD_LIBRARY_PATH=${libdir[$lib]}:$sysdirs" -x NCCL_NVLS_ENABLE=0 "${fwd[@]}")
          settings=${more_env[$lib]:-}
          if [ -n "$settings" ]; then
            IFS=, read -r -a pairs <<<"$settings"
            for pair in "${pairs[@]}"; do cmd+=(-x "$pair"); done
          fi
          if [ "$shared" = 1 ]; then
            # shellcheck disable=SC2016 # expanded by each rank's shell
            cmd+=(bash -c 'r=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}; export NCCL_TESTS_DEVICE=$((r % '"$gpus"')); exec "$0" "$@"')
          fi
          cmd+=("$nt/bin/${coll}_perf" "${args[@]}")
          {
            echo "# nccl_tests.sh: $coll $mode -R $reg on the libnccl.so.2 of $label (${libdir[$lib]})${settings:+ with $settings}"
            echo "# nccl_tests.sh: ${cmd[*]}"
          } >"$log"
          start=$(date +%s.%N)
          "${cmd[@]}" >>"$log" 2>&1 </dev/null
          rc=$?
          secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
          printf 'run\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n' "$coll" "$mode" "$reg" "$label" "$rc" "$secs" "$log_name" \
            "$margs" >>"$manifest"
          rows=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$log")
          avg=$(sed -nE 's/^# Avg bus bandwidth *: *([^ ]+).*/\1/p' "$log" | tail -n 1)
          oob=$(sed -nE 's/^# Out of bounds values *: *([0-9]+).*/\1/p' "$log" | tail -n 1)
          verdict=ok
          if [ "$rc" -ne 0 ]; then
            verdict="FAILED (exit $rc$([ "$rc" = 124 ] && echo ", timed out after $run_timeout s"))"
          elif [ -z "$avg" ]; then
            verdict="FAILED (no result footer)"
          elif [ "${oob:-0}" != 0 ]; then
            verdict="WRONG RESULTS ($oob out of bounds values)"
          fi
          [ "$verdict" = ok ] || failed=1
          printf '%-15s %-5s -R %s %-6s %5s s  %2s rows  avg busbw %-8s %s  (%s)\n' "$coll" "$mode" "$reg" "$label" \
            "$secs" "$rows" "${avg:--}" "$verdict" "$log_name"
        done
      done
    done
  done
done
echo "runs: $(($(date +%s) - runs_start)) s; logs in $out"

table
table_rc=$?
if [ "$table_rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
  echo "nccl_tests.sh: FAILED: a run failed, was cut short or had wrong results (see above and $out)" >&2
  exit 1
fi
exit 0
