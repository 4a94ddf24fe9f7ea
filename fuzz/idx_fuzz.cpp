// Fuzzes the Megatron .idx reader on arbitrary bytes: never crashes or reads
// out of bounds, errors are one line naming a byte offset, accepted files
// have exactly the sizes the header promises.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_util.hpp"
#include "libra/corpus.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  auto r = parse_megatron_idx(std::span<const unsigned char>(data, size), "fuzz.idx");
  if (!r.ok()) {
    fuzz::require_one_line(r.error());
    fuzz::require(r.error().message().rfind("fuzz.idx: byte ", 0) == 0);
    return 0;
  }
  fuzz::require(!r->empty());
  for (std::int64_t l : *r) fuzz::require(l > 0);
  fuzz::require(size >= 34 + 12 * r->size());
  return 0;
}
