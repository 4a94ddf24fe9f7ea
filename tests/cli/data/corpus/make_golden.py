#!/usr/bin/env python3
"""Computes the expected `libra corpus stats` outputs for the tiny test files
independently of libra (plain Python, nearest-rank percentiles, population
CV), and writes the golden files. The sequential packing of lengths.txt at
seq_len 1000 is worked by hand in packed.jsonl."""
import json
import math


def dist(values):
    v = sorted(values)
    n = len(v)
    rank = lambda p: v[(p * n + 99) // 100 - 1]
    mean = 0.0
    for x in v:
        mean += float(x)
    mean /= n
    ss = 0.0
    for x in v:
        ss += (x - mean) ** 2
    return {"count": n, "mean": mean, "median": rank(50), "p90": rank(90), "p99": rank(99), "max": v[-1],
            "cv": math.sqrt(ss / n) / mean}


def row(label, d):
    return "%-17s%16.2f%16d%16d%16d%16d%10.4f\n" % (label, d["mean"], d["median"], d["p90"], d["p99"], d["max"], d["cv"])


HEADER = "%-17s%16s%16s%16s%16s%16s%10s\n" % ("", "mean", "median", "p90", "p99", "max", "cv")

lengths = [300, 1000, 100, 700, 200, 900, 500, 400, 800, 600]
packed = [[300], [1000], [100, 700, 200], [900], [500, 400], [800], [600]]  # by hand, L = 1000
tokens = [sum(s) for s in packed]
work = [sum(l * l for l in s) for s in packed]


def text(source, fmt, packed_line):
    out = "source        %s\nformat        %s\nsamples       10\ntotal tokens  5500\n" % (source, fmt)
    if packed_line:
        out += packed_line + "\n"
    out += "\n" + HEADER + row("sample length", dist(lengths))
    if packed_line:
        out += row("tokens/sequence", dist(tokens)) + row("F = sum l^2", dist(work))
    return out


def js(source, fmt, kind, packed_obj):
    j = {"source": source, "format": fmt, "kind": kind, "samples": 10, "total_tokens": 5500,
         "sample_length": dist(lengths)}
    if packed_obj is not None:
        j["packed"] = packed_obj
    return json.dumps(j, indent=2) + "\n"


def packed_obj(by, seq_len):
    p = {"sequences": 7, "tokens_per_sequence": dist(tokens), "workload_f": dist(work), "packed_by": by}
    if seq_len:
        p["seq_len"] = seq_len
    return p


out = {
    "lengths.stats.txt": text("data/corpus/lengths.txt", "raw sample lengths (plain text)", None),
    "lengths.stats.json": js("data/corpus/lengths.txt", "text", "raw", None),
    "lengths.stats.L1000.txt": text("data/corpus/lengths.txt", "raw sample lengths (plain text)",
                                    "packed        7 sequences, sequentially at seq_len 1000 (overlong samples split)"),
    "lengths.stats.L1000.json": js("data/corpus/lengths.txt", "text", "raw",
                                   packed_obj("libra sequential, overlong samples split", 1000)),
    "packed.stats.txt": text("data/corpus/packed.jsonl", "packed sequences (JSON Lines)",
                             "packed        7 sequences as given"),
    "packed.stats.json": js("data/corpus/packed.jsonl", "jsonl", "packed", packed_obj("input", None)),
    "good.idx.stats.txt": text("data/corpus/good.idx", "raw sample lengths (Megatron-LM .idx)", None),
}
for name, data in out.items():
    with open(name, "w") as f:
        f.write(data)
