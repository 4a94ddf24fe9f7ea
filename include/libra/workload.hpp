// libra/workload.hpp: the attention-workload arithmetic of the paper.
//
// Defines the packed-sequence workload proxy `F = sum l^2` (paper eq. 1/5),
// the exact causal query-key pair count of a query fragment (paper eq. 8,
// planning contract section 4) for full causal or sliding-window attention,
// and the conversion of pair counts to real forward/backward FLOPs.
// All counts are exact int64 with overflow reported as an input error.
//
//   std::vector<std::int64_t> seq = {3000, 500, 12};
//   libra::Result<std::int64_t> f = libra::workload_proxy(seq);        // 9'250'144
//   libra::Result<std::int64_t> p = libra::causal_pairs(0, 3000);      // 3000*3001/2
//   libra::Result<std::int64_t> b = libra::block_pairs(seq, 2048, 4096); // pairs of queries in [2048, 4096)
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "libra/status.hpp"

namespace libra {

// One packed sequence: the sample lengths of one slot, in packing order.
// Here in core, not corpus, so the planners do not depend on the readers.
using PackedSequence = std::vector<std::int64_t>;

// Window value meaning "unbounded": plain causal attention.
inline constexpr std::int64_t kFullCausal = std::numeric_limits<std::int64_t>::max();

// F = sum_j l_j^2. Lengths must be positive.
[[nodiscard]] Result<std::int64_t> workload_proxy(std::span<const std::int64_t> lengths);

// Number of causal (query, key) pairs of the sample-local query positions
// [a, e): sum_{q=a}^{e-1} min(q + 1, window). Requires 0 <= a <= e and
// window >= 1. Closed form, O(1).
[[nodiscard]] Result<std::int64_t> causal_pairs(std::int64_t a, std::int64_t e,
                                                std::int64_t window = kFullCausal);

// Pairs of the queries at packed positions [begin, end) of a packed sequence
// with the given sample lengths: the sum of causal_pairs over the fragment of
// every sample that intersects the range. Positions past the last sample are
// padding and cost nothing.
[[nodiscard]] Result<std::int64_t> block_pairs(std::span<const std::int64_t> lengths, std::int64_t begin,
                                               std::int64_t end, std::int64_t window = kFullCausal);

// Real FLOPs of `pairs` causal pairs per head times `heads` heads at head
// dimension `head_dim`: forward is two matrix products (QK^T and PV) at 2
// FLOPs per multiply-add, 4*d per pair; the FlashAttention-2 backward pass
// recomputes QK^T and forms dP, dV, dQ and dK, 10*d per pair.
[[nodiscard]] constexpr double forward_flops(std::int64_t pairs, std::int64_t head_dim) {
  return 4.0 * static_cast<double>(head_dim) * static_cast<double>(pairs);
}
[[nodiscard]] constexpr double backward_flops(std::int64_t pairs, std::int64_t head_dim) {
  return 10.0 * static_cast<double>(head_dim) * static_cast<double>(pairs);
}

}  // namespace libra
