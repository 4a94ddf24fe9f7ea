"""libra's Triton tile-list kernels (libra.torch.triton_attention, backend "triton") on the CPU under
the Triton interpreter (TRITON_INTERPRET=1, set here before triton is imported).

- the kernels on randomised tile lists against a float64 reference written here (per fragment and
  head, plain softmax attention; independent of libra): empty and one-row fragments, fragments
  longer than a block, all four (q_home, kv_home) buffer pairs, key rows shared by several
  fragments, GQA 1/4/8, windows, d 64 and 128 (and 40, padded), fp32 and bf16, atomic and
  deterministic dK/dV; forward (O, LSE) and backward (dQ assigned, dK/dV added to what is there,
  every vector no fragment addresses untouched);
- libra.torch.attention with the backend pinned, on an in-process pool, against plain attention;
- the launch count of a chunk (one per buffer pair and kernel).

On a GPU (scripts/gpu-check.sh): ``TRITON_INTERPRET=0 pytest tests/python/test_triton.py -k kernels``
runs the kernel cases compiled, on cuda:0, with samples longer than the GPU block sizes.
"""
import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")
ON_DEVICE = os.environ["TRITON_INTERPRET"] == "0"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from libra.torch import backends  # noqa: E402
from libra.torch import triton_attention as ta  # noqa: E402
from libra.torch.descriptors import chunk_descriptors  # noqa: E402

BACKEND = backends.get("triton")
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
BLOCK = ta.INTERPRET_CONFIG.block_m  # 16: fragments of 1 .. 40 queries cover 0, 1, 2 and 3 blocks
DEVICE = torch.device("cuda" if ON_DEVICE else "cpu")
# Sample lengths: some longer than two blocks (interpreter 16, GPU up to 128).
SAMPLES = [1, 3, 170, 400] if ON_DEVICE else [1, 3, 17, 40]


def random_chunk(rng, hq, hkv, heads_total=8, window=None):
    """A chunk's calls over two buffer families (home, comp), each call one of the four pairs.
    Every call gets fresh query rows (a pass computes a query row once); key rows are shared
    between some calls and fragments (dK/dV add). Returns calls and the vector counts."""
    calls, q_rows, kv_rows = [], {True: 0, False: 0}, {True: 0, False: 0}
    shared_kv = {}
    for c in range(6):
        q_home, kv_home = bool(rng.integers(2)), bool(rng.integers(2))
        head0_q = int(rng.integers(0, heads_total // hq)) * hq
        frags = []
        n_frags = int(rng.integers(1, 4))
        sample = int(rng.choice(SAMPLES, p=[0.15, 0.15, 0.3, 0.4]))
        if kv_home in shared_kv and rng.integers(2):
            kv_base, sample = shared_kv[kv_home]  # the same sample's keys again: dK/dV rows overlap
        else:
            kv_base = kv_rows[kv_home]
            kv_rows[kv_home] += sample
            shared_kv[kv_home] = (kv_base, sample)
        cuts = np.sort(rng.integers(0, sample + 1, size=n_frags - 1)) if n_frags > 1 else np.array([], int)
        edges = [0, *cuts.tolist(), sample]
        q_base = q_rows[q_home]
        for a, e in zip(edges[:-1], edges[1:]):  # empty fragments (a == e) included
            frags.append((q_base + a, kv_base, sample, a, e))
        q_rows[q_home] += sample
        head0_kv = int(rng.integers(0, heads_total // hkv)) * hkv
        qp = (head0_q, sample, hq, heads_total)  # offset, rows, run, stride (rows informational)
        kp = (head0_kv, sample, hkv, heads_total)
        calls.append((qp, kp, np.array(frags, dtype=np.int64).reshape(-1, 5), q_home, kv_home))
    return calls, {w: q_rows[w] * heads_total for w in (True, False)}, {w: kv_rows[w] * heads_total for w in (True, False)}


def make_buffers(rng, nq, nkv, d, dtype):
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))

    def r(n, dt=dtype):
        return torch.randn(max(n, 1), d, generator=g, dtype=torch.float64).to(dt).to(DEVICE)

    out = {}
    for w in (True, False):
        out[w] = {"Q": r(nq[w]), "O": r(nq[w]), "dO": r(nq[w]), "dQ": r(nq[w], torch.float32),
                  "LSE": torch.randn(max(nq[w], 1), 1, generator=g, dtype=torch.float64).float().to(DEVICE),
                  "K": r(nkv[w]), "V": r(nkv[w]), "dK": r(nkv[w], torch.float32), "dV": r(nkv[w], torch.float32)}
    return out


def reference(calls, bufs, window, scale):
    """Float64: O and LSE per query vector, dQ (assigned), dK and dV (added to the buffers' values)."""
    f64 = {w: {n: t.cpu().to(torch.float64) for n, t in b.items()} for w, b in bufs.items()}
    for qp, kp, frags, q_home, kv_home in calls:
        bq, bk = f64[q_home], f64[kv_home]
        hq, hkv = qp[2], kp[2]
        for q_row, kv_row, _, a, e in frags:
            if a >= e:
                continue
            i = torch.arange(a, e)[:, None]
            j = torch.arange(e)[None, :]
            seen = (j <= i) if window is None else (j <= i) & (j > i - window)
            for h in range(hq):
                g = h // (hq // hkv)
                qv = qp[0] + (q_row + torch.arange(e - a)) * qp[3] + h
                kv = kp[0] + (kv_row + torch.arange(e)) * kp[3] + g
                q, k, v, do = bq["Q"][qv], bk["K"][kv], bk["V"][kv], bq["dO"][qv]
                s = (q @ k.T * scale).masked_fill(~seen, float("-inf"))
                lse = torch.logsumexp(s, 1)
                p = torch.exp(s - lse[:, None])
                o = p @ v
                dp = do @ v.T
                ds = p * (dp - (do * o).sum(1, keepdim=True))
                bq["O"][qv], bq["LSE"][qv, 0] = o, lse
                bq["dQ"][qv] = ds @ k * scale
                bk["dK"][kv] += ds.T @ q * scale
                bk["dV"][kv] += p.T @ do
    return f64


def fake_runtime(calls, window):
    """What the backend reads of a PlanRuntime for one chunk: the calls, the window, and (as
    ``rt.on(device)[pass]`` gives them from the binding's index arrays) the descriptor tables, here
    from the numpy reference builder."""
    table, bounds = chunk_descriptors(calls)

    def on(device):
        per = {"descriptors": [(torch.from_numpy(table).to(device), torch.from_numpy(bounds).to(device))],
               "descriptors_host": [(table, bounds)]}
        return [per, per]

    return types.SimpleNamespace(schedule={"calls": [[calls], [calls]]}, window=window, threads=1, on=on)


def err(got, want):
    """The largest |got - want| over the largest |want|, or over 1 where that is smaller (the values
    are O(1); a one-row fragment's dQ is 0 in exact arithmetic)."""
    want = want.to(torch.float64)
    return float((got.to(torch.float64) - want).abs().max() / want.abs().max().clamp_min(1.0))


CASES = [  # (seed, hq, hkv, d, dtype, window, deterministic)
    (1, 4, 4, 64, torch.float32, None, False),
    (2, 4, 1, 64, torch.bfloat16, None, True),
    (3, 8, 2, 128, torch.float32, 5, True),
    (4, 8, 1, 64, torch.bfloat16, 20, False),
    (5, 2, 2, 128, torch.bfloat16, None, True),
    (6, 4, 2, 40, torch.float32, 3, False),
]


@pytest.mark.parametrize("seed,hq,hkv,d,dtype,window,det", CASES)
def test_kernels_match_float64_on_random_tile_lists(seed, hq, hkv, d, dtype, window, det):
    rng = np.random.default_rng(seed)
    calls, nq, nkv = random_chunk(rng, hq, hkv, window=window)
    bufs = make_buffers(rng, nq, nkv, d, dtype)
    scale = None if seed % 2 else 0.3
    # The engine's order: forward writes O and LSE, backward reads them.
    rt = fake_runtime(calls, window)
    BACKEND.deterministic = det
    try:
        BACKEND.forward(rt, 0, 0, bufs[True], bufs[False], scale)
        want = reference(calls, bufs, window, d ** -0.5 if scale is None else scale)
        before = {w: {n: t.cpu() for n, t in b.items()} for w, b in bufs.items()}
        BACKEND.backward(rt, 1, 0, bufs[True], bufs[False], scale)
    finally:
        BACKEND.deterministic = None
    bufs = {w: {n: t.cpu() for n, t in b.items()} for w, b in bufs.items()}
    tol = TOL[dtype]
    touched_q = {w: torch.zeros(max(nq[w], 1), dtype=torch.bool) for w in (True, False)}
    touched_k = {w: torch.zeros(max(nkv[w], 1), dtype=torch.bool) for w in (True, False)}
    for qp, kp, frags, q_home, kv_home in calls:
        for q_row, kv_row, _, a, e in frags:
            for h in range(qp[2]):
                touched_q[q_home][qp[0] + (q_row + torch.arange(e - a)) * qp[3] + h] = True
            for g in range(kp[2]):
                touched_k[kv_home][kp[0] + (kv_row + torch.arange(e)) * kp[3] + g] = True
    # The figures docs/python.md reports (pytest -s prints them).
    errs = {n: max(err(bufs[w][n][touched_q[w]], want[w][n][touched_q[w]]) for w in (True, False))
            for n in ("O", "dQ")}
    errs.update({n: max(err(bufs[w][n], want[w][n]) for w in (True, False)) for n in ("dK", "dV")})
    print(f"\ntriton-errors: {str(dtype)[6:]} hq {hq} hkv {hkv} d {d} window {window} det {det}: "
          + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    for w in (True, False):
        b, r, t = bufs[w], want[w], touched_q[w]
        assert err(b["O"][t], r["O"][t]) < tol, ("O", w)
        assert err(b["LSE"][t], r["LSE"][t]) < 1e-5, ("LSE", w)
        assert err(b["dQ"][t], r["dQ"][t]) < tol, ("dQ", w)
        assert torch.equal(b["dQ"][~t], before[w]["dQ"][~t])  # rows of no fragment untouched
        assert torch.equal(b["O"][~t], before[w]["O"][~t])
        assert err(b["dK"], r["dK"]) < tol and err(b["dV"], r["dV"]) < tol, w
        tk = touched_k[w]
        assert torch.equal(b["dK"][~tk], before[w]["dK"][~tk])


def test_empty_and_one_row_fragments_and_all_pairs_are_covered():
    # The random chunks above are what they claim to be: every pair, empty, one-row and multi-block
    # fragments, shared key rows.
    pairs, sizes, shared = set(), set(), 0
    for seed, hq, hkv, *_ in CASES:
        calls = random_chunk(np.random.default_rng(seed), hq, hkv)[0]
        table, bounds = chunk_descriptors(calls)
        pairs |= {g for g in range(4) if bounds[g + 1] > bounds[g]}
        sizes |= {int(x) for x in table[:, 7] - table[:, 6]}
        sizes |= {0 for c in calls for f in c[2] if f[3] == f[4]}
        kv = [(c[1][0], f[1]) for c in calls for f in c[2]]
        shared += len(kv) - len(set(kv))
    assert pairs == {0, 1, 2, 3}
    assert 0 in sizes and 1 in sizes and max(sizes) > 2 * BLOCK * (8 if ON_DEVICE else 1)
    assert shared > 0


def test_deterministic_mode_writes_each_key_once_per_wave():
    # Fragments sharing key rows land in different waves; disjoint ones share a wave.
    rows = np.array([[0, 8, 0, 8, 0, 0, 0, 10, 4, 2],     # keys rows 0..9, heads 0-1
                     [32, 8, 0, 8, 10, 0, 10, 20, 4, 2],  # same sample's keys: overlaps the first
                     [0, 8, 2, 8, 20, 0, 0, 10, 4, 2],    # heads 2-3 of the same rows: disjoint
                     [0, 8, 0, 8, 30, 40, 0, 5, 4, 2]], dtype=np.int64)  # rows 40..44: disjoint
    assert ta._waves(ta._key_rects(rows, np.zeros(4, np.int64))) == [[0, 2, 3], [1]]


# ---------------------------------------------------------------- libra.torch.attention on the backend

POOL_CASES = [  # run_attention keywords (tests/python/test_torch.py), P 2 x CP 2, window W = 4 or none
    dict(name="tap M1 W4 fp32", mode="tap", chunks=1, window=4),
    dict(name="tap-topo M3 W4 bf16", mode="tap-topo", chunks=3, hq=6, hkv=2, shards=2, window=4, dtype="bfloat16"),
    dict(name="tap M3 fp32 GQA 3", mode="tap", chunks=3, hq=6, hkv=2, shards=2),
    dict(name="tap-topo M1 kv prefix fp32", mode="tap-topo", chunks=1, hq=8, hkv=2, shards=4, kv_prefix=True),
]


def pool_body(rank, world, relay_case):
    from test_relay import run_case
    from test_torch import WORKER, pinned, run_attention, POOLS
    out = {"errors": {}, "launches": {}, "tables": {}}
    with pinned("triton"):
        for case in POOL_CASES:
            kw = {k: v for k, v in case.items() if k != "name"}
            errs, _, padded = run_attention(rank, 2, 2, POOLS, **kw)
            out["errors"][case["name"]] = (kw.get("dtype", "float32"), errs, padded)
            rt = WORKER.runtime
            out["tables"][case["name"]] = tables_from_the_index_arrays(rt)
            # One forward and one backward ran: each pass's tables' launches of that pass.
            out["launches"][case["name"]] = (rt._triton_launches, sum(
                t.launches()[key[0]] for key, t in rt._triton_tables.items()), kw["chunks"])
        name, pool, kw = relay_case
        out["relay"] = run_case(rank, pool, kw)
    return out


def tables_from_the_index_arrays(rt):
    """Why not, or None when every work table the backend kept holds the table chunk_descriptors (the
    reference) builds from the chunk's calls, and reads it from the runtime's index arrays (a view of
    this pass's or, shared, the other pass's descriptors on that device), not from a copy of its own."""
    for (p, m, device, *_), t in rt._triton_tables.items():
        table, bounds = chunk_descriptors(rt.schedule["calls"][p][m])
        if not (np.array_equal(t.table, table) and np.array_equal(t.bounds, bounds)):
            return f"pass {p} chunk {m}: the table differs from chunk_descriptors"
        if not torch.equal(t.desc, torch.from_numpy(table).to(device)):
            return f"pass {p} chunk {m}: the device table differs from chunk_descriptors"
        # The view object itself: on the CPU a copy of a host view could share its memory.
        if not any(t.desc is rt.on(device)[q]["descriptors"][m][0] for q in (0, 1)):
            return f"pass {p} chunk {m}: the device table is not the index arrays' view"
    return None if rt._triton_tables else "no tables"


@pytest.fixture(scope="module")
def pool_results():
    if ON_DEVICE:
        pytest.skip("the pool cases run CPU tensors (interpreter only)")
    from dist_util import run
    from test_relay import CASES as RELAY_CASES, relaying_pool
    name, kw = RELAY_CASES[3]  # tap-topo M1 on two nodes of two GPUs
    return run("inprocess", pool_body, 4, (name, relaying_pool(kw), kw))


def test_attention_on_the_triton_backend_matches_plain_attention(pool_results):
    for r in pool_results:
        for name, (dtype, errs, padded) in r["errors"].items():
            assert max(errs.values()) < {"float32": 2e-5, "bfloat16": 2e-2}[dtype], (name, errs)
            assert padded, name
        rel = r["relay"]
        assert max(rel["errors"]) < 2e-5 and rel["same_as_direct"] and rel["relayed"], rel


def test_the_backend_reads_the_descriptor_tables_the_binding_built(pool_results):
    for r in pool_results:
        for name, why in r["tables"].items():
            assert why is None, (name, why)


def test_one_launch_per_chunk_buffer_pair_and_kernel(pool_results):
    # Forward: one launch per non-empty buffer pair of a chunk (at most 4 M); backward: delta, dQ
    # and dK/dV per pair (atomic mode: one dK/dV launch). The count the backend made is the count its
    # tables give.
    for r in pool_results:
        for name, (made, from_tables, chunks) in r["launches"].items():
            assert made == from_tables, name
            assert 0 < made <= 4 * chunks + 3 * 4 * chunks, name


def compiled_body(rank, world):
    import libra
    import libra.torch as lt
    from test_torch import pinned
    group, _ = lt.pool_group(1, 1)
    plan = libra.make_plan([[20, 12]], seq_len=32, cp=1, block_size=8, head_shards=1, heads_q=4, heads_kv=2,
                           head_dim=16, chunks=1, mode="tap")
    rt = lt.PlanRuntime(plan, group)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(32, h, 16, generator=g).requires_grad_() for h in (4, 2, 2))
    compiled = torch.compile(lambda a, b, c, r: lt.attention(a, b, c, r), fullgraph=True, backend="aot_eager")
    res = []
    with pinned("triton"):
        for fn in (compiled, lambda a, b, c, r: lt.attention(a, b, c, r)):
            q.grad = k.grad = v.grad = None
            o = fn(q, k, v, rt)
            o.square().sum().backward()
            res.append([o.detach(), q.grad, k.grad, v.grad])
    return {"equal": [bool(torch.equal(a, b)) for a, b in zip(*res)], "launches": rt._triton_launches}


def test_torch_compile_fullgraph_runs_the_triton_kernels_through_the_custom_op():
    # libra::attention runs the eager call inside; the compiled graph gives the eager results bit
    # for bit, and the kernels really ran (a forward and a backward, twice: 1 + 3 launches each).
    if ON_DEVICE:
        pytest.skip("CPU tensors (interpreter only)")
    from dist_util import run
    r = run("inprocess", compiled_body, 1)[0]
    assert all(r["equal"]), r
    assert r["launches"] == 8, r


@pytest.mark.parametrize("block, workers", [(32, [3]), (1024, range(8))])
def test_the_index_expansion_kernel_matches_numpy(block, workers, monkeypatch):
    # libra.torch.triton_index (index.expand on CUDA) on a pool's index arrays against the runs
    # expanded one at a time in numpy; block 32 puts several runs (about 20 entries each) in one
    # program, 1024 many (a few programs a worker: the interpreter is slow).
    import libra  # noqa: PLC0415
    from libra import _libra  # noqa: PLC0415
    from libra.torch import triton_index  # noqa: PLC0415
    monkeypatch.setattr(triton_index, "BLOCK", block)
    plan = libra.make_plan([[10, 30, 20], [64], [5, 5, 40, 3], [33, 17]], seq_len=64, cp=2, block_size=8,
                           head_shards=2, heads_q=8, heads_kv=2, head_dim=16, chunks=2, mode="tap-topo")
    for w in workers:
        runs, host, layout = _libra.rank_program(plan, w).index_arrays()
        want, at = [], 0
        for first, count, base, ln, stride in runs.tolist():
            assert first == at
            want.extend(base + (k // ln) * stride + k % ln for k in range(count))
            at += count
        cols = torch.from_numpy(host[layout["data"]:].reshape(5, layout["runs"]).copy()).to(DEVICE)
        assert triton_index.expand(cols, layout["rows"]).cpu().tolist() == want, w
