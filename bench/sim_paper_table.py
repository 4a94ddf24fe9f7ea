#!/usr/bin/env python3
"""The end-to-end table of docs/reproduction.md: libra's predictions beside the paper's.

Runs `libra simulate` on the two paper configs (data/configs/paper-*.json, 20 windows each)
with --json, or reads JSON files already written, and prints a markdown table: end-to-end
speedup over ulysses at DP 16 and both modes' DP 1 -> 16 scaling efficiency at the
configured coupling and pipeline, with the figure at every coupling setting.

    python3 bench/sim_paper_table.py --libra build/release/tools/libra          # runs both (minutes)
    python3 bench/sim_paper_table.py --json 1m.json 256k.json                   # from earlier runs

Nothing here is fitted: the paper's figures are printed beside the predictions.
"""
import argparse
import json
import subprocess
import sys

PAPER = {"1m": {"speedup": 2.54, "ulysses_eff": 27.6, "libra_eff": 70.3}, "256k": {"speedup": 1.79}}


def run(libra, config, extra):
    out = subprocess.run([libra, "simulate", "--config", config, "--json", "--quiet", *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def dataset(r):
    return "1m" if "1m" in r["source"] else "256k" if "256k" in r["source"] else "?"


def figures(r):
    top = r["dp_scaling"][-1]
    assert top["dp"] == 16 and r["dp_scaling"][0]["dp"] == 1, "needs a DP sweep from 1 to 16"
    by = {c["coupling"]: c for c in top["couplings"]}
    conf = r["config"]["coupling"]
    return top, by, conf


def fmt_range(by, key):
    return ", ".join(f"{k} {v:.3g}" for k, v in ((k, key(c)) for k, c in by.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libra", default="build/release/tools/libra")
    ap.add_argument("--json", nargs="*", help="read these simulate --json outputs instead of running")
    ap.add_argument("extra", nargs="*", help="extra simulate flags (after --)")
    a = ap.parse_args()
    results = [json.load(open(f)) for f in a.json] if a.json else [
        run(a.libra, f"data/configs/paper-{d}.json", a.extra) for d in ("1m", "256k")]
    print("| DP = 16 | dataset | paper | libra (configured) | libra by coupling |")
    print("|---|---|---|---|---|")
    for r in results:
        d = dataset(r)
        top, by, conf = figures(r)
        c = r["config"]
        setup = f"coupling {conf}, {c['pp']} stages"
        sp = lambda x: x["libra_tokens_per_s"] / x["ulysses_tokens_per_s"]
        p = PAPER.get(d, {})
        print(f"| end-to-end speedup over ulysses | {d} | {p.get('speedup', '-')}x | "
              f"{top['libra_tokens_per_s'] / top['ulysses_tokens_per_s']:.2f}x ({setup}) | {fmt_range(by, sp)} |")
        print(f"| ulysses scaling efficiency DP 1 -> 16 | {d} | "
              f"{str(p['ulysses_eff']) + '%' if 'ulysses_eff' in p else '-'} | {100 * top['ulysses_efficiency']:.1f}% | "
              f"{fmt_range(by, lambda x: 100 * x['ulysses_efficiency'])} |")
        print(f"| libra scaling efficiency DP 1 -> 16 | {d} | "
              f"{str(p['libra_eff']) + '%' if 'libra_eff' in p else '-'} | {100 * top['libra_efficiency']:.1f}% | "
              f"{fmt_range(by, lambda x: 100 * x['libra_efficiency'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
