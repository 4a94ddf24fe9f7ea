"""The compute backends of ``libra.torch.attention``, behind one small interface.

A backend computes the kernel calls of one pipeline chunk; the exchanges,
the pipeline order and the autograd function around it are the same for
all of them. Two kinds:

- ``buffers``: computes forward and backward itself on the pass's home and
  compute buffers, in place (libra's CPU kernel through the binding);
- ``varlen``: a differentiable varlen attention function in flash-attn's
  terms (q ``[total_q, h_q, d]``, k/v ``[total_k, h_kv, d]``, ``cu_seqlens``,
  bottom-right causal, ``window_size=(left, 0)``, GQA), returning ``(o, lse)``
  with ``lse`` ``[h_q, total_q]`` in fp32 or None where it gives none. The
  engine gathers a chunk's vectors per buffer pair (one merged call), runs
  forward under ``no_grad``, and backward by the backend's
  ``varlen_backward`` on the saved output and LSE where it has one, else
  through autograd on a recomputed forward (SDPA).

``select`` picks the first registered backend that is available for the
tensors' device and dtype, in the order of ``ORDER``; ``force(name)`` (or the
``LIBRA_TORCH_BACKEND`` environment variable) pins one, for tests and for
users who know better.

    from libra.torch import backends
    backends.select(torch.device("cpu"), torch.float32).name      # 'libra-cpu'
    backends.force("sdpa")    # every pass now runs the portable fallback

A new backend is a new file in this folder defining a ``Backend`` and one
line in ``ORDER`` below.
"""
from .._registry import Registry
import os

# Preference order; each name is a module of this package (dashes as underscores) whose BACKEND it
# registers. The first available one for a call's device and dtype runs it.
ORDER = ("triton", "libra-cpu", "flash-attn", "torch-varlen", "sdpa")

# Short names older code and tests use.
_ALIASES = {"flash": "flash-attn", "cpu": "libra-cpu"}


class Backend:
    """What every backend declares. Subclasses set ``name``, ``kind`` and override the methods of
    their kind."""

    name = "?"
    kind = "varlen"  # or "buffers"

    def unavailable(self, device, dtype):
        """Why this backend cannot run on ``device`` with ``dtype`` (one line), or None."""
        raise NotImplementedError

    def gives_lse(self):
        """Whether its forward fills the softmax LSE (``attention(return_lse=True)`` needs it)."""
        return True

    # kind "varlen"
    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, window, cu_host):
        """Returns (o [total_q, h_q, d] in q's dtype, lse [h_q, total_q] fp32 or None). ``window``
        is libra's (None or W: keys within W positions, the query's own included); ``cu_host`` the
        cu_seqlens as Python lists, for backends that loop on the host."""
        raise NotImplementedError

    def has_backward(self):
        """Whether ``varlen_backward`` runs (backward from the saved output and LSE); otherwise
        backward differentiates a recomputed forward through autograd."""
        return False

    def varlen_backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, window):
        """(dq, dk, dv) like q, k, v of the varlen forward that gave o and lse ([h_q, total_q] fp32)."""
        raise NotImplementedError

    # kind "buffers": chunk ``m`` of pass ``pass_index`` of runtime ``rt`` (its calls are
    # ``rt.schedule["calls"][pass_index][m]``, its window ``rt.window``), in place on the pass's
    # ``home`` and ``comp`` buffers; ``scale`` None means 1/sqrt(d).
    def forward(self, rt, pass_index, m, home, comp, scale):
        raise NotImplementedError

    def backward(self, rt, pass_index, m, home, comp, scale):
        raise NotImplementedError


_REGISTRY = Registry(__name__, ORDER, "BACKEND", "libra.torch backend")
_forced = None


def registry():
    """Every backend of ORDER by name (imported on first use)."""
    return _REGISTRY.table()


def get(name):
    name = _ALIASES.get(name, name)
    return _REGISTRY.get(name)


def force(name):
    """Pins every later attention pass to backend ``name`` (None: choose by device again); returns
    the previous setting."""
    global _forced
    previous = _forced
    _forced = None if name is None else get(name).name
    return previous


def forced():
    """The pinned backend's name: force()'s, else LIBRA_TORCH_BACKEND's, else None."""
    if _forced is not None:
        return _forced
    env = os.environ.get("LIBRA_TORCH_BACKEND")
    return get(env).name if env else None


def select(device, dtype):
    """The backend a pass on ``device`` with ``dtype`` runs; a ValueError naming the device, the
    dtype and why each candidate cannot run when none can."""
    device = __import__("torch").device(device)
    pinned = forced()
    candidates = [pinned] if pinned else list(ORDER)
    reasons = []
    for name in candidates:
        backend = get(name)
        why = backend.unavailable(device, dtype)
        if why is None:
            return backend
        reasons.append(f"{name}: {why}")
    raise ValueError(f"libra.torch.attention: no compute backend runs {dtype} on {device} ({'; '.join(reasons)})")


def flash_window(window):
    """libra's window W (keys within W positions, the query's own included) as flash-attn's
    window_size (left, right) under causal masking."""
    return (-1, -1) if window is None else (int(window) - 1, 0)
