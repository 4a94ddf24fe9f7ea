#!/usr/bin/env python3
"""Trains transformers' LlamaForCausalLM with the HF Trainer through libra (libra.hf.Trainer); checks it.

Launch with torchrun (gloo, CPU), DP x CP = 4 processes (P = 2, CP = 2):

    .venv/bin/torchrun --standalone --nproc-per-node 4 examples/hf_trainer.py --out out/hf_trainer

Three Trainer runs of the same small Llama (hidden 64, 2 layers, GQA 4/2, byte
vocabulary, random initial weights from its config) over --epochs epochs of packed
byte sequences (/usr/share/common-licenses, as hf_llama.py), with gradient
accumulation (--gbs sequences per optimizer step over DP 2: GA = gbs / dp):

1. libra: ``attn_implementation="libra"``, libra.hf.Trainer (PlacementBatchSampler
   through PlacementDataLoader, each batch's runtime from its own key), saving a
   checkpoint every --save-steps steps;
2. libra resumed: a fresh Trainer resumed from run 1's checkpoint at --resume-step
   (mid-epoch), trained to the end: its losses and final weights must equal run 1's;
3. sdpa: the same Trainer with ``attn_implementation="sdpa"`` on whole packed
   sequences (transformers' block-diagonal mask from restarting position ids, each
   rank keeping its home rows' loss terms).

and, independent of the Trainer and of DDP, the step-1 gradient of a single-process
sdpa model over the step's whole batch (every packed sequence of every replica),
which run 1's synchronised step-1 gradient must equal. Rank 0 prints the figures.
"""
import argparse
import copy
import os

import _common  # first: libra from this source tree
import libra.hf as lh
import libra.torch as lt
import torch
import torch.distributed as dist
import transformers
from _common import add_training_args, load_samples, pack_bytes, torchrun_main


class PackedBytes(_common.PackedBytes):
    """Packed sequence i: {"input_ids": [seq_len] (padding is token 0), "lengths": its sample lengths}."""

    def __getitem__(self, i):
        ids, lengths = super().__getitem__(i)
        return {"input_ids": ids, "lengths": lengths}


def model_config(args):
    return transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq_len)


def make_model(args, impl):
    torch.manual_seed(args.seed)  # the same initial weights in every run and on every rank
    return transformers.AutoModelForCausalLM.from_config(copy.deepcopy(model_config(args)), attn_implementation=impl)


class Step1Grad(transformers.TrainerCallback):
    """The gradient the optimizer applies at step 1 (after DDP's all-reduce), all parameters flat."""

    def __init__(self, model):
        self.model, self.grad = model, None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.grad = torch.cat([p.grad.reshape(-1).double() for p in self.model.parameters()])


def sdpa_trainer(base):
    """The baseline: the same Trainer on whole packed sequences under sdpa, home rows' loss terms."""

    class SdpaTrainer(base):
        def libra_inputs(self, batch):
            item, cp = batch["item"], self.cp
            lengths, L = item["lengths"], item["input_ids"].shape[0]
            rank = dist.get_rank()
            rows = torch.arange((rank % cp) * (L // cp), (rank % cp + 1) * (L // cp))
            return {"input_ids": item["input_ids"][None], "rows": rows,
                    "position_ids": lh.packed_position_ids(lengths, L)[None],
                    "labels": lh.packed_labels(item["input_ids"], lengths)[rows][None]}

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False)
            part = lh.loss(out.logits[:, inputs["rows"]], inputs["labels"], num_items_in_batch)
            self.libra_losses.append((self.state.global_step, float(part.detach())))
            return part * self.accelerator.num_processes

    return SdpaTrainer


def train(args, packed, impl, out_dir, resume=None):
    """One Trainer run; returns (per-step global losses, final weights flat, step-1 gradient or None)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // args.cp
    group, worker = lt.pool_group(args.pool_size, args.cp)
    sampler = lt.PlacementBatchSampler([s for s, _ in packed], gbs=args.gbs, dp=dp, pool_size=args.pool_size,
                                       dp_rank=rank // args.cp, seed=args.seed)
    planner = lt.Planner(sampler, worker=worker, seq_len=args.seq_len, cp=args.cp, block_size=args.block,
                         head_shards=2, heads_q=4, heads_kv=2, head_dim=16, chunks=2, dtype="fp32")
    model = make_model(args, impl)
    targs = transformers.TrainingArguments(
        output_dir=out_dir, num_train_epochs=args.epochs, gradient_accumulation_steps=sampler.ga_steps,
        per_device_train_batch_size=1, learning_rate=args.lr, lr_scheduler_type="constant", max_grad_norm=0.0,
        weight_decay=0.0, optim="adamw_torch", save_strategy="steps" if resume is None else "no",
        save_steps=args.save_steps, logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True,
        seed=args.seed, ddp_backend="gloo", dataloader_num_workers=0)
    cls = lh.Trainer if impl == "libra" else sdpa_trainer(lh.Trainer)
    grad = Step1Grad(model)
    trainer = cls(model=model, args=targs, train_dataset=PackedBytes(packed, args.seq_len), sampler=sampler,
                  planner=planner, group=group, callbacks=[grad])
    trainer.cp = args.cp
    trainer.train(resume_from_checkpoint=resume)
    planner.close()
    steps = trainer.state.global_step
    per = torch.zeros(steps, dtype=torch.float64)
    for step, part in trainer.libra_losses:
        per[step] += part
    dist.all_reduce(per)  # every rank's part of each step's mean loss
    weights = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    return per.tolist(), weights, grad.grad


def reference_step1_grad(args, packed):
    """Single process, no Trainer, no DDP: sdpa on every packed sequence of optimizer step 1 (epoch 0),
    the mean next-token loss over the step's labelled tokens; its gradient."""
    dp = dist.get_world_size() // args.cp
    model = make_model(args, "sdpa")
    data = PackedBytes(packed, args.seq_len)
    seqs = []
    for r in range(dp):
        s = lt.PlacementBatchSampler([x for x, _ in packed], gbs=args.gbs, dp=dp, pool_size=args.pool_size,
                                     dp_rank=r, seed=args.seed)
        seqs += [s.index(n) for n in range(s.ga_steps)]
    items = [data[i] for i in seqs]
    n_items = sum(sum(n - 1 for n in it["lengths"]) for it in items)
    for it in items:
        L = it["input_ids"].shape[0]
        logits = model(input_ids=it["input_ids"][None], position_ids=lh.packed_position_ids(it["lengths"], L)[None],
                       use_cache=False).logits[0]
        lab = lh.packed_labels(it["input_ids"], it["lengths"])
        (torch.nn.functional.cross_entropy(logits, lab, ignore_index=-100, reduction="sum") / n_items).backward()
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def rel(a, b):
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max() / torch.as_tensor(b).abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=12, help="packed sequences per epoch (the first of the text)")
    add_training_args(ap, "hf_trainer", seq_len=128, block=16)  # --out: the runs' Trainer output folders
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument("--save-steps", type=int, default=2)
    ap.add_argument("--resume-step", type=int, default=4, help="resume from run 1's checkpoint of this step")
    ap.add_argument("--check", type=float, help="exit 1 when a libra-vs-sdpa loss or the step-1 gradient "
                                                "differs by more than this (relative)")
    args = ap.parse_args()
    torchrun_main("hf_trainer", 1, lambda: run(args))


def run(args):
    """The three Trainer runs and the reference gradient, the figures (rank 0) and the failed checks."""
    bad = []
    rank = dist.get_rank()
    packed = pack_bytes(load_samples(args.text), args.seq_len)[:args.sequences]
    la, wa, ga = train(args, packed, "libra", os.path.join(args.out, "libra"))
    ckpt = os.path.join(args.out, "libra", f"checkpoint-{args.resume_step}")
    lr_, wr, _ = train(args, packed, "libra", os.path.join(args.out, "resumed"), resume=ckpt)
    lp, wp, _ = train(args, packed, "sdpa", os.path.join(args.out, "sdpa"))
    gref = reference_step1_grad(args, packed)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(la, lp))
    resumed_diff = max(abs(a - b) for a, b in zip(la[args.resume_step:], lr_[args.resume_step:]))
    figures = {"steps": len(la), "loss, libra vs sdpa": loss_diff, "resumed vs uninterrupted loss": resumed_diff,
               "resumed vs uninterrupted weights": rel(wr, wa), "step-1 gradient vs single-process sdpa": rel(ga, gref)}
    if rank == 0:
        print(f"hf_trainer: {len(packed)} packed sequences of {args.seq_len} bytes, {args.epochs} epochs, GA "
              f"{args.gbs // (dist.get_world_size() // args.cp)}: {len(la)} optimizer steps; resumed at step "
              f"{args.resume_step}")
        print("losses libra: " + " ".join(f"{x:.6f}" for x in la))
        print("losses sdpa:  " + " ".join(f"{x:.6f}" for x in lp))
        for k, v in figures.items():
            print(f"{k}: {v:.3e}" if isinstance(v, float) else f"{k}: {v}")
    want = args.epochs * (args.sequences // args.gbs)
    if len(la) != want or len(lr_) != want:
        bad.append(f"{len(la)} and {len(lr_)} optimizer steps, expected {want} ({args.epochs} epochs)")
    if args.check is not None:
        for k in ("loss, libra vs sdpa", "step-1 gradient vs single-process sdpa"):
            if not figures[k] <= args.check:
                bad.append(f"{k} {figures[k]:.3e} exceeds --check {args.check}")
        for k in ("resumed vs uninterrupted loss", "resumed vs uninterrupted weights"):
            if not figures[k] <= 1e-12:
                bad.append(f"{k} {figures[k]:.3e}: resuming must reproduce the uninterrupted run")
    return bad


if __name__ == "__main__":
    main()
