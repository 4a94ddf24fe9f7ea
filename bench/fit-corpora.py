#!/usr/bin/env python3
"""Fits the two tail parameters of each built-in corpus (docs/corpora.md, "Calibration").

The lognormal body is fixed by the paper's median and p99; above the p99 a
Pareto tail of index alpha is truncated at the longest sample, cap x L. This
script searches (alpha, cap) coarse to fine, minimising the worst relative
miss of the three inter-pool targets (random-grouping R-1 at P = 8 and 64, figure 4;
VRSP's R-1 at P = 8, figure 8), each measured by libra_corpus_fit exactly as
libra_sim_tests measures the builtins. The final candidates are re-measured
on every window with 32 groupings.

    cmake --build build/release --target libra_corpus_fit
    /usr/bin/python3 bench/fit-corpora.py [--corpus paper-1m|paper-256k] [--bin build/release/bench/libra_corpus_fit]
"""
import argparse
import math
import subprocess

# name: (median, p99, L, samples, default seed, targets random8, random64, vrsp8)
CORPORA = {
    "paper-1m": (644, 71006, 1048576, 1000000, 0x4C1B7A1D00000001, (0.90, 0.08, 0.0066)),
    "paper-256k": (607, 33000, 262144, 450000, 0x4C1B7A1D00000002, (1.08, 0.09, 0.0050)),
}


def measure(binary, corpus, points, windows, groupings):
    median, p99, seq_len, samples, seed, _ = CORPORA[corpus]
    args = [binary, str(median), str(p99), str(seq_len), str(samples), str(seed), str(windows), str(groupings)]
    for a, c in points:
        args += [f"{a:.4f}", f"{c:.4f}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.split("\n"):
        if line.strip():
            f = line.split()
            rows.append(tuple(float(x) for x in f))
    return rows


def loss(row, targets):
    """The worst relative miss, |ln(measured / target)|, over the three targets:
    the tolerances are per statistic, so the fit minimises the largest."""
    return max(abs(math.log(m / t)) for m, t in zip(row[4:7], targets))


def rank(row, targets):
    """Sort key: the worst miss (to 0.1%), then the sum of squared log misses."""
    return (round(loss(row, targets), 3), sum(math.log(m / t) ** 2 for m, t in zip(row[4:7], targets)))


def report(corpus, label, r, targets):
    print(f"{corpus} {label}: alpha {r[0]:.3f} cap {r[1]:.3f} median {int(r[2])} p99 {int(r[3])} random8 {r[4]:.3f} "
          f"random64 {r[5]:.4f} vrsp8 {r[6]:.5f} worst miss {100 * (math.exp(loss(r, targets)) - 1):.1f}%", flush=True)


def fit(binary, corpus):
    targets = CORPORA[corpus][5]
    # Coarse: every window of GBS 128, 8 groupings per window; fine: a dense
    # grid around the best with 32 groupings, as the calibration test measures.
    grid = [(a, c) for a in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.9, 1.1, 1.3)
            for c in (1.0, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 3.0, 5.0)]
    rows = sorted(measure(binary, corpus, grid, 0, 8), key=lambda r: rank(r, targets))
    for r in rows[:3]:
        report(corpus, "coarse", r, targets)
    done = {}
    for _ in range(3):  # fine passes, each around the three best so far
        grid = set()
        for r in rows[:3]:
            a0, c0 = r[0], r[1]
            grid |= {(round(max(0.05, a0 + i * 0.05), 4), round(max(1.0, c0 + j * 0.05), 4))
                     for i in range(-2, 3) for j in range(-3, 4)}
        grid -= set(done)
        for r in measure(binary, corpus, sorted(grid), 0, 32) if grid else []:
            done[(round(r[0], 4), round(r[1], 4))] = r
        rows = sorted(done.values(), key=lambda r: rank(r, targets))
    for r in rows[:3]:
        report(corpus, "fine", r, targets)
    report(corpus, "best", rows[0], targets)
    print(f"{corpus} targets: random8 {targets[0]} random64 {targets[1]} vrsp8 {targets[2]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", choices=sorted(CORPORA), action="append")
    ap.add_argument("--bin", default="build/release/bench/libra_corpus_fit")
    a = ap.parse_args()
    for corpus in a.corpus or sorted(CORPORA):
        fit(a.bin, corpus)


if __name__ == "__main__":
    main()
