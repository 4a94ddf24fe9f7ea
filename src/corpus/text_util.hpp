// Internal helpers for corpus error messages.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace libra::detail {

// 'text' in single quotes for an error message: at most 40 characters
// (then "..."), and every byte outside printable ASCII written as \xNN so
// the message stays one printable line whatever the input holds.
inline std::string quoted(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out = "'";
  const std::size_t n = text.size() < kMax ? text.size() : kMax;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

}  // namespace libra::detail
