// placement/random.hpp (private): the reproducible randomness of the
// `random` placement mode: libra's splitmix64 and an unbiased rejection
// mapping, because std::uniform_int_distribution and std::shuffle differ
// between standard libraries, and a placement must be the same on every
// machine.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "libra/splitmix64.hpp"

namespace libra::detail {

// Uniform in [0, n), n >= 1: rejects the 2^64 mod n lowest draws so that
// every residue is equally likely.
inline std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) {
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t x = splitmix64_next(state);
    if (x >= threshold) return x % n;
  }
}

// Fisher-Yates (Durstenfeld) from the back.
template <class T>
void shuffle(std::span<T> items, std::uint64_t seed) {
  std::uint64_t state = seed;
  for (std::size_t i = items.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(uniform_below(state, i));
    std::swap(items[i - 1], items[j]);
  }
}

}  // namespace libra::detail
