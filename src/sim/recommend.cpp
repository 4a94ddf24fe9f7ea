// The recommendation: the candidate with the least predicted libra-full
// mean + worst_weight x worst latency (ties: the earlier candidate).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "sim/internal.hpp"

namespace libra::detail {

void recommend(SimResult& res) {
  const double ww = res.config.worst_weight;
  auto full = [&](std::size_t i) { return res.candidates[i].find(Variant::kLibraFull)->seconds; };
  auto score = [&](std::size_t i) { return full(i).mean + ww * full(i).worst; };
  std::vector<std::size_t> order(res.candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return score(a) < score(b); });
  if (order.empty()) return;
  res.recommended = static_cast<std::int64_t>(order[0]);
  const CandidateResult& best = res.candidates[order[0]];
  const std::string criterion =
      ww == 0 ? std::string("mean") : fmt::format("mean + {:g} x worst", ww);
  if (order.size() == 1) {
    res.recommendation_reason = fmt::format("{} is the only valid candidate ({:.3f} ms mean per layer-step, libra-full)",
                                            cand_name(best.candidate), full(order[0]).mean * 1e3);
    return;
  }
  res.runner_up = static_cast<std::int64_t>(order[1]);
  const CandidateResult& second = res.candidates[order[1]];
  res.recommendation_reason = fmt::format(
      "{} predicts {:.3f} ms mean / {:.3f} ms worst per layer-step (libra-full), by {} {:.1f}% below runner-up {} "
      "({:.3f} / {:.3f} ms); inter-pool R-1 {:.4f} vs {:.4f}, intra-pool R-1 {:.4f} vs {:.4f}, bytes per pool {:.1f} vs "
      "{:.1f} MB",
      cand_name(best.candidate), full(order[0]).mean * 1e3, full(order[0]).worst * 1e3, criterion,
      100.0 * (1.0 - score(order[0]) / score(order[1])), cand_name(second.candidate), full(order[1]).mean * 1e3,
      full(order[1]).worst * 1e3, best.inter(PlacementMode::kVrsp).mean, second.inter(PlacementMode::kVrsp).mean,
      best.intra_imbalance.mean, second.intra_imbalance.mean, best.comm_bytes.mean / 1e6,
      second.comm_bytes.mean / 1e6);
}

}  // namespace libra::detail
