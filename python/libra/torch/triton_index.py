"""The index arrays' expansion on a GPU in one Triton launch (index.expand on CUDA): the head-vector
rows from the binding's strided runs, no temporaries beside the output, no host read.

    rows = expand(cols, n)     # cols: int32 [5, R] on the device (first, count, base, len, stride)

Entry first + k of a run is base + (k // len) * stride + k % len. A program writes BLOCK consecutive
entries: two scalar binary searches over the runs' firsts find the runs holding its first and last
entry, then a vector binary search among those (usually one: runs are thousands of entries long)
finds each entry's run. Under ``TRITON_INTERPRET=1`` (set before triton is imported) it runs on CPU
tensors (the tests' check against numpy).
"""
import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _run_at(cols, lo, runs, e):
    """The last run in [lo, runs) whose first entry (cols[run]) is at most e; cols[lo] <= e."""
    top = runs + 0
    while top - lo > 1:
        mid = (lo + top) // 2
        if tl.load(cols + mid) <= e:
            lo = mid
        else:
            top = mid
    return lo


# runs and n stay arguments (Triton would make a 1 a constant, and the loops below then constant).
@triton.jit(do_not_specialize=["runs", "n"])
def _expand_kernel(cols, runs, n, out, BLOCK: tl.constexpr):
    e0 = tl.program_id(0).to(tl.int64) * BLOCK
    offs = e0 + tl.arange(0, BLOCK)
    mask = offs < n
    e1 = tl.minimum(e0 + BLOCK, n) - 1
    # The runs lo and hi hold e0 and e1: first[lo] <= e0 < first[lo + 1] (first[runs] reads as n).
    lo = _run_at(cols, runs * 0, runs, e0)
    hi = _run_at(cols, lo, runs, e1)
    # Each entry's run in [lo, hi]: every interval [a, b) halves (or less) per step.
    a = tl.zeros([BLOCK], dtype=tl.int32) + lo
    b = tl.zeros([BLOCK], dtype=tl.int32) + hi + 1
    width = hi + 1 - lo
    while width > 1:
        open_ = b - a > 1
        mid = (a + b) // 2
        f = tl.load(cols + mid, mask=mask & open_, other=0)
        go = f <= offs
        a = tl.where(open_ & go, mid, a)
        b = tl.where(open_ & ~go, mid, b)
        width = (width + 1) // 2
    first = tl.load(cols + a, mask=mask, other=0).to(tl.int64)
    base = tl.load(cols + 2 * runs + a, mask=mask, other=0).to(tl.int64)
    ln = tl.load(cols + 3 * runs + a, mask=mask, other=1).to(tl.int64)
    stride = tl.load(cols + 4 * runs + a, mask=mask, other=0).to(tl.int64)
    k = offs - first
    tl.store(out + offs, (base + (k // ln) * stride + k % ln).to(tl.int32), mask=mask)


def expand(cols, n):
    """The rows, int32 [n] on cols' device, of the runs' columns ``cols`` (int32 [5, R], contiguous),
    which tile [0, n) in order (the binding checked every position fits int32)."""
    out = torch.empty(n, dtype=torch.int32, device=cols.device)
    runs = cols.shape[1]
    if n:
        _expand_kernel[(triton.cdiv(n, BLOCK),)](cols, runs, n, out, BLOCK=BLOCK)
    return out


def aot_variant():
    """(name, kernel, signature, constexprs, num_warps, num_stages) of the launch above on a GPU, for
    triton_attention.aot_compile (tests compile it for sm_90 without a GPU)."""
    return ("expand", _expand_kernel, dict(cols="*i32", runs="i32", n="i64", out="*i32"), dict(BLOCK=BLOCK), 4, 1)
