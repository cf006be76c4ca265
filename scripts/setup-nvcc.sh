#!/usr/bin/env bash
# Installs CUDA's compiler from PyPI into .toolchain/cuda (git-ignored) and makes it usable, unless the
# same pinned set is already there (CCCL too: the library's kernels include cuda_fp16.h and cuda_bf16.h,
# which need its <nv/target>). The versions match the GPU machines' CUDA 13.0 and each other (an
# unpinned nvidia-nvvm emits PTX that this ptxas rejects).
#
# The wheels unpack to .toolchain/cuda/nvidia/cu13/{bin,include,lib,nvvm}. nvcc looks for libraries in
# lib64 beside bin, and links -lcudart, while the wheel ships lib/ with libcudart.so.13 only: hence the
# links lib64 -> lib and lib/libcudart.so -> libcudart.so.13. A tiny program is compiled to prove it works.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.toolchain/cuda"
home="$dest/nvidia/cu13"
stamp="$dest/.ready"
packages=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85)

if [[ -f $stamp && $(cat "$stamp") == "${packages[*]}" ]]; then
  exit 0
fi

echo "setup: downloading CUDA's compiler from PyPI into .toolchain/cuda: about 270 MB, once (${packages[*]})"
rm -rf "$dest" "$dest.partial"
mkdir -p "$root/.toolchain"
# Into a side folder first, so that an interrupted install is never taken for a complete one.
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-input \
  --target "$dest.partial" "${packages[@]}"
mv "$dest.partial" "$dest"

if [[ ! -x $home/bin/nvcc ]]; then
  echo "setup: nvcc is not at $home/bin/nvcc; the wheels' layout changed:" >&2
  find "$dest" -maxdepth 4 -name nvcc >&2
  exit 1
fi
[[ -e $home/lib64 ]] || ln -s lib "$home/lib64"
[[ -e $home/lib/libcudart.so ]] || ln -s libcudart.so.13 "$home/lib/libcudart.so"

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat >"$probe/probe.cu" <<'CU'
#include <cstdio>
__global__ void increment(int* value) { *value += 1; }
int main() {
  int* value = nullptr;
  // No GPU is needed to build this; running it here is not attempted.
  if (cudaMalloc(&value, sizeof(int)) != cudaSuccess) return 1;
  increment<<<1, 1>>>(value);
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
CU
"$home/bin/nvcc" -arch=sm_90 -cudart shared "$probe/probe.cu" -o "$probe/probe"
echo "setup: nvcc works: $("$home/bin/nvcc" --version | tail -n 2 | head -n 1)"
echo "${packages[*]}" >"$stamp"
