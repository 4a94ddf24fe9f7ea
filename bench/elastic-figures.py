#!/usr/bin/python3
"""Measures elastic pools (vrsp-elastic) against VRSP on the built-in
corpora and the Debian source-file corpus and prints the markdown tables of
docs/elastic.md.

Usage: /usr/bin/python3 bench/elastic-figures.py [LIBRA]   (default build/release/tools/libra)
Runs libra place and libra simulate --elastic --elastic-unpriced (every window vrsp-elastic fuses
runs fused: what fusing costs and buys; bench/elastic-priced.py measures the priced default), a
few minutes on 2 cores.
"""
import json
import subprocess
import sys

LIBRA = sys.argv[1] if len(sys.argv) > 1 else "build/release/tools/libra"
# (name, source arguments, GBS, DP values: GA > 1 and GA = 1, block size)
CORPORA = [
    ("paper-1m", ["builtin:paper-1m"], 128, [16, 128], 16384),
    ("paper-256k", ["builtin:paper-256k"], 128, [16, 128], 16384),
    ("paper-1m-v1", ["builtin:paper-1m-v1"], 128, [16, 128], 16384),
    ("paper-256k-v1", ["builtin:paper-256k-v1"], 128, [16, 128], 16384),
    ("debian-source L=128K", ["data/corpora/debian-source.txt", "--seq-len", "131072"], 32, [16, 32], 4096),
]


# The simulator's default interconnect (fitted to paper figure 14: NIC
# congestion per node spanned, 4-node supernodes behind a 4 GB/s spine
# share) and a flat one (no congestion, full bisection).
NETS = [("fitted", []), ("flat", ["--congestion-per-node", "0", "--inter-supernode-gbps", "45"])]


def run(args):
    out = subprocess.run([LIBRA] + args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def place(src, gbs, dp, mode, extra=()):
    return run(["place"] + src + ["--pool-size", "8", "--gbs", str(gbs), "--dp", str(dp), "--mode", mode, "--json"]
               + list(extra))


def main():
    print("### Placement: mean R-1 over domains (P = 8), fused windows in brackets\n")
    print("| corpus | GBS | DP | windows | vrsp | vrsp-refine | whole-pool bound | buddy k=2 | buddy k=4 | lightest k=2 | lightest k=4 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, src, gbs, dps, _ in CORPORA:
        for dp in dps + ([64] if gbs >= 128 else []):
            v = place(src, gbs, dp, "vrsp")
            r = place(src, gbs, dp, "vrsp-refine")
            cells = []
            for rule in ("buddy", "lightest"):
                for k in (2, 4):
                    e = place(src, gbs, dp, "vrsp-elastic", ["--elastic-rule", rule, "--elastic-k", str(k)])
                    cells.append(f"{e['mean_imbalance']:.4f} ({e['fused_windows']})")
            print(f"| {name} | {gbs} | {dp} | {len(v['windows'])} | {v['mean_imbalance']:.4f} | "
                  f"{r['mean_imbalance']:.4f} | {v['mean_lower_bound']:.4f} | " + " | ".join(cells) + " |")
    print("\n### Simulator (libra simulate --elastic, P = 8, H = 8, CP = 8, k = 2, threshold 0.05)\n")
    print("| network | corpus | DP | GA | rule | fused windows | fused GA steps | placement imbalance vrsp -> elastic (mean / worst) "
          "| worker imbalance after TAP (mean / worst) | extra bytes | fused-step latency ms | optimizer-step latency ms "
          "| speedup mean / worst window |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    # Nothing fuses on the v2 builtins, so both networks agree there: flat only where it fuses.
    runs = [(net, net_args, c) for net, net_args in NETS for c in CORPORA
            if net == "fitted" or c[0].endswith("-v1") or c[0].startswith("debian")]
    for net, net_args, (name, src, gbs, dps, block) in runs:
        for dp in dps:
            for rule in ("buddy", "lightest"):
                j = run(["simulate"] + src + ["--elastic", "--gbs", str(gbs), "--dp", str(dp), "--block-size",
                                              str(block), "--elastic-rule", rule, "--elastic-unpriced", "--json"]
                        + net_args)
                pi, wi, b = j["placement_imbalance"], j["worker_imbalance"], j["step_bytes"]
                fl, wl = j["fused_step_latency_s"], j["window_latency_s"]
                extra = b["elastic"]["mean"] / b["vrsp"]["mean"] - 1
                worst = wl["vrsp"]["worst"] / wl["elastic"]["worst"]
                print(f"| {net} | {name} | {dp} | {gbs // dp} | {rule} | {j['fused_windows']} of {j['windows']} | "
                      f"{j['fused_steps']} of {j['steps']} | "
                      f"{pi['vrsp']['mean']:.4f} / {pi['vrsp']['worst']:.4f} -> {pi['elastic']['mean']:.4f} / {pi['elastic']['worst']:.4f} | "
                      f"{wi['vrsp']['mean']:.4f} / {wi['vrsp']['worst']:.4f} -> {wi['elastic']['mean']:.4f} / {wi['elastic']['worst']:.4f} | "
                      f"{100 * extra:+.2f}% | {1e3 * fl['vrsp']['mean']:.1f} -> {1e3 * fl['elastic']['mean']:.1f} | "
                      f"{1e3 * wl['vrsp']['mean']:.1f} -> {1e3 * wl['elastic']['mean']:.1f} | "
                      f"{j['mean_window_speedup']:.4f}x / {worst:.4f}x |")


if __name__ == "__main__":
    main()
