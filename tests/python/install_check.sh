#!/usr/bin/env bash
# Checks the documented install path, `pip install --no-build-isolation .`, in a
# scratch venv, without compiling the core again: setup.py is pointed at an
# existing CMake build (LIBRA_BUILD_DIR). Then runs the core tests against the
# installed package from outside the source tree.
# Usage: bash tests/python/install_check.sh BUILD_DIR [PYTHON]
# PYTHON is the project's .venv python (scripts/setup.sh): the scratch venv
# borrows its packages (pip, setuptools, numpy, pytest) by a path file, which
# adds the folder but not the folder's own path files, so the project's
# development-mode libra-dev.pth stays out and only the installed libra is seen.
set -euo pipefail
build=$(cd "$1" && pwd)
python=${2:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
# --without-pip: the project venv's pip installs into the scratch venv; ensurepip would take most of this
# check's time.
"$python" -m venv --without-pip "$venv/env"
deps=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site=$("$venv/env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$deps" > "$site/project-deps.pth"
(cd "$root" && LIBRA_BUILD_DIR="$build" "$venv/env/bin/python" -m pip install -q --no-build-isolation --no-deps .)
cd "$venv"
"$venv/env/bin/python" -c 'import libra, sys; assert libra.__file__.startswith(sys.prefix), libra.__file__'
LIBRA_TEST_INSTALLED=1 "$venv/env/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python/test_core.py"
echo "python install: pip install . and the core tests on the installed package passed"
