"""libra.torch's data layout on gloo (CPU): zigzag and contiguous homes, the caller's sample
boundaries checked against the plan, masks in flash-attn's terms, and the LSE.

The zigzag rows, positions and cu_seqlens are computed here from the layout's definition (the
packed sequence cut into 2 CP chunks; CP rank r holds chunks r and 2CP-1-r, in that order) and the
pool alone, independently of libra; outputs and gradients are compared with plain attention in
float64 on whole sequences (tests/python/dist_util.py), the LSE with a float64 log-sum-exp.
One run of 4 workers runs every case, over each communicator (gloo processes, the in-process pool).
"""
import warnings

import pytest

torch = pytest.importorskip("torch")

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from dist_util import COMMUNICATORS, reference_attention, rel_err, run  # noqa: E402

L = 64
POOLS = [[10, 30, 20], [64], [5, 5, 40, 3], [33, 17]]
TOL = {"float32": 2e-5, "bfloat16": 2e-2}


def home_rows(layout, cp, c):
    if layout == "contiguous":
        return list(range(c * L // cp, (c + 1) * L // cp))
    n = L // (2 * cp)
    return list(range(c * n, (c + 1) * n)) + list(range((2 * cp - 1 - c) * n, (2 * cp - c) * n))


def boundaries(samples, rows):
    """position_ids (padding rows -7: they are not checked) and cu_seqlens (token rows only, a new
    segment wherever the sample changes or the packed rows stop being consecutive) of home rows."""
    owner, pos, start = {}, {}, 0
    for j, n in enumerate(samples):
        for i in range(n):
            owner[start + i], pos[start + i] = j, i
        start += n
    position = [pos.get(x, -7) for x in rows]
    cu = [0]
    tokens = sum(1 for x in rows if x in owner)
    for i in range(1, tokens):
        if owner[rows[i]] != owner[rows[i - 1]] or rows[i] != rows[i - 1] + 1:
            cu.append(i)
    cu.append(tokens)
    return torch.tensor(position), torch.tensor(cu, dtype=torch.int32), tokens


def reference_lse(q, k, samples, window=None):
    """float64 log-sum-exp of the scaled causal (windowed) scores per row and head, [h_q, L]; 0 on padding."""
    Lq, hq, d = q.shape
    kk = k.repeat_interleave(hq // k.shape[1], dim=1)
    out = torch.zeros(hq, Lq, dtype=torch.float64)
    start = 0
    for n in samples:
        s = slice(start, start + n)
        scores = q[s].transpose(0, 1) @ kk[s].transpose(0, 1).transpose(1, 2) * d ** -0.5
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = j <= i
        if window is not None:
            mask &= j > i - window
        out[:, s] = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)
        start += n
    return out


def run_case(rank, P, cp, *, layout, mode="tap", chunks=1, hq=4, hkv=2, d=16, block=8, shards=2, window=None,
             dtype="float32", pass_window_size=False, kv_prefix=False):
    """Forward, backward and LSE of one case with the caller's tensors in the plan's home layout and
    its boundaries passed; returns the errors and what the runtime reported about its home."""
    dt = getattr(torch, dtype)
    group, worker = lt.pool_group(P, cp)
    pool_index = rank // (P * cp)
    pool = POOLS[pool_index * P:(pool_index + 1) * P]
    plan = libra.make_plan(pool, seq_len=L, cp=cp, block_size=block, head_shards=shards, heads_q=hq,
                           heads_kv=hkv, head_dim=d, chunks=chunks, mode=mode, window=window,
                           dtype="fp32" if dtype == "float32" else "bf16", home_layout=layout,
                           kv_prefix=kv_prefix)
    rt = lt.PlanRuntime(plan, group)
    slot, c = worker // cp, worker % cp
    rows = home_rows(layout, cp, c)
    position, cu, tokens = boundaries(pool[slot], rows)
    report = {"packed_rows": rt.packed_rows.tolist() == rows,
              "position_ids": rt.position_ids[:tokens].tolist() == position[:tokens].tolist(),
              "cu_seqlens": rt.cu_seqlens.tolist() == cu.tolist() and rt.cu_seqlens.dtype == torch.int32,
              "home_tokens": rt.home_tokens == tokens and rt.padding_rows == L // cp - tokens,
              "max_seqlen": rt.max_seqlen == int((cu[1:] - cu[:-1]).max()),
              "layout": rt.home_layout == layout and plan.config["home_layout"] == layout}
    g = torch.Generator().manual_seed(100 * pool_index + slot)
    Q, K, V, G = (torch.randn(L, h, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv, hq))
    Q, K, V = (x.to(dt).to(torch.float64) for x in (Q, K, V))
    idx = torch.tensor(rows)
    q, k, v = (x[idx].to(dt).requires_grad_() for x in (Q, K, V))
    kw = dict(window_size=(-1, 0) if window is None else (window - 1, 0)) if pass_window_size else {}
    o, lse = lt.attention(q, k, v, rt, cu_seqlens=cu, position_ids=position[None, :], return_lse=True, **kw)
    (o.to(torch.float64) * G[idx]).sum().backward()
    Qr, Kr, Vr = (x.clone().requires_grad_() for x in (Q, K, V))
    ref = reference_attention(Qr, Kr, Vr, pool[slot], window=window)
    (ref * G).sum().backward()
    ref_lse = reference_lse(Q, K, pool[slot], window)[:, idx]
    errs = {"o": rel_err(o, ref[idx]), "dq": rel_err(q.grad, Qr.grad[idx]), "dk": rel_err(k.grad, Kr.grad[idx]),
            "dv": rel_err(v.grad, Vr.grad[idx]),
            "lse": rel_err(lse[:, :tokens], ref_lse[:, :tokens])}
    report["lse_shape"] = list(lse.shape) == [hq, L // cp] and lse.dtype == torch.float32 and not lse.requires_grad
    report["padding_zero"] = bool((o.detach()[tokens:] == 0).all() and (lse[:, tokens:] == 0).all())
    return errs, report


CASES = [
    dict(name="zigzag tap M2 fp32 GQA", P=2, cp=2, layout="zigzag", chunks=2),
    dict(name="zigzag tap-split M1 bf16", P=2, cp=2, layout="zigzag", mode="tap-split", dtype="bfloat16",
         hq=8, shards=4),
    dict(name="zigzag ulysses M2 fp32", P=2, cp=2, layout="zigzag", mode="ulysses", chunks=2, hkv=4),
    dict(name="zigzag window 7 from the plan", P=2, cp=2, layout="zigzag", chunks=2, window=7),
    dict(name="zigzag window 7 as window_size", P=2, cp=2, layout="zigzag", window=7, pass_window_size=True),
    dict(name="zigzag P1 CP4 tap M2 fp32", P=1, cp=4, layout="zigzag", chunks=2, block=4),
    # What the simulator's libra-topo runs by default: tap-topo on zigzag homes with the KV causal prefix.
    dict(name="zigzag tap-topo kv prefix M2 fp32", P=2, cp=2, layout="zigzag", mode="tap-topo", chunks=2,
         hq=8, shards=4, kv_prefix=True),
    dict(name="zigzag P1 CP4 tap-topo kv prefix bf16", P=1, cp=4, layout="zigzag", mode="tap-topo", block=4,
         kv_prefix=True, dtype="bfloat16"),
    dict(name="contiguous tap M2 fp32", P=2, cp=2, layout="contiguous", chunks=2),
    dict(name="contiguous P1 CP4 window 5 bf16", P=1, cp=4, layout="contiguous", block=4, window=5,
         dtype="bfloat16"),
]


def call_error(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def refusals(rank):
    """Stale runtimes, mismatched boundaries and masks the plan cannot express: one line, same on
    every rank, naming what differs."""
    group, worker = lt.pool_group(2, 2)
    kw = dict(seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, dtype="fp32")
    slot, c = worker // 2, worker % 2
    now = libra.make_plan(POOLS[2:], home_layout="zigzag", **kw)
    before = libra.make_plan(POOLS[:2], home_layout="zigzag", **kw)
    stale = lt.PlanRuntime(before, group)  # last micro-batch's runtime
    position, cu, _ = boundaries(POOLS[2 + slot], home_rows("zigzag", 2, c))
    x, y = torch.zeros(L // 2, 4, 16), torch.zeros(L // 2, 2, 16)
    out = {"stale_positions": call_error(lambda: lt.attention(x, y, y, stale, position_ids=position)),
           "stale_cu": call_error(lambda: lt.attention(x, y, y, stale, cu_seqlens=cu))}
    rt = lt.PlanRuntime(now, group)
    # One rank's cu_seqlens off by one row: every rank raises the line naming it.
    bad = cu.clone()
    bad[1] += 1 if rank == 3 else 0
    out["one_rank_cu"] = call_error(lambda: lt.attention(x, y, y, rt, cu_seqlens=bad))
    # What passes: the runtime's own boundaries, padding as a last segment, [L/cp] or [1, L/cp].
    pad = torch.cat([rt.cu_seqlens, torch.tensor([L // 2], dtype=torch.int32)]) if rt.padding_rows else rt.cu_seqlens
    whole = torch.tensor([0] + [sum(POOLS[2 + slot][:i + 1]) for i in range(len(POOLS[2 + slot]))], dtype=torch.int32)
    out["accepted"] = [call_error(lambda a=a: lt.attention(x, y, y, rt, **a)) for a in (
        dict(cu_seqlens=rt.cu_seqlens, position_ids=rt.position_ids), dict(cu_seqlens=pad),
        dict(position_ids=rt.position_ids[None, :].clone()), dict(cu_seqlens=whole),
        dict(cu_seqlens=torch.cat([whole, torch.tensor([L], dtype=torch.int32)])))]
    out["packed_cu_seqlens"] = rt.packed_cu_seqlens.tolist() == whole.tolist()
    out["shape"] = call_error(lambda: lt.attention(x, y, y, rt, position_ids=rt.position_ids[:-1]))
    windowed = lt.PlanRuntime(libra.make_plan(POOLS[2:], window=9, **kw), group)
    out["window_default"] = call_error(lambda: lt.attention(x, y, y, windowed))
    # Its DeprecationWarning: test_the_window_alias_is_deprecated (warnings are not thread-safe).
    out["window_alias"] = call_error(lambda: lt.attention(x, y, y, windowed, window=9))
    out["window_size_ok"] = call_error(lambda: lt.attention(x, y, y, windowed, window_size=(8, 0)))
    out["window_size_bad"] = call_error(lambda: lt.attention(x, y, y, windowed, window_size=(4, 0)))
    out["window_none"] = call_error(lambda: lt.attention(x, y, y, windowed, window=None))
    out["right"] = call_error(lambda: lt.attention(x, y, y, windowed, window_size=(8, 3)))
    out["non_causal"] = call_error(lambda: lt.attention(x, y, y, windowed, causal=False))
    out["full_as_minus_one"] = call_error(lambda: lt.attention(x, y, y, rt, window_size=(-1, -1)))
    return out


def body(rank, world):
    out = {"errors": {}, "reports": {}}
    for case in CASES:
        kw = {k: v for k, v in case.items() if k not in ("name", "P", "cp")}
        errs, report = run_case(rank, case["P"], case["cp"], **kw)
        out["errors"][case["name"]] = (kw.get("dtype", "float32"), errs)
        out["reports"][case["name"]] = report
    out["refusals"] = refusals(rank)
    return out


@pytest.fixture(scope="module", params=COMMUNICATORS)
def four(request):
    return run(request.param, body, 4)


def test_zigzag_and_contiguous_homes_match_plain_attention_and_its_lse(four):
    for r in four:
        for name, (dtype, errs) in r["errors"].items():
            assert max(errs.values()) < TOL[dtype], (name, errs)


def test_the_runtime_reports_its_home_layout(four):
    for r in four:
        for name, report in r["reports"].items():
            assert all(report.values()), (name, report)


def test_a_runtime_of_another_micro_batch_is_refused(four):
    for key, part in (("stale_positions", "position_ids differ from the plan's at home row"),
                      ("stale_cu", "cu_seqlens")):
        msgs = [r["refusals"][key] for r in four]
        assert msgs[0] is not None and part in msgs[0] and "micro-batch" in msgs[0], msgs[0]
        assert msgs[0].startswith("libra.torch.attention: group rank 0: ")
        assert "\n" not in msgs[0] and all(m == msgs[0] for m in msgs)


def test_boundaries_wrong_on_one_rank_fail_on_every_rank_alike(four):
    msgs = [r["refusals"]["one_rank_cu"] for r in four]
    assert msgs[0].startswith("libra.torch.attention: group rank 3: cu_seqlens [") and all(m == msgs[0] for m in msgs)
    assert all(r["refusals"]["accepted"] == [None] * 5 and r["refusals"]["packed_cu_seqlens"] for r in four)
    assert "position_ids has shape [31]" in four[0]["refusals"]["shape"]


def test_masks_in_flash_attn_terms(four):
    f = four[0]["refusals"]
    assert f["window_default"] is None and f["window_alias"] is None and f["window_size_ok"] is None
    assert f["full_as_minus_one"] is None
    assert "window_size (4, 0) contradicts the plan's window_size (8, 0) (plan window 9)" in f["window_size_bad"]
    assert "window None differs from the plan's window 9" in f["window_none"]
    assert "window_size (8, 3)" in f["right"] and "cannot express" in f["right"]
    assert "causal=False" in f["non_causal"]


def alias_body(rank, world):
    """One worker (warnings are the process's: one thread records them): attention(window=) warns."""
    group, _ = lt.pool_group(1, 1)
    plan = libra.make_plan(POOLS[:1], seq_len=L, cp=1, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, dtype="fp32", window=9)
    rt = lt.PlanRuntime(plan, group)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = call_error(lambda: lt.attention(torch.zeros(L, 4, 16), torch.zeros(L, 2, 16), torch.zeros(L, 2, 16), rt,
                                              window=9))
    return err, any(issubclass(w.category, DeprecationWarning) and "window= is deprecated" in str(w.message)
                    for w in caught)


def test_the_window_alias_is_deprecated():
    assert run("inprocess", alias_body, 1) == [[None, True]]


def test_make_plan_refuses_an_unknown_home_layout():
    with pytest.raises(ValueError, match="home_layout striped: must be contiguous or zigzag"):
        libra.make_plan([[8]], seq_len=8, cp=2, block_size=2, head_shards=1, heads_q=1, heads_kv=1, head_dim=4,
                        home_layout="striped")
    with pytest.raises(ValueError, match="home_layout zigzag: seq_len / \\(2 cp\\) = 3 must be divisible by block_size 2"):
        libra.make_plan([[8]], seq_len=12, cp=2, block_size=2, head_shards=1, heads_q=1, heads_kv=1, head_dim=4,
                        home_layout="zigzag")


def test_zigzag_plans_survive_pickling_and_files(tmp_path):
    import pickle
    plan = libra.make_plan([[10, 30, 20], [64]], seq_len=L, cp=2, block_size=8, head_shards=2, heads_q=4,
                           heads_kv=2, head_dim=16, home_layout="zigzag")
    assert pickle.loads(pickle.dumps(plan)) == plan
    for name in ("p.json", "p.bin"):
        plan.save(str(tmp_path / name))
        again = libra.load_plan(str(tmp_path / name))
        assert again == plan and again.config["home_layout"] == "zigzag"
