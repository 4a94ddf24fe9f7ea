"""The autograd function that runs one pass per direction of the pipelined schedule,
and ``attention``, the public call."""
import torch
import torch.distributed as dist

from .. import _libra
from . import compute as _compute_mod
from .compute import _cpu_backward, _cpu_forward, _cuda_pass
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
    window = _libra.FULL_CAUSAL if rt.window is None else int(rt.window)
    calls = rt.schedule["calls"][pass_index]
    if _compute_mod._compute_backend not in (None, "flash"):
        raise ValueError(f"libra.torch.compute._compute_backend {_compute_mod._compute_backend!r} must be None or 'flash'")
    on_gpu = dev.type == "cuda" or _compute_mod._compute_backend == "flash"
    cuda = on_gpu or rt.exchange == "index"  # index-tensor exchanges
    if cuda:
        ix = rt.on(dev)
        ins, outs = ix["phases"][phase_in]["chunks"], ix["phases"][phase_out]["chunks"]
        posted_in = [_post(rt, phase_in, m, ex, home, dt, d, dev) for m, ex in enumerate(ins)]
    else:
        posted_in = [_post_cpu(rt, phase_in, m, home, dt, d) for m in range(rt.num_chunks)]
    posted_out = []
    for m in range(rt.num_chunks):
        if cuda:
            _unpack_in(ins[m], posted_in[m], comp)
        else:
            _unpack_in_cpu(rt, phase_in, m, posted_in[m], comp, dt)
        with _compute(rt, f"{'fwd' if pass_index == 0 else 'bwd'} compute chunk {m}"):
            if on_gpu:
                _cuda_pass(rt, pass_index, m, home, comp, scale or None)
            elif pass_index == 0:
                _cpu_forward(calls[m], home, comp, window, scale, rt.threads)
            else:
                _cpu_backward(calls[m], home, comp, window, scale, rt.threads)
        if cuda:
            posted_out.append(_post(rt, phase_out, m, outs[m], comp, dt, d, dev))
        else:
            posted_out.append(_post_cpu(rt, phase_out, m, comp, dt, d))
    if cuda:
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
        return "q, k and v must share dtype and device"
    if not q.is_cuda and q.dtype not in (torch.float32, torch.bfloat16):
        return f"CPU tensors must be float32 or bfloat16, got {q.dtype}"
    if q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16):
        return f"CUDA tensors must be float16 or bfloat16 (flash_attn's types), got {q.dtype}"
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
    problem = _call_problem(q, k, v, rt, window)
    if rt.check_calls:
        # One small collective so that a bad call on one rank fails on every rank with the same line
        # instead of leaving the others waiting in the exchange (PlanRuntime(check_calls=False) skips it).
        flag = torch.tensor([0 if problem is None else 1], dtype=torch.int64)
        dist.all_reduce(flag, group=rt.group)
        if int(flag[0]):
            msgs = [None] * dist.get_world_size(rt.group)
            dist.all_gather_object(msgs, problem, group=rt.group)
            first = next(i for i, m in enumerate(msgs) if m is not None)
            raise ValueError(f"libra.torch.attention: group rank {first}: {msgs[first]}")
    elif problem is not None:
        raise ValueError(f"libra.torch.attention: {problem}")
    if q.is_cuda:
        _compute_mod._flash_attn()
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), runtime, scale)
