#include "libra/workload.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "libra/checked.hpp"

namespace libra {

namespace {
Error overflow(const char* what) {
  return invalid_input(std::string(what) + ": value exceeds the 64-bit range");
}
}  // namespace

Result<std::int64_t> workload_proxy(std::span<const std::int64_t> lengths) {
  std::int64_t total = 0;
  for (std::size_t j = 0; j < lengths.size(); ++j) {
    const std::int64_t l = lengths[j];
    if (l <= 0) {
      return invalid_input("workload proxy: sample " + std::to_string(j) + " has length " + std::to_string(l) +
                           "; lengths must be positive");
    }
    auto sq = checked_mul(l, l);
    if (!sq) return overflow("workload proxy: squared sample length");
    auto sum = checked_add(total, *sq);
    if (!sum) return overflow("workload proxy: sum of squared lengths");
    total = *sum;
  }
  return total;
}

// sum_{k=lo+1}^{hi} k = (hi*(hi+1) - lo*(lo+1)) / 2, computed as
// (hi - lo) * (hi + lo + 1) / 2 so that intermediates stay small.
static std::optional<std::int64_t> triangular_difference(std::int64_t lo, std::int64_t hi) {
  const std::int64_t n = hi - lo;
  const std::int64_t s = hi + lo + 1;  // n and s have opposite parity: one is even
  if (n % 2 == 0) return checked_mul(n / 2, s);
  return checked_mul(n, s / 2);
}

Result<std::int64_t> causal_pairs(std::int64_t a, std::int64_t e, std::int64_t window) {
  if (a < 0 || e < a) {
    return invalid_input("causal pair count: query range [" + std::to_string(a) + ", " + std::to_string(e) +
                         ") must satisfy 0 <= a <= e");
  }
  if (window < 1) {
    return invalid_input("causal pair count: window " + std::to_string(window) + " must be at least 1");
  }
  // Queries q < window see q + 1 keys (the triangle); queries q >= window see
  // exactly `window` keys (the band).
  const std::int64_t split = std::min(std::max(a, window), e);
  std::optional<std::int64_t> triangle = std::int64_t{0};
  if (split > a) triangle = triangular_difference(a, split);
  if (!triangle) return overflow("causal pair count");
  auto band = checked_mul(e - split, window == kFullCausal ? 0 : window);
  if (!band) return overflow("causal pair count");
  auto total = checked_add(*triangle, *band);
  if (!total) return overflow("causal pair count");
  return *total;
}

Result<std::int64_t> block_pairs(std::span<const std::int64_t> lengths, std::int64_t begin, std::int64_t end,
                                 std::int64_t window) {
  if (begin < 0 || end < begin) {
    return invalid_input("block pair count: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") must satisfy 0 <= begin <= end");
  }
  std::int64_t total = 0;
  std::int64_t offset = 0;
  for (std::size_t j = 0; j < lengths.size() && offset < end; ++j) {
    const std::int64_t l = lengths[j];
    if (l <= 0) {
      return invalid_input("block pair count: sample " + std::to_string(j) + " has length " + std::to_string(l) +
                           "; lengths must be positive");
    }
    auto next = checked_add(offset, l);
    if (!next) return overflow("block pair count: sequence length");
    const std::int64_t lo = std::max(begin, offset);
    const std::int64_t hi = std::min(end, *next);
    if (lo < hi) {
      LIBRA_ASSIGN_OR_RETURN(std::int64_t pairs, causal_pairs(lo - offset, hi - offset, window));
      auto sum = checked_add(total, pairs);
      if (!sum) return overflow("block pair count");
      total = *sum;
    }
    offset = *next;
  }
  return total;
}

}  // namespace libra
