#!/usr/bin/env python3
"""Kernel launches per libra.torch.attention call with the triton backend, against the kernel calls
the varlen backends make (one per schedule call before the host engineer's merging; docs/python.md),
on every worker of a plan, from the chunks' descriptor tables (libra.torch.descriptors): per chunk,
forward one launch per non-empty buffer pair (at most 4), backward delta + dQ + dK/dV per pair (in
deterministic mode dK/dV once per wave). No GPU and no kernel run; prints the busiest worker.

    .venv/bin/python bench/triton-launches.py         # builtin:paper-256k, L 256K, CP 8, M 4 (4 slots)
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "build", "release", "python")
if os.path.isdir(BUILT):
    sys.path[0:0] = [BUILT, os.path.join(HERE, "..", "python")]

import libra  # noqa: E402
from libra.torch import triton_attention as ta  # noqa: E402
from libra.torch.descriptors import chunk_descriptors  # noqa: E402


def launches(calls, window, deterministic):
    """(forward, backward) launches of one chunk's calls (GPU block sizes for d 128, bf16)."""
    import torch  # noqa: PLC0415
    table, bounds = chunk_descriptors(calls)
    return ta.WorkTables(table, bounds, window, ta.gpu_config(128, torch.bfloat16), "cpu", deterministic).launches()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="builtin:paper-256k")
    ap.add_argument("--seq-len", type=int, default=262144)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--cp", type=int, default=8)
    ap.add_argument("--block", type=int, default=16384)
    ap.add_argument("--head-shards", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--mode", default="tap")
    a = ap.parse_args()
    pool = libra.load_packed_sequences(a.source, a.seq_len)[:a.pool_size]
    plan = libra.make_plan(pool, seq_len=a.seq_len, cp=a.cp, block_size=a.block, head_shards=a.head_shards,
                           heads_q=32, heads_kv=8, head_dim=128, chunks=a.chunks, mode=a.mode, dtype="bf16")
    rows = []
    for worker in range(len(pool) * a.cp):
        W = len(pool) * a.cp
        calls = libra._libra.rank_program(plan, worker, list(range(W))).info["calls"]
        n_calls = [sum(len(c) for c in calls[p]) for p in (0, 1)]
        atomic = np.sum([launches(c, None, False) for c in calls[0]], axis=0)
        det = np.sum([launches(c, None, True) for c in calls[1]], axis=0)
        rows.append((n_calls[0], n_calls[1], int(atomic[0]), int(atomic[1]), int(det[1]), worker))
    busiest = max(rows)
    print(f"{a.source}: L {a.seq_len}, P {len(pool)} x CP {a.cp}, M {a.chunks}, B {a.block}, H {a.head_shards}, "
          f"{a.mode}: busiest worker {busiest[5]}: {busiest[0]} kernel calls per forward, {busiest[1]} per "
          f"backward; triton launches: forward {busiest[2]}, backward {busiest[3]} "
          f"(deterministic {busiest[4]}); largest over workers: forward {max(r[2] for r in rows)}, "
          f"backward {max(r[3] for r in rows)}, deterministic backward {max(r[4] for r in rows)}")


if __name__ == "__main__":
    main()
