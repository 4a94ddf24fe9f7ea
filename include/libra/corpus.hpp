// libra/corpus.hpp: corpora of sample lengths, their readers and statistics.
//
// A corpus is either raw sample lengths in loader order, or packed sequences
// (each an ordered list of sample lengths). Sources are file paths or
// `builtin:NAME[:SEED]` synthetic corpora calibrated to the paper:
//   - plain text, one positive integer per line          -> raw
//   - JSON Lines, one JSON array of lengths per line       -> packed
//   - Megatron-LM `.idx` (MMIDIDX), memory-mapped          -> raw
//   - builtin:paper-1m, builtin:paper-256k                 -> raw
// The format of a file is detected from its content: the 9-byte `.idx` magic
// `MMIDIDX\0\0`, else JSON Lines when the first non-blank character is `[`,
// else plain text. See docs/corpora.md for the exact rules.
//
//   libra::Result<libra::Corpus> c = libra::load_corpus("builtin:paper-1m");
//   libra::Result<std::vector<libra::PackedSequence>> seqs =
//       libra::load_packed_sequences("builtin:paper-1m", std::nullopt);  // packed at its default length
//   libra::Result<libra::CorpusStats> s = libra::corpus_stats(*c);
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/status.hpp"
#include "libra/workload.hpp"  // PackedSequence

namespace libra {

enum class CorpusKind { kRaw, kPacked };

enum class CorpusFormat { kText, kJsonLines, kMegatronIdx, kBuiltin };

struct Corpus {
  CorpusKind kind = CorpusKind::kRaw;
  std::string source;                      // what the user named: path or builtin:NAME
  std::vector<std::int64_t> raw_lengths;   // kRaw: sample lengths in loader order
  std::vector<PackedSequence> packed;      // kPacked: packed sequences in loader order
  // Packed length the corpus was made for (builtins: 1'048'576 or 262'144);
  // 0 when unknown (a user's file).
  std::int64_t default_seq_len = 0;
  CorpusFormat format = CorpusFormat::kText;  // where the lengths came from
};

// Every length a reader accepts is a positive int64, and every total (corpus
// tokens, tokens of a packed sequence, F of a packed sequence) must fit in an
// int64; anything else is an input error naming the file and place.

// Reads a corpus from a path (format detected from content), "-" (standard
// input) or a builtin name. Errors name the file and the line or byte
// offset. Text and JSON Lines are read as a stream of lines, plain or gzip,
// holding at most one line (64 MiB) of the source (docs/corpora.md).
[[nodiscard]] Result<Corpus> load_corpus(const std::string& source);

// Packed sequences from any source: packed sources are returned as they are
// (checked against seq_len when given: a longer sequence is an error naming
// the file and line); raw sources are packed sequentially in loader order at
// seq_len, or at the corpus' default length when seq_len is not given (an
// error for raw files with no default). Overlong raw samples are split.
[[nodiscard]] Result<std::vector<PackedSequence>> load_packed_sequences(const std::string& source,
                                                                       std::optional<std::int64_t> seq_len);

// --- Readers on bytes already in memory (the fuzz targets call these
// directly; load_corpus reads files and pipes as a stream of lines through
// the same line parsers). `name` is the file name used in messages.

// Plain text: one positive integer per line; blank lines, surrounding spaces,
// tabs and a CR before the newline are allowed.
[[nodiscard]] Result<std::vector<std::int64_t>> parse_length_lines(std::string_view text, std::string_view name);

// JSON Lines: each non-blank line one JSON array of positive integers, the
// sample lengths of one packed sequence. When seq_len is given, a sequence
// of more than seq_len tokens is an error naming the line.
[[nodiscard]] Result<std::vector<PackedSequence>> parse_packed_jsonl(std::string_view text, std::string_view name,
                                                                    std::optional<std::int64_t> seq_len = std::nullopt);

// Megatron-LM `.idx` (little-endian): magic "MMIDIDX\0\0", uint64 version 1,
// uint8 dtype code (1..8), uint64 sequence count S, uint64 document count D,
// int32 lengths[S], int64 pointers[S], int64 document index[D]. The sizes,
// the pointers (consistent with lengths and dtype) and the document index
// (0 first, non-decreasing, S last) are all checked; errors give the byte
// offset. Returns the sequence lengths.
[[nodiscard]] Result<std::vector<std::int64_t>> parse_megatron_idx(std::span<const unsigned char> bytes,
                                                                  std::string_view name);

inline constexpr std::string_view kMegatronIdxMagic{"MMIDIDX\0\0", 9};

// Detects the format of `bytes` and parses it into a corpus named `name`.
[[nodiscard]] Result<Corpus> parse_corpus(std::span<const unsigned char> bytes, const std::string& name);

// --- Writers (the inverse of the readers above).

// One length per line, each line ending in '\n'.
std::string format_length_lines(std::span<const std::int64_t> lengths);
// One JSON array per line, no spaces: "[3,5,12]\n".
std::string format_packed_jsonl(std::span<const PackedSequence> sequences);

// --- Built-in corpora.

// Names accepted after "builtin:".
std::vector<std::string> builtin_corpus_names();

struct BuiltinSpec {
  std::string name;                 // e.g. "paper-1m"
  std::int64_t default_seq_len;     // packed length (and the longest sample)
  std::int64_t samples;             // how many raw samples are generated
  std::uint64_t default_seed;
  double paper_median, paper_p99;   // the paper's published figures
};

// The specification of builtin `name` (without the "builtin:" prefix).
[[nodiscard]] Result<BuiltinSpec> builtin_corpus_spec(std::string_view name);

// Generates builtin `name` with `seed` (the spec's default seed when
// absent). `builtin:NAME:SEED` in load_corpus does the same. Reproducible
// bit for bit: a splitmix64 stream mapped to lengths by libra's own
// inverse-CDF code, no std:: distributions.
[[nodiscard]] Result<Corpus> builtin_corpus(std::string_view name, std::optional<std::uint64_t> seed = std::nullopt);

// --- Statistics.

// Percentiles are nearest-rank: the p-th percentile of n sorted values
// v[1..n] is v[ceil(p/100 * n)], so the median of an even count is the lower
// middle value. CV is the population standard deviation over the mean.
struct Distribution {
  std::int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0, cv = 0;
};

// Computes a Distribution of `values` (any order). Empty input gives all 0.
Distribution distribution_of(std::span<const std::int64_t> values);

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
