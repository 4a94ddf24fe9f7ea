#!/usr/bin/env bash
# Sets up, builds and runs every libra test: the release build, the
# AddressSanitizer+UBSan build, short fuzz runs and the find_package consumer.
# Usage: bash scripts/test.sh [--quick]   (--quick: release build only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

run_preset() {
  local preset=$1
  echo "== libra: $preset build and tests" >&2
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  ctest --preset "$preset" --timeout 900
}

run_preset release
if [ "${1:-}" = "--quick" ]; then exit 0; fi
run_preset asan
bash scripts/fuzz-smoke.sh
bash tests/consumer/run.sh
