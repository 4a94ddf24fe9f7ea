"""The worker's index arrays on a device: everything a pass indexes with (every exchange's gather,
local and scatter rows, the apply rows, every chunk's merged varlen calls and kernel descriptor
table), built by the binding once per micro-batch as one int32 array (the descriptor tables int64) (``RankProgram.index_arrays``,
python/src/program_index.hpp, without the GIL), copied to the device in one copy (from one pinned
host buffer, non-blocking, on CUDA) and cut into views here. Nothing in a pass builds, copies or
reads back an index."""
import numpy as np
import torch

_KINDS = ("in", "out", "stage")


def _groups(dev, groups):
    """(field, src, dst, add, class, src rows, dst rows) per index op: views of ``dev``; a side whose
    rows are 0 .. n-1 is the slice ``slice(0, n)`` instead (exchange.py then reads or writes the
    message's first n rows without an index op)."""
    return [(field, src, dst, add, cls, slice(0, n) if ident & 1 else dev[s:s + n],
             slice(0, n) if ident & 2 else dev[d:d + n]) for field, src, dst, add, cls, s, d, n, ident in groups]


def _i64(t, off, n):
    """n int64 values stored as 2n int32 entries at ``off`` (even) of ``t`` (a view)."""
    return t[off:off + 2 * n].view(torch.int64)


class Pair:
    """One chunk's kernel calls on one (q buffer, kv buffer) pair, merged into one varlen call:
    ``q`` [total_q * hq] and ``kv`` [total_k * hkv] head-vector rows (query- or key-major), ``lse``
    [hq * total_q] the same q vectors head-major (flash-attn's LSE layout), ``cu_q`` / ``cu_k``
    int32 cu_seqlens on the device and ``cu_host`` the same as numpy arrays (host loops, no sync)."""

    __slots__ = ("q_home", "kv_home", "hq", "hkv", "total_q", "total_k", "max_q", "max_k", "seqs", "q", "kv", "lse",
                 "cu_q", "cu_k", "cu_host", "q2", "kv2", "lse2")

    def __init__(self, rec, dev, host):
        for name in ("q_home", "kv_home", "hq", "hkv", "total_q", "total_k", "max_q", "max_k", "seqs"):
            setattr(self, name, rec[name])
        nq, nk = rec["total_q"] * rec["hq"], rec["total_k"] * rec["hkv"]
        self.q = dev[rec["q_off"]:rec["q_off"] + nq]
        self.kv = dev[rec["kv_off"]:rec["kv_off"] + nk]
        self.lse = dev[rec["lse_off"]:rec["lse_off"] + nq]
        # The same rows shaped as the varlen tensors' leading dims, so one advanced-indexing op gathers
        # [total, heads, d] (or writes it back) with no reshape around it.
        self.q2 = self.q.view(rec["total_q"], rec["hq"])
        self.kv2 = self.kv.view(rec["total_k"], rec["hkv"])
        self.lse2 = self.lse.view(rec["hq"], rec["total_q"])
        n = rec["seqs"] + 1
        self.cu_q = dev[rec["cu_q_off"]:rec["cu_q_off"] + n]
        self.cu_k = dev[rec["cu_k_off"]:rec["cu_k_off"] + n]
        # Copies: a view would keep the whole host array alive after the runtime lets it go.
        self.cu_host = (host[rec["cu_q_off"]:rec["cu_q_off"] + n].numpy().copy(),
                        host[rec["cu_k_off"]:rec["cu_k_off"] + n].numpy().copy())


def host_arrays(program):
    """(int32 CPU tensor, layout) of ``program``'s index arrays (built once per program, GIL released)."""
    data, layout = program.index_arrays()
    return torch.from_numpy(data), layout


def to_device(host, layout, device):
    """The index arrays on ``device``: [pass] = {"in", "out", "stage": [chunk] exchange (send and recv
    counts per class, gather, local, scatter), "apply": groups, "varlen": [chunk] [Pair],
    "descriptors": [chunk] (table [rows, 10], bounds [5]) (libra.torch.descriptors' format),
    "descriptors_host": the same as numpy int64 arrays}, and
    the device tensor the views share (its bytes: the index memory of the worker on that device)."""
    if device.type == "cpu":
        dev = host
    elif device.type == "cuda":
        pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        pinned.copy_(host)
        dev = pinned.to(device, non_blocking=True)
        # The copy reads `pinned` after this returns: it lives as long as the device copy does.
        dev._libra_pinned = pinned
    else:
        dev = host.to(device)
    host_np = host.numpy()  # numpy slices: a fraction of torch views' host time
    out = []
    for per in layout["passes"]:
        p = {}
        for kind in _KINDS:
            p[kind] = [{"send": x["send"], "recv": x["recv"],
                        **{k: _groups(dev, x[k]) for k in ("gather", "local", "scatter")}} for x in per[kind]]
        p["apply"] = _groups(dev, per["apply"])
        p["varlen"] = [[Pair(rec, dev, host) for rec in chunk] for chunk in per["varlen"]]
        p["descriptors"] = [(_i64(dev, t, 10 * rows).view(rows, 10), _i64(dev, b, 5)) for t, rows, b in per["descriptors"]]
        # The same tables on the host, for what plans launches from them (the triton backend's work
        # rows and grids) without reading the device back; copies off the CPU, as cu_host.
        copy = device.type != "cpu"
        p["descriptors_host"] = [_desc_host(host_np, t, rows, b, copy) for t, rows, b in per["descriptors"]]
        out.append(p)
    return out, dev


def _desc_host(host_np, t, rows, b, copy):
    """A chunk's (table [rows, 10], bounds [5]) int64 from the int32 numpy array ``host_np``: views,
    or copies (which do not keep the whole host array alive)."""
    table, bounds = host_np[t:t + 20 * rows].view(np.int64).reshape(rows, 10), host_np[b:b + 10].view(np.int64)
    return (table.copy(), bounds.copy()) if copy else (table, bounds)


def descriptors_host(host, layout, pass_index, m):
    """Chunk m's descriptor table and bounds as numpy arrays (host views), for checks."""
    t, rows, b = layout["passes"][pass_index]["descriptors"][m]
    return _desc_host(host.numpy(), t, rows, b, False)


def nbytes(dev):
    return dev.numel() * dev.element_size()

