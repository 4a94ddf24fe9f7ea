// Fuzzes the JSON Lines packed-sequence reader, with and without a packed
// length: never crashes, errors are one line, accepted input round-trips and
// respects the packed length.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.hpp"
#include "libra/corpus.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  if (size < 1) return 0;
  // The first byte picks the packed length: none, or 1..255 * 16.
  const std::int64_t pick = data[0];
  const std::optional<std::int64_t> seq_len = pick == 0 ? std::nullopt : std::optional<std::int64_t>(pick * 16);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto r = parse_packed_jsonl(text, "fuzz.jsonl", seq_len);
  if (!r.ok()) {
    fuzz::require_one_line(r.error());
    return 0;
  }
  for (const PackedSequence& s : *r) {
    fuzz::require(!s.empty());
    std::int64_t t = 0;
    for (std::int64_t l : s) {
      fuzz::require(l > 0);
      t += l;
    }
    if (seq_len) fuzz::require(t <= *seq_len);
  }
  auto again = parse_packed_jsonl(format_packed_jsonl(*r), "again.jsonl");
  fuzz::require(again.ok() && *again == *r);
  return 0;
}
