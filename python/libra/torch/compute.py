"""The compute step of a pass, per pipeline chunk, on whichever backend ``backends.select`` chose:
a ``buffers`` backend computes on the pass's buffers itself; for a ``varlen`` backend this module
runs each chunk's kernel calls as one varlen call per (q buffer, kv buffer) pair (the binding merged
them: ``index.Pair``), gathering the head vectors with one index op per tensor and writing the
results where libra's kernel would. Backward takes the backend's own varlen backward on the saved
output and LSE where it has one (flash-attn, torch's varlen attention), else differentiates a
recomputed forward through autograd (SDPA). Everything here but the backend's call is the same on
every device, and nothing reads a device value on the host."""
import torch


def _pairs(rt, pass_index, m, device, kind):
    """Chunk m's merged varlen calls (index.Pair) on ``device``, one per buffer pair (kind "varlen")
    or joined across them ("joined"), kept on the runtime by (pass, chunk, device, kind): views of
    the index arrays copied once per micro-batch."""
    key = (pass_index, m, device, kind)
    pairs = rt._varlen_meta.get(key)
    if pairs is None:
        pairs = rt._varlen_meta[key] = rt.on(device)[pass_index][kind][m]
    return pairs


def _inputs(p, bq, bk):
    """q [total_q, hq, d], k and v [total_k, hkv, d] of a merged call: one gather op each."""
    return bq["Q"][p.q2], bk["K"][p.kv2], bk["V"][p.kv2]


def _forward(backend, pairs, bufs, window, scale):
    with torch.no_grad():
        for p in pairs:
            bq, bk = bufs[p.q_home], bufs[p.kv_home]
            q, k, v = _inputs(p, bq, bk)
            o, lse = backend.varlen(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, scale, window, p.cu_host)
            bq["O"].index_put_((p.q2,), o.to(bq["O"].dtype))  # a q vector is written by one call only
            if lse is not None:  # [h_q, total_q]: head-major, as p.lse2 lists the LSE buffer's vectors
                bq["LSE1"].index_put_((p.lse2,), lse.to(torch.float32))


def _backward_saved(backend, pairs, bufs, window, scale):
    """The backend's varlen backward on the saved O and LSE (no recomputed forward); dQ, dK, dV added
    where the kernel would add them (a q vector's dQ comes from one call, so adding into the zeroed
    dQ assigns it; dK/dV sum over every fragment that read the key)."""
    for p in pairs:
        bq, bk = bufs[p.q_home], bufs[p.kv_home]
        q, k, v = _inputs(p, bq, bk)
        o, do, lse = bq["O"][p.q2], bq["dO"][p.q2], bq["LSE1"][p.lse2]
        dq, dk, dv = backend.varlen_backward(do, q, k, v, o, lse, p.cu_q, p.cu_k, p.max_q, p.max_k, scale, window)
        bq["dQ"].index_put_((p.q2,), dq.to(torch.float32), accumulate=True)
        bk["dK"].index_put_((p.kv2,), dk.to(torch.float32), accumulate=True)
        bk["dV"].index_put_((p.kv2,), dv.to(torch.float32), accumulate=True)


def _backward_recompute(backend, pairs, bufs, window, scale):
    """Backward through autograd on a recomputed forward, with one leaf per (q_home or kv_home, field)
    the calls read (Q; K and V of the joined buffers: a pair reads its own half of one), each
    gradient added to the buffer's (backends with no backward of their own: SDPA)."""
    read = sorted({(p.q_home, "Q") for p in pairs} | {(p.kv_home, n) for p in pairs for n in ("K", "V")})
    with torch.enable_grad():
        leaves = {key: bufs[key[0]][key[1]].detach().requires_grad_() for key in read}
        src = {where: {n: leaves.get((where, n)) for n in ("Q", "K", "V")} for where in (True, False)}
        outs, grads_in = [], []
        for p in pairs:
            q, k, v = _inputs(p, src[p.q_home], src[p.kv_home])
            o, _lse = backend.varlen(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, scale, window, p.cu_host)
            outs.append(o)
            grads_in.append(bufs[p.q_home]["dO"][p.q2])
        grads = torch.autograd.grad(outs, [leaves[key] for key in read], grads_in, allow_unused=True)
    for (where, n), g in zip(read, grads):
        if g is not None:
            bufs[where]["d" + n].add_(g.to(torch.float32))


def run_chunk(rt, backend, pass_index, m, home, comp, scale, joined=None):
    """Computes chunk m of a pass (0 forward, 1 backward) on ``backend``. ``scale`` None: 1/sqrt(d).
    ``joined``: a varlen backend's buffers (home vectors, then compute ones; home and comp are their
    halves), which its calls index: one varlen call per run of the chunk's buffer pairs with the
    same head widths; a recomputed backward keeps one call and autograd leaf per buffer pair."""
    if backend.kind == "buffers":
        run = backend.forward if pass_index == 0 else backend.backward
        run(rt, pass_index, m, home, comp, scale)
        return
    recompute = pass_index == 1 and not backend.has_backward()
    pairs = _pairs(rt, pass_index, m, home["Q"].device, "varlen" if recompute else "joined")
    if not pairs:
        return
    bufs = {True: joined, False: joined}  # by a call's q_home / kv_home ("LSE1": the LSE buffer flat)
    if pass_index == 0:
        _forward(backend, pairs, bufs, rt.window, scale)
    elif backend.has_backward():
        _backward_saved(backend, pairs, bufs, rt.window, scale)
    else:
        _backward_recompute(backend, pairs, bufs, rt.window, scale)
