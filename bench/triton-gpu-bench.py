#!/usr/bin/env python3
"""Per-call throughput of libra's Triton tile-list kernels against torch's SDPA flash backend on the
same dense causal shapes (one sample of T tokens, bf16, h_q 32, h_kv 8 (GQA 4), d 128 by default),
forward and backward, in TFLOP/s with causal FLOPs counted once: pairs = T (T + 1) / 2, forward
4 d pairs h_q, backward 10 d pairs h_q (FlashAttention's convention; no recomputed forward counted).
Median of --reps timed calls after warm-up, CUDA events. One line per figure:

    gpu-bench: T 8192 d 128 h_q 32 h_kv 8 bf16 forward triton 312.4 TFLOP/s (0.881 ms)

    python bench/triton-gpu-bench.py                   # T 8192 and 32768 (scripts/gpu-check.sh)
    python bench/triton-gpu-bench.py --tokens 4096 --reps 5
    TRITON_INTERPRET=1 python bench/triton-gpu-bench.py --smoke   # CPU: the triton path runs once, tiny
"""
import argparse
import os
import statistics
import sys
import time

import torch


def triton_call(T, hq, hkv, d, dtype, device):
    """Closures (forward, backward) running one dense causal sample through the tile-list kernels:
    one call, one fragment [0, T), Q vectors row * h_q + h (libra's buffer layout)."""
    from libra.torch import triton_attention as ta  # noqa: PLC0415
    from libra.torch.descriptors import chunk_descriptors  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    calls = [((0, T, hq, hq), (0, T, hkv, hkv), np.array([[0, 0, T, 0, T]], dtype=np.int64), True, True)]
    table, bounds = chunk_descriptors(calls)
    tables = ta.WorkTables(table, bounds, None, ta.config(d, dtype), device)
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(n, dt=dtype):
        return torch.randn(n, d, generator=g).to(device, dt)

    b = {"Q": r(T * hq), "K": r(T * hkv), "V": r(T * hkv), "O": r(T * hq), "dO": r(T * hq),
         "LSE": torch.zeros(T * hq, 1, device=device), "dQ": r(T * hq, torch.float32),
         "dK": torch.zeros(T * hkv, d, device=device), "dV": torch.zeros(T * hkv, d, device=device)}
    pair = 3  # (q_home, kv_home) = (1, 1)
    return (lambda: ta.forward(tables, pair, b, b, None)), (lambda: ta.backward(tables, pair, b, b, None))


def sdpa_call(T, hq, hkv, d, dtype, device):
    """(forward, backward) closures of torch SDPA's flash backend on [1, h, T, d], causal. Backward
    runs autograd on one saved forward (the forward is not repeated inside the timing)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    q = torch.randn(1, hq, T, d, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, hkv, T, d, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, hkv, T, d, device=device, dtype=dtype, requires_grad=True)
    F = torch.nn.functional

    def fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except RuntimeError:  # a flash kernel without GQA: the K/V heads repeated (outside its FLOPs)
                r = hq // hkv
                return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1),
                                                      is_causal=True)

    o = fwd()
    do = torch.randn_like(o)

    def bwd():
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    return fwd, bwd


def timed(fn, reps, device):
    for _ in range(3):
        fn()
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, action="append", help="T (repeatable); default 8192 and 32768")
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1: T 64, h 2/1, d 16, triton once")
    args = ap.parse_args(argv)
    if args.smoke:
        device, tokens, hq, hkv, d, impls = torch.device("cpu"), [64], 2, 1, 16, ("triton",)
    else:
        if not torch.cuda.is_available():
            print("gpu-bench: no CUDA device; nothing measured (--smoke runs the CPU-checkable part)")
            return 0
        device, tokens, hq, hkv, d = torch.device("cuda"), args.tokens or [8192, 32768], args.heads_q, args.heads_kv, args.head_dim
        impls = ("triton", "sdpa-flash")
    dtype = torch.bfloat16
    for T in tokens:
        flops = {"forward": 4 * d * T * (T + 1) / 2 * hq}
        flops["backward"] = flops["forward"] * 2.5
        for impl in impls:
            try:
                fwd, bwd = (triton_call if impl == "triton" else sdpa_call)(T, hq, hkv, d, dtype, device)
                for what, fn in (("forward", fwd), ("backward", bwd)):
                    s = timed(fn, args.reps, device)
                    print(f"gpu-bench: T {T} d {d} h_q {hq} h_kv {hkv} bf16 {what} {impl} "
                          f"{flops[what] / s / 1e12:.1f} TFLOP/s ({s * 1e3:.3f} ms)", flush=True)
            except Exception as e:  # noqa: BLE001 - one line per figure, failures included
                print(f"gpu-bench: T {T} {impl}: failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
