"""What install_check.sh runs in the scratch environment, from outside the source tree: imports
every module of the installed libra package, then one libra.torch.attention forward and backward
on each communicator (torch.distributed gloo on 2 processes, libra's in-process pool on 2 threads),
against plain attention of each sample in float64."""
import importlib
import os
import pkgutil
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import libra

SAMPLES = [[10, 14, 6], [32]]  # one pool of P = 2 packed sequences, CP 1: one per worker
L = 32


def every_module():
    names = ["libra"]
    for m in pkgutil.walk_packages(libra.__path__, "libra."):
        names.append(m.name)
    for name in names:
        importlib.import_module(name)
    return names


def body(rank, world):
    import libra.torch as lt
    group, _ = lt.pool_group(2, 1)
    plan = libra.make_plan(SAMPLES, seq_len=L, cp=1, block_size=8, head_shards=1, heads_q=2, heads_kv=1,
                           head_dim=8, dtype="fp32")
    rt = lt.PlanRuntime(plan, group)
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(L, h, 8, generator=g, dtype=torch.float64) for h in (2, 1, 1))
    x = [t.float().requires_grad_() for t in (q, k, v)]
    o = lt.attention(*x, rt)
    o.sum().backward()
    # Reference: causal attention within each sample, float64.
    ref, start = torch.zeros(L, 2, 8, dtype=torch.float64), 0
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))
    for n in SAMPLES[rank]:
        s = slice(start, start + n)
        a = torch.einsum("qhd,khd->hqk", qr[s], kr[s]) * 8 ** -0.5
        a = a.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        ref[s] = torch.einsum("hqk,khd->qhd", a, vr[s])
        start += n
    ref.sum().backward()
    err = max(float((o.detach().double() - ref.detach()).abs().max()), float((x[0].grad.double() - qr.grad).abs().max()))
    assert err < 1e-4, f"rank {rank}: attention differs from plain attention by {err}"
    return err


def _gloo(rank, world, init):
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    try:
        body(rank, world)
    finally:
        dist.destroy_process_group()


def main():
    here = os.path.abspath(os.getcwd())
    names = every_module()
    print(f"imported {len(names)} modules of {os.path.dirname(libra.__file__)} from {here}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_gloo, args=(2, os.path.join(d, "init")), nprocs=2, join=True)
    print("libra.torch.attention forward + backward on gloo (2 processes): ok")
    from libra.torch.comms import inprocess
    errs = inprocess.run(body, 2)
    print(f"libra.torch.attention forward + backward in-process (2 threads): ok (max error {max(errs):.1e})")


if __name__ == "__main__":
    main()
