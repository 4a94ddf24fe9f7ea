#!/usr/bin/env bash
# Installs libra into a scratch prefix and builds/runs tests/consumer against it.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build/release --prefix "$prefix/install" >/dev/null
# Our warning flags (with -Werror) are for building libra, never exported.
if grep -l -e libra_build_flags -e Werror "$prefix"/install/lib*/cmake/libra/*.cmake; then
  echo "consumer: the installed package exports libra's build flags" >&2
  exit 1
fi
cmake -S tests/consumer -B "$prefix/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix/install" >/dev/null
cmake --build "$prefix/build" >/dev/null
"$prefix/build/consumer"
echo "consumer: find_package(libra) build and run passed"
