#!/usr/bin/env python3
"""Trains transformers' LlamaForCausalLM with attn_implementation="libra" and with "sdpa"; compares them.

Launch with torchrun (gloo, CPU), DP x CP = 4 processes (P = 2, CP = 2):

    .venv/bin/torchrun --standalone --nproc-per-node 4 examples/hf_llama.py --steps 50 --out out/hf_llama

A small Llama (hidden 64, 2 layers, 4 q heads, 2 kv heads: GQA; byte vocabulary
of 256) is randomly initialised from its config, no download. Data: the bytes of
/usr/share/common-licenses (examples/_common.py, as train_tiny.py), one sample
per paragraph, packed to --seq-len by libra. Each DP replica draws its packed
sequences from libra.torch.PlacementBatchSampler (VRSP), each CP rank feeds its
home rows (libra.hf.shard_batch: input_ids, position_ids restarting per sample,
labels shifted within each sample before sharding) to the model, whose attention
layers run libra.torch.attention over the pool. The same run is repeated from the
same initial weights and sample order with attn_implementation="sdpa" on whole
sequences (every rank runs its replica's whole packed sequence, transformers
masking block-diagonally from the position ids, and keeps its home rows' loss
terms). Both normalise the loss by the optimizer step's labelled tokens over all
ranks and sum the gradients over all ranks (libra.hf.count_items, loss,
all_reduce_gradients). Rank 0 writes OUT/loss.csv and OUT/loss.png and prints the
largest relative loss difference, the step-1 relative gradient error over all
parameters and the per-step times.
"""
import argparse
import copy
import os
import statistics
import time

import _common  # noqa: F401  (first: libra from this source tree)
import libra.hf as lh
import libra.torch as lt
import torch
import torch.distributed as dist
import transformers
from _common import PackedBytes, add_training_args, load_samples, pack_bytes, torchrun_main, write_loss_files


def model_config(args):
    return transformers.LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                    num_hidden_layers=args.layers, num_attention_heads=args.heads_q,
                                    num_key_value_heads=args.heads_kv, max_position_embeddings=args.seq_len)


def train(args, packed, impl):
    """One training run; returns (per-step losses, per-step seconds, step-1 gradient vector)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cp, pool = args.cp, args.pool_size
    dp, dp_rank = world // cp, rank // cp
    group, worker = lt.pool_group(pool, cp)
    sampler = lt.PlacementBatchSampler([s for s, _ in packed], gbs=args.gbs, dp=dp, pool_size=pool, dp_rank=dp_rank)
    loader = iter(torch.utils.data.DataLoader(PackedBytes(packed, args.seq_len), batch_sampler=sampler,
                                              collate_fn=lambda b: b[0]))
    planner = lt.Planner(sampler, worker=worker, seq_len=args.seq_len, cp=cp, block_size=args.block, head_shards=2,
                         heads_q=args.heads_q, heads_kv=args.heads_kv, head_dim=args.hidden // args.heads_q,
                         chunks=2, dtype="fp32")
    torch.manual_seed(args.seed)  # the same initial weights in both runs and on every rank
    # from_config writes the implementation into the config object: each model gets its own.
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(model_config(args)), attn_implementation=impl)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ga = sampler.ga_steps
    lh_rows = args.seq_len // cp
    rows = torch.arange((rank % cp) * lh_rows, (rank % cp + 1) * lh_rows)  # sdpa: this rank's loss rows
    losses, times, grad1 = [], [], None
    for step in range(args.steps):
        t0 = time.perf_counter()
        # The step's micro-batches first: the loss is normalised by the labelled tokens of the whole
        # optimizer step over every rank, known from the labels before any forward.
        micro = []
        for g in range(ga):
            n = step * ga + g
            ids, lengths = next(loader)
            if impl == "libra":
                rt = planner.runtime(n, group)
                micro.append((lh.shard_batch(rt, ids, lengths=lengths), rt))  # the batch names its samples
            else:
                whole = {"input_ids": ids[None], "position_ids": lh.packed_position_ids(lengths, args.seq_len)[None],
                         "labels": lh.packed_labels(ids, lengths)[rows][None]}
                micro.append((whole, None))
        num_items = lh.count_items(torch.cat([b["labels"] for b, _ in micro], dim=1))
        step_loss = torch.zeros((), dtype=torch.float64)
        for batch, rt in micro:
            # use_cache=False: with a cache (the config's default) transformers does not derive the
            # packed-sequence mask from the position ids, and sdpa would attend across samples.
            if rt is not None:
                logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                               libra_runtime=rt).logits
            else:
                logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                               use_cache=False).logits[:, rows]
            # float64 cross-entropy so that the two runs' differences are not hidden by fp32 sums.
            loss = lh.loss(logits, batch["labels"], num_items, dtype=torch.float64)
            loss.backward()
            step_loss += loss.detach()
        lh.all_reduce_gradients(model)
        if step == 0:
            grad1 = torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)
        losses.append(float(step_loss))
        times.append(time.perf_counter() - t0)
    planner.close()
    return losses, times, grad1


def write_outputs(out, la, lp, rel, ta, tp):
    rows = [[i + 1, f"{row[0]:.12g}", f"{row[1]:.12g}", f"{row[2]:.3e}", f"{row[3]:.4f}", f"{row[4]:.4f}"]
            for i, row in enumerate(zip(la, lp, rel, ta, tp))]
    write_loss_files(out, ["step", "loss_libra", "loss_sdpa", "relative_difference", "seconds_libra", "seconds_sdpa"],
                     rows, [(la, "-", 'attn_implementation="libra" (P=2, CP=2)'),
                            (lp, "--", 'attn_implementation="sdpa", whole sequences')],
                     title="LlamaForCausalLM (hidden 64, 2 layers, GQA 4/2)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="optimizer steps")
    add_training_args(ap, "hf_llama")
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads-q", type=int, default=4)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--check-loss", type=float, help="exit 1 when the largest relative loss difference exceeds this")
    ap.add_argument("--check-grad", type=float, help="exit 1 when the step-1 relative gradient error exceeds this")
    args = ap.parse_args()
    torchrun_main("hf_llama", args.threads, lambda: run(args))


def run(args):
    """Both trainings, the outputs (rank 0) and the failed checks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % (args.cp * args.pool_size):
        raise SystemExit(f"hf_llama: {world} processes: must be a multiple of --cp x --pool-size "
                         f"= {args.cp * args.pool_size}")
    packed = pack_bytes(load_samples(args.text), args.seq_len)
    need = args.steps * args.gbs
    if len(packed) < need:
        raise SystemExit(f"hf_llama: --steps {args.steps} needs {need} packed sequences, the text gives {len(packed)}")
    la, ta, ga = train(args, packed, "libra")
    lp, tp, gp = train(args, packed, "sdpa")
    # Every rank holds the same all-reduced losses and gradients, so every rank decides alike.
    rel = [abs(a - b) / abs(b) for a, b in zip(la, lp)]
    grad_err = float((ga - gp).abs().max() / gp.abs().max())
    worst = max(range(len(rel)), key=rel.__getitem__)
    if rank == 0:
        write_outputs(args.out, la, lp, rel, ta, tp)
        # The first step also builds the planner's first plan and warms caches: left out of the medians.
        med = lambda t: statistics.median(t[1:] if len(t) > 1 else t)  # noqa: E731
        print(f"hf_llama: {len(packed)} packed sequences of {args.seq_len} bytes; {world} processes "
              f"(DP {world // args.cp} x CP {args.cp}, pools of {args.pool_size}); {args.steps} steps of "
              f"{args.gbs} sequences")
        print(f"hf_llama: loss {la[0]:.4f} -> {la[-1]:.4f} (libra), {lp[0]:.4f} -> {lp[-1]:.4f} (sdpa)")
        print(f"largest relative loss difference: {rel[worst]:.3e} (step {worst + 1})")
        print(f"step-1 relative gradient error: {grad_err:.3e} (max |g_libra - g_sdpa| / max |g_sdpa| "
              f"over all {ga.numel()} parameter values)")
        print(f"per-step time, median (rank 0): libra {med(ta) * 1e3:.1f} ms, sdpa {med(tp) * 1e3:.1f} ms")
        print(f"wrote {os.path.join(args.out, 'loss.csv')} and loss.png")
    bad = []
    if args.check_loss is not None and not rel[worst] <= args.check_loss:
        bad.append(f"the loss difference {rel[worst]:.3e} exceeds --check-loss {args.check_loss}")
    if args.check_grad is not None and not grad_err <= args.check_grad:
        bad.append(f"the gradient error {grad_err:.3e} exceeds --check-grad {args.check_grad}")
    return bad


if __name__ == "__main__":
    main()
