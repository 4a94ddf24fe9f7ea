"""libra as Megatron-Core's core attention: a megatron-core TransformerLayer on gloo (CPU), forward
and backward, against the same layer with Megatron's own DotProductAttention on whole samples.

DP x CP = 4 processes (P = 2, CP = 2). The libra layer comes from libra.megatron.gpt_layer_spec()
(get_gpt_layer_local_spec with LibraCoreAttention) and runs on each rank's home rows in thd format
with Megatron's PackedSeqParams; the reference layer comes from get_gpt_layer_local_spec() itself
with the same weights and runs every packed sample alone as an sbhd sequence [n, 1, h] with
Megatron's causal mask (everything but attention is token-local, so this is the whole-sequence
layer). The same for a 2-layer GPTModel (no position embedding) with Megatron's per-token loss. Megatron's DotProductAttention allocates its score buffer with
device=torch.cuda.current_device() (megatron/core/utils.py:631, GlobalMemoryBuffer.get_tensor,
from dot_product_attention.py:189), and runs its dropout inside
tensor_parallel.get_cuda_rng_tracker().fork() (dot_product_attention.py:217), whose states exist only
after model_parallel_cuda_manual_seed, which calls torch.cuda.manual_seed
(tensor_parallel/random.py:248 raises "cuda rng state model-parallel-rng is not added"). The
reference pre-fills the buffer with a CPU tensor, which get_tensor then reuses, and replaces the
tracker with one whose fork does nothing (the dropout is 0). Nothing else in the layer needed CUDA here (fp32, use_cpu_initialization,
no TE or apex). With RoPE, Megatron's RotaryEmbedding.get_emb moves its frequencies to
torch.cuda.current_device(): the test process answers "cpu" there.
"""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
import torch.distributed as dist  # noqa: E402

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from dist_util import spawn  # noqa: E402

L, P, CP, HEADS, GROUPS, D = 64, 2, 2, 4, 2, 16
HIDDEN = HEADS * D
POOLS = [[10, 30, 20], [64], [5, 5, 40, 3], [33, 17]]
TOL = 2e-5  # fp32; measured 1.8e-8 .. 3.9e-7 (layer and GPTModel, outputs and gradients)


def make_config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig
    args = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
                ffn_hidden_size=2 * HIDDEN, use_cpu_initialization=True, params_dtype=torch.float32, bf16=False,
                fp16=False, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
                gradient_accumulation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                masked_softmax_fusion=False, persist_layer_norm=False, normalization="RMSNorm")
    args.update(kw)
    return TransformerConfig(**args)


def rel(got, want):
    return float((got.detach().double() - want.detach().double()).abs().max() / want.detach().abs().max())


def slot_data(pool_index, slot):
    g = torch.Generator().manual_seed(10 * pool_index + slot)
    x = torch.randn(L, 1, HIDDEN, generator=g)
    grad = torch.randn(L, 1, HIDDEN, generator=g)
    return x, grad


def body(rank, world):
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.spec_utils import build_module

    import libra.megatron as lm

    parallel_state.initialize_model_parallel(1, 1)
    # Megatron's DotProductAttention takes its score buffer from here, allocated on CUDA unless present.
    parallel_state.get_global_memory_buffer().buffer[("mpu", torch.float32)] = torch.empty(1 << 16)
    # and runs its (here 0) dropout inside a fork of the CUDA RNG tracker, which holds CUDA RNG states.
    import contextlib

    from megatron.core import tensor_parallel

    class _NoCudaRng:
        def fork(self, *a, **k):
            return contextlib.nullcontext()
    tensor_parallel.get_cuda_rng_tracker = _NoCudaRng
    # Megatron's RotaryEmbedding.get_emb moves its inv_freq to torch.cuda.current_device() on first use.
    torch.cuda.current_device = lambda: torch.device("cpu")
    group, worker = lt.pool_group(P, CP)
    pool_index = rank // (P * CP)
    pool = POOLS[2 * pool_index:2 * pool_index + 2]
    plan = libra.make_plan(pool, seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=HEADS, heads_kv=GROUPS,
                           head_dim=D, chunks=2, dtype="fp32")
    rt = lt.PlanRuntime(plan, group)
    config = make_config()
    torch.manual_seed(0)
    layer = build_module(lm.gpt_layer_spec(normalization="RMSNorm"), config=config, layer_number=1)
    ref = build_module(get_gpt_layer_local_spec(normalization="RMSNorm"), config=config, layer_number=1)
    ref.load_state_dict(layer.state_dict())
    out = {"core_attention": type(layer.self_attention.core_attention).__name__,
           "ref_core_attention": type(ref.self_attention.core_attention).__name__}

    slot, cpr = worker // CP, worker % CP
    home = slice(cpr * (L // CP), (cpr + 1) * (L // CP))
    X, G = slot_data(pool_index, slot)
    valid = sum(pool[slot])
    G[valid:] = 0  # padding rows: libra's attention gives 0 there, Megatron's has no padding
    x = X[home].clone().requires_grad_()
    psp = lm.packed_seq_params(rt)
    out["cu_seqlens"] = psp.cu_seqlens_q.tolist()
    with lm.use_runtime(rt):
        y, _ = layer(x, attention_mask=None, packed_seq_params=psp)
        (y * G[home]).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    for t in grads.values():
        dist.all_reduce(t, group=group)  # the pool's sequences; the reference below sums the same

    # Reference: every sample of the pool's sequences alone, through Megatron's own layer.
    ref_y, ref_dx = None, None
    for s, samples in enumerate(pool):
        Xs, Gs = slot_data(pool_index, s)
        xs = Xs.clone().requires_grad_()
        start, ys = 0, []
        for n in samples:
            mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)
            yo, _ = ref(xs[start:start + n], attention_mask=mask)
            (yo * Gs[start:start + n]).sum().backward()
            ys.append(yo)
            start += n
        if s == slot:
            ref_y, ref_dx = torch.cat(ys), xs.grad
    h0, h1 = home.start, min(home.stop, valid)
    n_valid = max(0, h1 - h0)
    out["err"] = {"out": rel(y[:n_valid], ref_y[h0:h0 + n_valid]) if n_valid else 0.0,
                  "dx": rel(x.grad[:n_valid], ref_dx[h0:h0 + n_valid]) if n_valid else 0.0,
                  "params": max(rel(grads[n], p.grad) for n, p in ref.named_parameters())}

    # The zigzag home layout (Megatron / TE's: rank r holds chunks r and 2CP-1-r), with this rank's
    # home cu_seqlens and with the whole packed sequence's (TE's convention under CP).
    zplan = libra.make_plan(pool, seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=HEADS, heads_kv=GROUPS,
                            head_dim=D, chunks=2, dtype="fp32", home_layout="zigzag")
    zrt = lt.PlanRuntime(zplan, group)
    rows = zrt.packed_rows
    keep = rows < valid
    out["zigzag_rows"] = rows.tolist()
    out["zigzag"] = {}
    for name, zpsp in (("home cu_seqlens", lm.packed_seq_params(zrt)),
                       ("packed cu_seqlens", PackedSeqParams(qkv_format="thd", cu_seqlens_q=zrt.packed_cu_seqlens,
                                                             cu_seqlens_kv=zrt.packed_cu_seqlens))):
        layer.zero_grad()
        xz = X[rows].clone().requires_grad_()
        with lm.use_runtime(zrt):
            yz, _ = layer(xz, attention_mask=None, packed_seq_params=zpsp)
            (yz * G[rows]).sum().backward()
        zgrads = {n: p.grad.clone() for n, p in layer.named_parameters()}
        for t in zgrads.values():
            dist.all_reduce(t, group=group)
        out["zigzag"][name] = {"out": rel(yz[keep], ref_y[rows[keep]]), "dx": rel(xz.grad[keep], ref_dx[rows[keep]]),
                               "params": max(rel(zgrads[n], p.grad) for n, p in ref.named_parameters())}

    out["gpt"] = gpt_model_case(rank, rt, pool, pool_index, slot, valid)
    # RoPE: libra hands Megatron's thd RoPE each home row's position in its sample (a sample cut by
    # the CP boundary continues its positions on the next rank; zigzag's second chunk too).
    out["gpt rope"] = gpt_model_case(rank, rt, pool, pool_index, slot, valid, rope=True)
    out["gpt rope zigzag"] = gpt_model_case(rank, zrt, pool, pool_index, slot, valid, rope=True)

    # The module alone, called as Megatron calls it, thd and sbhd (batch 1), with the runtime set on it.
    core = layer.self_attention.core_attention
    g2 = torch.Generator().manual_seed(rank)
    q = torch.randn(L // CP, HEADS, D, generator=g2)
    k, v = torch.randn(2, L // CP, GROUPS, D, generator=g2)
    core.runtime = rt
    o_thd = core(q, k, v, None, packed_seq_params=psp)
    o_sbhd = core(q[:, None], k[:, None], v[:, None], None)
    core.runtime = None
    out["shapes"] = [list(o_thd.shape), list(o_sbhd.shape)]
    out["sbhd_equal"] = bool(torch.equal(o_sbhd[:, 0], o_thd))

    # A stale runtime: the layout of another micro-batch's plan. Every rank raises the same line.
    other = libra.make_plan(POOLS[2:4] if pool_index == 0 else POOLS[0:2], seq_len=L, cp=CP, block_size=8,
                            head_shards=2, heads_q=HEADS, heads_kv=GROUPS, head_dim=D, dtype="fp32")
    stale = lm.packed_seq_params(lt.PlanRuntime(other, group))
    try:
        with lm.use_runtime(rt):
            layer(X[home].clone(), attention_mask=None, packed_seq_params=stale)
        out["stale"] = None
    except ValueError as e:
        out["stale"] = str(e)
    # No runtime at all: refused locally (nothing collective has started).
    try:
        layer(X[home].clone(), attention_mask=None, packed_seq_params=psp)
        out["no_runtime"] = None
    except ValueError as e:
        out["no_runtime"] = str(e)
    # Construction-time refusals, in Python names.
    refusals = {}
    for name, kw in (("dropout", dict(attention_dropout=0.1)),):
        try:
            build_module(lm.gpt_layer_spec(), config=make_config(**kw), layer_number=1)
            refusals[name] = None
        except ValueError as e:
            refusals[name] = str(e)
    out["refusals"] = refusals
    # Megatron's PackedSeqParams built by hand with another layout is refused too (not just ours).
    wrong = PackedSeqParams(qkv_format="thd", cu_seqlens_q=torch.tensor([0, L // CP], dtype=torch.int32),
                            cu_seqlens_kv=torch.tensor([0, L // CP], dtype=torch.int32), max_seqlen_q=L // CP,
                            max_seqlen_kv=L // CP)
    try:
        with lm.use_runtime(rt):
            core(q, k, v, None, packed_seq_params=wrong)
        out["hand_made"] = None
    except ValueError as e:
        out["hand_made"] = str(e)
    # The home segments without the padding rows (rank 1 has 4) describe the same layout as
    # packed_seq_params' (with them as a last segment).
    bare = lm.home_cu_seqlens(rt)
    with lm.use_runtime(rt):
        o_pad = core(q, k, v, None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=bare,
                                                                        cu_seqlens_kv=bare))
    out["padded_segment_equal"] = bool(torch.equal(o_pad, o_thd))
    parallel_state.destroy_model_parallel()
    return out


def gpt_model_case(rank, rt, pool, pool_index, slot, valid, rope=False):
    """A 2-layer GPTModel (embedding, layers, output layer, Megatron's per-token loss; no position
    embedding, or RoPE) through libra in thd on the runtime's home rows (contiguous or zigzag),
    against the same model with DotProductAttention and Megatron's own RoPE on every sample alone."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    import libra.megatron as lm
    config, vocab = make_config(num_layers=2), 48
    kw = dict(config=config, vocab_size=vocab, max_sequence_length=L, position_embedding_type="rope" if rope else "none")
    torch.manual_seed(1)
    gpt = GPTModel(transformer_layer_spec=lm.gpt_layer_spec(normalization="RMSNorm"), **kw)
    ref = GPTModel(transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"), **kw)
    ref.load_state_dict(gpt.state_dict())

    def data(s):
        g = torch.Generator().manual_seed(50 + 10 * pool_index + s)
        return torch.randint(0, vocab, (L,), generator=g), torch.randint(0, vocab, (L,), generator=g)
    ids, labels = data(slot)
    rows = rt.packed_rows
    with lm.use_runtime(rt):
        losses = gpt(ids[rows][None], lm.home_position_ids(rt)[None], None, labels=labels[rows][None],
                     packed_seq_params=lm.packed_seq_params(rt))
        keep = rows < valid  # padding rows count 0
        (losses[0] * keep.float()).sum().backward()
    grads = {n: p.grad.clone() for n, p in gpt.named_parameters()}
    for t in grads.values():
        dist.all_reduce(t, group=rt.group)
    ref_losses = None
    for s, samples in enumerate(pool):
        ids_s, labels_s = data(s)
        start, per = 0, []
        for n in samples:
            mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)
            lo = ref(ids_s[start:start + n][None], torch.arange(n)[None], mask, labels=labels_s[start:start + n][None])
            lo.sum().backward()
            per.append(lo[0])
            start += n
        if s == slot:
            ref_losses = torch.cat(per)
    return {"loss": rel(losses[0, keep], ref_losses[rows[keep]]) if bool(keep.any()) else 0.0,
            "params": max(rel(grads[n], p.grad) for n, p in ref.named_parameters())}


@pytest.fixture(scope="module")
def results():
    return spawn(body, 4)


def test_spec_swaps_in_libra(results):
    assert results[0]["core_attention"] == "LibraCoreAttention"
    assert results[0]["ref_core_attention"] == "DotProductAttention"


def test_transformer_layer_matches_megatron_dot_product_attention(results):
    print("errors by rank:", [r["err"] for r in results])
    for r in results:
        for what, e in r["err"].items():
            assert e < TOL, (what, r["err"])


@pytest.mark.parametrize("case", ["gpt", "gpt rope", "gpt rope zigzag"])
def test_gpt_model_matches_megatron_dot_product_attention(results, case):
    print(case, "errors by rank:", [r[case] for r in results])
    for r in results:
        for what, e in r[case].items():
            assert e < TOL, (what, r[case])


def test_zigzag_home_layout_matches_megatron_dot_product_attention(results):
    print("zigzag errors by rank:", [r["zigzag"] for r in results])
    # Rank r of the slot holds chunks r and 2CP-1-r of L/2CP rows each.
    c = L // (2 * CP)
    assert results[0]["zigzag_rows"] == list(range(0, c)) + list(range(3 * c, 4 * c))
    assert results[1]["zigzag_rows"] == list(range(c, 3 * c))
    for r in results:
        for case, errs in r["zigzag"].items():
            for what, e in errs.items():
                assert e < TOL, (case, what, r["zigzag"])


def test_home_layout(results):
    # Pool 0: sequences [10, 30, 20] (60 of 64 rows) and [64]; pool 1: [5, 5, 40, 3] and [33, 17].
    # packed_seq_params adds rank 1's 4 padding rows as a last segment (Megatron's thd RoPE splits every row).
    assert [r["cu_seqlens"] for r in results] == [[0, 10, 32], [0, 8, 28, 32], [0, 32], [0, 32]]


def test_module_shapes_thd_and_sbhd(results):
    for r in results:
        assert r["shapes"] == [[L // CP, HEADS * D], [L // CP, 1, HEADS * D]]
        assert r["sbhd_equal"]


def test_stale_layout_raises_the_same_line_on_every_rank(results):
    lines = {r["stale"] for r in results}
    assert len(lines) == 1 and None not in lines, lines
    (line,) = lines
    assert line.startswith("libra.torch.attention: group rank 0: cu_seqlens [0, 5, 10, 32] match neither this "
                           "rank's home rows' [0, 10, 32] nor the packed sequence's [0, 10, 40, 60]"), line
    assert "\n" not in line
    hand = {r["hand_made"] for r in results}
    assert len(hand) == 1 and "cu_seqlens [0, 32] match neither" in hand.pop()


def test_padding_as_a_last_segment_is_the_same_layout(results):
    assert all(r["padded_segment_equal"] for r in results)


def test_refusals_name_the_argument(results):
    r = results[0]
    assert r["no_runtime"] and "use_runtime" in r["no_runtime"]
    # Megatron's build_module re-raises with " when instantiating SelfAttention ..." appended.
    assert r["refusals"]["dropout"].startswith("libra.megatron.LibraCoreAttention: attention_dropout 0.1 must be 0 "
                                               "(libra's kernels have no dropout)")
