#!/usr/bin/env python3
"""A complete minimal training loop with libra: VRSP sampler, background planner, one PlanRuntime per
micro-batch, libra.torch.attention as the context-parallel core attention, the loss normalised by
the optimizer step's token count over every replica, and the gradients all-reduced over all ranks.

    .venv/bin/torchrun --nproc-per-node 4 examples/minimal_loop.py

runs DP x CP = 4 gloo processes on CPU (P = 2, CP = 2). Synthetic data: packed sequences of
random sample lengths with random tokens (both fixed by the sequence's index). ``--cp 1
--pool-size 1 --attention plain`` runs the same steps with torch's own attention on each rank's
whole sequence (DP = 4): every optimizer step trains on the same global batch either way, so the
printed losses agree (tests/python/test_minimal_loop.py checks it).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "build", "release", "python")
if os.path.isdir(BUILT):  # a source tree with a release build; otherwise the installed package
    sys.path[1:1] = [BUILT, os.path.join(HERE, "..", "python")]

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402

L, VOCAB, DM, HQ, HKV, D = 128, 64, 64, 4, 2, 16


def packed_sequences(count, seed=0):
    """`count` packed sequences of L tokens (lists of sample lengths), libra's sequential packer."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, L, (4 * count,), generator=g).tolist()
    return libra.pack(lengths, L)["sequences"][:count]


def sequence_data(i, samples):
    """Tokens [L] and next-token targets [L] of packed sequence i (-100: sample ends and padding)."""
    tokens = torch.randint(0, VOCAB, (L,), generator=torch.Generator().manual_seed(i))
    targets = torch.full((L,), -100)
    start = 0
    for n in samples:
        targets[start:start + n - 1] = tokens[start + 1:start + n]
        start += n
    return tokens, targets


class Packed(torch.utils.data.Dataset):
    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return (*sequence_data(i, self.seqs[i]), i)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same initial weights on every rank
        self.emb = torch.nn.Embedding(VOCAB, DM)
        self.qkv = torch.nn.Linear(DM, (HQ + 2 * HKV) * D, bias=False)
        self.proj = torch.nn.Linear(HQ * D, DM, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DM, 4 * DM), torch.nn.GELU(), torch.nn.Linear(4 * DM, DM))
        self.head = torch.nn.Linear(DM, VOCAB, bias=False)

    def forward(self, tokens, attend):
        x = self.emb(tokens)                                     # [rows, DM]: token-local from here ...
        q, k, v = self.qkv(x).split([HQ * D, HKV * D, HKV * D], dim=-1)
        o = attend(q.unflatten(-1, (HQ, D)), k.unflatten(-1, (HKV, D)), v.unflatten(-1, (HKV, D)))
        x = x + self.proj(o.flatten(1))                          # ... except attention
        x = x + self.mlp(x)
        return self.head(x)


def plain_attention(samples):
    """torch's attention of one whole packed sequence, causal within each sample (the reference)."""
    def attend(q, k, v):
        out, start = torch.zeros_like(q), 0
        for n in samples:
            s = slice(start, start + n)
            qs, ks, vs = (t[s].transpose(0, 1) for t in (q, k, v))            # [heads, n, D]
            out[s] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True).transpose(0, 1)
            start += n
        return out
    return attend


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    ap.add_argument("--cp", type=int, default=2, help="context-parallel size (default 2)")
    ap.add_argument("--pool-size", type=int, default=2, help="DP replicas per pool, P (default 2)")
    ap.add_argument("--gbs", type=int, default=8, help="packed sequences per optimizer step (default 8)")
    ap.add_argument("--attention", choices=("libra", "plain"), default="libra",
                    help="libra.torch.attention, or torch's on whole sequences (needs --cp 1)")
    args = ap.parse_args()
    dist.init_process_group("gloo")                    # torchrun's environment: RANK, WORLD_SIZE, MASTER_*
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    CP, P = args.cp, args.pool_size
    if world % CP or (world // CP) % P:
        raise SystemExit(f"minimal_loop: --cp {CP} and --pool-size {P} must divide the {world} ranks")
    if args.attention == "plain" and CP != 1:
        raise SystemExit("minimal_loop: --attention plain needs --cp 1")
    DP, dp_rank, cp_rank = world // CP, rank // CP, rank % CP

    seqs = packed_sequences(args.steps * args.gbs)
    group, worker = lt.pool_group(pool_size=P, cp=CP)  # collective: every rank, once
    sampler = lt.PlacementBatchSampler(seqs, gbs=args.gbs, dp=DP, pool_size=P, dp_rank=dp_rank)
    planner = lt.Planner(sampler, seq_len=L, cp=CP, block_size=16, head_shards=2, heads_q=HQ, heads_kv=HKV,
                         head_dim=D, chunks=2, dtype="fp32")
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    home = slice(cp_rank * (L // CP), (cp_rank + 1) * (L // CP))  # this rank's rows of its sequence

    loss_sum, tokens_seen = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    loader = torch.utils.data.DataLoader(Packed(seqs), batch_sampler=sampler)   # yields this replica's [1, L]
    for n, (tokens, targets, index) in enumerate(loader):  # batch n: GA index n % ga_steps of step n // ga_steps
        samples = seqs[int(index)]
        tokens, targets = tokens[0, home], targets[0, home]
        if args.attention == "libra":
            runtime = lt.PlanRuntime(planner.get(n), group)    # once per micro-batch, all layers, backward
            attend = lambda q, k, v: lt.attention(q, k, v, runtime)  # noqa: E731
        else:
            attend = plain_attention(samples)
        logits = model(tokens, attend)
        # Summed, not averaged: a rank holds a share of the step's tokens that differs per rank and
        # micro-batch; the step's mean is taken once below, over every token of every replica.
        loss = F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
        loss.backward()
        loss_sum += loss.detach()
        tokens_seen += (targets != -100).sum()
        if (n + 1) % sampler.ga_steps == 0:            # the optimizer step's last micro-batch
            totals = torch.stack([loss_sum, tokens_seen])
            dist.all_reduce(totals)                    # every rank: DP x CP
            for p in model.parameters():
                dist.all_reduce(p.grad)                # the sum over all ranks' tokens ...
                p.grad /= totals[1]                    # ... over the step's token count: the token mean
            opt.step()
            opt.zero_grad()
            if rank == 0:
                print(f"step {n // sampler.ga_steps} loss {float(totals[0] / totals[1]):.9f} "
                      f"tokens {int(totals[1])}", flush=True)
            loss_sum.zero_()
            tokens_seen.zero_()
    planner.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
