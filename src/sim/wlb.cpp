// The wlb baseline's repacker.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "libra/simulator.hpp"

namespace libra {

Result<WlbRepack> wlb_repack(std::span<const PackedSequence> window, std::int64_t seq_len, std::int64_t count) {
  if (seq_len < 1) return invalid_input(fmt::format("wlb repack: seq_len {} must be positive", seq_len));
  if (count < 1) return invalid_input(fmt::format("wlb repack: sequence count {} must be positive", count));
  std::vector<std::int64_t> samples;
  for (const auto& s : window) {
    for (std::int64_t l : s) {
      if (l < 1) return invalid_input(fmt::format("wlb repack: sample length {} must be positive", l));
      samples.push_back(l);
    }
  }
  std::vector<std::size_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return samples[a] > samples[b]; });
  WlbRepack out;
  const auto n = static_cast<std::size_t>(count);
  out.sequences.resize(n);
  std::vector<std::int64_t> room(n, seq_len);
  // F stays exact: every sequence holds at most seq_len tokens, and the
  // corpus stage already bounds seq_len^2 within int64.
  std::vector<std::int64_t> load(n, 0);
  for (std::size_t i : order) {
    std::int64_t l = samples[i];
    // Least F among sequences with room (ties: lowest index). Sequences are
    // few (GBS), so a linear scan is simplest and exact.
    std::size_t best = n;
    for (std::size_t k = 0; k < n; ++k) {
      if (room[k] >= l && (best == n || load[k] < load[best])) best = k;
    }
    if (best != n) {
      out.sequences[best].push_back(l);
      room[best] -= l;
      load[best] += l * l;
      continue;
    }
    // Fits nowhere: cut it, filling the sequences with the most room first.
    ++out.split_samples;
    while (l > 0) {
      const std::size_t k = static_cast<std::size_t>(std::max_element(room.begin(), room.end()) - room.begin());
      if (room[k] == 0) {
        return invalid_input(fmt::format("wlb repack: the window's tokens exceed {} sequences of {} tokens", count,
                                         seq_len));
      }
      const std::int64_t piece = std::min(l, room[k]);
      out.sequences[k].push_back(piece);
      room[k] -= piece;
      load[k] += piece * piece;
      l -= piece;
    }
  }
  return out;
}

}  // namespace libra
