// The naive double-precision reference: scores straight from the definition,
// two passes per query row (max, then normalised weights), no tiling.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernel/detail.hpp"
#include "libra/attention_reference.hpp"

namespace libra::kernel {

namespace {

double at(const ConstTensor& t, std::int64_t row, std::int64_t head, std::int64_t c) {
  return detail::load_elem(t.data, t.dtype, row * t.row_stride + head * t.head_dim + c);
}

// Scores of one query row against its visible keys [lo, hi], softmax
// weights and the log-sum-exp, all in double.
struct Row {
  std::int64_t lo = 0, hi = 0;
  std::vector<double> p;
  double lse = 0;
};

Row softmax_row(const ConstTensor& q, const ConstTensor& k, const Fragment& f, std::int64_t qpos, std::int64_t h,
                std::int64_t g, std::int64_t window, double scale) {
  Row r;
  r.lo = detail::first_key(qpos, window);
  r.hi = qpos;
  const std::int64_t qrow = f.q_row + (qpos - f.a);
  const std::int64_t d = q.head_dim;
  std::vector<double> s(static_cast<std::size_t>(r.hi - r.lo + 1));
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = r.lo; j <= r.hi; ++j) {
    double dot = 0;
    for (std::int64_t c = 0; c < d; ++c) dot += at(q, qrow, h, c) * at(k, f.kv_row + j, g, c);
    s[static_cast<std::size_t>(j - r.lo)] = scale * dot;
    m = std::max(m, scale * dot);
  }
  double sum = 0;
  for (double x : s) sum += std::exp(x - m);
  r.lse = m + std::log(sum);
  r.p.resize(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) r.p[i] = std::exp(s[i] - r.lse);
  return r;
}

double default_scale(double scale, std::int64_t d) {
  return scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(d)) : scale;
}

}  // namespace

Result<ReferenceForward> reference_forward(ConstTensor q, ConstTensor k, ConstTensor v,
                                           std::span<const Fragment> fragments, std::int64_t window,
                                           double softmax_scale) {
  // Validation reuses the kernel's rules with dummy outputs shaped like q.
  std::vector<float> dummy_lse(1);
  ForwardArgs probe{q, k, v, {}, {}, fragments, window, static_cast<float>(softmax_scale), 1};
  probe.o = Tensor{const_cast<void*>(q.data), q.dtype, q.rows, q.heads, q.head_dim, q.row_stride};
  probe.lse = Tensor{dummy_lse.data(), DType::kF32, q.rows, q.heads, 1, q.heads};
  LIBRA_TRY(validate(probe));
  const std::int64_t d = q.head_dim, hq = q.heads, hg = q.heads / k.heads;
  const double scale = default_scale(softmax_scale, d);
  ReferenceForward out;
  out.o.assign(static_cast<std::size_t>(q.rows * hq * d), 0.0);
  out.lse.assign(static_cast<std::size_t>(q.rows * hq), 0.0);
  for (const Fragment& f : fragments) {
    for (std::int64_t h = 0; h < hq; ++h) {
      for (std::int64_t qpos = f.a; qpos < f.e; ++qpos) {
        const Row r = softmax_row(q, k, f, qpos, h, h / hg, window, scale);
        const std::int64_t qrow = f.q_row + (qpos - f.a);
        out.lse[static_cast<std::size_t>(qrow * hq + h)] = r.lse;
        double* o = &out.o[static_cast<std::size_t>((qrow * hq + h) * d)];
        for (std::int64_t j = r.lo; j <= r.hi; ++j) {
          const double p = r.p[static_cast<std::size_t>(j - r.lo)];
          for (std::int64_t c = 0; c < d; ++c) o[c] += p * at(v, f.kv_row + j, h / hg, c);
        }
      }
    }
  }
  return out;
}

Result<ReferenceBackward> reference_backward(ConstTensor q, ConstTensor k, ConstTensor v, ConstTensor d_o,
                                             std::span<const Fragment> fragments, std::int64_t window,
                                             double softmax_scale) {
  std::vector<float> dummy_lse(1);
  ForwardArgs probe{q, k, v, {}, {}, fragments, window, static_cast<float>(softmax_scale), 1};
  probe.o = Tensor{const_cast<void*>(d_o.data), d_o.dtype, d_o.rows, d_o.heads, d_o.head_dim, d_o.row_stride};
  probe.lse = Tensor{dummy_lse.data(), DType::kF32, q.rows, q.heads, 1, q.heads};
  LIBRA_TRY(validate(probe));
  const std::int64_t d = q.head_dim, hq = q.heads, hkv = k.heads, hg = q.heads / k.heads;
  const double scale = default_scale(softmax_scale, d);
  ReferenceBackward out;
  out.dq.assign(static_cast<std::size_t>(q.rows * hq * d), 0.0);
  out.dk.assign(static_cast<std::size_t>(k.rows * hkv * d), 0.0);
  out.dv.assign(static_cast<std::size_t>(k.rows * hkv * d), 0.0);
  for (const Fragment& f : fragments) {
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t g = h / hg;
      for (std::int64_t qpos = f.a; qpos < f.e; ++qpos) {
        const Row r = softmax_row(q, k, f, qpos, h, g, window, scale);
        const std::int64_t qrow = f.q_row + (qpos - f.a);
        // dP_j = dO . V_j ; dS_j = P_j (dP_j - sum_i P_i dP_i)
        std::vector<double> dp(r.p.size());
        double delta = 0;
        for (std::int64_t j = r.lo; j <= r.hi; ++j) {
          double dot = 0;
          for (std::int64_t c = 0; c < d; ++c) dot += at(d_o, qrow, h, c) * at(v, f.kv_row + j, g, c);
          dp[static_cast<std::size_t>(j - r.lo)] = dot;
          delta += r.p[static_cast<std::size_t>(j - r.lo)] * dot;
        }
        double* dq = &out.dq[static_cast<std::size_t>((qrow * hq + h) * d)];
        for (std::int64_t j = r.lo; j <= r.hi; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j - r.lo);
          const double ds = r.p[jj] * (dp[jj] - delta);
          const std::int64_t krow = f.kv_row + j;
          double* dk = &out.dk[static_cast<std::size_t>((krow * hkv + g) * d)];
          double* dv = &out.dv[static_cast<std::size_t>((krow * hkv + g) * d)];
          for (std::int64_t c = 0; c < d; ++c) {
            dq[c] += scale * ds * at(k, krow, g, c);
            dk[c] += scale * ds * at(q, qrow, h, c);
            dv[c] += r.p[jj] * at(d_o, qrow, h, c);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace libra::kernel
