// The one decimal integer parser behind every integer the user types or a
// file holds: CLI flags (tools/libra), text corpus lines and builtin seeds
// (src/corpus). Decimal only: an optional '-' (signed types), then ASCII
// digits; leading zeros are decimal ("064" is 64, never octal), and '+',
// "0x", blanks and anything else are rejected, as is a value outside T.
//
//   auto r = libra::detail::parse_decimal<std::int64_t>("064");  // r.value 64, r.error kNone
//   parse_decimal<int>("0x400").error == DecimalError::kSyntax
//   parse_decimal<std::int64_t>("9223372036854775808").error == DecimalError::kRange
#pragma once

#include <concepts>
#include <limits>
#include <string_view>

namespace libra::detail {

enum class DecimalError { kNone, kSyntax, kRange };

template <std::integral T>
struct Decimal {
  T value = 0;
  DecimalError error = DecimalError::kNone;
  bool ok() const { return error == DecimalError::kNone; }
};

template <std::integral T>
constexpr Decimal<T> parse_decimal(std::string_view s) {
  Decimal<T> r;
  bool negative = false;
  if constexpr (std::is_signed_v<T>) {
    if (!s.empty() && s.front() == '-') {
      negative = true;
      s.remove_prefix(1);
    }
  }
  if (s.empty()) {
    r.error = DecimalError::kSyntax;
    return r;
  }
  for (char c : s) {
    if (c < '0' || c > '9') {
      r.error = DecimalError::kSyntax;
      return r;
    }
  }
  // Accumulate towards the sign so the most negative value parses too.
  T v = 0;
  for (char c : s) {
    const T digit = static_cast<T>(c - '0');
    if (__builtin_mul_overflow(v, T{10}, &v) ||
        (negative ? __builtin_sub_overflow(v, digit, &v) : __builtin_add_overflow(v, digit, &v))) {
      r.error = DecimalError::kRange;
      return r;
    }
  }
  r.value = v;
  return r;
}

}  // namespace libra::detail
