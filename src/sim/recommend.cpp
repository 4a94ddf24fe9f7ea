// The recommendation: the candidate and libra variant with the least
// predicted mean + worst_weight x worst latency (ties: the earlier candidate,
// then libra-full, libra-topo, libra-tap-vrsp), and ulysses instead where it
// is faster still, so that the recommendation is never slower than a mode
// libra has.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>

#include "sim/internal.hpp"

namespace libra::detail {

namespace {

// libra-tap-vrsp is libra-full with M = 1 (no pipeliner).
constexpr std::array<Variant, 3> kChoices = {Variant::kLibraFull, Variant::kLibraTopo, Variant::kLibraTapVrsp};

}  // namespace

namespace {

// The step model's figure of a variant at coupling `span`, when priced.
const StepAtDp* step_of(const VariantLatency& l, std::int64_t span) {
  for (const StepAtDp& s : l.step_at_dp) {
    if (s.coupling == span) return &s;
  }
  return nullptr;
}

// Candidates in recommendation order: by `key` (less is better), ties to
// the earlier candidate.
std::vector<std::size_t> ranked(const std::vector<double>& key) {
  std::vector<std::size_t> order(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  return order;
}

// Seconds per token of each candidate's variant under the step model at
// coupling `span`; empty when a candidate has no end-to-end figure.
std::vector<double> step_keys(const SimResult& res, const std::vector<Variant>& best_v, std::int64_t span) {
  std::vector<double> key;
  for (std::size_t i = 0; i < res.candidates.size(); ++i) {
    const StepAtDp* s = step_of(*res.candidates[i].find(best_v[i]), span);
    if (s == nullptr) return {};
    key.push_back(1.0 / s->libra_tokens_per_s);
  }
  return key;
}

// "; under coupling none the step model recommends P=.. instead (..x against ..x)" for every
// setting whose ranking differs from the configured one's.
std::string other_couplings(const SimResult& res, const std::vector<Variant>& best_v, std::size_t chosen) {
  std::string out;
  const VariantLatency& c = *res.candidates[chosen].find(best_v[chosen]);
  for (const StepAtDp& s : c.step_at_dp) {
    if (s.coupling == res.config.coupling) continue;
    const std::size_t alt = ranked(step_keys(res, best_v, s.coupling))[0];
    if (alt == chosen) continue;
    const StepAtDp* a = step_of(*res.candidates[alt].find(best_v[alt]), s.coupling);
    out += fmt::format("; under coupling {} the step model would recommend {} instead ({:.2f}x end-to-end against "
                       "{:.2f}x)",
                       coupling_name(s.coupling), cand_name(res.candidates[alt].candidate),
                       a->libra_tokens_per_s / a->ulysses_tokens_per_s, s.libra_tokens_per_s / s.ulysses_tokens_per_s);
  }
  return out;
}

}  // namespace

namespace {

// With several M listed, a pipelined variant is named with the M it ran at,
// and libra-topo with what a training loop must plan to run what was priced.
std::string label(const SimResult& res, std::size_t i, Variant v) {
  const VariantLatency* l = res.candidates[i].find(v);
  std::string s(variant_name(v));
  if (res.config.chunks.size() > 1) s += fmt::format(" at M = {}", l->chunks);
  if (v == Variant::kLibraTopo) {
    s += fmt::format(", {} homes{}{}{}", home_layout_name(res.candidates[i].home_layout_topo),
                     res.config.kv_prefix ? ", KV prefix" : "", l->relayed ? ", relayed inputs" : "",
                     l->chunk_split == ChunkSplit::kTapered ? ", tapered chunks" : "");
  }
  return s;
}

// Per candidate, its best libra choice by the attention score (ties:
// kChoices order), and that score.
struct BestVariants {
  std::vector<Variant> variant;
  std::vector<double> score;
};
BestVariants best_variants(const SimResult& res) {
  BestVariants b{std::vector<Variant>(res.candidates.size(), Variant::kLibraFull),
                 std::vector<double>(res.candidates.size(), 0)};
  for (std::size_t i = 0; i < res.candidates.size(); ++i) {
    bool first = true;
    for (Variant v : kChoices) {
      const VariantLatency* l = res.candidates[i].find(v);
      if (l == nullptr) continue;
      if (first || score(res.config, l->seconds) < b.score[i]) {
        b.score[i] = score(res.config, l->seconds);
        b.variant[i] = v;
        first = false;
      }
    }
  }
  return b;
}

// The winner against the runner-up: latencies, the criterion's margin,
// imbalance and bytes.
std::string versus_runner_up(const SimResult& res, const std::vector<Variant>& best_v, const std::vector<double>& key,
                             std::size_t a, std::size_t b, const std::string& criterion) {
  const CandidateResult& x = res.candidates[a];
  const CandidateResult& y = res.candidates[b];
  const Stat la = x.find(best_v[a])->seconds, lb = y.find(best_v[b])->seconds;
  std::string reason = fmt::format(
      "{} predicts {:.3f} ms mean / {:.3f} ms worst per layer-step ({}), by {} {:.1f}% below runner-up {} "
      "({:.3f} / {:.3f} ms, {}); inter-pool R-1 {:.4f} vs {:.4f}, intra-pool R-1 {:.4f} vs {:.4f}, bytes per pool "
      "{:.1f} vs {:.1f} MB",
      cand_name(x.candidate), la.mean * 1e3, la.worst * 1e3, label(res, a, best_v[a]), criterion,
      100.0 * (1.0 - key[a] / key[b]), cand_name(y.candidate), lb.mean * 1e3, lb.worst * 1e3, label(res, b, best_v[b]),
      x.inter(PlacementMode::kVrsp).mean, y.inter(PlacementMode::kVrsp).mean, x.intra_imbalance.mean,
      y.intra_imbalance.mean, x.comm_bytes.mean / 1e6, y.comm_bytes.mean / 1e6);
  return reason;
}

}  // namespace

void recommend(SimResult& res) {
  const double ww = res.config.worst_weight;
  if (res.candidates.empty()) return;
  const BestVariants bv = best_variants(res);
  const std::vector<Variant>& best_v = bv.variant;
  // With the end-to-end model, candidates rank by its step at --dp under
  // the configured coupling and pipeline; without, by the attention score.
  const std::vector<double> step_key = step_keys(res, best_v, res.config.coupling);
  const bool by_step = !step_key.empty();
  const std::vector<double>& key = by_step ? step_key : bv.score;
  auto lat = [&](std::size_t i) { return res.candidates[i].find(best_v[i])->seconds; };
  const std::vector<std::size_t> order = ranked(key);
  const std::size_t top = order[0];
  res.recommended = static_cast<std::int64_t>(top);
  res.recommended_variant = best_v[top];
  res.end_to_end_variant = best_v[top];
  const CandidateResult& best = res.candidates[top];
  const std::string criterion =
      by_step ? fmt::format("the end-to-end step at DP {} ({} pipeline stages, coupling {})", res.config.dp,
                            res.config.pp, coupling_name(res.config.coupling))
      : ww == 0 ? std::string("mean")
                : fmt::format("mean + {:g} x worst", ww);
  std::string reason;
  if (order.size() == 1) {
    reason = fmt::format("{} is the only valid candidate ({:.3f} ms mean per layer-step, {})",
                         cand_name(best.candidate), lat(top).mean * 1e3, label(res, top, best_v[top]));
  } else {
    res.runner_up = static_cast<std::int64_t>(order[1]);
    reason = versus_runner_up(res, best_v, key, top, order[1], criterion);
    // Chosen by the mean alone, a candidate can win by a hair with a much
    // worse worst step (256K: 0.9% on the mean, 32% on the worst step):
    // say so, and how to weigh it in.
    const double worse = lat(top).worst / lat(order[1]).worst - 1.0;
    if (!by_step && ww == 0 && worse > 0.1) {
      reason += fmt::format("; its worst step is {:.0f}% above the runner-up's (--worst-weight W recommends by mean + "
                            "W x worst)",
                            100.0 * worse);
    }
  }
  if (by_step) {
    const StepAtDp* s = step_of(*best.find(best_v[top]), res.config.coupling);
    reason += fmt::format("; end-to-end {:.2f}x over ulysses at DP {}", s->libra_tokens_per_s / s->ulysses_tokens_per_s,
                          res.config.dp);
    reason += other_couplings(res, best_v, top);
    if (s->ulysses_tokens_per_s > s->libra_tokens_per_s) {
      res.recommended_variant = Variant::kUlysses;
      reason = fmt::format("ulysses: its end-to-end step at DP {} ({:.4g} tokens/s) beat every libra variant; the "
                           "best of them: {}",
                           res.config.dp, s->ulysses_tokens_per_s, reason);
    }
  } else if (score(res.config, res.ulysses) < bv.score[top]) {
    res.recommended_variant = Variant::kUlysses;
    reason = fmt::format("ulysses: its {:.3f} ms mean / {:.3f} ms worst per layer-step beat every libra variant; "
                         "the best of them: {}",
                         res.ulysses.mean * 1e3, res.ulysses.worst * 1e3, reason);
  }
  res.recommendation_reason = std::move(reason);
}

}  // namespace libra::detail
