#!/usr/bin/env bash
# Sets up, builds and runs every libra test: the release build (unit,
# property, CLI golden and bad-input, contract, docs commands, MPI, Python),
# the AddressSanitizer + UBSan build (every test, MPI included), the
# ThreadSanitizer build (only the exec, kernel, sim and elastic test programs;
# the threaded tests: in-process communicator, executor ranks, kernel and
# simulator threads), short fuzz runs of every
# parser of untrusted files and the find_package consumer. Prints the time
# of each phase at the end.
# Usage: bash scripts/test.sh [--quick]   (--quick: release build only)
set -euo pipefail
cd "$(dirname "$0")/.."

total=0
timings=()
phase() {  # phase NAME COMMAND...: runs and times one phase
  local name=$1 start=$SECONDS
  shift
  "$@"
  timings+=("$(printf '%-22s %5d s' "$name" $((SECONDS - start)))")
}

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

consumer() {
  bash tests/consumer/run.sh
  total=$((total + 1))
}

phase setup bash scripts/setup.sh
phase release run_preset release
if [ "${1:-}" != "--quick" ]; then
  phase asan run_preset asan
  phase tsan run_preset tsan
  phase fuzz bash scripts/fuzz-smoke.sh
  phase consumer consumer
fi
echo "libra: phase times" >&2
for t in "${timings[@]}"; do echo "  $t" >&2; done
echo "libra: all suites passed"
echo "${total} passed, 0 failed"
