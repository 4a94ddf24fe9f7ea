#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a short time
# (LIBRA_FUZZ_SECONDS, default 20) from its seed corpus in fuzz/corpus/<name>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${LIBRA_FUZZ_SECONDS:-20}
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
shopt -s nullglob
for bin in build/fuzz/fuzz/libra_*_fuzz; do
  name=$(basename "$bin" | sed 's/^libra_//; s/_fuzz$//')
  work=$(mktemp -d)
  seeds=()
  [ -d "fuzz/corpus/$name" ] && seeds=("fuzz/corpus/$name")
  echo "== fuzz $name for ${seconds}s" >&2
  "$bin" -max_total_time="$seconds" -print_final_stats=0 "$work" "${seeds[@]}" 2>&1 | tail -n 3
  rm -rf "$work"
done
