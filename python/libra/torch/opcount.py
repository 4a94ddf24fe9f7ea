"""Counting the torch ops one libra.torch.attention call dispatches, with the wire taken out: what
bench/torch-host-time.py reports and tests/python/test_host_path.py bounds, one definition for both.

    rt.comm = NoWire(rt.comm)                 # an all-to-all moves nothing, counts one op
    fwd, bwd = call_ops(rt, q, k, v, do)      # ops of one forward and one backward call

On meta tensors (q, k, v, do on device "meta") every op runs its dispatch and shape logic without
data, and a host read of a device value raises: the count is the host path's alone."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .function import attention


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched inside it (``n``), and apart those that are not views
    (``kernels``: what runs on a device, or allocates)."""

    def __init__(self):
        super().__init__()
        self.n = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


class _Done:
    def wait(self, timeout=None):
        return True


class NoWire:
    """A runtime's communicator with the wire taken out: an all-to-all moves nothing and counts one
    op in ``n`` (NCCL's all_to_all_single is one op on the host); everything else is the
    communicator's."""

    def __init__(self, comm):
        self.comm, self.n = comm, 0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def all_to_all(self, out, inp, out_splits, in_splits, group):
        self.n += 1
        return _Done()


def call_ops(rt, q, k, v, do):
    """(forward, backward) ops of one attention call on ``rt`` (whose comm is a NoWire), each with
    its all-to-alls counted one op apiece."""
    wire = rt.comm
    wire.n = 0
    with CountOps() as c:
        o = attention(q, k, v, rt)
        fwd, fwd_wire = c.n, wire.n
        o.backward(do)
    return fwd + fwd_wire, c.n - fwd + wire.n - fwd_wire


def meta_inputs(rt, dtype=torch.bfloat16):
    """q, k, v (requiring grad) and do of ``rt``'s home rows on the meta device."""
    meta = dict(device="meta", dtype=dtype)
    q = torch.empty(rt.home_rows, rt.heads_q, rt.head_dim, **meta).requires_grad_()
    k = torch.empty(rt.home_rows, rt.heads_kv, rt.head_dim, **meta).requires_grad_()
    v = torch.empty(rt.home_rows, rt.heads_kv, rt.head_dim, **meta).requires_grad_()
    return q, k, v, torch.empty(rt.home_rows, rt.heads_q, rt.head_dim, **meta)
