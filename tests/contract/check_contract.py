#!/usr/bin/env python3
"""Independent implementation of the planning contract, checked against libra.

This file re-implements ../shared/spec/planning-contract.md sections 2-7
(VRSP, SH-Tiles, TAP, exchange accounting) from the text alone, in the most
literal way (token-by-token pair counts, linear scans), shares no code with
libra, and compares it with `libra place --json` and `libra plan --json` on
seeded random windows and pools, tile for tile.

Usage: check_contract.py LIBRA_BINARY [--cases N] [--seed S]
Prints 'N passed, M failed' and exits non-zero on any mismatch.
"""
import argparse
import heapq
import json
import os
import random
import subprocess
import sys
import tempfile


# ---------------------------------------------------------------- VRSP (3)
def vrsp(F, P):
    D = len(F)
    K = D // P
    order = sorted(range(D), key=lambda i: (-F[i], i))
    heap = [(0, k) for k in range(K)]
    heapq.heapify(heap)
    pools = [[] for _ in range(K)]
    loads = [0] * K
    for i in order:
        load, k = heapq.heappop(heap)
        pools[k].append(i)
        loads[k] = load + F[i]
        if len(pools[k]) < P:
            heapq.heappush(heap, (loads[k], k))
    return pools, loads


# ------------------------------------------------------ SH-Tiles, TAP (4-7)
def tap(pool, L, CP, B, H, hq, hkv, d, e, w, tau):
    P = len(pool)
    W = P * CP
    span = L // CP
    tiles = []  # dict per tile, in id order (p, b, h)
    for p, seq in enumerate(pool):
        offs = [0]
        for l in seq:
            offs.append(offs[-1] + l)
        T = offs[-1]
        nb = -(-T // B)
        for b in range(nb):
            x0, x1 = b * B, min((b + 1) * B, T)
            for h in range(H):
                pairs = 0
                groups = []
                for j, l in enumerate(seq):
                    lo, hi = max(x0, offs[j]), min(x1, offs[j] + l)
                    if lo < hi:
                        for q in range(lo - offs[j], hi - offs[j]):
                            pairs += min(q + 1, w)
                        groups.append((p, j, h))
                tiles.append(dict(slot=p, block=b, shard=h, flops=(hq // H) * pairs,
                                  home=p * CP + (b * B) // span, groups=groups,
                                  rows=x1 - x0))
    kappa = hkv // H if H <= hkv else 1
    v_kv = 2 * kappa * d * e
    v_q = lambda t: t["rows"] * (hq // H) * d * e

    def sample_range(p, j):
        o = sum(pool[p][:j])
        return o, o + pool[p][j]

    def nonresident(g, r):
        p, j, _ = g
        lo, hi = sample_range(p, j)
        return sum(1 for x in range(lo, hi) if p * CP + x // span != r)

    total = sum(t["flops"] for t in tiles)
    C = (1 + tau) * total / W
    load = [0] * W
    committed = [set() for _ in range(W)]
    order = sorted(range(len(tiles)), key=lambda i: (-tiles[i]["flops"], i))
    for i in order:
        t = tiles[i]

        def dcomm(r):
            kv = sum(v_kv * nonresident(g, r) for g in t["groups"] if g not in committed[r])
            return kv + (2 * v_q(t) if r != t["home"] else 0)

        room = [r for r in range(W) if float(load[r] + t["flops"]) <= C]
        if room:
            r = min(room, key=lambda r: (dcomm(r), load[r], r))
        else:
            r = min(range(W), key=lambda r: (load[r], dcomm(r), r))
        t["worker"] = r
        load[r] += t["flops"]
        committed[r].update(t["groups"])

    matrix = [[0] * W for _ in range(W)]
    for r in range(W):
        for (p, j, h) in committed[r]:
            lo, hi = sample_range(p, j)
            for x in range(lo, hi):
                src = p * CP + x // span
                if src != r:
                    matrix[src][r] += v_kv
    for t in tiles:
        if t["worker"] != t["home"]:
            matrix[t["home"]][t["worker"]] += v_q(t)
            matrix[t["worker"]][t["home"]] += v_q(t)
    comm = sum(map(sum, matrix))
    mean = total / W
    imbalance = max(load) / mean - 1
    return tiles, load, comm, matrix, imbalance


def run(libra, args):
    out = subprocess.run([libra] + args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"libra {' '.join(args)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def random_sequence(rng, cap):
    seq, room = [], rng.randint(max(1, cap // 2), cap)
    while room > 0:
        # long-tailed: mostly short samples, sometimes one spanning much of the sequence
        l = rng.randint(1, room) if rng.random() < 0.2 else rng.randint(1, max(1, min(room, cap // 8)))
        seq.append(l)
        room -= l
    return seq


def check_vrsp(libra, rng, tmp, case):
    P = rng.choice([1, 2, 3, 4, 8])
    K = rng.randint(1, 6)
    D = P * K
    cap = rng.choice([16, 64, 256])
    seqs = [random_sequence(rng, cap) for _ in range(D)]
    if rng.random() < 0.5:  # force ties in F
        for i in range(1, D, 3):
            seqs[i] = list(seqs[i - 1])
    path = os.path.join(tmp, f"w{case}.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in seqs)
    got = run(libra, ["place", path, "--gbs", str(D), "--pool-size", str(P), "--mode", "vrsp", "--json"])
    F = [sum(l * l for l in s) for s in seqs]
    pools, loads = vrsp(F, P)
    win = got["windows"][0]
    problems = []
    if win["pools"] != pools:
        problems.append(f"pools {win['pools']} != {pools}")
    if win["loads"] != loads:
        problems.append(f"loads {win['loads']} != {loads}")
    R = max(loads) / (sum(loads) / K) - 1
    if abs(win["imbalance"] - R) > 1e-12:
        problems.append(f"imbalance {win['imbalance']} != {R}")
    return problems


def check_tap(libra, rng, tmp, case):
    CP = rng.choice([1, 2, 4])
    P = rng.choice([1, 2, 3, 4])
    B = rng.choice([2, 4, 8])
    L = CP * B * rng.randint(1, 4)
    hkv = rng.choice([1, 2, 4])
    hq = hkv * rng.choice([1, 2, 4])
    H = rng.choice([h for h in (1, 2, 4, 8) if hq % h == 0 and (hkv % h == 0 or h % hkv == 0)])
    d = rng.choice([2, 4])
    dtype = rng.choice(["bf16", "fp32"])
    e = 2 if dtype == "bf16" else 4
    window = rng.choice([None, None, 1, 3, 7])
    tau = rng.choice([0.03, 0.0, 0.5])
    pool = [random_sequence(rng, L) for _ in range(P)]
    path = os.path.join(tmp, f"p{case}.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in pool)
    args = ["plan", path, "--seq-len", str(L), "--cp", str(CP), "--block", str(B), "--head-shards", str(H),
            "--heads-q", str(hq), "--heads-kv", str(hkv), "--head-dim", str(d), "--dtype", dtype,
            "--tau", repr(tau), "--mode", "tap", "--json"]
    if window is not None:
        args += ["--window", str(window)]
    got = run(libra, args)
    tiles, load, comm, matrix, imbalance = tap(pool, L, CP, B, H, hq, hkv, d, e,
                                               window if window is not None else 1 << 62, tau)
    problems = []
    gt = got["tiles"]
    if len(gt) != len(tiles):
        return [f"{len(gt)} tiles, expected {len(tiles)} ({' '.join(args)})"]
    for i, (a, b) in enumerate(zip(gt, tiles)):
        for key in ("slot", "block", "shard", "flops", "home", "worker"):
            if a[key] != b[key]:
                problems.append(f"tile {i} {key}: {a[key]} != {b[key]}")
    if got["worker_flops"] != load:
        problems.append(f"worker_flops {got['worker_flops']} != {load}")
    if got["comm_bytes"] != comm:
        problems.append(f"comm_bytes {got['comm_bytes']} != {comm}")
    m = got["byte_matrix"]
    flat = [x for row in m for x in row] if m and isinstance(m[0], list) else m
    if flat != [x for row in matrix for x in row]:
        problems.append("byte_matrix differs")
    if abs(got["imbalance"] - imbalance) > 1e-12:
        problems.append(f"imbalance {got['imbalance']} != {imbalance}")
    if problems:
        problems.insert(0, "config: " + " ".join(args[1:]))
    return problems[:8]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("libra")
    ap.add_argument("--cases", type=int, default=150)
    ap.add_argument("--seed", type=int, default=20260729)
    ap.add_argument("--only", choices=["vrsp", "tap"])
    opts = ap.parse_args()
    rng = random.Random(opts.seed)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in range(opts.cases):
            for name, check in (("vrsp", check_vrsp), ("tap", check_tap)):
                if opts.only and name != opts.only:
                    continue
                problems = check(opts.libra, rng, tmp, case)
                if problems:
                    failed += 1
                    print(f"FAIL {name} case {case}:", *problems, sep="\n  ")
                else:
                    passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
