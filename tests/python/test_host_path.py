"""libra.torch's host path (issue 36): the binding's index arrays against independent references,
a whole pool's passes on meta tensors (any host read of a device value raises there), the torch ops
a call dispatches not growing with the plan's tiles, and the varlen backward from the saved output
and LSE (flash-attn's contract, a float64 stand-in) against plain attention."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra import _libra  # noqa: E402
from libra.torch import backends, index  # noqa: E402
from libra.torch.comms import inprocess  # noqa: E402
from libra.torch.descriptors import chunk_descriptors  # noqa: E402
from libra.torch.opcount import NoWire, call_ops, meta_inputs  # noqa: E402

POOLS = [[10, 30, 20], [64], [5, 5, 40, 3], [33, 17]]
SMALL = dict(seq_len=64, cp=2, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16)
PLANS = [dict(mode="tap", chunks=2), dict(mode="tap-split", chunks=2, heads_q=8, head_shards=4, tau=0.0),
         dict(mode="ulysses", chunks=2, heads_kv=4), dict(mode="tap-topo", chunks=4, heads_q=8, kv_prefix=True),
         dict(mode="tap", chunks=1, heads_q=8, head_shards=4, dedup_per_kv_head=True), dict(mode="tap", window=7)]


def _plan(pool, **kw):
    return libra.make_plan(pool, **{**SMALL, **kw})


def _expand(groups):
    """The old per-group (field, src, dst, add, class, src rows, dst rows) of RankProgram.exchange/apply."""
    return [(f, s, d, a, c, list(si), list(di)) for f, s, d, a, c, si, di in groups]


def _rows(runs, n):
    """The runs expanded one at a time in numpy (what index.expand does on a device in one launch):
    the runs must tile [0, n) in order."""
    out, at = np.full(n, -1, dtype=np.int64), 0
    for first, count, base, ln, stride in runs.tolist():
        assert first == at and count > 0 and ln > 0
        k = np.arange(count)
        out[first:first + count] = base + (k // ln) * stride + k % ln
        at += count
    assert at == n
    return out


def _expansions(host, layout):
    """index.expand's rows on the CPU (the binding's C++) and expand_ops' (torch ops in steps, the
    devices with no kernel), from the host array's columns."""
    nd, nr, n = layout["data"], layout["runs"], layout["rows"]
    cols = host[nd:].reshape(5, nr)
    cpu = index.expand(torch.from_numpy(cols), cols, n, torch.device("cpu")).numpy()
    return cpu, index.expand_ops(None, cols, n, torch.device("cpu")).numpy()


def _from_arrays(data, groups, layout):
    """The groups' rows read back from the expanded rows, each side checked to be its cut (what the
    runtime indexes with: one split of the rows, index.sides)."""
    out = []
    for f, s, d, a, c, so, do, n, ident, s_cut, d_cut in groups:
        si, di = list(data[so:so + n]), list(data[do:do + n])
        assert ident == (si == list(range(n))) | 2 * (di == list(range(n)))
        for off, cut in ((so, s_cut), (do, d_cut)):
            assert (layout["cuts"][cut], layout["lengths"][cut]) == (off, n) if n else cut == -1
        out.append((f, s, d, a, c, si, di))
    return out


def _varlen_reference(calls, home_q, home_kv):
    """Per (q_home, kv_home, hq, hkv): q vectors, kv vectors, cu_q, cu_k of the merged varlen call,
    from the schedule's calls in numpy (what compute.py built per call before), positions in joined
    buffers (compute vectors after the home buffer's home_q / home_kv)."""
    out = {}
    for pair in ((False, False), (False, True), (True, False), (True, True)):
        for qp, kp, frags, qh, kh in calls:
            if (bool(qh), bool(kh)) != pair:
                continue
            r = out.setdefault((*pair, qp[2], kp[2]), ([], [], [0], [0]))
            for q_row, kv_row, _n, a, e in np.asarray(frags).reshape(-1, 5):
                if e <= a:
                    continue
                rows_q, rows_k = np.arange(q_row, q_row + e - a), np.arange(kv_row, kv_row + e)
                r[0].extend((0 if qh else home_q) + (qp[0] + rows_q[:, None] * qp[3] + np.arange(qp[2])[None, :]).ravel())
                r[1].extend((0 if kh else home_kv) + (kp[0] + rows_k[:, None] * kp[3] + np.arange(kp[2])[None, :]).ravel())
                r[2].append(r[2][-1] + e - a)
                r[3].append(r[3][-1] + e)
    return out


@pytest.mark.parametrize("relay", [False, True])
def test_index_arrays_match_the_program_the_schedule_and_the_descriptor_format(relay):
    for kw in PLANS:
        plan = _plan(POOLS, **kw)
        for w in range(plan.num_workers):
            prog = _libra.rank_program(plan, w, relay=relay)
            runs, small, layout = prog.index_arrays()
            data = _rows(runs, layout["rows"])
            assert all(np.array_equal(x, data) for x in _expansions(small, layout))
            if w == 0:  # in steps of a few entries, a run longer than a step alone in its own
                saved, index._BATCH = index._BATCH, 7
                try:
                    assert np.array_equal(_expansions(small, layout)[1], data)
                finally:
                    index._BATCH = saved
            # The records' sides tile the rows in order (one split cuts them all).
            cuts, lengths = layout["cuts"], layout["lengths"]
            assert cuts == list(np.cumsum([0] + lengths[:-1])) and sum(lengths) == layout["rows"]
            assert all(n > 0 for n in lengths)
            info = prog.info
            for p, per in enumerate(layout["passes"]):
                assert _from_arrays(data, per["apply"], layout) == _expand(prog.apply(p))
                for kind in ("in", "out", "stage"):
                    assert len(per[kind]) == (info["chunks"] if kind != "stage" or info["relayed"] else 0)
                    for m, x in enumerate(per[kind]):
                        want = prog.exchange(p, kind, m)
                        assert x["send"] == [list(v) for v in want["send_vectors"]]
                        assert x["recv"] == [list(v) for v in want["recv_vectors"]]
                        for lst in ("gather", "local", "scatter"):
                            assert _from_arrays(data, x[lst], layout) == _expand(want[lst]), (kw, w, p, kind, m, lst)
                for m in range(info["chunks"]):
                    calls = info["calls"][p][m]
                    table, bounds = chunk_descriptors(calls)
                    t, rows, b = per["descriptors"][m]
                    assert np.array_equal(small[t:t + 20 * rows].view(np.int64).reshape(rows, 10), table) and \
                        np.array_equal(small[b:b + 10].view(np.int64), bounds), (kw, w, p, m)
                    ref = _varlen_reference(calls, info["home_rows"] * info["heads_q"],
                                            info["home_rows"] * info["heads_kv"])
                    got = per["varlen"][m]
                    _check_joined(data, small, got, per["joined"][m])
                    assert [(r["q_home"], r["kv_home"], r["hq"], r["hkv"]) for r in got] == list(ref)
                    for r, (qv, kv, cq, ck) in zip(got, ref.values()):
                        assert list(data[r["q_off"]:r["q_off"] + len(qv)]) == qv
                        assert list(data[r["kv_off"]:r["kv_off"] + len(kv)]) == kv
                        assert list(small[r["cu_q_off"]:r["cu_q_off"] + len(cq)]) == cq
                        assert list(small[r["cu_k_off"]:r["cu_k_off"] + len(ck)]) == ck
                        assert (r["total_q"], r["total_k"], r["seqs"]) == (cq[-1], ck[-1], len(cq) - 1)
                        # A merged call's rows follow every group side's: the split's last piece.
                        assert not (len(qv) or len(kv)) or min(r["q_off"], r["kv_off"]) >= cuts[-1]
                        assert r["max_q"] == max(np.diff(cq)) and r["max_k"] == max(np.diff(ck))


def test_expand_runs_refuses_runs_that_do_not_tile_the_rows():
    # The binding writes through raw pointers: runs out of order, past the end or short of it, or with
    # a zero len, are one ValueError line, never a write out of bounds.
    cols = np.array([[0, 4], [4, 6], [0, 100], [2, 3], [5, 3]], dtype=np.int32)  # 4 + 6 rows
    out = np.empty(10, dtype=np.int32)
    _libra.expand_runs(cols, out)
    assert out.tolist() == [0, 1, 5, 6, 100, 101, 102, 103, 104, 105]
    for bad, n in ((cols[:, ::-1].copy(), 10), (cols, 9), (cols, 11)):
        with pytest.raises(ValueError, match="expand_runs: "):
            _libra.expand_runs(bad, np.empty(n, dtype=np.int32))
    zero = cols.copy()
    zero[3, 1] = 0
    with pytest.raises(ValueError, match=r"expand_runs: run 1 \(first 4, count 6, base 100, len 0"):
        _libra.expand_runs(zero, out)
    with pytest.raises(ValueError, match="C-contiguous int32"):
        _libra.expand_runs(cols.astype(np.int64), out)


def test_the_expansion_kernel_compiles_for_a_gpu():
    # The interpreter (python.triton) checks what the kernel computes; this that Triton's compiler
    # takes it for sm_80 and sm_90, which the interpreter cannot tell.
    pytest.importorskip("triton")
    from libra.torch import triton_attention as ta, triton_index  # noqa: PLC0415
    _name, kernel, sig, consts, warps, stages = triton_index.aot_variant()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton 3.9's note on its FP-fusion default
        for arch in (80, 90):
            assert ta.aot_compile(kernel, sig, consts, warps, stages, arch).asm["ptx"]


def _check_joined(rows, small, pairs, joined):
    """The joined calls: consecutive pairs of the same widths, their rows and sequences in order."""
    at = 0
    for j in joined:
        run = []
        while at < len(pairs) and (pairs[at]["hq"], pairs[at]["hkv"]) == (j["hq"], j["hkv"]):
            run.append(pairs[at])
            at += 1
            if sum(p["total_q"] for p in run) == j["total_q"] and sum(p["seqs"] for p in run) == j["seqs"]:
                break
        assert run and j["q_home"] and j["kv_home"]
        for side, hw, total in (("q_off", "hq", "total_q"), ("kv_off", "hkv", "total_k")):
            want = np.concatenate([rows[p[side]:p[side] + p[total] * p[hw]] for p in run])
            assert np.array_equal(rows[j[side]:j[side] + j[total] * j[hw]], want)
        for cu, total in (("cu_q_off", "total_q"), ("cu_k_off", "total_k")):
            want, base = [0], 0
            for p in run:
                want.extend(base + small[p[cu] + 1:p[cu] + p["seqs"] + 1])
                base += p[total]
            assert list(small[j[cu]:j[cu] + j["seqs"] + 1]) == want
        assert (j["max_q"], j["max_k"]) == (max(p["max_q"] for p in run), max(p["max_k"] for p in run))
    assert at == len(pairs)
    assert all((a["hq"], a["hkv"]) != (b["hq"], b["hkv"]) for a, b in zip(joined, joined[1:]))


# ---------------------------------------------------------------- meta tensors: no sync, ops per call

class NoKernel(backends.Backend):
    """The kernel taken out (o depends on q, k and v, so autograd reaches all three); with
    ``saved`` its backward is a varlen backward from the saved o and LSE."""

    kind = "varlen"

    def __init__(self, saved):
        self.name, self.saved = ("no-kernel-saved" if saved else "no-kernel"), saved

    def unavailable(self, device, dtype):
        return None

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        return q + (k.sum() + v.sum()) * 0, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)

    def has_backward(self):
        return self.saved

    def varlen_backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, window):
        return do + o * 0 + lse.sum() * 0, torch.zeros_like(k), torch.zeros_like(v)


def _meta_body(rank, world, pool, kw, relay):
    group, _ = lt.pool_group(len(pool), kw["cp"])
    plan = libra.make_plan(pool, **kw)
    rt = lt.PlanRuntime(plan, group, relay=relay, check_calls=False)
    rt.comm = NoWire(rt.comm)
    q, k, v, do = meta_inputs(rt)
    lt.attention(q, k, v, rt).backward(do)  # the first call copies the index arrays to the device
    fwd, bwd = call_ops(rt, q, k, v, do)
    frags = sum(len(f) for per in rt.schedule["calls"] for chunk in per for _qp, _kp, f, _h, _k in chunk)
    # A backward chunk with forward's calls (the binding gave it forward's records) has forward's very
    # Pairs on the device, whichever kind (made now or when first read, as here).
    on, lay, shared = rt.on(q.device), rt._index_layout["passes"], 0
    for kind in ("joined", "varlen"):
        for m, chunk in enumerate(lay[1].get(kind, ())):
            if chunk is lay[0][kind][m]:
                shared += 1
                assert all(a is b for a, b in zip(on[1][kind][m], on[0][kind][m], strict=True)), (kind, m)
    return fwd, bwd, frags, len(plan.tiles["worker"]), shared


def _meta_pool(pool, kw, relay=False):
    return inprocess.run(_meta_body, len(pool) * kw["cp"], pool, kw, relay)


@pytest.mark.parametrize("saved", [False, True])
def test_passes_on_meta_tensors_do_not_sync_and_their_ops_do_not_grow_with_the_tiles(saved):
    # On meta tensors any host read of a device value (.item(), .tolist(), bool(), a shape from data)
    # raises, so a whole pool's passes running there read none. Two plans of the same shape, one with
    # 4x the tiles (blocks of 2 rows instead of 8): the ops a call dispatches stay the same (one op per
    # exchange group and per merged varlen call), while the fragments (the kernel calls' work) multiply.
    backend = NoKernel(saved)
    backends.registry()[backend.name] = backend
    previous = backends.force(backend.name)
    try:
        pool = [[40, 24, 30, 34], [128], [7, 9, 50, 62], [90, 38]]
        kw = dict(seq_len=128, cp=4, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, chunks=2, dtype="bf16")
        coarse = _meta_pool(pool, {**kw, "block_size": 8})
        fine = _meta_pool(pool, {**kw, "block_size": 2})
        relayed = _meta_pool(pool, {**kw, "block_size": 2}, relay=True)
    finally:
        backends.force(previous)
        del backends.registry()[backend.name]
    assert max(r[2] for r in fine) >= 3 * max(r[2] for r in coarse)
    for i in (0, 1):  # forward, backward: the busiest worker's ops (a merged call more or less: 12 ops)
        assert max(r[i] for r in fine) <= max(r[i] for r in coarse) + 12, (i, coarse, fine)
    assert all(r[0] > 0 and r[1] > 0 for r in relayed)
    assert sum(r[4] for r in coarse + fine + relayed) > 0  # some chunk's Pairs were shared


# ---------------------------------------------------------------- backward from the saved O and LSE

def _window_mask(sq, sk, left):
    pos = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    mask = j <= pos
    if left >= 0:
        mask &= j >= pos - left
    return mask


def _stand_in_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False,
                      window_size=(-1, -1), return_attn_probs=False):
    """flash_attn_varlen_func with return_attn_probs=True: (o, lse [h_q, total_q] fp32, None), float64 inside."""
    assert return_attn_probs and causal and dropout_p == 0.0
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    ratio = q.shape[1] // k.shape[1]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    out, lses = torch.zeros(q.shape, dtype=torch.float64), torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    for i in range(len(cq) - 1):
        qs = q[cq[i]:cq[i + 1]].double()
        ks = k[ck[i]:ck[i + 1]].double().repeat_interleave(ratio, dim=1)
        vs = v[ck[i]:ck[i + 1]].double().repeat_interleave(ratio, dim=1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        s = s.masked_fill(~_window_mask(qs.shape[0], ks.shape[0], window_size[0]), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        out[cq[i]:cq[i + 1]] = torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]), vs)
        lses[:, cq[i]:cq[i + 1]] = lse
    return out.to(q.dtype), lses.float(), None


def _stand_in_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                       alibi_slopes, deterministic, rng_state=None):
    """flash-attn's varlen backward from the saved out and softmax_lse (its formula: P = exp(S - lse),
    dS = P (dP - rowsum(dO o))), writing dq, dk, dv; float64 inside."""
    assert causal and window_size_right in (0, -1) and dropout_p == 0.0  # causal: flash sets right to 0
    ratio = q.shape[1] // k.shape[1]
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        a, b, c, e = cq[i], cq[i + 1], ck[i], ck[i + 1]
        qs, o, g = q[a:b].double(), out[a:b].double(), dout[a:b].double()
        ks = k[c:e].double().repeat_interleave(ratio, dim=1)
        vs = v[c:e].double().repeat_interleave(ratio, dim=1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale
        p = torch.exp(s - softmax_lse[:, a:b].double()[..., None])
        p = p.masked_fill(~_window_mask(b - a, e - c, window_size_left), 0.0)
        dp = torch.einsum("qhd,khd->hqk", g, vs)
        ds = p * (dp - (g * o).sum(-1).t()[..., None])
        dq[a:b] = (torch.einsum("hqk,khd->qhd", ds, ks) * softmax_scale).to(dq.dtype)
        dkh = torch.einsum("hqk,qhd->khd", ds, qs) * softmax_scale
        dvh = torch.einsum("hqk,qhd->khd", p, g)
        dk[c:e] = dkh.view(e - c, k.shape[1], ratio, -1).sum(2).to(dk.dtype)
        dv[c:e] = dvh.view(e - c, k.shape[1], ratio, -1).sum(2).to(dv.dtype)


def _saved_body(rank, world):
    from test_torch import CASES_FLASH, pinned, run_attention  # noqa: PLC0415
    flash = backends.get("flash-attn")
    out = {}
    saved = flash.impl_backward
    flash.impl_backward = _stand_in_backward
    try:
        with pinned("flash-attn", _stand_in_forward):
            assert flash.has_backward() and flash.gives_lse()
            for case in CASES_FLASH:
                kw = {k: v for k, v in case.items() if k != "name"}
                errs, _, padded = run_attention(rank, 2, 2, [[10, 30, 20], [64], [5, 5, 40, 3], [33, 17]], **kw)
                out[case["name"]] = (kw.get("dtype", "float32"), errs, padded)
    finally:
        flash.impl_backward = saved
    return out


def test_the_varlen_backward_from_saved_output_and_lse_matches_plain_attention():
    from test_torch import TOL  # noqa: PLC0415
    for r in inprocess.run(_saved_body, 4):
        for name, (dtype, errs, padded) in r.items():
            assert max(errs.values()) < TOL[dtype], (name, errs)
            assert padded, name


def test_the_construction_agreement_checks_every_rank_s_words():
    """PlanRuntime's checks on the gathered words (runtime._check_agreed: numpy where the ranks agree)
    raise the lines the per-rank Python checks raised, in their order; and the binding's agreement
    hands an array gather back as an array, the same words as a list gather."""
    from libra.torch import runtime  # noqa: PLC0415

    def words(fps, workers, nw=3, relay=0):
        return np.array([[fp >> 32, fp & 0xFFFFFFFF, w, nw, relay] for fp, w in zip(fps, workers)], dtype=np.int64)

    def line(e, size=3):
        try:
            runtime._check_agreed(e, e[:, 2].tolist(), size)
        except ValueError as err:
            return str(err)
        return None

    fp, other = 0xDEADBEEF12345678, 0x0123456789ABCDEF
    assert line(words([fp] * 3, [2, 0, 1])) is None
    assert line(words([fp] * 3, [0, 1, 2], nw=4)) == "PlanRuntime: the group has 3 ranks but the plan has 4 workers"
    assert line(words([fp, other, fp], [0, 1, 2])) == (f"plan fingerprint mismatch across the pool group: group ranks "
                                                       f"[1] hold {other:016x}; group ranks [0, 2] hold {fp:016x}")
    mixed = words([fp] * 3, [0, 1, 2])
    mixed[1, 4] = 1
    assert line(mixed) == ("PlanRuntime: relay differs across the pool group (group ranks [0, 2] pass relay=False; "
                           "group ranks [1] pass relay=True): every rank must pass the same value")
    for bad in ([0, 0, 1], [0, 1, 3], [-1, 1, 2]):
        assert line(words([fp] * 3, bad)) == (f"PlanRuntime: the group's worker indices {bad} are not a permutation "
                                              f"of 0..2")
    rows = [[5, 6, 0], [7, 8, 0]]
    as_list = _libra.agree([1, 2], b"", lambda mine: rows, print)
    as_array = _libra.agree([1, 2], b"", lambda mine: np.array(rows, dtype=np.int64), print)
    assert as_list[0] == [[5, 6], [7, 8]] and as_list[1:] == as_array[1:]
    assert isinstance(as_array[0], np.ndarray) and as_array[0].tolist() == as_list[0]
