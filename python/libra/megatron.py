"""libra as Megatron-Core's core attention (packed ``thd`` input).

Megatron builds a layer from a ModuleSpec; its SelfAttention calls
``self.core_attention(query, key, value, attention_mask, attn_mask_type=..., attention_bias=...,
packed_seq_params=...)``. ``LibraCoreAttention`` has that constructor and that call, and runs
``libra.torch.attention`` on this rank's home tokens under the current micro-batch's PlanRuntime:

    import libra.megatron as lm
    spec = lm.gpt_layer_spec()                          # get_gpt_layer_local_spec() with libra's core attention
    layer = build_module(spec, config=config, layer_number=1)   # or GPTModel(config, spec, ...)
    for n, batch in enumerate(loader):
        runtime = planner.runtime(n, group)
        psp = lm.packed_seq_params(runtime)             # this rank's home cu_seqlens, qkv_format "thd"
        with lm.use_runtime(runtime):                   # forward and backward
            out, _ = layer(hidden, attention_mask=None, packed_seq_params=psp)   # hidden [L/cp, 1, h]
            loss(out).backward()

The runtime reaches the module through ``use_runtime`` (a context; Megatron's call signature has no
place for it) or, per module, through ``LibraCoreAttention.runtime`` (which wins when set).
Backward needs no runtime (autograd keeps it) unless Megatron recomputes the attention in backward
(``recompute_granularity``), so keep backward inside the context too.

Megatron's own context parallelism stays off (``context_parallel_size=1``): libra is the CP.
Each rank's ``hidden`` holds its home rows of its replica's packed sequence in the plan's home
layout (contiguous or zigzag: ``runtime.packed_rows``). ``cu_seqlens_q`` must describe them, as
``libra.torch.attention`` accepts ``cu_seqlens``: this rank's home segments (``home_cu_seqlens``)
or the slot's whole packed sequence (``runtime.packed_cu_seqlens``, TE's convention under CP),
either optionally with padding as a last segment; ``cu_seqlens_kv`` must equal it. Every call
checks them on every rank of the pool (a mismatch, e.g. the previous micro-batch's runtime, raises
the same one-line ValueError everywhere). The output is ``[t, h*d]`` for ``thd`` query ``[t, h, d]`` (what
TEDotProductAttention returns; SelfAttention reshapes it to ``[t, 1, h*d]``) and ``[s, 1, h*d]`` for
``sbhd`` query ``[s, 1, h, d]``.

Not supported (refused at construction or call): attention dropout, attention_bias, any
``attention_mask`` (pass None: the mask is libra's, causal within each packed sample, from the plan),
cross attention, softmax types other than vanilla, a sliding window differing from the plan's.

RoPE (``GPTModel(position_embedding_type="rope")``): Megatron's rotary embedding in ``thd`` would
restart positions at every ``cu_seqlens`` segment of the home rows (wrong for a sample continued
from the previous rank's rows, and for zigzag's second chunk). Inside ``use_runtime`` libra's
RotaryEmbedding.forward hands Megatron one frequency row per home row instead, at the row's own
position in its sample (``runtime.position_ids``), and ``packed_seq_params(runtime)`` covers every
home row (the padding as a last segment), so Megatron's ``thd`` RoPE takes its exact per-row path
(freqs of ``cu_seqlens[-1]`` rows). Outside ``use_runtime`` Megatron's own forward runs unchanged;
so run a RoPE model inside ``use_runtime`` (``LibraCoreAttention.runtime`` alone does not reach it).
"""
import contextlib
import math

import torch

import libra.torch as lt

_CURRENT = []  # the runtimes of the enclosing use_runtime contexts, innermost last


@contextlib.contextmanager
def use_runtime(runtime):
    """Makes ``runtime`` the PlanRuntime of every LibraCoreAttention call inside the block, and of
    Megatron's rotary embedding (each home row's frequencies at its own position)."""
    if not isinstance(runtime, lt.PlanRuntime):
        raise ValueError(f"libra.megatron.use_runtime: runtime must be a libra.torch.PlanRuntime, "
                         f"got {type(runtime).__name__}")
    _install_rope()
    _CURRENT.append(runtime)
    try:
        yield runtime
    finally:
        _CURRENT.pop()


def home_cu_seqlens(runtime):
    """This rank's home layout as int32 cu_seqlens (``runtime.cu_seqlens``): one segment per run of one
    sample's consecutive home rows, padding rows excluded; contiguous or zigzag, as the plan says."""
    return runtime.cu_seqlens.clone()


def home_position_ids(runtime):
    """Each home row's position within its sample, int64 [home_rows] (``runtime.position_ids``; padding
    rows count on from 0): what RoPE needs where Megatron's thd RoPE would restart at every segment."""
    return runtime.position_ids.clone()


def packed_seq_params(runtime):
    """Megatron's PackedSeqParams for this rank's home rows under ``runtime`` (qkv_format "thd"): the
    home segments and the padding rows as a last one, so the segments cover every row Megatron holds
    (its thd RoPE splits the rows by them)."""
    from megatron.core.packed_seq_params import PackedSeqParams
    cu = home_cu_seqlens(runtime)
    if int(cu[-1]) < runtime.home_rows:
        cu = torch.cat([cu, torch.tensor([runtime.home_rows], dtype=cu.dtype)])
    longest = int((cu[1:] - cu[:-1]).max()) if len(cu) > 1 else 0
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu.clone(), max_seqlen_q=longest,
                           max_seqlen_kv=longest)


def _install_rope():
    """Wraps Megatron's RotaryEmbedding.forward once: inside ``use_runtime`` it returns the frequencies
    of each home row at its position in its sample ([home_rows, 1, 1, d]); elsewhere Megatron's own."""
    try:
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    except ImportError:
        return
    if getattr(RotaryEmbedding.forward, "_libra", False):
        return
    megatron_forward = RotaryEmbedding.forward

    def forward(self, max_seq_len, offset=0, packed_seq=False, cp_group=None):
        if not _CURRENT:
            return megatron_forward(self, max_seq_len, offset, packed_seq, cp_group)
        if offset:
            raise ValueError(f"libra.megatron: RotaryEmbedding offset {offset}: libra's RoPE takes each home row's "
                             f"position from the runtime (offset 0 only)")
        pos = _CURRENT[-1].position_ids
        emb = self.get_emb(int(pos.max()) + 1)  # Megatron's own frequencies, positions 0 .. max
        return emb[pos.to(emb.device)]

    forward._libra = True
    forward.__doc__ = megatron_forward.__doc__
    RotaryEmbedding.forward = forward


def _kv_problem(psp):
    q, kv = getattr(psp, "cu_seqlens_q", None), getattr(psp, "cu_seqlens_kv", None)
    if q is None:
        return "packed_seq_params.cu_seqlens_q is None"
    if kv is not None and (kv.shape != q.shape or not torch.equal(kv.detach().cpu(), q.detach().cpu())):
        return (f"packed_seq_params.cu_seqlens_kv {kv.tolist()} differs from cu_seqlens_q {q.tolist()} "
                "(self-attention: one layout)")
    return None


def _agree(runtime, problem):
    """Raises the first rank's problem on every rank of the pool group (the runtime's agreement,
    bounded by its timeout)."""
    where = "libra.megatron.LibraCoreAttention"
    first = runtime._agree(problem, where)
    if first is not None:
        raise ValueError(f"{where}: group rank {first[0]}: {first[1]}")


class LibraCoreAttention(torch.nn.Module):
    """Megatron-Core's ``core_attention`` submodule, computed by ``libra.torch.attention``.

    Constructed like ``DotProductAttention`` (by ModuleSpec); holds no parameters.
    """

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None, **kwargs):
        super().__init__()
        from megatron.core.transformer.utils import is_layer_window_attention
        where = "libra.megatron.LibraCoreAttention"
        self.config, self.layer_number = config, max(1, layer_number)
        self.attn_mask_type, self.attention_type = attn_mask_type, attention_type
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError(f"{where}: attention_dropout {dropout} must be 0 (libra's kernels have no dropout)")
        if attention_type != "self":
            raise ValueError(f"{where}: attention_type {attention_type!r} must be 'self'")
        if getattr(config, "context_parallel_size", 1) != 1:
            raise ValueError(f"{where}: config.context_parallel_size {config.context_parallel_size} must be 1 "
                             "(libra runs the context parallelism; give Megatron CP 1)")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(f"{where}: config.softmax_type {config.softmax_type!r} must be 'vanilla'")
        tp = getattr(config, "tensor_model_parallel_size", 1)
        self.heads_q = config.num_attention_heads // tp
        self.heads_kv = (config.num_query_groups or config.num_attention_heads) // tp
        self.head_dim = config.kv_channels
        # Megatron's scale: 1/sqrt(d) unless given (apply_query_key_layer_scaling cancels out).
        self.softmax_scale = 1.0 / math.sqrt(self.head_dim) if softmax_scale is None else float(softmax_scale)
        self.window_size = None
        if is_layer_window_attention(config.window_size, getattr(config, "window_attn_skip_freq", None),
                                     layer_number):
            self.window_size = tuple(config.window_size)
        self.runtime = None  # when set, wins over use_runtime's

    def _runtime(self):
        rt = self.runtime if self.runtime is not None else (_CURRENT[-1] if _CURRENT else None)
        if rt is None:
            raise ValueError("libra.megatron.LibraCoreAttention: no PlanRuntime: call the layer inside "
                             "libra.megatron.use_runtime(runtime) or set the module's runtime attribute")
        return rt

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        rt = self._runtime()
        self._check(rt, query, attention_mask, attention_bias, packed_seq_params)
        q, k, v = (x.squeeze(1) if query.dim() == 4 else x for x in (query, key, value))
        # The mask and window are the plan's (checked equal to the layer's above); attention checks
        # cu_seqlens against the plan's home layout on every rank.
        cu = None if packed_seq_params is None else packed_seq_params.cu_seqlens_q
        o = lt.attention(q, k, v, rt, softmax_scale=self.softmax_scale, cu_seqlens=cu)
        o = o.reshape(o.shape[0], -1)
        return o.unsqueeze(1) if query.dim() == 4 else o

    # Under torch.compile, a graph break: the check gathers Python objects across the pool group.
    @torch.compiler.disable
    def _check(self, rt, query, attention_mask, attention_bias, packed_seq_params):
        # The plan fixes the mask: causal per sample, with the plan's window. Megatron's (left, right)
        # window of w - 1 keys to the left is libra's window w.
        window = None if self.window_size is None else self.window_size[0] + 1
        problem = None
        if attention_bias is not None:
            problem = "attention_bias must be None (libra has no attention bias)"
        elif query.dim() == 4 and query.shape[1] != 1:
            problem = f"query has batch {query.shape[1]} but libra takes one packed sequence per rank (batch 1, or thd)"
        elif self.window_size is not None and self.window_size[1] != 0:
            problem = f"config.window_size {self.window_size} must look left only (right 0)"
        elif window != rt.window:
            problem = f"the layer's window {window} (config.window_size) differs from the plan's window {rt.window}"
        elif attention_mask is not None:
            problem = "attention_mask must be None (the plan's mask applies: causal within each packed sample)"
        elif packed_seq_params is not None:
            problem = _kv_problem(packed_seq_params)
        # One agreement per call, so a bad call on one rank fails on every rank with the same line
        # instead of leaving the others in the exchange.
        _agree(rt, problem)


def gpt_layer_spec(**kwargs):
    """``get_gpt_layer_local_spec(**kwargs)`` with ``LibraCoreAttention`` as the core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    return use_libra(get_gpt_layer_local_spec(**kwargs))


def use_libra(spec):
    """Replaces the core attention of a TransformerLayer spec (or a block spec's layer specs) in place
    with LibraCoreAttention; returns ``spec``."""
    layers = getattr(spec, "layer_specs", None)
    if layers is not None:
        for s in layers:
            use_libra(s)
        return spec
    attn = getattr(getattr(spec, "submodules", None), "self_attention", None)
    sub = getattr(attn, "submodules", None)
    if sub is None or not hasattr(sub, "core_attention"):
        raise ValueError("libra.megatron.use_libra: spec has no submodules.self_attention.submodules.core_attention")
    sub.core_attention = LibraCoreAttention
    return spec
