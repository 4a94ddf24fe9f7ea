"""The worker's index arrays on a device: everything a pass indexes with (every exchange's gather,
local and scatter rows, the apply rows, every chunk's merged varlen calls and kernel descriptor
table), built by the binding once per micro-batch (``RankProgram.index_arrays``,
python/src/program_index.hpp, without the GIL): one int32 host array, a small part (cu_seqlens, the
descriptor tables as int64) then the head-vector rows as strided runs (five columns, a few ints per
run, not one per row). It goes to the device in one copy (from one pinned host buffer, non-blocking,
on CUDA); one kernel launch expands the runs into the rows there (``expand``: Triton on CUDA, the
binding's C++ on the CPU), one split cuts every exchange group's rows (a merged call's are views by
offset), and the records are made per pass and kind as a backend first reads them. Nothing in a pass builds, copies or reads back an index."""
import functools

import numpy as np
import torch

from .. import _libra

_KINDS = ("in", "out", "stage")


def sides(cuts, g):
    """(source rows, destination rows) of the exchange group ``g`` (the binding's tuple: field, src,
    dst, add, class, source offset, destination offset, n, identity, source cut, destination cut):
    views of the rows, ``cuts`` (cut once per micro-batch: an exchange's ``"sides"``, the pass's
    ``"sides"``), or ``slice(0, n)`` where the rows are 0 .. n-1 (exchange.py then reads or writes
    the message's first n rows without an index op). Per call: a tuple lookup, no torch op."""
    n, ident = g[7], g[8]
    return slice(0, n) if ident & 1 else cuts[g[9]], slice(0, n) if ident & 2 else cuts[g[10]]


def _i64(t, off, n):
    """n int64 values stored as 2n int32 entries at ``off`` (even) of ``t`` (a view)."""
    return t[off:off + 2 * n].view(torch.int64)


class Pair:
    """One chunk's kernel calls on one (q buffer, kv buffer) pair, merged into one varlen call, or
    (``"joined"``) consecutive pairs of the same head widths joined into one; positions in joined
    buffers (a field's home vectors, then its compute vectors: function.py):
    ``q2`` [total_q, hq] and ``kv2`` [total_k, hkv] the head-vector rows (query- or key-major),
    ``lse2`` [hq, total_q] the q vectors head-major (flash-attn's LSE layout: ``q2`` transposed),
    ``cu_q`` / ``cu_k`` int32 cu_seqlens on the device and ``cu_host`` the same as numpy arrays (host
    loops, no sync)."""

    __slots__ = ("q_home", "kv_home", "hq", "hkv", "total_q", "total_k", "max_q", "max_k", "seqs",
                 "cu_q", "cu_k", "cu_host", "q2", "kv2", "lse2")

    def __init__(self, rec, rows, dev, small):
        self.q_home, self.kv_home, hq, hkv = rec["q_home"], rec["kv_home"], rec["hq"], rec["hkv"]
        tq, tk = rec["total_q"], rec["total_k"]
        self.hq, self.hkv, self.total_q, self.total_k = hq, hkv, tq, tk
        self.max_q, self.max_k, self.seqs = rec["max_q"], rec["max_k"], rec["seqs"]
        # The rows shaped as the varlen tensors' leading dims (one advanced-indexing op gathers
        # [total, heads, d], or writes it back, with no reshape around it): one view each, straight
        # from the rows (the merged calls' rows are not cut: the split's last piece spans them all).
        at = rows.storage_offset()
        self.q2 = rows.as_strided((tq, hq), (hq, 1), at + rec["q_off"])
        self.lse2 = self.q2.t()
        self.kv2 = rows.as_strided((tk, hkv), (hkv, 1), at + rec["kv_off"])
        n, cq, ck = self.seqs + 1, rec["cu_q_off"], rec["cu_k_off"]
        self.cu_q = dev[cq:cq + n]
        self.cu_k = dev[ck:ck + n]
        # Views of the small array on the host (no copy: the program the runtime holds keeps the
        # binding's array, about a MiB at 1M, alive anyway).
        self.cu_host = (small[cq:cq + n], small[ck:ck + n])


_PAIR_KINDS = ("varlen", "joined", "descriptors")


def host_arrays(program, kinds=None):
    """(host, layout) of ``program``'s index arrays (built once per program, GIL released): host is
    one int32 CPU tensor sharing the binding's memory, the small array (cu_seqlens, descriptor
    tables: layout["data"] entries) then the runs' five columns of layout["runs"] entries (first,
    count, base, len, stride), which expand to layout["rows"] rows; layout["cuts"] and
    layout["lengths"] the exchange groups' sides in the rows, then the merged calls' rows as one last
    piece (they tile the rows). ``kinds`` (to_device's, per pass): the merged
    calls' and descriptor records the layout holds are those these name (all when None); to_device
    asks the program for others when first read."""
    if kinds is not None:
        want = {"descriptors" if k == "descriptors_host" else k for per in kinds for k in per}
        kinds = [k for k in _PAIR_KINDS if k in want]
    _runs, host, layout = program.index_arrays(kinds)
    return torch.from_numpy(host), layout


def expand(cols, host_cols, n, device):
    """The rows, int32 [n] on ``device``, from the runs' columns (int32 [5, R]: first, count, base,
    len, stride) on the device (``cols``) and on the host (``host_cols``, numpy): entry first + k of
    a run is base + (k // len) * stride + k % len. One kernel launch on CUDA (Triton), the binding's
    C++ on the CPU (without the GIL); on meta the launch's output alone; elsewhere torch ops in steps
    (``expand_ops``). No host read of a device value."""
    if device.type == "meta":
        return torch.empty(n, dtype=torch.int32, device=device)
    if device.type == "cpu":
        out = torch.empty(n, dtype=torch.int32)
        _libra.expand_runs(host_cols, out.numpy())
        return out
    if device.type == "cuda":
        kernel = _triton_expand()
        if kernel is not None:
            return kernel(cols, n)
    return expand_ops(cols, host_cols, n, device)


@functools.cache
def _triton_expand():
    """triton_index.expand, or None where Triton is not installed."""
    try:
        from . import triton_index  # noqa: PLC0415 - Triton loads only when a CUDA runtime needs it
    except ImportError:
        return None
    return triton_index.expand


# Entries of the rows one step of expand_ops makes: bounds the device's temporaries (about three int32 an entry: 0.75 GiB at most).
_BATCH = 1 << 26


def _run_columns(host_cols, n):
    """What ``expand_ops`` reads, per run (int32 [5, R]): its rows (count / len), its first row among
    all the runs' rows, its len, and d0, d1 such that an entry of its row r holds the entry's own
    index plus d0 + r * d1 (base - first and stride - len: every value fits int32, as the positions
    do); and the steps (first run, end run, first row, end row, first entry, end entry), each up to
    _BATCH entries unless one run is longer. O(runs) numpy on the host."""
    first, count, base, ln, stride = host_cols.astype(np.int64)
    nrows = count // ln
    ends = np.cumsum(nrows)
    rowfirst = ends - nrows
    cols = np.stack([nrows, rowfirst, ln, base - first, stride - ln]).astype(np.int32)
    steps, i0 = [], 0
    while i0 < len(first):
        i1 = max(int(np.searchsorted(first, first[i0] + _BATCH, "left")), i0 + 1)
        e1 = int(first[i1]) if i1 < len(first) else n
        steps.append((i0, i1, int(rowfirst[i0]), int(ends[i1 - 1]), int(first[i0]), e1))
        i0 = i1
    return cols, steps


def expand_ops(_cols, host_cols, n, device):
    """``expand`` with torch ops, for devices with no kernel for it: a constant number of ops per
    step of up to _BATCH entries (two repeat_interleaves with their output sizes given, the rest
    index and add ops, no division); the steps' sizes come from the host."""
    cols, steps = _run_columns(host_cols, n)
    out = torch.empty(n, dtype=torch.int32, device=device)
    nrows, rowfirst, ln, d0, d1 = torch.from_numpy(cols).to(device).unbind(0)
    for i0, i1, r0, r1, e0, e1 in steps:
        run = torch.repeat_interleave(nrows[i0:i1], output_size=r1 - r0)  # each row's run (in this step)
        r = torch.arange(r0, r1, dtype=torch.int32, device=device) - rowfirst[i0:i1][run]
        delta = torch.repeat_interleave(d0[i0:i1][run] + r * d1[i0:i1][run], ln[i0:i1][run], output_size=e1 - e0)
        torch.add(torch.arange(e0, e1, dtype=torch.int32, device=device), delta, out=out[e0:e1])
    return out


EXCHANGE_KINDS = ("in", "out", "stage", "apply", "sides")
ALL_KINDS = EXCHANGE_KINDS + ("varlen", "joined", "descriptors", "descriptors_host")


def to_device(host, layout, device, kinds=(ALL_KINDS, ALL_KINDS), program=None):
    """The index arrays on ``device``: [pass] = {"in", "out", "stage": [chunk] exchange (send and recv
    counts per class, gather, local, scatter groups, "sides"), "apply": groups, "sides": every group
    side's rows (``sides``), "varlen" and "joined": [chunk] [Pair],
    "descriptors": [chunk] (table [rows, 10], bounds [5]) (libra.torch.descriptors' format),
    "descriptors_host": the same as numpy int64 arrays}, each pass's ``kinds[pass]`` made here and
    any other kind when first read (from ``program``'s whole layout where ``layout`` left its
    records out: host_arrays' ``kinds``); and the device tensors the views share (their bytes: the
    index memory of the worker on that device)."""
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
    nd, nr = layout["data"], layout["runs"]
    rows = expand(dev[nd:].view(5, nr), host_np[nd:].reshape(5, nr), layout["rows"], device)
    # One split cuts every group side (the binding lists them, then the merged calls' rows as one last
    # piece: they tile the rows in order).
    cuts = rows.split_with_sizes(layout["lengths"]) if layout["lengths"] else ()
    # The small array's host part (cu_seqlens, descriptor tables): the records' host views are views of
    # the binding's array (the program, which the runtime holds, keeps it alive anyway).
    small = host_np[:nd]
    # pairs: shared by the passes (a backward chunk may have forward's); whole: program's whole layout,
    # fetched when a kind left out of ``layout`` is first read, and kept (the Pairs' keys are its records' ids).
    out, data, pairs, whole = [], dev[:nd], {}, []
    for p, (per, want) in enumerate(zip(layout["passes"], kinds)):
        rec = _Pass(per, p, (program, whole), rows, cuts, data, small, pairs)
        for kind in want:
            rec[kind]  # noqa: B018 - made now, not in a pass
        out.append(rec)
    return out, (dev, rows)


class _Pass(dict):
    """One pass's records on a device, by kind, each made on first read and kept: the exchanges and
    the apply list are the binding's own records (``per``), their groups' rows the cuts (``sides``);
    the merged calls and descriptor tables are made from ``per``, or for a kind the binding's layout
    left out (host_arrays' ``kinds``) from ``program``'s whole layout. ``pairs`` keeps every Pair made
    by its record (a backward chunk with forward's calls has forward's very records: the same Pair
    serves both passes)."""

    def __init__(self, per, p, program, rows, cuts, data, small, pairs):
        super().__init__()
        self._args = per, p, program, rows, cuts, data, small, pairs

    def __missing__(self, kind):
        per, p, program, rows, cuts, data, small, pairs = self._args
        if kind in _KINDS:
            value = per[kind]
            for x in value:
                x["sides"] = cuts
        elif kind == "apply":
            value = per["apply"]
        elif kind == "sides":
            value = cuts
        elif kind in _RECORD_KINDS:
            value = _records(per, p, program, kind, rows, data, small, pairs)
        else:
            raise KeyError(kind)
        self[kind] = value
        return value


_RECORD_KINDS = ("varlen", "joined", "descriptors", "descriptors_host")


def _records(per, p, program, kind, rows, data, small, pairs):
    """The merged calls or descriptor tables of pass p (_Pass's), from the binding's layout ``per`` or
    (a kind it left out) the program's whole layout (``program``: the program and a list keeping that
    layout once fetched)."""
    src = "descriptors" if kind == "descriptors_host" else kind
    if src not in per:
        prog, whole = program
        if not whole:
            whole.append(prog.index_arrays()[2])
        per = whole[0]["passes"][p]
    if kind in ("varlen", "joined"):
        return [[_pair(pairs, rec, rows, data, small) for rec in chunk] for chunk in per[kind]]
    if kind == "descriptors":
        return [(_i64(data, t, 10 * n).view(n, 10), _i64(data, b, 5)) for t, n, b in per["descriptors"]]
    # The same tables on the host, for what plans launches from them (the triton backend's work rows
    # and grids) without reading the device back: views of the small array on the host.
    return [_desc_host(small, t, n, b, False) for t, n, b in per["descriptors"]]


def _pair(pairs, rec, rows, data, small):
    """The Pair of the record ``rec`` (a dict the layout keeps alive, so its id is its own)."""
    p = pairs.get(id(rec))
    if p is None:
        p = pairs[id(rec)] = Pair(rec, rows, data, small)
    return p


def _desc_host(host_np, t, rows, b, copy):
    """A chunk's (table [rows, 10], bounds [5]) int64 from the int32 numpy array ``host_np``: views,
    or copies (which do not keep the whole host array alive)."""
    table, bounds = host_np[t:t + 20 * rows].view(np.int64).reshape(rows, 10), host_np[b:b + 10].view(np.int64)
    return (table.copy(), bounds.copy()) if copy else (table, bounds)


def descriptors_host(host, layout, pass_index, m):
    """Chunk m's descriptor table and bounds as numpy arrays (host views), for checks."""
    t, rows, b = layout["passes"][pass_index]["descriptors"][m]
    return _desc_host(host.numpy(), t, rows, b, False)


def nbytes(tensors):
    """The device bytes of to_device's tensors (the small array and runs, and the rows)."""
    return sum(t.numel() * t.element_size() for t in tensors)

