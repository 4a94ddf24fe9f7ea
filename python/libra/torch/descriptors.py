"""The kernel descriptor table of one pipeline chunk: every fragment of every kernel call of the
chunk as one row of plain integers, the format libra's tile-list kernels read (the triton backend)
and the binding builds (``_libra``'s per-micro-batch index arrays).

One row per non-empty fragment (a < e), ``COLUMNS`` wide, int64:

    q_off, q_stride, kv_off, kv_stride, q_row, kv_row, a, e, hq, hkv

- ``q_off, q_stride`` / ``kv_off, kv_stride``: the call's strided programs over head vectors
  (``libra/schedule.hpp``'s ``Strided``: vector ``offset + row * stride + head``);
- ``q_row, kv_row, a, e``: the fragment (``QueryFragment``): sample-local queries [a, e) at rows
  ``q_row ..`` of the Q family, the sample's keys 0 .. e-1 at rows ``kv_row ..`` of the KV family;
- ``hq, hkv``: the call's query and KV heads (the programs' runs); q head h reads KV head
  ``h // (hq // hkv)``.

So query i (a <= i < e) of q head h is head vector ``q_off + (q_row + i - a) * q_stride + h`` of
Q, O, LSE, dO, dQ; key j (0 <= j < e) of KV head g is ``kv_off + (kv_row + j) * kv_stride + g`` of
K, V, dK, dV.

Rows are grouped by the buffers they address, in ``PAIRS`` order ((q_home, kv_home) = (0, 0),
(0, 1), (1, 0), (1, 1)), and in the schedule's call and fragment order within a group; ``bounds``
(5 entries) delimits the groups: pair g is rows ``bounds[g]:bounds[g + 1]``.

    table, bounds = chunk_descriptors(rt.schedule["calls"][0][m])
"""
import numpy as np

COLUMNS = ("q_off", "q_stride", "kv_off", "kv_stride", "q_row", "kv_row", "a", "e", "hq", "hkv")
PAIRS = ((False, False), (False, True), (True, False), (True, True))


def chunk_descriptors(calls):
    """(table int64 [F, 10], bounds int64 [5]) of a chunk's kernel calls (the schedule's
    ``(q program, kv program, fragments, q_home, kv_home)`` tuples). The reference builder."""
    groups = {pair: [] for pair in PAIRS}
    for qp, kp, frags, q_home, kv_home in calls:
        f = np.asarray(frags, dtype=np.int64).reshape(-1, 5)
        f = f[f[:, 4] > f[:, 3]]
        if not len(f):
            continue
        rows = np.empty((len(f), len(COLUMNS)), dtype=np.int64)
        rows[:, 0], rows[:, 1] = qp[0], qp[3]
        rows[:, 2], rows[:, 3] = kp[0], kp[3]
        rows[:, 4], rows[:, 5], rows[:, 6], rows[:, 7] = f[:, 0], f[:, 1], f[:, 3], f[:, 4]
        rows[:, 8], rows[:, 9] = qp[2], kp[2]
        groups[(bool(q_home), bool(kv_home))].append(rows)
    parts = [np.concatenate(groups[p]) if groups[p] else np.empty((0, len(COLUMNS)), np.int64) for p in PAIRS]
    bounds = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return np.ascontiguousarray(np.concatenate(parts)), bounds
