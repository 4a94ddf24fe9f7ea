"""Measures priced elastic pools (issue 22) and prints the markdown tables of
docs/elastic.md, "Priced fusing: measured".

Usage: /usr/bin/python3 bench/elastic-priced.py [LIBRA]   (default build/release/tools/libra)
Runs `libra simulate --elastic` (priced, the default) on the three
outlier-heavy corpora, on the fitted and a flat network, with tap and tap-topo
tiles, and the unpriced runs' per-window gains; then sweeps the fitted
network's congestion and spine bandwidth on paper-256k-v1. About 10 minutes
on 2 shared cores.
"""
import json
import statistics
import subprocess
import sys

LIBRA = sys.argv[1] if len(sys.argv) > 1 else "build/release/tools/libra"
# (name, source args, GBS, DPs, block size)
CORPORA = [
    ("paper-1m-v1", ["builtin:paper-1m-v1"], 128, [128, 16], 16384),
    ("paper-256k-v1", ["builtin:paper-256k-v1"], 128, [128, 16], 16384),
    ("debian-source L=128K", ["data/corpora/debian-source.txt", "--seq-len", "131072"], 32, [32, 16], 4096),
]
FLAT = ["--congestion-per-node", "0", "--inter-supernode-gbps", "45"]
NETS = [("fitted", []), ("flat", FLAT)]


def simulate(src, gbs, dp, block, extra):
    args = [LIBRA, "simulate"] + src + ["--elastic", "--gbs", str(gbs), "--dp", str(dp), "--block-size", str(block),
                                        "--threads", "2", "--json"] + extra
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def row(net, name, dp, gbs, mode, j, u):
    w = j["per_window"]
    cand = [x for x in u["per_window"] if x["candidate"]]
    gains = [x["gain"] for x in cand]
    worst = min(x["vrsp_s"] / x["elastic_s"] for x in w)  # >= 1: no window slower than VRSP
    pi = j["placement_imbalance"]
    v, e = pi["vrsp"]["mean"], pi["elastic"]["mean"]
    target = "n/a (VRSP <= 0.05)" if v <= 0.05 else ("yes" if e <= v / 2 else "no")
    ul = u["window_latency_s"]
    gain_cell = (f"{statistics.mean(gains):.3f} ({min(gains):.3f}-{max(gains):.3f})" if gains else "-")
    wl = j["window_latency_s"]
    return (f"| {net} | {name} | {dp} | {gbs // dp} | {mode} | {j['fused_windows']} of {len(cand)} "
            f"(of {j['windows']}) | {1e3 * wl['vrsp']['mean']:.1f} -> {1e3 * wl['elastic']['mean']:.1f} | "
            f"{j['mean_window_speedup']:.4f}x | {worst:.4f}x | {v:.4f} -> {e:.4f} | {target} | "
            f"{gain_cell} | {1e3 * ul['elastic']['mean']:.1f} ({u['mean_window_speedup']:.4f}x) | "
            f"{u['placement_imbalance']['elastic']['mean']:.4f} |")


def main():
    print("| network | corpus | DP | GA | tiles | fused windows (of candidates, of windows) | optimizer-step "
          "latency ms, vrsp -> priced elastic | speedup, mean over windows | worst window | mean imbalance "
          "vrsp -> priced elastic | <= half of VRSP's? | unpriced: per-window gain of the candidates, mean "
          "(min-max) | unpriced: latency ms (speedup) | unpriced: mean imbalance |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for net, net_args in NETS:
        for name, src, gbs, dps, block in CORPORA:
            for dp in dps:
                for mode in ("tap", "tap-topo"):
                    extra = net_args + ["--elastic-plan-mode", mode]
                    j = simulate(src, gbs, dp, block, extra)
                    u = simulate(src, gbs, dp, block, extra + ["--elastic-unpriced"])
                    print(row(net, name, dp, gbs, mode, j, u), flush=True)

    print("\nSweep on paper-256k-v1, DP 128 (GA 1), tap tiles: fused windows of 35 candidates / mean speedup "
          "over windows (priced)\n")
    spines = ["7.5", "15", "22.5", "30", "45"]
    print("| congestion per node \\ inter-supernode GB/s | " + " | ".join(spines) + " |")
    print("|---|" + "---|" * len(spines))
    for cong in ("0.5", "0.25", "0.1", "0"):
        cells = []
        for spine in spines:
            j = simulate(["builtin:paper-256k-v1"], 128, 128, 16384,
                         ["--congestion-per-node", cong, "--inter-supernode-gbps", spine])
            cells.append(f"{j['fused_windows']} / {j['mean_window_speedup']:.3f}x")
        print(f"| {cong} | " + " | ".join(cells) + " |", flush=True)
    print("\nInter-node (NIC) bandwidth alone, the rest fitted (paper-256k-v1, DP 128, tap):\n")
    print("| inter-node GB/s | fused windows | mean speedup | unpriced mean gain of the candidates |")
    print("|---|---|---|---|")
    for nic in ("45", "90", "180", "360"):
        j = simulate(["builtin:paper-256k-v1"], 128, 128, 16384, ["--inter-node-gbps", nic])
        u = simulate(["builtin:paper-256k-v1"], 128, 128, 16384, ["--inter-node-gbps", nic, "--elastic-unpriced"])
        g = [x["gain"] for x in u["per_window"] if x["candidate"]]
        print(f"| {nic} | {j['fused_windows']} | {j['mean_window_speedup']:.4f}x | {statistics.mean(g):.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
