#!/usr/bin/env python3
"""One cell of the fault-injection matrix (issue 21).

Runs `libra_faulty exec` with LIBRA_FAULT=ACTION:POINT:RANK over in-process
ranks or mpirun and asserts that the job ends within the timeout (plus
start-up), with exactly one `libra: error:` line (in-process: exactly one
stderr line), the documented exit status, nothing on stdout and no trace
file. Prints the time the job took to exit.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 2  # --timeout of the run: short, so the matrix is quick
SHAPE = ["--seq-len", "512", "--cp", "2", "--block", "64", "--head-shards", "2", "--heads-q", "4", "--heads-kv", "2",
         "--head-dim", "16", "--chunks", "2"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--libra", required=True)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--transport", choices=["inproc", "mpi"], required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--action", choices=["fail", "stop", "alloc"], required=True)
    ap.add_argument("--point", choices=["before-post", "mid-pass", "kernel", "output"], required=True)
    ap.add_argument("--rank", type=int, default=1)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        args = ["exec", a.pool, *SHAPE, "--check", "--timeout", str(TIMEOUT_S), "--trace", trace]
        env = dict(os.environ, LIBRA_FAULT=f"{a.action}:{a.point}:{a.rank}")
        if a.transport == "inproc":
            cmd = [a.libra, *args, "--ranks", "4"]
        else:
            cmd = [a.mpirun, "--oversubscribe", "-np", "4", a.libra, *args]
        # Generous bound for the harness only (mpirun start-up on a loaded
        # machine); the assertion is that the job ends at all, on its own.
        limit = TIMEOUT_S + 60
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            print(f"FAIL: {a.transport} {a.action}@{a.point} rank {a.rank}: still running after {limit} s (hang)")
            return 1
        dt = time.monotonic() - t0
        errors = [l for l in p.stderr.splitlines() if l.startswith("libra: error:")]
        problems = []
        # Exit status 1: an internal failure (the injected error, out of
        # memory, or a peer silent for --timeout), never 0 or a signal.
        if p.returncode != 1:
            problems.append(f"exit status {p.returncode}, expected 1")
        if len(errors) != 1:
            problems.append(f"{len(errors)} 'libra: error:' lines, expected 1")
        if a.transport == "inproc" and len(p.stderr.splitlines()) != 1:
            problems.append(f"{len(p.stderr.splitlines())} stderr lines, expected 1")
        if p.stdout.strip():
            problems.append("partial output on stdout")
        if os.path.exists(trace):
            problems.append("a trace file was written")
        expect = {"fail": "fault injected at", "alloc": "out of memory",
                  "stop": f"(rank {a.rank} stopped or is too slow)"}[a.action]
        if errors and expect not in errors[0]:
            problems.append(f"the line does not say '{expect}'")
        # The line names the rank that failed or went silent (an out-of-memory
        # inside the kernel used to name only the kernel call).
        if errors and not re.search(rf"\brank {a.rank}\b", errors[0]):
            problems.append(f"the line does not name rank {a.rank}")
        print(f"{a.transport} {a.action}@{a.point} rank {a.rank}: exit {p.returncode} after {dt:.2f} s: "
              f"{errors[0] if errors else '(no error line)'}")
        if problems:
            print("FAIL: " + "; ".join(problems))
            print("stderr:\n" + p.stderr + "stdout:\n" + p.stdout)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
