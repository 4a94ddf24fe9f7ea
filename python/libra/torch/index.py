"""The worker's index arrays on a device: everything a pass indexes with (every exchange's gather,
local and scatter rows, the apply rows, every chunk's merged varlen calls and kernel descriptor
table), built by the binding once per micro-batch (``RankProgram.index_arrays``,
python/src/program_index.hpp, without the GIL): the head-vector rows as strided runs (a few ints per
run, not one per row) and a small int32 array (cu_seqlens, the descriptor tables as int64). Both go
to the device in one copy (from one pinned host buffer, non-blocking, on CUDA); the device expands
the runs into the rows with a constant number of ops per batch of runs (``expand``), and the records
are cut into views here. Nothing in a pass builds, copies or reads back an index."""
import numpy as np
import torch

_KINDS = ("in", "out", "stage")


def _groups(cut, groups):
    """(field, src, dst, add, class, src rows, dst rows) per index op: views of the rows (``cut``); a
    side whose rows are 0 .. n-1 is the slice ``slice(0, n)`` instead (exchange.py then reads or
    writes the message's first n rows without an index op)."""
    return [(field, src, dst, add, cls, slice(0, n) if ident & 1 else cut(s, n),
             slice(0, n) if ident & 2 else cut(d, n)) for field, src, dst, add, cls, s, d, n, ident in groups]


def _cutter(rows, layout):
    """cut(off, n): rows[off:off + n]. Every group side and merged call side of ``layout`` is made
    by one split of the rows (they tile it in order: one op where a slice each would be hundreds)."""
    sides = {}
    for per in layout["passes"]:
        for groups in [per["apply"]] + [x[k] for kind in _KINDS for x in per[kind] for k in ("gather", "local", "scatter")]:
            for *_, s, d, n, _ident in groups:
                sides[s] = sides[d] = n
        for chunk in per["varlen"]:  # (a joined call's rows span its pairs': cut apart)
            for r in chunk:
                sides[r["q_off"]] = r["total_q"] * r["hq"]
                sides[r["kv_off"]] = r["total_k"] * r["hkv"]
    offs = sorted(o for o, n in sides.items() if n)
    lengths = [sides[o] for o in offs]
    if offs and offs[0] == 0 and sum(lengths) == rows.shape[0] and all(
            b == a + n for a, b, n in zip(offs, offs[1:], lengths)):
        views = dict(zip(offs, rows.split(lengths)))
    else:  # not a tiling (no layout the binding makes): a slice each
        views = {}

    def cut(off, n):
        view = views.get(off)
        return view if view is not None and n == sides[off] else rows[off:off + n]
    return cut


def _i64(t, off, n):
    """n int64 values stored as 2n int32 entries at ``off`` (even) of ``t`` (a view)."""
    return t[off:off + 2 * n].view(torch.int64)


class Pair:
    """One chunk's kernel calls on one (q buffer, kv buffer) pair, merged into one varlen call, or
    (``"joined"``) consecutive pairs of the same head widths joined into one; positions in joined
    buffers (a field's home vectors, then its compute vectors: function.py):
    ``q`` [total_q * hq] and ``kv`` [total_k * hkv] head-vector rows (query- or key-major), ``lse2``
    [hq, total_q] the q vectors head-major (flash-attn's LSE layout: a transposed view of ``q2``),
    ``cu_q`` / ``cu_k`` int32 cu_seqlens on the device and ``cu_host`` the same as numpy arrays (host
    loops, no sync)."""

    __slots__ = ("q_home", "kv_home", "hq", "hkv", "total_q", "total_k", "max_q", "max_k", "seqs", "q", "kv",
                 "cu_q", "cu_k", "cu_host", "q2", "kv2", "lse2")

    def __init__(self, rec, cut, dev, host):
        for name in ("q_home", "kv_home", "hq", "hkv", "total_q", "total_k", "max_q", "max_k", "seqs"):
            setattr(self, name, rec[name])
        nq, nk = rec["total_q"] * rec["hq"], rec["total_k"] * rec["hkv"]
        self.q = cut(rec["q_off"], nq)
        self.kv = cut(rec["kv_off"], nk)
        # The same rows shaped as the varlen tensors' leading dims, so one advanced-indexing op gathers
        # [total, heads, d] (or writes it back) with no reshape around it.
        self.q2 = self.q.view(rec["total_q"], rec["hq"])
        self.kv2 = self.kv.view(rec["total_k"], rec["hkv"])
        self.lse2 = self.q2.t()
        n = rec["seqs"] + 1
        self.cu_q = dev[rec["cu_q_off"]:rec["cu_q_off"] + n]
        self.cu_k = dev[rec["cu_k_off"]:rec["cu_k_off"] + n]
        # Copies: a view would keep the whole host array alive after the runtime lets it go.
        self.cu_host = (host[rec["cu_q_off"]:rec["cu_q_off"] + n].numpy().copy(),
                        host[rec["cu_k_off"]:rec["cu_k_off"] + n].numpy().copy())


def host_arrays(program):
    """(host, layout) of ``program``'s index arrays (built once per program, GIL released): host is
    one int32 CPU tensor, the small array (cu_seqlens, descriptor tables) then what ``expand`` reads
    of the runs, five columns of R int32; layout["data"] the small array's length, layout["runs"] R
    and layout["steps"] expand's steps."""
    runs, data, layout = program.index_arrays()
    layout["data"], layout["runs"] = len(data), len(runs)
    cols, layout["steps"] = _run_columns(runs, layout["rows"])
    # One buffer, so one copy reaches the device; the small array first, so its int64 tables stay
    # 8-byte aligned. Kilobytes: the runs, not the rows.
    return torch.from_numpy(np.concatenate([data, cols.reshape(-1)])), layout


# Entries of the rows one expansion step makes: bounds the device's temporaries (about three int32 an entry: 0.75 GiB at most).
_BATCH = 1 << 26


def _run_columns(runs, n):
    """What ``expand`` reads, per run (int32 [5, R]): its rows (count / len), its first row among all
    the runs' rows, its len, and d0, d1 such that an entry of its row r holds the entry's own index
    plus d0 + r * d1 (base - first and stride - len: every value fits int32, as the positions do);
    and the steps (first run, end run, first row, end row, first entry, end entry), each up to
    _BATCH entries unless one run is longer. O(runs) numpy on the host."""
    first, count, base, ln, stride = runs.T.astype(np.int64)
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


def expand(cols, steps, n, device):
    """The rows, int32 [n] on ``device``, from the runs' columns on the device (``_run_columns``):
    entry first + k of a run is base + (k // len) * stride + k % len. A constant number of ops per
    step (one step below 64M entries: two repeat_interleaves, the rest index and add ops; no
    division), with no host read of a device value (the steps' sizes come from the host)."""
    out = torch.empty(n, dtype=torch.int32, device=device)
    nrows, rowfirst, ln, d0, d1 = cols.unbind(0)
    for i0, i1, r0, r1, e0, e1 in steps:
        run = torch.repeat_interleave(nrows[i0:i1], output_size=r1 - r0)  # each row's run (in this step)
        r = torch.arange(r0, r1, dtype=torch.int32, device=device) - rowfirst[i0:i1][run]
        delta = torch.repeat_interleave(d0[i0:i1][run] + r * d1[i0:i1][run], ln[i0:i1][run], output_size=e1 - e0)
        torch.add(torch.arange(e0, e1, dtype=torch.int32, device=device), delta, out=out[e0:e1])
    return out


def to_device(host, layout, device):
    """The index arrays on ``device``: [pass] = {"in", "out", "stage": [chunk] exchange (send and recv
    counts per class, gather, local, scatter), "apply": groups, "varlen": [chunk] [Pair],
    "descriptors": [chunk] (table [rows, 10], bounds [5]) (libra.torch.descriptors' format),
    "descriptors_host": the same as numpy int64 arrays}, and
    the device tensors the views share (their bytes: the index memory of the worker on that device)."""
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
    data = dev[:nd]
    rows = expand(dev[nd:].view(5, nr), layout["steps"], layout["rows"], device)
    cut = _cutter(rows, layout)
    out = []
    for per in layout["passes"]:
        p = {}
        for kind in _KINDS:
            p[kind] = [{"send": x["send"], "recv": x["recv"],
                        **{k: _groups(cut, x[k]) for k in ("gather", "local", "scatter")}} for x in per[kind]]
        p["apply"] = _groups(cut, per["apply"])
        p["varlen"] = [[Pair(rec, cut, data, host) for rec in chunk] for chunk in per["varlen"]]
        p["joined"] = [[Pair(rec, cut, data, host) for rec in chunk] for chunk in per["joined"]]
        p["descriptors"] = [(_i64(data, t, 10 * n).view(n, 10), _i64(data, b, 5)) for t, n, b in per["descriptors"]]
        # The same tables on the host, for what plans launches from them (the triton backend's work
        # rows and grids) without reading the device back; copies off the CPU, as cu_host.
        copy = device.type != "cpu"
        p["descriptors_host"] = [_desc_host(host_np, t, n, b, copy) for t, n, b in per["descriptors"]]
        out.append(p)
    return out, (dev, rows)


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

