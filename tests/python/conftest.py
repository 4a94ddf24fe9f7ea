"""pytest setup for libra's Python tests.

By default the tests import the package from the source tree (python/) and
the `_libra` extension from the release build (build/release/python), so CI
compiles the core once. LIBRA_PYTHON_BUILD names another build's python/
folder; LIBRA_TEST_INSTALLED=1 uses the installed package instead.
LIBRA_CLI names the `libra` executable the CLI-agreement tests run
(default build/release/tools/libra; those tests skip without it).

A DeprecationWarning raised from a libra module is an error: libra's own code must
not call what it deprecates (dist_util's spawned workers set the same filter).
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if not os.environ.get("LIBRA_TEST_INSTALLED"):
    build = Path(os.environ.get("LIBRA_PYTHON_BUILD", ROOT / "build" / "release" / "python"))
    for p in (str(build), str(ROOT / "python")):
        if p not in sys.path:
            sys.path.insert(0, p)


# The warning's module is the frame it is attributed to (the caller at the warning's stacklevel).
LIBRA_DEPRECATIONS = r"error::DeprecationWarning:libra(\.|$)"


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", LIBRA_DEPRECATIONS)


@pytest.fixture(scope="session")
def libra_cli():
    cli = Path(os.environ.get("LIBRA_CLI", ROOT / "build" / "release" / "tools" / "libra"))
    if not cli.exists():
        pytest.skip(f"no libra executable at {cli}")
    return str(cli)
