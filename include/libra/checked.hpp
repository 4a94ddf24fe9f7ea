// libra/checked.hpp: 64-bit integer arithmetic that reports overflow.
//
// Every workload, FLOP and byte count in libra is an exact int64. These
// helpers return std::nullopt instead of wrapping, so callers can turn an
// overflow into a clear input error.
//
//   std::optional<std::int64_t> sq = libra::checked_mul(l, l);
//   if (!sq) return libra::invalid_input("sample length too large");
#pragma once

#include <cstdint>
#include <optional>

namespace libra {

[[nodiscard]] inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

[[nodiscard]] inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace libra
