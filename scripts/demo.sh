#!/usr/bin/env bash
# Sets up, builds and runs libra's main job: the configuration simulator on
# the built-in corpus builtin:paper-1m (the paper's 1M-token setting), which
# prints the comparison table and writes the report (plots + index.md) to
# out/simulate-report/. Extra arguments go to `libra simulate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
# _libra too: the README's next command imports libra.torch from this build.
cmake --build --preset release --target libra_cli _libra
./build/release/tools/libra simulate builtin:paper-1m --report out/simulate-report "$@"
echo "report: out/simulate-report/index.md" >&2
