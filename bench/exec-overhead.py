#!/usr/bin/env python3
"""Executor overhead over kernel time, the figures of docs/executor.md (issue 10, point 6).

Runs `libra exec ... --repeat R --json` several times per configuration and prints, per
configuration, the medians of: wall of the pass (slowest rank) over the busiest rank's kernel
time, and the executor's own thread CPU time outside the kernel over its kernel CPU time (max
over ranks), forward and backward. Also times `--check` against the same run without it.

    bench/exec-overhead.py                        # the default matrix, 3 trials each
    bench/exec-overhead.py --trials 5 --only inprocess
    bench/exec-overhead.py --libra build/release/tools/libra --no-mpi

Every command is run as an argument list (no shell). Wall-clock figures depend on the machine's
load: 4 ranks on fewer than 4 cores share them, so read the CPU ratio beside the wall ratio.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

SHAPE = ["--cp", "2", "--heads-q", "8", "--heads-kv", "2", "--head-dim", "64", "--head-shards", "2"]
CONFIGS = [
    # name, transport, extra flags
    ("L 8192 tap fp32", "inprocess", ["--seq-len", "8192", "--block", "1024", "--chunks", "2", "--dtype", "fp32"]),
    ("L 8192 tap bf16", "inprocess", ["--seq-len", "8192", "--block", "1024", "--chunks", "2", "--dtype", "bf16"]),
    ("L 8192 tap-split bf16", "inprocess",
     ["--seq-len", "8192", "--block", "1024", "--chunks", "2", "--dtype", "bf16", "--mode", "tap-split"]),
    ("L 8192 ulysses bf16", "inprocess", ["--seq-len", "8192", "--block", "1024", "--dtype", "bf16", "--mode", "ulysses"]),
    ("L 16384 tap bf16 M 4", "inprocess", ["--seq-len", "16384", "--block", "2048", "--chunks", "4", "--dtype", "bf16"]),
    # The executor's first call: every buffer is new (page faults), measured apart.
    ("L 8192 tap bf16, first call", "inprocess",
     ["--seq-len", "8192", "--block", "1024", "--chunks", "2", "--dtype", "bf16", "--repeat", "1"]),
    ("L 8192 tap fp32", "mpi", ["--seq-len", "8192", "--block", "1024", "--chunks", "2", "--dtype", "fp32"]),
    ("L 8192 tap bf16", "mpi", ["--seq-len", "8192", "--block", "1024", "--chunks", "2", "--dtype", "bf16"]),
]


def command(libra, transport, extra, ranks=4):
    args = [libra, "exec", "builtin:paper-1m", *SHAPE, *extra]
    if transport == "mpi":
        return ["mpirun", "--oversubscribe", "-np", str(ranks), *args]
    return [*args, "--ranks", str(ranks)]


def run_json(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if p.returncode != 0:
        sys.exit(f"exec-overhead: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


def timed(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        sys.exit(f"exec-overhead: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libra", default="build/release/tools/libra")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="runs per trial; the last is measured")
    ap.add_argument("--only", choices=["inprocess", "mpi"], help="one transport")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="skip the --check timing")
    a = ap.parse_args()
    if a.trials < 1 or a.repeat < 1:
        sys.exit("exec-overhead: --trials and --repeat must be at least 1")
    if not os.access(a.libra, os.X_OK):
        sys.exit(f"exec-overhead: --libra {a.libra} is not an executable (build it: cmake --build build/release)")
    have_mpi = shutil.which("mpirun") is not None and not a.no_mpi
    print(f"load average before: {os.getloadavg()[0]:.2f}; {a.trials} trials of --repeat {a.repeat}; medians")
    print(f"{'configuration':30} {'transport':10} {'fwd wall':>9} {'bwd wall':>9} {'fwd cpu':>8} {'bwd cpu':>8}")
    for name, transport, extra in CONFIGS:
        if (a.only and transport != a.only) or (transport == "mpi" and not have_mpi):
            continue
        rows = []
        for _ in range(a.trials):
            repeat = [] if "--repeat" in extra else ["--repeat", str(a.repeat)]
            j = run_json(command(a.libra, transport, extra) + repeat + ["--json"])
            f, b, c = j["forward"], j["backward"], j["executor_cpu_over_kernel_cpu"]
            rows.append((f["wall_s"] / f["compute_max_s"] - 1, b["wall_s"] / b["compute_max_s"] - 1,
                         c["forward"], c["backward"]))
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        print(f"{name:30} {transport:10} " + " ".join(f"{100 * x:+8.1f}%" for x in med[:2]) + " " +
              " ".join(f"{100 * x:7.1f}%" for x in med[2:]))
    if not a.no_check:
        base = command(a.libra, "inprocess", CONFIGS[0][2])
        t = {label: statistics.median(timed(base + flags) for _ in range(a.trials))
             for label, flags in (("run", []), ("--check (auto: kernel reference)", ["--check"]))}
        print(f"--check, whole command, {CONFIGS[0][0]}, in-process: {t['run']:.2f} s without, "
              f"{t['--check (auto: kernel reference)']:.2f} s with ({t['--check (auto: kernel reference)'] / t['run']:.2f}x)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
