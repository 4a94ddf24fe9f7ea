"""Builds libra's C++ core and the `_libra` extension with CMake for `pip install .` / `pip wheel .`.

With build isolation (pip's default) CMake, Ninja and pybind11 come from PyPI (pyproject.toml's
build requirements); without it, from the environment or the system (Debian's pybind11-dev).

Environment:
  LIBRA_BUILD_DIR  an existing CMake build directory of this checkout (e.g.
                   build/release) to build `_libra` in instead of a fresh one:
                   nothing already built is compiled again.
  LIBRA_JOBS       parallel build jobs (default 2).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _gone_programs(build_dir):
    """The CMake and build programs a cached configuration names that no longer exist: an isolated
    build's CMake and Ninja live in a build environment pip deletes afterwards, so a second
    `pip install .` in the same checkout would find the first one's cache pointing at them."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.exists():
        return []
    gone = []
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(("CMAKE_COMMAND:", "CMAKE_MAKE_PROGRAM:")):
            path = line.split("=", 1)[1].strip()
            if path and os.path.isabs(path) and not os.path.exists(path):
                gone.append(path)
    return gone


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("LIBRA_BUILD_DIR")
        if build_dir:
            build_dir = Path(build_dir).resolve()
            gone = _gone_programs(build_dir)
            if gone:
                raise RuntimeError(f"libra: LIBRA_BUILD_DIR {build_dir} was configured with {gone[0]}, which no "
                                   f"longer exists: reconfigure it (cmake --preset release) or unset LIBRA_BUILD_DIR")
        else:
            build_dir = Path(self.build_temp).resolve() / "cmake"
            if _gone_programs(build_dir):  # configure afresh with this build environment's CMake and Ninja
                (build_dir / "CMakeCache.txt").unlink()
                shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        if not (build_dir / "CMakeCache.txt").exists():
            args = [
                "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release", "-DLIBRA_BUILD_PYTHON=ON", "-DLIBRA_BUILD_TESTS=OFF",
                "-DLIBRA_BUILD_BENCH=OFF", "-DLIBRA_BUILD_TOOLS=OFF", "-DLIBRA_WITH_MPI=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}",
            ]
            try:  # pybind11 from PyPI (the isolated build environment) when there is one
                import pybind11  # noqa: PLC0415
                args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
            except ImportError:
                pass
            subprocess.run(args, check=True)
        jobs = os.environ.get("LIBRA_JOBS", "2")
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_libra", "-j", jobs], check=True)
        built = sorted((build_dir / "python").glob("_libra*.so"))
        if not built:
            raise RuntimeError(f"libra: CMake built no _libra module under {build_dir / 'python'}")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], dest)


setup(ext_modules=[CMakeExtension("libra._libra")], cmdclass={"build_ext": CMakeBuild})
