"""``libra::attention`` as a torch.library custom op, what ``attention`` becomes under torch.compile.

torch.compile cannot trace into libra's pass (C++ kernel calls on raw pointers, asynchronous
all-to-alls, checks that gather Python objects across the group), so under compilation
``attention`` hands the call to one opaque op and the graph does not break there:

    libra::attention(q, k, v, handle, scale, window, causal, window_size, cu_seqlens, position_ids,
                     want_lse) -> (o, lse)
    libra::attention_backward(q, k, v, o, lse, do, handle, scale) -> (dq, dk, dv)

with a registered autograd formula (the first op's backward calls the second) and fake
implementations (shapes only) for tracing. A PlanRuntime is not a value torch.library can carry,
so each runtime registers itself at construction (runtime.register) and the ops take its handle: a 0-dim int64
CPU tensor (``PlanRuntime.op_handle``). Being a tensor, the handle is a graph input, not a constant
baked into the graph, so a new runtime per micro-batch reuses the compiled graph instead of
recompiling it.

The forward op runs the eager ``attention`` (every argument check, the collective agreement of
``check_calls``) and the backward op ``_Attention.backward`` on the saved home tensors, so the
compiled and eager paths compute bit for bit the same. Both ops contain collectives over the
runtime's group: every rank must run the same ops in the same order. Each rank compiles the same
graph to the same schedule, and a rank's attention calls depend on each other through the model's
data, which tests/python/test_compile_wrap.py checks with two attention layers whose backward
calls are independent of each other in the graph.
"""
import types
import typing
import warnings

import torch

from . import function
from .function import _UNSET, _Attention, attention
from .runtime import _RUNTIMES  # noqa: F401  (handle -> live runtime; tests count them)
from .runtime import runtime_of as _runtime

_WINDOW_UNSET, _WINDOW_NONE = -2, -1  # the op's encodings of attention's window= (not given; None)


@torch.library.custom_op("libra::attention", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: torch.Tensor,
                   scale: typing.Optional[float], window: int, causal: bool,
                   window_size: typing.Optional[typing.List[int]], cu_seqlens: typing.Optional[torch.Tensor],
                   position_ids: typing.Optional[torch.Tensor], want_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rt = _runtime(handle)
    kw = dict(causal=causal, window_size=None if window_size is None else tuple(window_size), cu_seqlens=cu_seqlens,
              position_ids=position_ids, return_lse=want_lse)
    # window: _WINDOW_UNSET (not given), _WINDOW_NONE (None: plain causal) or the width.
    win = _UNSET if window == _WINDOW_UNSET else None if window == _WINDOW_NONE else window
    # The eager call on fresh leaves, for its checks and its saved LSE (the autograd node is the ctx);
    # under inference_mode too, where the inputs are inference tensors, which autograd cannot record.
    with torch.inference_mode(False), torch.enable_grad(), warnings.catch_warnings():
        # window= is deprecated; the eager call would say so at every step of the compiled graph.
        warnings.simplefilter("ignore", DeprecationWarning)
        leaves = [(x.clone() if x.is_inference() else x.detach()).requires_grad_() for x in (q, k, v)]
        o = attention(*leaves, rt, scale, win, **kw)
    if want_lse:
        o = o[0]
    return o.detach(), o.grad_fn.lse


@_attention_fwd.register_fake
def _(q, k, v, handle, scale, window, causal, window_size, cu_seqlens, position_ids, want_lse):
    return q.new_empty(q.shape), q.new_empty((q.shape[0] * q.shape[1], 1), dtype=torch.float32)


@torch.library.custom_op("libra::attention_backward", mutates_args=())
def _attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   do: torch.Tensor, handle: torch.Tensor,
                   scale: typing.Optional[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    zero = scale == 0.0
    if zero:
        # What the eager call ran for scale 0 (libra's kernel reads 0 as 1/sqrt(d)): q * 0 at scale 1,
        # whose multiply sends dq = 0 back to q.
        q, scale = q * 0, 1.0
    ctx = types.SimpleNamespace(rt=_runtime(handle), scale=scale, lse=lse, saved_tensors=(q, k, v, o))
    dq, dk, dv = _Attention.backward(ctx, do)[:3]
    if zero:
        dq = torch.zeros_like(dq)
    # A custom op's outputs may not alias its inputs or each other.
    return dq.clone(), dk.clone(), dv.clone()


@_attention_bwd.register_fake
def _(q, k, v, o, lse, do, handle, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, handle, scale = inputs[:5]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, handle)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, handle = ctx.saved_tensors
    dq, dk, dv = _attention_bwd(q, k, v, o, lse, do.contiguous(), handle, ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd("libra::attention", _backward, setup_context=_setup_context)


_NOT_GIVEN = object()


def attention_op(q, k, v, runtime, softmax_scale=None, window=_NOT_GIVEN, *, causal=True, window_size=None,
                 cu_seqlens=None, position_ids=None, return_lse=False):
    """``attention`` through the custom op (what ``attention`` calls while torch.compile traces).

    The scale goes into the op as it is (a compiled function's float argument is symbolic here) and
    the eager call inside checks it and everything else, so a bad call raises the eager line on
    every rank. ``window`` is attention's deprecated ``window=`` (its sentinel when not given)."""
    if isinstance(softmax_scale, int) and not isinstance(softmax_scale, bool):
        softmax_scale = float(softmax_scale)
    if window is _UNSET or window is _NOT_GIVEN:
        win = _WINDOW_UNSET
    elif window is None:
        win = _WINDOW_NONE
    else:
        win = int(window)
    ws = None if window_size is None else [int(w) for w in window_size]
    o, lse = _attention_fwd(q.contiguous(), k.contiguous(), v.contiguous(), runtime.op_handle, softmax_scale, win,
                            bool(causal), ws, cu_seqlens, position_ids, bool(return_lse))
    if not return_lse:
        return o
    # attention's LSE: flash-attn's varlen layout [h_q, rows] (not differentiable).
    return o, lse.view(q.shape[0], q.shape[1]).t().contiguous()


# attention() hands a call under torch.compile to the op above; function.py does not import this
# module (the rooms depend one way: runtime <- function <- ops), the package's __init__ does.
function._COMPILED_OP = attention_op
