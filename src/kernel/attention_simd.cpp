// The SIMD bodies of the attention kernel: one register-blocked block
// product (C += A * B with A read by scalar broadcast, so the same routine
// serves Q K^T, P V, P^T dO, dS^T Q and dS K), the online softmax and the
// backward block update. Highway compiles this file once per target
// (AVX-512, AVX2, portable) and dispatches at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernel/attention_simd.cpp"
#ifndef HWY_DISABLED_TARGETS
// SSSE3/SSE4 add compile time and no value on any x86-64 made since 2013.
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "kernel/detail.hpp"

HWY_BEFORE_NAMESPACE();
namespace libra::kernel::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using I64 = std::int64_t;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Vector registers of the target: AVX-512 (and Arm) have 32, AVX2 and SSE
// 16. Register tiles and the FMA probe are sized from this: a tile or a set
// of chains that does not fit spills to the stack, and every FMA then waits
// on a store-to-load round trip (the AVX2 slowdown of the 32-register shapes).
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_ARCH_ARM
constexpr int kVecRegs = 32;
#else
constexpr int kVecRegs = 16;
#endif

// C[R x V*L] (+)= A[R x K] * B[K x V*L]; A(r, k) = a[r*ars + k*aks].
// With accumulate, the old C rows are first scaled by cscale[r] (if given):
// that is the online-softmax rescale of the output, fused into the store.
template <int R, int V>
HWY_INLINE void Tile(const float* HWY_RESTRICT a, I64 ars, I64 aks, const float* HWY_RESTRICT b, I64 ldb,
                     float* HWY_RESTRICT c, I64 ldc, I64 kdim, const float* HWY_RESTRICT cscale, bool accumulate) {
  const DF df;
  const I64 L = static_cast<I64>(hn::Lanes(df));
  VF s[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) s[r][v] = hn::Zero(df);
  // The C rows are read after the k loop; fetching them now hides the miss
  // (dQ accumulates into a per-thread buffer far larger than L2).
  if (accumulate) {
    for (int r = 0; r < R; ++r)
      for (I64 off = 0; off < V * L; off += 16) hwy::Prefetch(c + r * ldc + off);  // 16 floats: one line
  }
  for (I64 k = 0; k < kdim; ++k) {
    VF bv[V];
    for (int v = 0; v < V; ++v) bv[v] = hn::LoadU(df, b + k * ldb + v * L);
    const float* ak = a + k * aks;
    for (int r = 0; r < R; ++r) {
      const VF av = hn::Set(df, ak[r * ars]);
      for (int v = 0; v < V; ++v) s[r][v] = hn::MulAdd(av, bv[v], s[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    if (accumulate) {
      if (cscale != nullptr) {
        const VF sc = hn::Set(df, cscale[r]);
        for (int v = 0; v < V; ++v) s[r][v] = hn::MulAdd(hn::LoadU(df, cr + v * L), sc, s[r][v]);
      } else {
        for (int v = 0; v < V; ++v) s[r][v] = hn::Add(hn::LoadU(df, cr + v * L), s[r][v]);
      }
    }
    for (int v = 0; v < V; ++v) hn::StoreU(s[r][v], df, cr + v * L);
  }
}

// Register tile of the block product: kRows x kCols vectors of accumulators
// plus kCols B vectors and one broadcast A value must fit in the registers.
// 32 registers: 6 x 4 (24 + 4 + 1 = 29); 16 registers: 6 x 2 (12 + 2 + 1 = 15,
// the classic Haswell sgemm shape).
constexpr int kRows = 6;
constexpr int kCols = kVecRegs >= 32 ? 4 : 2;

// All column panels of rows [0, R): the A strip stays in L1 while B panels
// stream past it (A often comes from a buffer bigger than L2).
template <int R>
HWY_INLINE void RowStrip(I64 n, const float* a, I64 ars, I64 aks, const float* b, I64 ldb, float* c, I64 ldc,
                         I64 kdim, const float* cscale, bool acc) {
  const DF df;
  const I64 L = static_cast<I64>(hn::Lanes(df));
  for (I64 n0 = 0; n0 < n; n0 += kCols * L) {
    switch (std::min<I64>(kCols, (n - n0) / L)) {
      case 4: Tile<R, 4>(a, ars, aks, b + n0, ldb, c + n0, ldc, kdim, cscale, acc); break;
      case 3: Tile<R, 3>(a, ars, aks, b + n0, ldb, c + n0, ldc, kdim, cscale, acc); break;
      case 2: Tile<R, 2>(a, ars, aks, b + n0, ldb, c + n0, ldc, kdim, cscale, acc); break;
      default: Tile<R, 1>(a, ars, aks, b + n0, ldb, c + n0, ldc, kdim, cscale, acc); break;
    }
  }
}

// C[m x n] (+)= A[m x kdim] * B[kdim x n]; n must be a multiple of the lane
// count (packed buffers are padded so it always is).
HWY_NOINLINE void Gemm(I64 m, I64 n, I64 kdim, const float* a, I64 ars, I64 aks, const float* b, I64 ldb,
                       float* c, I64 ldc, const float* cscale, bool acc) {
  I64 r = 0;
  for (; r + kRows <= m; r += kRows) {
    // Fetch the next strip of A now: A is often a block of a buffer far
    // bigger than L2, and with narrow (AVX2) panels the first tile of a
    // strip consumes it 4x faster than the hardware prefetcher delivers.
    const I64 next = std::min<I64>(kRows, m - r - kRows);
    if (aks == 1) {
      for (I64 i = 0; i < next; ++i)
        for (I64 k = 0; k < kdim; k += 16) hwy::Prefetch(a + (r + kRows + i) * ars + k);
    } else if (ars == 1 && next > 0) {
      for (I64 k = 0; k < kdim; ++k) hwy::Prefetch(a + (r + kRows) + k * aks);
    }
    RowStrip<kRows>(n, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc, kdim, cscale ? cscale + r : nullptr, acc);
  }
  const float* ar = a + r * ars;
  float* cr = c + r * ldc;
  const float* sr = cscale ? cscale + r : nullptr;
  switch (m - r) {
    case 5: RowStrip<5>(n, ar, ars, aks, b, ldb, cr, ldc, kdim, sr, acc); break;
    case 4: RowStrip<4>(n, ar, ars, aks, b, ldb, cr, ldc, kdim, sr, acc); break;
    case 3: RowStrip<3>(n, ar, ars, aks, b, ldb, cr, ldc, kdim, sr, acc); break;
    case 2: RowStrip<2>(n, ar, ars, aks, b, ldb, cr, ldc, kdim, sr, acc); break;
    case 1: RowStrip<1>(n, ar, ars, aks, b, ldb, cr, ldc, kdim, sr, acc); break;
    default: break;
  }
}

// Fetches n floats into L2 (not L1: a block's operands are 32 KiB each)
// while the current block computes: the next key block's panels (forward)
// or query block's rows (backward) come from buffers far bigger than L2.
HWY_INLINE void PrefetchL2(const float* p, I64 n) {
  for (I64 i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 2);
}

HWY_INLINE float RowMax(const float* x, I64 n) {
  const DF df;
  const I64 L = static_cast<I64>(hn::Lanes(df));
  VF m = hn::Set(df, kNegInf);
  for (I64 i = 0; i < n; i += L) m = hn::Max(m, hn::LoadU(df, x + i));
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

// True if any of x[0, n) is NaN. Highway's Exp turns NaN into 0, and Max
// may drop it, so NaN has to be looked for to be propagated.
HWY_INLINE bool RowHasNaN(const float* x, I64 n) {
  const DF df;
  const I64 L = static_cast<I64>(hn::Lanes(df));
  auto m = hn::IsNaN(hn::LoadU(df, x));
  for (I64 i = L; i < n; i += L) m = hn::Or(m, hn::IsNaN(hn::LoadU(df, x + i)));
  return !hn::AllFalse(df, m);
}

// x[i] = exp(x[i] * mul - sub); returns the sum. exp(-inf) and exp(NaN from
// -inf - -inf) come out as 0 (Highway's Exp zeroes inputs below -104).
HWY_INLINE float ExpRow(float* x, I64 n, float mul, float sub) {
  const DF df;
  const I64 L = static_cast<I64>(hn::Lanes(df));
  const VF vm = hn::Set(df, mul), vs = hn::Set(df, sub);
  VF sum = hn::Zero(df);
  for (I64 i = 0; i < n; i += L) {
    const VF e = hn::Exp(df, hn::MulSub(hn::LoadU(df, x + i), vm, vs));
    hn::StoreU(e, df, x + i);
    sum = hn::Add(sum, e);
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// The online-softmax state of a query block's rows (pointers into the task's scratch).
struct RowState {
  float* m;      // running max
  float* l;      // running sum
  float* alpha;  // rescale of this block
  // Rows that saw a NaN or +inf score (a NaN or Inf in q or in a visible k
  // row): plain attention and flash-attn give NaN there, so they do too,
  // instead of a row that looks healthy.
  bool bad[kBq] = {};
  // Rows that see a non-finite value row: their O is NaN (their LSE is not:
  // it does not depend on V).
  bool vbad[kBq] = {};
};

// Packs the block's M query rows of head h, pre-scaled and zero-padded to dp, and resets their state.
HWY_INLINE void PackQueries(const FwdCtx& cx, I64 row0, I64 h, I64 M, float* qb, RowState& st) {
  const ForwardArgs& A = cx.args;
  const I64 d = cx.d, dp = cx.dp;
  for (I64 r = 0; r < M; ++r) {
    const I64 off = elem_offset(A.q, row0 + r, h);
    for (I64 c = 0; c < d; ++c) qb[r * dp + c] = cx.scale * load_elem(A.q.data, A.q.dtype, off + c);
    for (I64 c = d; c < dp; ++c) qb[r * dp + c] = 0.0f;
    st.m[r] = kNegInf;
    st.l[r] = 0.0f;
  }
}

// Sets to -inf the scores of keys a row does not see (after it, or before its window), in a key block on the
// diagonal or at the window's edge.
HWY_INLINE void MaskScores(float* sb, I64 M, I64 qpos0, I64 j0, I64 w) {
  const bool diag = j0 + kBk - 1 > qpos0;
  const bool edge = j0 < first_key(qpos0 + M - 1, w);
  if (!diag && !edge) return;
  for (I64 r = 0; r < M; ++r) {
    const I64 lo = first_key(qpos0 + r, w) - j0, hi = qpos0 + r - j0;
    float* sr = sb + r * kBk;
    for (I64 j = 0; j < std::min<I64>(lo, kBk); ++j) sr[j] = kNegInf;
    for (I64 j = std::max<I64>(hi + 1, 0); j < kBk; ++j) sr[j] = kNegInf;
  }
}

// The online-softmax step of one key block: scores become exp(s - new max) in place, the running max and sum
// move on, alpha rescales the output so far. v_bad marks the block's non-finite value rows.
HWY_INLINE void SoftmaxStep(float* sb, I64 M, I64 qpos0, I64 j0, I64 w, std::uint64_t v_bad, RowState& st) {
  for (I64 r = 0; r < M; ++r) {
    float* sr = sb + r * kBk;
    const float mx = RowMax(sr, kBk);
    if (!st.bad[r] && (mx == kPosInf || RowHasNaN(sr, kBk))) st.bad[r] = true;
    if (!st.vbad[r] && v_bad != 0) {  // a non-finite value row this query sees
      const I64 lo = std::max<I64>(first_key(qpos0 + r, w) - j0, 0), hi = std::min<I64>(qpos0 + r - j0, kBk - 1);
      for (I64 j = lo; j <= hi && !st.vbad[r]; ++j) st.vbad[r] = (v_bad >> j) & 1U;
    }
    if (st.bad[r]) {  // its output is NaN: keep the rest of the block finite
      st.alpha[r] = 1.0f;
      for (I64 j = 0; j < kBk; ++j) sr[j] = 0.0f;
      continue;
    }
    const float mnew = std::max(st.m[r], mx);
    if (mnew == kNegInf) {  // nothing visible yet in this row
      st.alpha[r] = 0.0f;
      for (I64 j = 0; j < kBk; ++j) sr[j] = 0.0f;
      continue;
    }
    const float sum = ExpRow(sr, kBk, 1.0f, mnew);
    st.alpha[r] = st.m[r] == kNegInf ? 0.0f : std::exp(st.m[r] - mnew);
    st.l[r] = st.l[r] * st.alpha[r] + sum;
    st.m[r] = mnew;
  }
}

// Writes O = ob / l and LSE = m + log(l) of the block's rows (NaN for the rows marked bad).
HWY_INLINE void StoreOutputs(const FwdCtx& cx, I64 row0, I64 h, I64 M, const float* ob, const RowState& st) {
  const ForwardArgs& A = cx.args;
  const I64 d = cx.d, dp = cx.dp;
  for (I64 r = 0; r < M; ++r) {
    if (st.bad[r]) {
      const I64 off = elem_offset(A.o, row0 + r, h);
      for (I64 c = 0; c < d; ++c) store_elem(A.o.data, A.o.dtype, off + c, kNaN);
      static_cast<float*>(A.lse.data)[elem_offset(A.lse, row0 + r, h)] = kNaN;
      continue;
    }
    const float inv = st.vbad[r] ? kNaN : st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
    const I64 off = elem_offset(A.o, row0 + r, h);
    for (I64 c = 0; c < d; ++c) store_elem(A.o.data, A.o.dtype, off + c, ob[r * dp + c] * inv);
    static_cast<float*>(A.lse.data)[elem_offset(A.lse, row0 + r, h)] =
        st.l[r] > 0.0f ? st.m[r] + std::log(st.l[r]) : kNegInf;
  }
}

void ForwardTask(const FwdCtx& cx, const FwdTask& t, float* scratch) {
  const ForwardArgs& A = cx.args;
  const Fragment& f = A.fragments[static_cast<std::size_t>(t.frag)];
  const Group& gr = (*cx.groups)[static_cast<std::size_t>((*cx.frag_group)[static_cast<std::size_t>(t.frag)])];
  const I64 d = cx.d, dp = cx.dp, M = t.m, w = A.window;
  const I64 h = cx.g * cx.hg + t.head;
  float* qb = scratch;              // [kBq][dp], pre-scaled
  float* ob = qb + kBq * dp;        // [kBq][dp]
  float* sb = ob + kBq * dp;        // [kBq][kBk]
  RowState st{.m = sb + kBq * kBk, .l = sb + kBq * kBk + kBq, .alpha = sb + kBq * kBk + 2 * kBq};
  const I64 row0 = f.q_row + t.i0, qpos0 = f.a + t.i0, qlast = qpos0 + M - 1;
  PackQueries(cx, row0, h, M, qb, st);
  const I64 jb0 = first_key(qpos0, w) / kBk, jb1 = qlast / kBk;
  for (I64 jb = jb0; jb <= jb1; ++jb) {
    const I64 j0 = jb * kBk;
    const I64 blk = gr.block_off + jb;
    if (jb < jb1) {
      PrefetchL2(cx.kt + (blk + 1) * dp * kBk, dp * kBk);
      PrefetchL2(cx.v + (blk + 1) * kBk * dp, kBk * dp);
    }
    Gemm(M, kBk, d, qb, dp, 1, cx.kt + blk * dp * kBk, kBk, sb, kBk, nullptr, false);
    MaskScores(sb, M, qpos0, j0, w);
    SoftmaxStep(sb, M, qpos0, j0, w, cx.v_bad[blk], st);
    Gemm(M, dp, kBk, sb, kBk, 1, cx.v + blk * kBk * dp, dp, ob, dp, st.alpha, jb != jb0);
  }
  StoreOutputs(cx, row0, h, M, ob, st);
}

// P and dS of a query block against the key block, row by row: P = exp(S - lse) in pb, dS = P (dP - delta) in
// sb (which holds dP), both masked; rows that see a non-finite key get a NaN dQ.
HWY_INLINE void ScoresToGradients(const BwdCtx& cx, I64 blk, I64 j0, I64 qs, I64 M, const float* lse,
                                  const float* delta, float* pb, float* sb, float* dq) {
  const I64 d = cx.d, dp = cx.dp, w = cx.args.window;
  const DF df;
  const I64 L = static_cast<I64>(hn::Lanes(df));
  const bool diag = j0 + kBk - 1 > qs;
  const bool edge = j0 < first_key(qs + M - 1, w);
  for (I64 r = 0; r < M; ++r) {
    float* pr = pb + r * kBk;
    float* sr = sb + r * kBk;
    // A row whose log-sum-exp is NaN (the forward made it NaN: it saw
    // a NaN or Inf in q or k) has a NaN P, as in plain attention; Exp
    // alone would zero it. A NaN delta (a non-finite v row it sees)
    // makes its dS NaN through the subtraction below. The operands are
    // finite here (non-finite values are packed as 0).
    const bool nan_row = std::isnan(lse[r]);
    ExpRow(pr, kBk, 1.0f, lse[r]);  // q is packed pre-scaled, as in the forward
    if (nan_row) std::fill(pr, pr + kBk, kNaN);
    const VF vd = hn::Set(df, delta[r]);
    for (I64 j = 0; j < kBk; j += L) {
      const VF p = hn::LoadU(df, pr + j);
      hn::StoreU(hn::Mul(p, hn::Sub(hn::LoadU(df, sr + j), vd)), df, sr + j);
    }
    if (const std::uint64_t kb = cx.k_bad[blk]; kb != 0) {
      const I64 lo = std::max<I64>(first_key(qs + r, w) - j0, 0), hi = std::min<I64>(qs + r - j0, kBk - 1);
      bool sees = false;
      for (I64 j = lo; j <= hi && !sees; ++j) sees = (kb >> j) & 1U;
      if (sees) std::fill(dq + r * dp, dq + r * dp + d, kNaN);
    }
    if (diag || edge) {
      // Masked after dS too: 0 * NaN is NaN, and keys this row does
      // not see must not get its NaN.
      const I64 lo = first_key(qs + r, w) - j0, hi = qs + r - j0;
      for (I64 j = 0; j < std::min<I64>(lo, kBk); ++j) pr[j] = sr[j] = 0.0f;
      for (I64 j = std::max<I64>(hi + 1, 0); j < kBk; ++j) pr[j] = sr[j] = 0.0f;
    }
  }
}

// Adds the key block's dK and dV (jn real keys) into the outputs of KV head g.
HWY_INLINE void AddKeyGradients(const BwdCtx& cx, const Group& gr, I64 j0, I64 jn, const float* dk, const float* dv) {
  const BackwardArgs& A = cx.args;
  const I64 d = cx.d, dp = cx.dp, g = cx.g;
  for (I64 r = 0; r < jn; ++r) {
    const I64 krow = gr.kv_row + j0 + r;
    const I64 ok = elem_offset(A.dk, krow, g), ov = elem_offset(A.dv, krow, g);
    for (I64 c = 0; c < d; ++c) {
      // dK = scale dS^T Q: the scale is already in the packed Q.
      store_elem(A.dk.data, A.dk.dtype, ok + c, load_elem(A.dk.data, A.dk.dtype, ok + c) + dk[r * dp + c]);
      store_elem(A.dv.data, A.dv.dtype, ov + c, load_elem(A.dv.data, A.dv.dtype, ov + c) + dv[r * dp + c]);
    }
  }
}

void BackwardTask(const BwdCtx& cx, const BwdTask& t, float* scratch, float* dq_acc) {
  const BackwardArgs& A = cx.args;
  const Group& gr = (*cx.groups)[static_cast<std::size_t>(t.group)];
  const I64 d = cx.d, dp = cx.dp, w = A.window, rows = cx.rows;
  const I64 j0 = t.jb * kBk, blk = gr.block_off + t.jb;
  const I64 jn = std::min<I64>(kBk, gr.len - j0);  // real keys in this block
  float* pb = scratch;              // [kBq][kBk]: P
  float* sb = pb + kBq * kBk;       // [kBq][kBk]: dP, then dS
  float* dk = sb + kBq * kBk;       // [kBk][dp]
  float* dv = dk + kBk * dp;        // [kBk][dp]
  std::fill(dk, dk + 2 * kBk * dp, 0.0f);
  const float* kt = cx.kt + blk * dp * kBk;
  const float* vt = cx.vt + blk * dp * kBk;
  const float* kr = cx.kr + blk * kBk * dp;
  for (I64 hl = 0; hl < cx.hg; ++hl) {
    const float* qp = cx.qp + hl * rows * dp;
    const float* dop = cx.dop + hl * rows * dp;
    const float* lse = cx.lse + hl * rows;
    const float* delta = cx.delta + hl * rows;
    float* dq = dq_acc + hl * rows * dp;
    for (std::int32_t fi : gr.frags) {
      const Fragment& f = A.fragments[static_cast<std::size_t>(fi)];
      if (f.a == f.e) continue;
      const I64 qlo = std::max(f.a, j0);
      const I64 qhi = last_query(j0 + jn - 1, w, f.e - 1);
      for (I64 qs = qlo; qs <= qhi; qs += kBq) {
        const I64 M = std::min<I64>(kBq, qhi - qs + 1);
        const I64 row = f.q_row + (qs - f.a);
        const float* qb = qp + row * dp;
        const float* dob = dop + row * dp;
        if (qs + kBq <= qhi) {
          const I64 nm = std::min<I64>(kBq, qhi - qs - kBq + 1) * dp;
          PrefetchL2(qb + kBq * dp, nm);
          PrefetchL2(dob + kBq * dp, nm);
          PrefetchL2(dq + (row + kBq) * dp, nm);
        }
        Gemm(M, kBk, d, qb, dp, 1, kt, kBk, pb, kBk, nullptr, false);
        Gemm(M, kBk, d, dob, dp, 1, vt, kBk, sb, kBk, nullptr, false);
        ScoresToGradients(cx, blk, j0, qs, M, lse + row, delta + row, pb, sb, dq + row * dp);
        Gemm(kBk, dp, M, pb, 1, kBk, dob, dp, dv, dp, nullptr, true);
        Gemm(kBk, dp, M, sb, 1, kBk, qb, dp, dk, dp, nullptr, true);
        Gemm(M, dp, kBk, sb, kBk, 1, kr, dp, dq + row * dp, dp, nullptr, true);
      }
    }
  }
  AddKeyGradients(cx, gr, j0, jn, dk, dv);
}

// Peak probe: independent chains acc = acc * mul + add. Enough chains to
// cover FMA latency (4-5 cycles) times FMA pipes (2) on every x86 core since
// Haswell, and few enough that chains plus the two constants stay in
// registers (16 chains on AVX2 would need 18 of 16 and spill: that probe
// read half the peak). Returns FLOPs per iteration.
I64 FmaLoop(I64 iters, float* sink) {
  const DF df;
  constexpr int kChains = kVecRegs >= 32 ? 24 : 12;
  VF acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(df, static_cast<float>(i));
  const VF mul = hn::Set(df, 0.999999f), add = hn::Set(df, 1e-7f);
  // Unrolled by a fold, not left to the compiler: GCC peels at most 16
  // iterations, and a rolled loop over 24 chains keeps them in memory.
  const auto step = [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((acc[I] = hn::MulAdd(acc[I], mul, add)), ...);
  };
  for (I64 it = 0; it < iters; ++it) step(std::make_index_sequence<kChains>{});
  VF total = acc[0];
  for (int i = 1; i < kChains; ++i) total = hn::Add(total, acc[i]);
  *sink = hn::GetLane(total);
  return 2 * kChains * static_cast<I64>(hn::Lanes(df));
}

}  // namespace HWY_NAMESPACE
}  // namespace libra::kernel::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace libra::kernel::detail {

HWY_EXPORT(ForwardTask);
HWY_EXPORT(BackwardTask);
HWY_EXPORT(FmaLoop);

std::int64_t fma_loop(std::int64_t iters, float* sink) { return HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, sink); }

void forward_task(const FwdCtx& cx, const FwdTask& t, float* scratch) {
  HWY_DYNAMIC_DISPATCH(ForwardTask)(cx, t, scratch);
}
void backward_task(const BwdCtx& cx, const BwdTask& t, float* scratch, float* dq_acc) {
  HWY_DYNAMIC_DISPATCH(BackwardTask)(cx, t, scratch, dq_acc);
}
namespace {
// hwy::SupportedTargets() re-points dispatch at every target the CPU has
// (Highway 1.0 updates the chosen target inside it, ignoring
// DisableTargets), so it is called only here, and the result is kept: what
// the CPU supports, and the subset dispatch is restricted to.
std::int64_t cpu_targets() {
  static const std::int64_t all = hwy::SupportedTargets() & HWY_TARGETS;
  return all;
}
std::atomic<std::int64_t>& active_targets() {
  static std::atomic<std::int64_t> active{cpu_targets()};
  return active;
}
}  // namespace

const char* best_target_name() {
  const std::int64_t t = active_targets().load();
  return hwy::TargetName(t & -t);
}

Status restrict_targets(std::string_view name) {
  std::int64_t want = 0;
  if (name == "avx512") {
    want = HWY_AVX3;
  } else if (name == "avx2") {
    want = HWY_AVX2;
  } else if (name == "scalar") {
    want = HWY_SCALAR;
  } else if (name != "auto") {
    return invalid_input("simd target '" + std::string(name) + "' is not one of auto, avx512, avx2, scalar");
  }
  const std::int64_t all = cpu_targets();
  if (want != 0 && (all & want) == 0) {
    return invalid_input("simd target '" + std::string(name) + "' is not supported by this CPU or not compiled in");
  }
  // Highway numbers targets best first (lower bit = better): disabling every
  // lower bit leaves `want` as the best remaining one.
  const std::int64_t disabled = want == 0 ? 0 : want - 1;
  hwy::DisableTargets(disabled);
  // Point dispatch at the restricted set now (SupportedTargets itself has
  // just pointed it at every target).
  const std::int64_t allowed = hwy::SupportedTargets() & ~disabled;
  hwy::GetChosenTarget().Update(allowed);
  active_targets().store(all & ~disabled);
  return {};
}

}  // namespace libra::kernel::detail
#endif
