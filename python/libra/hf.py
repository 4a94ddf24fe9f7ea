"""libra.hf: libra as a Hugging Face transformers attention implementation, and the data side.

Importing this module registers ``"libra"`` with transformers' ``AttentionInterface``
(the attention call) and ``AttentionMaskInterface`` (the mask call), so

    import libra.hf
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="libra")  # or from_pretrained

    rt = planner.runtime(n, group)                         # this micro-batch's libra.torch.PlanRuntime
    shard = libra.hf.shard_batch(rt, input_ids, lengths=lengths)   # this CP rank's home rows, labels shifted first
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
around the forward. A model whose layers have different windows (Gemma 2, Qwen2
with max_window_layers) takes one runtime per window, ``libra_runtime={w: rt_w}``
(``layer_windows(config)``); a layer never runs under a plan of another window.
``shard_batch`` ties the batch to its runtime by the batch's own sample lengths
(or position ids), and takes transformers' unshifted labels with ``shifted=False``.
``Trainer`` is transformers' Trainer on this path. The keyword is the safer of the two: it is captured with the
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
    forward is given ``libra_runtime=``): a PlanRuntime, or a dict {window: PlanRuntime} (see
    ``layer_windows``)."""
    if not isinstance(runtime, (PlanRuntime, dict)):
        raise ValueError(f"libra.hf.use_runtime: runtime must be a libra.torch.PlanRuntime or a dict "
                         f"{{window: PlanRuntime}}, got {type(runtime).__name__}")
    token = _current.set(runtime)
    try:
        yield runtime
    finally:
        _current.reset(token)


# ---------------------------------------------------------------- one runtime per distinct layer window

def layer_windows(config):
    """The distinct attention windows of a transformers model's layers (None: full causal), as the
    attention modules hand them to the attention function: ``config.layer_types`` ("sliding_attention"
    layers get ``config.sliding_window``, "full_attention" layers None: Gemma 2/3, Qwen2 with
    ``max_window_layers``), else ``config.sliding_window`` for every layer (Mistral; None for Llama).
    A model with more than one needs one runtime per window: ``libra_runtime={w: runtime_w}``."""
    config = getattr(config, "get_text_config", lambda: config)()
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        return [window]
    out = []
    for t in types:
        if t not in ("full_attention", "sliding_attention"):
            raise ValueError(f"libra.hf.layer_windows: layer type {t!r}: libra runs full_attention and "
                             f"sliding_attention layers only")
        w = window if t == "sliding_attention" else None
        if w not in out:
            out.append(w)
    return sorted(out, key=lambda w: -1 if w is None else w)


def _runtimes_problem(given):
    """What makes a {window: PlanRuntime} dict unusable for one forward, or None: every runtime must
    serve the same rank of the same packed sequence (same samples, same home rows), so the hidden
    states one layer leaves on this rank are what the next layer's runtime expects."""
    if not given:
        return "libra_runtime is an empty dict: give {window: PlanRuntime} (None for full causal layers)"
    first = None
    for w, rt in given.items():
        if not isinstance(rt, PlanRuntime):
            return f"libra_runtime[{w!r}] is a {type(rt).__name__}, not a libra.torch.PlanRuntime"
        if rt.window != w:
            return f"libra_runtime[{w!r}] is a runtime of a plan with window {rt.window}: key it by its own window"
        if first is None:
            first = rt
            continue
        if (rt.worker != first.worker or rt.plan.pool != first.plan.pool
                or not torch.equal(rt.packed_rows, first.packed_rows)):
            return (f"libra_runtime[{w!r}] and libra_runtime[{first.window!r}] plan other samples or home rows "
                    f"(worker {rt.worker} vs {first.worker}): plan every window from the same pool and home_layout")
    return None


def _pick(given, sliding_window):
    """(the runtime a layer of window ``sliding_window`` runs under, a problem line or None). A layer
    never runs under a plan of another window: the plan's window is the mask the kernel applies."""
    if isinstance(given, PlanRuntime):
        if sliding_window != given.window:
            return given, (f"this layer's sliding_window is {sliding_window} but the runtime's plan has window "
                           f"{given.window}: a layer must run under a plan of its own window (for a model whose "
                           f"layers differ, pass libra_runtime={{window: runtime}}, one per libra.hf.layer_windows)")
        return given, None
    problem = _runtimes_problem(given)
    anyone = next((r for r in given.values() if isinstance(r, PlanRuntime)), None)
    if problem is not None:
        return anyone, problem
    if sliding_window not in given:
        return anyone, (f"no runtime for this layer's sliding_window {sliding_window}: libra_runtime has windows "
                        f"{sorted(given, key=lambda w: -1 if w is None else w)}")
    return given[sliding_window], None


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


def _flat(x):
    t = torch.as_tensor(x)
    return t[0] if t.dim() == 2 and t.shape[0] == 1 else t


def _batch_problem(runtime, ids, lengths, labels, position_ids, shifted, ignore_index):
    """What ties (or fails to tie) this batch to the runtime's plan, as one line, or None. The batch
    names its samples itself (lengths=, or position_ids restarting per sample as transformers'
    DataCollatorWithFlattening makes them); the runtime's plan must have the same ones, so a runtime
    of another batch (a counter off after resuming, a skipped batch, another loader order) is refused."""
    seq_len, plan = runtime.plan.config["seq_len"], slot_lengths(runtime)
    m = sum(plan)
    for name, t in (("input_ids", ids), ("labels", labels), ("position_ids", position_ids)):
        if t is not None and (t.dim() != 1 or not 1 <= t.shape[0] <= seq_len):
            return (f"{name} has shape {list(t.shape)}, expected [n] or [1, n] with n <= seq_len {seq_len} "
                    f"(the slot's packed sequence)")
        if t is not None and t.shape[0] != ids.shape[0]:
            return f"{name} has {t.shape[0]} rows but input_ids has {ids.shape[0]}"
    n = ids.shape[0]
    if lengths is None and position_ids is None:
        return ("pass the batch's own sample lengths= (or position_ids= restarting per sample): they tie the "
                "batch to the runtime that plans it")
    if lengths is not None:
        got = [int(x) for x in torch.as_tensor(lengths).reshape(-1).tolist()]
        if got != plan:
            return (f"the batch's sample lengths {got} are not those of the runtime's plan {plan} (slot "
                    f"{_slot(runtime)}): the runtime plans another batch (take the runtime of this batch's own index)")
    if n < m:
        return f"input_ids has {n} rows, fewer than the {m} tokens of the plan's samples {plan}"
    if position_ids is not None:
        if lengths is None and n > m:
            return (f"position_ids cover {n} rows but the plan's samples {plan} {m}: pass lengths= to say that the "
                    f"rows past them are padding")
        want = packed_position_ids(plan, seq_len)[:m]
        got = position_ids[:m].cpu().long()
        if not torch.equal(got, want):
            bad = int((got != want).nonzero()[0, 0])
            return (f"position_ids[{bad}] is {int(got[bad])} but the runtime's plan (samples {plan}) puts position "
                    f"{int(want[bad])} there: the runtime plans another batch (take the runtime of this batch's own index)")
    if labels is not None:
        if shifted not in (True, False):
            return ("labels given without shifted=True/False: shifted=False for transformers' convention (the model's "
                    "labels=, DataCollatorWithFlattening: row i holds token i), shifted=True when row i holds token i+1")
        cut = torch.tensor(plan).cumsum(0)
        first, last = (cut - torch.tensor(plan)).tolist(), (cut - 1).tolist()
        lab = labels.cpu()
        if shifted:
            labelled = [r for r in last if int(lab[r]) != ignore_index]
            if labelled:
                return (f"labels[{labelled[0]}] (a sample's last row) is {int(lab[labelled[0]])} but shifted labels leave "
                        f"every sample's last row at {ignore_index}: are these unshifted labels (shifted=False)?")
        else:
            multi = [(f, l) for f, l in zip(first, last) if l > f]
            if multi and all(int(lab[l]) == ignore_index for _, l in multi) and any(
                    int(lab[f]) != ignore_index for f, _ in multi):
                return (f"labels look shifted (every sample's last row is {ignore_index}, first rows labelled) but "
                        f"shifted=False was given: pass shifted=True for labels where row i holds token i+1")
    return None


def _shift(labels, lengths, ignore_index):
    """Unshifted (transformers' convention) labels -> shifted within each sample: row i gets row i+1's."""
    out = torch.full_like(labels, ignore_index)
    start = 0
    for n in lengths:
        out[start:start + n - 1] = labels[start + 1:start + n]
        start += n
    return out


def shard_batch(runtime, input_ids, *, lengths=None, labels=None, position_ids=None, shifted=None,
                ignore_index=IGNORE_INDEX):
    """This CP rank's share of the slot's packed sequence, as the model's forward takes it.

    input_ids: [n] or [1, n] (n <= seq_len; shorter sequences are padded), the packed sequence of this
    DP replica (the plan's slot), with what names its samples: ``lengths=`` (its sample lengths) or
    ``position_ids=`` restarting at 0 per sample (what ``DataCollatorWithFlattening`` gives). They must
    be the runtime's plan's: a runtime of another batch raises one line on every rank of the pool (the
    runtime's agreement; this call is collective when the runtime checks calls).
    labels: None for ``packed_labels`` of the plan's samples, else [n] with ``shifted=False``
    (transformers' convention, the model's ``labels=`` and ``DataCollatorWithFlattening``'s: row i
    holds token i; shifted here within each sample) or ``shifted=True`` (row i holds token i+1).
    Returns a dict of [1, home_rows] tensors: input_ids, position_ids, labels (shifted: hand them to
    ``loss``, not to the model's ``labels=``, which would shift again).
    """
    if isinstance(runtime, dict):  # {window: runtime}: every window's plan has the same home rows
        problem = _runtimes_problem(runtime)
        if problem is not None:
            raise ValueError(f"libra.hf.shard_batch: {problem}")
        runtime = next(iter(runtime.values()))
    seq_len, plan = runtime.plan.config["seq_len"], slot_lengths(runtime)
    ids = _flat(input_ids)
    lab = None if labels is None else _flat(labels)
    pos = None if position_ids is None else _flat(position_ids)
    problem = _batch_problem(runtime, ids, lengths, lab, pos, shifted, ignore_index)
    if getattr(runtime, "check_calls", False) and hasattr(runtime, "_agree"):
        first = runtime._agree(problem, "libra.hf.shard_batch")
        if first is not None:
            raise ValueError(f"libra.hf.shard_batch: group rank {first[0]}: {first[1]}")
    elif problem is not None:
        raise ValueError(f"libra.hf.shard_batch: {problem}")
    pad = seq_len - ids.shape[0]
    ids = F.pad(ids, (0, pad))
    if lab is None:
        lab = packed_labels(ids, plan, ignore_index)
    else:
        lab = F.pad(lab.to(ids.device), (0, pad), value=ignore_index)
        lab = lab if shifted else _shift(lab, plan, ignore_index)
        lab[sum(plan):] = ignore_index  # the padding rows are no sample's
    pos = packed_position_ids(plan, seq_len)
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
    given = _current.get() if libra_runtime is None else libra_runtime
    rt, problem = (given, None) if not isinstance(given, (PlanRuntime, dict)) else _pick(given, sliding_window)
    if not isinstance(rt, PlanRuntime):
        raise ValueError("libra.hf: no PlanRuntime for this forward: pass libra_runtime=runtime (or "
                         "{window: runtime}) to the model or run it inside libra.hf.use_runtime(runtime)")
    _agree(rt, problem or _problem(rt, query, key, value, attention_mask, dropout, sliding_window, is_causal, softcap,
                                   s_aux, position_ids, cu_seq_lens_q, cu_seq_lens_k))
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, h, d]
    # The layer's own window in flash-attn's terms: attention refuses it if the plan's differs.
    size = (-1, 0) if sliding_window is None else (int(sliding_window) - 1, 0)
    o = attention(q, k, v, rt, softmax_scale=scaling, window_size=size)
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


# ---------------------------------------------------------------- transformers' Trainer

class _Keyed(torch.utils.data.Dataset):
    """The dataset's item with the batch key its PlacementBatchSampler index carries (BatchIndex)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return {"item": self.dataset[i], "key": (getattr(i, "epoch", None), getattr(i, "batch", None))}


def _one(batch):
    if len(batch) != 1:
        raise ValueError(f"libra.hf.Trainer: a batch holds {len(batch)} items: PlacementBatchSampler yields one "
                         f"packed sequence per batch")
    return batch[0]


def _trainer_class():
    import transformers  # noqa: PLC0415

    from .torch import PlacementDataLoader  # noqa: PLC0415

    class Trainer(transformers.Trainer):
        """transformers' Trainer training through libra (``attn_implementation="libra"`` model).

            trainer = libra.hf.Trainer(model=model, args=args, train_dataset=packed,
                                       sampler=sampler, planner=planner, group=group)

        ``train_dataset[i]`` is a dict with ``input_ids`` ([L], packed sequence i of the sequences the
        ``PlacementBatchSampler`` was given) and ``lengths`` (its sample lengths). The Trainer loads it
        through ``PlacementDataLoader`` (so ``set_epoch`` reaches the sampler at every epoch and
        resumption skips batches the sampler's way), takes each batch's runtime from the batch's own
        key (``planner.runtime(batch)``, not a counter: resuming and skipped batches pair right, and
        ``shard_batch`` checks the lengths), divides every micro-batch's loss by the labelled tokens
        of the whole optimizer step over all ranks (``count_items``) and multiplies it by the number
        of processes, because the Trainer's DDP averages the gradients where libra's loss needs their
        sum. ``args.gradient_accumulation_steps`` must be the sampler's ``ga_steps`` (gbs / dp)."""

        loss_is_scaled_for_ga = True  # compute_loss divides by the whole optimizer step's tokens

        def __init__(self, *args, sampler, planner, group=None, **kwargs):
            super().__init__(*args, **kwargs)
            ga = self.args.gradient_accumulation_steps
            if ga != sampler.ga_steps:
                raise ValueError(f"libra.hf.Trainer: gradient_accumulation_steps {ga} must be the sampler's "
                                 f"ga_steps {sampler.ga_steps} (gbs / dp): one optimizer step is one window of gbs")
            self.libra_sampler, self.libra_planner, self.libra_group = sampler, planner, group
            self.libra_losses = []  # (global step, this rank's part of the step's mean loss) per micro-batch

        def get_train_dataloader(self):
            return PlacementDataLoader(_Keyed(self.train_dataset), self.libra_sampler, collate_fn=_one)

        def libra_inputs(self, batch):
            """The model inputs of one collated batch: this rank's shard, its runtime and labels."""
            epoch, n = batch["key"]
            if n is None or epoch != self.libra_sampler.epoch:
                raise ValueError(f"libra.hf.Trainer: a batch of epoch {epoch} under the sampler's epoch "
                                 f"{self.libra_sampler.epoch}: batches must come from its PlacementBatchSampler")
            item = batch["item"]
            rt = self.libra_planner.runtime(n, self.libra_group)
            shard = shard_batch(rt, item["input_ids"], lengths=item["lengths"])
            return dict(shard, libra_runtime=rt)

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches = []
            for _ in range(num_batches):
                try:
                    batches.append(self.libra_inputs(next(epoch_iterator)))
                except StopIteration:
                    break
            n = count_items(torch.cat([b["labels"] for b in batches], dim=1)) if batches else None
            return batches, n

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False,
                        libra_runtime=inputs["libra_runtime"])
            part = loss(out.logits, inputs["labels"], num_items_in_batch)
            self.libra_losses.append((self.state.global_step, float(part.detach())))
            scaled = part * self.accelerator.num_processes
            return (scaled, out) if return_outputs else scaled

    return Trainer


def __getattr__(name):
    # The Trainer subclass imports transformers.Trainer (and accelerate) on first use only.
    if name == "Trainer":
        cls = globals()["Trainer"] = _trainer_class()
        return cls
    raise AttributeError(f"module 'libra.hf' has no attribute {name!r}")


register()

__all__ = ["NAME", "register", "use_runtime", "layer_windows", "Trainer", "attention_forward", "mask_forward", "packed_position_ids",
           "packed_labels", "slot_lengths", "home_rows", "shard_batch", "count_items", "loss",
           "all_reduce_gradients"]
