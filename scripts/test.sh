#!/usr/bin/env bash
# Sets up, builds and runs every libra test: the release build (unit,
# property, CLI golden and bad-input, contract, MPI), the AddressSanitizer +
# UBSan build, short fuzz runs of every reader and the find_package consumer.
# Usage: bash scripts/test.sh [--quick]   (--quick: release build only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

total=0
run_preset() {
  local preset=$1 log
  log=$(mktemp)
  echo "== libra: $preset build and tests" >&2
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  ctest --preset "$preset" --timeout 900 2>&1 | tee "$log"
  local n
  n=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
  rm -f "$log"
  total=$((total + ${n:-0}))
}

run_preset release
if [ "${1:-}" != "--quick" ]; then
  run_preset asan
  bash scripts/fuzz-smoke.sh
  bash tests/consumer/run.sh
  total=$((total + 1))
fi
echo "libra: all suites passed"
echo "${total} passed, 0 failed"
