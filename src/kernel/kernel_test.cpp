// Correctness of the attention kernel against the double-precision naive
// reference (attention_reference.hpp), and of the reference's gradients
// against finite differences of its own forward pass.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernel/detail.hpp"
#include "libra/attention_reference.hpp"
#include "libra/kernel.hpp"

namespace libra::kernel {
namespace {

using I64 = std::int64_t;

// A tensor that owns its storage; row_stride may exceed heads * head_dim.
struct Buf {
  DType dtype = DType::kF32;
  I64 rows = 0, heads = 0, head_dim = 0, row_stride = 0;
  std::vector<unsigned char> bytes;
  Buf() = default;
  Buf(DType t, I64 r, I64 h, I64 d, I64 pad = 0)
      : dtype(t), rows(r), heads(h), head_dim(d), row_stride(h * d + pad),
        bytes(static_cast<std::size_t>(std::max<I64>(1, r * (h * d + pad)) * dtype_bytes(t)), 0) {}
  Tensor view() { return {bytes.data(), dtype, rows, heads, head_dim, row_stride}; }
  ConstTensor cview() const { return {bytes.data(), dtype, rows, heads, head_dim, row_stride}; }
  I64 off(I64 r, I64 h, I64 c) const { return r * row_stride + h * head_dim + c; }
  float get(I64 r, I64 h, I64 c) const { return load_as_f32(bytes.data(), dtype, off(r, h, c)); }
  void set(I64 r, I64 h, I64 c, float x) { store_from_f32(bytes.data(), dtype, off(r, h, c), x); }
  // Uniform in [-amp, amp) from a 64-bit generator, mapped by hand.
  void fill(std::mt19937_64& rng, float amp) {
    for (I64 r = 0; r < rows; ++r)
      for (I64 h = 0; h < heads; ++h)
        for (I64 c = 0; c < head_dim; ++c) {
          const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
          set(r, h, c, static_cast<float>((2.0 * u - 1.0) * amp));
        }
  }
};

struct Problem {
  I64 d = 16, hq = 1, hkv = 1, window = kFullCausal;
  DType dtype = DType::kF32;
  int threads = 1;
  std::vector<I64> samples;       // sample lengths, stored back to back in K/V
  std::vector<Fragment> frags;
  I64 q_rows = 0, kv_rows = 0;
  I64 pad = 0;                    // extra elements per row (strided views)
  float amp = 1.0f;
  const char* target = "auto";    // SIMD target (set_simd_target) for this problem
};

// The SIMD targets this CPU can run, best first (each has its own register
// tile shape, so each is checked against the reference).
std::vector<const char*> runnable_targets() {
  std::vector<const char*> out;
  for (const char* t : {"avx512", "avx2", "scalar"}) {
    if (set_simd_target(t).ok()) out.push_back(t);
  }
  EXPECT_TRUE(set_simd_target("auto").ok());
  return out;
}

// Selects a SIMD target for a scope and restores "auto" after it.
class TargetScope {
 public:
  explicit TargetScope(const char* name) : ok_(set_simd_target(name).ok()) {}
  ~TargetScope() { (void)set_simd_target("auto"); }
  TargetScope(const TargetScope&) = delete;
  TargetScope& operator=(const TargetScope&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_;
};

// Max |x - ref| over entries, and max |ref| (to scale tolerances).
struct Err {
  double abs = 0, ref_max = 0;
};

template <class Get>
Err compare(const std::vector<double>& ref, I64 rows, I64 heads, I64 dim, Get get) {
  Err e;
  for (I64 r = 0; r < rows; ++r)
    for (I64 h = 0; h < heads; ++h)
      for (I64 c = 0; c < dim; ++c) {
        const double x = ref[static_cast<std::size_t>((r * heads + h) * dim + c)];
        e.ref_max = std::max(e.ref_max, std::abs(x));
        const double diff = std::abs(static_cast<double>(get(r, h, c)) - x);
        e.abs = std::isnan(diff) ? INFINITY : std::max(e.abs, diff);
      }
  return e;
}

// Documented tolerances (docs/kernel.md): fp32 storage 2e-5 relative to the
// largest reference magnitude (plus 1e-6 absolute); bf16 storage 1.6e-2 and
// fp16 storage 2e-3 (a few ulps of 8 and 11 significant bits: inputs are
// exact in the type, outputs and the O fed to the backward pass are rounded).
double rel_tolerance(DType t) { return t == DType::kF32 ? 2e-5 : t == DType::kBF16 ? 1.6e-2 : 2e-3; }
double tolerance(DType t, double ref_max) { return rel_tolerance(t) * ref_max + 1e-6; }
// 16-bit gradients also get an absolute term (inputs lie in [-1, 1]): the
// backward pass reads the rounded O through delta = rowsum(dO * O), an error
// of ~ulp/2 |dO||O| that does not shrink when the true gradient is small by
// cancellation (dP - delta ~ 0): 4e-3 for bf16 (2^-9), 5e-4 for fp16 (2^-12).
double grad_abs(DType t) { return t == DType::kF32 ? 0.0 : t == DType::kBF16 ? 4e-3 : 5e-4; }
double grad_tolerance(DType t, double ref_max) { return tolerance(t, ref_max) + grad_abs(t); }
// dV is read-modify-written around a value of magnitude ~1, so its rounding
// is relative to the accumulated value, not to the increment: one ulp of 1.
double dv_tolerance(DType t, double ref_max) {
  return t == DType::kF32 ? tolerance(t, ref_max) : rel_tolerance(t) * ref_max + 2 * grad_abs(t);
}
// The LSE is fp32 storage, computed in fp32 from inputs that are exact in
// their type: the fp32 tolerance for every input type.
double lse_tolerance(DType, double ref_max) { return 2e-5 * std::max(1.0, ref_max); }

struct Outcome {
  bool ok = true;
  std::string what;
};

// Runs forward and backward through the kernel and the reference and
// compares O, LSE, dQ, dK, dV.
Outcome check_problem(const Problem& p, std::uint64_t seed) {
  const TargetScope target(p.target);
  if (!target.ok()) return {false, std::string("SIMD target ") + p.target + " is not runnable here"};
  std::mt19937_64 rng(seed);
  Buf q(p.dtype, p.q_rows, p.hq, p.d, p.pad), k(p.dtype, p.kv_rows, p.hkv, p.d, p.pad),
      v(p.dtype, p.kv_rows, p.hkv, p.d, p.pad);
  q.fill(rng, p.amp);
  k.fill(rng, p.amp);
  v.fill(rng, 1.0f);
  Buf o(p.dtype, p.q_rows, p.hq, p.d, p.pad), lse(DType::kF32, p.q_rows, p.hq, 1, 1);
  ForwardArgs fa{q.cview(), k.cview(), v.cview(), o.view(), lse.view(), p.frags, p.window, 0.0f, p.threads, 0.0};
  Status s = attention_forward(fa);
  if (!s.ok()) return {false, "forward failed: " + s.message()};
  auto ref = reference_forward(q.cview(), k.cview(), v.cview(), p.frags, p.window);
  if (!ref.ok()) return {false, "reference failed: " + ref.error().message()};
  // Rows outside fragments are never written: compare fragment rows only, by masking.
  std::vector<char> in_frag(static_cast<std::size_t>(p.q_rows), 0);
  for (const Fragment& f : p.frags)
    for (I64 i = 0; i < f.e - f.a; ++i) in_frag[static_cast<std::size_t>(f.q_row + i)] = 1;
  auto masked = [&](auto get) {
    return [&, get](I64 r, I64 h, I64 c) { return in_frag[static_cast<std::size_t>(r)] ? get(r, h, c) : 0.0f; };
  };
  Err eo = compare(ref->o, p.q_rows, p.hq, p.d, masked([&](I64 r, I64 h, I64 c) { return o.get(r, h, c); }));
  if (eo.abs > tolerance(p.dtype, eo.ref_max)) return {false, "O error " + std::to_string(eo.abs)};
  Err el = compare(ref->lse, p.q_rows, p.hq, 1, masked([&](I64 r, I64 h, I64) { return lse.get(r, h, 0); }));
  if (el.abs > lse_tolerance(p.dtype, el.ref_max)) {
    return {false, "LSE error " + std::to_string(el.abs)};
  }
  // Backward: dK/dV start from random values and must be accumulated onto.
  Buf d_o(p.dtype, p.q_rows, p.hq, p.d, p.pad);
  d_o.fill(rng, 1.0f);
  Buf dq(p.dtype, p.q_rows, p.hq, p.d, p.pad), dk(DType::kF32, p.kv_rows, p.hkv, p.d, p.pad),
      dv(p.dtype, p.kv_rows, p.hkv, p.d, p.pad);
  dq.fill(rng, 5.0f);  // garbage: must be overwritten
  dk.fill(rng, 1.0f);
  dv.fill(rng, 1.0f);
  const Buf dk0 = dk, dv0 = dv;
  BackwardArgs ba{q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(), dk.view(),
                  dv.view(), p.frags, p.window, 0.0f, p.threads};
  ba.min_flops_per_thread = 0;  // exercise the threaded paths even on tiny problems
  s = attention_backward(ba);
  if (!s.ok()) return {false, "backward failed: " + s.message()};
  auto g = reference_backward(q.cview(), k.cview(), v.cview(), d_o.cview(), p.frags, p.window);
  if (!g.ok()) return {false, "reference backward failed: " + g.error().message()};
  Err eq = compare(g->dq, p.q_rows, p.hq, p.d, masked([&](I64 r, I64 h, I64 c) { return dq.get(r, h, c); }));
  if (eq.abs > grad_tolerance(p.dtype, eq.ref_max)) {
    return {false, "dQ error " + std::to_string(eq.abs) + " ref max " + std::to_string(eq.ref_max)};
  }
  // dK is fp32 storage here (mixed precision is allowed), dV uses p.dtype.
  Err ek = compare(g->dk, p.kv_rows, p.hkv, p.d,
                   [&](I64 r, I64 h, I64 c) { return dk.get(r, h, c) - dk0.get(r, h, c); });
  // dK has fp32 storage here, but its inputs (Q, dS through delta) carry bf16 rounding.
  const double ktol = grad_tolerance(p.dtype, ek.ref_max);
  if (ek.abs > ktol) return {false, "dK error " + std::to_string(ek.abs) + " ref max " + std::to_string(ek.ref_max)};
  // dV in bf16 is read-modify-written around a value of magnitude ~1, so its
  // rounding is relative to the accumulated value, not to the increment.
  Err ev = compare(g->dv, p.kv_rows, p.hkv, p.d, [&](I64 r, I64 h, I64 c) {
    return static_cast<double>(dv.get(r, h, c)) - static_cast<double>(dv0.get(r, h, c));
  });
  const double vtol = dv_tolerance(p.dtype, ev.ref_max);
  if (ev.abs > vtol) return {false, "dV error " + std::to_string(ev.abs) + " ref max " + std::to_string(ev.ref_max)};
  return {};
}

// Samples stored back to back; every sample cut into fragments at the
// given cut points; fragments placed in Q in the given order with gaps.
Problem layout(Problem p, const std::vector<std::vector<I64>>& cuts, const std::vector<std::size_t>& order,
               I64 gap) {
  std::vector<Fragment> all;
  I64 kv = 0;
  for (std::size_t s = 0; s < p.samples.size(); ++s) {
    std::vector<I64> c = cuts[s];
    c.push_back(0);
    c.push_back(p.samples[s]);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    for (std::size_t i = 0; i + 1 < c.size(); ++i) all.push_back({0, kv, p.samples[s], c[i], c[i + 1]});
    kv += p.samples[s];
  }
  p.kv_rows = kv;
  I64 row = 0;
  for (std::size_t i : order) {
    if (i >= all.size()) continue;
    Fragment f = all[i];
    f.q_row = row;
    row += f.e - f.a + gap;
    p.frags.push_back(f);
  }
  p.q_rows = row;
  return p;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_f32(1.0f), 0x3F80);
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1.0p-8f), 0x3F80);      // tie -> even
  EXPECT_EQ(bf16_from_f32(1.0f + 3 * 0x1.0p-8f), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1.8p-8f), 0x3F81);      // above half -> up
  EXPECT_EQ(bf16_from_f32(-2.0f), 0xC000);
  EXPECT_EQ(bf16_from_f32(INFINITY), 0x7F80);
  EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(NAN))));
  EXPECT_EQ(f32_from_bf16(0x3F81), 1.0f + 0x1.0p-7f);
}

TEST(AttentionForward, MatchesReferenceOnMultiBlockSample) {
  Problem p;
  p.d = 128;
  p.hq = 2;
  p.hkv = 1;
  p.samples = {200, 1, 70};
  p.threads = 2;
  p = layout(p, {{37, 130}, {}, {64}}, {5, 0, 1, 2, 3, 4}, 1);
  const Outcome r = check_problem(p, 1);
  EXPECT_TRUE(r.ok) << r.what;
}

TEST(AttentionKernel, MatchesReferenceOnEveryRunnableSimdTarget) {
  const std::string best = simd_target();
  const auto targets = runnable_targets();
  ASSERT_FALSE(targets.empty());
  for (const char* t : targets) {
    for (I64 d : {I64{128}, I64{64}, I64{37}}) {
      Problem p;
      p.d = d;
      p.hq = 3;
      p.hkv = 1;
      p.samples = {150, 5};
      p.window = d == 37 ? 70 : kFullCausal;
      p.threads = 2;
      p.pad = 1;
      p.target = t;
      p = layout(p, {{20, 64, 129}, {}}, {4, 1, 0, 3, 2}, 1);
      const Outcome r = check_problem(p, 40 + static_cast<std::uint64_t>(d));
      EXPECT_TRUE(r.ok) << "target " << t << " d " << d << ": " << r.what;
    }
  }
  EXPECT_EQ(simd_target(), best);  // each check restored "auto"
}

TEST(AttentionKernel, SimdTargetNamesAreChecked) {
  const std::string before = simd_target();
  Status s = set_simd_target("sse9");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidInput);
  EXPECT_EQ(s.message(), "simd target 'sse9' is not one of auto, avx512, avx2, scalar");
  EXPECT_EQ(simd_target(), before);
  // Dispatch really switches (the FMA probe's FLOPs per iteration are
  // 2 x lanes x chains: 12 chains of 8 lanes on AVX2, 24 of 16 on AVX-512).
  float sink = 0;
  if (set_simd_target("avx2").ok()) {
    EXPECT_EQ(simd_target(), "AVX2");
    EXPECT_EQ(detail::fma_loop(1, &sink), 2 * 12 * 8);
  }
  if (set_simd_target("avx512").ok()) {
    EXPECT_EQ(simd_target(), "AVX3");
    EXPECT_EQ(detail::fma_loop(1, &sink), 2 * 24 * 16);
  }
  ASSERT_TRUE(set_simd_target("auto").ok());
  EXPECT_EQ(simd_target(), before);
}

TEST(AttentionForward, MatchesReferenceWithHeadDim64AndBf16) {
  Problem p;
  p.d = 64;
  p.hq = 4;
  p.hkv = 2;
  p.dtype = DType::kBF16;
  p.samples = {150, 66};
  p.pad = 3;
  p = layout(p, {{10, 11, 149}, {65}}, {0, 1, 2, 3, 4, 5}, 0);
  const Outcome r = check_problem(p, 2);
  EXPECT_TRUE(r.ok) << r.what;
}

// fp16 (IEEE half) storage with fp32 accumulation: multi-block samples,
// GQA, a window, strided rows, two threads, on every runnable target. The
// fp16 tolerances are tight enough that outputs rounded through bf16 fail
// (tried: the dV check, error 7.8e-3 against 6.8e-3).
TEST(AttentionKernel, Fp16StorageMatchesReference) {
  const auto targets = runnable_targets();
  for (std::size_t i = 0; i < targets.size(); ++i) {
    Problem p;
    p.d = 128;
    p.hq = 4;
    p.hkv = 2;
    p.dtype = DType::kF16;
    p.samples = {140, 70};
    p.window = i % 2 == 0 ? kFullCausal : 100;  // both windows across the targets
    p.threads = 2;
    p.pad = 2;
    p.target = targets[i];
    p = layout(p, {{64, 100}, {33}}, {3, 0, 4, 1, 2}, 1);
    const Outcome r = check_problem(p, 77);
    EXPECT_TRUE(r.ok) << "target " << p.target << " window " << p.window << ": " << r.what;
  }
}

TEST(AttentionForward, SlidingWindowsOfOneAndLongerThanTheSample) {
  for (I64 w : {I64{1}, I64{2}, I64{3}, I64{7}, I64{63}, I64{64}, I64{65}, I64{500}}) {
    Problem p;
    p.d = 20;
    p.hq = 3;
    p.hkv = 3;
    p.window = w;
    p.threads = 3;
    p.samples = {190};
    p = layout(p, {{50, 120}}, {2, 0, 1}, 2);
    const Outcome r = check_problem(p, 3 + static_cast<std::uint64_t>(w));
    EXPECT_TRUE(r.ok) << "window " << w << ": " << r.what;
  }
}

TEST(AttentionForward, LargeScoresStayFinite) {
  // Scores of magnitude ~ 60 would overflow a softmax without max subtraction.
  Problem p;
  p.d = 16;
  p.samples = {100};
  p.amp = 4.0f;
  p = layout(p, {{}}, {0}, 0);
  const Outcome r = check_problem(p, 4);
  EXPECT_TRUE(r.ok) << r.what;
}

// The fp32 gradients of plain attention written the obvious way (scores
// (q . k) * scale, max-subtracted softmax, one P for both directions), as
// torch computes them: the yardstick of what fp32 can do at a scale. One
// sample, one fragment from row 0; [rows][heads][d] arrays.
struct Fp32Grads {
  std::vector<float> o, dq, dk, dv;
};
Fp32Grads fp32_attention(const Buf& q, const Buf& k, const Buf& v, const Buf& d_o, float scale) {
  const I64 T = q.rows, H = q.heads, d = q.head_dim, g = q.heads / k.heads;
  Fp32Grads r{std::vector<float>(static_cast<std::size_t>(T * H * d)), std::vector<float>(static_cast<std::size_t>(T * H * d)),
              std::vector<float>(static_cast<std::size_t>(T * k.heads * d)),
              std::vector<float>(static_cast<std::size_t>(T * k.heads * d))};
  std::vector<float> p(static_cast<std::size_t>(T)), dp(static_cast<std::size_t>(T));
  for (I64 h = 0; h < H; ++h) {
    const I64 kh = h / g;
    for (I64 i = 0; i < T; ++i) {
      float m = -INFINITY;
      for (I64 j = 0; j <= i; ++j) {
        float dot = 0;
        for (I64 c = 0; c < d; ++c) dot += q.get(i, h, c) * k.get(j, kh, c);
        p[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, p[static_cast<std::size_t>(j)]);
      }
      float l = 0;
      for (I64 j = 0; j <= i; ++j) l += (p[static_cast<std::size_t>(j)] = std::exp(p[static_cast<std::size_t>(j)] - m));
      float delta = 0;
      for (I64 j = 0; j <= i; ++j) {
        float& pj = p[static_cast<std::size_t>(j)];
        pj /= l;
        float dpj = 0;
        for (I64 c = 0; c < d; ++c) {
          r.o[static_cast<std::size_t>((i * H + h) * d + c)] += pj * v.get(j, kh, c);
          dpj += d_o.get(i, h, c) * v.get(j, kh, c);
        }
        dp[static_cast<std::size_t>(j)] = dpj;
        delta += pj * dpj;
      }
      for (I64 j = 0; j <= i; ++j) {
        const float pj = p[static_cast<std::size_t>(j)], ds = pj * (dp[static_cast<std::size_t>(j)] - delta);
        for (I64 c = 0; c < d; ++c) {
          r.dq[static_cast<std::size_t>((i * H + h) * d + c)] += scale * ds * k.get(j, kh, c);
          r.dk[static_cast<std::size_t>((j * k.heads + kh) * d + c)] += scale * ds * q.get(i, h, c);
          r.dv[static_cast<std::size_t>((j * k.heads + kh) * d + c)] += pj * d_o.get(i, h, c);
        }
      }
    }
  }
  return r;
}

// Issue 35 (F5): the backward recomputed the scores as scale * (q . k)
// while the forward had formed the LSE from (scale * q) . k; at scale 1e6
// the two roundings differ by ~1e-7 |s|, so P = exp(s - lse) was 37% off in
// dV, and from 1e10 exp overflowed to Inf/NaN. At every finite scale and
// magnitude here, O, dQ, dK and dV must be as close to the float64
// reference as the fp32 computation above, within 4x and an absolute floor
// of 2e-5 of each tensor's natural size (for dQ and dK, whose true value
// cancels to ~0 once P is one-hot: |scale| |dO . v| |k|, resp. |q|; the
// fp32 LSE and delta = rowsum(dO O) leave an error of that order times eps).
TEST(AttentionBackward, ExtremeScalesAndMagnitudesAreAsAccurateAsFp32) {
  const I64 T = 70, d = 16;
  struct Case {
    float scale, amp_qk;
  };
  const std::vector<const char*> targets = runnable_targets();
  for (const Case cs : {Case{1e-6f, 1.0f}, Case{0.25f, 1.0f}, Case{1e3f, 1.0f}, Case{1e6f, 1.0f}, Case{1e10f, 1.0f},
                        Case{1e20f, 1.0f}, Case{1e30f, 1e-3f}, Case{0.25f, 1e3f}, Case{1e-20f, 1e10f}})
  for (const char* target_name : targets) {
    const TargetScope target(target_name);
    SCOPED_TRACE(std::string(target_name) + ": scale " + std::to_string(cs.scale) + " |q|,|k| <= " +
                 std::to_string(cs.amp_qk));
    std::mt19937_64 rng(35);
    Buf q(DType::kF32, T, 2, d), k(DType::kF32, T, 1, d), v(DType::kF32, T, 1, d), o(DType::kF32, T, 2, d),
        lse(DType::kF32, T, 2, 1), d_o(DType::kF32, T, 2, d), dq(DType::kF32, T, 2, d), dk(DType::kF32, T, 1, d),
        dv(DType::kF32, T, 1, d);
    q.fill(rng, cs.amp_qk);
    k.fill(rng, cs.amp_qk);
    v.fill(rng, 1.0f);
    d_o.fill(rng, 1.0f);
    const std::vector<Fragment> frags = {{0, 0, T, 0, T}};
    ForwardArgs fa{q.cview(), k.cview(), v.cview(), o.view(), lse.view(), frags, kFullCausal, cs.scale, 1, 0.0};
    ASSERT_TRUE(attention_forward(fa).ok());
    BackwardArgs ba{q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(), dk.view(),
                    dv.view(), frags, kFullCausal, cs.scale, 1};
    ASSERT_TRUE(attention_backward(ba).ok());
    auto rf = reference_forward(q.cview(), k.cview(), v.cview(), frags, kFullCausal, cs.scale);
    auto rb = reference_backward(q.cview(), k.cview(), v.cview(), d_o.cview(), frags, kFullCausal, cs.scale);
    ASSERT_TRUE(rf.ok() && rb.ok());
    const Fp32Grads f32 = fp32_attention(q, k, v, d_o, cs.scale);
    const double dov = d * 1.0, qk = cs.amp_qk;  // |dO . v| <= d with entries in [-1, 1]
    struct Tensor3 {
      const char* name;
      const std::vector<double>& ref;
      const std::vector<float>& fp32;
      const Buf& got;
      double natural;
    };
    for (const Tensor3& t : {Tensor3{"O", rf->o, f32.o, o, 1.0}, Tensor3{"dQ", rb->dq, f32.dq, dq, cs.scale * dov * qk},
                             Tensor3{"dK", rb->dk, f32.dk, dk, cs.scale * dov * qk},
                             Tensor3{"dV", rb->dv, f32.dv, dv, 1.0}}) {
      double got_err = 0, fp32_err = 0, ref_max = 0;
      for (I64 r = 0; r < t.got.rows; ++r)
        for (I64 h = 0; h < t.got.heads; ++h)
          for (I64 c = 0; c < d; ++c) {
            const auto i = static_cast<std::size_t>((r * t.got.heads + h) * d + c);
            ref_max = std::max(ref_max, std::abs(t.ref[i]));
            const double e = std::abs(static_cast<double>(t.got.get(r, h, c)) - t.ref[i]);
            got_err = std::isfinite(e) ? std::max(got_err, e) : INFINITY;
            fp32_err = std::max(fp32_err, std::abs(static_cast<double>(t.fp32[i]) - t.ref[i]));
          }
      const double size = std::max(ref_max, t.natural);
      EXPECT_LE(got_err / size, std::max(4 * fp32_err / size, 2e-5))
          << t.name << ": kernel error " << got_err << ", fp32 error " << fp32_err << ", size " << size;
    }
  }
}

TEST(AttentionForward, SelectsHeadRangesWithoutCopying) {
  // Heads [2, 4) of an 8-head Q and KV head 1 of a 4-head K/V equal the
  // reference on the same slices, and nothing outside the slice is written.
  std::mt19937_64 rng(7);
  const I64 T = 90, d = 32;
  Buf q(DType::kF32, T, 8, d), k(DType::kF32, T, 4, d), v(DType::kF32, T, 4, d), o(DType::kF32, T, 8, d),
      lse(DType::kF32, T, 8, 1);
  q.fill(rng, 1.0f);
  k.fill(rng, 1.0f);
  v.fill(rng, 1.0f);
  o.fill(rng, 9.0f);
  const Buf o_before = o;
  std::vector<Fragment> frags = {{0, 0, T, 0, T}};
  ForwardArgs fa{q.cview().heads_slice(2, 2), k.cview().heads_slice(1, 1), v.cview().heads_slice(1, 1),
                 o.view().heads_slice(2, 2), lse.view().heads_slice(2, 2), frags};
  ASSERT_TRUE(attention_forward(fa).ok());
  auto ref = reference_forward(fa.q, fa.k, fa.v, frags);
  ASSERT_TRUE(ref.ok());
  for (I64 r = 0; r < T; ++r)
    for (I64 h = 0; h < 8; ++h)
      for (I64 c = 0; c < d; ++c) {
        if (h == 2 || h == 3) {
          EXPECT_NEAR(o.get(r, h, c), ref->o[static_cast<std::size_t>((r * 2 + h - 2) * d + c)], 2e-5);
        } else {
          ASSERT_EQ(o.get(r, h, c), o_before.get(r, h, c));
        }
      }
}

TEST(AttentionBackward, IsBitwiseDeterministicForAFixedThreadCount) {
  Problem p;
  p.d = 32;
  p.hq = 2;
  p.hkv = 1;
  p.samples = {300, 40};
  p = layout(p, {{100, 200}, {}}, {0, 1, 2, 3}, 0);
  std::mt19937_64 rng(11);
  Buf q(DType::kF32, p.q_rows, 2, 32), k(DType::kF32, p.kv_rows, 1, 32), v(DType::kF32, p.kv_rows, 1, 32),
      o(DType::kF32, p.q_rows, 2, 32), lse(DType::kF32, p.q_rows, 2, 1), d_o(DType::kF32, p.q_rows, 2, 32);
  q.fill(rng, 1.0f);
  k.fill(rng, 1.0f);
  v.fill(rng, 1.0f);
  d_o.fill(rng, 1.0f);
  ForwardArgs fa{q.cview(), k.cview(), v.cview(), o.view(), lse.view(), p.frags, kFullCausal, 0.0f, 2, 0.0};
  ASSERT_TRUE(attention_forward(fa).ok());
  // On every runnable target (each has its own tile shape and prefetches).
  for (const char* t : runnable_targets()) {
    const TargetScope target(t);
    ASSERT_TRUE(target.ok());
    std::vector<std::vector<unsigned char>> runs;
    for (int rep = 0; rep < 2; ++rep) {
      Buf dq(DType::kF32, p.q_rows, 2, 32), dk(DType::kF32, p.kv_rows, 1, 32), dv(DType::kF32, p.kv_rows, 1, 32);
      BackwardArgs ba{q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(), dk.view(),
                      dv.view(), p.frags, kFullCausal, 0.0f, 2};
      ba.min_flops_per_thread = 0;
      ASSERT_TRUE(attention_backward(ba).ok());
      std::vector<unsigned char> all = dq.bytes;
      all.insert(all.end(), dk.bytes.begin(), dk.bytes.end());
      all.insert(all.end(), dv.bytes.begin(), dv.bytes.end());
      runs.push_back(all);
    }
    EXPECT_EQ(runs[0], runs[1]) << "target " << t;
  }
}

TEST(AttentionBackward, AccumulatesDqWhenAsked) {
  std::mt19937_64 rng(12);
  const I64 T = 70, d = 16;
  Buf q(DType::kF32, T, 1, d), k(DType::kF32, T, 1, d), v(DType::kF32, T, 1, d), o(DType::kF32, T, 1, d),
      lse(DType::kF32, T, 1, 1), d_o(DType::kF32, T, 1, d), dk(DType::kF32, T, 1, d), dv(DType::kF32, T, 1, d);
  q.fill(rng, 1.0f);
  k.fill(rng, 1.0f);
  v.fill(rng, 1.0f);
  d_o.fill(rng, 1.0f);
  std::vector<Fragment> frags = {{0, 0, T, 0, T}};
  ASSERT_TRUE(attention_forward({q.cview(), k.cview(), v.cview(), o.view(), lse.view(), frags}).ok());
  Buf dq(DType::kF32, T, 1, d);
  dq.fill(rng, 1.0f);
  const Buf dq0 = dq;
  BackwardArgs ba{q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(), dk.view(),
                  dv.view(), frags};
  ba.accumulate_dq = true;
  ASSERT_TRUE(attention_backward(ba).ok());
  auto g = reference_backward(q.cview(), k.cview(), v.cview(), d_o.cview(), frags);
  ASSERT_TRUE(g.ok());
  for (I64 r = 0; r < T; ++r)
    for (I64 c = 0; c < d; ++c)
      EXPECT_NEAR(dq.get(r, 0, c) - dq0.get(r, 0, c), g->dq[static_cast<std::size_t>(r * d + c)], 1e-5);
}

// Issue 21: NaN in gives NaN out in the same rows as plain attention (the
// fp64 reference), forward and backward; every other row keeps its value. A NaN or Inf q row used to give an
// all-zero row, and a NaN k row left every later query finite.
TEST(AttentionKernel, NanAndInfPropagateToTheSameElementsAsTheReference) {
  const I64 T = 150, d = 16;  // three key blocks: rows before, at and after the bad row
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* what;
    char tensor;  // 'q', 'k' or 'v'
    I64 row;
    float value;
    I64 window;
  };
  for (const Case& c : {Case{"NaN q row", 'q', 70, nan, kFullCausal}, Case{"+Inf q row", 'q', 3, inf, kFullCausal},
                        Case{"-Inf q row", 'q', 100, -inf, kFullCausal}, Case{"NaN k row", 'k', 70, nan, kFullCausal},
                        Case{"NaN k row, window", 'k', 70, nan, 20}, Case{"+Inf k row", 'k', 40, inf, kFullCausal},
                        Case{"NaN v row", 'v', 70, nan, kFullCausal}, Case{"NaN v row, window", 'v', 30, nan, 10}}) {
    SCOPED_TRACE(c.what);
    std::mt19937_64 rng(21);
    Buf q(DType::kF32, T, 1, d), k(DType::kF32, T, 1, d), v(DType::kF32, T, 1, d), o(DType::kF32, T, 1, d),
        lse(DType::kF32, T, 1, 1), d_o(DType::kF32, T, 1, d), dq(DType::kF32, T, 1, d), dk(DType::kF32, T, 1, d),
        dv(DType::kF32, T, 1, d);
    q.fill(rng, 1.0f);
    k.fill(rng, 1.0f);
    v.fill(rng, 1.0f);
    d_o.fill(rng, 1.0f);
    Buf& bad = c.tensor == 'q' ? q : c.tensor == 'k' ? k : v;
    bad.set(c.row, 0, 5, c.value);
    std::vector<Fragment> frags = {{0, 0, T, 0, T}};
    ASSERT_TRUE(attention_forward({q.cview(), k.cview(), v.cview(), o.view(), lse.view(), frags, c.window}).ok());
    BackwardArgs ba{q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(), dk.view(),
                    dv.view(), frags, c.window};
    ASSERT_TRUE(attention_backward(ba).ok());
    auto f = reference_forward(q.cview(), k.cview(), v.cview(), frags, c.window);
    auto g = reference_backward(q.cview(), k.cview(), v.cview(), d_o.cview(), frags, c.window);
    ASSERT_TRUE(f.ok() && g.ok());
    int nan_rows = 0;
    auto same = [&](const char* name, const std::vector<double>& ref, const Buf& got, I64 width) {
      for (I64 r = 0; r < T; ++r) {
        bool ref_nan = false, got_nan = false;
        for (I64 x = 0; x < width; ++x) {
          ref_nan |= !std::isfinite(ref[static_cast<std::size_t>(r * width + x)]);
          got_nan |= std::isnan(got.get(r, 0, x));
        }
        for (I64 x = 0; x < width && !ref_nan; ++x) {  // rows that stay finite keep their values
          const double a = ref[static_cast<std::size_t>(r * width + x)];
          EXPECT_NEAR(got.get(r, 0, x), a, 1e-4 * std::max(1.0, std::abs(a))) << name << " row " << r;
        }
        EXPECT_EQ(got_nan, ref_nan) << name << " row " << r;
        nan_rows += ref_nan;
      }
    };
    same("O", f->o, o, d);
    same("LSE", f->lse, lse, 1);
    same("dQ", g->dq, dq, d);
    same("dK", g->dk, dk, d);
    same("dV", g->dv, dv, d);
    EXPECT_GT(nan_rows, 0);  // the case does reach the outputs
  }
}

// Loss L = sum(O * dO); central differences of the reference forward pass.
TEST(AttentionReference, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(13);
  const I64 T = 7, d = 3;
  Buf q(DType::kF32, T, 2, d), k(DType::kF32, T, 1, d), v(DType::kF32, T, 1, d), d_o(DType::kF32, T, 2, d);
  q.fill(rng, 1.0f);
  k.fill(rng, 1.0f);
  v.fill(rng, 1.0f);
  d_o.fill(rng, 1.0f);
  std::vector<Fragment> frags = {{0, 0, T, 2, T}, {5, 0, T, 0, 2}};
  const I64 w = 4;
  auto loss = [&]() {
    auto f = reference_forward(q.cview(), k.cview(), v.cview(), frags, w);
    double l = 0;
    for (I64 r = 0; r < T; ++r)
      for (I64 h = 0; h < 2; ++h)
        for (I64 c = 0; c < d; ++c) l += f->o[static_cast<std::size_t>((r * 2 + h) * d + c)] * d_o.get(r, h, c);
    return l;
  };
  auto g = reference_backward(q.cview(), k.cview(), v.cview(), d_o.cview(), frags, w);
  ASSERT_TRUE(g.ok());
  // Kernel gradients for the same problem.
  Buf o(DType::kF32, T, 2, d), lse(DType::kF32, T, 2, 1), dq(DType::kF32, T, 2, d), dk(DType::kF32, T, 1, d),
      dv(DType::kF32, T, 1, d);
  ASSERT_TRUE(attention_forward({q.cview(), k.cview(), v.cview(), o.view(), lse.view(), frags, w}).ok());
  ASSERT_TRUE(attention_backward({q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(),
                                  dk.view(), dv.view(), frags, w})
                  .ok());
  auto check = [&](Buf& x, const std::vector<double>& grad, const Buf& kernel_grad, I64 heads) {
    for (I64 r = 0; r < T; ++r)
      for (I64 h = 0; h < heads; ++h)
        for (I64 c = 0; c < d; ++c) {
          const float x0 = x.get(r, h, c);
          const float eps = 1e-2f;
          x.set(r, h, c, x0 + eps);
          const double up = loss();
          x.set(r, h, c, x0 - eps);
          const double down = loss();
          x.set(r, h, c, x0);
          const double fd = (up - down) / (2.0 * static_cast<double>(eps));
          const double an = grad[static_cast<std::size_t>((r * heads + h) * d + c)];
          EXPECT_NEAR(an, fd, 1e-4 * std::max(1.0, std::abs(fd))) << "row " << r << " head " << h << " c " << c;
          EXPECT_NEAR(kernel_grad.get(r, h, c), fd, 1e-4 * std::max(1.0, std::abs(fd)));
        }
  };
  check(q, g->dq, dq, 2);
  check(k, g->dk, dk, 1);
  check(v, g->dv, dv, 1);
}

TEST(AttentionForward, EmptyFragmentsAreNoOps) {
  Buf q(DType::kF32, 4, 1, 8), k(DType::kF32, 4, 1, 8), v(DType::kF32, 4, 1, 8), o(DType::kF32, 4, 1, 8),
      lse(DType::kF32, 4, 1, 1);
  std::vector<Fragment> frags = {{0, 0, 4, 2, 2}};
  EXPECT_TRUE(attention_forward({q.cview(), k.cview(), v.cview(), o.view(), lse.view(), frags}).ok());
  EXPECT_TRUE(attention_forward({q.cview(), k.cview(), v.cview(), o.view(), lse.view(), {}}).ok());
}

// Bad input: a clear error naming the rule, never a read out of bounds.
class BadInput : public ::testing::Test {
 protected:
  Buf q{DType::kF32, 10, 4, 8}, k{DType::kF32, 10, 2, 8}, v{DType::kF32, 10, 2, 8}, o{DType::kF32, 10, 4, 8},
      lse{DType::kF32, 10, 4, 1};
  std::vector<Fragment> frags = {{0, 0, 10, 0, 10}};
  ForwardArgs args() { return {q.cview(), k.cview(), v.cview(), o.view(), lse.view(), frags}; }
  void expect_error(const ForwardArgs& a, const std::string& needle) {
    Status s = attention_forward(a);
    ASSERT_FALSE(s.ok()) << "expected an error mentioning '" << needle << "'";
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidInput);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
};

TEST_F(BadInput, ValidArgumentsPass) { EXPECT_TRUE(attention_forward(args()).ok()); }

TEST_F(BadInput, NullPointer) {
  auto a = args();
  a.k.data = nullptr;
  expect_error(a, "tensor k: data pointer is null");
}

TEST_F(BadInput, OutOfRangeHeadSlice) {
  auto a = args();
  a.q = q.cview().heads_slice(3, 2);
  expect_error(a, "tensor q: data pointer is null");
}

TEST_F(BadInput, RowStrideTooSmall) {
  auto a = args();
  a.v.row_stride = 15;
  expect_error(a, "tensor v: row_stride 15 must be >= heads * head_dim = 16");
}

TEST_F(BadInput, HeadsThatDoNotDivide) {
  auto a = args();
  a.k = k.cview().heads_slice(0, 1);
  a.v = v.cview().heads_slice(0, 1);
  a.q = q.cview().heads_slice(0, 3);
  a.o = o.view().heads_slice(0, 3);
  a.lse = lse.view().heads_slice(0, 3);
  EXPECT_TRUE(attention_forward(a).ok());
  a.k = k.cview();
  a.v = v.cview();
  expect_error(a, "query heads 3 must be a multiple of KV heads 2");
}

TEST_F(BadInput, MismatchedShapes) {
  auto a = args();
  a.o.rows = 9;
  expect_error(a, "tensor o has shape [9, 4, 8] but must match q");
  a = args();
  a.v.head_dim = 4;
  a.v.row_stride = 8;
  expect_error(a, "tensor v has shape");
  a = args();
  a.lse.dtype = DType::kBF16;
  expect_error(a, "tensor lse must be fp32");
  a = args();
  a.lse.dtype = DType::kF16;
  expect_error(a, "tensor lse must be fp32 [10, 4, 1], got fp16 [10, 4, 1]");
}

TEST_F(BadInput, UnknownDtypeCode) {
  auto a = args();
  a.q.dtype = static_cast<DType>(3);
  expect_error(a, "attention_forward: tensor q: dtype code 3 is not fp32, bf16 or fp16");
  // Mixed fp16/fp32 views are fine.
  a = args();
  Buf q16{DType::kF16, 10, 4, 8}, o16{DType::kF16, 10, 4, 8};
  a.q = q16.cview();
  a.o = o16.view();
  EXPECT_TRUE(attention_forward(a).ok());
}

TEST_F(BadInput, FragmentsOutsideTheirSample) {
  auto a = args();
  frags = {{0, 0, 10, 5, 4}};
  a.fragments = frags;
  expect_error(a, "fragment 0: query range [5, 4) must satisfy 0 <= a <= e <= sample_len 10");
  frags = {{0, 0, 8, 0, 9}};
  a.fragments = frags;
  expect_error(a, "sample_len 8");
  frags = {{0, 0, 10, -1, 3}};
  a.fragments = frags;
  expect_error(a, "must satisfy 0 <= a");
}

TEST_F(BadInput, FragmentRowsOutsideTheViews) {
  auto a = args();
  frags = {{5, 0, 10, 0, 6}};
  a.fragments = frags;
  expect_error(a, "query rows [5, 5 + 6) lie outside q's 10 rows");
  frags = {{0, 3, 10, 0, 8}};
  a.fragments = frags;
  expect_error(a, "key rows [3, 3 + 8) lie outside k's 10 rows");
  frags = {{0, 0, 20, 0, 1}, {1, 0, 20, 12, 20}};
  a.fragments = frags;
  expect_error(a, "key rows [0, 0 + 20)");
}

TEST_F(BadInput, OverlappingQueryRows) {
  auto a = args();
  frags = {{0, 0, 10, 0, 5}, {4, 0, 10, 5, 10}};
  a.fragments = frags;
  expect_error(a, "fragments overlap in query rows at row 4");
}

TEST_F(BadInput, WindowThreadsAndScale) {
  auto a = args();
  a.window = 0;
  expect_error(a, "window must be >= 1, got 0");
  a = args();
  a.threads = 0;
  expect_error(a, "threads must be in [1, 1024], got 0");
  a = args();
  a.softmax_scale = NAN;
  expect_error(a, "softmax_scale must be finite");
}

TEST_F(BadInput, BackwardChecksGradientShapes) {
  Buf dq(DType::kF32, 10, 4, 8), dk(DType::kF32, 10, 2, 8), dv(DType::kF32, 9, 2, 8), d_o(DType::kF32, 10, 4, 8);
  BackwardArgs b{q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.cview(), dq.view(), dk.view(),
                 dv.view(), frags};
  Status s = attention_backward(b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("attention_backward: tensor dv has shape [9, 2, 8]"), std::string::npos)
      << s.message();
  auto r = reference_forward(q.cview(), k.cview(), v.cview(), std::vector<Fragment>{{0, 0, 10, 3, 11}});
  EXPECT_FALSE(r.ok());
}

// Property: random samples, fragment layouts, windows, head groupings,
// dtypes, strides and thread counts all match the reference.
RC_GTEST_PROP(AttentionKernel, MatchesReferenceOnRandomLayouts, ()) {
  Problem p;
  const int dsel = *rc::gen::inRange(0, 10);
  p.d = dsel == 0 ? 128 : dsel == 1 ? 64 : *rc::gen::inRange<I64>(1, 40);
  const I64 max_len = p.d >= 64 ? 90 : 160;
  p.hkv = *rc::gen::inRange<I64>(1, 3);
  p.hq = p.hkv * *rc::gen::inRange<I64>(1, 4);
  p.dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  p.threads = *rc::gen::inRange(1, 4);
  p.pad = *rc::gen::inRange<I64>(0, 3);
  static const std::vector<const char*> targets = runnable_targets();
  p.target = *rc::gen::elementOf(targets);
  const int wsel = *rc::gen::inRange(0, 4);
  p.window = wsel == 0 ? kFullCausal : wsel == 1 ? 1 : *rc::gen::inRange<I64>(1, 2 * max_len);
  const auto nsamples = *rc::gen::inRange<std::size_t>(1, 4);
  std::vector<std::vector<I64>> cuts;
  std::size_t nfrag = 0;
  for (std::size_t s = 0; s < nsamples; ++s) {
    const I64 len = *rc::gen::inRange<I64>(1, max_len + 1);
    p.samples.push_back(len);
    cuts.push_back(*rc::gen::container<std::vector<I64>>(*rc::gen::inRange<std::size_t>(0, 4),
                                                        rc::gen::inRange<I64>(1, len + 1)));
    nfrag += cuts.back().size() + 1;
  }
  // A random subset of fragments in a random order.
  std::vector<std::size_t> order(nfrag);
  for (std::size_t i = 0; i < nfrag; ++i) order[i] = i;
  const auto keys = *rc::gen::container<std::vector<int>>(nfrag, rc::gen::inRange(0, 1000));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return keys[x] < keys[y]; });
  order.resize(*rc::gen::inRange<std::size_t>(1, nfrag + 1));
  p = layout(p, cuts, order, *rc::gen::inRange<I64>(0, 3));
  const Outcome r = check_problem(p, *rc::gen::arbitrary<std::uint64_t>());
  RC_LOG() << "d " << p.d << " hq " << p.hq << " hkv " << p.hkv << " dtype " << dtype_name(p.dtype) << " window "
           << p.window << " threads " << p.threads << " target " << p.target << ": " << r.what << '\n';
  RC_ASSERT(r.ok);
}

}  // namespace
}  // namespace libra::kernel
