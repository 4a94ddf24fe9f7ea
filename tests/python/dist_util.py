"""Helpers for the libra.torch tests: a test body run over each communicator (gloo process groups via
torch.multiprocessing.spawn, or libra.torch's in-process pool on threads), a plain-attention
reference in float64 (block-diagonal causal per sample), and what several test files compare with
it (rel_err, attend, reference_grads, planner_runs_make_plan)."""
import json
import os
import tempfile
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import libra
import libra.torch as lt
from libra.torch import comms
from libra.torch.comms import inprocess

BACKEND = "gloo"  # the CUDA test switches to nccl

# The communicators every distributed test body runs over (pytest parameters): torch.distributed on
# processes, and the in-process pool.
COMMUNICATORS = ("gloo", "inprocess")


def _entry(rank, world, init_file, out_dir, fn, args, backend):
    torch.set_num_threads(1)
    # As conftest.py in the parent: libra's own code raises no DeprecationWarning.
    warnings.filterwarnings("error", category=DeprecationWarning, module=r"libra(\.|$)")
    dist.init_process_group(backend, init_method="file://" + init_file, rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
    except BaseException:
        with open(os.path.join(out_dir, f"error.{rank}"), "w") as f:
            f.write(traceback.format_exc())
        # No barrier: the other ranks may be waiting in a collective this rank never joins. The
        # exception ends this process and spawn's join then terminates the others and raises.
        raise
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"result.{rank}.json"), "w") as f:
        json.dump(result, f)


def spawn(fn, world, *args):
    """Runs fn(rank, world, *args) on `world` gloo processes; returns the JSON results by rank."""
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        mp.spawn(_entry, args=(world, init_file, d, fn, args, BACKEND), nprocs=world, join=True)
        out = []
        for r in range(world):
            with open(os.path.join(d, f"result.{r}.json")) as f:
                out.append(json.load(f))
        return out


def run(comm, fn, world, *args):
    """fn(rank, world, *args) on every rank of a pool of `world` workers over communicator `comm`
    ("gloo": processes, "inprocess": threads of this process); the JSON results by rank either way."""
    if comm == "gloo":
        return spawn(fn, world, *args)
    if comm != "inprocess":
        raise ValueError(f"run: communicator {comm!r}: must be one of {COMMUNICATORS}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one kernel thread per worker, as in each spawned process
    try:
        return [json.loads(json.dumps(r)) for r in inprocess.run(fn, world, *args)]
    finally:
        torch.set_num_threads(threads)


def barrier():
    """Waits for every rank of the body's world, on either communicator."""
    comms.current().barrier()


def all_reduce(t, group=None):
    """Sums `t` in place over `group` (the body's world when None), on either communicator."""
    (comms.current() if group is None else comms.of(group)).all_reduce(t, group)


def all_gather(outs, t, group=None):
    """Every rank's `t` into `outs` (over the body's world when `group` is None), on either communicator."""
    (comms.current() if group is None else comms.of(group)).all_gather(outs, t, group).wait()


def reference_attention(q, k, v, samples, window=None, scale=None):
    """Plain attention of one packed sequence: q [L, h_q, d], k/v [L, h_kv, d] (float64);
    causal within each sample (bottom-right), optional sliding window; padding rows 0."""
    L, hq, d = q.shape
    hkv = k.shape[1]
    ratio = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    o = torch.zeros_like(q)
    start = 0
    kk = k.repeat_interleave(ratio, dim=1)
    vv = v.repeat_interleave(ratio, dim=1)
    for n in samples:
        s = slice(start, start + n)
        qs, ks, vs = q[s].transpose(0, 1), kk[s].transpose(0, 1), vv[s].transpose(0, 1)  # [h, n, d]
        scores = qs @ ks.transpose(1, 2) * scale
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        mask = j <= i
        if window is not None:
            mask &= j > i - window
        scores = scores.masked_fill(~mask, float("-inf"))
        o[s] = (torch.softmax(scores, dim=-1) @ vs).transpose(0, 1)
        start += n
    return o


# ---------------------------------------------------------------- helpers the libra.torch test files share

def rel_err(got, want):
    """The largest |got - want| over the largest |want|, in float64 (either may carry autograd)."""
    want = want.detach().to(torch.float64)
    return float((got.detach().to(torch.float64) - want).abs().max() / want.abs().max().clamp_min(1e-30))


def attend(rt, q, k, v, grad):
    """lt.attention of this worker's rows on runtime `rt`, forward and backward against `grad` (dL/do,
    float64): [o, dq, dk, dv], on fresh leaves (q, k, v are not changed)."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = lt.attention(q, k, v, rt)
    (o.to(torch.float64) * grad).sum().backward()
    return [o.detach(), q.grad, k.grad, v.grad]


def reference_grads(Q, K, V, G, samples, rows):
    """The float64 reference (reference_attention) of one packed sequence forward and backward against
    `G` (dL/do): [o, dQ, dK, dV] at `rows`."""
    Qr, Kr, Vr = (x.clone().requires_grad_() for x in (Q, K, V))
    ref = reference_attention(Qr, Kr, Vr, samples)
    (ref * G).sum().backward()
    return [ref.detach()[rows], Qr.grad[rows], Kr.grad[rows], Vr.grad[rows]]


def planner_runs_make_plan(rank, pools, kw, check=lambda rt: True):
    """On 4 workers (P 2, CP 2): Planner(worker=..., **kw).runtime(n, group) (plan and schedule from its
    background thread) runs exactly what a PlanRuntime of make_plan(sampler.pool(n), **kw) runs, for
    every batch n of a sampler over `pools` (gbs 4, dp 2), and passes check(runtime)."""
    group, worker = lt.pool_group(2, 2)
    L, hq, hkv, d = kw["seq_len"], kw["heads_q"], kw["heads_kv"], kw["head_dim"]
    sampler = lt.PlacementBatchSampler(pools, gbs=4, dp=2, pool_size=2, dp_rank=rank // 2)
    planner = lt.Planner(sampler, worker=worker, **kw)
    same = True
    try:
        for n in range(len(sampler)):
            a = planner.runtime(n, group)
            b = lt.PlanRuntime(libra.make_plan(sampler.pool(n), **kw), group)
            x = torch.randn(L // 2, hq, d, generator=torch.Generator().manual_seed(n))
            y = torch.randn(L // 2, hkv, d, generator=torch.Generator().manual_seed(n + 1))
            same &= (check(a) and a.fingerprint == b.fingerprint
                     and torch.equal(lt.attention(x, y, y, a), lt.attention(x, y, y, b)))
    finally:
        planner.close()
    return bool(same)
