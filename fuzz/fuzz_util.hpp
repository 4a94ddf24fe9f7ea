// Shared checks for the corpus fuzz targets.
#pragma once

#include <cstdlib>
#include <string>

#include "libra/status.hpp"

namespace libra::fuzz {

// libFuzzer reports an abort as a crash with the input that caused it.
inline void require(bool condition) {
  if (!condition) std::abort();
}

// Every error is one printable line: the CLI prints it as is.
inline void require_one_line(const Error& e) {
  require(!e.message().empty());
  for (char c : e.message()) require(c >= 0x20 && c < 0x7f);
}

}  // namespace libra::fuzz
