#!/usr/bin/env python3
"""An independent reference of the end-to-end step model (docs/simulator.md, "Checking the step").

The C++ model (src/sim/step_model.cpp) runs 1F1B as an event loop: passes over the stages, each
running the next operation of its order once its dependency has run. This reference prices the
same schedule another way: every operation is a node of a DAG (its stage's previous operation,
and the same micro-batch's forward on the stage before or backward on the stage after), and the
makespan is the DAG's longest path, found by Kahn's topological order. A coupled group is not
folded into one replica by an elementwise max: each member keeps its own operations, and a
barrier node per (stage, slot) makes every member start together and wait for the slowest.
`tick_makespan` is a third, discrete-time simulation for integer costs (hand-made cases).

With --costs FILE (written by `libra simulate --step-costs-out FILE`) it recomputes every step
the simulator reported from the micro-batch costs it fed its model, prints the largest relative
difference, takes the DP 1 figure apart (--explain), and prices ulysses with its GA steps in the
order libra's layout runs its pools, heaviest first (--what-if-sorted):

    build/release/tools/libra simulate --config data/configs/paper-1m.json --windows 1 \\
        --step-costs-out /tmp/costs.json --quiet > /dev/null
    python3 bench/step_reference.py --costs /tmp/costs.json --explain --what-if-sorted
"""
import argparse
import json
import math
import sys
from collections import deque


def one_f_one_b_order(stages, s, g):
    """Stage s's operations in Megatron's non-interleaved 1F1B: warm-up forwards, one forward and
    one backward in turn, then the remaining backwards; ("F" | "B", micro-batch)."""
    warm = min(stages - 1 - s, g)
    ops = [("F", i) for i in range(warm)]
    for k in range(g - warm):
        ops += [("F", warm + k), ("B", k)]
    return ops + [("B", i) for i in range(g - warm, g)]


def _longest_path(nodes, preds):
    """nodes: {name: duration}; preds: {name: [names]}. Returns the latest end time."""
    succ = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}
    for n, ps in preds.items():
        for p in ps:
            succ[p].append(n)
            indeg[n] += 1
    start = {n: 0 for n in nodes}
    queue = deque(n for n in nodes if indeg[n] == 0)
    end, seen = {}, 0
    while queue:
        n = queue.popleft()
        seen += 1
        end[n] = start[n] + nodes[n]
        for m in succ[n]:
            start[m] = max(start[m], end[n])
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    assert seen == len(nodes), "the 1F1B DAG has a cycle"
    return max(end.values(), default=0)


def group_makespan(members):
    """1F1B makespan of replicas that start every (stage, slot) together and end it with their
    slowest member. members[m][mb][s] = (fwd, bwd); one member: a plain pipeline."""
    g, stages = len(members[0]), len(members[0][0]) if members[0] else 0
    if g == 0 or stages == 0:
        return 0
    nodes, preds = {}, {}
    slot_of = {}  # (s, kind, mb) -> slot index on stage s
    for s in range(stages):
        for k, (kind, i) in enumerate(one_f_one_b_order(stages, s, g)):
            slot_of[(s, kind, i)] = k
    for (s, kind, i), k in slot_of.items():
        begin, done = ("begin", s, k), ("done", s, k)
        deps = [("done", s, k - 1)] if k > 0 else []
        if kind == "F" and s > 0:
            deps.append(("done", s - 1, slot_of[(s - 1, "F", i)]))
        if kind == "B" and s + 1 < stages:
            deps.append(("done", s + 1, slot_of[(s + 1, "B", i)]))
        nodes[begin], preds[begin] = 0, deps
        nodes[done], preds[done] = 0, []
        for m, costs in enumerate(members):
            op = ("op", m, s, k)
            nodes[op] = costs[i][s][0 if kind == "F" else 1]
            preds[op] = [begin]
            preds[done].append(op)
    return _longest_path(nodes, preds)


def makespan(mbs):
    """One replica's 1F1B makespan; mbs[mb][s] = (fwd, bwd)."""
    return group_makespan([mbs])


def tick_makespan(mbs):
    """Discrete-time 1F1B for integer costs: every tick each idle stage starts its next operation
    if that operation's dependency has finished by the tick's start."""
    g, stages = len(mbs), len(mbs[0])
    order = [one_f_one_b_order(stages, s, g) for s in range(stages)]
    nxt, busy_until, finished = [0] * stages, [0] * stages, {}
    running = [None] * stages
    t = 0
    while any(nxt[s] < len(order[s]) or running[s] for s in range(stages)):
        for s in range(stages):
            if running[s] and busy_until[s] <= t:
                finished[running[s]] = busy_until[s]
                running[s] = None
        for s in range(stages):
            if running[s] or nxt[s] >= len(order[s]):
                continue
            kind, i = order[s][nxt[s]]
            dep = (s - 1, "F", i) if kind == "F" and s > 0 else (s + 1, "B", i) if kind == "B" and s + 1 < stages else None
            if dep is not None and (dep not in finished or finished[dep] > t):
                continue
            cost = mbs[i][s][0 if kind == "F" else 1]
            assert cost == int(cost) and cost >= 1, "tick_makespan takes positive integer costs"
            running[s], busy_until[s] = (s, kind, i), t + int(cost)
            nxt[s] += 1
        t += 1
        if t > 10**6:
            raise RuntimeError("tick_makespan did not finish")
    return max(finished.values(), default=0)


def stage_layers(layers, stages, s):
    return layers // stages + (1 if s < layers % stages else 0)


def stage_costs(mb, layers, stages):
    """[attn_fwd, attn_bwd, lin_fwd, lin_bwd] (attention per layer, linear per model) -> per stage."""
    af, ab, lf, lb = mb
    out = []
    for s in range(stages):
        n = stage_layers(layers, stages, s)
        out.append((n * af + n / layers * lf, n * ab + n / layers * lb))
    return out


def step(replicas, span, allreduce):
    """Replicas in groups of `span` consecutive ones (0: all), each group synchronised per
    operation; the slowest group plus the all-reduce."""
    n = len(replicas)
    span = n if span == 0 or span > n else span
    return max(group_makespan(replicas[i:i + span]) for i in range(0, n, span)) + allreduce


def check_costs(doc, explain=False, out=sys.stdout):
    """Recomputes every reported step of a --step-costs-out document; returns the largest
    relative difference. With explain, prints the DP 1 step taken apart, summed over windows."""
    layers, pp = doc["layers"], doc["pp"]
    worst = 0.0
    parts = {}
    for w in doc["windows"]:
        for pt in w["points"]:
            reps = {m: [[stage_costs(mb, layers, pp) for mb in r] for r in pt[m]] for m in ("ulysses", "libra")}
            for st in pt["steps"]:
                span = st["span"]
                lspan = 0 if span == 0 else math.lcm(span, pt["pool_size"])
                for mode, sp in (("ulysses", span), ("libra", lspan)):
                    ref = step(reps[mode], sp, pt["allreduce_s"])
                    worst = max(worst, abs(ref - st[mode]) / ref)
            if explain and pt["dp"] == 1:
                for mode in ("ulysses", "libra"):
                    acc = parts.setdefault(mode, [0.0] * 7)
                    for k, v in enumerate(dp1_parts(pt[mode][0], layers, pp)):
                        acc[k] += v
    if explain:
        print_dp1(parts, len(doc["windows"]), pp, out)
    return worst


def dp1_parts(mbs, layers, pp):
    """One DP 1 replica's step taken apart: attention and linear work, the busiest stage (the
    1F1B bound), 1F1B in the simulator's order, heaviest first, lightest first, on one stage."""
    costs = [stage_costs(mb, layers, pp) for mb in mbs]
    load = lambda c: -sum(f + b for f, b in c)
    return (sum(layers * (m[0] + m[1]) for m in mbs), sum(m[2] + m[3] for m in mbs),
            max(sum(c[s][0] + c[s][1] for c in costs) for s in range(pp)), makespan(costs),
            makespan(sorted(costs, key=load)), makespan(sorted(costs, key=lambda c: -load(c))),
            makespan([stage_costs(mb, layers, 1) for mb in mbs]))


def print_dp1(parts, windows, pp, out):
    print(f"DP 1, {pp} stages, summed over {windows} windows (seconds):", file=out)
    for mode, (attn, lin, bound, t, heavy, light, one) in parts.items():
        print(f"  {mode:8s} attention {attn:9.1f}, linear {lin:7.1f}, busiest stage {bound:8.1f}; 1F1B {t:8.1f} "
              f"(bubble {t / bound - 1:6.1%}), heaviest first {heavy:8.1f}, lightest first {light:8.1f}, "
              f"one stage {one:8.1f}", file=out)
    u, lb = parts["ulysses"], parts["libra"]
    print(f"  libra / ulysses speedup: attention work {u[0] / lb[0]:.3f}x, one stage {u[6] / lb[6]:.3f}x, "
          f"{pp} stages in the simulator's order {u[3] / lb[3]:.3f}x, both heaviest first {u[4] / lb[4]:.3f}x",
          file=out)


def ga_sorted(reps):
    """The same GA steps (the same sequences side by side), run heaviest step first: steps ordered
    by their heaviest replica's micro-batch, the rule VRSP's layout gives libra's pools."""
    g = len(reps[0])
    load = [max(sum(f + b for f, b in r[i]) for r in reps) for i in range(g)]
    perm = sorted(range(g), key=lambda i: -load[i])
    return [[r[i] for i in perm] for r in reps]


def sorted_figures(doc):
    """Per coupling setting, summed over windows, with ulysses' GA steps heaviest first (ga_sorted):
    the DP 1 and top-DP speedups and both modes' efficiency from the first to the last DP point."""
    layers, pp = doc["layers"], doc["pp"]
    tot = {}  # coupling -> {k: [ulysses sorted, libra]}
    dps = [pt["dp"] for pt in doc["windows"][0]["points"]]
    for w in doc["windows"]:
        for k, pt in enumerate(w["points"]):
            us = ga_sorted([[stage_costs(mb, layers, pp) for mb in r] for r in pt["ulysses"]])
            for st in pt["steps"]:
                t = tot.setdefault(st["coupling"], {}).setdefault(k, [0.0, 0.0])
                t[0] += step(us, st["span"], pt["allreduce_s"])
                t[1] += st["libra"]
    last, scale = len(dps) - 1, dps[-1] / dps[0]
    return {c: {"dp1_speedup": t[0][0] / t[0][1], "speedup": t[last][0] / t[last][1],
                "ulysses_eff": t[0][0] / (scale * t[last][0]), "libra_eff": t[0][1] / (scale * t[last][1])}
            for c, t in tot.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--costs", required=True, help="a `libra simulate --step-costs-out` file")
    ap.add_argument("--explain", action="store_true", help="take each window's DP 1 step apart")
    ap.add_argument("--what-if-sorted", action="store_true",
                    help="also price ulysses with its GA steps heaviest first (the order libra's layout runs)")
    ap.add_argument("--tolerance", type=float, default=1e-9)
    a = ap.parse_args()
    try:
        with open(a.costs) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:  # one line, status 2 (not a traceback) for a bad --costs
        print(f"step_reference: --costs {a.costs}: not a readable `libra simulate --step-costs-out` file"
              f" ({e.strerror if isinstance(e, OSError) else e})", file=sys.stderr)
        return 2
    worst = check_costs(doc, a.explain)
    if a.what_if_sorted:
        for c, f in sorted_figures(doc).items():
            print(f"ulysses GA steps heaviest first, coupling {c}: " + ", ".join(f"{k} {v:.3f}" for k, v in f.items()))
    print(f"largest relative difference, reference vs simulator: {worst:.3g}")
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
