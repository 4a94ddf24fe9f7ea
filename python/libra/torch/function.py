"""The autograd function that runs one pass per direction of the pipelined schedule,
and ``attention``, the public call."""
import math
import struct
import warnings

import torch

from . import _fault, backends
from .compute import run_chunk
from .exchange import apply as _apply
from .exchange import post as _post
from .exchange import scatter as _scatter
from .runtime import PlanRuntime
from .trace import _compute


class _Attention(torch.autograd.Function):
    """libra's pipelined executor on torch tensors: the worker's flat program (libra/program.hpp)
    carried out in the C++ engine's order.

    Each pass: post in(0); per chunk m: post in(m+1), wait in(m), scatter,
    compute the chunk's kernel calls while chunk m+1 arrives and chunk m-1
    returns, gather and post out(m); then wait every out and apply them in the
    program's fixed order. A relayed runtime also runs each chunk's stage
    exchange a chunk ahead of its In exchange (``_run_pass``). Forward: Q, K, V
    in; O, LSE out. Backward: Q, dO, O, LSE, K, V in; dQ assigned and fp32
    dK/dV partial sums added at home. Calls flagged q_home / kv_home read and
    write the home tensors in place instead of compute buffers. Only the home
    tensors are saved between the passes.
    """

    @staticmethod
    def forward(ctx, q, k, v, rt, scale, want_lse=False):
        d, dt, dev = rt.head_dim, q.dtype, q.device
        sd = rt.schedule
        cq, ckv = sd["compute_q_vectors"], sd["compute_kv_vectors"]
        backend = backends.select(dev, dt)
        hq = q.numel() // d
        home, comp, joined = _buffers({"Q": (q.view(-1, d), cq), "K": (k.view(-1, d), ckv), "V": (v.view(-1, d), ckv),
                                       "O": ((hq, d, dt), cq), "LSE": ((hq, 1, torch.float32), cq)},
                                      backend.kind == "varlen", dev)
        _run_pass(rt, 0, home, comp, dt, d, dev, scale, backend, joined)
        if joined is not None:  # what is kept of the joined buffers: the home halves alone
            home["O"], home["LSE"] = home["O"].clone(), home["LSE"].clone()
        o = home["O"].view(q.shape)
        ctx.rt, ctx.scale, ctx.lse = rt, scale, home["LSE"]
        ctx.save_for_backward(q, k, v, o)
        if not want_lse:
            return o
        # flash-attn's varlen layout [h_q, total]; a result, not differentiable.
        lse = home["LSE"].view(q.shape[0], q.shape[1]).t().contiguous()
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse=None):
        rt, scale = ctx.rt, ctx.scale
        q, k, v, o = ctx.saved_tensors
        o, lse = o.view(-1, rt.head_dim), ctx.lse
        d, dt, dev = rt.head_dim, q.dtype, q.device
        sd = rt.schedule
        cq, ckv = sd["compute_q_vectors"], sd["compute_kv_vectors"]
        f32 = torch.float32
        backend = backends.select(dev, dt)
        hq, hkv = q.numel() // d, k.numel() // d
        home, comp, joined = _buffers({"Q": (q.view(-1, d), cq), "K": (k.view(-1, d), ckv), "V": (v.view(-1, d), ckv),
                                       "O": (o, cq), "LSE": (lse, cq), "dO": (do.contiguous().view(-1, d).to(dt), cq),
                                       "dQ": ((hq, d, f32), cq), "dK": ((hkv, d, f32), ckv), "dV": ((hkv, d, f32), ckv)},
                                      backend.kind == "varlen", dev)
        _run_pass(rt, 1, home, comp, dt, d, dev, scale, backend, joined)
        return (home["dQ"].view(q.shape).to(dt), home["dK"].view(k.shape).to(dt), home["dV"].view(v.shape).to(dt),
                None, None, None)


def _buffers(fields, join, dev):
    """(home, compute, joined) buffers from {field: (home, n)}: ``home`` is the field's home vectors
    (a [rows, width] tensor) or (rows, width, dtype) for zeros, and n compute vectors, zeros. Joined
    (the varlen backends): one buffer per field, home vectors first, and the home and compute
    buffers are its two halves (compute.py runs a chunk's calls on both as one); else separate
    buffers, the home tensors themselves, and ``joined`` is None."""
    home, comp, joined = {}, {}, ({} if join else None)
    for f, (h, n) in fields.items():
        given = torch.is_tensor(h)
        rows, width, dtype = (h.shape[0], h.shape[1], h.dtype) if given else h
        if join:
            j = (torch.cat([h, h.new_zeros((n, width))]) if given
                 else torch.zeros((rows + n, width), dtype=dtype, device=dev))
            joined[f], home[f], comp[f] = j, j[:rows], j[rows:]
        else:
            home[f] = h if given else torch.zeros((rows, width), dtype=dtype, device=dev)
            comp[f] = torch.zeros((n, width), dtype=dtype, device=dev)
    return home, comp, joined


def _staging(rt, pass_index, home, dev):
    """The staging buffers of a relayed pass (Loc kStage), one per In field, sized by the schedule;
    every vector a main exchange sends from them is landed by its stage exchange first."""
    sd = rt.schedule
    fields = ("Q", "K", "V") if pass_index == 0 else ("Q", "dO", "O", "LSE", "K", "V")
    return {f: home[f].new_empty((sd["stage_kv_vectors"] if f in ("K", "V") else sd["stage_q_vectors"],
                                  home[f].shape[1]), device=dev) for f in fields}


def _run_pass(rt, pass_index, home, comp, dt, d, dev, scale, backend, joined=None):
    """One pass of the pipelined program, the C++ engine's loop (src/exec/executor.cpp): post chunk
    0's input; per chunk m, post chunk m+1's input, wait for chunk m's only, compute it on the
    selected backend while chunk m+1 arrives and chunk m-1 returns, post chunk m's output; finally
    apply every output in the program's fixed order. The same index ops on every device.

    Relayed (``PlanRuntime(relay=True)`` on a plan that relays): chunk m's In exchange sends from
    the relays' staging buffers, so its stage exchange must have landed before it is posted; stages
    run a chunk ahead (post and land stage 0, post in 0, post stage 1; per m, land stage m+1 before
    posting in m+1, then post stage m+2). Every rank posts the same collectives in the same order,
    the C++ engine's among them."""
    prog = rt.on(dev, backend)[pass_index]
    if backend.kind == "varlen":
        for b in (home, comp, joined):  # the LSE buffers flat, as the merged varlen calls index them (compute.py)
            b["LSE1"] = b["LSE"].view(-1)
    M = rt.num_chunks
    relayed = bool(prog["stage"])
    # By the program's Loc: home 0, compute 1, (2 is the wire), stage 3.
    bufs = (home, comp, None, _staging(rt, pass_index, home, dev)) if relayed else (home, comp)
    staged = {}

    def post_stage(j):
        if relayed and j < M:
            staged[j] = _post(rt, pass_index, "stage", j, prog["stage"][j], bufs, dt, d, dev)

    def land_stage(j):
        if relayed:
            _scatter(prog["stage"][j], staged.pop(j), bufs)

    _fault.point("before-post", rt)
    post_stage(0)
    land_stage(0)
    posted_in = [_post(rt, pass_index, "in", 0, prog["in"][0], bufs, dt, d, dev)]
    # Stage 1 after in 0: on NVLink beside in 0's cross-node bytes, not ahead of stage 0.
    post_stage(1)
    _fault.point("mid-pass", rt)
    posted_out = []
    for m in range(M):
        if m + 1 < M:
            land_stage(m + 1)
            posted_in.append(_post(rt, pass_index, "in", m + 1, prog["in"][m + 1], bufs, dt, d, dev))
            post_stage(m + 2)
        _scatter(prog["in"][m], posted_in[m], bufs)
        with _compute(rt, f"{'fwd' if pass_index == 0 else 'bwd'} compute chunk {m}"):
            _fault.point("kernel", rt)
            run_chunk(rt, backend, pass_index, m, home, comp, scale, joined)
        posted_out.append(_post(rt, pass_index, "out", m, prog["out"][m], bufs, dt, d, dev))
    _apply(prog["apply"], posted_out, bufs)
    _fault.point("output", rt)


_UNSET = object()  # attention's window= not given (None means plain causal there)
_COMPILED_OP = None  # ops.attention_op, set when ops.py is imported (libra.torch's __init__ imports it)


def _plan_window_size(rt):
    return (-1, 0) if rt.window is None else (int(rt.window) - 1, 0)


def _mask_problem(rt, window, causal, window_size):
    """What contradicts the plan in the mask arguments, or None. flash-attn's terms: causal=True,
    window_size=(left, right) lets query i see keys [i - left, i + right] (-1: unbounded); a plan of
    window w is (w - 1, 0), plain causal (-1, 0)."""
    if causal is not True and causal != 1:
        return (f"causal={causal!r}: libra plans causal attention only (bottom-right per sample); "
                "non-causal masks cannot be expressed")
    if window_size is not None:
        ok = isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in window_size)
        if not ok:
            return f"window_size {window_size!r}: must be a pair of ints (left, right), -1 for unbounded"
        left, right = window_size
        if right not in (0, -1) or left < -1:
            return (f"window_size ({left}, {right}): the plan cannot express it (causal plans need right 0 or -1 "
                    "and left >= -1)")
        want = None if left == -1 else left + 1
        if want != rt.window:
            return (f"window_size ({left}, {right}) contradicts the plan's window_size {_plan_window_size(rt)} "
                    f"(plan window {rt.window})")
    if window is not _UNSET and window != rt.window:
        return f"window {window} differs from the plan's window {rt.window}"
    return None


def _boundary_problem(rt, cu_seqlens, position_ids):
    """Whether the caller's sample boundaries are this runtime's (a runtime of another micro-batch,
    or data in another home layout, would compute silently wrong attention), or None."""
    n = rt.home_tokens
    stale = "this runtime is not the plan of the data (one PlanRuntime per micro-batch, same home layout)"
    if position_ids is not None:
        p = position_ids
        if isinstance(p, torch.Tensor) and p.dim() == 2 and p.shape[0] == 1:
            p = p[0]
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.shape[0] != rt.home_rows:
            shape = list(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
            return f"position_ids has shape {shape} but this rank's home needs [{rt.home_rows}] or [1, {rt.home_rows}]"
        want = rt._position_on.get(p.device)
        if want is None:
            want = rt._position_on[p.device] = rt.position_ids[:n].to(p.device)
        bad = (p[:n] != want).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            return (f"position_ids differ from the plan's at home row {i} (got {int(p[i])}, plan {int(want[i])}): "
                    + stale)
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
            return "cu_seqlens must be a 1-D integer tensor (flash-attn's cumulative sequence lengths)"
        got = [int(x) for x in cu_seqlens.tolist()]
        home = [int(x) for x in rt.cu_seqlens.tolist()]
        packed = [int(x) for x in rt.packed_cu_seqlens.tolist()]
        L = rt.plan.config["seq_len"]
        # This rank's home rows, or the slot's whole packed sequence (TE / Megatron pass those under
        # CP); padding as one last segment is flash-attn practice too.
        accepted = (home, packed) + ((home + [rt.home_rows],) if rt.padding_rows else ()) + (
            (packed + [L],) if packed[-1] < L else ())
        if got not in accepted:
            def short(xs):
                return str(xs) if len(xs) <= 8 else f"[{', '.join(map(str, xs[:6]))}, ... {xs[-1]}] ({len(xs)} entries)"
            return (f"cu_seqlens {short(got)} match neither this rank's home rows' {short(home)} nor the packed "
                    f"sequence's {short(packed)}: " + stale)
    return None


def _call_problem(q, k, v, rt, window, causal=True, window_size=None, cu_seqlens=None, position_ids=None,
                  return_lse=False):
    """What is wrong with an attention call's arguments, or None."""
    if not isinstance(return_lse, bool):  # "no" read as True
        return f"return_lse {return_lse!r}: must be True or False"
    mask = _mask_problem(rt, window, causal, window_size)
    if mask is not None:
        return mask
    problem = _tensor_problem(q, k, v, rt)
    if problem is not None:
        return problem
    if return_lse:
        backend = backends.select(q.device, q.dtype)
        if not backend.gives_lse():
            return f"return_lse=True: the {backend.name} backend that runs these tensors gives no LSE"
    return _boundary_problem(rt, cu_seqlens, position_ids)


def _tensor_problem(q, k, v, rt):
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


def attention(q, k, v, runtime, softmax_scale=None, window=_UNSET, *, causal=True, window_size=None,
              cu_seqlens=None, position_ids=None, return_lse=False):
    """Core attention of this worker's home tokens under ``runtime``'s plan; differentiable.

    q: [L/cp, h_q, d]; k, v: [L/cp, h_kv, d] (THD, this worker's home rows of
    its slot's packed sequence, in the plan's home layout: ``runtime.packed_rows``);
    returns o like q, and with ``return_lse=True`` also (o, lse), lse the softmax
    log-sum-exp (natural log, of the scaled scores) per q head and home row,
    fp32 [h_q, L/cp] (flash-attn's varlen layout; padding rows 0; not
    differentiable; CPU kernel only).

    The mask is causal (bottom-right) per sample with the plan's window, in
    flash-attn's terms ``causal=True, window_size=(w - 1, 0)`` ((-1, 0) or
    (-1, -1): plain causal). Both default to the plan's; a window_size that
    contradicts it, ``causal=False`` or a right window > 0 raise.
    ``window=`` is the deprecated alias: the plan's width w, None for plain causal.

    ``cu_seqlens`` (flash-attn's, over this rank's home rows: ``runtime.cu_seqlens``, or
    over the slot's whole packed sequence: ``runtime.packed_cu_seqlens``; either
    optionally with padding as a last segment) and ``position_ids`` ([L/cp] or
    [1, L/cp], per sample from 0: ``runtime.position_ids``; padding rows not
    checked) are the caller's sample boundaries, checked against the plan.
    Any problem raises the same one-line ValueError on every rank of the group.
    """
    if not isinstance(runtime, PlanRuntime):
        raise ValueError("libra.torch.attention: runtime must be a libra.torch.PlanRuntime")
    if torch.compiler.is_compiling():
        # torch.compile traces one opaque op (ops.py) instead, which runs this function eagerly inside:
        # the checks below gather Python objects across the group, which no graph can hold.
        if not isinstance(return_lse, bool):  # the op takes bool(return_lse): "no" would be True
            raise ValueError(f"libra.torch.attention: return_lse {return_lse!r}: must be True or False")
        return _COMPILED_OP(q, k, v, runtime, softmax_scale, window, causal=causal, window_size=window_size,
                            cu_seqlens=cu_seqlens, position_ids=position_ids, return_lse=return_lse)
    if window is not _UNSET:
        warnings.warn("libra.torch.attention: window= is deprecated; the plan's window is the default "
                      "(window_size=(w - 1, 0) in flash-attn's terms)", DeprecationWarning, stacklevel=2)
    rt = runtime
    scale, scale_problem = _softmax_scale(softmax_scale)
    problem = _call_problem(q, k, v, rt, window, causal, window_size, cu_seqlens, position_ids,
                            return_lse) or scale_problem
    if rt.check_calls:
        # One small collective so that a bad call on one rank fails on every rank with the same line
        # instead of leaving the others waiting in the exchange (PlanRuntime(check_calls=False) skips it).
        # It also carries what each rank passes that changes the numbers, which must be the same on
        # every rank even where each is valid alone (another scale or dtype on one rank computed
        # silently wrong attention, or aborted gloo).
        everyone, first = rt._agree_words(_call_words(q, k, v, rt, scale, return_lse), problem,
                                          "libra.torch.attention")
        if first is not None:
            raise ValueError(f"libra.torch.attention: group rank {first[0]}: {first[1]}")
        differs = _call_disagreement(everyone)
        if differs is not None:
            raise ValueError(f"libra.torch.attention: {differs}")
    elif problem is not None:
        raise ValueError(f"libra.torch.attention: {problem}")
    if scale == 0.0:
        # Scale 0 is legal math (every visible key weighs the same), but libra's kernel reads 0 as
        # "1/sqrt(d)". q * 0 at scale 1 gives the same scores (all 0), o, LSE and dk (0), and the
        # multiply sends dq = 0 back to q.
        q, scale = q * 0, 1.0
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), runtime, scale, bool(return_lse))


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_DEVICES = ("cpu", "cuda")


def _call_words(q, k, v, rt, scale, return_lse):
    """The arguments of an attention call that change the numbers, as int64 words (as many on every
    rank): the effective softmax scale's float64 bits, q/k/v's dtypes, device type and shapes, and
    return_lse. The mask arguments and sample boundaries are checked against the plan itself, which
    the ranks agreed on at construction."""
    eff = 1.0 / math.sqrt(rt.head_dim) if scale is None else float(scale)
    words = [struct.unpack("<q", struct.pack("<d", eff))[0], int(bool(return_lse))]
    for t in (q, k, v):
        tensor = isinstance(t, torch.Tensor)
        words.append(_DTYPES.index(t.dtype) + 1 if tensor and t.dtype in _DTYPES else 0)
        words.append(_DEVICES.index(t.device.type) + 1 if tensor and t.device.type in _DEVICES else 0)
        shape = list(t.shape)[:3] if tensor else []
        words += shape + [-1] * (3 - len(shape))
    return words


def _call_disagreement(everyone):
    """The line naming the first argument whose words differ between group rank 0 and another rank,
    or None; the same on every rank, as every rank has every rank's words."""
    def value(name, w):
        if name == "softmax_scale":
            return repr(struct.unpack("<d", struct.pack("<q", w[0]))[0])
        if name == "return_lse":
            return repr(bool(w[1]))
        i = 2 + 5 * "qkv".index(name[0])
        if name.endswith("dtype"):
            return str(_DTYPES[w[i] - 1]) if w[i] else "?"
        if name.endswith("device"):
            return _DEVICES[w[i + 1] - 1] if w[i + 1] else "?"
        return str([x for x in w[i + 2:i + 5] if x >= 0])

    names = ["softmax_scale", "return_lse"] + [f"{t} {what}" for t in "qkv" for what in ("dtype", "device", "shape")]
    for r, w in enumerate(everyone[1:], start=1):
        for name in names:
            if value(name, w) != value(name, everyone[0]):
                return (f"{name} differs across the group: group rank 0 passes {value(name, everyone[0])}, group "
                        f"rank {r} {value(name, w)}; every rank of the group must pass the same")
    return None


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
