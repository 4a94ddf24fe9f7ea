"""libra.hf with transformers' own Llama and Qwen3 code, randomly initialised from tiny configs.

DP x CP = 4 gloo processes (P = 2, CP = 2, GQA: 4 q heads, 2 kv heads). Each rank
feeds its CP shard of its replica's packed sequence to the model with
attn_implementation="libra"; the loss summed over the ranks and the all-reduced
gradients are compared with the same weights under attn_implementation="sdpa"
run on every sample separately (batch 1, positions 0..n-1, no packing at all):
the whole-sequence loss, computed without libra and without transformers'
packed-sequence masks. The examples/hf_llama.py run under torchrun is tested
here too.
"""
import copy
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import libra  # noqa: E402
import libra.hf as lh  # noqa: E402
import libra.torch as lt  # noqa: E402
from dist_util import COMMUNICATORS, all_gather, all_reduce, reference_attention, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
L, CP, P = 64, 2, 2
# Two micro-batches (one GA step of 2 replicas each): padding, samples across the CP cut at row 32,
# a sample of length 1, a sequence of one sample.
STEPS = [[[10, 30, 20], [64]], [[5, 5, 40, 3, 1], [33, 17, 14]]]
# Measured (fp32 model, float64 loss; every rank): loss 1.1e-10 (Llama), 8.6e-10 (Qwen3) relative;
# gradients (max |diff| / max |ref| per parameter, the largest) 4.9e-7, 6.1e-7.
LOSS_TOL, GRAD_TOL = 1e-8, 5e-6


WINDOW = 12  # shorter than most samples of STEPS, so a window applied to a full layer changes its output


def configs():
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=L)
    return {"llama": transformers.LlamaConfig(**kw),
            "qwen3": transformers.Qwen3Config(head_dim=16, **kw),
            "mistral": transformers.MistralConfig(sliding_window=WINDOW, **kw),
            # layer 0 full, layer 1 sliding (transformers' layer_types from max_window_layers)
            "qwen2": transformers.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, **kw),
            # alternating sliding / full layers; no logit softcap (libra refuses it)
            "gemma2": transformers.Gemma2Config(head_dim=16, sliding_window=WINDOW, attn_logit_softcapping=None,
                                                query_pre_attn_scalar=16, **kw)}


# Gemma 2 has no sdpa path in transformers (its eager attention is the reference there).
def reference_impl(cfg):
    return "eager" if cfg.model_type == "gemma2" else "sdpa"


_SEEDED = threading.Lock()  # the seed is the process's: in-process workers build their models in turn


def make_model(cfg, impl):
    with _SEEDED:
        torch.manual_seed(0)
        # from_config writes the implementation into the config it is given: one copy per model.
        return transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)


def tokens(step, slot):
    g = torch.Generator().manual_seed(100 * step + slot)
    return torch.randint(0, 256, (L,), generator=g)


def separate_reference(cfg):
    """Loss and gradients of the step's mean next-token loss, every sample of every replica run
    alone under sdpa."""
    model = make_model(cfg, reference_impl(cfg))
    total = 0.0
    for step, pool in enumerate(STEPS):
        n_items = sum(n - 1 for seq in pool for n in seq)
        loss_sum = 0.0
        for slot, seq in enumerate(pool):
            ids, start = tokens(step, slot), 0
            for n in seq:
                x = ids[start:start + n][None]
                logits = model(input_ids=x).logits[0, :-1].double()
                ce = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum") if n > 1 else logits.sum() * 0
                (ce / n_items).backward()
                loss_sum += float(ce)
                start += n
        total += loss_sum / n_items
    return total, {k: p.grad.clone() for k, p in model.named_parameters()}


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


class _Last(threading.local):
    runtime = None  # run_model's last runtime, per worker


rt_last = _Last()


def runtimes(pool, group, windows, home_layout="contiguous"):
    """One PlanRuntime per window (a dict keyed by window when the layers have more than one)."""
    out = {}
    for w in windows:
        plan = libra.make_plan(pool, seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                               head_dim=16, chunks=2, dtype="fp32", home_layout=home_layout, window=w)
        out[w] = lt.PlanRuntime(plan, group)
    return out[windows[0]] if len(windows) == 1 else out


def flattened(step, slot):
    """The slot's samples as transformers' DataCollatorWithFlattening makes them: input_ids, unshifted
    labels (-100 at each sample's first row) and position_ids restarting per sample, [1, sum of lengths]."""
    ids, start, feats = tokens(step, slot), 0, []
    for n in STEPS[step][slot]:
        feats.append({"input_ids": ids[start:start + n].tolist(), "labels": ids[start:start + n].tolist()})
        start += n
    return transformers.DataCollatorWithFlattening(return_tensors="pt")(feats)


def run_model(rank, cfg, context, checkpointing=False, home_layout="contiguous", collator=False):
    """libra over the shards: (loss, gradients) summed over the ranks."""
    group, worker = lt.pool_group(P, CP)
    model = make_model(cfg, "libra")
    if checkpointing:
        # The decoder layers' forwards rerun during backward: libra_runtime= travels with them.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    calls = []  # layer 0's attention forwards: twice per micro-batch when the forward is recomputed
    model.model.layers[0].self_attn.register_forward_pre_hook(lambda *a: calls.append(1))
    total = 0.0
    for step, pool in enumerate(STEPS):
        rt = runtimes(pool, group, lh.layer_windows(cfg), home_layout)
        if collator:
            b = flattened(step, rank // CP)
            shard = lh.shard_batch(rt, b["input_ids"], labels=b["labels"], position_ids=b["position_ids"], shifted=False)
        else:
            shard = lh.shard_batch(rt, tokens(step, rank // CP), lengths=pool[rank // CP])
        if context:
            with lh.use_runtime(rt):
                logits = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"]).logits
        else:
            logits = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"], libra_runtime=rt).logits
        loss = lh.loss(logits, shard["labels"], lh.count_items(shard["labels"]), dtype=torch.float64)
        loss.backward()
        s = loss.detach().clone()
        all_reduce(s)
        total += float(s)
    lh.all_reduce_gradients(model)
    rt_last.runtime = rt
    model.attention_calls = len(calls)
    return total, model, group


def errors_of(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def dist_cases(rank, world):
    out = {}
    # Megatron / TransformerEngine's zigzag CP shards too: shard_batch takes the runtime's home rows.
    # (The scaling check below rebuilds whole sequences from contiguous shards: the last case is contiguous.)
    cases = [("llama", "llama", False, "contiguous"), ("qwen3", "qwen3", False, "contiguous"),
             ("llama zigzag", "llama", False, "zigzag"), ("llama checkpointed", "llama", True, "contiguous"),
             ("mistral window", "mistral", False, "contiguous"), ("qwen2 max_window_layers", "qwen2", False, "contiguous"),
             ("gemma2 mixed", "gemma2", False, "contiguous"), ("gemma2 mixed zigzag", "gemma2", False, "zigzag"),
             ("llama DataCollatorWithFlattening", "llama", False, "contiguous")]
    refs = {}
    for name, family, ckpt, layout in cases:
        cfg = configs()[family]
        loss, model, group = run_model(rank, cfg, context=(family == "qwen3"), checkpointing=ckpt,
                                       home_layout=layout, collator="Flattening" in name)
        if family not in refs:
            refs[family] = separate_reference(cfg)
        ref_loss, ref_grads = refs[family]
        grads = {k: p.grad for k, p in model.named_parameters()}
        out[name] = {"loss": abs(loss - ref_loss) / abs(ref_loss),
                     "grad": max(rel(grads[k], ref_grads[k]) for k in ref_grads),
                     "grad_names": sorted(grads) == sorted(ref_grads), "calls": model.attention_calls}
    # transformers' scaling argument reaches libra (the models above use the default d^-0.5).
    sched = rt_last.runtime.schedule
    g = torch.Generator().manual_seed(7 + rank)
    q = torch.randn(1, 4, sched["home_rows"], 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, sched["home_rows"], 16, generator=g, dtype=torch.float64) for _ in range(2))
    o, _ = lh.attention_forward(None, q.float(), k.float(), v.float(), None, scaling=0.3, libra_runtime=rt_last.runtime,
                                position_ids=lh.shard_batch(rt_last.runtime, tokens(0, 0),
                                                             lengths=STEPS[-1][rank // CP])["position_ids"])
    whole = [torch.zeros(L, h, 16, dtype=torch.float64) for h in (4, 2, 2)]
    gathered = [[torch.zeros_like(x[0].transpose(0, 1)) for _ in range(world)] for x in (q, k, v)]
    for x, gl in zip((q, k, v), gathered):
        all_gather(gl, x[0].transpose(0, 1).contiguous())
    slot = rank // CP
    for w, gl in zip(whole, gathered):
        w.copy_(torch.cat(gl[slot * CP:(slot + 1) * CP]))
    ref = reference_attention(*[x.float().double() for x in whole], STEPS[-1][slot], scale=0.3)
    rows = lh.home_rows(rt_last.runtime)
    out["scaling 0.3"] = rel(o[0].double(), ref[rows])
    # Bad calls: each must raise the same one line on every rank (and leave the group usable).
    cfg = configs()["llama"]
    model = make_model(cfg, "libra")
    plan_b = libra.make_plan(STEPS[1], seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                             head_dim=16, chunks=2, dtype="fp32")
    rt_b = lt.PlanRuntime(plan_b, group)
    plan_a = libra.make_plan(STEPS[0], seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                             head_dim=16, chunks=2, dtype="fp32")
    rt_a = lt.PlanRuntime(plan_a, group)
    sh = lh.shard_batch(rt_a, tokens(0, rank // CP), lengths=STEPS[0][rank // CP])
    # The home rows' samples in flash-attention's cu_seqlens terms, written out from STEPS[0]: slot 0
    # [10, 30, 20] + 4 padding, slot 1 [64]; CP rank 0 holds rows 0..31, rank 1 rows 32..63.
    cu = {0: [0, 10, 32], 1: [0, 8, 28, 32], 2: [0, 32], 3: [0, 32]}[rank]
    mask = torch.ones(1, L // CP, dtype=torch.long)
    if rank == 1:
        mask[0, -3:] = 0
    out["errors"] = {
        "padding mask on rank 1": errors_of(lambda: model(input_ids=sh["input_ids"], position_ids=sh["position_ids"],
                                                          attention_mask=mask, libra_runtime=rt_a)),
        "no position_ids": errors_of(lambda: model(input_ids=sh["input_ids"], libra_runtime=rt_a)),
        "the previous micro-batch's runtime": errors_of(lambda: model(input_ids=sh["input_ids"],
                                                                      position_ids=sh["position_ids"],
                                                                      libra_runtime=rt_b)),
        "no runtime": errors_of(lambda: model(input_ids=sh["input_ids"], position_ids=sh["position_ids"])),
        "cu_seq_lens_q off by one on rank 3": errors_of(
            lambda: model(input_ids=sh["input_ids"], position_ids=sh["position_ids"], libra_runtime=rt_a,
                          cu_seq_lens_q=torch.tensor([0, 31] if rank == 3 else cu),
                          cu_seq_lens_k=torch.tensor(cu))),
        "4D mask": errors_of(lambda: model(input_ids=sh["input_ids"], position_ids=sh["position_ids"],
                                           attention_mask=torch.zeros(1, 1, L // CP, L // CP), libra_runtime=rt_a)),
    }
    # An all-ones mask is no mask: it runs, and gives what no mask gives.
    with torch.no_grad():
        a = model(input_ids=sh["input_ids"], position_ids=sh["position_ids"], libra_runtime=rt_a).logits
        b = model(input_ids=sh["input_ids"], position_ids=sh["position_ids"], libra_runtime=rt_a,
                  attention_mask=torch.ones(1, L // CP, dtype=torch.long)).logits
        c = model(input_ids=sh["input_ids"], position_ids=sh["position_ids"], libra_runtime=rt_a,
                  cu_seq_lens_q=torch.tensor(cu), cu_seq_lens_k=torch.tensor(cu)).logits
    out["ones mask equal"] = bool(torch.equal(a, b))
    # A layer never runs under a plan of another window: Llama (full layers) under a windowed plan,
    # Gemma 2's full layers under its sliding window's plan, a window with no runtime.
    ws = runtimes(STEPS[0], group, [None, WINDOW])
    gemma = make_model(configs()["gemma2"], "libra")
    out["errors"].update({
        "llama under a windowed plan": errors_of(lambda: model(input_ids=sh["input_ids"], position_ids=sh["position_ids"],
                                                               libra_runtime=ws[WINDOW])),
        "gemma2 under its sliding window's plan alone": errors_of(
            lambda: gemma(input_ids=sh["input_ids"], position_ids=sh["position_ids"], libra_runtime=ws[WINDOW])),
        "gemma2 without a runtime for its window": errors_of(
            lambda: gemma(input_ids=sh["input_ids"], position_ids=sh["position_ids"], libra_runtime={None: ws[None]})),
        # The batch names its samples; a runtime planning another batch is refused on every rank.
        "shard_batch under the next batch's runtime": errors_of(
            lambda: lh.shard_batch(rt_b, tokens(0, rank // CP), lengths=STEPS[0][rank // CP])),
        "shard_batch under another batch's runtime on rank 2 only": errors_of(
            lambda: lh.shard_batch(rt_a, flattened(0, rank // CP)["input_ids"],
                                   position_ids=flattened(1 if rank == 2 else 0, rank // CP)["position_ids"])),
        "runtimes of other samples": errors_of(
            lambda: gemma(input_ids=sh["input_ids"], position_ids=sh["position_ids"],
                          libra_runtime={None: ws[None], WINDOW: runtimes(STEPS[1], group, [WINDOW])})),
    })
    out["right cu_seq_lens run"] = bool(torch.equal(a, c))
    return out


@pytest.fixture(scope="module", params=COMMUNICATORS)
def results(request):
    return run(request.param, dist_cases, P * CP)


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama checkpointed", "llama zigzag", "mistral window",
                                    "qwen2 max_window_layers", "gemma2 mixed", "gemma2 mixed zigzag",
                                    "llama DataCollatorWithFlattening"])
def test_loss_and_gradients_over_cp_shards_match_sdpa_on_each_sample(results, family):
    for r, res in enumerate(results):
        got = res[family]
        assert got["grad_names"]
        assert got["calls"] == len(STEPS) * (2 if "checkpointed" in family else 1)
        assert got["loss"] <= LOSS_TOL, (family, r, got)
        assert got["grad"] <= GRAD_TOL, (family, r, got)


@pytest.mark.parametrize("case,expect", [
    ("padding mask on rank 1", "libra.hf: group rank 1: attention_mask of shape [1, 32] given"),
    ("no position_ids", "libra.hf: group rank 0: position_ids[10] is 10 but the plan"),
    ("the previous micro-batch's runtime", "libra.hf: group rank 0: position_ids[5] is 5 but the plan"),
    ("no runtime", "libra.hf: no PlanRuntime for this forward"),
    ("4D mask", "libra.hf: group rank 0: attention_mask of shape [1, 1, 32, 32] given"),
    ("cu_seq_lens_q off by one on rank 3",
     "libra.hf: group rank 3: cu_seq_lens_q [0, 31] differs from the plan's home layout [0, 32]"),
    ("llama under a windowed plan",
     f"libra.hf: group rank 0: this layer's sliding_window is None but the runtime's plan has window {WINDOW}: "),
    ("gemma2 under its sliding window's plan alone",
     f"libra.hf: group rank 0: this layer's sliding_window is None but the runtime's plan has window {WINDOW}: "),
    ("gemma2 without a runtime for its window",
     f"libra.hf: group rank 0: no runtime for this layer's sliding_window {WINDOW}: libra_runtime has windows [None]"),
    ("runtimes of other samples", f"libra.hf: group rank 0: libra_runtime[{WINDOW}] and libra_runtime[None] plan other"),
    ("shard_batch under the next batch's runtime",
     "libra.hf.shard_batch: group rank 0: the batch's sample lengths [10, 30, 20] are not those of the runtime's plan "
     "[5, 5, 40, 3, 1] (slot 0): the runtime plans another batch"),
    ("shard_batch under another batch's runtime on rank 2 only",
     "libra.hf.shard_batch: group rank 2: position_ids[33] is 0 but the runtime's plan (samples [64]) puts position 33"),
])
def test_a_call_libra_cannot_honour_fails_on_every_rank_with_one_line(results, case, expect):
    msgs = [res["errors"][case] for res in results]
    assert msgs[0] is not None and msgs[0].startswith(expect), msgs[0]
    assert "\n" not in msgs[0]
    assert all(m == msgs[0] for m in msgs), msgs


def test_the_scaling_argument_reaches_libra(results):
    assert all(res["scaling 0.3"] <= 2e-6 for res in results), [res["scaling 0.3"] for res in results]


def test_an_all_ones_mask_is_no_mask(results):
    assert all(res["ones mask equal"] for res in results)


def test_cu_seq_lens_of_the_home_samples_are_accepted(results):
    assert all(res["right cu_seq_lens run"] for res in results)


def test_labels_shift_within_samples_before_sharding():
    ids = torch.arange(10, 20)
    assert lh.packed_labels(ids, [3, 4]).tolist() == [11, 12, -100, 14, 15, 16, -100, -100, -100, -100]
    assert lh.packed_position_ids([3, 4], 10).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
    with pytest.raises(ValueError, match="lengths sum to 11, more than seq_len 10"):
        lh.packed_position_ids([5, 6], 10)


def runtime_without_group(plan, w):
    """What shard_batch reads of a PlanRuntime (its plan, worker and home layout), without a process group."""
    from types import SimpleNamespace  # noqa: PLC0415

    lay = libra._libra.home_layout(plan, w)
    return SimpleNamespace(plan=plan, worker=w, home_tokens=lay["home_tokens"],
                           packed_rows=torch.from_numpy(lay["packed_rows"].astype("int64")),
                           cu_seqlens=torch.from_numpy(lay["cu_seqlens"].astype("int32")))


def test_shard_batch_gives_each_cp_rank_its_home_rows_with_the_labels_across_the_cut():
    plan = libra.make_plan(STEPS[0], seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, dtype="fp32")
    for slot, lengths in enumerate(STEPS[0]):
        ids = tokens(0, slot)
        shards = []
        for cpr in range(CP):
            w = slot * CP + cpr
            rt = runtime_without_group(plan, w)
            shards.append(lh.shard_batch(rt, ids, lengths=lengths))
        for key, whole in (("input_ids", ids), ("labels", lh.packed_labels(ids, lengths)),
                           ("position_ids", lh.packed_position_ids(lengths, L))):
            assert torch.equal(torch.cat([sh[key][0] for sh in shards]), whole), key
    # Slot 0's sample of rows 10..39 crosses the cut at row 32: rank 0's last label is rank 1's first token.
    rt0 = runtime_without_group(plan, 0)
    s0 = lh.shard_batch(rt0, tokens(0, 0), lengths=STEPS[0][0])
    assert int(s0["labels"][0, -1]) == int(tokens(0, 0)[L // CP])
    with pytest.raises(ValueError, match=r"^libra.hf.shard_batch: input_ids has shape \[2, 64\], expected \[n\] or \[1, n\]"):
        lh.shard_batch(rt0, torch.zeros(2, L, dtype=torch.long), lengths=STEPS[0][0])
    with pytest.raises(ValueError, match=r"^libra.hf.shard_batch: pass the batch's own sample lengths="):
        lh.shard_batch(rt0, tokens(0, 0))


def test_data_collator_with_flattening_labels_are_unshifted_and_said_so():
    """DataCollatorWithFlattening's labels hold token i at row i (transformers' convention): shard_batch
    shifts them with shifted=False, refuses them without shifted=, and refuses them as shifted=True."""
    plan = libra.make_plan(STEPS[1], seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=4, heads_kv=2,
                           head_dim=16, dtype="fp32")
    for slot, lengths in enumerate(STEPS[1]):
        b = flattened(1, slot)  # [1, 54] (padded to 64 here) and [1, 64]
        shards = [lh.shard_batch(runtime_without_group(plan, slot * CP + c), b["input_ids"], labels=b["labels"],
                                 position_ids=b["position_ids"], shifted=False) for c in range(CP)]
        assert torch.equal(torch.cat([sh["labels"][0] for sh in shards]), lh.packed_labels(tokens(1, slot), lengths))
        rt = runtime_without_group(plan, slot * CP)
        with pytest.raises(ValueError, match=r"^libra.hf.shard_batch: labels given without shifted=True/False"):
            lh.shard_batch(rt, b["input_ids"], labels=b["labels"], position_ids=b["position_ids"])
        with pytest.raises(ValueError, match=r"a sample's last row\) is \d+ but shifted labels leave every sample's"):
            lh.shard_batch(rt, b["input_ids"], labels=b["labels"], position_ids=b["position_ids"], shifted=True)
        shifted = lh.packed_labels(tokens(1, slot), lengths)[:b["input_ids"].shape[1]]
        with pytest.raises(ValueError, match=r"labels look shifted .* but shifted=False was given"):
            lh.shard_batch(rt, b["input_ids"], labels=shifted, position_ids=b["position_ids"], shifted=False)


def test_transformers_packed_sdpa_equals_separate_samples():
    """The example's baseline (sdpa on the whole packed sequence, transformers' own block-diagonal mask
    from position ids restarting per sample) against every sample alone."""
    model = make_model(configs()["llama"], "sdpa")
    seq, ids = [10, 30, 20], tokens(0, 0)
    with torch.no_grad():
        # use_cache=False: with a cache transformers skips the packed-sequence mask (attends across samples).
        packed = model(input_ids=ids[None], position_ids=lh.packed_position_ids(seq, L)[None],
                       use_cache=False).logits[0]
        start = 0
        for n in seq:
            alone = model(input_ids=ids[start:start + n][None]).logits[0]
            assert rel(packed[start:start + n], alone) < 1e-5
            start += n


def _torchrun():
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def test_hf_llama_example_under_torchrun(tmp_path):
    env = dict(os.environ)
    build = os.environ.get("LIBRA_PYTHON_BUILD", str(ROOT / "build" / "release" / "python"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), build, env.get("PYTHONPATH", "")])
    cmd = _torchrun() + ["--standalone", "--nproc-per-node", "4", str(ROOT / "examples" / "hf_llama.py"),
                         "--steps", "3", "--out", str(tmp_path), "--check-loss", "1e-8", "--check-grad", "2e-6"]
    # Its own session, so that a timeout ends torchrun's workers too, not only torchrun.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail("hf_llama.py under torchrun ran past 300 s: " + stdout[-2000:] + stderr[-2000:])
    r = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    loss = float(re.search(r"largest relative loss difference: (\S+)", r.stdout).group(1))
    grad = float(re.search(r"step-1 relative gradient error: (\S+)", r.stdout).group(1))
    assert 0 <= loss <= 1e-8 and 0 <= grad <= 2e-6, r.stdout
    assert (tmp_path / "loss.csv").read_text().count("\n") == 4
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_placement_data_loader_moves_the_sampler_to_the_next_epoch():
    """transformers' Trainer calls set_epoch on the loader (or on the batch sampler that accelerate's
    skip_first_batches wraps ours in): both reach the PlacementBatchSampler, which yields nothing once
    an epoch is done until set_epoch moves it on. Each index carries its batch key."""
    from accelerate.data_loader import skip_first_batches  # noqa: PLC0415

    seqs = [[10, 20], [30], [5, 5], [12], [7, 8], [9]]
    sampler = lt.PlacementBatchSampler(seqs, gbs=2, dp=2, pool_size=2, dp_rank=0)
    loader = lt.PlacementDataLoader(list(range(len(seqs))), sampler, collate_fn=lambda b: b)
    loader.set_epoch(0)
    first = list(loader)
    assert len(first) == len(sampler) == 3 and list(loader) == []  # the epoch is spent
    loader.set_epoch(1)
    second = list(loader)
    assert len(second) == 3
    keys = [(i.epoch, i.batch) for (i,) in lt.PlacementBatchSampler(seqs, gbs=2, dp=2, pool_size=2, dp_rank=0)]
    assert keys == [(0, 0), (0, 1), (0, 2)]
    # Resuming: accelerate's skip_first_batches wraps the sampler; Trainer then reaches it as
    # loader.batch_sampler.batch_sampler.
    sampler2 = lt.PlacementBatchSampler(seqs, gbs=2, dp=2, pool_size=2, dp_rank=0)
    skipped = skip_first_batches(lt.PlacementDataLoader(list(range(len(seqs))), sampler2, collate_fn=lambda b: b), 1)
    skipped.batch_sampler.batch_sampler.set_epoch(1)
    assert list(skipped) == second[1:]


def test_hf_trainer_example_under_torchrun(tmp_path):
    """examples/hf_trainer.py: libra.hf.Trainer over 2 epochs with gradient accumulation, resumed from a
    mid-epoch checkpoint, against the same Trainer under sdpa and a single-process step-1 gradient."""
    env = dict(os.environ)
    build = os.environ.get("LIBRA_PYTHON_BUILD", str(ROOT / "build" / "release" / "python"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), build, env.get("PYTHONPATH", "")])
    cmd = _torchrun() + ["--standalone", "--nproc-per-node", "4", str(ROOT / "examples" / "hf_trainer.py"),
                         "--out", str(tmp_path), "--check", "1e-6"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail("hf_trainer.py under torchrun ran past 300 s: " + stdout[-2000:] + stderr[-2000:])
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    figures = dict(re.findall(r"^([a-z0-9, -]+): (\S+)$", stdout, re.M))
    assert figures["steps"] == "6", stdout  # two epochs of 3 optimizer steps: epoch 2 runs
    assert float(figures["loss, libra vs sdpa"]) <= 1e-6, stdout
    assert float(figures["step-1 gradient vs single-process sdpa"]) <= 1e-6, stdout
    assert float(figures["resumed vs uninterrupted loss"]) == 0.0, stdout
    assert float(figures["resumed vs uninterrupted weights"]) == 0.0, stdout
