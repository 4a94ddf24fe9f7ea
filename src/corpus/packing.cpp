// Sequential and best-fit-decreasing packers.
#include "libra/packing.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "libra/checked.hpp"

namespace libra {

namespace {

// The samples the packer places, after the overlong policy: an overlong
// sample becomes pieces of L then the remainder (split), one piece of L
// (truncate) or nothing (drop).
Result<std::vector<std::int64_t>> apply_overlong(std::span<const std::int64_t> lengths, const PackOptions& o,
                                                 PackResult& r) {
  const std::int64_t L = o.seq_len;
  // Check every length and the total first, and bound what splitting adds
  // (a 10^18-token line at L = 1 must be an error, not 10^18 pieces).
  std::int64_t extra_pieces = 0;
  const std::int64_t piece_limit = std::max<std::int64_t>(static_cast<std::int64_t>(lengths.size()), kMaxSplitPieces);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int64_t l = lengths[i];
    if (l <= 0) {
      return invalid_input("pack: sample " + std::to_string(i) + " has length " + std::to_string(l) +
                           "; lengths must be positive");
    }
    auto total = checked_add(r.input_tokens, l);
    if (!total) return invalid_input("pack: total token count exceeds the 64-bit range at sample " + std::to_string(i));
    r.input_tokens = *total;
    if (l > L && o.overlong == OverlongPolicy::kSplit) {
      extra_pieces += (l - 1) / L;  // ceil(l / L) - 1, no overflow
      if (extra_pieces > piece_limit) {
        return invalid_input("pack: splitting sample " + std::to_string(i) + " (length " + std::to_string(l) +
                             ") and those before it at seq_len " + std::to_string(L) + " makes more than " +
                             std::to_string(piece_limit) + " extra pieces; use a larger seq_len or --overlong truncate|drop");
      }
    }
  }
  std::vector<std::int64_t> items;
  items.reserve(lengths.size() + static_cast<std::size_t>(extra_pieces));
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int64_t l = lengths[i];
    if (l <= L) {
      items.push_back(l);
      continue;
    }
    ++r.overlong_samples;
    switch (o.overlong) {
      case OverlongPolicy::kSplit: {
        std::int64_t left = l;
        while (left > L) {
          items.push_back(L);
          left -= L;
        }
        items.push_back(left);  // 0 < left <= L
        break;
      }
      case OverlongPolicy::kTruncate:
        items.push_back(L);
        r.dropped_tokens += l - L;
        break;
      case OverlongPolicy::kDrop:
        r.dropped_tokens += l;
        break;
    }
  }
  r.input_samples = static_cast<std::int64_t>(lengths.size());
  r.output_tokens = r.input_tokens - r.dropped_tokens;
  return items;
}

std::vector<PackedSequence> pack_sequential(const std::vector<std::int64_t>& items, std::int64_t L) {
  std::vector<PackedSequence> out;
  PackedSequence current;
  std::int64_t room = L;
  for (std::int64_t l : items) {
    if (l > room) {
      out.push_back(std::move(current));
      current = {};
      room = L;
    }
    current.push_back(l);
    room -= l;
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

std::vector<PackedSequence> pack_best_fit_decreasing(const std::vector<std::int64_t>& items, std::int64_t L) {
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Longest first; equal lengths keep loader order so the result is unique.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return items[a] > items[b]; });
  std::vector<PackedSequence> bins;
  // Open bins by (room left, bin id): lower_bound finds the fullest bin the
  // item fits in, the oldest among equally full ones.
  std::set<std::pair<std::int64_t, std::size_t>> open;
  for (std::size_t idx : order) {
    const std::int64_t l = items[idx];
    auto it = open.lower_bound({l, 0});
    std::size_t bin;
    std::int64_t room;
    if (it == open.end()) {
      bin = bins.size();
      bins.emplace_back();
      room = L;
    } else {
      bin = it->second;
      room = it->first;
      open.erase(it);
    }
    bins[bin].push_back(l);
    room -= l;
    if (room > 0) open.insert({room, bin});
  }
  return bins;
}

}  // namespace

Result<PackResult> pack(std::span<const std::int64_t> lengths, const PackOptions& options) {
  if (options.seq_len < 1 || options.seq_len > kMaxSeqLen) {
    return invalid_input("pack: packed length " + std::to_string(options.seq_len) + " must be in [1, " +
                         std::to_string(kMaxSeqLen) + "]");
  }
  PackResult r;
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> items, apply_overlong(lengths, options, r));
  r.sequences = options.packer == PackerKind::kSequential ? pack_sequential(items, options.seq_len)
                                                          : pack_best_fit_decreasing(items, options.seq_len);
  return r;
}

Result<OverlongPolicy> parse_overlong_policy(std::string_view text) {
  if (text == "split") return OverlongPolicy::kSplit;
  if (text == "truncate") return OverlongPolicy::kTruncate;
  if (text == "drop") return OverlongPolicy::kDrop;
  return invalid_input("--overlong '" + std::string(text) + "': expected one of split, truncate, drop");
}

Result<PackerKind> parse_packer_kind(std::string_view text) {
  if (text == "sequential") return PackerKind::kSequential;
  if (text == "bfd") return PackerKind::kBestFitDecreasing;
  return invalid_input("--packer '" + std::string(text) + "': expected one of sequential, bfd");
}

std::string_view to_string(OverlongPolicy policy) {
  switch (policy) {
    case OverlongPolicy::kSplit: return "split";
    case OverlongPolicy::kTruncate: return "truncate";
    case OverlongPolicy::kDrop: return "drop";
  }
  return "?";
}

std::string_view to_string(PackerKind kind) {
  return kind == PackerKind::kSequential ? "sequential" : "bfd";
}

}  // namespace libra
