"""libra.hf: libra as a Hugging Face transformers attention implementation, and the data side.

Importing this module registers ``"libra"`` with transformers' ``AttentionInterface``
(the attention call) and ``AttentionMaskInterface`` (the mask call), so

    import libra.hf
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="libra")  # or from_pretrained

    rt = planner.runtime(n, group)                         # this micro-batch's libra.torch.PlanRuntime
    shard = libra.hf.shard_batch(rt, input_ids)            # this CP rank's home rows, labels shifted first
    out = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"], use_cache=False,
                libra_runtime=rt)
    loss = libra.hf.loss(out.logits, shard["labels"], libra.hf.count_items(shard["labels"]))
    loss.backward(); libra.hf.all_reduce_gradients(model)

runs every attention layer of the model through ``libra.torch.attention`` over the
runtime's pool. transformers hands the attention function q [1, h_q, T, d] and
k, v [1, h_kv, T, d] (T = this rank's home rows); libra takes them as THD
[T, h, d], does GQA itself (K/V are not repeated) and gives [1, T, h_q, d] back.

The runtime reaches the layers as the ``libra_runtime=`` keyword of the model's
forward (transformers passes unknown keywords down to the attention function;
checked for Llama and Qwen3 in transformers 5.24), or from ``use_runtime(rt)``
around the forward. The keyword is the safer of the two: it is captured with the
call, so activation checkpointing that recomputes the forward during backward
still sees it.

libra takes the sample boundaries from the plan, not from a mask: the mask hook
returns None for a full (all-ones) 2D mask and passes any other mask on, and the
attention function refuses every mask it is given (padding or a prepared 4D
mask), and position ids that do not restart at each sample of the plan (what
transformers derives packed-sequence boundaries from), on every rank with one
line. flash-attention style ``cu_seq_lens_q`` / ``cu_seq_lens_k`` keywords are
checked against the plan too.
"""
import contextlib
import contextvars
import weakref

import torch
import torch.nn.functional as F

from .torch import PlanRuntime, attention, comms

NAME = "libra"
IGNORE_INDEX = -100

_current = contextvars.ContextVar("libra_hf_runtime", default=None)


@contextlib.contextmanager
def use_runtime(runtime):
    """Every ``attn_implementation="libra"`` layer called inside runs under ``runtime`` (unless the
    forward is given ``libra_runtime=``)."""
    if not isinstance(runtime, PlanRuntime):
        raise ValueError(f"libra.hf.use_runtime: runtime must be a libra.torch.PlanRuntime, got {type(runtime).__name__}")
    token = _current.set(runtime)
    try:
        yield runtime
    finally:
        _current.reset(token)


# ---------------------------------------------------------------- the packed sequence and its home rows

def _lengths(lengths):
    out = [int(n) for n in lengths]
    if any(n < 1 for n in out):
        raise ValueError(f"libra.hf: lengths {out}: sample lengths must be >= 1")
    return out


def packed_position_ids(lengths, seq_len):
    """Position ids [seq_len] of a packed sequence: 0, 1, ... restarting at every sample; the padding
    past the samples counts from 0 again, as one more segment (transformers then keeps it apart)."""
    lengths = _lengths(lengths)
    total = sum(lengths)
    if total > seq_len:
        raise ValueError(f"libra.hf.packed_position_ids: lengths sum to {total}, more than seq_len {seq_len}")
    parts = [torch.arange(n) for n in lengths]
    if total < seq_len:
        parts.append(torch.arange(seq_len - total))
    return torch.cat(parts).long()


def packed_labels(input_ids, lengths, ignore_index=IGNORE_INDEX):
    """Next-token labels [seq_len] of one packed sequence, shifted within each sample: row i holds token
    i+1 of its sample, ignore_index at each sample's last row and on the padding. Shift before
    sharding: the label of a CP shard's last row is the first token of the next shard."""
    ids = torch.as_tensor(input_ids).reshape(-1)
    lengths = _lengths(lengths)
    total = sum(lengths)
    if total > ids.numel():
        raise ValueError(f"libra.hf.packed_labels: lengths sum to {total}, more than the {ids.numel()} input_ids")
    labels = torch.full_like(ids, ignore_index)
    start = 0
    for n in lengths:
        labels[start:start + n - 1] = ids[start + 1:start + n]
        start += n
    return labels


def _slot(runtime):
    cp = runtime.plan.config["cp"]
    return runtime.worker // cp


def slot_lengths(runtime):
    """The sample lengths of the packed sequence this rank's DP replica trains on (its plan slot)."""
    return list(runtime.plan.pool[_slot(runtime)])


def home_rows(runtime):
    """Row indices [home_rows] of the slot's packed sequence that this rank holds (its home, in THD order),
    in the plan's home layout (contiguous or zigzag): the runtime's ``packed_rows``."""
    return torch.as_tensor(runtime.packed_rows, dtype=torch.int64)


class _Layout:
    """What the attention function checks a call against: this rank's expected position ids (valid rows
    only) and the home rows' segments."""

    def __init__(self, runtime):
        lengths = slot_lengths(runtime)
        seq_len = runtime.plan.config["seq_len"]
        rows = home_rows(runtime)
        pos = packed_position_ids(lengths, seq_len)[rows]
        self.valid = int(runtime.home_tokens)  # home rows holding tokens (padding comes last)
        self.positions = pos[:self.valid]
        cuts = [int(x) for x in runtime.cu_seqlens.tolist()]
        # With and without the padding as a last segment: both describe the same layout.
        self.cu = [cuts] + ([cuts + [len(rows)]] if cuts[-1] < len(rows) else [])


_layouts = weakref.WeakKeyDictionary()


def _layout(runtime):
    lay = _layouts.get(runtime)
    if lay is None:
        lay = _layouts[runtime] = _Layout(runtime)
    return lay


def shard_batch(runtime, input_ids, labels=None, position_ids=None, ignore_index=IGNORE_INDEX):
    """This CP rank's share of the slot's whole packed sequence, as the model's forward takes it.

    input_ids: [seq_len] or [1, seq_len], the packed sequence of this DP replica (the plan's slot);
    labels and position_ids likewise, or None for ``packed_labels`` / ``packed_position_ids`` of the
    plan's sample lengths. Returns a dict of [1, home_rows] tensors: input_ids, position_ids, labels
    (already shifted: hand them to ``loss``, not to the model's ``labels=``, which would shift again).
    """
    seq_len = runtime.plan.config["seq_len"]
    lengths = slot_lengths(runtime)

    def whole(name, x):
        t = torch.as_tensor(x)
        if t.dim() == 2 and t.shape[0] == 1:
            t = t[0]
        if t.dim() != 1 or t.shape[0] != seq_len:
            raise ValueError(f"libra.hf.shard_batch: {name} has shape {list(torch.as_tensor(x).shape)}, "
                             f"expected [{seq_len}] or [1, {seq_len}] (the slot's whole packed sequence)")
        return t

    ids = whole("input_ids", input_ids)
    lab = packed_labels(ids, lengths, ignore_index) if labels is None else whole("labels", labels)
    pos = packed_position_ids(lengths, seq_len) if position_ids is None else whole("position_ids", position_ids)
    rows = home_rows(runtime).to(ids.device)
    return {"input_ids": ids[rows][None], "position_ids": pos.to(ids.device)[rows][None],
            "labels": lab.to(ids.device)[rows][None]}


# ---------------------------------------------------------------- the loss over CP shards

def _comm(group):
    """The communicator of ``group`` (the caller's world when None; None outside any)."""
    if group is not None:
        return comms.of(group)
    return next((c for c in comms.registry().values() if c.active()), None)


def count_items(labels, group=None, ignore_index=IGNORE_INDEX):
    """The number of labelled tokens (labels != ignore_index) summed over ``group`` (all-reduced; default
    the whole world, every DP and CP rank), as float64: the denominator that makes ``loss`` over the
    shards the mean over all of them."""
    n = torch.tensor([float((torch.as_tensor(labels) != ignore_index).sum())], dtype=torch.float64)
    comm = _comm(group)
    if comm is not None:
        comm.all_reduce(n, group)
    return n[0]


def loss(logits, labels, num_items, ignore_index=IGNORE_INDEX, dtype=torch.float32):
    """This rank's part of the mean next-token loss: the sum of its tokens' cross-entropies divided by
    ``num_items``, the labelled tokens of every rank (``count_items``). Summed over the ranks (which
    the gradient all-reduce with SUM does for the gradients) it is the mean over all their tokens,
    the whole-sequence loss. labels: already shifted (``shard_batch``). The cross-entropy runs in
    ``dtype`` (float32; float64 to compare runs)."""
    v = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, v).to(dtype), labels.reshape(-1).to(logits.device),
                         ignore_index=ignore_index, reduction="sum")
    return ce / torch.as_tensor(num_items, dtype=dtype, device=ce.device).clamp_min(1)


def all_reduce_gradients(model, group=None):
    """Sums every parameter's gradient over ``group`` (default the world: all DP x CP ranks). With
    ``loss``'s normalisation the sum is the gradient of the global mean loss; an average (DDP's
    default) would divide it by the world size once more."""
    comm = comms.current() if group is None else comms.of(group)
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad, group)


# ---------------------------------------------------------------- the transformers hooks

def _problem(rt, query, key, value, attention_mask, dropout, sliding_window, is_causal, softcap, s_aux,
             position_ids, cu_q, cu_k):
    """What in a call transformers makes cannot run under rt's plan, or None."""
    if attention_mask is not None:
        shape = list(attention_mask.shape) if hasattr(attention_mask, "shape") else type(attention_mask).__name__
        return (f"attention_mask of shape {shape} given: libra takes sample boundaries from the plan and "
                f"cannot apply a padding or dense mask (pass position_ids restarting per sample, no attention_mask)")
    if query.dim() != 4 or query.shape[0] != 1:
        return f"query has shape {list(query.shape)}: libra needs batch 1 (one packed sequence per rank)"
    if dropout:
        return f"dropout {dropout}: libra's attention has no dropout"
    if is_causal is False:
        return "is_causal=False: libra's attention is causal"
    if softcap is not None or s_aux is not None:
        return "softcap and attention sinks (s_aux) are not supported"
    if sliding_window is not None and sliding_window != rt.window:
        return f"sliding_window {sliding_window} differs from the plan's window {rt.window}"
    lay = _layout(rt)
    if position_ids is not None:
        pos = position_ids.reshape(-1, position_ids.shape[-1])[0]
        if pos.numel() != query.shape[2]:
            return f"position_ids has {pos.numel()} rows but query has {query.shape[2]}"
        got = pos[:lay.valid].cpu()
        if not torch.equal(got, lay.positions):
            bad = int((got != lay.positions).nonzero()[0, 0])
            return (f"position_ids[{bad}] is {int(got[bad])} but the plan's sample layout puts position "
                    f"{int(lay.positions[bad])} at home row {bad} (position ids must restart at every sample; "
                    f"use libra.hf.shard_batch)")
    for name, cu in (("cu_seq_lens_q", cu_q), ("cu_seq_lens_k", cu_k)):
        if cu is not None and [int(x) for x in torch.as_tensor(cu).reshape(-1)] not in lay.cu:
            return f"{name} {[int(x) for x in torch.as_tensor(cu).reshape(-1)]} differs from the plan's home layout {lay.cu[0]}"
    if position_ids is None and cu_q is None:
        return "neither position_ids nor cu_seq_lens_q given: libra cannot check the sample boundaries"
    return None


def _agree(rt, problem):
    """Raises the first rank's problem on every rank of the pool when the runtime checks calls (the
    runtime's agreement, as libra.torch.attention's, bounded by its timeout), so no rank is left
    waiting in an exchange."""
    if rt.check_calls:
        first = rt._agree(problem, "libra.hf")
        if first is not None:
            raise ValueError(f"libra.hf: group rank {first[0]}: {first[1]}")
    elif problem is not None:
        raise ValueError(f"libra.hf: {problem}")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      is_causal=None, softcap=None, s_aux=None, libra_runtime=None, position_ids=None,
                      cu_seq_lens_q=None, cu_seq_lens_k=None, **kwargs):
    """transformers' attention-function signature: query [1, h_q, T, d], key/value [1, h_kv, T, d]
    (this rank's home rows) -> ([1, T, h_q, d], None)."""
    rt = _current.get() if libra_runtime is None else libra_runtime
    if not isinstance(rt, PlanRuntime):
        raise ValueError("libra.hf: no PlanRuntime for this forward: pass libra_runtime=runtime to the model "
                         "or run it inside libra.hf.use_runtime(runtime)")
    _agree(rt, _problem(rt, query, key, value, attention_mask, dropout, sliding_window, is_causal, softcap, s_aux,
                        position_ids, cu_seq_lens_q, cu_seq_lens_k))
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, h, d]
    o = attention(q, k, v, rt, softmax_scale=scaling, window=rt.window)
    return o.unsqueeze(0), None


def mask_forward(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                 **kwargs):
    """transformers' mask hook: None when the 2D mask is absent or all ones, else the mask itself, which
    attention_forward then refuses. Registered so that a padding mask reaches the attention function
    (without an entry transformers drops every mask for an unknown implementation)."""
    if attention_mask is not None and attention_mask.shape[-1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def register(name=NAME):
    """Registers the attention and mask functions under ``name`` (done for "libra" on import)."""
    from transformers import AttentionInterface  # noqa: PLC0415
    from transformers.masking_utils import AttentionMaskInterface  # noqa: PLC0415

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_forward)
    return name


register()

__all__ = ["NAME", "register", "use_runtime", "attention_forward", "mask_forward", "packed_position_ids",
           "packed_labels", "slot_lengths", "home_rows", "shard_batch", "count_items", "loss",
           "all_reduce_gradients"]
