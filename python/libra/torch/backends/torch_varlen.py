"""PyTorch's own varlen attention, ``torch.nn.attention.varlen.varlen_attn`` (torch 2.10 and later,
CUDA). What it accepts differs between releases, so its signature is read, not assumed: GQA needs
``enable_gqa``, a window ``window_size`` and the LSE ``return_aux``. Backward is its own varlen
backward op (``torch.ops.torch_attn._varlen_attn_backward``, what varlen_attn's autograd formula
calls) on the saved output and LSE, where this torch has it; else autograd on a recomputed forward."""
import inspect

import torch

from . import Backend, flash_window


def _load():
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415
    except ImportError as e:
        return None, f"torch {torch.__version__} has no torch.nn.attention.varlen ({e})"
    return varlen_attn, None


class TorchVarlen(Backend):
    name = "torch-varlen"
    kind = "varlen"

    def __init__(self):
        self._fn, self._missing = None, None
        self._params = None

    def _ensure(self):
        if self._fn is None and self._missing is None:
            self._fn, self._missing = _load()
            if self._fn is not None:
                self._params = set(inspect.signature(self._fn).parameters)
        return self._fn

    def unavailable(self, device, dtype):
        if device.type != "cuda":
            return f"runs on CUDA tensors only, not {device.type}"
        if dtype not in (torch.float16, torch.bfloat16):
            return f"takes float16 or bfloat16, not {dtype}"
        if self._ensure() is None:
            return self._missing
        return None

    def gives_lse(self):
        return self._ensure() is not None and "return_aux" in self._params

    def _backward_op(self):
        ns = getattr(torch.ops, "torch_attn", None)
        return None if ns is None or not hasattr(ns, "_varlen_attn_backward") else ns._varlen_attn_backward

    def has_backward(self):
        return self.gives_lse() and self._backward_op() is not None

    def varlen_backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, window):
        # varlen_attn's own formula: is_causal for plain causal, else flash's window (left, 0); no dropout,
        # so its rng state is zeros (what varlen_attn's forward returns).
        ws = list(flash_window(window)) if window is not None else [-1, 0]
        rng = torch.zeros((2,), dtype=torch.uint64, device=q.device)
        return self._backward_op()(do.contiguous(), q, k, v, o, lse, cu_q, cu_k, max_q, max_k, ws == [-1, 0], rng,
                                   scale, ws)

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        fn = self._ensure()
        p = self._params
        kw = {}
        if q.shape[1] != k.shape[1]:
            if "enable_gqa" not in p:
                raise ValueError(f"libra.torch.attention: this torch's varlen_attn has no enable_gqa, and the plan "
                                 f"has {q.shape[1]} q heads per {k.shape[1]} kv heads")
            kw["enable_gqa"] = True
        if window is not None:
            if "window_size" not in p:
                raise ValueError(f"libra.torch.attention: this torch's varlen_attn has no window_size, and the plan "
                                 f"has window {window}")
            kw["window_size"] = flash_window(window)
        elif "window_size" in p:
            kw["window_size"] = (-1, 0)  # causal
        elif "is_causal" in p:
            kw["is_causal"] = True
        if scale is not None and "scale" in p:
            kw["scale"] = scale
        want_lse = "return_aux" in p
        if want_lse:
            from torch.nn.attention.varlen import AuxRequest  # noqa: PLC0415
            kw["return_aux"] = AuxRequest(lse=True)
        out = fn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)
        if want_lse:
            o, lse = out
            if tuple(lse.shape) != (q.shape[1], q.shape[0]):
                raise RuntimeError(f"libra.torch: varlen_attn returned its LSE as {list(lse.shape)}, not "
                                   "[h_q, total_q]; this torch version is not supported")
            return o, lse
        return out, None


BACKEND = TorchVarlen()
