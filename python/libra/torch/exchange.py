"""The exchanges of the worker's flat program (libra/program.hpp) carried out with torch ops on any
device: gather (index_select into the message), post (an async all-to-all on the runtime's
communicator, one per element class), the data kept (buffer to buffer), scatter, and the Out
phases' apply list (index_put_ / index_add_ in the program's fixed order). A relayed program
also has stage exchanges (home -> the relay's staging buffer), which carry an In phase's classes.
Nothing here derives positions: the binding gives them (each group the binding's tuple, its rows
the pass's cuts: ``index.sides``)."""
import torch

from .index import sides
from .trace import _watch

# Element classes a pass's exchanges carry (the program's wire_class): 0 the data type, 1 LSE (fp32,
# 1 wide), 2 gradients (fp32). Fixed per (pass, direction), so every rank posts the same collectives
# even when its own part is empty.
_CLASSES = {(0, "in"): (0,), (0, "out"): (0, 1), (1, "in"): (0, 1), (1, "out"): (2,),
            (0, "stage"): (0,), (1, "stage"): (0, 1)}
_NAMES = {(0, "in"): "fwd in", (0, "out"): "fwd out", (1, "in"): "bwd in", (1, "out"): "bwd out",
          (0, "stage"): "fwd stage", (1, "stage"): "bwd stage"}
_TRACE = {"in": "input", "out": "output", "stage": "stage"}  # the C++ engine's trace words
_HOME, _COMPUTE, _WIRE, _STAGE = range(4)  # the program's Loc (bufs is indexed by it)


def _class_layout(c, dtype, d):
    return (dtype, d) if c == 0 else (torch.float32, 1 if c == 1 else d)


def _read(t, rows):
    """t's rows: an index, or a slice (rows 0 .. n-1: all of t, or a view of them, no op on the device)."""
    if isinstance(rows, slice):
        return t if rows.stop == t.shape[0] else t[rows]
    return t.index_select(0, rows)


def _write(t, rows, values, add=False):
    """Writes (adds) values into t's rows (an index or a slice, as _read)."""
    if isinstance(rows, slice):
        view = t if rows.stop == t.shape[0] else t[rows]
        view.add_(values) if add else view.copy_(values)
    elif add:
        t.index_add_(0, rows, values)
    else:
        t.index_put_((rows,), values)


def post(rt, pass_index, kind, m, x, bufs, dtype, d, device):
    """Gathers and posts (async) one (pass, kind, chunk)'s class messages (kind "in", "out" or
    "stage"); an In exchange also copies the data this worker keeps. Returns [(class, work, recv)]."""
    sends, groups, cuts = {}, {}, x["sides"]
    for g in x["gather"]:
        groups.setdefault(g[4], []).append(g)
    for c in _CLASSES[(pass_index, kind)]:
        total = sum(x["send"][c])
        gs = groups.get(c, ())
        if len(gs) == 1 and gs[0][8] & 2 and gs[0][7] == total:
            # One group fills the whole message in order: the message is its gather (a fresh tensor,
            # never a live buffer the next chunk's compute may write while the transfer reads it).
            field, src = gs[0][0], gs[0][1]
            sidx, _didx = sides(cuts, gs[0])
            rows = _read(bufs[src][field], sidx)
            sends[c] = rows.clone() if isinstance(sidx, slice) else rows
            continue
        dt, width = _class_layout(c, dtype, d)
        sends[c] = torch.empty((total, width), dtype=dt, device=device)
        for g in gs:
            sidx, didx = sides(cuts, g)
            _write(sends[c], didx, _read(bufs[g[1]][g[0]], sidx))
    posted = []
    for c, send in sends.items():
        recv = torch.empty((sum(x["recv"][c]), send.shape[1]), dtype=send.dtype, device=device)
        work = rt.comm.all_to_all(recv, send, x["recv"][c], x["send"][c], rt.group)
        trace = f"{'fwd' if pass_index == 0 else 'bwd'} {_TRACE[kind]} chunk {m} class {c}"
        posted.append((c, _watch(rt, work, f"{_NAMES[(pass_index, kind)]} chunk {m} class {c}", trace), recv))
    for g in x["local"]:
        sidx, didx = sides(cuts, g)
        _write(bufs[g[2]][g[0]], didx, _read(bufs[g[1]][g[0]], sidx))
    return posted


def scatter(x, posted, bufs):
    """Waits for an In or stage exchange and scatters its receipts into the compute (staging) buffers."""
    recvs = {}
    for c, work, recv in posted:
        work.wait()
        recvs[c] = recv
    for g in x["scatter"]:
        sidx, didx = sides(x["sides"], g)
        _write(bufs[g[2]][g[0]], didx, _read(recvs[g[4]], sidx))


def apply(groups, posted_by_chunk, bufs, cuts):
    """Waits for every chunk's Out exchange and applies the receipts and the outputs kept in the
    program's fixed order, so the fp32 sums of dK/dV do not depend on arrival order (``cuts``: the
    pass's "sides")."""
    per_class = {}
    for posted in posted_by_chunk:
        for c, work, recv in posted:
            work.wait()
            per_class.setdefault(c, []).append(recv)
    for g in groups:
        field, dst, add, c = g[0], g[2], g[3], g[4]
        sidx, didx = sides(cuts, g)
        # One source per field: every chunk's class messages, then the field's compute buffer.
        source = torch.cat(per_class.get(c, []) + [bufs[_COMPUTE][field]])
        _write(bufs[dst][field], didx, _read(source, sidx), add)
