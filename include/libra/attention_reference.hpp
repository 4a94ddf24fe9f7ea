// libra/attention_reference.hpp: a naive double-precision attention
// reference, forward and backward, for testing kernels and executors.
//
// Same inputs as libra/kernel.hpp (views, fragments, window, scale), but every
// score is computed in double precision directly from the definition: no
// tiling, no online softmax, the backward pass recomputes the softmax from Q
// and K rather than trusting a forward output. Outputs are dense double
// arrays. O(sum over fragments of (e - a) * e * h_q * d): tiny shapes only.
//
//   using namespace libra::kernel;
//   libra::Result<ReferenceForward> ref = reference_forward(q, k, v, frags);
//   double o_0 = ref->o[(row * q.heads + head) * q.head_dim + c];
//   libra::Result<ReferenceBackward> g = reference_backward(q, k, v, d_o, frags);
//   double dk_0 = g->dk[(row * k.heads + head) * k.head_dim + c];
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "libra/kernel.hpp"
#include "libra/status.hpp"
#include "libra/workload.hpp"

namespace libra::kernel {

struct ReferenceForward {
  std::vector<double> o;    // [q.rows, q.heads, head_dim]; rows outside fragments are 0
  std::vector<double> lse;  // [q.rows, q.heads]; rows outside fragments are 0
};

struct ReferenceBackward {
  std::vector<double> dq;  // [q.rows, q.heads, head_dim]
  std::vector<double> dk;  // [k.rows, k.heads, head_dim], summed over fragments
  std::vector<double> dv;  // [k.rows, k.heads, head_dim], summed over fragments
};

// The views are validated with the kernel's rules (see kernel.hpp).
// softmax_scale 0 means 1 / sqrt(head_dim).
[[nodiscard]] Result<ReferenceForward> reference_forward(ConstTensor q, ConstTensor k, ConstTensor v,
                                                         std::span<const Fragment> fragments,
                                                         std::int64_t window = kFullCausal,
                                                         double softmax_scale = 0.0);

// Gradients of sum(O * dO) with respect to Q, K and V.
[[nodiscard]] Result<ReferenceBackward> reference_backward(ConstTensor q, ConstTensor k, ConstTensor v,
                                                           ConstTensor d_o, std::span<const Fragment> fragments,
                                                           std::int64_t window = kFullCausal,
                                                           double softmax_scale = 0.0);

}  // namespace libra::kernel
