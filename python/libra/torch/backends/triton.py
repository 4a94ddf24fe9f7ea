"""libra's own tile-list kernels in Triton (``libra.torch.triton_attention``): per chunk, one launch
per buffer pair and kernel reads the chunk's descriptor table and computes every kernel call in
place on the pass's buffers, forward and backward (no gather, scatter or autograd recompute).

CUDA tensors; CPU tensors too when ``TRITON_INTERPRET=1`` was set before triton was imported (the
interpreter: slow, for tests and for checking the kernel without a GPU). fp16, bf16 and fp32
storage, head dims up to 256. ``LIBRA_TRITON_DETERMINISTIC=1`` (or ``DETERMINISTIC = True`` on
this module's BACKEND) makes gradients bitwise reproducible: no atomics, dK/dV in ordered waves.

The work tables are built once per (pass, chunk, device, head dim) and kept on the runtime, from the
descriptor tables the binding built with the micro-batch's index arrays (the kernels read their device
view; chunk_descriptors, the Python builder, is the tests' reference).
"""
import os

import numpy as np
import torch

from . import Backend, forced

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _load():
    try:
        from .. import triton_attention  # noqa: PLC0415
    except ImportError as e:
        return None, f"triton is not installed ({e})"
    return triton_attention, None


class Triton(Backend):
    name = "triton"
    kind = "buffers"

    def __init__(self):
        self._mod, self._missing = None, None
        self.deterministic = None  # None: LIBRA_TRITON_DETERMINISTIC decides

    def _ensure(self):
        if self._mod is None and self._missing is None:
            self._mod, self._missing = _load()
        return self._mod

    def is_deterministic(self):
        if self.deterministic is not None:
            return bool(self.deterministic)
        return os.environ.get("LIBRA_TRITON_DETERMINISTIC", "0") not in ("", "0")

    def unavailable(self, device, dtype):
        if dtype not in _DTYPES:
            return f"takes float16, bfloat16 or float32, not {dtype}"
        if device.type == "cpu":
            # The interpreter is for checking the kernel: never chosen for CPU tensors unless pinned.
            if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or forced() != self.name:
                return "runs on CUDA tensors (CPU tensors only pinned, under TRITON_INTERPRET=1)"
        elif device.type != "cuda":
            return f"runs on CUDA tensors only, not {device.type}"
        elif not torch.cuda.is_available():
            return "this torch sees no CUDA device"
        elif torch.cuda.get_device_capability(device) < (8, 0):
            return "needs compute capability 8.0 or later (bf16 tensor cores; the configurations compiled in CI)"
        if self._ensure() is None:
            return self._missing
        if (device.type == "cpu") != self._mod.interpreted():
            return ("TRITON_INTERPRET=1 was set after libra's kernels were built (set it before importing triton)"
                    if device.type == "cpu" else "the kernels were built for the interpreter (TRITON_INTERPRET=1)")
        return None

    def gives_lse(self):
        return True

    def tables(self, rt, pass_index, m, bufs):
        """The chunk's WorkTables for these buffers' device, head dim and dtype (built once, kept on
        the runtime)."""
        mod = self._ensure()
        q = bufs["Q"]
        det = self.is_deterministic()
        cache = rt.__dict__.setdefault("_triton_tables", {})
        key = (pass_index, m, q.device, q.shape[1], q.dtype, det)
        t = cache.get(key)
        if t is None:
            # The binding built the chunk's descriptor table with the rest of the micro-batch's index
            # arrays (libra.torch.descriptors' format; chunk_descriptors is the tests' reference):
            # its device view is what the kernels read, its host copy plans the launches.
            per = rt.on(q.device)[pass_index]
            table, bounds = per["descriptors_host"][m]
            # The backward usually runs the forward's calls: one set of tables serves both.
            other = cache.get((1 - pass_index,) + key[1:])
            if other is not None and np.array_equal(other.table, table) and np.array_equal(other.bounds, bounds):
                cache[key] = other
                return other
            t = mod.WorkTables(table, bounds, rt.window, mod.config(q.shape[1], q.dtype), q.device, det,
                               desc=per["descriptors"][m][0])
            cache[key] = t
        return t

    def _run(self, rt, pass_index, m, home, comp, scale, fn):
        t = self.tables(rt, pass_index, m, home)
        mod = self._mod
        launches = 0
        for pair, (q_home, kv_home) in enumerate(PAIRS):
            launches += fn(mod)(t, pair, home if q_home else comp, home if kv_home else comp, scale)
        rt.__dict__["_triton_launches"] = rt.__dict__.get("_triton_launches", 0) + launches

    def forward(self, rt, pass_index, m, home, comp, scale):
        self._run(rt, pass_index, m, home, comp, scale, lambda mod: mod.forward)

    def backward(self, rt, pass_index, m, home, comp, scale):
        self._run(rt, pass_index, m, home, comp, scale, lambda mod: mod.backward)


PAIRS = ((False, False), (False, True), (True, False), (True, True))  # descriptors.PAIRS
BACKEND = Triton()
