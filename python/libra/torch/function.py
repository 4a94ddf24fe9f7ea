"""The autograd function that runs one pass per direction of the pipelined schedule,
and ``attention``, the public call."""
import math

import torch

from . import backends
from .compute import run_chunk
from .exchange import (_BWD_IN, _BWD_OUT, _FWD_IN, _FWD_OUT, _post, _post_cpu, _unpack_in, _unpack_in_cpu,
                       _unpack_out, _unpack_out_cpu)
from .runtime import PlanRuntime
from .trace import _compute


class _Attention(torch.autograd.Function):
    """libra's pipelined executor on torch tensors (libra/schedule.hpp's loop).

    Each pass, per chunk m: post in(m) for every chunk up front, wait in(m),
    unpack, compute the chunk's kernel calls, pack and post out(m); then wait
    every out and apply them in the schedule's fixed order. Forward: Q, K, V
    in; O, LSE out. Backward: Q, dO, O, LSE, K, V in; dQ assigned and fp32
    dK/dV partial sums added at home. Calls flagged q_home / kv_home read and
    write the home tensors in place instead of compute buffers. Only the home
    tensors are saved between the passes.
    """

    @staticmethod
    def forward(ctx, q, k, v, rt, scale):
        d, dt, dev = rt.head_dim, q.dtype, q.device
        sd = rt.schedule
        cq, ckv = sd["compute_q_vectors"], sd["compute_kv_vectors"]
        home = {"Q": q.view(-1, d), "K": k.view(-1, d), "V": v.view(-1, d),
                "O": torch.zeros_like(q).view(-1, d),
                "LSE": torch.zeros((q.shape[0] * q.shape[1], 1), dtype=torch.float32, device=dev)}
        comp = {"Q": q.new_zeros((cq, d)), "K": q.new_zeros((ckv, d)), "V": q.new_zeros((ckv, d)),
                "O": q.new_zeros((cq, d)), "LSE": torch.zeros((cq, 1), dtype=torch.float32, device=dev)}
        _run_pass(rt, _FWD_IN, _FWD_OUT, 0, home, comp, dt, d, dev, scale)
        o = home["O"].view(q.shape)
        ctx.rt, ctx.scale, ctx.lse = rt, scale, home["LSE"]
        ctx.save_for_backward(q, k, v, o)
        return o

    @staticmethod
    def backward(ctx, do):
        rt, scale = ctx.rt, ctx.scale
        q, k, v, o = ctx.saved_tensors
        o, lse = o.view(-1, rt.head_dim), ctx.lse
        d, dt, dev = rt.head_dim, q.dtype, q.device
        sd = rt.schedule
        cq, ckv = sd["compute_q_vectors"], sd["compute_kv_vectors"]
        f32 = dict(dtype=torch.float32, device=dev)
        home = {"Q": q.view(-1, d), "K": k.view(-1, d), "V": v.view(-1, d), "O": o, "LSE": lse,
                "dO": do.contiguous().view(-1, d).to(dt), "dQ": torch.zeros((q.numel() // d, d), **f32),
                "dK": torch.zeros((k.numel() // d, d), **f32), "dV": torch.zeros((v.numel() // d, d), **f32)}
        comp = {n: q.new_zeros((cq if n in ("Q", "O", "dO") else ckv, d)) for n in ("Q", "K", "V", "O", "dO")}
        comp["LSE"] = torch.zeros((cq, 1), **f32)
        comp["dQ"] = torch.zeros((cq, d), **f32)
        comp["dK"] = torch.zeros((ckv, d), **f32)
        comp["dV"] = torch.zeros((ckv, d), **f32)
        _run_pass(rt, _BWD_IN, _BWD_OUT, 1, home, comp, dt, d, dev, scale)
        return (home["dQ"].view(q.shape).to(dt), home["dK"].view(k.shape).to(dt), home["dV"].view(v.shape).to(dt),
                None, None)


def _run_pass(rt, phase_in, phase_out, pass_index, home, comp, dt, d, dev, scale):
    """One pass of the pipelined schedule: post every chunk's input exchange, then per chunk wait for
    its input, compute it on the selected backend and post its output; finally apply the outputs in
    the schedule's fixed order. A ``buffers`` backend on CPU tensors packs with the binding's C++
    programs (unless PlanRuntime(exchange="index")); every other case uses index tensors on the
    tensors' device."""
    backend = backends.select(dev, dt)
    index = backend.kind == "varlen" or rt.exchange == "index"
    if index:
        ix = rt.on(dev)
        ins, outs = ix["phases"][phase_in]["chunks"], ix["phases"][phase_out]["chunks"]
        posted_in = [_post(rt, phase_in, m, ex, home, dt, d, dev) for m, ex in enumerate(ins)]
    else:
        posted_in = [_post_cpu(rt, phase_in, m, home, dt, d) for m in range(rt.num_chunks)]
    posted_out = []
    for m in range(rt.num_chunks):
        if index:
            _unpack_in(ins[m], posted_in[m], comp)
        else:
            _unpack_in_cpu(rt, phase_in, m, posted_in[m], comp, dt)
        with _compute(rt, f"{'fwd' if pass_index == 0 else 'bwd'} compute chunk {m}"):
            run_chunk(rt, backend, pass_index, m, home, comp, scale)
        if index:
            posted_out.append(_post(rt, phase_out, m, outs[m], comp, dt, d, dev))
        else:
            posted_out.append(_post_cpu(rt, phase_out, m, comp, dt, d))
    if index:
        _unpack_out(ix["phases"][phase_out]["apply"], posted_out, home)
    else:
        _unpack_out_cpu(rt, phase_out, posted_out, home, dt)


def _call_problem(q, k, v, rt, window):
    """What is wrong with an attention call's arguments, or None."""
    if window != rt.window:
        return f"window {window} differs from the plan's window {rt.window}"
    want_q = (rt.home_rows, rt.heads_q, rt.head_dim)
    want_kv = (rt.home_rows, rt.heads_kv, rt.head_dim)
    for name, t, want in (("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            return f"{name} has shape {shape} but the plan needs {list(want)}"
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        return (f"q, k and v must share dtype and device, got q {q.dtype} on {q.device}, k {k.dtype} on "
                f"{k.device}, v {v.dtype} on {v.device}")
    try:
        backends.select(q.device, q.dtype)
    except ValueError as e:
        return str(e).removeprefix("libra.torch.attention: ")
    return None


def attention(q, k, v, runtime, softmax_scale=None, window=None):
    """Core attention of this worker's home tokens under ``runtime``'s plan; differentiable.

    q: [L/cp, h_q, d]; k, v: [L/cp, h_kv, d] (THD, this worker's home rows of
    its slot's packed sequence); returns o like q. ``window`` must equal the
    plan's (None: plain causal); the masks are bottom-right causal per sample.
    """
    if not isinstance(runtime, PlanRuntime):
        raise ValueError("libra.torch.attention: runtime must be a libra.torch.PlanRuntime")
    if torch.compiler.is_compiling():
        # torch.compile traces one opaque op (ops.py) instead, which runs this function eagerly inside:
        # the checks below gather Python objects across the group, which no graph can hold.
        from .ops import attention_op
        return attention_op(q, k, v, runtime, softmax_scale, window)
    rt = runtime
    scale, scale_problem = _softmax_scale(softmax_scale)
    problem = _call_problem(q, k, v, rt, window) or scale_problem
    if rt.check_calls:
        # One small collective so that a bad call on one rank fails on every rank with the same line
        # instead of leaving the others waiting in the exchange (PlanRuntime(check_calls=False) skips it).
        first = rt._agree(problem, "libra.torch.attention")
        if first is not None:
            raise ValueError(f"libra.torch.attention: group rank {first[0]}: {first[1]}")
    elif problem is not None:
        raise ValueError(f"libra.torch.attention: {problem}")
    if scale == 0.0:
        # Scale 0 is legal math (every visible key weighs the same), but libra's kernel reads 0 as
        # "1/sqrt(d)". q * 0 at scale 1 gives the same scores (all 0), o, LSE and dk (0), and the
        # multiply sends dq = 0 back to q.
        q, scale = q * 0, 1.0
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), runtime, scale)


def _softmax_scale(value):
    """(the scale to run, None for 1/sqrt(head_dim); a problem line or None) of ``softmax_scale``."""
    if value is None:
        return None, None
    try:  # numbers and 0-d tensors; float() of a str would read text as a number
        scale = None if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError, RuntimeError):
        scale = None
    if scale is None:
        return None, f"softmax_scale {value!r}: must be a number or None"
    if not math.isfinite(scale):
        return None, f"softmax_scale {scale}: must be finite"
    return scale, None
