"""libra.torch with relayed inputs (PlanRuntime(relay=True), libra/relay.hpp) on nodes of two GPUs:
forward and backward against plain attention in float64 (tests/python/dist_util.py) and against the
same plan run without relay, over each communicator (gloo processes, the in-process pool).

Each case's pool is the first of a seeded series whose plan relays something (libra.plan_relays),
as in the C++ executor's relay_cases, and every case asserts that its runtime runs stage exchanges
and that some rank stages data, so no case passes by relaying nothing. The relay only changes
which rank sends an input and from where; the compute buffers, kernel calls and the Out phases'
application order are the same, so relayed and direct runs must agree bit for bit.
"""
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from dist_util import COMMUNICATORS, all_gather, attend, reference_grads, rel_err, run  # noqa: E402

L = 64
TOL = {"float32": 2e-5, "bfloat16": 2e-2}
TOPOLOGY = {"gpus_per_node": 2, "nodes_per_supernode": 2}  # 4 ranks: two nodes, so cross-node pairs exist

# (name, make_plan keywords) on 4 ranks; P = 4 / cp. The C++ relay_cases' shapes: tap and tap-topo,
# M 1, 2 and 4, zigzag homes with the KV prefix, bf16 GQA with H > h_kv.
CASES = [
    ("tap M1", dict(cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, chunks=1, mode="tap")),
    ("tap M2", dict(cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, chunks=2, mode="tap")),
    ("tap M4", dict(cp=2, block_size=8, head_shards=2, heads_q=8, heads_kv=2, chunks=4, mode="tap")),
    ("tap-topo M1", dict(cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, chunks=1, mode="tap-topo")),
    ("tap-topo zigzag kv prefix M2", dict(cp=2, block_size=8, head_shards=4, heads_q=8, heads_kv=2, chunks=2,
                                          mode="tap-topo", home_layout="zigzag", kv_prefix=True)),
    ("tap-topo P1 CP4 zigzag kv prefix M2", dict(cp=4, block_size=4, head_shards=2, heads_q=4, heads_kv=2,
                                                 chunks=2, mode="tap-topo", home_layout="zigzag",
                                                 kv_prefix=True)),
    ("tap bf16 H4 hkv1 kv prefix M2", dict(cp=2, block_size=8, head_shards=4, heads_q=8, heads_kv=1, chunks=2,
                                           mode="tap", dtype="bf16", kv_prefix=True)),
]


def random_pool(rng):
    """One packed sequence of L: a long sample of 40-95% of L, short ones, sometimes padding."""
    left = L - (rng.randrange(8) if rng.random() < 0.3 else 0)
    lens = [min(max(1, L * rng.randrange(40, 96) // 100), left)]
    left -= lens[0]
    while left > 0:
        lens.append(min(left, 1 + rng.randrange(L // 6)))
        left -= lens[-1]
    rng.shuffle(lens)
    return lens


def plan_of(pool, kw):
    return libra.make_plan(pool, seq_len=L, head_dim=16, topology=TOPOLOGY, **kw)


def relaying_pool(kw):
    """The first pool of the seeded series whose plan relays something."""
    for seed in range(200):
        rng = random.Random(seed)
        pool = [random_pool(rng) for _ in range(4 // kw["cp"])]
        via = libra.plan_relays(plan_of(pool, kw))
        if (via != np.arange(via.shape[1])[None, :, None]).any():
            return pool
    raise AssertionError(f"no pool of the series relays under {kw}")


def run_case(rank, pool, kw, trace=False):
    cp = kw["cp"]
    group, worker = lt.pool_group(4 // cp, cp)
    plan = plan_of(pool, kw)
    relayed = lt.PlanRuntime(plan, group, relay=True, trace=trace)
    direct = lt.PlanRuntime(plan, group)
    slot = worker // cp
    dt = torch.bfloat16 if kw.get("dtype") == "bf16" else torch.float32
    g = torch.Generator().manual_seed(10 * slot + 1)
    Q, K, V, G = (torch.randn(L, h, 16, generator=g, dtype=torch.float64)
                  for h in (kw["heads_q"], kw["heads_kv"], kw["heads_kv"], kw["heads_q"]))
    Q, K, V = (x.to(dt).to(torch.float64) for x in (Q, K, V))
    rows = relayed.packed_rows
    q, k, v = (x[rows].to(dt) for x in (Q, K, V))
    got = attend(relayed, q, k, v, G[rows])
    plain = attend(direct, q, k, v, G[rows])
    want = reference_grads(Q, K, V, G, pool[slot], rows)
    staged = torch.tensor([relayed.schedule["stage_q_vectors"] + relayed.schedule["stage_kv_vectors"]])
    every = [torch.zeros_like(staged) for _ in range(4)]
    all_gather(every, staged, group)
    out = {"errors": [rel_err(a, b) for a, b in zip(got, want)],
           "same_as_direct": all(torch.equal(a, b) for a, b in zip(got, plain)),
           "relayed": relayed.relayed and not direct.relayed and relayed.relay is True,
           "staged_vectors": int(sum(int(x) for x in every)),
           "fingerprints": [relayed.schedule["fingerprint"] != direct.schedule["fingerprint"],
                            relayed.fingerprint == direct.fingerprint == plan.fingerprint]}
    if trace:
        out["trace"] = sorted({e[1] for e in relayed.trace if "stage" in e[1]})
    return out


def refusals(rank, pool, kw):
    """relay on some ranks only, and a relay that is not a bool: the same line on every rank."""
    group, worker = lt.pool_group(2, 2)
    plan = plan_of(pool, kw)
    out = {}
    for name, mine in (("one_rank", {"relay": rank == 3}), ("type", {"relay": "yes"} if rank == 1 else {})):
        try:
            lt.PlanRuntime(plan, group, **mine)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    # A schedule prefetched without relay (Planner's) is not reused for a relayed runtime.
    prefetched = libra._libra.rank_program(plan, worker)
    out["prefetched"] = lt.PlanRuntime(plan, group, schedule=prefetched, relay=True).relayed
    return out


def body(rank, world, cases):
    out = {"cases": {}}
    for i, (name, pool, kw) in enumerate(cases):
        out["cases"][name] = run_case(rank, pool, kw, trace=i == 2)
    name, pool, kw = cases[1]
    out["refusals"] = refusals(rank, pool, kw)
    return out


@pytest.fixture(scope="module")
def cases():
    return [(name, relaying_pool(kw), kw) for name, kw in CASES]


@pytest.fixture(scope="module", params=COMMUNICATORS)
def four(request, cases):
    return run(request.param, body, 4, cases), cases


def test_relayed_runs_match_plain_attention_and_the_direct_run(four):
    results, cases = four
    for name, _pool, kw in cases:
        tol = TOL["bfloat16" if kw.get("dtype") == "bf16" else "float32"]
        for r in results:
            c = r["cases"][name]
            assert max(c["errors"]) < tol, (name, c["errors"])
            assert c["same_as_direct"], name


def test_every_case_really_relays(four):
    results, cases = four
    for name, _pool, _kw in cases:
        for r in results:
            c = r["cases"][name]
            assert c["relayed"] and c["staged_vectors"] > 0, (name, c)
            # The schedule fingerprint carries the relay; the plan's stays what every rank agreed on.
            assert c["fingerprints"] == [True, True], (name, c)


def test_the_stage_exchanges_are_traced_like_the_cpp_engine(four):
    results, _ = four
    for r in results:
        names = r["cases"]["tap M4"]["trace"]
        for m in range(4):
            assert f"fwd stage chunk {m} class 0" in names and f"bwd stage chunk {m} class 1" in names, names


def test_ranks_that_disagree_on_relay_raise_one_line(four):
    results, _ = four
    lines = [r["refusals"]["one_rank"] for r in results]
    assert lines[0] == ("PlanRuntime: relay differs across the pool group (group ranks [0, 1, 2] pass "
                        "relay=False; group ranks [3] pass relay=True): every rank must pass the same value")
    assert len(set(lines)) == 1
    for r in results:
        assert r["refusals"]["type"] == "PlanRuntime: group rank 1: relay 'yes': must be True or False"
        assert r["refusals"]["prefetched"] is True
