"""The compute step of a pass, per pipeline chunk, on whichever backend ``backends.select`` chose:
a ``buffers`` backend computes on the pass's buffers itself; for a ``varlen`` backend this module
gathers each kernel call's head vectors, runs the backend (forward under no_grad, backward through
autograd on a recomputed forward) and scatters the results where libra's kernel would write them.
Everything here but the backend's call is the same on every device."""
import numpy as np
import torch

from . import backends


def _vectors(prog, rows_idx, device):
    """Head-vector indices [len(rows_idx), run] of rows rows_idx under a strided program."""
    offset, _rows, run, stride = prog
    return offset + rows_idx[:, None] * stride + torch.arange(run, device=device)[None, :]


def _call_meta(rt, pass_index, m, device):
    """Per kernel call of chunk ``m``: (q_home, kv_home, q vectors, kv vectors, cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k, (cu_q, cu_k) as lists) in flash-attn's varlen terms. Fixed by the
    schedule, so built once per (pass, chunk, device) and kept on the runtime: every layer and step
    reuses them instead of copying index arrays to the device per call."""
    key = (pass_index, m, device)
    meta = rt._varlen_meta.get(key)
    if meta is not None:
        return meta
    calls = rt.schedule["calls"][pass_index][m]
    # Forward and backward run the same calls (same tiles, same buffers): one set of index tensors
    # serves both, which halves their device memory (90-112 MiB a worker at 256K tokens, CP 8).
    other = rt._varlen_meta.get((1 - pass_index, m, device))
    if other is not None and _same_calls(calls, rt.schedule["calls"][1 - pass_index][m]):
        rt._varlen_meta[key] = other
        return other
    meta = []
    for call in calls:
        qp, kp, frags, q_home, kv_home = call
        f = np.asarray(frags, dtype=np.int64)
        nq, nk = f[:, 4] - f[:, 3], f[:, 4]  # per fragment: queries [a, e), keys 0 .. e-1
        q_rows = np.concatenate([np.arange(r, r + n) for r, n in zip(f[:, 0], nq)])
        k_rows = np.concatenate([np.arange(r, r + n) for r, n in zip(f[:, 1], nk)])
        qv = _vectors(qp, torch.from_numpy(q_rows).to(device), device)
        kv = _vectors(kp, torch.from_numpy(k_rows).to(device), device)
        cu_q_host = np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)
        cu_k_host = np.concatenate([[0], np.cumsum(nk)]).astype(np.int32)
        cu_q = torch.from_numpy(cu_q_host).to(device)
        cu_k = torch.from_numpy(cu_k_host).to(device)
        meta.append((bool(q_home), bool(kv_home), qv, kv, cu_q, cu_k, int(nq.max()), int(nk.max()),
                     (cu_q_host.tolist(), cu_k_host.tolist())))
    rt._varlen_meta[key] = meta
    return meta


def _same_calls(a, b):
    return len(a) == len(b) and all(
        x[3] == y[3] and x[4] == y[4] and tuple(x[0]) == tuple(y[0]) and tuple(x[1]) == tuple(y[1])
        and np.array_equal(np.asarray(x[2]), np.asarray(y[2])) for x, y in zip(a, b))


def _varlen_calls(backend, meta, home, comp, window, scale):
    """Runs a chunk's calls (their _call_meta) on a varlen backend on the Q, K, V of `home` and
    `comp` (each call reads the buffers its flags name); returns [(q_home, q vectors, o, lse)]."""
    out = []
    for q_home, kv_home, qv, kv, cu_q, cu_k, max_q, max_k, cu_host in meta:
        bq, bk = home if q_home else comp, home if kv_home else comp
        o, lse = backend.varlen(bq["Q"][qv], bk["K"][kv], bk["V"][kv], cu_q, cu_k, max_q, max_k, scale, window,
                                cu_host)
        out.append((q_home, qv, o, lse))
    return out


def run_chunk(rt, backend, pass_index, m, home, comp, scale):
    """Computes chunk m of a pass (0 forward, 1 backward) on ``backend``. ``scale`` None: 1/sqrt(d)."""
    if backend.kind == "buffers":
        run = backend.forward if pass_index == 0 else backend.backward
        run(rt, pass_index, m, home, comp, scale)
        return
    meta = _call_meta(rt, pass_index, m, home["Q"].device)
    if not meta:
        return
    window = rt.window
    bufs = {True: home, False: comp}  # by a call's q_home / kv_home
    if pass_index == 0:
        with torch.no_grad():
            for q_home, qv, o, lse in _varlen_calls(backend, meta, home, comp, window, scale):
                dst = bufs[q_home]
                dst["O"][qv] = o.to(dst["O"].dtype)
                if lse is not None:  # [h_q, total_q] -> the LSE buffer's head vectors
                    dst["LSE"][qv] = lse.t().unsqueeze(-1).to(torch.float32)
        return
    # Backward: the backend's own backward, through autograd on a recomputed forward, with one leaf
    # per buffer the calls read (home or compute Q; K and V), each gradient added where the kernel
    # would add it (dQ of a row is computed once, so adding into the zeroed dQ assigns it).
    read = sorted({(c[0], "Q") for c in meta} | {(c[1], n) for c in meta for n in ("K", "V")})
    with torch.enable_grad():
        leaves = {key: bufs[key[0]][key[1]].detach().requires_grad_() for key in read}
        src = {where: {n: leaves.get((where, n)) for n in ("Q", "K", "V")} for where in (True, False)}
        res = _varlen_calls(backend, meta, src[True], src[False], window, scale)
        grads = torch.autograd.grad([o for _, _, o, _ in res], [leaves[key] for key in read],
                                    [bufs[q_home]["dO"][qv] for q_home, qv, _, _ in res], allow_unused=True)
    for (where, n), g in zip(read, grads):
        if g is not None:
            bufs[where]["d" + n] += g.float()
