#!/usr/bin/env bash
# Installs everything libra needs to build, test and plot, from Debian's
# packages only. Idempotent: when every package is present it does nothing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build g++ clang libclang-rt-14-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libopenmpi-dev openmpi-bin
  libhwy-dev libopenblas-dev
  gnuplot-nox python3 ccache
  python3-venv python3-pip python3-numpy python3-pytest python3-pybind11 pybind11-dev
  python3-torch python3-matplotlib python3-dev python3-setuptools python3-wheel
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "libra setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
