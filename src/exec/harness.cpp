// The check harness of the executors (tests, `libra exec --check`):
// deterministic data, a whole-sequence reference, error metrics and
// tolerances. Built as libra_exec_harness, which tests and the CLI link; it
// is not part of the installed library.
#include "exec/harness.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "libra/attention_reference.hpp"
#include "libra/kernel.hpp"
#include "libra/splitmix64.hpp"

namespace libra {

float harness_value(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + stream * 0xd1b54a32d192ed03ULL + index + 0x632be59bd9b4e019ULL;
  z = splitmix64_mix(z);
  // 24 random bits -> [-1, 1).
  return static_cast<float>(static_cast<double>(z >> 40) / 8388608.0 - 1.0);
}

namespace {

int tensor_heads(const PlanConfig& c, int tensor) { return (tensor == 1 || tensor == 2) ? c.shape.heads_kv : c.shape.heads_q; }

// The value of element (token, head, col) of a slot's whole tensor, rounded
// to the plan's element type so every party computes on the same numbers.
float slot_value(std::uint64_t seed, const PlanConfig& c, int slot, int tensor, std::int64_t token, int head,
                 std::int64_t col) {
  const auto heads = static_cast<std::uint64_t>(tensor_heads(c, tensor));
  const std::uint64_t idx = (static_cast<std::uint64_t>(token) * heads + static_cast<std::uint64_t>(head)) *
                                static_cast<std::uint64_t>(c.shape.head_dim) +
                            static_cast<std::uint64_t>(col);
  float v = harness_value(seed, static_cast<std::uint64_t>(slot) * 8u + static_cast<std::uint64_t>(tensor), idx);
  v = round_to(c.shape.dtype, v);
  return v;
}

}  // namespace

std::vector<float> harness_home_tensor(std::uint64_t seed, const PlanConfig& c, int worker, int tensor) {
  const int slot = worker / c.cp;
  const HomeMap map = c.home_map();
  const std::int64_t lc = map.rows();
  const int heads = tensor_heads(c, tensor);
  std::vector<float> out(static_cast<std::size_t>(lc * heads * c.shape.head_dim));
  std::size_t i = 0;
  for (std::int64_t row = 0; row < lc; ++row) {
    const std::int64_t t = map.packed_row(worker % c.cp, row);
    for (int h = 0; h < heads; ++h)
      for (std::int64_t col = 0; col < c.shape.head_dim; ++col) out[i++] = slot_value(seed, c, slot, tensor, t, h, col);
  }
  return out;
}

Result<SlotReference> harness_reference(std::uint64_t seed, const PlanConfig& c, const PackedSequence& sequence,
                                        int slot, ReferenceKind kind, int threads) {
  const std::int64_t L = c.seq_len;
  std::vector<std::vector<float>> whole(4);
  for (int tensor = 0; tensor < 4; ++tensor) {
    const int heads = tensor_heads(c, tensor);
    auto& v = whole[static_cast<std::size_t>(tensor)];
    v.resize(static_cast<std::size_t>(L * heads * c.shape.head_dim));
    std::size_t i = 0;
    for (std::int64_t t = 0; t < L; ++t)
      for (int h = 0; h < heads; ++h)
        for (std::int64_t col = 0; col < c.shape.head_dim; ++col) v[i++] = slot_value(seed, c, slot, tensor, t, h, col);
  }
  const std::int64_t d = c.shape.head_dim;
  kernel::ConstTensor q{whole[0].data(), kernel::DType::kF32, L, c.shape.heads_q, d, c.shape.heads_q * d};
  kernel::ConstTensor k{whole[1].data(), kernel::DType::kF32, L, c.shape.heads_kv, d, c.shape.heads_kv * d};
  kernel::ConstTensor v{whole[2].data(), kernel::DType::kF32, L, c.shape.heads_kv, d, c.shape.heads_kv * d};
  kernel::ConstTensor d_o{whole[3].data(), kernel::DType::kF32, L, c.shape.heads_q, d, c.shape.heads_q * d};
  std::vector<kernel::Fragment> frags;
  std::int64_t start = 0;
  for (std::int64_t len : sequence) {
    frags.push_back({start, start, len, 0, len});
    start += len;
  }
  if (kind == ReferenceKind::kKernel) {
    const auto qn = static_cast<std::size_t>(L * c.shape.heads_q * d), kn = static_cast<std::size_t>(L * c.shape.heads_kv * d);
    std::vector<float> o(qn), lse(static_cast<std::size_t>(L * c.shape.heads_q)), dq(qn), dk(kn), dv(kn);
    kernel::Tensor to{o.data(), kernel::DType::kF32, L, c.shape.heads_q, d, c.shape.heads_q * d};
    kernel::Tensor tl{lse.data(), kernel::DType::kF32, L, c.shape.heads_q, 1, c.shape.heads_q};
    kernel::ForwardArgs fa{q, k, v, to, tl, frags};
    fa.window = c.shape.window;
    fa.threads = threads;
    LIBRA_TRY(kernel::attention_forward(fa));
    kernel::BackwardArgs ba;
    ba.q = q;
    ba.k = k;
    ba.v = v;
    ba.o = to;
    ba.d_o = d_o;
    ba.lse = tl;
    ba.dq = {dq.data(), kernel::DType::kF32, L, c.shape.heads_q, d, c.shape.heads_q * d};
    ba.dk = {dk.data(), kernel::DType::kF32, L, c.shape.heads_kv, d, c.shape.heads_kv * d};
    ba.dv = {dv.data(), kernel::DType::kF32, L, c.shape.heads_kv, d, c.shape.heads_kv * d};
    ba.fragments = frags;
    ba.window = c.shape.window;
    ba.threads = threads;
    LIBRA_TRY(kernel::attention_backward(ba));
    auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    return SlotReference{widen(o), widen(lse), widen(dq), widen(dk), widen(dv)};
  }
  LIBRA_ASSIGN_OR_RETURN(kernel::ReferenceForward f, kernel::reference_forward(q, k, v, frags, c.shape.window));
  LIBRA_ASSIGN_OR_RETURN(kernel::ReferenceBackward b, kernel::reference_backward(q, k, v, d_o, frags, c.shape.window));
  SlotReference out;
  out.o = std::move(f.o);
  out.lse = std::move(f.lse);
  out.dq = std::move(b.dq);
  out.dk = std::move(b.dk);
  out.dv = std::move(b.dv);
  return out;
}

void ErrorStats::merge(const ErrorStats& o) {
  max_abs = std::max(max_abs, o.max_abs);
  max_ref = std::max(max_ref, o.max_ref);
}

ErrorStats compare_home(std::span<const float> got, std::span<const double> reference, std::int64_t row_begin,
                        std::int64_t rows, std::int64_t row_width) {
  ErrorStats s;
  const auto off = static_cast<std::size_t>(row_begin * row_width);
  const auto n = static_cast<std::size_t>(rows * row_width);
  for (std::size_t i = 0; i < n && i < got.size() && off + i < reference.size(); ++i) {
    const double ref = reference[off + i];
    s.max_abs = std::max(s.max_abs, std::abs(static_cast<double>(got[i]) - ref));
    s.max_ref = std::max(s.max_ref, std::abs(ref));
  }
  if (got.size() != n || off + n > reference.size()) s.max_abs = std::numeric_limits<double>::infinity();
  return s;
}

ErrorStats compare_home(std::span<const float> got, std::span<const double> reference, const PlanConfig& config,
                        int worker, std::int64_t row_width) {
  const HomeMap map = config.home_map();
  const std::int64_t rows = map.rows();
  if (got.size() != static_cast<std::size_t>(rows * row_width)) {
    return {std::numeric_limits<double>::infinity(), 0};
  }
  ErrorStats s;
  for (std::int64_t i = 0; i < rows;) {
    const std::int64_t x = map.packed_row(worker % config.cp, i);
    const std::int64_t len = std::min(map.locate(x).run_end - x, rows - i);
    s.merge(compare_home(got.subspan(static_cast<std::size_t>(i * row_width), static_cast<std::size_t>(len * row_width)),
                         reference, x, len, row_width));
    i += len;
  }
  return s;
}

Tolerance tolerance_for(DType dtype) {
  // fp32: kernel accumulation error only. bf16: inputs are exact bf16
  // values for both sides, but O, dO and the partial sums travel in bf16
  // (8 significant bits), so errors of a few bf16 ulps are expected.
  if (dtype == DType::kF32) return {2e-5, 2e-5, 5e-5, 5e-5, 5e-5};
  // fp16 keeps 11 significant bits (bf16 8): measured errors ~3e-4.
  if (dtype == DType::kF16) return {2e-3, 2e-3, 5e-3, 5e-3, 5e-3};
  return {2e-2, 2e-2, 5e-2, 5e-2, 5e-2};
}

}  // namespace libra
