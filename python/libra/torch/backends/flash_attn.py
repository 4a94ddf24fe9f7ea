"""flash-attn's ``flash_attn_varlen_func`` (CUDA, fp16/bf16), when the package is importable; its
backward is flash-attn's varlen backward on the saved output and LSE (no recomputed forward)."""
import inspect

import torch

from . import Backend, flash_window


class FlashAttn(Backend):
    name = "flash-attn"
    kind = "varlen"
    # Tests put a plain-torch stand-in written from flash_attn's contract here to run this backend's
    # path on CPU; None: import flash_attn.
    impl = None
    # The tests' stand-in for flash-attn's varlen backward (flash_attn_interface._flash_attn_varlen_backward's
    # contract: dq, dk, dv written into the tensors passed); None: flash_attn's own, when impl is None.
    impl_backward = None

    def _fn(self):
        if self.impl is not None:
            return self.impl
        try:
            from flash_attn import flash_attn_varlen_func  # noqa: PLC0415
        except ImportError as e:
            raise RuntimeError(f"flash_attn is not importable: {e}") from None
        return flash_attn_varlen_func

    def unavailable(self, device, dtype):
        if self.impl is not None:
            return None
        if device.type != "cuda":
            return f"runs on CUDA tensors only, not {device.type}"
        if dtype not in (torch.float16, torch.bfloat16):
            return f"takes float16 or bfloat16, not {dtype}"
        try:
            self._fn()
        except RuntimeError as e:
            return str(e)
        return None

    def gives_lse(self):
        # The tests' forward stand-in gives an LSE only beside a backward stand-in (flash-attn's contract).
        return self.impl is None or self.impl_backward is not None

    def _backward_fn(self):
        if self.impl_backward is not None:
            return self.impl_backward
        from flash_attn.flash_attn_interface import _flash_attn_varlen_backward  # noqa: PLC0415
        return _flash_attn_varlen_backward

    def has_backward(self):
        if self.impl is not None:
            return self.impl_backward is not None
        try:
            self._backward_fn()
        except ImportError:
            return False
        return True

    def varlen_backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, window):
        fn = self._backward_fn()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # Its arguments moved between flash-attn 2.x releases: passed by name, as the signature has them.
        params = inspect.signature(fn).parameters
        left, right = flash_window(window)
        kw = dict(dropout_p=0.0, softmax_scale=q.shape[-1] ** -0.5 if scale is None else scale, causal=True)
        if "window_size_left" in params:
            kw.update(window_size_left=left, window_size_right=right)
        else:
            kw["window_size"] = (left, right)
        for name, value in (("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False), ("rng_state", None)):
            if name in params:
                kw[name] = value
        fn(do.contiguous(), q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, **kw)
        return dq, dk, dv

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        fn = self._fn()
        if self.impl is not None and self.impl_backward is None:  # the stand-in returns o only
            return fn(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=True,
                      window_size=flash_window(window)), None
        # flash-attn 2.x varlen: with return_attn_probs, (out, softmax_lse [h_q, total_q], S_dmask).
        out = fn(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=True,
                 window_size=flash_window(window), return_attn_probs=True)
        o, lse = out[0], out[1]
        if lse.dim() != 2 or tuple(lse.shape) != (q.shape[1], q.shape[0]):
            # flash_attn 1.x pads its LSE per batch entry: a layout libra does not read.
            raise RuntimeError(f"libra.torch: flash_attn returned its LSE as {list(lse.shape)}, not [h_q, total_q] "
                               "(flash_attn 2.x); this version is not supported")
        return o, lse


BACKEND = FlashAttn()
