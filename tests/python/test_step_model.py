"""The end-to-end step model against an independent reference (bench/step_reference.py).

The reference prices 1F1B as a DAG's longest path (and, for integer costs, as a discrete-time
simulation), with coupled replicas kept apart behind per-operation barriers; the C++ model runs an
event loop over elementwise maxima. Hand-made cases check the reference against closed forms; a
small `libra simulate --step-costs-out` run checks every step the simulator reported against the
reference on the costs the simulator fed its own model.
"""
import importlib.util
import json
import math
import random
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("step_reference", ROOT / "bench" / "step_reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def uniform(g, s, f, b):
    return [[(f, b)] * s for _ in range(g)]


@pytest.mark.parametrize("g,s", [(1, 1), (1, 3), (2, 4), (4, 2), (8, 4), (16, 3)])
def test_uniform_pipeline_is_the_textbook_closed_form(g, s):
    # (G + S - 1)(f + b): every micro-batch one slot, plus S - 1 slots of fill and drain.
    assert ref.makespan(uniform(g, s, 2, 3)) == (g + s - 1) * 5
    assert ref.tick_makespan(uniform(g, s, 2, 3)) == (g + s - 1) * 5


def test_one_stage_is_the_sum():
    mbs = [[(1, 2)], [(3, 1)], [(0.5, 0.25)]]
    assert ref.makespan(mbs) == 7.75


def two_by_two(f0, b0, f1, b1):
    """Two stages, two micro-batches costing (f_i, b_i) on each stage, by hand: stage 0 runs F0 F1
    B0 B1, stage 1 F0 B0 F1 B1."""
    f1_on_1 = max(2 * f0 + b0, f0 + f1)  # stage 1's F1 waits for its B0 and stage 0's F1
    b1_on_1 = f1_on_1 + f1 + b1
    b0_on_0 = max(f0 + f1, 2 * f0 + b0) + b0
    return max(b0_on_0, b1_on_1) + b1


def test_two_stages_two_micro_batches_closed_form():
    rng = random.Random(3)
    for _ in range(200):
        f0, b0, f1, b1 = (rng.randint(1, 9) for _ in range(4))
        mbs = [[(f0, b0)] * 2, [(f1, b1)] * 2]
        assert ref.makespan(mbs) == two_by_two(f0, b0, f1, b1)
        assert ref.tick_makespan(mbs) == two_by_two(f0, b0, f1, b1)
    assert two_by_two(1, 2, 3, 4) == 15 and two_by_two(3, 4, 1, 2) == 16  # step_model_test's cases


def test_dag_and_tick_simulation_agree_and_respect_the_bounds():
    rng = random.Random(7)
    for _ in range(60):
        g, s = rng.randint(1, 7), rng.randint(1, 4)
        mbs = [[(rng.randint(1, 6), rng.randint(1, 9)) for _ in range(s)] for _ in range(g)]
        t = ref.makespan(mbs)
        assert t == ref.tick_makespan(mbs)
        assert t >= max(sum(m[k][0] + m[k][1] for m in mbs) for k in range(s))  # the busiest stage
        assert t >= max(sum(f + b for f, b in m) for m in mbs)  # any micro-batch's own path


def test_a_lone_heavy_micro_batch_crosses_the_stages_alone():
    # One micro-batch: its forwards then its backwards, stage after stage.
    assert ref.makespan([[(5, 7)] * 4]) == 4 * 12
    # Two heavy micro-batches apart, light ones between, against the heavy ones together.
    heavy, light = [(4, 8)] * 4, [(1, 2)] * 4
    apart = ref.makespan([heavy, light, light, light, heavy, light, light, light])
    together = ref.makespan([heavy, heavy, light, light, light, light, light, light])
    assert together < apart


def test_two_replicas_two_stages_coupled_and_not():
    a = [[(1, 2)] * 2, [(3, 4)] * 2]
    b = [[(3, 4)] * 2, [(1, 2)] * 2]
    # Not coupled: the slower replica, 16 (heavy first) against 15, then the all-reduce.
    assert ref.step([a, b], 1, 0.5) == 16.5
    # Coupled: every slot costs the slower member, (3, 4) on both: (2 + 2 - 1) x 7.
    assert ref.step([a, b], 2, 0.5) == 3 * 7 + 0.5
    assert ref.step([a, b], 0, 0.5) == 3 * 7 + 0.5
    # Members of unequal stage costs: the closed form of the elementwise maximum.
    c = [[(2, 1), (1, 5)], [(1, 1), (4, 2)]]
    d = [[(1, 3), (2, 2)], [(3, 1), (1, 1)]]
    assert ref.step([c, d], 2, 0) == ref.makespan([[(2, 3), (2, 5)], [(3, 1), (4, 2)]])


def test_span_groups_consecutive_replicas():
    r = [[[(1, 0)]], [[(2, 0)]], [[(3, 0)]], [[(0, 10)]]]
    assert ref.step(r, 1, 0) == 10
    assert ref.step(r, 2, 0) == 13  # {0, 1}: 2; {2, 3}: 3 + 10


def test_stage_split_of_a_micro_batch():
    c = ref.stage_costs([1, 2, 10, 20], 10, 4)  # 10 layers over 4 stages: 3, 3, 2, 2
    assert c == [(6.0, 12.0), (6.0, 12.0), (4.0, 8.0), (4.0, 8.0)]


SMALL = ["--source", "builtin:paper-256k", "--windows", "2", "--gbs", "16", "--dp", "4", "--scaling-dp", "1,2,4",
         "--pool-size", "2", "--head-shards", "4", "--block-size", "16384", "--chunks", "1", "--random-seeds", "2",
         "--pp", "3", "--coupling", "2", "--trained-heads-kv", "4"]


def test_simulator_steps_match_the_reference_on_its_own_costs(libra_cli, tmp_path):
    costs = tmp_path / "costs.json"
    out = subprocess.run([libra_cli, "simulate", *SMALL, "--step-costs-out", str(costs), "--json", "--quiet"],
                         check=True, capture_output=True, text=True).stdout
    res, doc = json.loads(out), json.loads(costs.read_text())
    assert doc["pp"] == 3 and len(doc["windows"]) == 2
    # Every DP point carries none, the configured span 2 and all, each checked.
    assert [s["coupling"] for s in doc["windows"][0]["points"][0]["steps"]] == ["none", "2", "all"]
    assert ref.check_costs(doc) < 1e-9
    # The check can fail: one micro-batch's attention 10% dearer moves some reported step.
    doc["windows"][0]["points"][0]["ulysses"][0][0][1] *= 1.1
    assert ref.check_costs(doc) > 1e-6
    doc["windows"][0]["points"][0]["ulysses"][0][0][1] /= 1.1
    # The report's throughput is the windows' tokens over the sum of these steps.
    tokens = sum(w["tokens"] for w in doc["windows"])
    for k, pt in enumerate(res["dp_scaling"]):
        for c, cp in enumerate(pt["couplings"]):
            for mode in ("ulysses", "libra"):
                total = sum(w["points"][k]["steps"][c][mode] for w in doc["windows"])
                assert math.isclose(cp[f"{mode}_tokens_per_s"], tokens / total, rel_tol=1e-9)


def test_step_costs_out_to_a_missing_directory_is_refused(libra_cli, tmp_path):
    bad = tmp_path / "missing" / "costs.json"
    r = subprocess.run([libra_cli, "simulate", *SMALL, "--step-costs-out", str(bad), "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--step-costs-out" in r.stderr and str(bad) in r.stderr
