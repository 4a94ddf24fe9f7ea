#!/usr/bin/env python3
"""Wall time of libra.torch.attention vs the C++ executor (`libra exec --ranks`) on one pool.

Both run the same plan configuration on the same pool file, forward and
backward, one kernel thread per rank, random Q/K/V/dO. The Python side runs
W = P * CP workers: by default libra.torch's in-process pool (W threads of
one process, like `libra exec --ranks W`), with --comm gloo W gloo processes
(torch.multiprocessing.spawn); it reports the slowest rank's median over
--reps timed runs after one warm-up. The C++ side runs `libra exec --ranks W`
(threads of one process, its own communicator) --reps times and reports the
median of its slowest-rank walls.

    /usr/bin/python3 examples/exec_compare.py POOL.jsonl --seq-len 8192 --cp 2 --block 512 \\
        --head-shards 2 --heads-q 8 --heads-kv 2 --head-dim 64 --chunks 2
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "build", "release", "python")
if os.path.isdir(BUILT):
    sys.path[1:1] = [BUILT, os.path.join(HERE, "..", "python")]

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import comms  # noqa: E402
from libra.torch.comms import inprocess  # noqa: E402
from libra.torch.timing import fwd_bwd_medians  # noqa: E402


def body(rank, world, init_file, a, pool, out_file):
    """One worker; in a gloo process (init_file set) or a thread of the in-process pool."""
    if init_file:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    comm = comms.current()
    P = len(pool)
    group, worker = lt.pool_group(P, a.cp)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    t0 = time.perf_counter()
    plan = libra.make_plan(pool, seq_len=a.seq_len, cp=a.cp, block_size=a.block, head_shards=a.head_shards,
                           heads_q=a.heads_q, heads_kv=a.heads_kv, head_dim=a.head_dim, chunks=a.chunks,
                           dtype=a.dtype, mode=a.mode)
    t1 = time.perf_counter()
    rt = lt.PlanRuntime(plan, group, threads=a.threads, trace=bool(a.trace))
    t2 = time.perf_counter()
    n = a.seq_len // a.cp
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(n, a.heads_q, a.head_dim, generator=g).to(dtype).requires_grad_()
    k = torch.randn(n, a.heads_kv, a.head_dim, generator=g).to(dtype).requires_grad_()
    v = torch.randn(n, a.heads_kv, a.head_dim, generator=g).to(dtype).requires_grad_()
    do = torch.randn(n, a.heads_q, a.head_dim, generator=g).to(dtype)
    # The trace keeps the timed runs only.
    warmed = rt.trace.clear if rt.trace is not None else None
    f, b = fwd_bwd_medians(lambda: lt.attention(q, k, v, rt), lambda o: o.backward(do), a.reps,
                           prepare=comm.barrier, warmed=warmed)
    res = torch.tensor([f, b, t1 - t0, t2 - t1], dtype=torch.float64)
    if not init_file:
        return res, rt.trace
    allres = [torch.zeros_like(res) for _ in range(world)]
    dist.all_gather(allres, res)
    if a.trace:
        traces = [None] * world
        dist.all_gather_object(traces, rt.trace)
        if rank == 0:
            lt.write_trace(a.trace, [e for t in traces for e in t])
    if rank == 0:
        torch.save(torch.stack(allres), out_file)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pool", help="JSON Lines pool file, one packed sequence per slot")
    for flag in ("seq-len", "cp", "block", "head-shards", "heads-q", "heads-kv", "head-dim"):
        ap.add_argument("--" + flag, type=int, required=True)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--mode", default="tap", choices=["tap", "tap-split"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--comm", default="inprocess", choices=["inprocess", "gloo"],
                    help="the Python workers: threads of this process (default; like libra exec --ranks) or "
                         "gloo processes")
    ap.add_argument("--trace", help="write the trace of the Python runs (the C++ executor's format: compute, transfer and wait "
                    "lanes, docs/executor.md)")
    ap.add_argument("--libra", default=os.path.join(HERE, "..", "build", "release", "tools", "libra"))
    a = ap.parse_args()
    pool = libra.load_packed_sequences(a.pool, a.seq_len)
    W = len(pool) * a.cp
    if a.comm == "inprocess":
        torch.set_num_threads(1)  # one kernel thread per worker, as in each gloo process
        results = inprocess.run(body, W, None, a, pool, None)
        res = torch.stack([r for r, _ in results])
        if a.trace:
            lt.write_trace(a.trace, [e for _, t in results for e in t])
    else:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "res.pt")
            mp.spawn(body, args=(W, os.path.join(d, "init"), a, pool, out), nprocs=W)
            res = torch.load(out)
    py_f, py_b = float(res[:, 0].max()), float(res[:, 1].max())
    cmd = [a.libra, "exec", a.pool, "--seq-len", str(a.seq_len), "--cp", str(a.cp), "--pool-size", str(len(pool)),
           "--ranks", str(W), "--block", str(a.block), "--head-shards", str(a.head_shards), "--heads-q",
           str(a.heads_q), "--heads-kv", str(a.heads_kv), "--head-dim", str(a.head_dim), "--chunks",
           str(a.chunks), "--dtype", a.dtype, "--threads", str(a.threads), "--mode", a.mode]
    cf, cb = [], []
    for _ in range(a.reps):
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        cf.append(float(re.search(r"forward:\s+wall ([0-9.]+) s", text).group(1)))
        cb.append(float(re.search(r"backward:\s+wall ([0-9.]+) s", text).group(1)))
    c_f, c_b = statistics.median(cf), statistics.median(cb)
    print(f"pool {a.pool}: W {W} (P {len(pool)} x CP {a.cp}), L {a.seq_len}, B {a.block}, H {a.head_shards}, "
          f"h_q {a.heads_q}, h_kv {a.heads_kv}, d {a.head_dim}, M {a.chunks}, {a.dtype}, {a.threads} thread(s)/rank")
    print(f"python (libra.torch, {a.comm}): forward {py_f:.4f} s, backward {py_b:.4f} s (slowest rank, median of {a.reps})")
    print(f"C++ (libra exec --ranks {W}): forward {c_f:.4f} s, backward {c_b:.4f} s (median of {a.reps})")
    print(f"ratio python / C++: forward {py_f / c_f:.2f}, backward {py_b / c_b:.2f}")
    print(f"python make_plan {float(res[:, 2].max()) * 1e3:.1f} ms, PlanRuntime (schedule) "
          f"{float(res[:, 3].max()) * 1e3:.1f} ms (slowest rank)")


if __name__ == "__main__":
    main()
