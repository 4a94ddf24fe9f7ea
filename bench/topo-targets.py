#!/usr/bin/env python3
"""Issue 20's targets from `libra simulate --json` output (docs/simulator.md,
"tap-topo"): per candidate, libra-topo's mean and worst-step speedup over
ulysses, tap-topo's busiest cross-node receiver against tap's, its
intra-pool imbalance, libra-full's mean latency against distca, and the
M, home layout and relaying libra-topo ran with.

    libra simulate --config data/configs/paper-256k.json --pool-size 8 --json -o r.json
    python3 bench/topo-targets.py r.json
"""
import json
import sys


def main(path):
    r = json.load(open(path))
    u = r["baselines"]["ulysses"]
    print(f"{r['source']}  L={r['config']['seq_len']}  ulysses {u['mean'] * 1e3:.1f} / {u['worst'] * 1e3:.1f} ms "
          f"(mean / worst per layer-step); recommended: {r['recommended_variant']}")
    print(f"{'candidate':<20} {'topo mean':>9} {'topo worst':>10} {'full mean':>9} {'X-node':>7} "
          f"{'intra topo':>10} {'full vs distca':>14} {'topo M':>6} {'homes':>10} {'relay':>5} {'chunks':>7}")
    for c in r["candidates"]:
        lat = c["latency"]
        topo, full = lat["libra-topo"], lat["libra-full"]
        cross = c["max_recv_cross_node_bytes_topo"]["mean"] / c["max_recv_cross_node_bytes"]["mean"]
        distca = lat.get("distca")
        vs = f"{100 * (1 - full['mean'] / distca['mean']):.1f}% below" if distca else "n/a"
        name = f"P={c['pool_size']} H={c['head_shards']} B={c['block_size']}"
        print(f"{name:<20} {u['mean'] / topo['mean']:>8.2f}x {u['worst'] / topo['worst']:>9.2f}x "
              f"{u['mean'] / full['mean']:>8.2f}x {cross:>7.2f} {c['intra_imbalance_topo']['worst']:>10.4f} {vs:>14} "
              f"{c.get('chunks', {}).get('libra-topo', '-'):>6} {c.get('home_layout_topo', 'contiguous'):>10} "
              f"{'yes' if c.get('relay_topo') else 'no':>5} {c.get('chunk_split_topo', 'equal'):>7}")
    print("topo/full mean, worst: speedup over ulysses (ulysses mean / libra mean; ulysses worst step / libra worst "
          "step); X-node: tap-topo's busiest cross-node receiver / tap's (mean over pools); intra topo: the worst "
          "pool's intra-pool imbalance; topo M: the pipeliner chunks libra-topo ran at; homes: its home layout; relay: "
          "whether it ran with relayed inputs (--relay); chunks: how its pipeline chunks cut a tile's heads, equal "
          "or tapered (--chunk-split)")


if __name__ == "__main__":
    main(sys.argv[1])
