#!/usr/bin/env python3
"""Trains a tiny causal byte-level transformer with libra and with plain attention; compares the losses.

Data: the bytes of the text files Debian ships in /usr/share/common-licenses,
one sample per paragraph, packed to --seq-len by libra (sequential packer,
overlong paragraphs split). DP x CP = 4 gloo processes (P = 2, CP = 2) on
CPU: libra.torch.PlacementBatchSampler orders each optimizer step's packed
sequences (VRSP), libra.torch.Planner plans the next micro-batch on a
background thread, and libra.torch.attention runs core attention over the
pool, forward and backward. The same run is then repeated with plain
attention (each replica computing its whole sequence, the same seeds, the
same sample order and the same per-rank loss terms). Writes
OUT/loss.csv and OUT/loss.png and prints the largest relative difference.

    /usr/bin/python3 examples/train_tiny.py --steps 20 --out out/train_tiny
"""
import argparse
import os
import sys
import tempfile
import time

import _common  # first: libra from this source tree
import libra.torch as lt
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from _common import add_training_args, load_samples, pack_bytes, write_loss_files

P, CP = 2, 2


class Packed(_common.PackedBytes):
    def __getitem__(self, i):
        tokens, lengths = super().__getitem__(i)
        # Targets: the next byte within the same sample; -100 at sample ends and padding.
        target = torch.full((self.seq_len,), -100, dtype=torch.long)
        pos = torch.zeros(self.seq_len, dtype=torch.long)
        start = 0
        for n in lengths:
            target[start:start + n - 1] = tokens[start + 1:start + n]
            pos[start:start + n] = torch.arange(n)
            start += n
        return tokens, target, pos


def plain_attention(q, k, v, lengths):
    """Causal attention within each sample of one whole packed sequence (the baseline)."""
    L, hq, d = q.shape
    rep = hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = torch.zeros(L, L, dtype=torch.bool)
    start = 0
    for n in lengths:
        mask[start:start + n, start:start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    s = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # padding rows attend to nothing
    return torch.einsum("hqk,khd->qhd", p, v)


class Block(torch.nn.Module):
    def __init__(self, dm, hq, hkv):
        super().__init__()
        self.hq, self.hkv, self.d = hq, hkv, dm // hq
        self.ln1, self.ln2 = torch.nn.LayerNorm(dm), torch.nn.LayerNorm(dm)
        self.wq = torch.nn.Linear(dm, hq * self.d, bias=False)
        self.wkv = torch.nn.Linear(dm, 2 * hkv * self.d, bias=False)
        self.wo = torch.nn.Linear(hq * self.d, dm, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dm, 4 * dm), torch.nn.GELU(), torch.nn.Linear(4 * dm, dm))

    def forward(self, x, attn):
        n = x.shape[0]
        h = self.ln1(x)
        q = self.wq(h).view(n, self.hq, self.d)
        k, v = self.wkv(h).view(n, 2, self.hkv, self.d).unbind(1)
        x = x + self.wo(attn(q, k.contiguous(), v.contiguous()).reshape(n, -1))
        return x + self.mlp(self.ln2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, seq_len, dm=128, layers=2, hq=4, hkv=2):
        super().__init__()
        self.emb = torch.nn.Embedding(256, dm)
        self.pos = torch.nn.Embedding(seq_len, dm)
        self.blocks = torch.nn.ModuleList(Block(dm, hq, hkv) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dm)
        self.head = torch.nn.Linear(dm, 256, bias=False)

    def forward(self, tokens, pos, attn):
        x = self.emb(tokens) + self.pos(pos)
        for b in self.blocks:
            x = b(x, attn)
        return self.head(self.ln(x))


def train(rank, world, args, use_libra, data):
    dp_rank, cp_rank = rank // CP, rank % CP
    dp = world // CP
    group, worker = lt.pool_group(P, CP)
    packed = data
    dataset = Packed(packed, args.seq_len)
    sampler = lt.PlacementBatchSampler([s for s, _ in packed], gbs=args.gbs, dp=dp, pool_size=P, dp_rank=dp_rank)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=lambda b: b[0])
    model_kw = dict(dm=args.d_model, layers=args.layers, hq=args.heads_q, hkv=args.heads_kv)
    torch.manual_seed(args.seed)
    model = TinyLM(args.seq_len, **model_kw)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    planner = lt.Planner(sampler, worker=worker, seq_len=args.seq_len, cp=CP, block_size=args.block, head_shards=2,
                         heads_q=args.heads_q, heads_kv=args.heads_kv, head_dim=args.d_model // args.heads_q,
                         chunks=2, dtype="fp32")
    ga = sampler.ga_steps
    Lh = args.seq_len // CP
    home = slice(cp_rank * Lh, (cp_rank + 1) * Lh)
    losses, t0 = [], time.perf_counter()
    for n, (tokens, target, pos) in enumerate(loader):
        if n >= args.steps * ga:
            break
        lengths = sampler.sequence(sampler.index(n))
        if use_libra:
            rt = planner.runtime(n, group)
            logits = model(tokens[home], pos[home], lambda q, k, v: lt.attention(q, k, v, rt))
            tgt = target[home]
        else:
            logits = model(tokens, pos, lambda q, k, v: plain_attention(q, k, v, lengths))[home]
            tgt = target[home]
        # Sum of this rank's token losses over the step's token count: the all-reduced sum of the
        # gradients is then the gradient of the step's mean token loss.
        count = torch.tensor([float((tgt != -100).sum())], dtype=torch.float64)
        # float64 loss so that the two runs' differences are not hidden by float32 rounding of the sum.
        loss_sum = F.cross_entropy(logits.double(), tgt, ignore_index=-100, reduction="sum")
        step_tokens = count.clone()
        dist.all_reduce(step_tokens)  # this micro-batch's tokens over every rank
        (loss_sum / (step_tokens * ga)).backward()
        stat = torch.stack([loss_sum.detach(), count[0]])
        dist.all_reduce(stat)
        if n % ga == 0:
            acc = torch.zeros(2, dtype=torch.float64)
        acc += stat
        if n % ga == ga - 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(acc[0] / acc[1]))
    planner.close()
    return losses, time.perf_counter() - t0


def entry(rank, world, init_file, args, data, out_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    try:
        res = {name: train(rank, world, args, flag, data) for name, flag in (("libra", True), ("plain", False))}
        if rank == 0:
            torch.save(res, out_file)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
    add_training_args(ap, "train_tiny")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads-q", type=int, default=4)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--check", type=float, help="exit 1 when the largest relative loss difference exceeds this")
    args = ap.parse_args()
    packed = pack_bytes(load_samples(args.text), args.seq_len)
    need = args.steps * args.gbs
    if len(packed) < need:
        raise SystemExit(f"train_tiny: --steps {args.steps} needs {need} packed sequences, the text gives {len(packed)}")
    with tempfile.TemporaryDirectory() as d:
        res_file = os.path.join(d, "res.pt")
        mp.spawn(entry, args=(P * CP, os.path.join(d, "init"), args, packed, res_file), nprocs=P * CP)
        res = torch.load(res_file)
    (la, ta), (lp, tp) = res["libra"], res["plain"]
    rel = [abs(a - b) / abs(b) for a, b in zip(la, lp)]
    rows = [[i, f"{a:.9g}", f"{b:.9g}", f"{r:.3e}"] for i, (a, b, r) in enumerate(zip(la, lp, rel))]
    if not write_loss_files(args.out, ["step", "loss_libra", "loss_plain", "relative_difference"], rows,
                            [(la, "-", "libra attention (P=2, CP=2)"), (lp, "--", "plain attention")], first_step=0):
        print("train_tiny: matplotlib missing; wrote the CSV only")
    print(f"train_tiny: {len(packed)} packed sequences of {args.seq_len} bytes; {args.steps} steps; "
          f"loss {la[0]:.4f} -> {la[-1]:.4f} (libra), {lp[0]:.4f} -> {lp[-1]:.4f} (plain)")
    print(f"train_tiny: training wall time {ta:.1f} s (libra), {tp:.1f} s (plain), rank 0")
    print(f"largest relative loss difference: {max(rel):.3e} (step {rel.index(max(rel))})")
    print(f"wrote {os.path.join(args.out, 'loss.csv')} and loss.png")
    if args.check is not None and not max(rel) <= args.check:
        print(f"train_tiny: the loss difference exceeds --check {args.check}")
        sys.exit(1)


if __name__ == "__main__":
    main()
