// placement/random.hpp (private): the reproducible randomness of the
// `random` placement mode. splitmix64 and an unbiased rejection mapping are
// written out here because std::uniform_int_distribution and std::shuffle
// differ between standard libraries, and a placement must be the same on
// every machine.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

namespace libra::placement_detail {

// One step of splitmix64 (Steele, Lea, Flood 2014): advances `state`.
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, n), n >= 1: rejects the 2^64 mod n lowest draws so that
// every residue is equally likely.
inline std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) {
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t x = splitmix64(state);
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

}  // namespace libra::placement_detail
