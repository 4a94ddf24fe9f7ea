"""The exchanges of the per-rank schedule carried out with torch collectives: pack,
post (async all_to_all_single), unpack and apply, by index tensors on any device or by
the binding's C++ programs on CPU tensors."""
import numpy as np
import torch
import torch.distributed as dist

from .trace import _watch


def _wire(x):
    """gloo has no bf16: send 16-bit floats as their bytes."""
    return x.view(torch.uint8) if x.dtype in (torch.bfloat16, torch.float16) else x


def _a2a(out, inp, out_splits, in_splits, group):
    """Async all_to_all_single of row buffers (splits count rows); returns the work."""
    return dist.all_to_all_single(_wire(out), _wire(inp), list(out_splits), list(in_splits), group=group,
                                  async_op=True)


# ---------------------------------------------------------------- exchanges

_FWD_IN, _FWD_OUT, _BWD_IN, _BWD_OUT = range(4)
# Element classes of the binding's sub-messages (one all_to_all_single each): the data type,
# LSE (fp32, 1 wide) and gradients (fp32); which a phase carries is fixed, so every rank posts the
# same collectives even when its own part is empty.
_PHASE_CLASSES = {_FWD_IN: (0,), _FWD_OUT: (0, 1), _BWD_IN: (0, 1), _BWD_OUT: (2,)}
_PHASE_NAMES = {_FWD_IN: "fwd in", _FWD_OUT: "fwd out", _BWD_IN: "bwd in", _BWD_OUT: "bwd out"}


def _index_tensors(sd):
    """The binding's schedule dict as the index tensors the passes use."""
    def t(a):
        return torch.from_numpy(np.array(a, dtype=np.int64))  # a writable copy of the read-only array

    def side(x):
        return {"splits": x["splits"],
                "fields": [(f["field"], f["class"], f["add"], t(f["pos"]), t(f["idx"])) for f in x["fields"]]}

    phases = []
    for p, per_chunk in enumerate(sd["exchanges"]):
        phase = {"chunks": [{"send": side(e["send"]), "recv": side(e["recv"])} for e in per_chunk]}
        if p in (_FWD_OUT, _BWD_OUT):
            phase["apply"] = _apply_plan(per_chunk, sd["apply_order"], sd["workers"])
        phases.append(phase)
    return {"phases": phases, "calls": sd["calls"]}


def _apply_plan(per_chunk, apply_order, workers):
    """Out phases: each field's received pieces of every chunk, in the schedule's apply order (peer,
    chunk), as positions into the chunks' class buffers concatenated in chunk order."""
    M = len(per_chunk)
    rank = np.zeros(workers * M, dtype=np.int64)
    for i, (peer, m) in enumerate(apply_order):
        rank[peer * M + m] = i
    offsets = {}
    for c in range(3):
        acc = 0
        for m, e in enumerate(per_chunk):
            offsets[(c, m)] = acc
            acc += sum(e["recv"]["splits"][c])
    entries = {}
    for m, e in enumerate(per_chunk):
        for f in e["recv"]["fields"]:
            key = (f["field"], f["class"], f["add"])
            pos = f["pos"] + offsets[(f["class"], m)]
            order = rank[f["peer"] * M + m]
            entries.setdefault(key, []).append((order, pos, f["idx"]))
    out = []
    for (field, cls, add), parts in entries.items():
        order = np.concatenate([o for o, _, _ in parts])
        pos = np.concatenate([p for _, p, _ in parts])
        idx = np.concatenate([i for _, _, i in parts])
        perm = np.argsort(order, kind="stable")
        out.append((field, cls, add, torch.from_numpy(pos[perm].copy()), torch.from_numpy(idx[perm].copy())))
    return out


def _class_layout(c, dtype, d):
    return (dtype, d) if c == 0 else (torch.float32, 1 if c == 1 else d)


def _post(rt, phase, m, ex, bufs, dtype, d, device):
    """Packs and posts (async) one (phase, chunk)'s sub-messages; returns [(class, work, recv)]."""
    posted = []
    for c in _PHASE_CLASSES[phase]:
        dt, width = _class_layout(c, dtype, d)
        send = torch.empty((sum(ex["send"]["splits"][c]), width), dtype=dt, device=device)
        for field, cls, _add, pos, idx in ex["send"]["fields"]:
            if cls == c:
                send.index_copy_(0, pos, bufs[field].index_select(0, idx))
        recv = torch.empty((sum(ex["recv"]["splits"][c]), width), dtype=dt, device=device)
        work = _a2a(recv, send, ex["recv"]["splits"][c], ex["send"]["splits"][c], rt.group)
        posted.append((c, _watch(rt, work, f"{_PHASE_NAMES[phase]} chunk {m} class {c}"), recv))
    return posted


def _unpack_in(ex, posted, bufs):
    recvs = {}
    for c, work, recv in posted:
        work.wait()
        recvs[c] = recv
    for field, cls, _add, pos, idx in ex["recv"]["fields"]:
        bufs[field].index_copy_(0, idx, recvs[cls].index_select(0, pos))


def _unpack_out(apply, posted_by_chunk, bufs):
    """Waits for every chunk's Out sub-messages and applies them in the schedule's fixed order, so
    the fp32 sums of dK/dV do not depend on arrival order."""
    per_class = {}
    for posted in posted_by_chunk:
        for c, work, recv in posted:
            work.wait()
            per_class.setdefault(c, []).append(recv)
    cat = {c: torch.cat(v) for c, v in per_class.items()}
    for field, cls, add, pos, idx in apply:
        rows = cat[cls].index_select(0, pos)
        if add:
            bufs[field].index_add_(0, idx, rows)
        else:
            bufs[field].index_copy_(0, idx, rows)


def _ptrs(bufs):
    return {name: (t.data_ptr(), t.shape[0]) for name, t in bufs.items()}


def _post_cpu(rt, phase, m, bufs, dtype, d):
    """CPU: packs one (phase, chunk)'s sub-messages with the C++ programs and posts them."""
    posted = []
    data_bytes = torch.empty(0, dtype=dtype).element_size()
    ptrs = _ptrs(bufs)
    for c in _PHASE_CLASSES[phase]:
        dt, width = _class_layout(c, dtype, d)
        send_splits, recv_splits = rt.splits[(phase, m, c)]
        send = torch.empty((sum(send_splits), width), dtype=dt)
        rt.programs.pack(phase, m, c, ptrs, send.data_ptr(), send.shape[0], data_bytes)
        recv = torch.empty((sum(recv_splits), width), dtype=dt)
        work = _a2a(recv, send, recv_splits, send_splits, rt.group)
        posted.append((c, _watch(rt, work, f"{_PHASE_NAMES[phase]} chunk {m} class {c}"), recv))
    return posted


def _unpack_in_cpu(rt, phase, m, posted, bufs, dtype):
    data_bytes = torch.empty(0, dtype=dtype).element_size()
    ptrs = _ptrs(bufs)
    for c, work, recv in posted:
        work.wait()
        rt.programs.unpack(phase, m, c, ptrs, recv.data_ptr(), recv.shape[0], data_bytes)


def _unpack_out_cpu(rt, phase, posted_by_chunk, bufs, dtype):
    data_bytes = torch.empty(0, dtype=dtype).element_size()
    ptrs = _ptrs(bufs)
    per_class = {}
    for posted in posted_by_chunk:
        for c, work, recv in posted:
            work.wait()
            per_class.setdefault(c, []).append(recv)
    for c, recvs in per_class.items():
        rt.programs.apply(phase, c, ptrs, [(r.data_ptr(), r.shape[0]) for r in recvs], data_bytes)
