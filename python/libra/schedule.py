"""libra.schedule: one worker's execution schedule of a Plan as index arrays (numpy, torch-free).

The schedule says, for worker ``r`` of a plan and every pipeline chunk ``m``,
which rows of its home Q/K/V go to which peer in one all-to-all-v, where the
rows it receives land, and which kernel calls it then runs; and, for the
backward pass, how dO/dQ travel (like Q/O) and where the dK/dV partial sums
go back (the KV transfers reversed). Everything is derived from the plan's
tiles, fragments, groups and chunk transfers, so every worker of a pool
computes matching send and receive lists from the same plan.

Rows are vectors of ``head_dim`` elements. A worker's home tensors are
``q: [L/CP, h_q, d]`` and ``k, v: [L/CP, h_kv, d]``, flattened to rows
``token * heads + head``; the forward source of a chunk is
``cat(q_rows, k_rows, v_rows)``. Received Q rows of a chunk form the
workspace ``[rows, head_width / M, d]`` (tiles in receive order); received
K/V rows land in the KV store ``[store_tokens, store_heads, d]``, one block of
rows per KV group the worker holds (the whole sample, the group's KV heads).

    s = libra.schedule.build(plan, worker=3, peers=list(range(plan.num_workers)))
    s.chunks[0].send_index, s.chunks[0].send_splits, s.chunks[0].calls
"""
import numpy as np

from . import TRANSFER_KV

_I64 = np.int64


def _rows(begin, end, base, stride, hb, he, hbase):
    """Row indices of tokens [begin, end) x heads [hb, he): (token - base) * stride + head - hbase."""
    t = np.arange(begin, end, dtype=_I64) - base
    h = np.arange(hb, he, dtype=_I64) - hbase
    return (t[:, None] * stride + h[None, :]).ravel()


def _cat(parts):
    return np.concatenate(parts).astype(_I64, copy=False) if parts else np.zeros(0, dtype=_I64)


class ChunkSchedule:
    """Index arrays of one pipeline chunk (see the module docstring)."""

    __slots__ = ("send_index", "send_splits", "recv_splits", "q_send_index", "q_send_splits",
                 "q_recv_splits", "q_select", "kv_recv_k", "kv_recv_v", "kv_store", "calls")


class Schedule:
    """One worker's schedule; built by :func:`build`."""


def build(plan, worker, peers):
    """Builds worker ``worker``'s schedule; ``peers[i]`` is the plan worker of group rank ``i``."""
    cfg = plan.config
    W = plan.num_workers
    if sorted(peers) != list(range(W)):
        raise ValueError(f"schedule peers {list(peers)}: must be a permutation of the plan's {W} workers")
    if not 0 <= worker < W:
        raise ValueError(f"worker {worker}: must be in [0, {W})")
    L, cp = cfg["seq_len"], cfg["cp"]
    hq, hkv, M = cfg["heads_q"], cfg["heads_kv"], cfg["chunks"]
    Lh = L // cp
    width = plan.head_width
    cw = width // M
    ratio = hq // hkv  # query heads per KV head
    tiles = plan.tiles
    frags = plan.fragments
    groups = plan.groups
    n_tiles = len(tiles["id"])

    def home_base(r):
        return (r // cp, (r % cp) * Lh)  # slot, first token

    q_rows, k_rows = Lh * hq, Lh * hkv
    my_slot, my_base = home_base(worker)

    # KV store: one block per group this worker holds, rows token-major, heads minor.
    held = plan.worker_groups(worker)
    store_heads = int(max((groups["kv_heads_end"][g] - groups["kv_heads_begin"][g] for g in held), default=1))
    store_off = {}
    tok = 0
    for g in held:
        store_off[int(g)] = tok
        tok += int(groups["end"][g] - groups["begin"][g])
    store_tokens = tok

    def store_rows(g, begin, end, hb, he):
        return _rows(begin, end, groups["begin"][g] - store_off[g], store_heads, hb, he,
                     groups["kv_heads_begin"][g])

    # Local part of the store: tokens of held groups that are this worker's home tokens.
    self_src, self_dst = [], []
    for g in held:
        g = int(g)
        if groups["slot"][g] != my_slot:
            continue
        b = max(int(groups["begin"][g]), my_base)
        e = min(int(groups["end"][g]), my_base + Lh)
        if b >= e:
            continue
        hb, he = int(groups["kv_heads_begin"][g]), int(groups["kv_heads_end"][g])
        self_src.append(_rows(b, e, my_base, hkv, hb, he, 0))
        self_dst.append(store_rows(g, b, e, hb, he))

    # Tiles by (home, worker), in tile order.
    by_pair = {}
    for t in range(n_tiles):
        by_pair.setdefault((int(tiles["home"][t]), int(tiles["worker"][t])), []).append(t)

    def q_items(src, dst, m):
        """Q rows (indices into src's q rows) that src sends dst in chunk m, and the tiles."""
        parts, ts = [], []
        base = home_base(src)[1]
        for t in by_pair.get((src, dst), ()):
            c0 = int(tiles["heads_begin"][t]) + m * cw
            parts.append(_rows(int(tiles["begin"][t]), int(tiles["end"][t]), base, hq, c0, c0 + cw, 0))
            ts.append(t)
        return parts, ts

    def kv_items(m, src, dst):
        if src == dst:
            return []
        x = plan.chunk_transfers(m, src, dst)
        sel = np.nonzero(x["kind"] == TRANSFER_KV)[0]
        return [(int(x["group"][i]), int(x["begin"][i]), int(x["end"][i]), int(x["heads_begin"][i]),
                 int(x["heads_end"][i])) for i in sel]

    my_tiles = [int(t) for t in plan.worker_tiles(worker)]
    window = cfg["window"]
    sched = Schedule()
    sched.worker, sched.peers = worker, list(peers)
    sched.home_rows, sched.heads_q, sched.heads_kv, sched.head_dim = Lh, hq, hkv, cfg["head_dim"]
    sched.chunk_heads, sched.num_chunks = cw, M
    sched.q_rows, sched.k_rows = q_rows, k_rows
    sched.store_tokens, sched.store_heads = store_tokens, store_heads
    sched.self_src, sched.self_dst = _cat(self_src), _cat(self_dst)
    sched.window = window
    sched.chunks = []
    dkv_send = {p: [] for p in range(len(peers))}   # group rank -> store rows this worker returns
    dkv_recv = {p: [] for p in range(len(peers))}   # group rank -> home k rows it adds into

    for m in range(M):
        c = ChunkSchedule()
        send, send_splits, q_send, q_splits = [], [], [], []
        for dst in peers:
            qp, _ = q_items(worker, dst, m)
            kp = [_rows(b, e, my_base, hkv, hb, he, 0) for (_, b, e, hb, he) in kv_items(m, worker, dst)]
            qi, ki = _cat(qp), _cat(kp)
            send += [qi, q_rows + ki, q_rows + k_rows + ki]
            send_splits.append(len(qi) + 2 * len(ki))
            q_send.append(qi)
            q_splits.append(len(qi))
        c.send_index, c.send_splits = _cat(send), send_splits
        c.q_send_index, c.q_send_splits = _cat(q_send), q_splits

        recv_splits, q_recv_splits, q_sel, kv_k, kv_v, kv_dst = [], [], [], [], [], []
        tile_row = {}
        ws_rows = 0
        off = 0
        for gi, src in enumerate(peers):
            qp, ts = q_items(src, worker, m)
            nq = sum(len(p) for p in qp)
            q_sel.append(off + np.arange(nq, dtype=_I64))
            for t in ts:
                tile_row[t] = ws_rows
                ws_rows += int(tiles["end"][t] - tiles["begin"][t])
            items = kv_items(m, src, worker)
            dst_rows = [store_rows(g, b, e, hb, he) for (g, b, e, hb, he) in items]
            nk = sum(len(p) for p in dst_rows)
            kv_k.append(off + nq + np.arange(nk, dtype=_I64))
            kv_v.append(off + nq + nk + np.arange(nk, dtype=_I64))
            kv_dst += dst_rows
            dkv_send[gi] += dst_rows
            # The rows of this worker's home it sent src in chunk m: src returns their partial sums.
            dkv_recv[gi] += [_rows(b, e, my_base, hkv, hb, he, 0) for (_, b, e, hb, he) in kv_items(m, worker, src)]
            recv_splits.append(nq + 2 * nk)
            q_recv_splits.append(nq)
            off += nq + 2 * nk
        c.recv_splits, c.q_recv_splits = recv_splits, q_recv_splits
        c.q_select = _cat(q_sel)
        c.kv_recv_k, c.kv_recv_v, c.kv_store = _cat(kv_k), _cat(kv_v), _cat(kv_dst)

        # Kernel calls: fragments grouped by (query-head offset, count, store head offset, count).
        calls = {}
        for t in my_tiles:
            c0 = int(tiles["heads_begin"][t]) + m * cw
            segs = []
            if cw % ratio == 0 and c0 % ratio == 0:
                segs.append((0, cw, c0 // ratio, cw // ratio))
            else:
                for kvh in range(c0 // ratio, (c0 + cw - 1) // ratio + 1):
                    b = max(c0, kvh * ratio)
                    e = min(c0 + cw, (kvh + 1) * ratio)
                    segs.append((b - c0, e - b, kvh, 1))
            for f in range(int(tiles["fragment_begin"][t]), int(tiles["fragment_end"][t])):
                g = int(frags["group"][f])
                start = int(frags["sample_start"][f])
                a, e = int(frags["a"][f]), int(frags["e"][f])
                q_row = tile_row[t] + start + a - int(tiles["begin"][t])
                kv_row = store_off[g] + start - int(groups["begin"][g])
                row = (q_row, kv_row, int(frags["sample_length"][f]), a, e)
                for (qo, qn, kvh, kn) in segs:
                    key = (qo, qn, kvh - int(groups["kv_heads_begin"][g]), kn)
                    calls.setdefault(key, []).append(row)
        c.calls = [(k, np.asarray(v, dtype=_I64).reshape(-1, 5)) for k, v in sorted(calls.items())]
        sched.workspace_rows = ws_rows
        sched.chunks.append(c)

    # Backward dK/dV return, per peer [dK rows, dV rows]: send indices into cat(dK store, dV store)
    # rows, receive indices into cat(home dk rows, home dv rows).
    store_rows_total = store_tokens * store_heads
    send, recv, send_splits, recv_splits = [], [], [], []
    for p in range(len(peers)):
        si, ri = _cat(dkv_send[p]), _cat(dkv_recv[p])
        send += [si, store_rows_total + si]
        recv += [ri, k_rows + ri]
        send_splits.append(2 * len(si))
        recv_splits.append(2 * len(ri))
    sched.dkv_send_index, sched.dkv_send_splits = _cat(send), send_splits
    sched.dkv_recv_index, sched.dkv_recv_splits = _cat(recv), recv_splits
    return sched
