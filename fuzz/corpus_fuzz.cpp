// Fuzzes the whole path a user's file takes: format detection, statistics
// and packing with every packer and overlong policy. Checks that packing
// never exceeds L and conserves tokens.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_util.hpp"
#include "libra/corpus.hpp"
#include "libra/packing.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  if (size < 2) return 0;
  PackOptions o;
  o.seq_len = 1 + static_cast<std::int64_t>(data[0]) * 64;
  o.overlong = static_cast<OverlongPolicy>(data[1] % 3);
  o.packer = (data[1] / 3) % 2 == 0 ? PackerKind::kSequential : PackerKind::kBestFitDecreasing;
  auto c = parse_corpus(std::span<const unsigned char>(data + 2, size - 2), "fuzz.in");
  if (!c.ok()) {
    fuzz::require_one_line(c.error());
    return 0;
  }
  auto s = corpus_stats(*c);
  if (!s.ok()) {
    fuzz::require_one_line(s.error());
    return 0;
  }
  fuzz::require(s->samples > 0 && s->lengths.median <= s->lengths.max);
  if (c->kind != CorpusKind::kRaw) return 0;
  auto p = pack(c->raw_lengths, o);
  if (!p.ok()) {
    fuzz::require_one_line(p.error());
    return 0;
  }
  std::int64_t tokens = 0;
  for (const PackedSequence& seq : p->sequences) {
    std::int64_t t = 0;
    for (std::int64_t l : seq) t += l;
    fuzz::require(!seq.empty() && t <= o.seq_len);
    tokens += t;
  }
  fuzz::require(tokens == p->output_tokens && p->output_tokens + p->dropped_tokens == p->input_tokens);
  if (o.overlong == OverlongPolicy::kSplit) fuzz::require(p->dropped_tokens == 0);
  return 0;
}
