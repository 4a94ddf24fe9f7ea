#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (only them: `libra_fuzz_targets`)
# and runs each for LIBRA_FUZZ_SECONDS (default 20) from its seed corpus in
# fuzz/corpus/<name>/, which also holds the regression inputs of every crash
# found so far (libFuzzer runs them all first). Prints runs per target.
# Usage: bash scripts/fuzz-smoke.sh [TARGET ...]   (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${LIBRA_FUZZ_SECONDS:-20}
cmake --preset fuzz >/dev/null
cmake --build build/fuzz --target libra_fuzz_targets
shopt -s nullglob
names=("$@")
if [ "${#names[@]}" -eq 0 ]; then
  for bin in build/fuzz/fuzz/libra_*_fuzz; do
    names+=("$(basename "$bin" | sed 's/^libra_//; s/_fuzz$//')")
  done
fi
for name in "${names[@]}"; do
  bin=build/fuzz/fuzz/libra_${name}_fuzz
  work=$(mktemp -d)
  seeds=()
  [ -d "fuzz/corpus/$name" ] && seeds=("fuzz/corpus/$name")
  log=$(mktemp)
  # -rss_limit_mb and -timeout: a reader that explodes in memory or time on
  # a small input is a bug like a crash.
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$work/" "$work" "${seeds[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz $name: FAILED; the input is in $work (add it to fuzz/corpus/$name once fixed)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "fuzz $name: ${runs:-?} runs in ${seconds}s, no crash" >&2
  rm -rf "$work" "$log"
done
