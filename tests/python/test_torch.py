"""libra.torch on CPU: attention forward and backward against plain attention in float64, every
distributed body over each communicator (gloo processes and the in-process pool, dist_util.run).

Each run executes many cases on one pool of workers (process start-up
dominates on a small machine). The reference is written here in torch:
block-diagonal causal attention per sample over the whole packed sequence
(tests/python/dist_util.py), in float64 from the same (rounded) inputs.
"""
import contextlib
import threading

import pytest

torch = pytest.importorskip("torch")
import torch.utils.checkpoint  # noqa: E402

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import backends  # noqa: E402
from dist_util import COMMUNICATORS, all_reduce, barrier, planner_runs_make_plan, reference_attention, rel_err, run  # noqa: E402

L = 64
POOLS = [[10, 30, 20], [64], [5, 5, 40, 3], [33, 17], [64], [1, 2, 3, 50], [8] * 8, [60]]
TOL = {"float32": 2e-5, "bfloat16": 2e-2}


def slot_data(pool_index, slot, hq, hkv, d, dtype, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + 100 * pool_index + slot)
    q = torch.randn(L, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(L, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(L, hkv, d, generator=g, dtype=torch.float64)
    grad = torch.randn(L, hq, d, generator=g, dtype=torch.float64)
    # The reference sees the same rounded inputs as libra.
    return [x.to(dtype).to(torch.float64) for x in (q, k, v)] + [grad]


class _PerWorker(threading.local):
    """What a body keeps between its calls, per worker (in-process workers share the module)."""
    runtime = None  # the runtime of run_attention's last case
    stand_in_calls = 0  # calls of the flash_attn stand-in


WORKER = _PerWorker()


def run_attention(rank, P, cp, pools, *, mode="tap", chunks=1, hq=4, hkv=2, d=16, block=8, shards=2,
                  window=None, dtype="float32", dedup=False, checkpoint=False, tau=0.03, exchange="auto",
                  kv_prefix=False):
    """One case on this rank: returns errors of o, dq, dk, dv and the raw results."""
    dt = getattr(torch, dtype)
    group, worker = lt.pool_group(P, cp)
    pool_index = rank // (P * cp)
    pool = pools[pool_index * P:(pool_index + 1) * P]
    plan = libra.make_plan(pool, seq_len=L, cp=cp, block_size=block, head_shards=shards, heads_q=hq,
                           heads_kv=hkv, head_dim=d, chunks=chunks, mode=mode, window=window, tau=tau,
                           dtype="fp32" if dtype == "float32" else "bf16", dedup_per_kv_head=dedup,
                           kv_prefix=kv_prefix)
    rt = lt.PlanRuntime(plan, group, exchange=exchange)
    WORKER.runtime = rt
    slot, cpr = worker // cp, worker % cp
    Q, K, V, G = slot_data(pool_index, slot, hq, hkv, d, dt)
    home = slice(cpr * (L // cp), (cpr + 1) * (L // cp))
    q, k, v = (x[home].to(dt).requires_grad_() for x in (Q, K, V))
    if checkpoint:
        o = torch.utils.checkpoint.checkpoint(lambda a, b, c: lt.attention(a, b, c, rt, window=window), q, k, v,
                                              use_reentrant=False)
    else:
        o = lt.attention(q, k, v, rt, window=window)
    (o.to(torch.float64) * G[home]).sum().backward()
    Qr, Kr, Vr = (x.clone().requires_grad_() for x in (Q, K, V))
    ref = reference_attention(Qr, Kr, Vr, pool[slot], window=window)
    (ref * G).sum().backward()
    errs = {"o": rel_err(o, ref[home]), "dq": rel_err(q.grad, Qr.grad[home]),
            "dk": rel_err(k.grad, Kr.grad[home]), "dv": rel_err(v.grad, Vr.grad[home])}
    pad = sum(pool[slot])
    padded = o.detach()[max(0, pad - cpr * (L // cp)):] if pad < (cpr + 1) * (L // cp) else o.detach()[:0]
    return errs, (o.detach(), q.grad, k.grad, v.grad), bool((padded == 0).all())


CASES_4 = [
    dict(name="tap M1 fp32 GQA", mode="tap", chunks=1),
    dict(name="tap M2 bf16", mode="tap", chunks=2, dtype="bfloat16"),
    dict(name="tap M4 fp32 h_q 8", mode="tap", chunks=4, hq=8, hkv=2, shards=2),
    dict(name="tap-split M2 fp32", mode="tap-split", chunks=2, hq=8, hkv=2, shards=4, tau=0.0),
    dict(name="ulysses fp32", mode="ulysses", chunks=2, hq=4, hkv=4),
    dict(name="tap-topo M2 fp32", mode="tap-topo", chunks=2, hq=8, hkv=2, shards=4),
    dict(name="window 7 tap M2 fp32", mode="tap", chunks=2, window=7),
    dict(name="window 5 tap-split bf16", mode="tap-split", chunks=1, window=5, dtype="bfloat16"),
    dict(name="dedup per kv head H>h_kv", mode="tap", chunks=1, hq=8, hkv=2, shards=4, dedup=True),
    dict(name="checkpoint tap M2 fp32", mode="tap", chunks=2, checkpoint=True),
    dict(name="kv prefix tap-topo M4 fp32", mode="tap-topo", chunks=4, hq=8, hkv=2, shards=2, kv_prefix=True),
    dict(name="kv prefix window 7 tap bf16", mode="tap", chunks=2, window=7, dtype="bfloat16", kv_prefix=True),
]


def body_4(rank, world):
    out = {"errors": {}, "padding_zero": True}
    for case in CASES_4:
        kw = {k: v for k, v in case.items() if k != "name"}
        errs, _, padded = run_attention(rank, 2, 2, POOLS, **kw)
        out["errors"][case["name"]] = (kw.get("dtype", "float32"), errs)
        out["padding_zero"] &= padded
    # Bitwise determinism: the same case twice; and with vs without checkpointing.
    a = run_attention(rank, 2, 2, POOLS, mode="tap", chunks=2, dtype="bfloat16")[1]
    b = run_attention(rank, 2, 2, POOLS, mode="tap", chunks=2, dtype="bfloat16")[1]
    c = run_attention(rank, 2, 2, POOLS, mode="tap", chunks=2, dtype="bfloat16", checkpoint=True)[1]
    # The index-tensor exchanges (what CUDA tensors use) move the same bytes as the C++ programs.
    i = run_attention(rank, 2, 2, POOLS, mode="tap", chunks=2, dtype="bfloat16", exchange="index")[1]
    out["index_equal"] = all(torch.equal(x, y) for x, y in zip(a, i))
    out["deterministic"] = all(torch.equal(x, y) for x, y in zip(a, b))
    out["checkpoint_equal"] = all(torch.equal(x, y) for x, y in zip(a, c))
    out["mismatch"] = fingerprint_mismatch(rank)
    out["window_refused"] = window_refused(rank)
    out["layer"] = layer_grads(rank, world)
    out["planner_runtime"] = planner_runtime(rank)
    out["flash"] = flash_path(rank)
    out["sdpa"] = sdpa_path(rank)
    return out


# ---------------------------------------------------------------- the CUDA tensors' path on CPU

def stand_in_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1)):
    """flash_attn_varlen_func's contract, the part libra.torch uses, in plain torch (differentiable):
    q [total_q, h_q, d], k/v [total_k, h_kv, d], sequence i = rows cu_seqlens[i] .. cu_seqlens[i+1];
    query head h uses KV head h // (h_q / h_kv); causal is bottom-right aligned (query i of s_q sees
    keys j <= i + s_k - s_q), window_size (left, right) bounds j to [i' - left, i' + right]; the
    output has q's dtype, computed in fp32."""
    WORKER.stand_in_calls += 1
    assert dropout_p == 0.0 and causal
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and len(cu_seqlens_q) == len(cu_seqlens_k)
    assert q.device == k.device == v.device == cu_seqlens_q.device and q.shape[1] % k.shape[1] == 0
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert cq[-1] == q.shape[0] and ck[-1] == k.shape[0] == v.shape[0]
    # flash_attn sizes its grid from the max lengths: too small would silently drop rows.
    assert max_seqlen_q >= max(b - a for a, b in zip(cq, cq[1:]))
    assert max_seqlen_k >= max(b - a for a, b in zip(ck, ck[1:]))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    ratio = q.shape[1] // k.shape[1]
    left, right = window_size[0], 0  # causal: flash_attn sets the right window to 0
    out = []
    for i in range(len(cq) - 1):
        qs = q[cq[i]:cq[i + 1]].float()
        ks = k[ck[i]:ck[i + 1]].float().repeat_interleave(ratio, dim=1)
        vs = v[ck[i]:ck[i + 1]].float().repeat_interleave(ratio, dim=1)
        sq, sk = qs.shape[0], ks.shape[0]
        pos = torch.arange(sq)[:, None] + (sk - sq)
        j = torch.arange(sk)[None, :]
        mask = j <= pos + right
        if left >= 0:
            mask &= j >= pos - left
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
        out.append(torch.einsum("hqk,khd->qhd", p, vs))
    return torch.cat(out).to(q.dtype)


CASES_FLASH = [
    dict(name="flash tap M2 fp32 GQA", mode="tap", chunks=2),
    dict(name="flash tap M1 bf16", mode="tap", chunks=1, dtype="bfloat16"),
    dict(name="flash tap-split M2 fp32", mode="tap-split", chunks=2, hq=8, hkv=2, shards=4, tau=0.0),
    dict(name="flash ulysses fp32", mode="ulysses", chunks=1, hq=4, hkv=4),
    dict(name="flash window 7 tap M2 fp32", mode="tap", chunks=2, window=7),
    dict(name="flash dedup per kv head", mode="tap", chunks=1, hq=8, hkv=2, shards=4, dedup=True),
    dict(name="flash kv prefix tap-topo M2 fp32", mode="tap-topo", chunks=2, hq=8, hkv=2, shards=4, kv_prefix=True),
]


@contextlib.contextmanager
def pinned(name, flash_impl=None):
    """Pins compute backend `name` (and the flash-attn backend's function) for a body's cases. The pin
    is the process's, which in-process workers share: each reads the old one before any sets it, and
    it goes once every worker is done."""
    flash = backends.get("flash-attn")
    saved = backends.forced(), flash.impl

    def restore():
        backends.force(saved[0])
        flash.impl = saved[1]

    barrier()
    backends.force(name)
    flash.impl = flash_impl or saved[1]
    try:
        yield
    except BaseException:
        restore()  # without barriers: the other workers may never reach them
        raise
    barrier()
    restore()
    barrier()


def flash_path(rank):
    """The CUDA tensors' path (flash_attn_varlen_func calls, flash backward through autograd,
    index-tensor exchanges) forced on CPU tensors with the stand-in above, against float64 plain
    attention; also whether the stand-in really ran and how many calls read home buffers in place."""
    out = {"errors": {}, "in_place_calls": 0}
    with pinned("flash-attn", stand_in_flash_attn_varlen_func):
        for case in CASES_FLASH:
            kw = {k: v for k, v in case.items() if k != "name"}
            before = WORKER.stand_in_calls
            errs, _, padded = run_attention(rank, 2, 2, POOLS, **kw)
            errs["stand_in_calls"] = WORKER.stand_in_calls - before
            out["errors"][case["name"]] = (kw.get("dtype", "float32"), errs, padded)
            calls = WORKER.runtime.schedule["calls"]
            out["in_place_calls"] += sum(c[3] or c[4] for per_pass in calls for chunk in per_pass for c in chunk)
        # A second step on the last runtime reuses its per-call index tensors (built once per pass,
        # chunk and device) and gives the same numbers bit for bit.
        rt = WORKER.runtime
        built = len(rt._varlen_meta)
        results = []
        for _ in range(2):
            q, k, v = (torch.randn(rt.home_rows, h, rt.head_dim, generator=torch.Generator().manual_seed(s))
                       .requires_grad_() for s, h in ((1, rt.heads_q), (2, rt.heads_kv), (3, rt.heads_kv)))
            o = lt.attention(q, k, v, rt)
            o.square().sum().backward()
            results.append([o.detach(), q.grad, k.grad, v.grad])
        out["repeat"] = {"built_before": built, "built_after": len(rt._varlen_meta),
                         "identical": all(torch.equal(a, b) for a, b in zip(*results))}
    return out


def sdpa_path(rank):
    """The portable fallback (scaled_dot_product_attention per sample) forced on CPU tensors, through
    the same engine code as the flash path (index-tensor exchanges, autograd recompute)."""
    out = {}
    with pinned("sdpa"):
        for case in CASES_FLASH:
            kw = {k: v for k, v in case.items() if k != "name"}
            errs, _, padded = run_attention(rank, 2, 2, POOLS, **kw)
            out[case["name"]] = (kw.get("dtype", "float32"), errs, padded)
    return out


def planner_runtime(rank):
    """Planner(worker=...).runtime(n, group) (plan and schedule from the background thread) runs
    exactly what a PlanRuntime of make_plan(sampler.pool(n)) runs."""
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, chunks=2,
              dtype="fp32")
    return planner_runs_make_plan(rank, POOLS, kw)


def fingerprint_mismatch(rank):
    group, _ = lt.pool_group(2, 2)
    plan = libra.make_plan(POOLS[:2], seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, tau=0.5 if rank == 3 else 0.03)
    try:
        lt.PlanRuntime(plan, group)
    except ValueError as e:
        return str(e)
    return None


def window_refused(rank):
    group, _ = lt.pool_group(2, 2)
    plan = libra.make_plan(POOLS[:2], seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, window=9)
    rt = lt.PlanRuntime(plan, group)
    x = torch.zeros(L // 2, 4, 16)
    y = torch.zeros(L // 2, 2, 16)
    msgs = []
    try:
        lt.attention(x, y, y, rt, window=5)  # the plan's is 9
    except ValueError as e:
        msgs.append(str(e))
    try:  # a bad shape on one rank only: every rank raises the same line, none waits in the exchange
        lt.attention(x[:-1] if rank == 2 else x, y, y, rt, window=9)
    except ValueError as e:
        msgs.append(str(e))
    return msgs


def layer_grads(rank, world, P=2, cp=2, dm=32, hq=4, hkv=2, d=8):
    """Q/K/V/O projections around attention; weight grads all-reduced over every rank vs the reference."""
    group, worker = lt.pool_group(P, cp)
    plan = libra.make_plan(POOLS[:P], seq_len=L, cp=cp, block_size=8, head_shards=2, heads_q=hq, heads_kv=hkv,
                           head_dim=d, chunks=2, dtype="fp32")
    rt = lt.PlanRuntime(plan, group)
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(dm, n, generator=g, dtype=torch.float64) / dm ** 0.5
               for n in (hq * d, hkv * d, hkv * d)] + [torch.randn(hq * d, dm, generator=g, dtype=torch.float64)]
    xs = [torch.randn(L, dm, generator=g, dtype=torch.float64) for _ in range(P)]
    gs = [torch.randn(L, dm, generator=g, dtype=torch.float64) for _ in range(P)]

    def layer(x, ws, attn):
        wq, wk, wv, wo = ws
        n = x.shape[0]
        o = attn((x @ wq).view(n, hq, d), (x @ wk).view(n, hkv, d), (x @ wv).view(n, hkv, d))
        return o.reshape(n, hq * d) @ wo

    slot, cpr = worker // cp, worker % cp
    home = slice(cpr * (L // cp), (cpr + 1) * (L // cp))
    ws = [w.to(torch.float32).requires_grad_() for w in weights]
    out = layer(xs[slot][home].to(torch.float32), ws, lambda q, k, v: lt.attention(q, k, v, rt))
    (out.to(torch.float64) * gs[slot][home]).sum().backward()
    grads = [w.grad.clone() for w in ws]
    for t in grads:
        all_reduce(t)  # the DP (x CP) gradient all-reduce
    wr = [w.clone().requires_grad_() for w in weights]
    for p in range(P):
        ref = layer(xs[p], wr, lambda q, k, v, p=p: reference_attention(q, k, v, POOLS[p]))
        (ref * gs[p]).sum().backward()
    return max(rel_err(a, b.grad) for a, b in zip(grads, wr))


@pytest.fixture(scope="module", params=COMMUNICATORS)
def four(request):
    return run(request.param, body_4, 4)


def test_attention_matches_plain_attention_on_4_ranks(four):
    for r in four:
        for name, (dtype, errs) in r["errors"].items():
            assert max(errs.values()) < TOL[dtype], (name, errs)
        assert r["padding_zero"]


def test_determinism_and_checkpoint(four):
    assert all(r["deterministic"] for r in four)
    assert all(r["checkpoint_equal"] for r in four)
    assert all(r["index_equal"] for r in four)


def test_fingerprint_mismatch_raises_the_same_line_on_every_rank(four):
    msgs = [r["mismatch"] for r in four]
    assert msgs[0] is not None and "fingerprint mismatch" in msgs[0] and "\n" not in msgs[0]
    assert all(m == msgs[0] for m in msgs)


def test_window_differing_from_the_plan_is_refused(four):
    assert all(len(r["window_refused"]) == 2 and "window" in r["window_refused"][0] for r in four)


def test_a_bad_call_on_one_rank_fails_on_every_rank_alike(four):
    msgs = [r["window_refused"][1] for r in four]
    assert "group rank 2" in msgs[0] and "shape" in msgs[0] and all(m == msgs[0] for m in msgs)


def test_the_cuda_path_forced_on_cpu_matches_plain_attention(four):
    # Every rank computes something in every case, so each ran the stand-in for flash_attn.
    for r in four:
        for name, (dtype, errs, padded) in r["flash"]["errors"].items():
            assert errs.pop("stand_in_calls") > 0, name
            assert max(errs.values()) < TOL[dtype], (name, errs)
            assert padded, name
    # The schedules read home data in place (q_home / kv_home calls), so the cases above test it.
    assert sum(r["flash"]["in_place_calls"] for r in four) > 0
    for r in four:
        rep = r["flash"]["repeat"]
        assert rep["identical"], rep
        assert 0 < rep["built_before"] == rep["built_after"], rep


def test_the_portable_fallback_matches_plain_attention(four):
    for r in four:
        for name, (dtype, errs, padded) in r["sdpa"].items():
            assert max(errs.values()) < TOL[dtype], (name, errs)
            assert padded, name


def test_backend_selection_by_device_dtype_and_availability():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert backends.select(cpu, torch.float32).name == "libra-cpu"
    assert backends.select(cpu, torch.bfloat16).name == "libra-cpu"
    assert backends.select(cpu, torch.float16).name == "sdpa"  # the kernel has no fp16
    assert backends.select(cpu, torch.float64).name == "sdpa"
    # CUDA tensors (selection only; nothing runs): flash-attn when importable, else torch's varlen_attn
    # where this torch has it, else the fallback; fp32 only on the fallback.
    flash, varlen = backends.get("flash-attn"), backends.get("torch-varlen")
    # libra's Triton kernels come first on a CUDA device (none here); CPU tensors only when pinned,
    # under TRITON_INTERPRET=1 (tests/python/test_triton.py).
    if not torch.cuda.is_available():
        assert backends.get("triton").unavailable(cuda, torch.bfloat16) is not None
    if not _has_flash_attn():
        assert "flash_attn" in flash.unavailable(cuda, torch.bfloat16)
        want = "torch-varlen" if varlen.unavailable(cuda, torch.bfloat16) is None else "sdpa"
        assert backends.select(cuda, torch.bfloat16).name == want
    assert backends.select(cuda, torch.float32).name == "sdpa"
    saved = flash.impl
    flash.impl = stand_in_flash_attn_varlen_func
    try:
        assert backends.select(cuda, torch.bfloat16).name == "flash-attn"
    finally:
        flash.impl = saved
    # Pinning: by force() or LIBRA_TORCH_BACKEND; an unknown name, or a pinned backend that cannot run,
    # is one line naming it.
    previous = backends.force("sdpa")
    try:
        assert backends.select(cpu, torch.float32).name == "sdpa"
        backends.force("libra-cpu")
        with pytest.raises(ValueError, match=r"^libra.torch.attention: no compute backend runs torch.float16 on cpu "
                                             r"\(libra-cpu: takes float32 or bfloat16, not torch.float16\)$"):
            backends.select(cpu, torch.float16)
    finally:
        backends.force(previous)
    with pytest.raises(ValueError, match="backend 'nope': must be one of triton, libra-cpu, flash-attn, torch-varlen, sdpa"):
        backends.force("nope")


def test_the_fallback_gives_the_output_and_lse_of_plain_attention():
    # Two packed samples of different lengths, bottom-right causal (queries are the last rows of their
    # sample's keys), GQA 4:2, window 3 and none, against the flash_attn stand-in and an LSE by hand.
    g = torch.Generator().manual_seed(7)
    nq, nk = [2, 5], [6, 5]
    cu_q, cu_k = [0, 2, 7], [0, 6, 11]
    q = torch.randn(7, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(11, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(11, 2, 8, generator=g, dtype=torch.float64)
    t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    for window in (None, 3):
        o, lse = backends.get("sdpa").varlen(q, k, v, t(cu_q), t(cu_k), 5, 6, None, window, (cu_q, cu_k))
        ws = (-1, -1) if window is None else (window - 1, 0)
        want = stand_in_flash_attn_varlen_func(q, k, v, t(cu_q), t(cu_k), 5, 6, causal=True, window_size=ws)
        assert torch.allclose(o, want.to(o.dtype), atol=1e-12), window
        for i in range(2):
            qs, ks = q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]].repeat_interleave(2, dim=1)
            pos = torch.arange(nq[i])[:, None] + nk[i] - nq[i]
            j = torch.arange(nk[i])[None, :]
            mask = (j <= pos) & ((j > pos - window) if window else True)
            sc = torch.einsum("qhd,khd->hqk", qs, ks) / 8 ** 0.5
            ref = torch.logsumexp(sc.masked_fill(~mask, float("-inf")), dim=-1)
            assert torch.allclose(lse[:, cu_q[i]:cu_q[i + 1]].double(), ref, atol=1e-5), (window, i)


def test_planner_runtime_is_the_same_runtime(four):
    assert all(r["planner_runtime"] for r in four)


def test_layer_weight_grads_match(four):
    assert all(r["layer"] < 1e-5 for r in four), [r["layer"] for r in four]


CASES_8 = [
    dict(name="P4 CP2 tap M2 fp32", P=4, cp=2, mode="tap", chunks=2),
    dict(name="P4 CP2 tap-split M1 bf16", P=4, cp=2, mode="tap-split", chunks=1, dtype="bfloat16"),
    dict(name="P2 CP4 tap M2 fp32", P=2, cp=4, mode="tap", chunks=2, block=4),
    dict(name="P2 CP4 ulysses fp32", P=2, cp=4, mode="ulysses", chunks=1, hq=4, hkv=4),
    dict(name="2 pools P2 CP2 tap M2 fp32", P=2, cp=2, mode="tap", chunks=2),
]


def body_8(rank, world):
    out = {}
    for case in CASES_8:
        kw = {k: v for k, v in case.items() if k not in ("name", "P", "cp")}
        errs, _, _ = run_attention(rank, case["P"], case["cp"], POOLS, **kw)
        out[case["name"]] = (kw.get("dtype", "float32"), errs)
    return out


@pytest.mark.parametrize("comm", COMMUNICATORS)
def test_attention_on_8_ranks(comm):
    for r in run(comm, body_8, 8):
        for name, (dtype, errs) in r.items():
            assert max(errs.values()) < TOL[dtype], (name, errs)


def test_sampler_resume_and_pools():
    seqs = libra.pack([int(x) for x in torch.randint(1, 60, (400,), generator=torch.Generator().manual_seed(3))],
                      L)["sequences"]
    dp, P, gbs = 4, 2, 8
    samplers = [lt.PlacementBatchSampler(seqs, gbs=gbs, dp=dp, pool_size=P, dp_rank=r) for r in range(dp)]
    full = [list(s) for s in samplers]
    core = libra.PlacementSampler(seqs, gbs, dp, P)
    for n in range(len(samplers[0])):
        step, ga = divmod(n, gbs // dp)
        order = list(core.at(step)["order"])
        assert [full[r][n][0] for r in range(dp)] == order[ga * dp:(ga + 1) * dp]
        for r in range(dp):
            pool = samplers[r].pool_indices(n)
            assert full[r][n][0] == pool[r % P] and len(pool) == P
    # Resume mid-run from a state dict: the rest of the sequence is identical.
    s = lt.PlacementBatchSampler(seqs, gbs=gbs, dp=dp, pool_size=P, dp_rank=1)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    state = s.state_dict()
    t = lt.PlacementBatchSampler(seqs, gbs=gbs, dp=dp, pool_size=P, dp_rank=1)
    t.load_state_dict(state)
    assert head + list(t) == full[1]
    loader = torch.utils.data.DataLoader(list(range(len(seqs))), batch_sampler=t)
    assert list(loader) == []  # exhausted
    t.load_state_dict({"position": 0})
    assert [int(b[0]) for b in torch.utils.data.DataLoader(list(range(len(seqs))), batch_sampler=t)] == \
        [b[0] for b in full[1]]
    with pytest.raises(ValueError):
        t.load_state_dict({"position": -1})


def test_planner_plans_ahead_on_a_thread():
    seqs = libra.pack(list(range(1, 200)), L)["sequences"]
    s = lt.PlacementBatchSampler(seqs, gbs=4, dp=2, pool_size=2, dp_rank=0)
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16)
    planner = lt.Planner(s, **kw)
    try:
        for n in range(4):
            assert planner.get(n) == libra.make_plan(s.pool(n), **kw)
            assert n + 1 in planner._futures  # the next batch is being planned
    finally:
        planner.close()


def test_planner_refuses_a_batch_out_of_range():
    seqs = libra.pack(list(range(1, 200)), L)["sequences"]
    s = lt.PlacementBatchSampler(seqs, gbs=4, dp=2, pool_size=2, dp_rank=0)
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16)
    planner = lt.Planner(s, **kw)
    try:
        for n in (len(s), len(s) + 99, -1):
            with pytest.raises(ValueError) as e:
                planner.get(n)
            assert str(e.value) == f"Planner: batch {n} must be in [0, {len(s)})"
        assert planner.get(len(s) - 1) == libra.make_plan(s.pool(len(s) - 1), **kw)  # still usable
    finally:
        planner.close()


def _has_flash_attn():
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_attention_without_flash_attn_falls_back():
    if _has_flash_attn():
        pytest.skip("flash_attn is importable")
    assert backends.select(torch.device("cuda"), torch.bfloat16).name in ("torch-varlen", "sdpa")


def body_cuda(rank, world, per_gpu):
    """P = world, CP = 1; CUDA bf16 attention vs the float64 reference. per_gpu: one NCCL process per
    GPU; else every worker of the in-process pool on the current GPU."""
    if per_gpu:
        torch.cuda.set_device(rank)
    errs, _, _ = run_attention_cuda(rank, world)
    return errs


def run_attention_cuda(rank, P):
    group, worker = lt.pool_group(P, 1)
    pool = POOLS[:P]
    plan = libra.make_plan(pool, seq_len=L, cp=1, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=64, chunks=2)
    rt = lt.PlanRuntime(plan, group)
    Q, K, V, G = slot_data(0, worker, 4, 2, 64, torch.bfloat16)
    q, k, v = (x.to(torch.bfloat16).cuda().requires_grad_() for x in (Q, K, V))
    o = lt.attention(q, k, v, rt)
    (o.double() * G.cuda()).sum().backward()
    Qr, Kr, Vr = (x.clone().requires_grad_() for x in (Q, K, V))
    ref = reference_attention(Qr, Kr, Vr, pool[worker])
    (ref * G).sum().backward()
    return ({"o": rel_err(o.cpu(), ref), "dq": rel_err(q.grad.cpu(), Qr.grad), "dk": rel_err(k.grad.cpu(), Kr.grad),
             "dv": rel_err(v.grad.cpu(), Vr.grad)}, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("comm", ["nccl", "inprocess"])
def test_cuda_attention_matches_plain_attention(comm):
    import dist_util  # noqa: PLC0415

    if comm == "inprocess":  # a whole pool of 2 on one GPU
        results = run("inprocess", body_cuda, 2, False)
    else:
        if torch.cuda.device_count() < 2:
            pytest.skip("one GPU: NCCL needs a GPU per process (the in-process case runs the pool)")
        dist_util.BACKEND = "nccl"
        try:
            results = dist_util.spawn(body_cuda, 2, True)
        finally:
            dist_util.BACKEND = "gloo"
    for errs in results:
        assert max(errs.values()) < TOL["bfloat16"], errs


def test_the_tap_split_case_really_splits_tiles():
    # The distributed "tap-split M2 fp32" case above relies on this plan cutting tiles into pieces.
    plan = libra.make_plan(POOLS[:2], seq_len=L, cp=2, block_size=8, head_shards=4, heads_q=8, heads_kv=2,
                           head_dim=16, chunks=2, mode="tap-split", tau=0.0, dtype="fp32")
    assert plan.tiles["piece"].max() > 0


def test_the_kv_prefix_tap_topo_case_really_splits_tiles():
    # So does "kv prefix tap-topo M4 fp32": tap-topo splits a tile that fits no worker whole.
    plan = libra.make_plan(POOLS[:2], seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=8, heads_kv=2,
                           head_dim=16, chunks=4, mode="tap-topo", kv_prefix=True, dtype="fp32")
    assert plan.tiles["piece"].max() > 0
    assert plan.imbalance <= 0.03


# ---------------------------------------------------------------- elastic pools (vrsp-elastic)

# One GA step of 4 sequences (DP 4, P 2: two pools): the [64] outlier alone costs 4096 of the
# window's 4992, so VRSP leaves its pool 69% above the mean and vrsp-elastic fuses both pools.
ELASTIC_WINDOW = [[64], [8] * 8, [4] * 16, [2] * 32]


def fwd_bwd_errors(rt, cp, seqs, ids, worker):
    """attention fwd+bwd of this worker (slot worker // cp of the plan's pool `seqs`) vs the float64
    reference; inputs seeded by the sequence's window index `ids[slot]`, so they do not depend on
    which pool or domain runs it."""
    slot, cpr = worker // cp, worker % cp
    Q, K, V, G = slot_data(0, ids[slot], 4, 2, 16, torch.float32)
    home = slice(cpr * (L // cp), (cpr + 1) * (L // cp))
    q, k, v = (x[home].to(torch.float32).requires_grad_() for x in (Q, K, V))
    o = lt.attention(q, k, v, rt)
    (o.to(torch.float64) * G[home]).sum().backward()
    Qr, Kr, Vr = (x.clone().requires_grad_() for x in (Q, K, V))
    ref = reference_attention(Qr, Kr, Vr, seqs[slot])
    (ref * G).sum().backward()
    return {"o": rel_err(o, ref[home]), "dq": rel_err(q.grad, Qr.grad[home]),
            "dk": rel_err(k.grad, Kr.grad[home]), "dv": rel_err(v.grad, Vr.grad[home])}


def body_elastic(rank, world, P=2, cp=2, k=2):
    step = libra.PlacementSampler(ELASTIC_WINDOW, 4, world // cp, P, mode="vrsp-elastic").at(0)
    g = lt.domain_groups(P, cp, k=k)  # both kinds of group, once
    replica, cpr = rank // cp, rank % cp
    first = [int(x) for x in step["pool_first_replica"]]
    pool = next(p for p in range(len(first)) if first[p] <= replica < first[p] + P)
    domain = next(d for d in step["domains"] if pool in d)
    kw = dict(seq_len=L, cp=cp, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, chunks=2,
              dtype="fp32")
    out = {"domains": step["domains"], "pool_imbalance": step["pool_imbalance"], "imbalance": step["imbalance"]}
    # The fused domain: slot s is slot s % P of pool domain[s // P] (docs/elastic.md), k*P slots.
    ids = [step["pools"][p][s] for p in domain for s in range(P)]
    seqs = [ELASTIC_WINDOW[i] for i in ids]
    dslot = (replica - first[domain[0]]) if len(domain) > 1 else None
    out["domain_worker_ok"] = g.domain_worker == dslot * cp + cpr
    plan = libra.make_plan(seqs, **kw)
    out["domain_workers"] = plan.num_workers
    # Some tile of the outlier's slot runs on the other pool's workers: the domain really shares work.
    tiles = plan.tiles
    outlier_slot = ids.index(0)
    out["outlier_shared"] = bool(((tiles["slot"] == outlier_slot) &
                                  (tiles["worker"] // cp // P != outlier_slot // P)).any())
    out["domain"] = fwd_bwd_errors(lt.PlanRuntime(plan, g.domain), cp, seqs, ids, g.domain_worker)
    # The same rank's unfused pool (VRSP's) on its pool group, from the same domain_groups call.
    pids = step["pools"][pool]
    out["pool_worker_ok"] = g.pool_worker == (replica - first[pool]) * cp + cpr
    pseqs = [ELASTIC_WINDOW[i] for i in pids]
    out["pool"] = fwd_bwd_errors(lt.PlanRuntime(libra.make_plan(pseqs, **kw), g.pool), cp, pseqs, pids,
                                 g.pool_worker)
    return out


@pytest.mark.parametrize("comm", COMMUNICATORS)
def test_fused_domain_on_its_domain_group_matches_plain_attention(comm):
    results = run(comm, body_elastic, 8)
    r0 = results[0]
    assert r0["domains"] == [[0, 1]] and r0["pool_imbalance"] > 0.5 and r0["imbalance"] < 0.05, r0
    for r in results:
        assert r["domain_worker_ok"] and r["pool_worker_ok"] and r["domain_workers"] == 8, r
        assert r["outlier_shared"]
        assert max(r["domain"].values()) < TOL["float32"], r["domain"]
        assert max(r["pool"].values()) < TOL["float32"], r["pool"]


def test_elastic_placement_in_the_binding():
    w = libra.place_window(ELASTIC_WINDOW, 2, mode="vrsp-elastic", dp=4)
    assert w["domains"] == [[0, 1]] and w["imbalance"] < w["pool_imbalance"]
    assert libra.place_window(ELASTIC_WINDOW, 2, mode="vrsp-elastic", dp=4, elastic_k=1)["domains"] == [[0], [1]]
    assert libra.place_window(ELASTIC_WINDOW, 2, mode="vrsp", dp=4)["domains"] == [[0], [1]]
    with pytest.raises(ValueError, match="elastic rule"):
        libra.place_window(ELASTIC_WINDOW, 2, mode="vrsp-elastic", dp=4, elastic_rule="nearest")


def test_sampler_node_interleave_keeps_replicas_and_pools_in_step():
    seqs = libra.pack([int(x) for x in torch.randint(1, 60, (400,), generator=torch.Generator().manual_seed(9))],
                      L)["sequences"]
    dp, P, gbs = 8, 4, 16
    kw = dict(interleave_cp=2, interleave_gpus_per_node=4)
    samplers = [lt.PlacementBatchSampler(seqs, gbs=gbs, dp=dp, pool_size=P, dp_rank=r, **kw) for r in range(dp)]
    full = [list(s) for s in samplers]
    core = libra.PlacementSampler(seqs, gbs, dp, P, **kw)
    plain = libra.PlacementSampler(seqs, gbs, dp, P)
    for n in range(len(samplers[0])):
        step, ga = divmod(n, gbs // dp)
        assert core.at(step)["pools"] == [
            libra.place_window([seqs[i] for i in range(step * gbs, (step + 1) * gbs)], P, **kw)["pools"][k]
            for k in range(gbs // P)]
        assert sorted(core.at(step)["order"]) == sorted(plain.at(step)["order"])
        for r in range(dp):
            # The sequence replica r trains on is the one its slot holds in the plan's pool.
            assert full[r][n][0] == samplers[r].pool_indices(n)[r % P]
    with pytest.raises(ValueError, match="node-interleaved"):
        lt.PlacementBatchSampler(seqs, gbs=gbs, dp=dp, pool_size=P, dp_rank=0, mode="vrsp-elastic",
                                 elastic_pricing={"seq_len": L}, **kw)


# ---------------------------------------------------------------- one trace format

TRACE_NAME = r"^(wait )?(fwd|bwd) (compute|input|output) chunk (\d+)( class [0-2])?$"
LANES = {0: "compute", 1: "transfer", 2: "wait"}


def read_trace(path):
    """The one reader of libra's trace files (libra::trace_document's schema): checks every event and
    returns {rank: [(lane name, event name, ts, dur)]}."""
    import json
    import re

    with open(path) as f:
        doc = json.load(f)
    assert set(doc) == {"displayTimeUnit", "traceEvents"} and doc["displayTimeUnit"] == "ms"
    meta, spans = {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M":
            meta.setdefault(e["pid"], {})[(e["name"], e.get("tid"))] = e["args"]["name"]
            continue
        assert set(e) == {"name", "cat", "ph", "pid", "tid", "ts", "dur"} and e["ph"] == "X", e
        assert e["cat"] == LANES[e["tid"]] and e["dur"] >= 0, e
        m = re.match(TRACE_NAME, e["name"])
        assert m and (m.group(3) == "compute") == (e["tid"] == 0) and bool(m.group(1)) == (e["tid"] == 2), e
        spans.setdefault(e["pid"], []).append((e["cat"], e["name"], e["ts"], e["dur"]))
    for pid in spans:
        assert meta[pid] == {("process_name", None): f"rank {pid}",
                             **{("thread_name", t): n for t, n in LANES.items()}}, meta[pid]
    return spans


def traced_body(rank, world):
    group, _ = lt.pool_group(2, 2)
    plan = libra.make_plan(POOLS[:2], seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, chunks=2, dtype="fp32")
    rt = lt.PlanRuntime(plan, group, trace=True)
    q = torch.randn(L // 2, 4, 16, requires_grad=True)
    kv = torch.randn(L // 2, 2, 16, requires_grad=True)
    lt.attention(q, kv, kv, rt).sum().backward()
    return rt.trace


def test_both_engines_write_one_trace_format(libra_cli, tmp_path):
    import subprocess

    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(f"{s}\n" for s in POOLS[:2]))
    cpp = tmp_path / "cpp.json"
    subprocess.run([libra_cli, "exec", str(pool), "--seq-len", str(L), "--cp", "2", "--pool-size", "2", "--ranks",
                    "4", "--block", "8", "--head-shards", "2", "--heads-q", "4", "--heads-kv", "2", "--head-dim",
                    "16", "--chunks", "2", "--trace", str(cpp)], check=True, capture_output=True)
    py = tmp_path / "py.json"
    lt.write_trace(str(py), [e for t in run("inprocess", traced_body, 4) for e in t])
    for path in (cpp, py):
        spans = read_trace(path)
        assert sorted(spans) == [0, 1, 2, 3], path
        for events in spans.values():
            names = {n for _, n, _, _ in events}
            # Every chunk's compute in both passes, and each transfer with its wait.
            assert {f"{p} compute chunk {m}" for p in ("fwd", "bwd") for m in (0, 1)} <= names, names
            transfers = {n for lane, n, _, _ in events if lane == "transfer"}
            assert transfers and all("wait " + n in names for n in transfers), names
    with pytest.raises(ValueError, match=r"^trace event 'x': lane 3: must be 0 \(compute\), 1 \(transfer\) or 2"):
        lt.write_trace(str(tmp_path / "bad.json"), [(0, "x", 3, 0.0, 1.0)])


def test_fwd_bwd_medians_leaves_out_the_warm_up_and_takes_each_phase_median():
    """libra.torch.timing, which the benchmarks and examples/exec_compare.py report through: on a fake
    clock, the warm-up's (large) times are left out, prepare runs before every repetition and warmed
    once after the warm-up."""
    from libra.torch.timing import fwd_bwd_medians  # noqa: PLC0415

    now, calls = [0.0], []
    costs = iter([(100.0, 200.0), (1.0, 4.0), (3.0, 2.0), (2.0, 9.0)])  # warm-up, then 3 repetitions

    def forward():
        f, b = next(costs)
        now[0] += f
        return b

    def backward(b):
        now[0] += b

    got = fwd_bwd_medians(forward, backward, 3, clock=lambda: now[0], prepare=lambda: calls.append("p"),
                          warmed=lambda: calls.append("w"))
    assert got == (2.0, 4.0)
    assert calls == ["p", "w", "p", "p", "p"]
    with pytest.raises(ValueError, match=r"^libra.torch.timing: reps 0: must be at least 1$"):
        fwd_bwd_medians(forward, backward, 0)
