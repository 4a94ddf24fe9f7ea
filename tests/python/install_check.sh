#!/usr/bin/env bash
# Installs libra into a fresh environment and checks it from outside the source tree: every module
# of the package imports, and libra.torch.attention runs forward and backward on each communicator
# (tests/python/install_smoke.py), then the core tests on the installed package.
#
# Usage: bash tests/python/install_check.sh BUILD_DIR [PYTHON]   (ctest's python.install: fast)
#        bash tests/python/install_check.sh --isolated [PYTHON]  (by hand: the user's path, minutes)
#
# BUILD_DIR: `pip install --no-build-isolation .` pointed at that CMake build (LIBRA_BUILD_DIR):
# nothing compiles again. --isolated: a clean clone of this checkout's HEAD, `pip wheel .` with build
# isolation (CMake, Ninja, pybind11 from PyPI, the core compiled from scratch), then `pip install`
# of that wheel, and `pip install .` of the clone too.
# PYTHON is the project's .venv python (scripts/setup.sh): the scratch venv borrows its packages
# (pip, setuptools, numpy, torch, pytest) by a path file, which adds the folder but not the folder's
# own path files, so the project's development-mode libra-dev.pth stays out and only the installed
# libra is seen.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mode=fast
if [ "${1:-}" = "--isolated" ]; then mode=isolated; else build=$(cd "$1" && pwd); fi
python=${2:-$root/.venv/bin/python}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
# --without-pip: the project venv's pip installs into the scratch venv; ensurepip would take most of
# this check's time.
"$python" -m venv --without-pip "$venv/env"
deps=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site=$("$venv/env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$deps" > "$site/project-deps.pth"
pip=("$venv/env/bin/python" -m pip)
if [ "$mode" = fast ]; then
  (cd "$root" && LIBRA_BUILD_DIR="$build" "${pip[@]}" install -q --no-build-isolation --no-deps .)
else
  git clone -q "$root" "$venv/src"
  t0=$(date +%s)
  (cd "$venv/src" && env -u LIBRA_BUILD_DIR "${pip[@]}" wheel -q --no-deps -w "$venv/dist" .)
  t1=$(date +%s)
  echo "pip wheel . (isolated build, from a clean clone): $((t1 - t0)) s: $(ls "$venv/dist")"
  "${pip[@]}" install -q --no-deps "$venv"/dist/libra-*.whl
  "$venv/env/bin/python" -c 'import libra.torch' 2>/dev/null || { echo "the wheel does not import"; exit 1; }
  "${pip[@]}" uninstall -q -y libra
  (cd "$venv/src" && env -u LIBRA_BUILD_DIR "${pip[@]}" install -q --no-deps .)
  echo "pip install . (isolated build): $(($(date +%s) - t1)) s"
fi
cd "$venv"
"$venv/env/bin/python" -c 'import libra, sys; assert libra.__file__.startswith(sys.prefix), libra.__file__'
env -u PYTHONPATH -u LIBRA_PYTHON_BUILD "$venv/env/bin/python" "$root/tests/python/install_smoke.py"
LIBRA_TEST_INSTALLED=1 "$venv/env/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python/test_core.py"
echo "python install ($mode): pip install, every module, attention on each communicator and the core tests passed"
