#!/usr/bin/env python3
"""The end-to-end table of docs/reproduction.md: libra's predictions beside the paper's.

Runs `libra simulate` on the two paper configs (data/configs/paper-*.json, 20 windows each)
with --json, --report OUT/<dataset> and --step-costs-out OUT/<dataset>-step-costs.json, or reads
those files from earlier runs (--from OUT), and prints two markdown tables:

1. end-to-end speedup over ulysses at DP 16 and both modes' DP 1 -> 16 scaling efficiency at the
   configured coupling and pipeline, with the figure at every coupling setting;
2. the same with ulysses' GA steps in the order libra's layout runs its pools (heaviest first),
   priced by the independent reference (bench/step_reference.py) on the simulator's own costs,
   after checking that the reference reproduces every step the simulator reported.

--figures copies each report's sim-dp-scaling.png to docs/figures/sim-<dataset>-dp-scaling.png.

    python3 bench/sim_paper_table.py --libra build/release/tools/libra --figures   # runs both (minutes)
    python3 bench/sim_paper_table.py --from out/paper-e2e                          # from earlier runs

Nothing here is fitted: the paper's figures are printed beside the predictions.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_reference  # noqa: E402

PAPER = {"1m": {"speedup": 2.54, "ulysses_eff": 27.6, "libra_eff": 70.3}, "256k": {"speedup": 1.79}}
DATASETS = ("1m", "256k")


def run(libra, d, out, extra):
    os.makedirs(out, exist_ok=True)
    res = subprocess.run([libra, "simulate", "--config", f"data/configs/paper-{d}.json", "--json", "--quiet",
                          "--report", os.path.join(out, d), "--step-costs-out", costs_path(out, d), *extra],
                         check=True, capture_output=True, text=True).stdout
    with open(os.path.join(out, f"{d}.json"), "w") as f:
        f.write(res)


def costs_path(out, d):
    return os.path.join(out, f"{d}-step-costs.json")


def figures(r):
    top = r["dp_scaling"][-1]
    assert top["dp"] == 16 and r["dp_scaling"][0]["dp"] == 1, "needs a DP sweep from 1 to 16"
    by = {c["coupling"]: c for c in top["couplings"]}
    conf = r["config"]["coupling"]
    return top, by, conf


def fmt_range(by, key):
    return ", ".join(f"{k} {v:.3g}" for k, v in ((k, key(c)) for k, c in by.items()))


def pct(p, key):
    return f"{p[key]}%" if key in p else "-"


def table(results):
    print("| DP = 16 | dataset | paper | libra (configured) | libra by coupling |")
    print("|---|---|---|---|---|")
    for d, r in results.items():
        top, by, conf = figures(r)
        c = r["config"]
        setup = f"coupling {conf}, {c['pp']} stages"
        sp = lambda x: x["libra_tokens_per_s"] / x["ulysses_tokens_per_s"]
        p = PAPER.get(d, {})
        print(f"| end-to-end speedup over ulysses | {d} | {p.get('speedup', '-')}x | "
              f"{top['libra_tokens_per_s'] / top['ulysses_tokens_per_s']:.2f}x ({setup}) | {fmt_range(by, sp)} |")
        print(f"| ulysses scaling efficiency DP 1 -> 16 | {d} | {pct(p, 'ulysses_eff')} | "
              f"{100 * top['ulysses_efficiency']:.1f}% | {fmt_range(by, lambda x: 100 * x['ulysses_efficiency'])} |")
        print(f"| libra scaling efficiency DP 1 -> 16 | {d} | {pct(p, 'libra_eff')} | "
              f"{100 * top['libra_efficiency']:.1f}% | {fmt_range(by, lambda x: 100 * x['libra_efficiency'])} |")
        dp1 = r["dp_scaling"][0]
        print(f"| end-to-end speedup at DP 1 | {d} | {implied_dp1(p)} | "
              f"{dp1['libra_tokens_per_s'] / dp1['ulysses_tokens_per_s']:.2f}x | - |")


def implied_dp1(p):
    # speedup(16) = speedup(1) x libra_eff / ulysses_eff, so the paper's figures imply speedup(1).
    if "ulysses_eff" not in p:
        return "-"
    return f"{p['speedup'] * p['ulysses_eff'] / p['libra_eff']:.2f}x (implied)"


def sorted_table(docs, results):
    print("| ulysses GA steps heaviest first | dataset | paper | DP 1 speedup | DP 16 speedup | "
          "ulysses eff. DP 1 -> 16 | libra eff. |")
    print("|---|---|---|---|---|---|---|")
    for d, doc in docs.items():
        worst = step_reference.check_costs(doc)
        assert worst < 1e-9, f"{d}: the reference differs from the simulator by {worst:.3g}"
        rows = step_reference.sorted_figures(doc)
        p = PAPER.get(d, {})
        conf = results[d]["config"]["coupling"] if d in results else None
        for c, f in rows.items():
            mark = " (configured)" if c == conf else ""
            print(f"| coupling {c}{mark} | {d} | {p.get('speedup', '-')}x, {pct(p, 'ulysses_eff')} | "
                  f"{f['dp1_speedup']:.2f}x | {f['speedup']:.2f}x | {100 * f['ulysses_eff']:.1f}% | "
                  f"{100 * f['libra_eff']:.1f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libra", default="build/release/tools/libra")
    ap.add_argument("--out", default="out/paper-e2e", help="where the runs write (default out/paper-e2e)")
    ap.add_argument("--from", dest="source", help="read the runs already in this folder instead of running")
    ap.add_argument("--figures", action="store_true", help="copy the DP-scaling figures into docs/figures")
    ap.add_argument("extra", nargs="*", help="extra simulate flags (after --)")
    a = ap.parse_args()
    out = a.source or a.out
    if not a.source:
        for d in DATASETS:
            run(a.libra, d, out, a.extra)
    results, docs = {}, {}
    for d in DATASETS:
        with open(os.path.join(out, f"{d}.json")) as f:
            results[d] = json.load(f)
        with open(costs_path(out, d)) as f:
            docs[d] = json.load(f)
        if a.figures:
            shutil.copyfile(os.path.join(out, d, "sim-dp-scaling.png"), f"docs/figures/sim-{d}-dp-scaling.png")
    table(results)
    print()
    sorted_table(docs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
