"""The compute step of a pass, per pipeline chunk, on whichever backend ``backends.select`` chose:
a ``buffers`` backend computes on the pass's buffers itself; for a ``varlen`` backend this module
runs each chunk's kernel calls as one varlen call per (q buffer, kv buffer) pair (the binding merged
them: ``index.Pair``), gathering the head vectors with one index op per tensor and writing the
results where libra's kernel would. Backward takes the backend's own varlen backward on the saved
output and LSE where it has one (flash-attn, torch's varlen attention), else differentiates a
recomputed forward through autograd (SDPA). Everything here but the backend's call is the same on
every device, and nothing reads a device value on the host."""
import torch

from .index import join


def _pairs(rt, pass_index, m, device):
    """Chunk m's merged varlen calls (index.Pair) on ``device``, kept on the runtime by (pass, chunk,
    device): views of the index arrays copied once per micro-batch."""
    key = (pass_index, m, device)
    pairs = rt._varlen_meta.get(key)
    if pairs is None:
        pairs = rt._varlen_meta[key] = rt.on(device)[pass_index]["varlen"][m]
    return pairs


def _joined(rt, pass_index, m, device):
    """Chunk m's merged calls joined across home and compute buffers (index.Joined), on the runtime
    by the rows they come from (forward and backward share them where their calls are the same)."""
    pairs = _pairs(rt, pass_index, m, device)
    key = ("joined", device) + tuple((p.q.storage_offset(), p.kv.storage_offset(), p.q_home, p.kv_home) for p in pairs)
    calls = rt._varlen_meta.get(key)
    if calls is None:
        sd = rt.schedule
        home_q, home_kv = rt.home_rows * rt.heads_q, rt.home_rows * rt.heads_kv
        if max(home_q + sd["compute_q_vectors"], home_kv + sd["compute_kv_vectors"]) >= 2 ** 31:
            raise ValueError(f"libra.torch.attention: {home_q} home and {sd['compute_q_vectors']} compute q vectors "
                             f"(kv: {home_kv} and {sd['compute_kv_vectors']}): joined buffers need positions < 2^31")
        calls = rt._varlen_meta[key] = join(pairs, home_q, home_kv)
    return calls


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
    """Backward through autograd on a recomputed forward, with one leaf per buffer the calls read
    (home or compute Q; K and V), each gradient added to the buffer's (backends with no backward of
    their own: SDPA)."""
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
    ``joined`` (a varlen backend's buffers, home vectors then compute ones; home and comp their
    views): the chunk's calls run joined (index.Joined), one varlen call per head widths instead of
    one per buffer pair, except a recomputed backward, which keeps one autograd leaf per buffer."""
    if backend.kind == "buffers":
        run = backend.forward if pass_index == 0 else backend.backward
        run(rt, pass_index, m, home, comp, scale)
        return
    device = home["Q"].device
    if joined is not None and (pass_index == 0 or backend.has_backward()):
        pairs, bufs = _joined(rt, pass_index, m, device), {True: joined}
    else:
        pairs = _pairs(rt, pass_index, m, device)
        bufs = {True: home, False: comp}  # by a call's q_home / kv_home ("LSE1": the LSE buffer flat)
    if not pairs:
        return
    if pass_index == 0:
        _forward(backend, pairs, bufs, rt.window, scale)
    elif backend.has_backward():
        _backward_saved(backend, pairs, bufs, rt.window, scale)
    else:
        _backward_recompute(backend, pairs, bufs, rt.window, scale)
