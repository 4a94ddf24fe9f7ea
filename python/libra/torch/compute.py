"""The compute step of a pass, per pipeline chunk, on whichever backend ``backends.select`` chose:
a ``buffers`` backend computes on the pass's buffers itself; for a ``varlen`` backend this module
runs each chunk's kernel calls as one varlen call per (q buffer, kv buffer) pair (the binding merged
them: ``index.Pair``), gathering the head vectors with one index op per tensor and writing the
results where libra's kernel would. Backward takes the backend's own varlen backward on the saved
output and LSE where it has one (flash-attn, torch's varlen attention), else differentiates a
recomputed forward through autograd (SDPA). Everything here but the backend's call is the same on
every device, and nothing reads a device value on the host."""
import torch


def _pairs(rt, pass_index, m, device):
    """Chunk m's merged varlen calls (index.Pair) on ``device``, kept on the runtime by (pass, chunk,
    device): views of the index arrays copied once per micro-batch."""
    key = (pass_index, m, device)
    pairs = rt._varlen_meta.get(key)
    if pairs is None:
        pairs = rt._varlen_meta[key] = rt.on(device)[pass_index]["varlen"][m]
    return pairs


def _gather(buf, rows, n, heads, d):
    return buf.index_select(0, rows).view(n, heads, d)


def _inputs(p, bq, bk, d):
    return (_gather(bq["Q"], p.q, p.total_q, p.hq, d), _gather(bk["K"], p.kv, p.total_k, p.hkv, d),
            _gather(bk["V"], p.kv, p.total_k, p.hkv, d))


def _forward(backend, pairs, bufs, window, scale, d):
    with torch.no_grad():
        for p in pairs:
            bq, bk = bufs[p.q_home], bufs[p.kv_home]
            q, k, v = _inputs(p, bq, bk, d)
            o, lse = backend.varlen(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, scale, window, p.cu_host)
            bq["O"].index_copy_(0, p.q, o.reshape(-1, d).to(bq["O"].dtype))
            if lse is not None:  # [h_q, total_q]: head-major, as p.lse lists the LSE buffer's vectors
                bq["LSE"].index_copy_(0, p.lse, lse.reshape(-1, 1).to(torch.float32))


def _backward_saved(backend, pairs, bufs, window, scale, d):
    """The backend's varlen backward on the saved O and LSE (no recomputed forward); dQ, dK, dV added
    where the kernel would add them (a q vector's dQ comes from one call, so adding into the zeroed
    dQ assigns it; dK/dV sum over every fragment that read the key)."""
    for p in pairs:
        bq, bk = bufs[p.q_home], bufs[p.kv_home]
        q, k, v = _inputs(p, bq, bk, d)
        o = _gather(bq["O"], p.q, p.total_q, p.hq, d)
        do = _gather(bq["dO"], p.q, p.total_q, p.hq, d)
        lse = bq["LSE"].index_select(0, p.lse).view(p.hq, p.total_q)
        dq, dk, dv = backend.varlen_backward(do, q, k, v, o, lse, p.cu_q, p.cu_k, p.max_q, p.max_k, scale, window)
        bq["dQ"].index_add_(0, p.q, dq.reshape(-1, d).to(torch.float32))
        bk["dK"].index_add_(0, p.kv, dk.reshape(-1, d).to(torch.float32))
        bk["dV"].index_add_(0, p.kv, dv.reshape(-1, d).to(torch.float32))


def _backward_recompute(backend, pairs, bufs, window, scale, d):
    """Backward through autograd on a recomputed forward, with one leaf per buffer the calls read
    (home or compute Q; K and V), each gradient added to the buffer's (backends with no backward of
    their own: SDPA)."""
    read = sorted({(p.q_home, "Q") for p in pairs} | {(p.kv_home, n) for p in pairs for n in ("K", "V")})
    with torch.enable_grad():
        leaves = {key: bufs[key[0]][key[1]].detach().requires_grad_() for key in read}
        src = {where: {n: leaves.get((where, n)) for n in ("Q", "K", "V")} for where in (True, False)}
        outs, grads_in = [], []
        for p in pairs:
            q, k, v = _inputs(p, src[p.q_home], src[p.kv_home], d)
            o, _lse = backend.varlen(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, scale, window, p.cu_host)
            outs.append(o)
            grads_in.append(_gather(bufs[p.q_home]["dO"], p.q, p.total_q, p.hq, d))
        grads = torch.autograd.grad(outs, [leaves[key] for key in read], grads_in, allow_unused=True)
    for (where, n), g in zip(read, grads):
        if g is not None:
            bufs[where]["d" + n].add_(g.to(torch.float32))


def run_chunk(rt, backend, pass_index, m, home, comp, scale):
    """Computes chunk m of a pass (0 forward, 1 backward) on ``backend``. ``scale`` None: 1/sqrt(d)."""
    if backend.kind == "buffers":
        run = backend.forward if pass_index == 0 else backend.backward
        run(rt, pass_index, m, home, comp, scale)
        return
    pairs = _pairs(rt, pass_index, m, home["Q"].device)
    if not pairs:
        return
    bufs = {True: home, False: comp}  # by a call's q_home / kv_home
    d = rt.head_dim
    if pass_index == 0:
        _forward(backend, pairs, bufs, rt.window, scale, d)
    elif backend.has_backward():
        _backward_saved(backend, pairs, bufs, rt.window, scale, d)
    else:
        _backward_recompute(backend, pairs, bufs, rt.window, scale, d)
