// The end-to-end step model: DP scaling at fixed GBS and the per-microbatch
// forward times (paper sections 8.2 and 8.3).
#include <algorithm>
#include <numeric>

#include "libra/workload.hpp"
#include "sim/internal.hpp"

namespace libra::detail {

E2eWindow e2e_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w,
                     const SimCandidate& rec, const std::vector<std::int64_t>& dps, Variant libra,
                     std::int64_t chunks, bool relayed, ChunkSplit split) {
  E2eWindow out;
  const SimConfig& cfg = ctx.cfg;
  const ModelShape& model = cfg.model;
  const double layers = static_cast<double>(model.layers);
  const double cp = static_cast<double>(cfg.cp);
  Timing& tm = out.timing;
  for (const auto& s : window) out.tokens += seq_tokens(s);
  auto f = sequence_workloads(window);
  if (!f.ok()) {
    out.status = f.error();
    return out;
  }
  // Ulysses: every sequence on its own CP group; planned once, timed per DP.
  std::vector<PlanCost> uly;
  const PlanConfig upc = ulysses_config(ctx);
  for (std::size_t i = 0; i < window.size(); ++i) {
    auto gpus = pool_gpus(0, 1, cfg.cp);
    auto c = price_pool(ctx, window.subspan(i, 1), upc, gpus, tm, "end-to-end ulysses");
    if (!c.ok()) {
      out.status = c.error();
      return out;
    }
    uly.push_back(std::move(*c));
  }
  PlanConfig lpc = plan_config(ctx, rec.head_shards, rec.block_size, chunks,
                               libra == Variant::kLibraTopo ? PlanMode::kTapTopo : PlanMode::kTap, false);
  lpc.chunk_split = split;
  const bool pipelined = variant_pipelined(libra);
  // VRSP pools depend on P only, not on DP: plan each P once. (Their
  // communication times keep the node locality of the first layout that used
  // them; later layouts shift pools by whole multiples of P x CP GPUs.)
  std::map<std::int64_t, std::vector<PlanCost>> libra_costs;
  for (std::int64_t dp : dps) {
    const std::int64_t ga = cfg.gbs / dp;
    // Ulysses replicas run their GA microbatches without waiting for each
    // other; they meet at the gradient all-reduce.
    std::vector<double> replica(static_cast<std::size_t>(dp), 0.0);
    // With per-layer synchronisation of all replicas (an MoE whose expert-
    // parallel all-to-all spans the DP replicas), every GA step costs its
    // slowest replica.
    std::vector<double> step_max(static_cast<std::size_t>(ga), 0.0);
    for (std::size_t i = 0; i < window.size(); ++i) {
      const std::int64_t g = static_cast<std::int64_t>(i) / dp, r = static_cast<std::int64_t>(i) % dp;
      auto gpus = pool_gpus(r, 1, cfg.cp);
      const NoiseKey key{w, static_cast<std::uint64_t>(g)};
      const double attn = time_plan(ctx, uly[i], gpus, key, false, false) + time_plan(ctx, uly[i], gpus, key, false, true);
      const double tok = seq_tokens(window[i]);
      const double fwd = layers * time_plan(ctx, uly[i], gpus, key, false, false) +
                         linear_seconds(cfg.cost.step, model, tok, cp, false);
      const double mb = layers * attn + linear_seconds(cfg.cost.step, model, tok, cp, false) +
                        linear_seconds(cfg.cost.step, model, tok, cp, true);
      replica[static_cast<std::size_t>(r)] += mb;
      step_max[static_cast<std::size_t>(g)] = std::max(step_max[static_cast<std::size_t>(g)], mb);
      if (dp == cfg.dp) out.mb_ulysses.push_back(fwd);
    }
    const double ar = allreduce_seconds(cfg.cost.net, model.grad_bytes_per_gpu, dp);
    out.ulysses_time.push_back(max_of(replica) + ar);
    out.ulysses_sync.push_back(std::accumulate(step_max.begin(), step_max.end(), 0.0) + ar);
    std::fill(step_max.begin(), step_max.end(), 0.0);

    // Libra (full): VRSP pools of P = gcd(P_rec, DP), TAP, pipeliner; a pool's
    // replicas wait for each other at every layer's all-to-all.
    const std::int64_t p = std::gcd(rec.pool_size, dp);
    const double t0 = thread_cpu_seconds();
    const NodeInterleave interleave = libra == Variant::kLibraTopo ? topo_interleave(ctx) : NodeInterleave{};
    auto pl = place_window(*f, {.pool_size = p, .mode = PlacementMode::kVrsp, .seed = cfg.seed, .interleave = interleave});
    if (!pl.ok()) {
      out.status = pl.error();
      return out;
    }
    auto lay = layout_window(*pl, dp);
    tm.placement += thread_cpu_seconds() - t0;
    if (!lay.ok()) {
      out.status = lay.error();
      return out;
    }
    std::vector<double> group(static_cast<std::size_t>(dp / p), 0.0);
    auto cached = libra_costs.find(p);
    if (cached == libra_costs.end()) {
      std::vector<PlanCost> costs;
      for (std::size_t k = 0; k < pl->pools.size(); ++k) {
        const auto gpus = pool_gpus(lay->pool_first_replica[k], p, cfg.cp);
        auto c = price_pool(ctx, pool_of(window, pl->pools[k]), lpc, gpus, tm, "end-to-end libra", relayed);
        if (!c.ok()) {
          out.status = c.error();
          return out;
        }
        costs.push_back(std::move(*c));
      }
      cached = libra_costs.emplace(p, std::move(costs)).first;
    }
    for (std::size_t k = 0; k < pl->pools.size(); ++k) {
      const auto pool = pool_of(window, pl->pools[k]);
      const auto gpus = pool_gpus(lay->pool_first_replica[k], p, cfg.cp);
      const PlanCost* c = &cached->second[k];
      const std::int64_t g = lay->pool_ga[k];
      const NoiseKey key{w, static_cast<std::uint64_t>(g)};
      const double af = time_plan(ctx, *c, gpus, key, pipelined, false);
      const double ab = time_plan(ctx, *c, gpus, key, pipelined, true);
      double lin_f = 0, lin_b = 0;
      for (const auto& s : pool) {
        lin_f = std::max(lin_f, linear_seconds(cfg.cost.step, model, seq_tokens(s), cp, false));
        lin_b = std::max(lin_b, linear_seconds(cfg.cost.step, model, seq_tokens(s), cp, true));
      }
      const double mb = layers * (af + ab) + lin_f + lin_b;
      group[static_cast<std::size_t>(lay->pool_first_replica[k] / p)] += mb;
      step_max[static_cast<std::size_t>(g)] = std::max(step_max[static_cast<std::size_t>(g)], mb);
      if (dp == cfg.dp) {
        for (const auto& s : pool) {
          out.mb_libra.push_back(layers * af + linear_seconds(cfg.cost.step, model, seq_tokens(s), cp, false));
        }
      }
    }
    out.libra_time.push_back(max_of(group) + ar);
    out.libra_sync.push_back(std::accumulate(step_max.begin(), step_max.end(), 0.0) + ar);
  }
  return out;
}

Status fold_end_to_end(const std::vector<E2eWindow>& er, const std::vector<std::int64_t>& dps,
                       const SimCandidate& rec, SimResult& res) {
    if (dps.empty() || er.empty()) return {};
    const std::size_t n = dps.size();
    std::vector<double> ut(n), lt(n), us(n), ls(n);
    double tokens = 0;
    std::vector<double> mbu, mbl;
    for (const auto& r : er) {
      if (!r.status.ok()) return r.status;
      for (std::size_t k = 0; k < dps.size(); ++k) {
        ut[k] += r.ulysses_time[k];
        lt[k] += r.libra_time[k];
        us[k] += r.ulysses_sync[k];
        ls[k] += r.libra_sync[k];
      }
      tokens += r.tokens;
      mbu.insert(mbu.end(), r.mb_ulysses.begin(), r.mb_ulysses.end());
      mbl.insert(mbl.end(), r.mb_libra.begin(), r.mb_libra.end());
      add_timing(res.timing, r.timing);
    }
    for (std::size_t k = 0; k < dps.size(); ++k) {
      DpScalingPoint pt;
      pt.dp = dps[k];
      pt.pool_size = std::gcd(rec.pool_size, dps[k]);
      pt.ulysses_tokens_per_s = tokens / ut[k];
      pt.libra_tokens_per_s = tokens / lt[k];
      pt.ulysses_sync_tokens_per_s = tokens / us[k];
      pt.libra_sync_tokens_per_s = tokens / ls[k];
      res.dp_scaling.push_back(pt);
    }
    const double base = static_cast<double>(res.dp_scaling[0].dp);
    for (auto& pt : res.dp_scaling) {
      const double scale = static_cast<double>(pt.dp) / base;
      pt.ulysses_efficiency = pt.ulysses_tokens_per_s / (scale * res.dp_scaling[0].ulysses_tokens_per_s);
      pt.libra_efficiency = pt.libra_tokens_per_s / (scale * res.dp_scaling[0].libra_tokens_per_s);
      pt.ulysses_sync_efficiency =
          pt.ulysses_sync_tokens_per_s / (scale * res.dp_scaling[0].ulysses_sync_tokens_per_s);
      pt.libra_sync_efficiency = pt.libra_sync_tokens_per_s / (scale * res.dp_scaling[0].libra_sync_tokens_per_s);
    }
    const double libra_mean = stat_of(mbl).mean;
    auto norm = [&](const std::vector<double>& v) {
      MicrobatchStats m;
      for (double x : v) m.values.push_back(x / libra_mean);
      if (!m.values.empty()) {
        m.min = *std::min_element(m.values.begin(), m.values.end());
        m.max = *std::max_element(m.values.begin(), m.values.end());
        m.mean = std::accumulate(m.values.begin(), m.values.end(), 0.0) / static_cast<double>(m.values.size());
      }
      return m;
    };
    res.microbatch_ulysses = norm(mbu);
    res.microbatch_libra = norm(mbl);
  return {};
}

}  // namespace libra::detail
