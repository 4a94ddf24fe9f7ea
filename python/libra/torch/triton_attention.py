"""libra's tile-list attention kernels in Triton: forward and backward of every kernel call of one
pipeline chunk in one launch per buffer pair, reading and writing the pass's buffers in place.

The kernels read the chunk's descriptor table (``libra.torch.descriptors``: one int64 row per
fragment, ``q_off, q_stride, kv_off, kv_stride, q_row, kv_row, a, e, hq, hkv``) and a work table
derived from it once (``WorkTables``): one int64 row ``(fragment, start)`` per query block (forward,
delta, dQ) or key block (dK/dV) of every fragment, so a long fragment is many programs. The grid is
work rows x heads (q heads; KV heads for dK/dV, each looping over its group's q heads).

Semantics are the C++ kernel's (``libra/kernel.hpp``): per fragment, sample-local queries
[a, e) see keys max(0, i - W + 1) .. i (bottom-right causal, libra's window W), GQA q head h reads
KV head ``h // (hq // hkv)``, fp32 accumulation; the forward writes O (storage dtype) and the LSE
(fp32, natural log of the scaled scores); the backward (FlashAttention-2, from O and the LSE, with a
``delta = rowsum(dO * O)`` pre-pass) ASSIGNS dQ (each query row lies in one fragment of a pass)
and ADDS fp32 dK/dV partial sums (fragments share key rows). dK/dV adds are atomic unless
``deterministic``: then the dK/dV work runs in waves whose fragments touch disjoint key vectors, in
a fixed order, with plain read-add-write (more launches, less parallelism per launch).

    from libra.torch import triton_attention as ta
    tables = ta.WorkTables(table, bounds, window=None, config=ta.config(128, torch.bfloat16))
    ta.forward(tables, pair, bq, bk, scale)          # bq/bk: the Q-family and KV-family buffers
    ta.backward(tables, pair, bq, bk, scale)

Under ``TRITON_INTERPRET=1`` (set before triton is imported) the same kernels run on CPU tensors.
"""
import contextlib
import math
import threading
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

# A window for plain causal attention: larger than any sample, small enough to stay a 32-bit
# argument (one compiled variant for windowed and plain causal calls).
NO_WINDOW = 1 << 30
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
DESC_COLS = 10


@dataclass(frozen=True)
class Config:
    """Block sizes and launch options of the four kernels for one head dim and dtype."""
    block_m: int      # forward, delta and dQ: queries per program
    block_n: int      # forward and dQ: keys per inner step
    bwd_block_m: int  # dK/dV: queries per inner step
    bwd_block_n: int  # dK/dV: keys per program
    num_warps: int = 4
    num_stages: int = 2


# Block sizes per (padded head dim, bytes per element) for GPU launches: FlashAttention-2's Triton
# tutorial's shapes for 2-byte types, halved where the tiles would not fit an A100's shared memory
# (d 256; fp32 storage, whose ieee dots are a correctness option rather than a fast path). Every
# entry is compiled and its shared memory checked by scripts/triton-aot-check.py.
GPU_CONFIGS = {
    (64, 2): Config(128, 64, 32, 128, num_warps=4, num_stages=3),
    (128, 2): Config(128, 64, 32, 128, num_warps=8, num_stages=2),
    (256, 2): Config(64, 32, 32, 64, num_warps=8, num_stages=1),
    (64, 4): Config(64, 32, 32, 64, num_warps=4, num_stages=2),
    (128, 4): Config(64, 32, 32, 64, num_warps=4, num_stages=1),
    (256, 4): Config(32, 32, 16, 32, num_warps=4, num_stages=1),
}
# Under the interpreter: small blocks (every op is a numpy call; tests want fragments longer than
# a block).
INTERPRET_CONFIG = Config(16, 16, 16, 16, num_warps=1, num_stages=1)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreted():
    """Whether this module's kernels run under Triton's interpreter: TRITON_INTERPRET=1 was set when
    triton decorated them (setting it later changes nothing)."""
    from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415
    return isinstance(_fwd_kernel, InterpretedFunction)


# The interpreter patches triton.language while a kernel runs, so two threads (an in-process pool's
# workers) must not interpret at once; compiled launches need no lock.
_INTERPRETER_LOCK = threading.Lock()


def _launching():
    return _INTERPRETER_LOCK if interpreted() else contextlib.nullcontext()


def padded_head_dim(head_dim):
    """The kernels' HEAD_D: a power of two of at least 16 (tl.arange and tl.dot); the columns past
    head_dim are masked."""
    return max(16, triton.next_power_of_2(int(head_dim)))


def gpu_config(head_d, dtype):
    return GPU_CONFIGS[(max(64, head_d), 4 if dtype == torch.float32 else 2)]


def config(head_dim, dtype):
    """The Config a launch on this process's device kind uses for ``head_dim`` and ``dtype``."""
    if not 1 <= head_dim <= 256:
        raise ValueError(f"libra.torch triton kernel: head_dim {head_dim}: must be 1 .. 256")
    if dtype not in DTYPES:
        raise ValueError(f"libra.torch triton kernel: dtype {dtype}: must be one of float16, bfloat16, float32")
    return INTERPRET_CONFIG if interpreted() else gpu_config(padded_head_dim(head_dim), dtype)


# ---------------------------------------------------------------- kernels

# Every compute kernel walks its inner blocks on one grid (lo + k * block, ascending) in three
# phases: blocks that may hold a masked pair (causal diagonal, window edge, past the fragment's end)
# compute the mask; the blocks between them, where every pair is seen, skip it. Triton inlines the
# helpers below: the kernels compile to the instructions of the code written out in each.

@triton.jit
def _work_item(desc, work):
    """This program's first query (or key), its head (q head; KV head for dK/dV) and its fragment's
    descriptor row as a tuple (descriptors.COLUMNS: q_off, q_stride, kv_off, kv_stride, q_row, kv_row,
    a, e, hq, hkv; the compiler drops the loads of unused columns)."""
    wi = tl.program_id(0)
    f = tl.load(work + 2 * wi)
    start = tl.load(work + 2 * wi + 1)
    row = desc + f * 10
    return start, tl.program_id(1), (tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3), tl.load(row + 4),
                   tl.load(row + 5), tl.load(row + 6), tl.load(row + 7), tl.load(row + 8), tl.load(row + 9))


@triton.jit
def _tile(start, end, first, a, off, stride, head, BLOCK: tl.constexpr, D: tl.constexpr, HEAD_D: tl.constexpr):
    """A program's rows [start, start + BLOCK) of one head (rows from ``end`` on masked; row ``a`` is
    buffer row ``first``): row and column offsets, their masks, the [BLOCK, HEAD_D] mask and the
    rows' buffer vectors."""
    offs = start + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_D)
    d_ok = offs_d < D
    ok = offs < end
    return offs, offs_d, d_ok, ok, ok[:, None] & d_ok[None, :], off + (first + offs - a) * stride + head


@triton.jit
def _at(P, vec, stride, offs_d):
    """Pointers to vectors ``vec`` of buffer P, one row each: [len(vec), HEAD_D]."""
    return P + vec[:, None] * stride + offs_d[None, :]


@triton.jit
def _at_t(P, vec, stride, offs_d):
    """The same, transposed: [HEAD_D, len(vec)]."""
    return P + vec[None, :] * stride + offs_d[:, None]


@triton.jit
def _seen(i, j, window):
    """Whether query i sees key j (broadcast shapes): j <= i and j > i - window."""
    return (j <= i) & (j > i - window)


@triton.jit
def _key_phases(qs, e, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, u0, u1, hi) for the key blocks of the queries [qs, min(qs + BLOCK_M, e)): [lo, u0) and
    [u1, hi) masked, [u0, u1) unmasked (keys <= qs and >= the last query - window + 1)."""
    hi = tl.minimum(qs + BLOCK_M, e)
    lo = tl.maximum(qs - window + 1, 0)
    q_last = hi - 1
    u0 = lo + tl.cdiv(tl.maximum(q_last - window + 1 - lo, 0), BLOCK_N) * BLOCK_N
    u1 = tl.maximum(lo + ((qs + 1 - lo) // BLOCK_N) * BLOCK_N, u0)
    return lo, u0, u1, hi


@triton.jit
def _query_phases(ks, a, e, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, u0, u1, hi) for the query blocks that see a key of [ks, ks + BLOCK_N): i >= j and
    i < j + window. Unmasked query blocks: all past the block's last key, within the window of its
    first, before the fragment's end."""
    lo = tl.maximum(ks, a)
    hi = tl.minimum(e, ks + BLOCK_N - 1 + window)
    u0 = tl.minimum(lo + tl.cdiv(tl.maximum(ks + BLOCK_N - 1 - lo, 0), BLOCK_M) * BLOCK_M, hi)
    u1 = tl.maximum(lo + (tl.maximum(tl.minimum(hi, ks + window) - lo, 0) // BLOCK_M) * BLOCK_M, u0)
    return lo, u0, u1, hi


@triton.jit
def _query_block(Q, stride_q, qs, frag, h, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 HEAD_D: tl.constexpr, DOT_TY: tl.constexpr):
    """A forward or dQ program's query block of head h (one of fragment ``frag``'s): its _tile, its
    queries, its keys' _key_phases, and the vector of its KV head's first key and the key stride."""
    q_off, q_stride, kv_off, kv_stride, q_row, kv_row, a, e, hq, hkv = frag
    g = h // (hq // hkv)
    offs_m, offs_d, d_ok, m_ok, qmask, q_vec = _tile(qs, e, q_row, a, q_off, q_stride, h, BLOCK_M, D, HEAD_D)
    q = tl.load(_at(Q, q_vec, stride_q, offs_d), mask=qmask, other=0.0).to(DOT_TY)
    phases = _key_phases(qs, e, window, BLOCK_M, BLOCK_N)
    return offs_m, offs_d, d_ok, m_ok, qmask, q_vec, q, phases, kv_off + kv_row * kv_stride + g, kv_stride


@triton.jit
def _phases(BLOCKS: tl.constexpr, acc, args, phases, BLOCK: tl.constexpr, PREC: tl.constexpr,
            DOT_TY: tl.constexpr):
    """BLOCKS (a *_blocks loop) over [lo, u0) masked, [u0, u1) unmasked and [u1, hi) masked
    (``phases``: lo, u0, u1, hi); ``acc``: the tuple of accumulators it carries, ``args``: the tuple
    of what it reads."""
    lo, u0, u1, hi = phases
    acc = BLOCKS(acc, args, lo, u0, BLOCK, PREC, DOT_TY, True)
    acc = BLOCKS(acc, args, u0, u1, BLOCK, PREC, DOT_TY, False)
    return BLOCKS(acc, args, u1, hi, BLOCK, PREC, DOT_TY, True)


@triton.jit
def _fwd_blocks(acc, args, start_lo, start_hi, BLOCK_N: tl.constexpr, PREC: tl.constexpr, DOT_TY: tl.constexpr,
                MASK: tl.constexpr):
    o, l_i, m_i = acc
    q, K, V, k_base, kv_stride, stride_k, stride_v, offs_m, offs_d, d_ok, scale_log2, window, hi = args
    for start in range(start_lo, start_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        k_vec = k_base + offs_n * kv_stride
        kt = tl.load(_at_t(K, k_vec, stride_k, offs_d), mask=n_ok[None, :] & d_ok[:, None], other=0.0).to(DOT_TY)
        s = tl.dot(q, kt, input_precision=PREC) * scale_log2
        if MASK:
            s = tl.where(_seen(offs_m[:, None], offs_n[None, :], window) & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row whose keys so far are all outside its window keeps -inf; exp2 of 0 keeps it 0.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(_at(V, k_vec, stride_v, offs_d), mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_TY)
        o = o * alpha[:, None] + tl.dot(p.to(V.dtype.element_ty).to(DOT_TY), v, input_precision=PREC)
        m_i = m_new
    return o, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, desc, work, stride_q, stride_k, stride_v, stride_o, scale_log2, window,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, HEAD_D: tl.constexpr,
                PREC: tl.constexpr, DOT_TY: tl.constexpr):
    qs, h, frag = _work_item(desc, work)
    if h < frag[8]:  # hq
        offs_m, offs_d, d_ok, m_ok, qmask, q_vec, q, phases, k_base, kv_stride = _query_block(
            Q, stride_q, qs, frag, h, window, BLOCK_M, BLOCK_N, D, HEAD_D, DOT_TY)
        acc = (tl.zeros([BLOCK_M, HEAD_D], tl.float32), tl.zeros([BLOCK_M], tl.float32),
               tl.full([BLOCK_M], float("-inf"), tl.float32))
        args = (q, K, V, k_base, kv_stride, stride_k, stride_v, offs_m, offs_d, d_ok, scale_log2, window, phases[3])
        o, l_i, m_i = _phases(_fwd_blocks, acc, args, phases, BLOCK_N, PREC, DOT_TY)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        tl.store(_at(O, q_vec, stride_o, offs_d), (o / l_safe[:, None]).to(O.dtype.element_ty), mask=qmask)
        tl.store(LSE + q_vec, (m_i + tl.log2(l_safe)) * 0.6931471805599453, mask=m_ok)  # natural log


@triton.jit
def _delta_kernel(O, DO, DELTA, desc, work, stride_o, stride_do,
                  BLOCK_M: tl.constexpr, D: tl.constexpr, HEAD_D: tl.constexpr):
    qs, h, frag = _work_item(desc, work)
    q_off, q_stride, _kv_off, _kv_stride, q_row, _kv_row, a, e, hq, _hkv = frag
    if h < hq:
        _offs_m, offs_d, _d_ok, m_ok, qmask, q_vec = _tile(qs, e, q_row, a, q_off, q_stride, h, BLOCK_M, D, HEAD_D)
        o = tl.load(_at(O, q_vec, stride_o, offs_d), mask=qmask, other=0.0)
        do = tl.load(_at(DO, q_vec, stride_do, offs_d), mask=qmask, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(DELTA + q_vec, delta, mask=m_ok)


@triton.jit
def _dq_blocks(acc, args, start_lo, start_hi, BLOCK_N: tl.constexpr, PREC: tl.constexpr, DOT_TY: tl.constexpr,
               MASK: tl.constexpr):
    dq = acc[0]
    q, do, lse2, delta, K, V, k_base, kv_stride, stride_k, stride_v, offs_m, offs_d, d_ok, scale_log2, window, hi = args
    for start in range(start_lo, start_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        k_vec = k_base + offs_n * kv_stride
        kvmask = n_ok[None, :] & d_ok[:, None]
        kt = tl.load(_at_t(K, k_vec, stride_k, offs_d), mask=kvmask, other=0.0).to(DOT_TY)
        vt = tl.load(_at_t(V, k_vec, stride_v, offs_d), mask=kvmask, other=0.0).to(DOT_TY)
        s = tl.dot(q, kt, input_precision=PREC) * scale_log2
        p = tl.exp2(s - lse2[:, None])
        if MASK:
            p = tl.where(_seen(offs_m[:, None], offs_n[None, :], window) & n_ok[None, :], p, 0.0)
        dp = tl.dot(do, vt, input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(K.dtype.element_ty).to(DOT_TY), tl.trans(kt), input_precision=PREC)
    return (dq,)


@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, desc, work, stride_q, stride_k, stride_v, stride_do, stride_dq,
               scale, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, HEAD_D: tl.constexpr,
               PREC: tl.constexpr, DOT_TY: tl.constexpr):
    qs, h, frag = _work_item(desc, work)
    if h < frag[8]:  # hq
        offs_m, offs_d, d_ok, m_ok, qmask, q_vec, q, phases, k_base, kv_stride = _query_block(
            Q, stride_q, qs, frag, h, window, BLOCK_M, BLOCK_N, D, HEAD_D, DOT_TY)
        do = tl.load(_at(DO, q_vec, stride_do, offs_d), mask=qmask, other=0.0).to(DOT_TY)
        lse2 = tl.load(LSE + q_vec, mask=m_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(DELTA + q_vec, mask=m_ok, other=0.0)
        args = (q, do, lse2, delta, K, V, k_base, kv_stride, stride_k, stride_v, offs_m, offs_d, d_ok,
                scale * 1.4426950408889634, window, phases[3])
        dq, = _phases(_dq_blocks, (tl.zeros([BLOCK_M, HEAD_D], tl.float32),), args, phases, BLOCK_N, PREC, DOT_TY)
        tl.store(_at(DQ, q_vec, stride_dq, offs_d), dq * scale, mask=qmask)


@triton.jit
def _dkdv_blocks(acc, args, start_lo, start_hi, BLOCK_M: tl.constexpr, PREC: tl.constexpr, DOT_TY: tl.constexpr,
                 MASK: tl.constexpr):
    dk, dv = acc
    k, v, Q, DO, LSE, DELTA, q_base, q_stride, stride_q, stride_do, offs_n, offs_d, d_ok, scale_log2, window, hi = args
    for start in range(start_lo, start_hi, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        m_ok = offs_m < hi
        q_vec = q_base + offs_m * q_stride
        qt = tl.load(_at_t(Q, q_vec, stride_q, offs_d), mask=m_ok[None, :] & d_ok[:, None], other=0.0).to(DOT_TY)
        do = tl.load(_at(DO, q_vec, stride_do, offs_d), mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_TY)
        lse2 = tl.load(LSE + q_vec, mask=m_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(DELTA + q_vec, mask=m_ok, other=0.0)
        st = tl.dot(k, qt, input_precision=PREC) * scale_log2  # [N, M]
        pt = tl.exp2(st - lse2[None, :])
        if MASK:
            pt = tl.where(_seen(offs_m[None, :], offs_n[:, None], window) & m_ok[None, :], pt, 0.0)
        dv += tl.dot(pt.to(DO.dtype.element_ty).to(DOT_TY), do, input_precision=PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(Q.dtype.element_ty).to(DOT_TY), tl.trans(qt), input_precision=PREC)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, desc, work, stride_q, stride_k, stride_v, stride_do,
                 stride_dk, stride_dv, scale, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 D: tl.constexpr, HEAD_D: tl.constexpr, PREC: tl.constexpr, DOT_TY: tl.constexpr,
                 ATOMIC: tl.constexpr):
    ks, g, frag = _work_item(desc, work)
    q_off, q_stride, kv_off, kv_stride, q_row, kv_row, a, e, hq, hkv = frag
    if g < hkv:
        ratio = hq // hkv
        offs_n, offs_d, d_ok, _n_ok, kmask, k_vec = _tile(ks, e, kv_row, 0, kv_off, kv_stride, g, BLOCK_N, D, HEAD_D)
        k = tl.load(_at(K, k_vec, stride_k, offs_d), mask=kmask, other=0.0).to(DOT_TY)
        v = tl.load(_at(V, k_vec, stride_v, offs_d), mask=kmask, other=0.0).to(DOT_TY)
        dk = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
        scale_log2 = scale * 1.4426950408889634
        phases = _query_phases(ks, a, e, window, BLOCK_M, BLOCK_N)
        for h in range(g * ratio, (g + 1) * ratio):
            args = (k, v, Q, DO, LSE, DELTA, q_off + (q_row - a) * q_stride + h, q_stride, stride_q, stride_do,
                    offs_n, offs_d, d_ok, scale_log2, window, phases[3])
            dk, dv = _phases(_dkdv_blocks, (dk, dv), args, phases, BLOCK_M, PREC, DOT_TY)
        dk_ptr = _at(DK, k_vec, stride_dk, offs_d)
        dv_ptr = _at(DV, k_vec, stride_dv, offs_d)
        if ATOMIC:
            tl.atomic_add(dk_ptr, dk * scale, mask=kmask)
            tl.atomic_add(dv_ptr, dv, mask=kmask)
        else:  # the only program of this launch on these rows (a wave)
            tl.store(dk_ptr, tl.load(dk_ptr, mask=kmask, other=0.0) + dk * scale, mask=kmask)
            tl.store(dv_ptr, tl.load(dv_ptr, mask=kmask, other=0.0) + dv, mask=kmask)


# ---------------------------------------------------------------- work tables and launches

def _blocks(frag_index, lo, hi, block):
    """Work rows (fragment, start) covering [lo, hi) of each fragment in steps of ``block``."""
    counts = np.maximum(0, -(-(hi - lo) // block))
    total = int(counts.sum())
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    idx = np.repeat(np.arange(len(counts)), counts)
    starts = lo[idx] + (np.arange(total, dtype=np.int64) - first[idx]) * block
    return np.stack([frag_index[idx], starts], axis=1).astype(np.int64).reshape(-1, 2)


def _key_rects(rows, lo):
    """Per fragment, the key vectors its dK/dV programs write, as (stride, head0, head1, row0, row1):
    rows [row0, row1) of a head-interleaved layout times heads [head0, head1) when the program's heads
    fit in its stride, else one flat interval of vectors (stride 0)."""
    kv_off, stride, kv_row, e, hkv = rows[:, 2], rows[:, 3], rows[:, 5], rows[:, 7], rows[:, 9]
    out = []
    for i in range(len(rows)):
        s, off = int(stride[i]), int(kv_off[i])
        r0, r1 = int(kv_row[i] + lo[i]), int(kv_row[i] + e[i])
        if s > 0 and off % s + int(hkv[i]) <= s:
            out.append((s, off % s, off % s + int(hkv[i]), off // s + r0, off // s + r1))
        else:
            out.append((0, 0, 1, off + r0 * s, off + (r1 - 1) * s + int(hkv[i])))
    return out


def _overlap(x, y):
    return x[0] == y[0] and x[1] < y[2] and y[1] < x[2] and x[3] < y[4] and y[3] < x[4] or (
        x[0] != y[0] and _hull(x)[0] < _hull(y)[1] and _hull(y)[0] < _hull(x)[1])


def _hull(r):
    s, h0, h1, r0, r1 = r
    return (r0, r1) if s == 0 else (r0 * s + h0, (r1 - 1) * s + h1)


def _waves(rects):
    """Fragments (indices) in waves, in table order: a fragment joins the first wave none of whose
    fragments writes a key vector it writes. Every wave's programs then own their dK/dV rows."""
    waves = []
    for i, r in enumerate(rects):
        for w in waves:
            if not any(_overlap(r, rects[j]) for j in w):
                w.append(i)
                break
        else:
            waves.append([i])
    return waves


class WorkTables:
    """What the launches of one chunk read, built once from its descriptor table: the table on the
    device, and per buffer pair the forward/dQ work rows (query blocks), the dK/dV work rows (key
    blocks; in deterministic mode one array per wave), the grid's head extent and the largest
    vector each family's programs address (checked against the buffers before every launch).

    ``desc``: the same table already on ``device`` (the runtime's index arrays,
    ``rt.on(device)[pass]["descriptors"][m][0]``), used as it is; None copies ``table`` there."""

    def __init__(self, table, bounds, window, cfg, device, deterministic=False, desc=None):
        table = np.asarray(table, dtype=np.int64).reshape(-1, DESC_COLS)
        self.window = NO_WINDOW if window is None else int(window)
        self.cfg, self.deterministic = cfg, deterministic
        self.table, self.bounds = table, np.asarray(bounds, dtype=np.int64)
        if desc is None:
            desc = torch.from_numpy(np.ascontiguousarray(table)).to(device)
        elif desc.dtype != torch.int64 or tuple(desc.shape) != table.shape or not desc.is_contiguous() \
                or desc.device != torch.device(device):
            raise ValueError(f"libra.torch triton WorkTables: desc {desc.dtype} {tuple(desc.shape)} on {desc.device}: "
                             f"must be the contiguous int64 {table.shape} table on {device}")
        self.desc = desc
        self.pairs = []
        for g in range(4):
            b0, b1 = int(bounds[g]), int(bounds[g + 1])
            rows = table[b0:b1]
            if not len(rows):
                self.pairs.append(None)
                continue
            idx = np.arange(b0, b1, dtype=np.int64)
            a, e = rows[:, 6], rows[:, 7]
            klo = np.maximum(0, a - self.window + 1)  # keys no query of the fragment sees are skipped
            qwork = _blocks(idx, a, e, cfg.block_m)
            if deterministic:
                kwork = [_blocks(idx[w], klo[w], e[w], cfg.bwd_block_n) for w in _waves(_key_rects(rows, klo))]
            else:
                kwork = [_blocks(idx, klo, e, cfg.bwd_block_n)]
            q_last = rows[:, 0] + (rows[:, 4] + e - a - 1) * rows[:, 1] + rows[:, 8]
            kv_last = rows[:, 2] + (rows[:, 5] + e - 1) * rows[:, 3] + rows[:, 9]
            self.pairs.append({
                "qwork": torch.from_numpy(qwork).to(device),
                "kwork": [torch.from_numpy(w).to(device) for w in kwork],
                "hq": int(rows[:, 8].max()), "hkv": int(rows[:, 9].max()),
                "q_end": int(q_last.max()), "kv_end": int(kv_last.max())})

    def launches(self):
        """Kernel launches per forward and per backward of this chunk."""
        used = [p for p in self.pairs if p is not None]
        return len(used), sum(2 + len(p["kwork"]) for p in used)


def _check(p, bq, bk):
    for name, buf, end in (("Q", bq["Q"], p["q_end"]), ("K", bk["K"], p["kv_end"])):
        if end > buf.shape[0]:
            raise RuntimeError(f"libra.torch: triton kernel: a fragment addresses {name} vector {end - 1}, "
                               f"beyond its buffer of {buf.shape[0]} vectors")


_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _statics(tables, bq):
    d = bq["Q"].shape[1]
    head_d = padded_head_dim(d)
    prec = "ieee" if bq["Q"].dtype == torch.float32 else "tf32"
    # triton 3.9's interpreter multiplies bf16 tl.dot operands as their raw uint16 bits: there the
    # tiles are widened to fp32 after loading (and p, dS after their bf16 rounding), which gives the
    # products a bf16 MMA gives (exact in fp32) and the same fp32 sums up to order. On a GPU
    # DOT_TY is the storage type and the casts vanish.
    dot_ty = tl.float32 if interpreted() and bq["Q"].dtype == torch.bfloat16 else _TL[bq["Q"].dtype]
    return dict(D=d, HEAD_D=head_d, PREC=prec, DOT_TY=dot_ty, num_warps=tables.cfg.num_warps, num_stages=tables.cfg.num_stages)


def _scale(scale, d):
    if scale is None:
        return d ** -0.5
    scale = float(scale)
    if scale == 0.0 or not math.isfinite(scale):
        raise ValueError(f"libra.torch triton kernel softmax_scale {scale}: must be finite and nonzero "
                         "(None for 1/sqrt(head_dim))")
    return scale


def _pair(tables, pair, bq, bk, scale):
    """Buffer pair ``pair``'s work (None when it has no fragments), checked against the buffers, its
    launches' constants and the softmax scale."""
    p = tables.pairs[pair]
    if p is None:
        return None, None, None
    _check(p, bq, bk)
    st = _statics(tables, bq)
    return p, st, _scale(scale, st["D"])


def forward(tables, pair, bq, bk, scale):
    """O and LSE of buffer pair ``pair``'s fragments (bq: the Q family's buffers Q, O, LSE; bk: K, V)."""
    p, st, scale = _pair(tables, pair, bq, bk, scale)
    if p is None:
        return 0
    cfg = tables.cfg
    q, k, v, o, lse = bq["Q"], bk["K"], bk["V"], bq["O"], bq["LSE"]
    grid = (p["qwork"].shape[0], p["hq"])
    with _launching():
        _fwd_kernel[grid](q, k, v, o, lse, tables.desc, p["qwork"], q.stride(0), k.stride(0), v.stride(0),
                          o.stride(0), scale * LOG2E, tables.window, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **st)
    return 1


def backward(tables, pair, bq, bk, scale):
    """dQ (assigned) and dK, dV (fp32, added) of buffer pair ``pair``'s fragments from Q, K, V, O, dO
    and the LSE. Returns the number of launches."""
    p, st, scale = _pair(tables, pair, bq, bk, scale)
    if p is None:
        return 0
    q, k, v, o, do, lse = bq["Q"], bk["K"], bk["V"], bq["O"], bq["dO"], bq["LSE"]
    dq, dk, dv = bq["dQ"], bk["dK"], bk["dV"]
    delta = torch.empty(lse.shape[0], dtype=torch.float32, device=lse.device)
    qgrid = (p["qwork"].shape[0], p["hq"])
    with _launching():
        _launch_backward(tables, p, qgrid, st, (q, k, v, o, do, lse, dq, dk, dv, delta), scale)
    return 2 + len(p["kwork"])


def _launch_backward(tables, p, qgrid, st, bufs, scale):
    q, k, v, o, do, lse, dq, dk, dv, delta = bufs
    cfg = tables.cfg
    _delta_kernel[qgrid](o, do, delta, tables.desc, p["qwork"], o.stride(0), do.stride(0), BLOCK_M=cfg.block_m,
                         D=st["D"], HEAD_D=st["HEAD_D"], num_warps=st["num_warps"], num_stages=st["num_stages"])
    _dq_kernel[qgrid](q, k, v, do, lse, delta, dq, tables.desc, p["qwork"], q.stride(0), k.stride(0), v.stride(0),
                      do.stride(0), dq.stride(0), scale, tables.window, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      **st)
    for work in p["kwork"]:  # one launch, or one per wave in order
        _dkdv_kernel[(work.shape[0], p["hkv"])](
            q, k, v, do, lse, delta, dk, dv, tables.desc, work, q.stride(0), k.stride(0), v.stride(0), do.stride(0),
            dk.stride(0), dv.stride(0), scale, tables.window, BLOCK_M=cfg.bwd_block_m, BLOCK_N=cfg.bwd_block_n,
            ATOMIC=not tables.deterministic, **st)


# ---------------------------------------------------------------- ahead-of-time compilation (no GPU needed)

# Shared memory one block may use, bytes (CUDA's opt-in maximum per block).
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448}
_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def aot_variants(dtype, head_d, cfg=None):
    """Every (name, kernel, signature, constexprs, num_warps, num_stages) the launches above make on a
    GPU for storage ``dtype`` and padded head dim ``head_d`` (D = head_d; a smaller D only masks
    columns): forward, delta, dQ, and dK/dV atomic and deterministic. Windowed and plain causal calls
    share one variant (the window is an argument)."""
    cfg = cfg or gpu_config(head_d, dtype)
    t, f, i = _PTR[dtype], "*fp32", "*i64"
    prec = "ieee" if dtype == torch.float32 else "tf32"
    dots = dict(D=head_d, HEAD_D=head_d, PREC=prec, DOT_TY=_TL[dtype])
    fwd = dict(Q=t, K=t, V=t, O=t, LSE=f, desc=i, work=i, stride_q="i32", stride_k="i32", stride_v="i32",
               stride_o="i32", scale_log2="fp32", window="i32")
    delta = dict(O=t, DO=t, DELTA=f, desc=i, work=i, stride_o="i32", stride_do="i32")
    dq = dict(Q=t, K=t, V=t, DO=t, LSE=f, DELTA=f, DQ=f, desc=i, work=i, stride_q="i32", stride_k="i32",
              stride_v="i32", stride_do="i32", stride_dq="i32", scale="fp32", window="i32")
    dkdv = dict(Q=t, K=t, V=t, DO=t, LSE=f, DELTA=f, DK=f, DV=f, desc=i, work=i, stride_q="i32", stride_k="i32",
                stride_v="i32", stride_do="i32", stride_dk="i32", stride_dv="i32", scale="fp32", window="i32")
    w, s = cfg.num_warps, cfg.num_stages
    fwd_c = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **dots)
    bwd_c = dict(BLOCK_M=cfg.bwd_block_m, BLOCK_N=cfg.bwd_block_n, **dots)
    return [("forward", _fwd_kernel, fwd, fwd_c, w, s),
            ("delta", _delta_kernel, delta, dict(BLOCK_M=cfg.block_m, D=head_d, HEAD_D=head_d), w, s),
            ("dq", _dq_kernel, dq, fwd_c, w, s),
            ("dkdv atomic", _dkdv_kernel, dkdv, dict(bwd_c, ATOMIC=True), w, s),
            ("dkdv deterministic", _dkdv_kernel, dkdv, dict(bwd_c, ATOMIC=False), w, s)]


def aot_compile(kernel, signature, constexprs, num_warps, num_stages, arch):
    """triton.compile for CUDA ``arch`` (80, 90, ...) without a GPU; returns the compiled kernel (its
    ``metadata.shared`` is the shared memory a block needs, ``asm`` the PTX and cubin)."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource, make_backend  # noqa: PLC0415
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    target = GPUTarget("cuda", arch, 32)
    options = make_backend(target).parse_options({"num_warps": num_warps, "num_stages": num_stages})
    return triton.compile(ASTSource(kernel, sig, constexprs), target=target, options=options.__dict__)
