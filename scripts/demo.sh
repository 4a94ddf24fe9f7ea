#!/usr/bin/env bash
# Sets up, builds and runs libra's main job on the built-in default corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target libra_cli
./build/release/tools/libra corpus stats builtin:paper-1m "$@"
