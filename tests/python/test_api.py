"""The Python API's argument checks, the sampler's epochs, and libra.torch's agreement and timeouts.

Each test holds a finding of the new-user and hostile trials (issues 18 and 21) and failed before its
fix: bools read as integers, range errors reported as type mismatches, CLI flag names in Python
errors, multi-line or foreign exceptions from the sampler, a sampler that covers one epoch only,
softmax_scale=0 read as the default, and ranks left waiting on a peer that raised or went silent.
The distributed cases run on 2 gloo processes under a hang guard, so a case that would block the
others fails instead of waiting for gloo's 30-minute default.
"""
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import libra

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import libra.torch as lt  # noqa: E402
from dist_util import _entry, reference_attention, run  # noqa: E402

SHAPE = dict(seq_len=8, cp=2, block_size=2, head_shards=2, heads_q=4, heads_kv=2, head_dim=16)
POOL = [[3, 5], [8]]


def one_line_value_error(fn):
    with pytest.raises(ValueError) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text and text
    return e.value


# ---- the core binding


@pytest.mark.parametrize("call, want", [
    (lambda: libra.make_plan(POOL, **{**SHAPE, "window": True}), "make_plan(): window True: must be an integer, not a bool"),
    (lambda: libra.make_plan(POOL, **{**SHAPE, "cp": True}), "make_plan(): cp True: must be an integer, not a bool"),
    (lambda: libra.make_plan(POOL, **{**SHAPE, "tau": False}), "make_plan(): tau False: must be a number, not a bool"),
    (lambda: libra.make_plan([[True, 7], [8]], **SHAPE), "pool[0][0] True: is a bool, not a sample length"),
    (lambda: libra.place_window(POOL, True), "place_window(): pool_size True: must be an integer, not a bool"),
    (lambda: libra.PlacementSampler([[4]] * 8, 4, 2, True), "PlacementSampler(): pool_size True: must be an integer, not a bool"),
    (lambda: libra.pack([4, True], 8), "pack(): lengths[1] True: must be an integer, not a bool"),
    (lambda: libra.sequence_workloads([[2], [3, False]]), "sequences[1][1] False: is a bool, not a sample length"),
])
def test_bools_are_not_taken_as_integers(call, want):
    assert str(one_line_value_error(call)) == want


# Issue 35 (F9, F10): a Plan's methods gave pybind11's 4-line TypeError for a float or None index, read
# True as 0 and called 2**63 a type mismatch; numbers and None were read as bools, bytes as a str.
@pytest.mark.parametrize("call, want, kind", [
    (lambda p: p.chunk_heads(True, 0), "Plan.chunk_heads(): tile True: must be an integer, not a bool", ValueError),
    (lambda p: p.chunk_heads(2 ** 63, 0), "Plan.chunk_heads(): tile 9223372036854775808: out of range, must be in "
                                          "[-2147483648, 2147483647]", ValueError),
    (lambda p: p.chunk_heads(0.0, 0), "Plan.chunk_heads(): arguments of types (Plan, float, int) do not match "
                                      "(self: _libra.Plan, tile: int, chunk: int) -> Tuple[int, int]", libra.ArgumentError),
    (lambda p: p.chunk_heads(None, 0), "Plan.chunk_heads(): arguments of types (Plan, NoneType, int) do not match "
                                       "(self: _libra.Plan, tile: int, chunk: int) -> Tuple[int, int]", libra.ArgumentError),
    (lambda p: p.chunk_transfers(0, 0.5, 1), "Plan.chunk_transfers(): arguments of types (Plan, int, float, int) do "
                                             "not match (self: _libra.Plan, chunk: int, src: int, dst: int) -> dict",
     libra.ArgumentError),
    (lambda p: p.worker_tiles(False), "Plan.worker_tiles(): worker False: must be an integer, not a bool", ValueError),
    (lambda p: libra.make_plan(POOL, **{**SHAPE, "kv_prefix": 1}),
     "make_plan(): kv_prefix 1: must be True or False, not an int", ValueError),
    (lambda p: libra.make_plan(POOL, **{**SHAPE, "kv_prefix": None}),
     "make_plan(): kv_prefix None: must be True or False, not a NoneType", ValueError),
    (lambda p: libra.make_plan(POOL, **{**SHAPE, "dedup_per_kv_head": "yes"}),
     "make_plan(): dedup_per_kv_head 'yes': must be True or False, not a str", ValueError),
    (lambda p: libra.make_plan(POOL, **{**SHAPE, "chunk_split": b"tapered"}),
     "make_plan(): chunk_split b'tapered': must be a str, not bytes", ValueError),
])
def test_plan_methods_and_bools_take_their_types_only(call, want, kind):
    plan = libra.make_plan(POOL, **SHAPE)
    e = one_line_value_error(lambda: call(plan))
    assert str(e) == want and isinstance(e, kind)
    assert plan.chunk_heads(0, 0) == plan.chunk_heads(False + 0, 0)  # the method still works


def test_an_integer_out_of_range_is_a_range_error_not_a_type_mismatch():
    e = one_line_value_error(lambda: libra.make_plan(POOL, **{**SHAPE, "cp": 2 ** 31}))
    assert str(e) == "make_plan(): cp 2147483648: out of range, must be in [-2147483648, 2147483647]"
    assert not isinstance(e, TypeError)
    e = one_line_value_error(lambda: libra.make_plan(POOL, **{**SHAPE, "seq_len": 2 ** 63}))
    assert str(e).startswith("make_plan(): seq_len 9223372036854775808: out of range")
    e = one_line_value_error(lambda: libra.place_window(POOL, 2, seed=-1))
    assert str(e) == "place_window(): seed -1: out of range, must be in [0, 18446744073709551615]"
    # A real type mismatch is still one, in one line.
    assert isinstance(one_line_value_error(lambda: libra.make_plan(POOL, **{**SHAPE, "cp": "2"})), TypeError)


def test_errors_name_python_arguments_not_cli_flags(tmp_path):
    e = one_line_value_error(lambda: libra.PlacementSampler([[4]] * 8, 3, 1, 2))
    assert str(e) == "pool_size 2: must divide gbs 3"
    assert str(one_line_value_error(lambda: libra.PlacementSampler([[4]] * 8, 4, 3, 1))) == "dp 3: must divide gbs 4"
    (tmp_path / "--seq-len").mkdir()
    raw = tmp_path / "--seq-len" / "raw.txt"  # a path's `--` is not a flag
    raw.write_text("3\n4\n")
    e = one_line_value_error(lambda: libra.load_packed_sequences(str(raw)))
    assert str(e) == f"{raw}: raw sample lengths have no default packed length; give one (seq_len)"


def test_simulate_names_a_value_json_cannot_hold():
    for bad in (float("nan"), float("inf")):
        e = one_line_value_error(lambda: libra.simulate({"tau": bad}))
        assert str(e) == f"simulate config: tau {bad}: must be a finite number"
    e = one_line_value_error(lambda: libra.simulate({"pool_sizes": [4, float("-inf")]}))
    assert str(e) == "simulate config: pool_sizes[1] -inf: must be a finite number"
    assert "set is not a JSON value" in str(one_line_value_error(lambda: libra.simulate({"pool_sizes": {4}})))


def test_simulate_takes_a_list_of_chunks_and_reports_the_chosen_m():
    tiny = str(Path(__file__).resolve().parents[1] / "cli" / "data" / "simulate" / "tiny.jsonl")
    cfg = {"source": tiny, "seq_len": 64, "gbs": 4, "dp": 4, "cp": 2, "heads_q": 4, "heads_kv": 2, "head_dim": 8,
           "pool_sizes": [2], "head_shards": [2], "block_sizes": [16], "windows": 1, "threads": 1,
           "scaling_dp": [2, 4]}
    single = {m: libra.simulate({**cfg, "chunks": m}) for m in (1, 2)}
    both = libra.simulate({**cfg, "chunks": [1, 2]})
    assert both["config"]["chunks"] == [1, 2] and single[2]["config"]["chunks"] == 2
    assert "chunks" not in single[2]["candidates"][0]
    c = both["candidates"][0]
    for v, m in c["chunks"].items():
        lat = {k: single[k]["candidates"][0]["latency"][v] for k in (1, 2)}
        assert c["latency_by_chunks"][v] == {str(k): lat[k] for k in (1, 2)}
        assert m == min((1, 2), key=lambda k: lat[k]["mean"])
        assert c["latency"][v] == lat[m]
    assert both["end_to_end_chunks"] == c["chunks"].get(both["end_to_end_variant"], 1)
    e = one_line_value_error(lambda: libra.simulate({**cfg, "chunks": [2, 0]}))
    assert str(e) == "chunks 0: must be at least 1"


def test_the_kernel_binding_refuses_a_zero_scale_it_would_read_as_the_default():
    q = np.zeros((4, 1, 16), dtype=np.float32)
    o, lse = np.zeros_like(q), np.zeros((4, 1, 1), dtype=np.float32)
    view = (q.ctypes.data, "fp32", 4, 1, 16, 16)
    frags = np.array([[0, 0, 4, 0, 4]], dtype=np.int64)
    args = (view, view, view, (o.ctypes.data, "fp32", 4, 1, 16, 16), (lse.ctypes.data, "fp32", 4, 1, 1, 1), frags)
    e = one_line_value_error(lambda: libra._libra.kernel_forward(*args, softmax_scale=0.0))
    assert str(e) == "kernel softmax_scale 0.0: must be finite and nonzero (None for 1/sqrt(head_dim))"
    libra._libra.kernel_forward(*args)  # None: the default scale


# ---- the sampler and the planner

SEQS = libra.pack([int(x) for x in np.random.default_rng(3).integers(1, 60, size=400)], 64)["sequences"]


@pytest.mark.parametrize("kwargs, want", [
    (dict(gbs="8"), "PlacementBatchSampler: gbs '8': must be an integer, not a str"),
    (dict(dp_rank=1.0), "PlacementBatchSampler: dp_rank 1.0: must be an integer, not a float"),
    (dict(pool_size=True), "PlacementBatchSampler: pool_size True: must be an integer, not a bool"),
    (dict(dp=0, dp_rank=0), "PlacementBatchSampler: dp 0: must be >= 1"),
    (dict(dp_rank=4), "PlacementBatchSampler: dp_rank 4: must be in [0, dp = 4)"),
    (dict(gbs=6), "PlacementBatchSampler: dp 4: must divide gbs 6"),
    (dict(dp=2, pool_size=4, dp_rank=0), "PlacementBatchSampler: pool_size 4: must divide dp 2"),
    (dict(seed=-1), "PlacementBatchSampler: seed -1: must be in [0, 2**64)"),
])
def test_sampler_arguments_are_refused_in_one_line(kwargs, want):
    args = {**dict(gbs=8, dp=4, pool_size=2, dp_rank=1), **kwargs}
    assert str(one_line_value_error(lambda: lt.PlacementBatchSampler(SEQS, **args))) == want


def epoch_batches(samplers, epoch):
    for s in samplers:
        s.set_epoch(epoch)
    return [[b[0] for b in s] for s in samplers]


def test_set_epoch_gives_each_epoch_its_own_order_the_same_on_every_rank():
    dp, P, gbs = 4, 2, 8
    ranks = [lt.PlacementBatchSampler(SEQS, gbs=gbs, dp=dp, pool_size=P, dp_rank=r, seed=5) for r in range(dp)]
    again = [lt.PlacementBatchSampler(SEQS, gbs=gbs, dp=dp, pool_size=P, dp_rank=r, seed=5) for r in range(dp)]
    core = libra.PlacementSampler(SEQS, gbs, dp, P, seed=5)
    per_epoch = []
    for epoch in range(3):
        got = epoch_batches(ranks, epoch)
        assert got == epoch_batches(again, epoch)  # a pure function of (seed, epoch)
        steps = len(got[0]) // (gbs // dp)
        # The ranks' batches interleave into each step's order: every sequence at most once per epoch,
        # every GA step a window of gbs distinct sequences.
        flat = [got[r][n] for n in range(len(got[0])) for r in range(dp)]
        assert len(flat) == steps * gbs == len(set(flat)) and all(0 <= i < len(SEQS) for i in flat)
        if epoch == 0:  # epoch 0 is the order the sequences were given in, as before epochs existed
            assert flat == [int(i) for s in range(steps) for i in core.at(s)["order"]]
        # Pools: P consecutive replicas of a GA index, slot = dp_rank % P.
        for n in range(len(got[0])):
            for r in range(dp):
                assert ranks[r].pool_indices(n) == [got[r - r % P + p][n] for p in range(P)]
                assert ranks[r].pool(n) == [SEQS[i] for i in ranks[r].pool_indices(n)]
        assert list(ranks[0]) == []  # an epoch is iterated once; set_epoch moves on
        per_epoch.append(flat)
    assert len({tuple(x) for x in per_epoch}) == 3
    other = lt.PlacementBatchSampler(SEQS, gbs=gbs, dp=dp, pool_size=P, dp_rank=0, seed=6)
    assert epoch_batches([other], 1)[0] != [b for b in per_epoch[1][0::dp]]  # another seed, another order


def test_sampler_resumes_mid_epoch_and_refuses_bad_states():
    kw = dict(gbs=8, dp=4, pool_size=2, dp_rank=3, seed=1)
    s = lt.PlacementBatchSampler(SEQS, **kw)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it)[0] for _ in range(7)]
    state = s.state_dict()
    assert state == {"epoch": 2, "position": 7}
    t = lt.PlacementBatchSampler(SEQS, **kw)
    t.load_state_dict(state)
    t.set_epoch(2)  # the resumed loop's set_epoch of the same epoch keeps the position
    full = lt.PlacementBatchSampler(SEQS, **kw)
    full.set_epoch(2)
    assert head + [b[0] for b in t] == [b[0] for b in full]
    t.load_state_dict({"position": 0})  # a state from before epochs: epoch 0
    assert t.epoch == 0 and [b[0] for b in t] == [b[0] for b in lt.PlacementBatchSampler(SEQS, **kw)]
    n = len(s)
    for bad, want in [
        ({"position": True}, f"position True: must be an integer in [0, {n}]"),
        ({"position": n + 1}, f"position {n + 1}: must be an integer in [0, {n}]"),
        ({"epoch": -1, "position": 0}, "epoch -1: must be an integer >= 0"),
        ({"epoch": 1.5, "position": 0}, "epoch 1.5: must be an integer >= 0"),
        ({"epoch": 1}, "position is missing"),
        ({"position": 0, "step": 3}, "unknown key 'step' (it holds epoch and position)"),
        ([0], "must be a dict with position (and epoch), got a list"),
    ]:
        assert str(one_line_value_error(lambda: t.load_state_dict(bad))) == f"PlacementBatchSampler state: {want}"
    assert str(one_line_value_error(lambda: t.set_epoch(True))) == \
        "PlacementBatchSampler.set_epoch(): epoch True: must be an integer, not a bool"


def test_planner_checks_its_plan_arguments_at_construction_and_follows_the_epoch():
    s = lt.PlacementBatchSampler(SEQS, gbs=4, dp=2, pool_size=2, dp_rank=0)
    kw = dict(seq_len=64, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16)
    e = one_line_value_error(lambda: lt.Planner(s, **{**kw, "seq_len": 255}))
    assert str(e) == "Planner: plan config: seq_len 255 must be divisible by cp 2"
    e = one_line_value_error(lambda: lt.Planner(s, **{**kw, "head_dim": "32"}))
    assert isinstance(e, libra.ArgumentError) and "head_dim=str" in str(e)
    e = one_line_value_error(lambda: lt.Planner(s, **{**kw, "chunks": True}))
    assert str(e) == "Planner: make_plan(): chunks True: must be an integer, not a bool"
    e = one_line_value_error(lambda: lt.Planner(s, relay="yes", **kw))
    assert str(e) == "Planner: relay 'yes': must be True or False"
    # relay=True: the schedules the thread derives are relayed ones (the plan's own topology decides
    # whether anything is relayed; the option itself is what travels).
    relayed = lt.Planner(s, worker=0, relay=True, **kw)
    try:
        assert relayed._result(0)[1].info["relay"] is True
    finally:
        relayed.close()
    planner = lt.Planner(s, **kw)
    try:
        assert planner.get(0) == libra.make_plan(s.pool(0), **kw)
        s.set_epoch(1)
        assert s.pool(0) != lt.PlacementBatchSampler(SEQS, gbs=4, dp=2, pool_size=2, dp_rank=0).pool(0)
        for n in (0, 1):
            assert planner.get(n) == libra.make_plan(s.pool(n), **kw)  # the new epoch's pools
    finally:
        planner.close()


# ---- libra.torch on 2 gloo processes: agreement before work, softmax_scale 0, timeouts

L = 64
PT_POOLS = [[10, 30, 20], [64]]
T = 1.0  # the timeout the silence cases run with (seconds)
GUARD = 240  # a case that hangs fails after this long instead of waiting for gloo's 30 minutes


def spawn_guarded(fn, world):
    """dist_util.spawn with a hang guard: ranks still running after GUARD seconds fail the test."""
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_entry, args=(world, os.path.join(d, "init"), d, fn, (), "gloo"), nprocs=world,
                                 join=False, start_method="spawn")
        end = time.monotonic() + GUARD
        while not ctx.join(timeout=1):
            if time.monotonic() > end:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"ranks still running after {GUARD} s: one waits on a peer that will never come")
        import json
        return [json.load(open(os.path.join(d, f"result.{r}.json"))) for r in range(world)]


def _plan(**kw):
    return libra.make_plan(PT_POOLS, seq_len=L, cp=1, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, dtype="fp32", **kw)


def _data(slot, scale=None):
    g = torch.Generator().manual_seed(10 + slot)
    q, k, v = (torch.randn(L, h, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    grad = torch.randn(L, 4, 16, generator=g, dtype=torch.float64)
    qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
    ref = reference_attention(qr, kr, vr, PT_POOLS[slot], scale=scale)
    (ref * grad).sum().backward()
    return (q, k, v, grad), (ref.detach(), qr.grad, kr.grad, vr.grad)


def _error(fn):
    try:
        fn()
    except (ValueError, TimeoutError) as e:
        return [type(e).__name__, str(e)]
    return None


def _attend(rt, q, k, v, grad, **kw):
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    o = lt.attention(q, k, v, rt, **kw)
    (o.double() * grad).sum().backward()
    return o, q.grad, k.grad, v.grad


def body_agreement(rank, world):
    out = {}
    group, worker = lt.pool_group(2, 1)
    (q, k, v, grad), _ = _data(worker)
    # One rank's bad option used to raise after the others had posted (threads: in the kernel; exchange:
    # after the all_gather), leaving them waiting; now every rank raises that rank's line at construction.
    for name, bad in (("threads", {"threads": 5000}), ("exchange", {"exchange": "nope"}),
                      ("timeout", {"timeout": -1}), ("worker", {"worker": 1.5})):
        out[name] = _error(lambda: _attend(lt.PlanRuntime(_plan(), group, **(bad if rank == 1 else {})),
                                           q, k, v, grad))
    rt = lt.PlanRuntime(_plan(), group)
    out["scale_nan"] = _error(lambda: _attend(rt, q, k, v, grad, softmax_scale=math.nan if rank == 0 else None))
    out["dtype"] = _error(lambda: lt.attention(q.float(), k.to(torch.bfloat16 if rank == 0 else torch.float32),
                                               v.float(), rt))
    # softmax_scale 0 is uniform attention over each row's visible keys, not the default scale.
    (q, k, v, grad), want = _data(worker, scale=0.0)
    got = _attend(rt, q, k, v, grad, softmax_scale=0.0)
    out["scale0"] = [float((g.double() - w).abs().max() / w.abs().max().clamp_min(1e-30)) if w.abs().max() > 0
                     else float(g.abs().max()) for g, w in zip(got, want)]
    return out


def test_a_bad_option_on_one_rank_raises_its_line_on_every_rank_and_scale_zero_is_honoured():
    r0, r1 = spawn_guarded(body_agreement, 2)
    want = {
        "threads": "PlanRuntime: group rank 1: threads 5000: must be an integer in [1, 1024]",
        "exchange": "PlanRuntime: group rank 1: exchange 'nope': must be auto, programs or index",
        "timeout": "PlanRuntime: group rank 1: timeout -1: must be a finite number of seconds > 0",
        "worker": "PlanRuntime: group rank 1: worker 1.5: must be an integer",
        "scale_nan": "libra.torch.attention: group rank 0: softmax_scale nan: must be finite",
        "dtype": "libra.torch.attention: group rank 0: q, k and v must share dtype and device, got q torch.float32 "
                 "on cpu, k torch.bfloat16 on cpu, v torch.float32 on cpu",
    }
    for key, line in want.items():
        assert r0[key] == r1[key] == ["ValueError", line], key
    for r in (r0, r1):
        o, dq, dk, dv = r["scale0"]
        assert o < 2e-6 and dv < 2e-6, r["scale0"]  # relative to float64 plain attention at scale 0
        assert dq == 0 and dk == 0, r["scale0"]  # the scores do not depend on q or k at scale 0


def test_a_plans_topology_survives_pickle_bytes_and_files_and_is_in_its_fingerprint(tmp_path):
    """Issue 35 (F3): a tap plan on nodes of 2 GPUs came back from pickle and files with 8."""
    import pickle
    topo = {"gpus_per_node": 2, "nodes_per_supernode": 2}
    plan = _plan(topology=topo)
    default = _plan()
    assert plan.fingerprint != default.fingerprint
    plan.save(str(tmp_path / "p.json"))
    plan.save(str(tmp_path / "p.bin"))
    for back in (pickle.loads(pickle.dumps(plan)), libra.plan_from_bytes(plan.to_bytes()),
                 libra.load_plan(str(tmp_path / "p.json")), libra.load_plan(str(tmp_path / "p.bin"))):
        assert back.config["topology"] == plan.config["topology"]
        assert back.config["topology"]["gpus_per_node"] == 2
        assert back.fingerprint == plan.fingerprint
    assert pickle.loads(pickle.dumps(default)).fingerprint == default.fingerprint


# Every make_plan keyword changed alone changes the fingerprint and comes back from pickle and bytes
# (issue 35: the topology did neither).
@pytest.mark.parametrize("change", [
    dict(seq_len=128), dict(block_size=4), dict(head_shards=1), dict(heads_q=8), dict(heads_kv=1), dict(head_dim=8),
    dict(dtype="fp32"), dict(window=5), dict(tau=0.05), dict(chunks=1), dict(mode="tap-split"),
    dict(dedup_per_kv_head=True), dict(home_layout="zigzag"), dict(kv_prefix=True),
    dict(heads_q=12, heads_kv=1, head_shards=1, chunks=3, chunk_split="tapered"),
    dict(topology={"gpus_per_node": 1}), dict(topology={"nodes_per_supernode": 1}),
    dict(topology={"intra_node_gbps": 100.0}), dict(topology={"inter_node_gbps": 10.0}),
    dict(topology={"inter_supernode_gbps": 1.0}), dict(topology={"congestion_per_node": 0.0}),
])
def test_every_plan_field_travels_through_pickle_and_bytes_and_the_fingerprint(change):
    import pickle
    base = dict(seq_len=64, cp=1, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, dtype="bf16",
                chunks=2)
    plan = libra.make_plan(PT_POOLS, **{**base, **change})
    assert plan.fingerprint != libra.make_plan(PT_POOLS, **base).fingerprint
    for back in (pickle.loads(pickle.dumps(plan)), libra.plan_from_bytes(plan.to_bytes()),
                 libra.plan_from_json(plan.to_json())):
        assert back.config == plan.config and back.fingerprint == plan.fingerprint


def body_call_agreement(rank, world):
    """Issue 35 (F3, F4): each argument that changes the numbers differs on group rank 1 alone, each
    value valid by itself; every rank must raise the same one line before any exchange. A case that
    ran would return (no error) or abort gloo."""
    out = {}
    group, worker = lt.pool_group(2, 1)
    (q, k, v, grad), _ = _data(worker)
    q, k, v = (x.float() for x in (q, k, v))
    one = rank == 1
    # The plan's topology only (gpus_per_node): part of the fingerprint, so the construction refuses.
    out["topology"] = _error(lambda: lt.PlanRuntime(_plan(topology={"gpus_per_node": 1} if one else None), group))
    rt = lt.PlanRuntime(_plan(), group)
    bf = torch.bfloat16
    cases = {
        "softmax_scale": lambda: lt.attention(q, k, v, rt, softmax_scale=0.5 if one else None),
        "softmax_scale_value": lambda: lt.attention(q, k, v, rt, softmax_scale=0.5 if one else 0.25 + 1e-9),
        "dtype": lambda: lt.attention(*((x.to(bf) if one else x) for x in (q, k, v)), rt),
        "return_lse": lambda: lt.attention(q, k, v, rt, return_lse=one),
        "return_lse_str": lambda: lt.attention(q, k, v, rt, return_lse="no" if one else False),
        "shape": lambda: lt.attention(q[:-1] if one else q, k, v, rt),
    }
    for name, call in cases.items():
        out[name] = _error(call)
    # Equal effective values are no disagreement: None is 1/sqrt(16) = 0.25.
    o = lt.attention(q, k, v, rt, softmax_scale=0.25 if one else None)
    out["same_scale_ran"] = list(o.shape)
    return out


@pytest.mark.parametrize("comm", ["inprocess", "gloo"])
def test_every_call_argument_that_changes_the_numbers_agrees_on_every_rank(comm):
    r0, r1 = run(comm, body_call_agreement, 2)
    agree = "; every rank of the group must pass the same"
    want = {
        "softmax_scale": "libra.torch.attention: softmax_scale differs across the group: group rank 0 passes 0.25, "
                         "group rank 1 0.5" + agree,
        "softmax_scale_value": "libra.torch.attention: softmax_scale differs across the group: group rank 0 passes "
                               "0.250000001, group rank 1 0.5" + agree,
        "dtype": "libra.torch.attention: q dtype differs across the group: group rank 0 passes torch.float32, group "
                 "rank 1 torch.bfloat16" + agree,
        "return_lse": "libra.torch.attention: return_lse differs across the group: group rank 0 passes False, group "
                      "rank 1 True" + agree,
        "shape": "libra.torch.attention: group rank 1: q has shape [63, 4, 16] but the plan needs [64, 4, 16]",
        "return_lse_str": "libra.torch.attention: group rank 1: return_lse 'no': must be True or False",
    }
    for key, line in want.items():
        assert r0[key] == r1[key] == ["ValueError", line], (key, r0[key], r1[key])
    assert r0["topology"] == r1["topology"] and r0["topology"][0] == "ValueError", r0["topology"]
    assert "fingerprint mismatch" in r0["topology"][1] and "\n" not in r0["topology"][1], r0["topology"]
    assert r0["same_scale_ran"] == r1["same_scale_ran"] == [64, 4, 16]


def body_silence(rank, world):
    """Rank 1 goes silent (sleeps 3 T) at three places; rank 0 must raise one line naming it. Each case
    on a fresh pool group: a timed-out group is not used again."""
    out = {}
    (q, k, v, grad), _ = _data(rank)

    group, _ = lt.pool_group(2, 1)
    if rank == 1:
        time.sleep(3 * T)  # silent during the construction's agreement
    else:
        out["construct"] = _error(lambda: lt.PlanRuntime(_plan(), group, timeout=T))

    for case, check in (("check", True), ("exchange", False)):
        group, _ = lt.pool_group(2, 1)
        dist.barrier()  # both healthy here: start the agreement together, however loaded the machine
        rt = lt.PlanRuntime(_plan(), group, timeout=T, check_calls=check)
        if rank == 1:
            time.sleep(3 * T)  # silent in attention: its call agreement, or (unchecked) its exchange
        else:
            out[case] = _error(lambda: _attend(rt, q, k, v, grad))
    return out


def test_a_silent_rank_is_named_within_the_timeout():
    r0, _ = spawn_guarded(body_silence, 2)
    who = "group rank 1 (global rank 1) sent nothing within 1 s"
    assert r0["construct"] == ["TimeoutError", f"PlanRuntime: {who}"]
    assert r0["check"] == ["TimeoutError", f"libra.torch.attention: {who}"]
    assert r0["exchange"] == ["TimeoutError", f"libra.torch.attention: fwd in chunk 0 class 0: {who}"]
