// libra/splitmix64.hpp: splitmix64 (Steele, Lea, Flood 2014), the one
// generator and hash behind libra's seeds, device noise, random placement and
// test data streams. Written out (not <random>) because it must give the
// same numbers on every machine and standard library.
//
//   std::uint64_t state = seed;
//   std::uint64_t a = libra::splitmix64_next(state);  // the stream: advances state
//   std::uint64_t h = libra::splitmix64(key);         // stateless: one step from `key`
//   std::uint64_t m = libra::splitmix64_mix(z);       // the output finaliser alone
#pragma once

#include <cstdint>

namespace libra {

inline constexpr std::uint64_t kSplitmix64Gamma = 0x9e3779b97f4a7c15ULL;

constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t splitmix64(std::uint64_t x) { return splitmix64_mix(x + kSplitmix64Gamma); }

constexpr std::uint64_t splitmix64_next(std::uint64_t& state) {
  state += kSplitmix64Gamma;
  return splitmix64_mix(state);
}

}  // namespace libra
