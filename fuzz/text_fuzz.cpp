// Fuzzes the plain-text length reader: never crashes, errors are one line,
// and whatever it accepts survives a write/read round trip.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.hpp"
#include "libra/corpus.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = parse_length_lines(text, "fuzz.txt");
  if (!r.ok()) {
    fuzz::require_one_line(r.error());
    return 0;
  }
  for (std::int64_t l : *r) fuzz::require(l > 0);
  auto again = parse_length_lines(format_length_lines(*r), "again.txt");
  fuzz::require(again.ok() && *again == *r);
  return 0;
}
