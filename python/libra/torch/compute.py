"""Compute backends of the attention passes: libra's CPU kernel through the binding,
and flash_attn_varlen_func on the schedule's kernel calls."""
import numpy as np
import torch

from .. import _libra


def _kernel_dtype(t):
    if t.dtype == torch.float32:
        return "fp32"
    if t.dtype == torch.bfloat16:
        return "bf16"
    raise ValueError(f"libra.torch.attention: CPU tensors must be float32 or bfloat16, got {t.dtype}")


def _view(buf, prog):
    """Kernel view (data_ptr, dtype, rows, heads, width, row_stride) of a [vectors, width] buffer
    addressed by a strided program (offset, rows, run, stride) over head vectors."""
    offset, rows, run, stride = prog
    # The kernel checks fragments against the view, not the view against the memory behind it.
    if offset < 0 or run < 0 or (rows > 0 and offset + (rows - 1) * stride + run > buf.shape[0]):
        raise RuntimeError(f"libra.torch: kernel view {tuple(prog)} lies outside its buffer of {buf.shape[0]} vectors")
    width = buf.shape[1]
    return (buf.data_ptr() + offset * width * buf.element_size(), _kernel_dtype(buf), rows, run, width,
            stride * width)


def _sources(call, home, comp):
    """A kernel call's (q program, kv program, fragments, Q-family buffers, KV-family buffers): a call
    with q_home (kv_home) reads and writes the home buffers of that family in place, else the compute
    buffers (libra/schedule.hpp, "Data read in place")."""
    qp, kp, frags, q_home, kv_home = call
    return qp, kp, frags, home if q_home else comp, home if kv_home else comp


def _cpu_forward(calls, home, comp, window, scale, threads):
    for call in calls:
        qp, kp, frags, bq, bk = _sources(call, home, comp)
        _libra.kernel_forward(_view(bq["Q"], qp), _view(bk["K"], kp), _view(bk["V"], kp), _view(bq["O"], qp),
                              _view(bq["LSE"], qp), frags, window, scale, threads)


def _cpu_backward(calls, home, comp, window, scale, threads):
    for call in calls:
        qp, kp, frags, bq, bk = _sources(call, home, comp)
        _libra.kernel_backward(_view(bq["Q"], qp), _view(bk["K"], kp), _view(bk["V"], kp), _view(bq["O"], qp),
                               _view(bq["dO"], qp), _view(bq["LSE"], qp), _view(bq["dQ"], qp),
                               _view(bk["dK"], kp), _view(bk["dV"], kp), frags, window, scale, threads)


def _flash_attn():
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: PLC0415
    except ImportError as e:
        raise RuntimeError("libra.torch.attention: CUDA tensors need the flash_attn package "
                           "(flash_attn_varlen_func), which is not importable: " + str(e)) from None
    return flash_attn_varlen_func


def _vectors(prog, rows_idx, device):
    """Head-vector indices [len(rows_idx), run] of rows rows_idx under a strided program."""
    offset, _rows, run, stride = prog
    return offset + rows_idx[:, None] * stride + torch.arange(run, device=device)[None, :]


def _cuda_call_meta(rt, pass_index, m, device):
    """Per kernel call of chunk ``m``: (q_home, kv_home, q vectors, kv vectors, cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k) as flash_attn_varlen_func takes them. Fixed by the schedule, so built
    once per (pass, chunk, device) and kept on the runtime: every layer and step reuses them instead of
    copying index arrays to the device per call."""
    key = (pass_index, m, device)
    meta = rt._cuda_meta.get(key)
    if meta is not None:
        return meta
    calls = rt.schedule["calls"][pass_index][m]
    # Forward and backward run the same calls (same tiles, same buffers): one set of index tensors
    # serves both, which halves their device memory (90-112 MiB a worker at 256K tokens, CP 8).
    other = rt._cuda_meta.get((1 - pass_index, m, device))
    if other is not None and _same_calls(calls, rt.schedule["calls"][1 - pass_index][m]):
        rt._cuda_meta[key] = other
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
        cu_q = torch.from_numpy(np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)).to(device)
        cu_k = torch.from_numpy(np.concatenate([[0], np.cumsum(nk)]).astype(np.int32)).to(device)
        meta.append((bool(q_home), bool(kv_home), qv, kv, cu_q, cu_k, int(nq.max()), int(nk.max())))
    rt._cuda_meta[key] = meta
    return meta


def _same_calls(a, b):
    return len(a) == len(b) and all(
        x[3] == y[3] and x[4] == y[4] and tuple(x[0]) == tuple(y[0]) and tuple(x[1]) == tuple(y[1])
        and np.array_equal(np.asarray(x[2]), np.asarray(y[2])) for x, y in zip(a, b))


def _cuda_calls(meta, home, comp, window, scale):
    """Runs a chunk's calls (their _cuda_call_meta) with flash_attn_varlen_func (differentiable) on the
    Q, K, V of `home` and `comp` (each call reads the buffers its flags name); returns
    [(q_home, q vectors, o)]."""
    fn = _flash_attn()
    ws = (-1, -1) if window is None else (int(window) - 1, 0)
    out = []
    for q_home, kv_home, qv, kv, cu_q, cu_k, max_q, max_k in meta:
        bq, bk = home if q_home else comp, home if kv_home else comp
        o = fn(bq["Q"][qv], bk["K"][kv], bk["V"][kv], cu_q, cu_k, max_q, max_k,
               softmax_scale=scale, causal=True, window_size=ws)
        out.append((q_home, qv, o))
    return out


def _cuda_pass(rt, pass_index, m, home, comp, scale):
    meta = _cuda_call_meta(rt, pass_index, m, home["Q"].device)
    if not meta:
        return
    window = rt.window
    bufs = {True: home, False: comp}  # by a call's q_home / kv_home
    if pass_index == 0:
        with torch.no_grad():
            for q_home, qv, o in _cuda_calls(meta, home, comp, window, scale):
                dst = bufs[q_home]["O"]
                dst[qv] = o.to(dst.dtype)
        return
    # Backward: flash_attn's own backward, through autograd on a recomputed forward, with one leaf
    # per buffer the calls read (home or compute Q; K and V), each gradient added where the kernel
    # would add it (dQ of a row is computed once, so adding into the zeroed dQ assigns it).
    read = sorted({(c[0], "Q") for c in meta} | {(c[1], n) for c in meta for n in ("K", "V")})
    with torch.enable_grad():
        leaves = {key: bufs[key[0]][key[1]].detach().requires_grad_() for key in read}
        src = {where: {n: leaves.get((where, n)) for n in ("Q", "K", "V")} for where in (True, False)}
        res = _cuda_calls(meta, src[True], src[False], window, scale)
        grads = torch.autograd.grad([o for _, _, o in res], [leaves[key] for key in read],
                                    [bufs[q_home]["dO"][qv] for q_home, qv, _ in res], allow_unused=True)
    for (where, n), g in zip(read, grads):
        if g is not None:
            bufs[where]["d" + n] += g.float()


# Test-only: "flash" makes every pass take the CUDA tensors' path (flash_attn_varlen_func, as
# _flash_attn returns it, and the index-tensor exchanges) whatever the tensors' device, so the tests
# run that path on CPU with a stand-in for flash_attn. None: CUDA tensors take it, CPU tensors not.
_compute_backend = None
