#!/usr/bin/env python3
"""Compiles every configuration libra's Triton backend can launch (libra.torch.triton_attention:
forward, delta, dQ, dK/dV atomic and deterministic, per storage dtype and padded head dim; windowed
and plain causal share a variant) for CUDA targets with Triton's ahead-of-time compiler, without a
GPU, and checks that each fits the target's shared memory per block. The interpreter cannot catch
this class of error (e.g. a tl.dot of an fp32 by a bf16 operand, which fails for sm_90).

    python scripts/triton-aot-check.py                    # everything: sm_80, sm_90 (and sm_100)
    python scripts/triton-aot-check.py --quick            # the CI subset (the largest tiles per dtype)

One line per compile: arch, dtype, head dim, kernel, shared bytes, limit, seconds. Exit status 1
when a configuration fails to compile or does not fit.
"""
import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret

import torch  # noqa: E402

from libra.torch import triton_attention as ta  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def arches():
    """The CUDA targets checked by default: A100 (80), H100/H200 (90) and B200 (100; the pinned
    Triton's ptxas compiles for it)."""
    return [80, 90, 100]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="CI subset: the largest tiles per target, sm_90 bf16 d 128 and sm_80 bf16 d 256")
    ap.add_argument("--arch", type=int, action="append", help="CUDA arch (repeatable), default all offered")
    ap.add_argument("--dtype", choices=sorted(DTYPES), action="append")
    ap.add_argument("--head-dim", type=int, action="append", choices=(16, 32, 64, 128, 256))
    args = ap.parse_args(argv)
    if args.quick:
        combos = [(90, "bf16", 128), (80, "bf16", 256)]
    else:
        combos = [(a, t, h) for a in args.arch or arches() for t in args.dtype or sorted(DTYPES)
                  for h in args.head_dim or [16, 32, 64, 128, 256]]
    failed = 0
    warnings.filterwarnings("ignore")
    for arch, dt, hd in combos:
        limit = ta.SHARED_LIMIT.get(arch, 101376)
        for name, kernel, sig, consts, warps, stages in ta.aot_variants(DTYPES[dt], hd):
            t = time.time()
            try:
                shared = ta.aot_compile(kernel, sig, consts, warps, stages, arch).metadata.shared
                why = "" if shared <= limit else " EXCEEDS"
            except Exception as e:  # noqa: BLE001 - report every failing configuration
                shared, why = -1, f" FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            failed += bool(why)
            print(f"sm_{arch} {dt} d{hd} {name}: shared {shared} of {limit} bytes, {time.time() - t:.1f} s{why}",
                  flush=True)
    print(f"triton-aot-check: {failed} failing configuration(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
