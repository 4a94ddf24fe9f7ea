#!/usr/bin/env python3
"""Corpus sources are read as streams (issue 21): `libra corpus stats` under an
address-space limit far below what the sources expand to.

A 4 MB gzip file expanding to 4 GiB (a bad first line, then newlines) was
inflated whole before its first line was read: "out of memory", and so was a
good file expanding to more than the limit. Standard input was read whole, so
an endless pipe never ended. Now each bad source fails at its first line with
one line and exit status 2, within the limit, and the good one is read; a
4 GiB run of zeros fails once its first line passes the 64 MiB line bound.

usage: corpus_stream_bound.py LIBRA
"""
import os
import resource
import subprocess
import sys
import tempfile
import zlib

LIMIT = 256 << 20  # bytes of address space: the line bound (64 MiB) and the program, not the source


def member(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    return z.compress(data) + z.flush()


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run(libra, args, stdin=None, feeder=None):
    """(exit status, stdout, stderr) of libra ARGS under the limit; stdin a file or a feeding shell command."""
    feed = subprocess.Popen(["sh", "-c", feeder], stdout=subprocess.PIPE) if feeder else None
    src = feed.stdout if feed else stdin
    try:
        p = subprocess.run([libra, *args], stdin=src, capture_output=True, text=True, timeout=60,
                           preexec_fn=limited)
    finally:
        if feed:
            feed.stdout.close()  # the feeder ends on SIGPIPE once libra stopped reading
            feed.kill()
            feed.wait()
    return p.returncode, p.stdout, p.stderr


def main() -> int:
    libra = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        # 4096 members of 1 MiB each: 4 GiB inflated from about 4 MB.
        newlines = os.path.join(d, "newlines.gz")
        with open(newlines, "wb") as f:
            f.write(member(b"x\n") + member(b"\n" * (1 << 20)) * 4096)
        zeros = os.path.join(d, "zeros.gz")
        with open(zeros, "wb") as f:
            f.write(member(b"\0" * (1 << 20)) * 4096)
        bound = "line longer than 64 MiB; a corpus line holds one sample or one packed sequence"
        # A good source passes too: 512 MiB of blank lines (1 MiB of spaces each), twice the limit,
        # then one sample.
        blank_then_one = os.path.join(d, "blank_then_one.gz")
        with open(blank_then_one, "wb") as f:
            f.write(member(b" " * ((1 << 20) - 1) + b"\n") * 512 + member(b"7\n"))
        cases = [
            ("gzip file, bad line 1 then 4 GiB of newlines", ["corpus", "stats", newlines], None, None,
             f"libra: error: {newlines}:1: expected a positive integer, got 'x'"),
            ("gzip file, 4 GiB of zeros", ["corpus", "stats", zeros], None, None,
             f"libra: error: {zeros}:1: {bound}"),
            ("gzip on standard input, bad line 1 then 4 GiB of newlines", ["corpus", "stats", "-"], newlines, None,
             "libra: error: -:1: expected a positive integer, got 'x'"),
            ("endless standard input, bad line 1", ["corpus", "stats", "-"], None, "echo x; yes ''",
             "libra: error: -:1: expected a positive integer, got 'x'"),
            ("endless standard input of zeros", ["corpus", "stats", "-"], None, "cat /dev/zero",
             f"libra: error: standard input:1: {bound}"),
        ]
        code, out, err = run(libra, ["corpus", "stats", blank_then_one, "--json"])
        ok = code == 0 and '"samples": 1' in out and '"total_tokens": 7' in out and err == ""
        print(f"{'ok  ' if ok else 'FAIL'} gzip file, 512 MiB of blank lines then one sample: exit {code}: "
              f"{'one sample of 7 tokens' if ok else err.strip()}")
        failures += not ok
        for what, args, stdin_path, feeder, expected in cases:
            if stdin_path:
                with open(stdin_path, "rb") as f:
                    code, out, err = run(libra, args, stdin=f)
            else:
                code, out, err = run(libra, args, feeder=feeder)
            ok = code == 2 and err == expected + "\n" and out == ""
            print(f"{'ok  ' if ok else 'FAIL'} {what}: exit {code}: {err.strip()}")
            if not ok:
                print(f"     expected exit 2 and: {expected}")
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
