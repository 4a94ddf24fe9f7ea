// Argument checks for the attention kernel and the reference: every view,
// stride and fragment is checked before any memory is touched.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "libra/checked.hpp"
#include "libra/kernel.hpp"

namespace libra::kernel {

namespace {

std::string s(std::int64_t x) { return std::to_string(x); }

template <class Void>
Status check_view(const char* call, const char* name, const BasicTensor<Void>& t) {
  const std::string at = std::string(call) + ": tensor " + name + ": ";
  if (t.data == nullptr) return invalid_input(at + "data pointer is null (or a slice was out of range)");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return invalid_input(at + "dtype code " + s(static_cast<int>(t.dtype)) + " is not fp32, bf16 or fp16");
  }
  if (t.rows < 0) return invalid_input(at + "rows must be >= 0, got " + s(t.rows));
  if (t.heads < 1) return invalid_input(at + "heads must be >= 1, got " + s(t.heads));
  if (t.head_dim < 1) return invalid_input(at + "head_dim must be >= 1, got " + s(t.head_dim));
  auto width = checked_mul(t.heads, t.head_dim);
  if (!width) return invalid_input(at + "heads * head_dim overflows");
  if (t.row_stride < *width) {
    return invalid_input(at + "row_stride " + s(t.row_stride) + " must be >= heads * head_dim = " + s(*width));
  }
  auto span = checked_mul(t.rows, t.row_stride);
  if (!span || !checked_mul(*span, dtype_bytes(t.dtype))) {
    return invalid_input(at + "rows * row_stride overflows");
  }
  return {};
}

template <class A, class B>
Status same_shape(const char* call, const char* na, const A& a, const char* nb, const B& b) {
  if (a.rows != b.rows || a.heads != b.heads || a.head_dim != b.head_dim) {
    return invalid_input(std::string(call) + ": tensor " + nb + " has shape [" + s(b.rows) + ", " + s(b.heads) +
                         ", " + s(b.head_dim) + "] but must match " + na + " [" + s(a.rows) + ", " + s(a.heads) +
                         ", " + s(a.head_dim) + "]");
  }
  return {};
}

Status check_common(const char* call, const ConstTensor& q, const ConstTensor& k, const ConstTensor& v,
                    const ConstTensor& lse, std::span<const Fragment> frags, std::int64_t window, float scale,
                    int threads) {
  LIBRA_TRY(check_view(call, "q", q));
  LIBRA_TRY(check_view(call, "k", k));
  LIBRA_TRY(check_view(call, "v", v));
  LIBRA_TRY(check_view(call, "lse", lse));
  const std::string c = call;
  if (k.head_dim != q.head_dim) {
    return invalid_input(c + ": tensor k head_dim " + s(k.head_dim) + " must equal q head_dim " + s(q.head_dim));
  }
  LIBRA_TRY(same_shape(call, "k", k, "v", v));
  if (q.heads % k.heads != 0) {
    return invalid_input(c + ": query heads " + s(q.heads) + " must be a multiple of KV heads " + s(k.heads));
  }
  if (lse.dtype != DType::kF32 || lse.head_dim != 1 || lse.heads != q.heads || lse.rows != q.rows) {
    return invalid_input(c + ": tensor lse must be fp32 [" + s(q.rows) + ", " + s(q.heads) + ", 1], got " +
                         dtype_name(lse.dtype) + " [" + s(lse.rows) + ", " + s(lse.heads) + ", " +
                         s(lse.head_dim) + "]");
  }
  if (window < 1) return invalid_input(c + ": window must be >= 1, got " + s(window));
  if (!std::isfinite(scale)) return invalid_input(c + ": softmax_scale must be finite");
  if (threads < 1 || threads > 1024) {
    return invalid_input(c + ": threads must be in [1, 1024], got " + std::to_string(threads));
  }
  if (frags.size() > static_cast<std::size_t>(INT32_MAX)) return invalid_input(c + ": too many fragments");
  std::vector<std::pair<std::int64_t, std::int64_t>> qranges;
  for (std::size_t i = 0; i < frags.size(); ++i) {
    const Fragment& f = frags[i];
    const std::string at = c + ": fragment " + std::to_string(i) + ": ";
    if (f.a < 0 || f.a > f.e || f.e > f.sample_len) {
      return invalid_input(at + "query range [" + s(f.a) + ", " + s(f.e) + ") must satisfy 0 <= a <= e <= sample_len " +
                           s(f.sample_len));
    }
    if (f.a == f.e) continue;
    if (f.q_row < 0 || f.q_row > q.rows - (f.e - f.a)) {
      return invalid_input(at + "query rows [" + s(f.q_row) + ", " + s(f.q_row) + " + " + s(f.e - f.a) +
                           ") lie outside q's " + s(q.rows) + " rows");
    }
    if (f.kv_row < 0 || f.kv_row > k.rows - f.e) {
      return invalid_input(at + "key rows [" + s(f.kv_row) + ", " + s(f.kv_row) + " + " + s(f.e) +
                           ") lie outside k's " + s(k.rows) + " rows");
    }
    qranges.emplace_back(f.q_row, f.q_row + (f.e - f.a));
  }
  std::sort(qranges.begin(), qranges.end());
  for (std::size_t i = 1; i < qranges.size(); ++i) {
    if (qranges[i].first < qranges[i - 1].second) {
      return invalid_input(c + ": fragments overlap in query rows at row " + s(qranges[i].first) +
                           " (each query row may belong to one fragment per call)");
    }
  }
  return {};
}

}  // namespace

Status validate(const ForwardArgs& a) {
  constexpr const char* call = "attention_forward";
  LIBRA_TRY(check_view(call, "o", a.o));
  LIBRA_TRY(check_common(call, a.q, a.k, a.v, a.lse, a.fragments, a.window, a.softmax_scale, a.threads));
  LIBRA_TRY(same_shape(call, "q", a.q, "o", a.o));
  return {};
}

Status validate(const BackwardArgs& a) {
  constexpr const char* call = "attention_backward";
  LIBRA_TRY(check_view(call, "o", a.o));
  LIBRA_TRY(check_view(call, "d_o", a.d_o));
  LIBRA_TRY(check_view(call, "dq", a.dq));
  LIBRA_TRY(check_view(call, "dk", a.dk));
  LIBRA_TRY(check_view(call, "dv", a.dv));
  LIBRA_TRY(check_common(call, a.q, a.k, a.v, a.lse, a.fragments, a.window, a.softmax_scale, a.threads));
  LIBRA_TRY(same_shape(call, "q", a.q, "o", a.o));
  LIBRA_TRY(same_shape(call, "q", a.q, "d_o", a.d_o));
  LIBRA_TRY(same_shape(call, "q", a.q, "dq", a.dq));
  LIBRA_TRY(same_shape(call, "k", a.k, "dk", a.dk));
  LIBRA_TRY(same_shape(call, "k", a.k, "dv", a.dv));
  return {};
}

}  // namespace libra::kernel
