#!/usr/bin/env bash
# Runs libra's CUDA checks on a machine with a GPU and prints what they measured;
# on a machine without one it says so and exits 0.
#   bash scripts/gpu-check.sh            (after scripts/setup.sh and a release build,
#                                          or on a machine whose python has torch with CUDA)
# LIBRA_PYTHON: the interpreter (default .venv/bin/python, else python3). What runs:
# - the backend each CUDA dtype selects (triton, flash-attn, torch-varlen or sdpa) and why the others don't;
# - libra's Triton kernels first: tests/python/test_triton.py's kernel cases compiled on cuda:0
#   against float64 (TRITON_INTERPRET=0), then bench/triton-gpu-bench.py: per-call TFLOP/s of the
#   triton kernels and of torch SDPA's flash backend on dense causal shapes (T 8K and 32K, d 128,
#   GQA 4, bf16; causal FLOPs counted once), forward and backward;
# - tests/python/test_torch.py's CUDA tests, bf16 attention forward and backward against the float64
#   reference on the CPU: a pool of 2 workers in one process on cuda:0 (libra.torch's in-process
#   communicator; what one GPU runs), and with two or more GPUs also one NCCL process per GPU;
# - every varlen backend pinned in turn on cuda:0, one call each, against the same reference;
# - a whole pool (4 workers, in-process) on cuda:0: its forward + backward wall time, per backend.
# Every figure is one line starting "gpu-check:" or "gpu-bench:" (docs/kernel.md's GPU table).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${LIBRA_PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu-check: no CUDA device visible to $py (torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing)); nothing to check"
  exit 0
fi
export PYTHONPATH="$PWD/python:$PWD/build/release/python${PYTHONPATH:+:$PYTHONPATH}"
"$py" - <<'PY'
import torch
from libra.torch import backends
print(f"gpu-check: torch {torch.__version__}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
dev = torch.device("cuda")
for dt in (torch.bfloat16, torch.float16, torch.float32):
    chosen = backends.select(dev, dt).name
    why = {n: backends.get(n).unavailable(dev, dt) for n in backends.ORDER}
    print(f"gpu-check: {dt} selects {chosen}; " + "; ".join(f"{n}: {w or 'available'}" for n, w in why.items()))
PY
TRITON_INTERPRET=0 "$py" -m pytest -q -p no:cacheprovider tests/python/test_triton.py -k kernels \
  && echo "gpu-check: triton kernels on cuda:0 match float64 (tests/python/test_triton.py -k kernels)" \
  || echo "gpu-check: triton kernels on cuda:0: FAILED against float64 (above)"
TRITON_INTERPRET=0 "$py" bench/triton-gpu-bench.py
"$py" -m pytest -q -p no:cacheprovider tests/python/test_torch.py -k cuda -rs
"$py" - <<'PY'
import time
import torch
from libra.torch import backends
# One varlen call per backend: two packed samples, GQA 8:2, bottom-right causal, against float64.
g = torch.Generator().manual_seed(0)
lens = [300, 700]
cu = torch.tensor([0, 300, 1000], dtype=torch.int32)
q = torch.randn(1000, 8, 64, generator=g, dtype=torch.float64)
k = torch.randn(1000, 2, 64, generator=g, dtype=torch.float64)
v = torch.randn(1000, 2, 64, generator=g, dtype=torch.float64)
ref = backends.get("sdpa").varlen(q, k, v, cu, cu, 700, 700, None, None, ([0, 300, 1000], [0, 300, 1000]))[0]
for name in ("flash-attn", "torch-varlen", "sdpa"):
    b = backends.get(name)
    why = b.unavailable(torch.device("cuda"), torch.bfloat16)
    if why:
        print(f"gpu-check: {name}: skipped ({why})")
        continue
    x = [t.to("cuda", torch.bfloat16) for t in (q, k, v)]
    c = cu.cuda()
    for _ in range(3):
        o, lse = b.varlen(*x, c, c, 700, 700, None, None, ([0, 300, 1000], [0, 300, 1000]))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        o, lse = b.varlen(*x, c, c, 700, 700, None, None, ([0, 300, 1000], [0, 300, 1000]))
    torch.cuda.synchronize()
    err = ((o.double().cpu() - ref).abs().max() / ref.abs().max()).item()
    print(f"gpu-check: {name}: bf16 max rel error {err:.2e} vs float64, lse {'given' if lse is not None else 'none'}, "
          f"{(time.perf_counter() - t0) / 20 * 1e3:.3f} ms a call (mean of 20)")
PY
# A whole pool on one GPU (the in-process communicator): P 2 x CP 2 = 4 workers on threads, bf16
# forward + backward at L 16384; the wall time of the slowest worker, median of 5 after a warm-up.
"$py" - <<'PY'
import statistics
import time
import torch
import libra
import libra.torch as lt
from libra.torch import backends
from libra.torch.comms import inprocess

dev = torch.device("cuda")
L, P, CP = 16384, 2, 2
pool = [[8192, 4096, 4096], [16384]]


def body(rank, world):
    group, worker = lt.pool_group(P, CP)
    plan = libra.make_plan(pool, seq_len=L, cp=CP, block_size=1024, head_shards=2, heads_q=16, heads_kv=4,
                           head_dim=128, chunks=2, dtype="bf16")
    rt = lt.PlanRuntime(plan, group)
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(L // CP, h, 128, generator=g).to(dev, torch.bfloat16).requires_grad_() for h in (16, 4, 4))
    times = []
    for rep in range(6):
        inprocess.COMMUNICATOR.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        lt.attention(q, k, v, rt).float().square().sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if rep:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


for name in backends.ORDER:
    why = backends.get(name).unavailable(dev, torch.bfloat16)
    if why:
        print(f"gpu-check: pool forward + backward on {name}: skipped ({why})")
        continue
    previous = backends.force(name)
    try:
        walls = inprocess.run(body, P * CP)
        print(f"gpu-check: in-process pool of {P * CP} workers on one {dev.type} device ({name}): L {L}, "
              f"h_q 16, h_kv 4, d 128, M 2, bf16 forward + backward {max(walls) * 1e3:.1f} ms "
              f"(slowest worker, median of 5)")
    except Exception as e:  # noqa: BLE001 - one line per backend, failures included
        print(f"gpu-check: pool forward + backward on {name}: failed ({type(e).__name__}: {e})")
    finally:
        backends.force(previous)
PY
