#!/usr/bin/env bash
# Installs everything libra needs to build, test and plot: the C++ toolchain
# and libraries from Debian's packages, and the project's Python environment
# at .venv (Python 3.11, torch 2.13.0 CPU, transformers, megatron-core, pytest;
# requirements-dev.txt pins them) from PyPI, with libra's source tree and
# release build on its path. Idempotent: what is already there is kept.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build g++ clang libclang-rt-14-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libopenmpi-dev openmpi-bin
  libhwy-dev libopenblas-dev
  gnuplot-nox python3 ccache
  python3-venv python3-pip python3-numpy python3-pybind11 pybind11-dev
  python3-dev python3-setuptools python3-wheel
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -ne 0 ]; then
  echo "libra setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python environment. Debian's python3 (3.11) makes it, so the extension
# built against Debian's pybind11 and python3-dev imports in it. A stamp of
# requirements-dev.txt says whether the pins changed since it was filled.
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv
stamp=$venv/.libra-requirements
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$root/requirements-dev.txt" "$stamp"; then
  echo "libra setup: filling $venv from requirements-dev.txt" >&2
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/requirements-dev.txt" 2>&1 \
    | grep -v "^WARNING: Location '.*' is ignored" >&2 || true
  "$venv/bin/python" -c "import torch, transformers, megatron.core, pytest" >/dev/null 2>&1 || {
    echo "libra setup: $venv lacks torch, transformers, megatron-core or pytest after pip install" >&2
    exit 1
  }
  cp "$root/requirements-dev.txt" "$stamp"
fi
# libra itself, in development mode: the pure-Python package from the source
# tree and the _libra extension from the release build (built by demo.sh,
# test.sh or `cmake --build --preset release`). `pip install .` makes a real
# installation instead (tests/python/install_check.sh does that).
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
printf '%s\n%s\n' "$root/python" "$root/build/release/python" > "$site/libra-dev.pth"
