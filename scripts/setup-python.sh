#!/usr/bin/env bash
# Sets up what the Python package's build and tests need, unless the same pinned set is already there:
#   build/python-venv     a virtual environment with the build backend (setuptools, wheel), pytest, and
#                         NVRTC from PyPI (the tests compile mscclpp.h with it, as cupy's RawModule does)
#   build/python-wheels   pytest and its dependencies as wheels (pure Python, for Python 3.10 and later),
#                         so that a GPU machine without pytest and without network can install it
#                         (python/run_gpu_tests.sh does)
# `make` then installs the package itself into the venv (pip install ./python).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/build/python-venv"
wheels="$root/build/python-wheels"
stamp="$venv/.ready"
# NVRTC of the CUDA release the toolchain's nvcc and the GPU machines have.
packages=("setuptools>=64" wheel "pytest>=8" nvidia-cuda-nvrtc==13.0.88)
test_wheels=("pytest>=8" exceptiongroup tomli typing_extensions)

if [[ -f $stamp && $(cat "$stamp") == "${packages[*]} | ${test_wheels[*]}" ]]; then
  touch "$stamp" # newer than this script, for make
  exit 0
fi

echo "setup: making the Python test environment build/python-venv (${packages[*]})"
rm -rf "$venv" "$wheels"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check --no-input)
"${pip[@]}" install "${packages[@]}"
# The back-ports pytest needs below Python 3.11 are named: pip evaluates markers for the running Python.
"${pip[@]}" download --dest "$wheels" --only-binary=:all: --python-version 3.10 "${test_wheels[@]}"
echo "${packages[*]} | ${test_wheels[*]}" >"$stamp"
