#!/usr/bin/env bash
# Checks the documented install path, `pip install --no-build-isolation .` in a
# venv with the system site packages, without compiling the core again: setup.py
# is pointed at an existing CMake build (LIBRA_BUILD_DIR). Then runs the core
# tests against the installed package from outside the source tree.
# Usage: bash tests/python/install_check.sh BUILD_DIR [PYTHON]
set -euo pipefail
build=$(cd "$1" && pwd)
python=${2:-/usr/bin/python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
# --without-pip: the system pip (seen through the system site packages) installs into the venv; ensurepip
# would take most of this check's time.
"$python" -m venv --without-pip --system-site-packages "$venv/env"
(cd "$root" && LIBRA_BUILD_DIR="$build" "$venv/env/bin/python" -m pip install -q --no-build-isolation --no-deps .)
cd "$venv"
"$venv/env/bin/python" -c 'import libra, sys; assert libra.__file__.startswith(sys.prefix), libra.__file__'
LIBRA_TEST_INSTALLED=1 "$venv/env/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python/test_core.py"
echo "python install: pip install . and the core tests on the installed package passed"
