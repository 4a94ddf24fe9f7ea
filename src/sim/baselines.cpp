// The baselines that do not depend on the candidate: ulysses (and wlb, which
// is ulysses over wlb_repack's sequences, wlb.cpp), and DistCA's limits.
#include <fmt/format.h>
#include <utility>

#include "sim/internal.hpp"

namespace libra::detail {

double linear_part(const Ctx& ctx, double tokens, bool backward) {
  return linear_seconds(ctx.cfg.cost.step, ctx.cfg.model, tokens, static_cast<double>(ctx.cfg.cp), backward);
}

Result<std::vector<double>> ulysses_steps(const Ctx& ctx, std::span<const PackedSequence> seqs, std::uint64_t window,
                                          Timing& tm, const std::string& kind, std::vector<MicroBatch>* mbs,
                                          std::vector<PlanCost>* costs) {
  const std::int64_t dp = ctx.cfg.dp;
  const std::int64_t ga = static_cast<std::int64_t>(seqs.size()) / dp;
  StepMax sm{std::vector<double>(static_cast<std::size_t>(ga), 0.0)};
  const PlanConfig pc = ulysses_config(ctx);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(seqs.size()); ++i) {
    const std::int64_t g = i / dp, r = i % dp;
    auto gpus = pool_gpus(r, 1, ctx.cfg.cp);
    LIBRA_ASSIGN_OR_RETURN(PlanCost c, price_pool(ctx, seqs.subspan(static_cast<std::size_t>(i), 1), pc, gpus, tm, kind));
    const NoiseKey key{window, static_cast<std::uint64_t>(g)};
    const double fwd = time_plan(ctx, c, gpus, key, false, false);
    sm.put(g, fwd);
    if (mbs != nullptr) {
      const double tok = seq_tokens(seqs[static_cast<std::size_t>(i)]);
      mbs->push_back({.attn_fwd = fwd,
                      .attn_bwd = time_plan(ctx, c, gpus, key, false, true),
                      .lin_fwd = linear_part(ctx, tok, false),
                      .lin_bwd = linear_part(ctx, tok, true)});
    }
    if (costs != nullptr) costs->push_back(std::move(c));  // its last use
  }
  return sm.step;
}

std::string distca_skip_reason(const SimConfig& cfg) {
  if (cfg.dp * cfg.cp <= cfg.distca_max_gpus) return {};
  return fmt::format("distca not timed: its pool spans DP x CP = {} GPUs, more than --distca-max-gpus {}",
                     cfg.dp * cfg.cp, cfg.distca_max_gpus);
}

}  // namespace libra::detail
