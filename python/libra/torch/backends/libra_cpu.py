"""libra's CPU kernel through the binding: fp32 or bf16 storage, fp32 accumulation, forward and
backward computed in place on the pass's buffers (no autograd recompute)."""
import torch

from ... import _libra
from . import Backend


def _kernel_dtype(t):
    if t.dtype == torch.float32:
        return "fp32"
    if t.dtype == torch.bfloat16:
        return "bf16"
    raise ValueError(f"libra.torch.attention: libra's CPU kernel takes float32 or bfloat16 tensors, got {t.dtype}")


def _view(buf, prog):
    """Kernel view (data_ptr, dtype, rows, heads, width, row_stride) of a [vectors, width] buffer
    addressed by a strided program (offset, rows, run, stride) over head vectors."""
    offset, rows, run, stride = prog
    # The kernel checks fragments against the view, not the view against the memory behind it.
    if offset < 0 or run < 0 or (rows > 0 and offset + (rows - 1) * stride + run > buf.shape[0]):
        raise RuntimeError(f"libra.torch: kernel view {tuple(prog)} lies outside its buffer of {buf.shape[0]} vectors")
    width = buf.shape[1]
    return (buf.data_ptr() + offset * width * buf.element_size(), _kernel_dtype(buf), rows, run, width,
            stride * width)


def _sources(call, home, comp):
    """A kernel call's (q program, kv program, fragments, Q-family buffers, KV-family buffers): a call
    with q_home (kv_home) reads and writes the home buffers of that family in place, else the compute
    buffers (libra/schedule.hpp, "Data read in place")."""
    qp, kp, frags, q_home, kv_home = call
    return qp, kp, frags, home if q_home else comp, home if kv_home else comp


class LibraCpu(Backend):
    name = "libra-cpu"
    kind = "buffers"

    def unavailable(self, device, dtype):
        if device.type != "cpu":
            return f"runs on CPU tensors only, not {device.type}"
        if dtype not in (torch.float32, torch.bfloat16):
            return f"takes float32 or bfloat16, not {dtype}"
        return None

    def forward(self, rt, pass_index, m, home, comp, scale):
        calls, threads = rt.schedule["calls"][pass_index][m], rt.threads
        window = _libra.FULL_CAUSAL if rt.window is None else int(rt.window)
        for call in calls:
            qp, kp, frags, bq, bk = _sources(call, home, comp)
            _libra.kernel_forward(_view(bq["Q"], qp), _view(bk["K"], kp), _view(bk["V"], kp), _view(bq["O"], qp),
                                  _view(bq["LSE"], qp), frags, window, scale, threads)

    def backward(self, rt, pass_index, m, home, comp, scale):
        calls, threads = rt.schedule["calls"][pass_index][m], rt.threads
        window = _libra.FULL_CAUSAL if rt.window is None else int(rt.window)
        for call in calls:
            qp, kp, frags, bq, bk = _sources(call, home, comp)
            _libra.kernel_backward(_view(bq["Q"], qp), _view(bk["K"], kp), _view(bk["V"], kp), _view(bq["O"], qp),
                                   _view(bq["dO"], qp), _view(bq["LSE"], qp), _view(bq["dQ"], qp),
                                   _view(bk["dK"], kp), _view(bk["dV"], kp), frags, window, scale, threads)


BACKEND = LibraCpu()
