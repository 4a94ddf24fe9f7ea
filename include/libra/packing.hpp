// libra/packing.hpp: packers that turn raw sample lengths into packed sequences.
//
// Defines the sequential packer production data loaders use (samples in
// loader order; a new packed sequence starts when the next sample does not
// fit in the room left) and a workload-blind best-fit-decreasing packer, plus
// the handling of samples longer than the packed length L (split into pieces
// of at most L, truncate to L, or drop). Pure functions: no I/O, no state.
//
//   libra::PackOptions opts;
//   opts.seq_len = 262'144;
//   libra::Result<libra::PackResult> r = libra::pack(lengths, opts);
//   // r->sequences: every sequence holds at most seq_len tokens;
//   // r->dropped_tokens: tokens lost to --overlong truncate|drop (0 for split)
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/status.hpp"

namespace libra {

// Largest packed length whose F = sum l^2 <= L^2 is sure to fit in an int64.
inline constexpr std::int64_t kMaxSeqLen = 3'037'000'499;

// Splitting may add at most max(input samples, kMaxSplitPieces) pieces, so
// the output stays proportional to the input; more is an input error.
inline constexpr std::int64_t kMaxSplitPieces = std::int64_t{1} << 20;

enum class OverlongPolicy {
  kSplit,     // pieces of exactly L tokens, then the remainder, each packed as a sample
  kTruncate,  // keep the first L tokens
  kDrop,      // leave the sample out
};

enum class PackerKind {
  kSequential,          // loader order, new sequence when the next sample does not fit
  kBestFitDecreasing,   // longest first, into the fullest sequence it fits (ties: oldest)
};

struct PackOptions {
  std::int64_t seq_len = 0;  // L, in [1, kMaxSeqLen]
  OverlongPolicy overlong = OverlongPolicy::kSplit;
  PackerKind packer = PackerKind::kSequential;
};

struct PackResult {
  std::vector<PackedSequence> sequences;
  std::int64_t input_samples = 0;
  std::int64_t input_tokens = 0;
  std::int64_t output_tokens = 0;     // input_tokens - dropped_tokens
  std::int64_t overlong_samples = 0;  // samples longer than L (split, truncated or dropped)
  std::int64_t dropped_tokens = 0;    // tokens removed by truncate or drop
};

// Packs `lengths` (each positive, total within int64) under `options`.
// Errors: seq_len out of range, a non-positive length, a total overflow.
[[nodiscard]] Result<PackResult> pack(std::span<const std::int64_t> lengths, const PackOptions& options);

// "split" | "truncate" | "drop" and "sequential" | "bfd"; errors list the choices.
[[nodiscard]] Result<OverlongPolicy> parse_overlong_policy(std::string_view text);
[[nodiscard]] Result<PackerKind> parse_packer_kind(std::string_view text);
std::string_view to_string(OverlongPolicy policy);
std::string_view to_string(PackerKind kind);

}  // namespace libra
