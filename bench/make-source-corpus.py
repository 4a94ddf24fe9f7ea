#!/usr/bin/python3
"""Builds data/corpora/debian-source.txt: one sample per source file that a
fixed set of Debian packages ships (the Python and C/C++ sources of the
packages libra's scripts/setup.sh installs, directly or as hard
dependencies), its length in code tokens, one length per line.

A code token is a maximal identifier ([A-Za-z_][A-Za-z0-9_]*), a maximal
digit run, or any other single non-space character, counted on the file
decoded as UTF-8 (bad bytes replaced). Loader order is the SHA-256 of the
file's path, so the order is a fixed pseudo-random shuffle that does not
depend on the file system or on Python's random module.

Usage: /usr/bin/python3 bench/make-source-corpus.py [OUT]
       (default OUT: data/corpora/debian-source.txt; a second line on stderr
       names the package versions used, for the docs.)
Exits 2 with one line naming the package when one is not installed.
"""
import hashlib
import os
import re
import subprocess
import sys

PACKAGES = [
    "libpython3.11-minimal", "libpython3.11-stdlib",  # python3
    "python3-numpy", "python3-torch", "python3-sympy", "python3-mpmath",
    "python3-hypothesis", "python3-matplotlib",
    "libstdc++-12-dev", "libc6-dev", "linux-libc-dev", "libopenmpi-dev",
    "libhwy-dev", "nlohmann-json3-dev", "libfmt-dev", "libcli11-dev",
    "libgtest-dev", "libgmock-dev", "libbenchmark-dev", "librapidcheck-dev",
]
SOURCE = re.compile(r"\.(py|h|hh|hpp|hxx|c|cc|cpp|cxx|tcc|inl|ipp)$")
TOKEN = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^\sA-Za-z0-9_]")


def package_files(pkg):
    try:
        out = subprocess.run(["dpkg-query", "-L", pkg], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        sys.stderr.write(f"make-source-corpus: package {pkg}: not installed (run scripts/setup.sh)\n")
        sys.exit(2)
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True).stdout
    files = []
    for path in out.splitlines():
        # Headers without a suffix (libstdc++'s <vector>, ...) are sources too.
        if (SOURCE.search(path) or "/include/c++/" in path) and os.path.isfile(path) and not os.path.islink(path):
            files.append(path)
    return files, version


def tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    # Decoding first makes non-ASCII text one token per character, not per byte.
    return len(TOKEN.findall(data.decode("utf-8", "replace").encode("ascii", "replace")))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "data/corpora/debian-source.txt"
    paths, versions = set(), []
    for pkg in PACKAGES:
        files, version = package_files(pkg)
        paths.update(files)
        versions.append(f"{pkg}={version}")
    order = sorted(paths, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    lengths = [n for n in (tokens(p) for p in order) if n > 0]
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{n}\n" for n in lengths))
    os.replace(tmp, out)  # atomic: never a half-written corpus
    sys.stderr.write(f"make-source-corpus: {len(lengths)} files, {sum(lengths)} tokens, max {max(lengths)} -> {out}\n")
    sys.stderr.write("packages: " + " ".join(versions) + "\n")


if __name__ == "__main__":
    main()
