#!/usr/bin/env python3
"""Host time of one libra.torch.attention call (forward, backward): everything but the kernel and the wire.

One process runs the whole pool (W = P * CP workers) on libra.torch's in-process communicator, on
torch's meta device: every op runs its dispatch and shape logic without touching data, so the
program's index ops, the merged varlen calls' gathers and write-backs cost only their host time; a
no-op varlen backend (one op per output it allocates, as flash-attn's forward and its backward
from the saved o and LSE) stands in for the kernel, and an all-to-all moves nothing (the wire taken out:
counted as one op, what NCCL's is on the host). This is the CUDA tensors' path with the device
work taken out; on meta tensors any host read of a device value raises, so it also shows that a
pass never synchronises.

Per worker, printed as the median and the largest over the workers:
- the thread CPU time of each forward and backward pass (median over --reps after one warm-up; one
  worker at a time, every worker's turn in a repetition before the next), with the per-call agreement off (check_calls=False), and the torch ops one call dispatches, with
  the agreement (check_calls=True: CPU tensors, a collective per call) counted apart;
- what each micro-batch builds before its first call (median over --build-reps micro-batches
  after one more, one worker at a time where nothing is collective): the rank program with its
  home layout and the index arrays in C++ (GIL released: Planner's thread), then PlanRuntime's
  construction (the agreement, a collective) and ``PlanRuntime.on`` (the arrays' layout to Python,
  the one copy, the expansion launch, the records the backend reads), which hold the GIL; the
  sum of those two is the GIL-held figure;
- the index arrays' device memory.
A measurement, not a test.

    .venv/bin/python bench/torch-host-time.py                        # builtin:paper-256k, P 4, CP 8, M 4
    .venv/bin/python bench/torch-host-time.py --preset paper-1m      # builtin:paper-1m, P 8, CP 8, M 4
    .venv/bin/python bench/torch-host-time.py --preset paper-1m --build-only   # the build alone (no calls)
"""
import argparse
import os
import statistics
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "build", "release", "python")
if os.path.isdir(BUILT):
    sys.path[0:0] = [BUILT, os.path.join(HERE, "..", "python")]

import libra  # noqa: E402
from libra import _libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import backends, index, runtime  # noqa: E402
from libra.torch.comms import inprocess  # noqa: E402
from libra.torch.opcount import CountOps, NoWire, call_ops, meta_inputs  # noqa: E402


class NoKernel(backends.Backend):
    """The kernel taken out: as flash-attn's varlen forward and backward on the host, one op per
    output they allocate (o, LSE; dq, dk, dv) and nothing computed; backward from the saved o and
    LSE."""

    name, kind = "no-kernel", "varlen"

    def unavailable(self, device, dtype):
        return None

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)

    def has_backward(self):
        return True

    def varlen_backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, window):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_ONE_AT_A_TIME = threading.Lock()
_ROUND = None  # a threading.Barrier over the pool's workers (main): one per timed repetition
BACKEND = NoKernel()


def build(rank, a, pool):
    """One worker's per-micro-batch build, timed in parts (thread CPU): what Planner's thread does in
    C++ with the GIL released (rank_program, with the home layout; the index arrays), then what the
    training thread does with the GIL held: PlanRuntime's construction (the agreement, the program's
    summary and home layout) and the index arrays on the device (``PlanRuntime.on``: their layout
    to Python, the one copy, the expansion, the records the backend reads). Returns (runtime, figures)."""
    group, worker = lt.pool_group(len(pool), a.cp)
    plan = libra.make_plan(pool, seq_len=a.seq_len, cp=a.cp, block_size=a.block, head_shards=a.head_shards,
                           heads_q=a.heads_q, heads_kv=a.heads_kv, head_dim=a.head_dim, chunks=a.chunks,
                           dtype="bf16", mode=a.mode)
    meta = torch.device("meta")
    runs = []
    for rep in range(a.build_reps + 1):  # a micro-batch each, the first a warm-up (the pool's first collectives)
        rt, figures = _micro_batch(plan, group, worker, meta)
        if rep:
            runs.append(figures)
    return rt, {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _micro_batch(plan, group, worker, meta):
    # One worker at a time where nothing is collective (its thread time is then its own, not the
    # other threads' contention on two cores).
    with _ONE_AT_A_TIME:
        t0 = time.thread_time()
        prog = _libra.rank_program(plan, worker)
        t1 = time.thread_time()
    rt = lt.PlanRuntime(plan, group, schedule=prog, check_calls=False, timeout=3600)
    t2 = time.thread_time()
    with _ONE_AT_A_TIME:
        t3 = time.thread_time()
        index_s = prog.build_index()
        t4 = time.thread_time()
        rt.on(meta, BACKEND)  # what the first call would do
        t5 = time.thread_time()
        # The same steps again, timed apart: the layout to Python, the expansion alone, all of it; and
        # counted (the counting's own dispatch mode slows what it counts: not timed).
        host, layout = index.host_arrays(prog)
        t6 = time.thread_time()
        nd, nr = layout["data"], layout["runs"]
        index.expand(host[nd:].view(5, nr), host.numpy()[nd:].reshape(5, nr), layout["rows"], meta)
        t7 = time.thread_time()
        kinds = runtime._kinds(BACKEND)
        index.to_device(host, layout, meta, kinds)
        t8 = time.thread_time()
        with CountOps() as ops:
            index.to_device(*index.host_arrays(prog), meta, kinds)
    return rt, dict(program=t1 - t0, index=t4 - t3, index_cpp=index_s, runtime=t2 - t1, on=t5 - t4,
                    layout=t6 - t5, expand=t7 - t6, records=(t8 - t7) - (t7 - t6), on_ops=ops.n,
                    on_kernels=ops.kernels, index_bytes=rt.index_bytes(meta))


def body(rank, world, a, pool):
    rt, res = build(rank, a, pool)
    if a.build_only:
        return res
    rt.comm = NoWire(rt.comm)
    q, k, v, do = meta_inputs(rt)
    fwd, bwd = [], []
    for rep in range(a.reps + 1):
        # One worker at a time, as for the build: with the wire taken out nothing in a call is
        # collective, and a worker's thread time is then its own, as in a process per GPU, not 2 cores'
        # worth of W threads handing one GIL around (each hand-off costs the waiting thread CPU). Every
        # worker takes its turn in a repetition before the next begins (and none is still building, with
        # collectives outside the lock), so a burst of load on the machine lands on a few workers' one
        # repetition each, which their medians leave out, not on one worker's every repetition.
        _ROUND.wait()
        with _ONE_AT_A_TIME:
            s = time.thread_time()
            o = lt.attention(q, k, v, rt)
            m = time.thread_time()
            o.backward(do)
            e = time.thread_time()
        if rep:
            fwd.append(m - s)
            bwd.append(e - m)
    f_ops, b_ops = call_ops(rt, q, k, v, do)
    rt.check_calls = True
    fa_ops, _ = call_ops(rt, q, k, v, do)
    return dict(res, fwd=statistics.median(fwd), bwd=statistics.median(bwd), fwd_ops=f_ops, bwd_ops=b_ops,
                agree_ops=fa_ops - f_ops)


def _stat(res, key, scale=1e3, fmt=".1f"):
    per = sorted(r[key] for r in res)
    return f"median {statistics.median(per) * scale:{fmt}}, largest {per[-1] * scale:{fmt}}"


def _warm_meta(plan):
    """Untimed: the first index op on the meta device loads torch's meta kernels (about a second, once
    per process; a GPU's first op has its own start-up, before any micro-batch)."""
    warm = _libra.rank_program(plan, 0)
    with CountOps():
        index.to_device(*index.host_arrays(warm), torch.device("meta"))


def report(res, a, W, wall):
    if not a.build_only:
        for key, name in (("fwd", "forward"), ("bwd", "backward")):
            print(f"{name} pass: host ms {_stat(res, key)} (thread CPU, median of {a.reps}); "
                  f"torch ops {_stat(res, key + '_ops', 1, '.0f')}")
        print(f"the per-call agreement (check_calls=True) adds ops: {_stat(res, 'agree_ops', 1, '.0f')}")
    print(f"per micro-batch (each worker's median of {a.build_reps}), C++ with the GIL released (Planner's thread): "
          f"rank_program and home layout ms "
          f"{_stat(res, 'program')}; index arrays ms {_stat(res, 'index')} (of which the C++ build "
          f"{_stat(res, 'index_cpp')})")
    print(f"per micro-batch, GIL held: PlanRuntime ms {_stat(res, 'runtime')}; PlanRuntime.on ms {_stat(res, 'on')} "
          f"(timed apart: layout to Python {_stat(res, 'layout', fmt='.2f')}, expansion "
          f"{_stat(res, 'expand', fmt='.2f')}, records {_stat(res, 'records', fmt='.2f')}); torch ops of on "
          f"{_stat(res, 'on_ops', 1, '.0f')}, of them not views {_stat(res, 'on_kernels', 1, '.0f')}")
    for r in res:
        r["total"] = r["program"] + r["index"] + r["runtime"] + r["on"]
        r["gil"] = r["runtime"] + r["on"]
    print(f"per micro-batch in all: ms {_stat(res, 'total')}; GIL held ms {_stat(res, 'gil', fmt='.2f')}")
    print(f"index arrays per worker: MiB {_stat(res, 'index_bytes', 1 / 2 ** 20, '.2f')}; whole run {wall:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


PRESETS = {"paper-256k": dict(source="builtin:paper-256k", seq_len=262144, pool_size=4, cp=8, block=16384,
                              head_shards=8, chunks=4),
           "paper-1m": dict(source="builtin:paper-1m", seq_len=1048576, pool_size=8, cp=8, block=8192, head_shards=8,
                            chunks=4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), help="the issue's configurations (sets the options below)")
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
    ap.add_argument("--reps", type=int, default=5, help="timed attention calls per worker (after one more)")
    ap.add_argument("--build-reps", type=int, default=5,
                    help="timed micro-batch builds per worker (after one more); each figure their median")
    ap.add_argument("--build-only", action="store_true",
                    help="only each worker's per-micro-batch build (no attention calls)")
    a = ap.parse_args()
    if a.preset:
        for key, value in PRESETS[a.preset].items():
            setattr(a, key, value)
    pool = libra.load_packed_sequences(a.source, a.seq_len)[:a.pool_size]
    W = len(pool) * a.cp
    backends.registry()[BACKEND.name] = BACKEND
    backends.force(BACKEND.name)
    torch.set_num_threads(1)
    _warm_meta(libra.make_plan(pool, seq_len=a.seq_len, cp=a.cp, block_size=a.block, head_shards=a.head_shards,
                               heads_q=a.heads_q, heads_kv=a.heads_kv, head_dim=a.head_dim, chunks=a.chunks,
                               dtype="bf16", mode=a.mode))
    global _ROUND
    _ROUND = threading.Barrier(W)
    start = time.perf_counter()
    res = inprocess.run(body, W, a, pool)
    wall = time.perf_counter() - start
    print(f"{a.source}: W {W} (P {len(pool)} x CP {a.cp}), L {a.seq_len}, B {a.block}, H {a.head_shards}, "
          f"h_q {a.heads_q}, h_kv {a.heads_kv}, d {a.head_dim}, M {a.chunks}, {a.mode}, bf16, meta tensors"
          + (", the build alone" if a.build_only else ""))
    report(res, a, W, wall)


if __name__ == "__main__":
    main()
