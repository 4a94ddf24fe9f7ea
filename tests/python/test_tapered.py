"""Tapered pipeline chunks from Python (make_plan(chunk_split="tapered"), libra::ChunkSplit::kTapered):
the bindings report the split and cut a tile's heads by the tapered rule; bad values raise one
line; libra.torch runs tapered plans forward and backward against plain attention in float64
(tests/python/dist_util.py) and against the same tiles cut equally, over each communicator.

The taper only moves query heads between pipeline chunks: the tiles, their workers and every
kernel's per-head arithmetic stay, so the output and dQ (each query head computed once) agree bit
for bit with the equal cut of the same tiles. dK and dV agree bit for bit where both cuts put the
query heads of every KV head's group into chunks alike; where they do not (8 heads over 2 KV heads
cut 1,3,3,1 against 2,2,2,2), a KV head's gradient sums its group's contributions in another
grouping (other kernel calls, added into dK/dV per chunk) and float addition rounds differently
(about 1e-7 relative in fp32): those are compared with a tight tolerance instead (TIGHT, far below
the tolerance against the float64 reference). bf16 gradients are rounded after the fp32 sums and
get one bf16 step.
"""
import pickle
import random
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from dist_util import COMMUNICATORS, attend, planner_runs_make_plan, reference_grads, rel_err, run  # noqa: E402

L = 64
TOL = {"float32": 2e-5, "bfloat16": 2e-2}
TIGHT = {"float32": 1e-6, "bfloat16": 4e-3}  # dK/dV, tapered against equal where groups split otherwise
TOPOLOGY = {"gpus_per_node": 2, "nodes_per_supernode": 2}  # 4 ranks on two nodes, so tap-topo has tiers
POOLS = [[10, 30, 20], [64], [5, 5, 40, 3], [33, 17]]  # P 2, CP 2: pools[0:2] on 4 ranks

# (name, make_plan keywords, the equal split's chunks for the same tiles). head_shards 1: a tile is
# all heads_q query heads. The equal run uses the tapered run's M where M divides the width, else 1
# (8 heads in 3 chunks has no equal cut).
CASES = [
    ("tap hq8 hkv2 M4", dict(heads_q=8, heads_kv=2, chunks=4, mode="tap"), 4),
    ("tap hq8 hkv4 M3", dict(heads_q=8, heads_kv=4, chunks=3, mode="tap"), 1),
    ("tap-topo hq8 hkv4 M4", dict(heads_q=8, heads_kv=4, chunks=4, mode="tap-topo"), 4),
    ("tap-topo hq8 hkv2 M3 kv prefix", dict(heads_q=8, heads_kv=2, chunks=3, mode="tap-topo", kv_prefix=True), 1),
    ("tap hq12 hkv4 M3", dict(heads_q=12, heads_kv=4, chunks=3, mode="tap"), 3),
    ("tap-topo hq8 hkv2 M4 bf16", dict(heads_q=8, heads_kv=2, chunks=4, mode="tap-topo", dtype="bf16"), 4),
]


def plan_of(pool, kw, **over):
    args = dict(seq_len=L, cp=2, block_size=8, head_shards=1, head_dim=16, dtype="fp32", topology=TOPOLOGY,
                chunk_split="tapered")
    args.update(kw)
    args.update(over)
    return libra.make_plan(pool, **args)


def tapered_widths(width, chunks):
    """The tapered rule, written out here from its statement (not from chunk_head_offset): the first
    and the last chunk are max(1, width / (2 (chunks - 1)) rounded half up) wide; the middle chunks
    share the rest, the earlier ones one head wider where it does not divide."""
    end = max(1, int(Fraction(width, 2 * (chunks - 1)) + Fraction(1, 2)))
    middle, extra = divmod(width - 2 * end, chunks - 2)
    return [end] + [middle + (1 if i < extra else 0) for i in range(chunks - 2)] + [end]


def group_cuts(widths, group):
    """Per KV head of a tile, its query heads as the chunks cut them (a tuple of tuples of heads)."""
    chunk = []
    for m, w in enumerate(widths):
        chunk += [m] * w
    return [tuple(tuple(h for h in range(k * group, (k + 1) * group) if chunk[h] == m)
                  for m in sorted({chunk[h] for h in range(k * group, (k + 1) * group)}))
            for k in range(len(chunk) // group)]


def same_dkv_sums(kw, equal_chunks):
    """Whether the tapered cut and the equal cut (head_shards 1: a tile is all heads_q heads) split
    every KV head's group of query heads alike, so dK and dV are summed the same way."""
    width, group = kw["heads_q"], kw["heads_q"] // kw["heads_kv"]
    equal = [width // equal_chunks] * equal_chunks
    return group_cuts(tapered_widths(width, kw["chunks"]), group) == group_cuts(equal, group)


# ---------------------------------------------------------------- bindings (no torch distributed)

def test_the_rule_written_here_gives_the_documented_cuts():
    assert tapered_widths(8, 4) == [1, 3, 3, 1]
    assert tapered_widths(8, 3) == [2, 4, 2]
    assert tapered_widths(16, 4) == [3, 5, 5, 3]
    assert tapered_widths(12, 3) == [3, 6, 3]


@pytest.mark.parametrize("heads_q,head_shards,chunks", [(8, 1, 4), (8, 1, 3), (16, 2, 4), (16, 1, 4), (12, 1, 3),
                                                        (8, 1, 8), (16, 1, 5)])
def test_chunk_heads_follow_the_tapered_rule(heads_q, head_shards, chunks):
    plan = plan_of(POOLS[:2], dict(heads_q=heads_q, heads_kv=2, chunks=chunks), head_shards=head_shards)
    assert plan.config["chunk_split"] == "tapered" and plan.config["chunks"] == chunks
    width = heads_q // head_shards
    widths = tapered_widths(width, chunks)
    assert sum(widths) == width and min(widths) >= 1
    t = plan.tiles
    assert len(t["id"]) > 0
    for i in range(len(t["id"])):
        begin, end = int(t["heads_begin"][i]), int(t["heads_end"][i])
        assert end - begin == width
        got = [plan.chunk_heads(i, m) for m in range(chunks)]
        at = begin
        for m, w in enumerate(widths):
            assert got[m] == (at, at + w), (i, m, got, widths)
            at += w


def test_width_8_in_4_chunks_is_1_3_3_1_and_equal_is_2_2_2_2():
    tapered = plan_of(POOLS[:2], dict(heads_q=8, heads_kv=2, chunks=4))
    equal = plan_of(POOLS[:2], dict(heads_q=8, heads_kv=2, chunks=4), chunk_split="equal")
    assert [b - a for a, b in (tapered.chunk_heads(0, m) for m in range(4))] == [1, 3, 3, 1]
    assert [b - a for a, b in (equal.chunk_heads(0, m) for m in range(4))] == [2, 2, 2, 2]


def test_config_reports_the_split_and_equal_is_the_default():
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=1, heads_q=8, heads_kv=2, head_dim=16, chunks=4)
    default = libra.make_plan(POOLS[:2], **kw)
    equal = libra.make_plan(POOLS[:2], chunk_split="equal", **kw)
    tapered = libra.make_plan(POOLS[:2], chunk_split="tapered", **kw)
    assert default.config["chunk_split"] == "equal" and default == equal
    assert tapered.config["chunk_split"] == "tapered"
    # The split is part of the plan: another fingerprint, the same tiles on the same workers.
    assert tapered.fingerprint != equal.fingerprint and tapered != equal
    for col in ("worker", "begin", "end", "heads_begin", "heads_end"):
        assert np.array_equal(tapered.tiles[col], equal.tiles[col]), col
    # Tapered plans are plan format version 4 and keep the split through bytes, JSON and pickle.
    for back in (libra.plan_from_bytes(tapered.to_bytes()), libra.plan_from_json(tapered.to_json()),
                 pickle.loads(pickle.dumps(tapered))):
        assert back == tapered and back.config["chunk_split"] == "tapered"
    assert '"chunk_split": "tapered"' in tapered.to_json()


def one_line_value_error(fn):
    with pytest.raises(ValueError) as e:
        fn()
    assert "\n" not in str(e.value)
    return e.value


def test_bad_values_raise_one_line():
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=1, heads_q=8, heads_kv=2, head_dim=16)
    make = libra.make_plan
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=4, chunk_split="taper", **kw))
    assert str(e) == "chunk split 'taper': must be equal or tapered"
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=4, chunk_split="Tapered", **kw))
    assert str(e) == "chunk split 'Tapered': must be equal or tapered"
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=2, chunk_split="tapered", **kw))
    assert str(e) == "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 8 (chunks is 2)"
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=9, chunk_split="tapered", **kw))
    assert str(e) == "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 8 (chunks is 9)"
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=5, chunk_split="tapered", **dict(kw, head_shards=2)))
    assert str(e) == "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 4 (chunks is 5)"
    # Ulysses cuts heads_q / cp heads per tile; the same rule names that width.
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=5, chunk_split="tapered", mode="ulysses",
                                          **dict(kw, heads_kv=8)))
    assert str(e) == "plan config: mode ulysses: tapered chunks need 3 <= chunks <= heads_q / cp = 4 (chunks is 5)"
    # The default stays the planning contract's equal cut, with its own rule.
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=3, **kw))
    assert str(e) == "plan config: chunks 3 must divide heads_q / head_shards = 8"
    # Not a string: the package's one-line type error (a ValueError too).
    e = one_line_value_error(lambda: make(POOLS[:2], chunks=4, chunk_split=1, **kw))
    assert isinstance(e, libra.ArgumentError) and "chunk_split: str = 'equal'" in str(e)


def test_planner_forwards_chunk_split():
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=1, heads_q=8, heads_kv=2, head_dim=16, chunks=4)
    sampler = lt.PlacementBatchSampler(POOLS, gbs=4, dp=2, pool_size=2, dp_rank=0)
    planner = lt.Planner(sampler, chunk_split="tapered", **kw)
    try:
        plan = planner.get(0)
        assert plan.config["chunk_split"] == "tapered"
        assert plan == libra.make_plan(sampler.pool(0), chunk_split="tapered", **kw)
    finally:
        planner.close()
    e = one_line_value_error(lambda: lt.Planner(sampler, chunk_split="wide", **kw))
    assert str(e) == "Planner: chunk split 'wide': must be equal or tapered"
    e = one_line_value_error(lambda: lt.Planner(sampler, chunk_split="tapered", **dict(kw, chunks=2)))
    assert str(e) == ("Planner: plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 8 "
                      "(chunks is 2)")


# ---------------------------------------------------------------- libra.torch on 4 ranks

def slot_data(slot, hq, hkv, dt, seed):
    g = torch.Generator().manual_seed(100 * seed + slot)
    Q, K, V, G = (torch.randn(L, h, 16, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv, hq))
    return [x.to(dt).to(torch.float64) for x in (Q, K, V)] + [G]  # the reference sees libra's rounded inputs


def run_case(rank, seed, kw, equal_chunks):
    group, worker = lt.pool_group(2, 2)
    pool = POOLS[:2]
    tapered_plan = plan_of(pool, kw)
    equal_plan = plan_of(pool, kw, chunk_split="equal", chunks=equal_chunks)
    tapered = lt.PlanRuntime(tapered_plan, group)
    equal = lt.PlanRuntime(equal_plan, group)
    slot = worker // 2
    dt = torch.bfloat16 if kw.get("dtype") == "bf16" else torch.float32
    Q, K, V, G = slot_data(slot, kw["heads_q"], kw["heads_kv"], dt, seed)
    rows = tapered.packed_rows
    q, k, v = (x[rows].to(dt) for x in (Q, K, V))
    got = attend(tapered, q, k, v, G[rows])
    same_tiles = attend(equal, q, k, v, G[rows])
    want = reference_grads(Q, K, V, G, pool[slot], rows)
    return {"errors": [rel_err(a, b) for a, b in zip(got, want)],
            "bitwise_vs_equal": [bool(torch.equal(a, b)) for a, b in zip(got, same_tiles)],
            "err_vs_equal": [rel_err(a, b) for a, b in zip(got, same_tiles)],
            "runtime": [tapered.num_chunks, tapered.plan.config["chunk_split"], equal.plan.config["chunk_split"],
                        tapered.fingerprint == tapered_plan.fingerprint != equal.fingerprint]}


def planner_body(rank):
    """Planner(worker=..., chunk_split="tapered").runtime(n) runs what PlanRuntime of make_plan does."""
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=1, heads_q=8, heads_kv=2, head_dim=16, chunks=4,
              dtype="fp32", chunk_split="tapered")
    return planner_runs_make_plan(rank, POOLS, kw, check=lambda rt: rt.plan.config["chunk_split"] == "tapered")


def body(rank, world, seeds):
    out = {"cases": {}}
    for (name, kw, equal_chunks), seed in zip(CASES, seeds):
        out["cases"][name] = run_case(rank, seed, kw, equal_chunks)
    out["planner"] = planner_body(rank)
    return out


@pytest.fixture(scope="module", params=COMMUNICATORS)
def four(request):
    seeds = [random.Random(i).randrange(1000) for i in range(len(CASES))]
    return run(request.param, body, 4, seeds)


def test_tapered_runs_match_plain_attention(four):
    for name, kw, _ in CASES:
        tol = TOL["bfloat16" if kw.get("dtype") == "bf16" else "float32"]
        for r in four:
            c = r["cases"][name]
            assert max(c["errors"]) < tol, (name, c["errors"])


def test_tapered_runs_really_run_tapered_plans(four):
    for name, kw, _ in CASES:
        for r in four:
            assert r["cases"][name]["runtime"] == [kw["chunks"], "tapered", "equal", True], name


def test_the_cases_cover_both_kinds_of_dkv_sums():
    assert same_dkv_sums(CASES[1][1], CASES[1][2])  # 8 heads, groups of 2: 2,4,2 against one chunk
    assert not same_dkv_sums(CASES[0][1], CASES[0][2])  # groups of 4: 1,3,3,1 against 2,2,2,2
    assert group_cuts([1, 3, 3, 1], 4) == [((0,), (1, 2, 3)), ((4, 5, 6), (7,))]


def test_tapered_equals_the_equal_cut_of_the_same_tiles(four):
    for name, kw, equal_chunks in CASES:
        tight = TIGHT["bfloat16" if kw.get("dtype") == "bf16" else "float32"]
        for r in four:
            c = r["cases"][name]
            # o and dQ: each query head computed once either way, bit for bit.
            assert c["bitwise_vs_equal"][:2] == [True, True], (name, c["bitwise_vs_equal"], c["err_vs_equal"])
            if same_dkv_sums(kw, equal_chunks) and kw.get("dtype") != "bf16":
                assert c["bitwise_vs_equal"][2:] == [True, True], (name, c["err_vs_equal"])
            # dK, dV where the cuts split a KV head's group otherwise (module docstring).
            assert max(c["err_vs_equal"][2:]) < tight, (name, c["err_vs_equal"])

def test_planner_runtime_runs_the_tapered_plan(four):
    assert all(r["planner"] for r in four)
