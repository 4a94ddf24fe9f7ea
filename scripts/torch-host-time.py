#!/usr/bin/env python3
"""Host time of one libra.torch.attention call (forward, backward): everything but the kernel and the wire.

One process runs the whole pool (W = P * CP workers) on libra.torch's in-process communicator, on
torch's meta device: every op runs its dispatch and shape logic without touching data, so the
program's index_select / index_copy_ / index_add_, the in-process all-to-alls, the call agreement
and the varlen path's per-call gathers and scatters cost only their host time, and a no-op varlen
backend (its output depends on q, k and v, so backward runs the same autograd path) stands in for
the kernel. This is the CUDA tensors' path (a varlen backend) with the device work taken out.

Per worker: thread CPU time of each forward and backward call (median over --reps after one
warm-up); printed: the median and the largest over the workers, and the number of torch ops one
call dispatches (a GPU adds its launch latency per op on top). A measurement, not a test.

    .venv/bin/python scripts/torch-host-time.py --source builtin:paper-256k --seq-len 262144 --cp 8 --chunks 4
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "build", "release", "python")
if os.path.isdir(BUILT):
    sys.path[0:0] = [BUILT, os.path.join(HERE, "..", "python")]

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import backends  # noqa: E402
from libra.torch.comms import inprocess  # noqa: E402


class NoKernel(backends.Backend):
    """The kernel taken out: o is q plus zero times k and v (so autograd reaches all three), no LSE work."""

    name, kind = "no-kernel", "varlen"

    def unavailable(self, device, dtype):
        return None

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        return q + (k.sum() + v.sum()) * 0, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def body(rank, world, a, pool):
    group, worker = lt.pool_group(len(pool), a.cp)
    plan = libra.make_plan(pool, seq_len=a.seq_len, cp=a.cp, block_size=a.block, head_shards=a.head_shards,
                           heads_q=a.heads_q, heads_kv=a.heads_kv, head_dim=a.head_dim, chunks=a.chunks,
                           dtype="bf16", mode=a.mode)
    t0 = time.thread_time()
    rt = lt.PlanRuntime(plan, group)
    runtime_s = time.thread_time() - t0
    n = rt.home_rows
    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(n, a.heads_q, a.head_dim, **meta).requires_grad_()
    k = torch.empty(n, a.heads_kv, a.head_dim, **meta).requires_grad_()
    v = torch.empty(n, a.heads_kv, a.head_dim, **meta).requires_grad_()
    do = torch.empty(n, a.heads_q, a.head_dim, **meta)
    fwd, bwd = [], []
    for rep in range(a.reps + 1):
        s = time.thread_time()
        o = lt.attention(q, k, v, rt)
        m = time.thread_time()
        o.backward(do)
        e = time.thread_time()
        if rep:
            fwd.append(m - s)
            bwd.append(e - m)
    with CountOps() as c:
        o = lt.attention(q, k, v, rt)
        f_ops = c.n
        o.backward(do)
    return statistics.median(fwd), statistics.median(bwd), f_ops, c.n - f_ops, runtime_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="builtin:paper-256k", help="corpus of packed sequences (one per slot)")
    ap.add_argument("--seq-len", type=int, default=262144)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--cp", type=int, default=8)
    ap.add_argument("--block", type=int, default=16384)
    ap.add_argument("--head-shards", type=int, default=8)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--mode", default="tap")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    pool = libra.load_packed_sequences(a.source, a.seq_len)[:a.pool_size]
    W = len(pool) * a.cp
    backends.registry()["no-kernel"] = NoKernel()
    backends.force("no-kernel")
    torch.set_num_threads(1)
    start = time.perf_counter()
    res = inprocess.run(body, W, a, pool)
    wall = time.perf_counter() - start
    print(f"{a.source}: W {W} (P {len(pool)} x CP {a.cp}), L {a.seq_len}, B {a.block}, H {a.head_shards}, "
          f"h_q {a.heads_q}, h_kv {a.heads_kv}, d {a.head_dim}, M {a.chunks}, {a.mode}, bf16, meta tensors")
    for i, name in ((0, "forward"), (1, "backward")):
        per = sorted(r[i] for r in res)
        print(f"host time per {name} call: median worker {statistics.median(per) * 1e3:.1f} ms, "
              f"largest {per[-1] * 1e3:.1f} ms (thread CPU, median of {a.reps}); "
              f"torch ops dispatched: median {statistics.median(r[2 + i] for r in res):.0f}, "
              f"largest {max(r[2 + i] for r in res)}")
    per = sorted(r[4] for r in res)
    print(f"PlanRuntime construction (program, layout; once per micro-batch): median {statistics.median(per) * 1e3:.1f} "
          f"ms, largest {per[-1] * 1e3:.1f} ms; whole run {wall:.1f} s")


if __name__ == "__main__":
    main()
