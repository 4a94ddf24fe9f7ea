#!/usr/bin/env python3
"""Times libra.torch.attention forward + backward on each compute backend that runs here, on the
same plan and calls: libra's CPU kernel against the portable SDPA fallback (and, on a GPU machine,
the CUDA backends). One process, a pool of one worker (P = 1, CP = 1, a gloo group of one), so the
exchanges are messages to self and the figure is the backends' difference.

    .venv/bin/python bench/torch-backends-bench.py --samples 4096,2048,1024,1024 --reps 5

Prints per backend the median forward and backward wall time over --reps after one warm-up, and the
ratio to the first backend measured. A measurement, not a test.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[1:1] = [os.path.join(HERE, "..", "build", "release", "python"), os.path.join(HERE, "..", "python")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import backends  # noqa: E402
from libra.torch.timing import fwd_bwd_medians  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", default="4096,2048,1024,1024", help="sample lengths of the packed sequence")
    ap.add_argument("--heads-q", type=int, default=8)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch and kernel threads")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    samples = [int(x) for x in a.samples.split(",")]
    L = sum(samples)
    torch.set_num_threads(a.threads)
    init = tempfile.NamedTemporaryFile(delete=False).name
    dist.init_process_group("gloo", init_method="file://" + init, rank=0, world_size=1)
    group, _ = lt.pool_group(1, 1)
    plan = libra.make_plan([samples], seq_len=L, cp=1, block_size=min(512, L), head_shards=1, heads_q=a.heads_q,
                           heads_kv=a.heads_kv, head_dim=a.head_dim, chunks=a.chunks,
                           dtype="fp32" if a.dtype == "float32" else "bf16")
    rt = lt.PlanRuntime(plan, group, threads=a.threads)
    dt = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    q0 = torch.randn(L, a.heads_q, a.head_dim, generator=g).to(dt)
    k0 = torch.randn(L, a.heads_kv, a.head_dim, generator=g).to(dt)
    v0 = torch.randn(L, a.heads_kv, a.head_dim, generator=g).to(dt)
    do = torch.randn(L, a.heads_q, a.head_dim, generator=g).to(dt)
    print(f"torch-backends-bench: L {L} ({len(samples)} samples), h_q {a.heads_q}, h_kv {a.heads_kv}, "
          f"d {a.head_dim}, M {a.chunks}, {a.dtype}, {a.threads} thread(s), torch {torch.__version__}")
    leaves = []

    def fresh():  # each repetition's q, k, v: new leaves, so that no gradient accumulates
        leaves[:] = [x.clone().requires_grad_() for x in (q0, k0, v0)]

    first = None
    for name in backends.ORDER:
        if backends.get(name).unavailable(torch.device("cpu"), dt):
            continue
        previous = backends.force(name)
        try:
            f, b = fwd_bwd_medians(lambda: lt.attention(*leaves, rt), lambda o: o.backward(do), a.reps,
                                   prepare=fresh)
        finally:
            backends.force(previous)
        first = first or (name, f, b)
        print(f"  {name:12s} forward {f * 1e3:9.1f} ms  backward {b * 1e3:9.1f} ms  "
              f"(x{f / first[1]:.2f} and x{b / first[2]:.2f} of {first[0]})")
    dist.destroy_process_group()
    os.unlink(init)


if __name__ == "__main__":
    main()
