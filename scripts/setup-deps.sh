#!/usr/bin/env bash
# Checks for what the build needs besides the Rust toolchain, and installs the Debian packages for what is
# missing (only then: a machine that has everything is left alone).
# Usage: scripts/setup-deps.sh [--pip]   (--pip: pip is needed too, to fetch CUDA's compiler from PyPI)
set -euo pipefail

need_pip=0
[[ ${1:-} == --pip ]] && need_pip=1

missing=()
command -v "${CXX:-g++}" >/dev/null 2>&1 || missing+=(g++)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The Python package is built and tested in a virtual environment (scripts/setup-python.sh).
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if ((need_pip)) && ! python3 -m pip --version >/dev/null 2>&1; then
  missing+=(python3-pip)
fi

if ((${#missing[@]})); then
  echo "setup: installing missing Debian packages: ${missing[*]}"
  sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: not root and no sudo; install ${missing[*]} by hand" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# For the tests only: iproute2 lets the cross-host bootstrap test build its network namespaces (without
# it, that test says it was skipped). Installed when we are root; a failure here does not stop the build.
if ! command -v ip >/dev/null 2>&1 && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing iproute2 for the cross-host test"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2; } ||
    echo "setup: could not install iproute2; the cross-host test will be skipped" >&2
fi

if ! command -v "${CARGO:-cargo}" >/dev/null 2>&1; then
  echo "setup: cargo not found; install the Rust toolchain (https://rustup.rs) and run make again" >&2
  exit 1
fi
