// The candidate sweep of one window: every (P, H, B), every placement mode,
// the Libra variants and DistCA, through the real planners.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "libra/workload.hpp"
#include "sim/internal.hpp"

namespace libra::detail {

Result<double> mean_random_imbalance(std::span<const std::int64_t> f, std::int64_t pool_size, std::uint64_t first,
                                     std::int64_t seeds) {
  double sum = 0;
  for (std::int64_t s = 0; s < seeds; ++s) {
    LIBRA_ASSIGN_OR_RETURN(
        WindowPlacement pl,
        place_window(f, {.pool_size = pool_size, .mode = PlacementMode::kRandom, .seed = first + static_cast<std::uint64_t>(s)}));
    sum += pl.imbalance;
  }
  return sum / static_cast<double>(std::max<std::int64_t>(seeds, 1));
}

std::vector<TopoShape> admitted_shapes(std::optional<bool> relay, std::optional<ChunkSplit> split) {
  std::vector<TopoShape> out;
  for (ChunkSplit sp : {ChunkSplit::kEqual, ChunkSplit::kTapered}) {
    if (split && *split != sp) continue;
    for (bool r : {false, true}) {
      if (relay && *relay != r) continue;
      out.push_back({.relayed = r, .split = sp});
    }
  }
  return out;
}

Status check_candidate(const Ctx& ctx, const SimCandidate& c, std::int64_t chunks) {
  if (c.pool_size < 1 || ctx.cfg.dp % c.pool_size != 0) {
    return invalid_input(fmt::format("--pool-size {}: must divide --dp {}", c.pool_size, ctx.cfg.dp));
  }
  // Checked before plan_config narrows them to int.
  if (c.head_shards < 1 || c.head_shards > ctx.cfg.model.heads_q) {
    return invalid_input(fmt::format("--head-shards {}: must be in [1, --heads-q {}]", c.head_shards,
                                     ctx.cfg.model.heads_q));
  }
  Status s = validate_plan_config(tap_config(ctx, c.head_shards, c.block_size, chunks));
  // An explicit --home-layout zigzag must fit every candidate (auto falls
  // back to contiguous where it does not).
  if (s.ok() && ctx.cfg.home_layout) {
    s = validate_plan_config(plan_config(ctx, c.head_shards, c.block_size, chunks, PlanMode::kTapTopo, false));
  }
  if (!s.ok()) {
    return invalid_input(fmt::format("--head-shards {} --block-size {}: {}", c.head_shards, c.block_size,
                                     s.message()));
  }
  return {};
}

namespace {

using Placed = std::pair<WindowPlacement, StepLayout>;

// What run_pools records per pool besides step latencies.
enum class Record { kNothing, kTap, kPlus, kTopo };

}  // namespace

WindowResult simulate_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w) {
  WindowResult out;
  const SimConfig& cfg = ctx.cfg;
  const std::int64_t ga = cfg.gbs / cfg.dp;
  Timing& tm = out.timing;
  auto fail = [&](const Error& e) {
    out.status = e;
    return out;
  };
  double t0 = thread_cpu_seconds();
  auto f = sequence_workloads(window);
  tm.placement += thread_cpu_seconds() - t0;
  if (!f.ok()) return fail(f.error());

  // Baselines that do not depend on the candidate.
  auto uly = ulysses_steps(ctx, window, w, tm, "ulysses");
  if (!uly.ok()) return fail(uly.error());
  out.ulysses = std::move(*uly);
  auto repacked = wlb_repack(window, ctx.seq_len, static_cast<std::int64_t>(window.size()));
  if (!repacked.ok()) return fail(repacked.error());
  out.wlb_split = repacked->split_samples;
  auto wlb = ulysses_steps(ctx, repacked->sequences, w, tm, "wlb");
  if (!wlb.ok()) return fail(wlb.error());
  out.wlb = std::move(*wlb);
  // Like for like with ulysses: WLB's repacking within each GA step, so an
  // outlier stays in the step the loader gave it (the sorted variant above
  // packs the window's heaviest sequences first and runs them in step 0).
  {
    std::vector<PackedSequence> per_step;
    const auto dp = static_cast<std::size_t>(cfg.dp);
    for (std::size_t g = 0; g * dp < window.size(); ++g) {
      auto r = wlb_repack(window.subspan(g * dp, dp), ctx.seq_len, cfg.dp);
      if (!r.ok()) return fail(r.error());
      per_step.insert(per_step.end(), r->sequences.begin(), r->sequences.end());
    }
    auto wl = ulysses_steps(ctx, per_step, w, tm, "wlb-loader");
    if (!wl.ok()) return fail(wl.error());
    out.wlb_loader = std::move(*wl);
  }

  auto placement_for = [&](std::int64_t p, PlacementMode mode, NodeInterleave interleave = {}) -> Result<Placed> {
    const double t1 = thread_cpu_seconds();
    LIBRA_ASSIGN_OR_RETURN(WindowPlacement pl,
                           place_window(*f, {.pool_size = p, .mode = mode, .seed = cfg.seed, .interleave = interleave}));
    LIBRA_ASSIGN_OR_RETURN(StepLayout lay, layout_window(pl, cfg.dp));
    tm.placement += thread_cpu_seconds() - t1;
    return std::make_pair(std::move(pl), std::move(lay));
  };
  // Every pool of a placement through make_plan (pc, at one of `chunks`);
  // step latencies of the given variants into cw.steps, the
  // pipelined ones at every M of `chunks`: the same tiles re-chunked (no
  // placement reads M), and M = 1 is the unpipelined timing of any of them.
  auto run_pools = [&](const Placed& pl, const PlanConfig& pc, const std::vector<Variant>& variants, CandWindow& cw,
                       Record rec, const std::vector<std::int64_t>& chunks) -> Status {
    const auto& [placement, layout] = pl;
    const bool any_pipelined = std::any_of(variants.begin(), variants.end(), variant_pipelined);
    std::map<std::pair<Variant, std::int64_t>, StepMax> sms;
    std::map<TopoShape, std::map<std::pair<Variant, std::int64_t>, StepMax>> shaped;
    // libra-topo also with relayed inputs and tapered chunks, unless
    // switched off (the choice among them is simulate()'s).
    // Forced shapes are priced beside the plain one too (simulate() falls
    // back to equal chunks where M does not admit tapered ones).
    std::vector<TopoShape> shapes;
    if (rec == Record::kTopo) {
      const auto relay = ctx.cfg.relay == false ? std::optional<bool>(false) : std::nullopt;
      const auto split = ctx.cfg.chunk_split == ChunkSplit::kEqual ? std::optional(ChunkSplit::kEqual) : std::nullopt;
      for (const TopoShape& sh : admitted_shapes(relay, split)) {
        if (sh != TopoShape{}) shapes.push_back(sh);
      }
    }
    // Tapered chunks need 3 <= M <= the heads of a tile (validate_plan_config).
    std::vector<bool> tapered_fits;
    for (std::int64_t m : chunks) {
      PlanConfig c = pc;
      c.chunks = static_cast<int>(m);
      c.chunk_split = ChunkSplit::kTapered;
      tapered_fits.push_back(validate_plan_config(c).ok());
    }
    const std::string kind(variant_name(variants[0]));
    for (std::size_t k = 0; k < placement.pools.size(); ++k) {
      const auto pool = pool_of(window, placement.pools[k]);
      const auto gpus = pool_gpus(layout.pool_first_replica[k], static_cast<std::int64_t>(pool.size()), cfg.cp);
      LIBRA_ASSIGN_OR_RETURN(auto planned, plan_and_price(ctx, pool, pc, gpus, tm, kind));
      const PlanCost& c = planned.second;
      const std::int64_t g = layout.pool_ga[k];
      // shape: priced as such a schedule runs (a relayed pool with nothing
      // to relay too, so that every pool counts in the shape's steps).
      auto put = [&](const PlanCost& cost, Variant var, std::int64_t m, bool pipelined,
                     const TopoShape* shape = nullptr) {
        const double t = time_plan(ctx, cost, gpus, {w, static_cast<std::uint64_t>(g)}, pipelined, false);
        auto& into = shape != nullptr ? shaped[*shape] : sms;
        auto it = into.try_emplace({var, m}, StepMax{std::vector<double>(static_cast<std::size_t>(ga), 0.0)}).first;
        it->second.put(g, t);
        if (var == Variant::kLibraFull || var == Variant::kLibraTopo || var == Variant::kLibraTapVrsp) {
          (shape != nullptr ? cw.shaped_pools[*shape] : cw.pools)[{var, m}].emplace_back(t, decompose(cost, pipelined));
        }
      };
      for (Variant var : variants) {
        if (!variant_pipelined(var)) put(c, var, 1, false);
      }
      for (std::size_t i = 0; any_pipelined && i < chunks.size(); ++i) {
        const std::int64_t m = chunks[i];
        PlanCost re;
        if (m != 1 && m != pc.chunks) {
          LIBRA_ASSIGN_OR_RETURN(re, price_shaped(ctx, planned.first, m, pc.chunk_split, false, gpus, tm, kind));
        }
        for (Variant var : variants) {
          if (variant_pipelined(var)) put(m == pc.chunks || m == 1 ? c : re, var, m, m != 1);
        }
        for (const TopoShape& sh : shapes) {
          if (sh.split == ChunkSplit::kTapered && !tapered_fits[i]) continue;
          // Relays are chosen per chunk, so each M (1 too) is relayed afresh.
          const std::string label = kind + (sh.relayed ? " relayed" : "") +
                                    (sh.split == ChunkSplit::kTapered ? " tapered" : "");
          LIBRA_ASSIGN_OR_RETURN(PlanCost sc, price_shaped(ctx, planned.first, m, sh.split, sh.relayed, gpus, tm, label));
          for (Variant var : variants) {
            if (variant_pipelined(var)) put(sc, var, m, m != 1, &sh);
          }
        }
      }
      if (rec == Record::kTap) {
        cw.intra.push_back(c.imbalance);
        cw.bytes.push_back(static_cast<double>(c.comm_bytes));
        cw.send.push_back(static_cast<double>(c.max_send));
        cw.recv.push_back(static_cast<double>(c.max_recv));
        cw.comm.push_back(comm_seconds(c));
      } else if (rec == Record::kPlus) {
        cw.intra_plus.push_back(c.imbalance);
        cw.bytes_plus.push_back(static_cast<double>(c.comm_bytes));
      } else if (rec == Record::kTopo) {
        cw.intra_topo.push_back(c.imbalance);
        cw.recv_cross_topo.push_back(static_cast<double>(c.max_recv_cross_node));
      }
      if (rec == Record::kTap) cw.recv_cross.push_back(static_cast<double>(c.max_recv_cross_node));
    }
    for (auto& [key, sm] : sms) cw.steps[key] = std::move(sm.step);
    for (auto& [sh, by] : shaped) {
      for (auto& [key, sm] : by) cw.shaped_steps[sh][key] = std::move(sm.step);
    }
    return {};
  };

  const bool time_distca = distca_skip_reason(cfg).empty();
  // Per (H, B): distca's steps at each M (the valid M depend on H only).
  std::map<std::pair<std::int64_t, std::int64_t>, std::map<std::pair<Variant, std::int64_t>, std::vector<double>>>
      distca;
  std::map<std::int64_t, std::map<PlacementMode, Placed>> by_p;
  std::map<std::int64_t, Placed> topo_by_p;  // libra-topo's interleaved VRSP pools
  const auto modes = all_placement_modes();
  out.cand.resize(ctx.candidates.size());
  for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) {
    const SimCandidate& cand = ctx.candidates[ci];
    CandWindow& cw = out.cand[ci];
    auto it = by_p.find(cand.pool_size);
    if (it == by_p.end()) {
      std::map<PlacementMode, Placed> placed;
      for (PlacementMode mode : modes) {
        auto pl = placement_for(cand.pool_size, mode);
        if (!pl.ok()) return fail(pl.error());
        placed.emplace(mode, std::move(*pl));
      }
      it = by_p.emplace(cand.pool_size, std::move(placed)).first;
    }
    const auto& placed = it->second;
    for (PlacementMode mode : modes) {
      if (mode == PlacementMode::kRandom) {
        const double t1 = thread_cpu_seconds();
        auto r = mean_random_imbalance(*f, cand.pool_size, cfg.seed, cfg.random_seeds);
        tm.placement += thread_cpu_seconds() - t1;
        if (!r.ok()) return fail(r.error());
        cw.inter.push_back(*r);
      } else {
        cw.inter.push_back(placed.at(mode).first.imbalance);
      }
    }
    cw.lower_bound = imbalance_lower_bound(*f, cand.pool_size) - 1.0;

    const std::vector<std::int64_t>& ms = ctx.chunks[ci];
    // Plans are made at the first listed M above 1 (M = 1 is any plan's
    // unpipelined timing) and re-chunked for the others.
    const auto above_one = std::find_if(ms.begin(), ms.end(), [](std::int64_t m) { return m > 1; });
    const std::int64_t base = above_one == ms.end() ? ms[0] : *above_one;
    const PlanConfig tap = tap_config(ctx, cand.head_shards, cand.block_size, base);
    const PlanConfig plus = plan_config(ctx, cand.head_shards, cand.block_size, base, PlanMode::kTapSplit, true);
    Status s = run_pools(placed.at(PlacementMode::kSampler), tap, {Variant::kLibraTap}, cw, Record::kNothing, ms);
    if (s.ok()) {
      s = run_pools(placed.at(PlacementMode::kVrsp), tap, {Variant::kLibraTapVrsp, Variant::kLibraFull}, cw,
                    Record::kTap, ms);
    }
    if (s.ok()) {
      s = run_pools(placed.at(PlacementMode::kVrspRefine), plus, {Variant::kLibraPlus}, cw, Record::kPlus, ms);
    }
    if (s.ok()) {
      const PlanConfig topo = plan_config(ctx, cand.head_shards, cand.block_size, base, PlanMode::kTapTopo, false);
      auto tp = topo_by_p.find(cand.pool_size);
      if (tp == topo_by_p.end()) {
        auto pl = placement_for(cand.pool_size, PlacementMode::kVrsp, topo_interleave(ctx));
        if (!pl.ok()) return fail(pl.error());
        tp = topo_by_p.emplace(cand.pool_size, std::move(*pl)).first;
      }
      s = run_pools(tp->second, topo, {Variant::kLibraTopo}, cw, Record::kTopo, ms);
    }
    if (s.ok() && time_distca) {
      // One pool of P = DP per GA step in loader order; once per (H, B).
      const auto key = std::make_pair(cand.head_shards, cand.block_size);
      auto d = distca.find(key);
      if (d == distca.end()) {
        auto pl = placement_for(cfg.dp, PlacementMode::kSampler);
        if (!pl.ok()) return fail(pl.error());
        CandWindow tmp;
        s = run_pools(*pl, tap, {Variant::kDistca}, tmp, Record::kNothing, ms);
        if (s.ok()) d = distca.emplace(key, std::move(tmp.steps)).first;
      }
      if (s.ok()) cw.steps.insert(d->second.begin(), d->second.end());
    }
    if (!s.ok()) return fail(s.error());
  }
  return out;
}

}  // namespace libra::detail
