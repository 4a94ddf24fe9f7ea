#!/usr/bin/env python3
"""Writes the expected outputs of tests/cli/plan.cmake.in from hand-computed
plans (see the comments there), independently of libra: the fingerprint is
computed here from the format described in docs/plan-format.md.

    python3 expected.py   # rewrites gqa.json, ties.txt, ties_split.txt, gqa_tapered.txt, gqa_topology.txt

gqa_format1.json is gqa.json as format-1 writers wrote it (elem_bytes, no
dtype): it must load to the same plan.
"""
import json
import struct

M64 = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1


def fingerprint(cfg, pool, tiles):
    # Version 1 (contiguous homes, no KV prefix, equal chunks), or version 4
    # for tapered chunks: then the home layout (contiguous 0), kv_prefix (0)
    # and chunk split (tapered 1) words follow dedup_per_kv_head.
    # Version 5: a topology other than the default on a plan of another
    # mode than tap-topo; the layout, prefix and split words (0 0 0), then
    # gpus_per_node, nodes_per_supernode and the bits of the four numbers.
    tapered = cfg.get("chunk_split") == "tapered"
    topo = cfg.get("topology")
    words = [0x4E4C50415242494C, 5 if topo else 4 if tapered else 1, cfg["seq_len"], cfg["cp"], cfg["block_size"], cfg["head_shards"],
             cfg["heads_q"], cfg["heads_kv"], cfg["head_dim"], {"fp32": 4, "bf16": 2, "fp16": 2 | 1 << 8}[cfg["dtype"]],
             INT64_MAX if cfg["window"] is None else cfg["window"],
             struct.unpack("<Q", struct.pack("<d", cfg["tau"]))[0], cfg["chunks"],
             {"tap": 0, "ulysses": 1, "tap-split": 2}[cfg["mode"]], int(cfg["dedup_per_kv_head"])]
    if tapered or topo:
        words += [0, 0, 1 if tapered else 0]
    if topo:
        bits = lambda x: struct.unpack("<Q", struct.pack("<d", x))[0]
        words += [topo["gpus_per_node"], topo["nodes_per_supernode"]] + [
            bits(topo[k]) for k in ("intra_node_gbps", "inter_node_gbps", "inter_supernode_gbps", "congestion_per_node")]
    words.append(len(pool))
    for seq in pool:
        words += [len(seq)] + seq
    words.append(len(tiles))
    for t in tiles:
        words += [(t["slot"] << 32) | t["block"], (t["shard"] << 32) | t["worker"], t["begin"], t["end"]]
    h = 0xCBF29CE484222325
    for w in words:
        h ^= w
        h = (h * 0x100000001B3) & M64
        h ^= h >> 29
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & M64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & M64
    h ^= h >> 31
    return "0x%016x" % h


def tile(i, slot, block, shard, begin, end, heads, kv, flops, home, worker, piece=0):
    return {"id": i, "slot": slot, "block": block, "shard": shard, "piece": piece, "begin": begin, "end": end,
            "heads": heads, "kv_heads": kv, "flops": flops, "home": home, "worker": worker}


def config(mode, seq_len, cp, block, shards, hq, hkv, d, e, tau, chunks=1):
    return {"mode": mode, "seq_len": seq_len, "cp": cp, "block_size": block, "head_shards": shards,
            "heads_q": hq, "heads_kv": hkv, "head_dim": d, "dtype": {2: "bf16", 4: "fp32"}[e], "elem_bytes": e, "window": None, "tau": tau,
            "chunks": chunks, "dedup_per_kv_head": False}


# GQA pool (see plan.cmake.in): tiles 0,1 on worker 0, tiles 2,3 on worker 1.
cfg = config("tap", 4, 2, 2, 2, 4, 1, 2, 2, 0.03)
pool = [[3]]
tiles = [tile(0, 0, 0, 0, 0, 2, [0, 2], [0, 1], 6, 0, 0), tile(1, 0, 0, 1, 0, 2, [2, 4], [0, 1], 6, 0, 0),
         tile(2, 0, 1, 0, 2, 3, [0, 2], [0, 1], 6, 1, 1), tile(3, 0, 1, 1, 2, 3, [2, 4], [0, 1], 6, 1, 1)]
doc = {"format": "libra-plan", "version": 1, "fingerprint": fingerprint(cfg, pool, tiles), "config": cfg,
       "pool_size": 1, "num_workers": 2, "pool": pool, "tiles": tiles, "worker_flops": [12, 12],
       "imbalance": 0.0, "comm_bytes": 48, "byte_matrix": [[0, 32], [16, 0]],
       # kept: Q+O of tiles on their home (rows x 2 heads x d 2 x 2 bytes, twice) plus
       # the resident KV tokens of each shard's group (8 bytes a token); one node.
       "workers": [{"worker": 0, "flops": 12, "tiles": 2, "kv_groups": 2, "send_bytes": 32, "recv_bytes": 16,
                    "kept_bytes": 64 + 32, "send_intra_node_bytes": 32, "send_cross_node_bytes": 0,
                    "recv_intra_node_bytes": 16, "recv_cross_node_bytes": 0, "recv_cross_supernode_bytes": 0},
                   {"worker": 1, "flops": 12, "tiles": 2, "kv_groups": 2, "send_bytes": 16, "recv_bytes": 32,
                    "kept_bytes": 32 + 16, "send_intra_node_bytes": 16, "send_cross_node_bytes": 0,
                    "recv_intra_node_bytes": 32, "recv_cross_node_bytes": 0, "recv_cross_supernode_bytes": 0}],
       "busiest_receiver": 1, "max_recv_cross_node_bytes": 0}
with open("gqa.json", "w") as f:
    f.write(json.dumps(doc, indent=1) + "\n")


def summary(mode, cfg, pool, tiles, rows, imbalance, comm, kv, widths=None):
    # widths: the query heads of a tile in each tapered chunk.
    chunks = "%d" % cfg["chunks"] + (" (tapered chunks %s)" % ",".join(map(str, widths)) if widths else "")
    out = "# plan mode %s  slots %d  cp %d  workers %d  tiles %d  block %d  head-shards %d  chunks %s  tau %s\n" % (
        mode, len(pool), cfg["cp"], len(rows), len(tiles), cfg["block_size"], cfg["head_shards"], chunks,
        "%g" % cfg["tau"])
    out += "# fingerprint %s\n" % fingerprint(cfg, pool, tiles)
    out += "%6s %6s %9s %20s %9s %16s %16s\n" % ("worker", "tiles", "kv_groups", "flops", "load/mean", "send_bytes",
                                                 "recv_bytes")
    total = sum(r[2] for r in rows)
    for i, (n, groups, flops, send, recv) in enumerate(rows):
        out += "%6d %6d %9d %20d %9.6f %16d %16d\n" % (i, n, groups, flops, flops / (total / len(rows)), send, recv)
    out += "# imbalance %.6f  comm_bytes %d  (kv %d, q+o %d)\n" % (imbalance, comm, kv, comm - kv)
    return out


# Ties pool, tap: workers of tiles 0..3 = 1, 0, 1, 2; loads 7, 4, 1.
cfg = config("tap", 4, 1, 2, 1, 1, 1, 1, 2, 0.0)
pool = [[4], [1], [1]]
tiles = [dict(slot=0, block=0, shard=0, begin=0, end=2, worker=1), dict(slot=0, block=1, shard=0, begin=2, end=4, worker=0),
         dict(slot=1, block=0, shard=0, begin=0, end=1, worker=1), dict(slot=2, block=0, shard=0, begin=0, end=1, worker=2)]
with open("ties.txt", "w") as f:
    f.write(summary("tap", cfg, pool, tiles, [(1, 1, 7, 20, 4), (2, 2, 4, 4, 20), (1, 1, 1, 0, 0)], 0.75, 24, 16))

# Split pool (hand case of TapSplitPlacement.MatchesHandComputedSplit, e = 2):
# pieces [0,3) on worker 1 and [3,4) on worker 0, slot 1's tile on worker 0.
cfg = config("tap-split", 4, 1, 4, 1, 1, 1, 1, 2, 0.2)
pool = [[4], [1]]
tiles = [dict(slot=0, block=0, shard=0, begin=0, end=3, worker=1), dict(slot=0, block=0, shard=0, begin=3, end=4, worker=0),
         dict(slot=1, block=0, shard=0, begin=0, end=1, worker=0)]
with open("ties_split.txt", "w") as f:
    f.write(summary("tap-split", cfg, pool, tiles, [(2, 2, 5, 24, 12), (1, 1, 6, 12, 24)], 6 / 5.5 - 1, 36, 20))

# GQA pool with one head shard in 3 tapered chunks (see plan.cmake.in): the
# 4 query heads of a tile cut 1, 2, 1 (ends max(1, round(4 / 4)) = 1). Tiles
# (block 0, f 12) and (block 1, f 12) stay home (C = 12.36): worker 0 fetches
# token 2's K/V (8 bytes), worker 1 tokens 0 and 1 (16 bytes).
cfg = config("tap", 4, 2, 2, 1, 4, 1, 2, 2, 0.03, chunks=3)
cfg["chunk_split"] = "tapered"
pool = [[3]]
tiles = [dict(slot=0, block=0, shard=0, begin=0, end=2, worker=0), dict(slot=0, block=1, shard=0, begin=2, end=3, worker=1)]
with open("gqa_tapered.txt", "w") as f:
    f.write(summary("tap", cfg, pool, tiles, [(1, 1, 12, 16, 8), (1, 1, 12, 8, 16)], 0.0, 24, 24, widths=[1, 2, 1]))

# The GQA pool of gqa.txt on nodes of one GPU (--gpus-per-node 1): the same
# tiles and bytes (tap does not place by the topology), a version-5 plan
# whose fingerprint holds the topology.
cfg = config("tap", 4, 2, 2, 2, 4, 1, 2, 2, 0.03)
cfg["topology"] = {"gpus_per_node": 1, "nodes_per_supernode": 4, "intra_node_gbps": 360.0, "inter_node_gbps": 45.0,
                   "inter_supernode_gbps": 7.5, "congestion_per_node": 0.5}
pool = [[3]]
tiles = [dict(slot=0, block=0, shard=0, begin=0, end=2, worker=0), dict(slot=0, block=0, shard=1, begin=0, end=2, worker=0),
         dict(slot=0, block=1, shard=0, begin=2, end=3, worker=1), dict(slot=0, block=1, shard=1, begin=2, end=3, worker=1)]
with open("gqa_topology.txt", "w") as f:
    f.write(summary("tap", cfg, pool, tiles, [(2, 2, 12, 32, 16), (2, 2, 12, 16, 32)], 0.0, 48, 48))
