// libra/corpus.hpp: corpora of sample lengths, their readers and statistics.
//
// A corpus is either raw sample lengths in loader order, or packed sequences
// (each an ordered list of sample lengths). Sources are file paths or
// `builtin:NAME` synthetic corpora calibrated to the paper:
//   - plain text, one positive integer per line          -> raw
//   - JSON Lines, one JSON array of lengths per line       -> packed
//   - Megatron-LM `.idx` (MMIDIDX), memory-mapped          -> raw
//   - builtin:paper-1m, builtin:paper-256k                 -> raw
//
//   libra::Result<libra::Corpus> c = libra::load_corpus("builtin:paper-1m");
//   libra::Result<std::vector<libra::PackedSequence>> seqs =
//       libra::load_packed_sequences("builtin:paper-1m", std::nullopt);  // packed at its default length
//   libra::Result<libra::CorpusStats> s = libra::corpus_stats(*c);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libra/status.hpp"

namespace libra {

// The sample lengths of one packed sequence, in order.
using PackedSequence = std::vector<std::int64_t>;

enum class CorpusKind { kRaw, kPacked };

struct Corpus {
  CorpusKind kind = CorpusKind::kRaw;
  std::string source;                      // what the user named: path or builtin:NAME
  std::vector<std::int64_t> raw_lengths;   // kRaw: sample lengths in loader order
  std::vector<PackedSequence> packed;      // kPacked: packed sequences in loader order
  // Packed length the corpus was made for (builtins: 1'048'576 or 262'144);
  // 0 when unknown (a user's file).
  std::int64_t default_seq_len = 0;
};

// Reads a corpus from a path (format detected from content/extension) or a
// builtin name. Errors name the file and the line or byte offset.
[[nodiscard]] Result<Corpus> load_corpus(const std::string& source);

// Packed sequences from any source: packed sources are returned as they are
// (checked against seq_len when given); raw sources are packed sequentially in
// loader order at seq_len, or at the corpus' default length when seq_len is
// not given (an error for raw files with no default).
[[nodiscard]] Result<std::vector<PackedSequence>> load_packed_sequences(const std::string& source,
                                                                       std::optional<std::int64_t> seq_len);

// Names accepted after "builtin:".
std::vector<std::string> builtin_corpus_names();

struct Distribution {
  std::int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0, cv = 0;
};

struct CorpusStats {
  CorpusKind kind = CorpusKind::kRaw;
  std::int64_t samples = 0;
  std::int64_t total_tokens = 0;
  Distribution lengths;                      // raw-sample lengths
  std::optional<Distribution> workloads;     // per packed sequence F = sum l^2 (packed input only)
  std::optional<Distribution> tokens_per_sequence;  // packed input only
};

[[nodiscard]] Result<CorpusStats> corpus_stats(const Corpus& corpus);

}  // namespace libra
