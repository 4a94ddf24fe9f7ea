// The candidate sweep of one window: every (P, H, B), every placement mode,
// the Libra variants and DistCA, through the real planners.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

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

// Whether a pool's price on GPUs b is its price on a: AlltoallPricer reads
// the GPUs only through which node and supernode each is on (compared and
// counted) and, with PXN, the GPU of the same local rank on another node.
// So b prices as a where its workers' nodes and supernodes lie as a's do
// (the same offsets from worker 0's) and, with PXN, b is a shifted by
// whole nodes.
bool same_price_gpus(const Interconnect& net, std::span<const std::int64_t> a, std::span<const std::int64_t> b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  const std::int64_t per_node = net.gpus_per_node, per_sn = net.gpus_per_node * net.nodes_per_supernode;
  const std::int64_t shift = b[0] - a[0];
  if (net.pxn && shift % per_node != 0) return false;
  for (std::size_t r = 0; r < a.size(); ++r) {
    if (b[r] / per_node - b[0] / per_node != a[r] / per_node - a[0] / per_node ||
        b[r] / per_sn - b[0] / per_sn != a[r] / per_sn - a[0] / per_sn || (net.pxn && b[r] - a[r] != shift)) {
      return false;
    }
  }
  return true;
}

namespace {

using Placed = std::pair<WindowPlacement, StepLayout>;

// What run_pools records per pool besides step latencies.
enum class Record { kNothing, kTap, kPlus, kTopo };

// The variants whose pools are also timed backward and decomposed
// (put_pool); the others' prices are read forward only.
bool timed_backward(Variant v) {
  return v == Variant::kLibraFull || v == Variant::kLibraTopo || v == Variant::kLibraTapVrsp;
}

// What a pool's prices are read for (PriceReuse::backward, ::chunks): the
// backward where a variant is timed backward, the chunks where one is
// pipelined; record_pool reads the whole step forward and the bytes.
struct PriceReads {
  bool backward = true, chunks = true;
};

// Everything one window's planners share: the window, its workloads, the
// placements made so far (by P; each is made once per window).
struct WindowRun {
  const Ctx& ctx;
  std::span<const PackedSequence> window;
  std::uint64_t w = 0;
  std::vector<std::int64_t> f;  // sequence workloads
  Timing& tm;
  std::map<std::int64_t, std::map<PlacementMode, Placed>> by_p;
  std::map<std::int64_t, Placed> topo_by_p;  // libra-topo's interleaved VRSP pools
  // Per (H, B): distca's steps at each M (the valid M depend on H only).
  std::map<std::pair<std::int64_t, std::int64_t>, StepSeries> distca;
  // Per (H, B): libra-tap's steps at P = DP, priced with distca's (the same
  // sampler pools, tap config and M list), and the M list they are for.
  std::map<std::pair<std::int64_t, std::int64_t>, std::pair<std::vector<std::int64_t>, StepSeries>> tap_at_dp;
};

Result<Placed> placement_for(WindowRun& run, std::int64_t p, PlacementMode mode, NodeInterleave interleave = {}) {
  const SimConfig& cfg = run.ctx.cfg;
  const double t1 = run.tm.clock();
  LIBRA_ASSIGN_OR_RETURN(WindowPlacement pl,
                         place_window(run.f, {.pool_size = p, .mode = mode, .seed = cfg.seed, .interleave = interleave}));
  LIBRA_ASSIGN_OR_RETURN(StepLayout lay, layout_window(pl, cfg.dp));
  run.tm.placement += run.tm.clock() - t1;
  return std::make_pair(std::move(pl), std::move(lay));
}

// The candidate-independent baselines: ulysses, wlb (sorted) and wlb-loader.
Status window_baselines(WindowRun& run, WindowResult& out) {
  const SimConfig& cfg = run.ctx.cfg;
  const bool e2e = cfg.end_to_end && !cfg.scaling_dp.empty();
  LIBRA_ASSIGN_OR_RETURN(out.ulysses, ulysses_steps(run.ctx, run.window, run.w, run.tm, "ulysses", &out.ulysses_mb,
                                                    e2e ? &out.ulysses_costs : nullptr));
  for (const auto& sq : run.window) out.tokens += seq_tokens(sq);
  LIBRA_ASSIGN_OR_RETURN(WlbRepack repacked,
                         wlb_repack(run.window, run.ctx.seq_len, static_cast<std::int64_t>(run.window.size())));
  out.wlb_split = repacked.split_samples;
  LIBRA_ASSIGN_OR_RETURN(out.wlb, ulysses_steps(run.ctx, repacked.sequences, run.w, run.tm, "wlb"));
  // Like for like with ulysses: WLB's repacking within each GA step, so an
  // outlier stays in the step the loader gave it (the sorted variant above
  // packs the window's heaviest sequences first and runs them in step 0).
  std::vector<PackedSequence> per_step;
  const auto dp = static_cast<std::size_t>(cfg.dp);
  for (std::size_t g = 0; g * dp < run.window.size(); ++g) {
    LIBRA_ASSIGN_OR_RETURN(WlbRepack r, wlb_repack(run.window.subspan(g * dp, dp), run.ctx.seq_len, cfg.dp));
    per_step.insert(per_step.end(), r.sequences.begin(), r.sequences.end());
  }
  LIBRA_ASSIGN_OR_RETURN(out.wlb_loader, ulysses_steps(run.ctx, per_step, run.w, run.tm, "wlb-loader"));
  return {};
}

// One pool's plan and its re-chunked and relayed prices, each made once:
// libra-topo's shapes share re-chunked plans (relayed or not), a tapered
// shape that cuts the tiles as the equal one does is the equal shape
// (cut_split: H 8 of 32 heads at M 4), and a relayed price of a plan with
// nothing to relay is its direct price. Each
// price is one span of cost-model time (sums, relays and cost_plan
// together: the thread CPU clock is a system call), returned by address
// (the map keeps it; a PlanCost is a dozen vectors).
struct PoolPrices {
  const Ctx& ctx;
  const Plan& base;
  std::span<const std::int64_t> gpus;
  Timing& tm;
  PlanCost base_cost;
  std::map<std::pair<std::int64_t, ChunkSplit>, Plan> plans;
  std::map<std::tuple<std::int64_t, ChunkSplit, bool>, PlanCost> costs;
  std::map<const Plan*, ExchangeSums> sums;  // each plan's, for its relays and its prices
  // The base plan's pairs and K/V fetches: every re-chunked plan has the same.
  std::optional<ExchangeLayout> layout;
  PriceReads reads;  // every price's
  std::optional<PlanCost> unchunked;  // base_unchunked()
  AlltoallPricer::Pairs pairs;  // the layout's pairs on gpus: every unrelayed price's

  PoolPrices(const Ctx& c, const Plan& b, std::span<const std::int64_t> g, Timing& t, PriceReads r)
      : ctx(c), base(b), gpus(g), tm(t), reads(r) {
    const double t0 = tm.clock();
    const ExchangeSums& x = sums_of(&base);
    pairs = AlltoallPricer(ctx.cfg.cost.net, gpus).pairs(x.pairs);
    base_cost = cost_plan(ctx, base, x, gpus, nullptr, reuse(nullptr, nullptr, true));
    tm.cost += tm.clock() - t0;
  }
  PriceReuse reuse(const PlanCost* direct, const PlanCost* same_tiles, bool whole_step) const {
    return {.direct = direct, .same_tiles = same_tiles, .whole_step = whole_step, .pairs = &pairs,
            .backward = reads.backward, .chunks = reads.chunks};
  }
  // The split naming (m, split)'s cut of the base's tiles (the plans' and
  // prices' key).
  ChunkSplit cut(std::int64_t m, ChunkSplit split) const { return cut_split(base.head_width(), m, split); }
  bool is_base(std::int64_t m, ChunkSplit split) const {
    return m == base.config().chunks && cut(m, split) == cut(m, base.config().chunk_split);
  }
  const ExchangeSums& sums_of(const Plan* p) {
    auto it = sums.find(p);
    if (it == sums.end()) {
      if (!layout) layout = exchange_layout(base.data_as_built());
      it = sums.emplace(p, exchange_sums(p->data_as_built(), *layout, reads.backward)).first;
    }
    return it->second;
  }

  Result<const Plan*> plan(std::int64_t m, ChunkSplit split, const std::string& kind) {
    if (is_base(m, split)) return &base;
    auto it = plans.find({m, split});
    if (it == plans.end()) {
      // `kind` names the shape (sweep.cpp: "libra-topo relayed tapered").
      const std::string label = kind + " (M " + std::to_string(m) + ")";
      LIBRA_ASSIGN_OR_RETURN(Plan re, timed_plan(tm, label, [&] {
                               return rechunk_plan(base, static_cast<int>(m), split);
                             }));
      it = plans.emplace(std::make_pair(m, split), std::move(re)).first;
    }
    return &it->second;
  }
  // p's price at (m, split), relayed or not; untimed (price times it).
  // The base price as the M = 1 re-chunking of its tiles prices itself:
  // one chunk of every head (its compute the whole step's; its returns the
  // whole step's, integer byte sums over the chunks).
  const PlanCost& base_unchunked() {
    if (!unchunked) {
      PlanCost u;
      u.workers = base_cost.workers;
      u.has_backward = base_cost.has_backward;
      u.comp_fwd = base_cost.comp_fwd;
      u.comp_bwd = base_cost.comp_bwd;
      u.chunk_comp_fwd = {base_cost.comp_fwd};
      u.chunk_comp_bwd = {base_cost.comp_bwd};
      u.ret_fwd = base_cost.ret_fwd;
      u.ret_bwd = base_cost.ret_bwd;
      u.take_byte_totals(base_cost);
      unchunked = std::move(u);
    }
    return *unchunked;
  }
  // The unrelayed price of p at (m, split) if made already.
  const PlanCost* direct_of(std::int64_t m, ChunkSplit split) {
    if (is_base(m, split)) return &base_cost;
    if (m == 1) return &base_unchunked();
    const auto it = costs.find({m, split, false});
    return it != costs.end() ? &it->second : nullptr;
  }
  const PlanCost& cost_of(const Plan* p, std::int64_t m, ChunkSplit split, bool relayed) {
    if (!relayed && is_base(m, split)) return base_cost;
    const auto key = std::make_tuple(m, split, relayed);
    if (auto it = costs.find(key); it != costs.end()) return it->second;
    const ExchangeSums& x = sums_of(p);
    // Priced here at M > 1 only to be timed pipelined (put_pool): the
    // whole step is left unpriced; the tiles' whole compute is the base's.
    PriceReuse re = reuse(nullptr, &base_cost, m <= 1);
    if (!relayed) return costs.emplace(key, cost_plan(ctx, *p, x, gpus, nullptr, re)).first->second;
    const RelayTable relays = relays_of(x, p->config().topology);
    // Nothing to relay: the direct price (cost_plan ignores an empty table).
    if (!relays.any()) return costs.emplace(key, cost_of(p, m, split, false)).first->second;
    re.direct = direct_of(m, split);
    return costs.emplace(key, cost_plan(ctx, *p, x, gpus, &relays, re)).first->second;
  }
  Result<const PlanCost*> price(std::int64_t m, ChunkSplit split, bool relayed, const std::string& kind) {
    split = cut(m, split);
    if (!relayed && is_base(m, split)) return &base_cost;
    if (auto it = costs.find({m, split, relayed}); it != costs.end()) return &it->second;
    LIBRA_ASSIGN_OR_RETURN(const Plan* p, plan(m, split, kind));
    const double t0 = tm.clock();
    const PlanCost& c = cost_of(p, m, split, relayed);
    tm.cost += tm.clock() - t0;
    return &c;
  }
};

// The pool loop's fixed inputs: what is planned, timed and recorded.
struct PoolRun {
  const PlanConfig& pc;
  const std::vector<Variant>& variants;
  Record rec;
  const std::vector<std::int64_t>& chunks;
  std::vector<TopoShape> shapes;  // libra-topo's shapes beside the plain one
  std::vector<std::string> shape_labels;  // per shape: "libra-topo relayed tapered"
  std::vector<bool> tapered_fits;  // per M of chunks
  PriceReads reads;
};

// Step maxima of one placement's pools, by (variant, M) and by shape.
struct PoolSteps {
  std::int64_t ga = 0;
  std::map<std::pair<Variant, std::int64_t>, StepMax> plain;
  std::map<TopoShape, std::map<std::pair<Variant, std::int64_t>, StepMax>> shaped;
};

// libra-topo also with relayed inputs and tapered chunks, unless switched
// off (the choice among them is simulate()'s). Forced shapes are priced
// beside the plain one too (simulate() falls back to equal chunks where M
// does not admit tapered ones).
PoolRun pool_run(const Ctx& ctx, const PlanConfig& pc, const std::vector<Variant>& variants, Record rec,
                 const std::vector<std::int64_t>& chunks) {
  PoolRun r{pc, variants, rec, chunks, {}, {}, {}, {}};
  r.reads.backward = std::any_of(variants.begin(), variants.end(), timed_backward);
  r.reads.chunks = std::any_of(variants.begin(), variants.end(), variant_pipelined);
  if (rec == Record::kTopo) {
    const auto relay = ctx.cfg.relay == false ? std::optional<bool>(false) : std::nullopt;
    const auto split = ctx.cfg.chunk_split == ChunkSplit::kEqual ? std::optional(ChunkSplit::kEqual) : std::nullopt;
    const std::string kind(variant_name(variants[0]));
    for (const TopoShape& sh : admitted_shapes(relay, split)) {
      if (sh == TopoShape{}) continue;
      r.shapes.push_back(sh);
      r.shape_labels.push_back(kind + (sh.relayed ? " relayed" : "") + (sh.split == ChunkSplit::kTapered ? " tapered" : ""));
    }
  }
  // Tapered chunks need 3 <= M <= the heads of a tile (validate_plan_config).
  for (std::int64_t m : chunks) {
    PlanConfig c = pc;
    c.chunks = static_cast<int>(m);
    c.chunk_split = ChunkSplit::kTapered;
    r.tapered_fits.push_back(validate_plan_config(c).ok());
  }
  return r;
}

// Times one priced pool for a variant at M into the step maxima (and the
// libra variants' pool list); shape: priced as such a schedule runs (a
// relayed pool with nothing to relay too, so that every pool counts in the
// shape's steps).
// Where a pool runs: its GPUs, GA step and first replica, and its
// micro-batch's linear part (its longest sequence's: the pool's replicas
// wait for each other at every layer).
struct PoolPlace {
  std::span<const std::int64_t> gpus;
  std::int64_t g = 0, first_replica = 0, slots = 0;
  double lin_fwd = 0, lin_bwd = 0;
  std::vector<double> noise;  // per GPU, this GA step's (the same at every shape and M)
};

void put_pool(const PoolPlace& at, const PlanCost& cost, Variant var, std::int64_t m, bool pipelined,
              PoolSteps& steps, CandWindow& cw, const TopoShape* shape = nullptr) {
  const double t = time_plan(cost, at.noise, pipelined, false);
  auto& into = shape != nullptr ? steps.shaped[*shape] : steps.plain;
  auto it = into.try_emplace({var, m}, StepMax{std::vector<double>(static_cast<std::size_t>(steps.ga), 0.0)}).first;
  it->second.put(at.g, t);
  if (timed_backward(var)) {
    const MicroBatch mb{.attn_fwd = t,
                        .attn_bwd = time_plan(cost, at.noise, pipelined, true),
                        .lin_fwd = at.lin_fwd,
                        .lin_bwd = at.lin_bwd};
    (shape != nullptr ? cw.shaped_pools[*shape] : cw.pools)[{var, m}].push_back(
        {.fwd = t, .d = decompose(cost, pipelined), .ga = at.g, .first_replica = at.first_replica, .slots = at.slots,
         .mb = mb});
  }
}

void record_pool(Record rec, const PlanCost& c, CandWindow& cw) {
  if (rec == Record::kTap) {
    cw.tap.push_back({.intra = c.imbalance,
                      .bytes = static_cast<double>(c.comm_bytes),
                      .send = static_cast<double>(c.max_send),
                      .recv = static_cast<double>(c.max_recv),
                      .comm = comm_seconds(c),
                      .recv_cross = static_cast<double>(c.max_recv_cross_node)});
  } else if (rec == Record::kPlus) {
    cw.plus.push_back({.intra = c.imbalance, .bytes = static_cast<double>(c.comm_bytes)});
  } else if (rec == Record::kTopo) {
    cw.topo.push_back({.intra = c.imbalance, .recv_cross = static_cast<double>(c.max_recv_cross_node)});
  }
}

// One pool's step latencies from its plan's prices (PoolPrices, or a
// KeptPool): the pipelined variants at every M of `chunks`: the same tiles
// re-chunked (no placement reads M), and M = 1 is the unpipelined timing of
// any of them.
template <class Prices>
Status time_pool(const PoolRun& pr, Prices& prices, const PoolPlace& at, PoolSteps& steps, CandWindow& cw) {
  const std::string kind(variant_name(pr.variants[0]));
  const PlanCost& c = prices.base_cost;
  for (Variant var : pr.variants) {
    if (!variant_pipelined(var)) put_pool(at, c, var, 1, false, steps, cw);
  }
  const bool any_pipelined = std::any_of(pr.variants.begin(), pr.variants.end(), variant_pipelined);
  for (std::size_t i = 0; any_pipelined && i < pr.chunks.size(); ++i) {
    const std::int64_t m = pr.chunks[i];
    const PlanCost* re = &c;
    if (m != 1 && m != pr.pc.chunks) {
      LIBRA_ASSIGN_OR_RETURN(re, prices.price(m, pr.pc.chunk_split, false, kind));
    }
    for (Variant var : pr.variants) {
      if (variant_pipelined(var)) put_pool(at, *re, var, m, m != 1, steps, cw);
    }
    for (std::size_t k = 0; k < pr.shapes.size(); ++k) {
      const TopoShape& sh = pr.shapes[k];
      if (sh.split == ChunkSplit::kTapered && !pr.tapered_fits[i]) continue;
      // Relays are chosen per chunk, so each M (1 too) is relayed afresh.
      LIBRA_ASSIGN_OR_RETURN(const PlanCost* sc, prices.price(m, sh.split, sh.relayed, pr.shape_labels[k]));
      for (Variant var : pr.variants) {
        if (variant_pipelined(var)) put_pool(at, *sc, var, m, m != 1, steps, cw, &sh);
      }
    }
  }
  record_pool(pr.rec, c, cw);
  return {};
}

// A libra-tap-vrsp pool's prices, kept for libra-plus where its VRSP-refine
// pool of the same index is the same sequences on the same GPUs and
// tap-split makes TAP's plan of them (detail::same_tap_plan): the same plan
// on the same GPUs has the same prices, made once. libra-plus reads the
// base price and the unrelayed ones at the other M of `chunks` (libra-full's,
// pipelined at the same M).
struct KeptPool {
  PlanCost base_cost;
  ChunkSplit split = ChunkSplit::kEqual;
  PriceReads reads;  // what the prices hold (libra-tap-vrsp's: all)
  std::map<std::int64_t, PlanCost> at_m;

  Result<const PlanCost*> price(std::int64_t m, ChunkSplit s, bool relayed, const std::string& kind) const {
    const auto it = at_m.find(m);
    if (relayed || s != split || it == at_m.end()) {
      return internal_error(kind + " (M " + std::to_string(m) + "): not among the kept prices");
    }
    return &it->second;
  }
};

// One candidate's kept pools, by VRSP pool index, filled in the
// candidate's own fixed order (the same whatever thread runs it). `want`:
// the VRSP-refine pool of that index is the same sequences on the same GPUs.
struct SharedPools {
  const PlanConfig* plus = nullptr;
  std::vector<bool> want;
  std::vector<std::optional<KeptPool>> kept;
};

// Makes CandWindow::topo_at_dp pool by pool, as end_to_end.cpp's
// libra_replicas would time each pool at each DP point.
struct TopoTimer {
  const Ctx& ctx;
  std::uint64_t w = 0;
  std::vector<StepLayout> layouts;  // per DP point of out.dps
  TopoAtDp out;

  void put(std::size_t k, const PlanCost& c, const PoolPlace& at) {
    for (std::size_t d = 0; d < layouts.size(); ++d) {
      const StepLayout& lay = layouts[d];
      const auto gpus = pool_gpus(lay.pool_first_replica[k], at.slots, ctx.cfg.cp);
      const NoiseKey key{w, static_cast<std::uint64_t>(lay.pool_ga[k])};
      const auto noise = noise_factors(ctx, std::span(gpus).first(static_cast<std::size_t>(c.workers)), key);
      out.times[d].emplace_back(time_plan(c, noise, true, false), time_plan(c, noise, true, true));
      if (!same_price_gpus(ctx.cfg.cost.net, at.gpus, gpus)) out.same_price[d] = 0;
    }
  }
};

// libra-topo's timer where the end-to-end model runs: the DP points P
// divides (layout_window), the base plan's M, relayed unless switched off.
std::optional<TopoTimer> topo_timer(const WindowRun& run, const Placed& placed, const PoolRun& pr) {
  const SimConfig& cfg = run.ctx.cfg;
  if (pr.rec != Record::kTopo || !cfg.end_to_end || cfg.scaling_dp.empty()) return std::nullopt;
  TopoTimer t{run.ctx, run.w, {}, {}};
  t.out.chunks = pr.pc.chunks;
  t.out.relayed = cfg.relay != false;
  for (std::int64_t dp : end_to_end_dps(cfg)) {
    if (dp % placed.second.pool_size != 0) continue;
    auto lay = layout_window(placed.first, dp);
    if (!lay.ok()) continue;  // the end-to-end phase reports it
    t.out.dps.push_back(dp);
    t.layouts.push_back(std::move(*lay));
  }
  t.out.times.resize(t.layouts.size());
  t.out.same_price.assign(t.layouts.size(), 1);
  return t;
}

// Pool k of a placement: libra-plus's from the kept prices where there are
// some; libra-tap-vrsp's through make_plan and kept where libra-plus makes
// the same plan; else through make_plan (pc, at one of `chunks`).
Status run_pool(WindowRun& run, const PoolRun& pr, std::size_t k, std::span<const PackedSequence> pool,
                const PoolPlace& at, PoolSteps& steps, CandWindow& cw, SharedPools* shared, TopoTimer* timer) {
  if (shared != nullptr && pr.rec == Record::kPlus && k < shared->kept.size() && shared->kept[k]) {
    KeptPool& kp = *shared->kept[k];
    // A price read for more holds the same figures for fewer readers.
    if ((kp.reads.backward || !pr.reads.backward) && (kp.reads.chunks || !pr.reads.chunks)) {
      return time_pool(pr, kp, at, steps, cw);
    }
  }
  const std::string kind(variant_name(pr.variants[0]));
  LIBRA_ASSIGN_OR_RETURN(const Plan base, timed_plan(run.tm, kind, [&] { return make_plan(pool, pr.pc); }));
  // The base plan's sums serve its direct price and its relays.
  PoolPrices prices(run.ctx, base, at.gpus, run.tm, pr.reads);
  LIBRA_TRY(time_pool(pr, prices, at, steps, cw));
  if (timer != nullptr) {
    LIBRA_ASSIGN_OR_RETURN(const PlanCost* c, prices.price(timer->out.chunks, ChunkSplit::kEqual, timer->out.relayed, kind));
    timer->put(k, *c, at);
  }
  const bool keep = shared != nullptr && pr.rec == Record::kTap && k < shared->want.size() && shared->want[k] &&
                    same_tap_plan(base, pool, *shared->plus);
  if (!keep) return {};
  KeptPool kp{std::move(prices.base_cost), pr.pc.chunk_split, pr.reads, {}};
  for (std::int64_t m : pr.chunks) {
    if (m == 1 || m == pr.pc.chunks) continue;
    const auto it = prices.costs.find({m, prices.cut(m, pr.pc.chunk_split), false});
    if (it == prices.costs.end()) return {};  // not priced here: libra-plus prices its own
    kp.at_m.emplace(m, std::move(it->second));
  }
  if (shared->kept.size() <= k) shared->kept.resize(k + 1);
  shared->kept[k] = std::move(kp);
  return {};
}

// Every pool of a placement through run_pool; the step maxima into cw.
Status run_pools(WindowRun& run, const Placed& pl, const PlanConfig& pc, const std::vector<Variant>& variants,
                 CandWindow& cw, Record rec, const std::vector<std::int64_t>& chunks, SharedPools* shared = nullptr) {
  const auto& [placement, layout] = pl;
  const PoolRun pr = pool_run(run.ctx, pc, variants, rec, chunks);
  PoolSteps steps{.ga = run.ctx.cfg.gbs / run.ctx.cfg.dp, .plain = {}, .shaped = {}};
  std::optional<TopoTimer> timer = topo_timer(run, pl, pr);
  for (std::size_t k = 0; k < placement.pools.size(); ++k) {
    const auto pool = pool_of(run.window, placement.pools[k]);
    const auto slots = static_cast<std::int64_t>(pool.size());
    const auto gpus = pool_gpus(layout.pool_first_replica[k], slots, run.ctx.cfg.cp);
    PoolPlace at{gpus, layout.pool_ga[k], layout.pool_first_replica[k], slots, 0, 0,
                 noise_factors(run.ctx, gpus, {run.w, static_cast<std::uint64_t>(layout.pool_ga[k])})};
    for (const auto& sq : pool) {
      at.lin_fwd = std::max(at.lin_fwd, linear_part(run.ctx, seq_tokens(sq), false));
      at.lin_bwd = std::max(at.lin_bwd, linear_part(run.ctx, seq_tokens(sq), true));
    }
    LIBRA_TRY(run_pool(run, pr, k, pool, at, steps, cw, shared, timer ? &*timer : nullptr));
  }
  if (timer) cw.topo_at_dp = std::move(timer->out);
  for (auto& [key, sm] : steps.plain) cw.steps[key] = std::move(sm.step);
  for (auto& [sh, by] : steps.shaped) {
    for (auto& [key, sm] : by) cw.shaped_steps[sh][key] = std::move(sm.step);
  }
  return {};
}

// Inter-pool R-1 of every placement mode at the candidate's P (placements
// made once per P), and the lower bound.
Status placement_figures(WindowRun& run, std::int64_t p, CandWindow& cw) {
  const SimConfig& cfg = run.ctx.cfg;
  auto it = run.by_p.find(p);
  if (it == run.by_p.end()) {
    std::map<PlacementMode, Placed> placed;
    for (PlacementMode mode : all_placement_modes()) {
      LIBRA_ASSIGN_OR_RETURN(Placed pl, placement_for(run, p, mode));
      placed.emplace(mode, std::move(pl));
    }
    it = run.by_p.emplace(p, std::move(placed)).first;
  }
  for (PlacementMode mode : all_placement_modes()) {
    if (mode == PlacementMode::kRandom) {
      const double t1 = run.tm.clock();
      auto r = mean_random_imbalance(run.f, p, cfg.seed, cfg.random_seeds);
      run.tm.placement += run.tm.clock() - t1;
      if (!r.ok()) return r.error();
      cw.inter[mode] = *r;
    } else {
      cw.inter[mode] = it->second.at(mode).first.imbalance;
    }
  }
  cw.lower_bound = imbalance_lower_bound(run.f, p) - 1.0;
  return {};
}

// DistCA: one pool of P = DP per GA step in loader order; once per (H, B).
// Its pools, config and M list are libra-tap's at P = DP (the sampler
// placement, made the same way): one run_pools prices both, and libra-tap's
// steps are kept for the P = DP candidate (sampler_steps).
Status distca_steps(WindowRun& run, const SimCandidate& cand, const PlanConfig& tap,
                    const std::vector<std::int64_t>& ms, CandWindow& cw) {
  const auto key = std::make_pair(cand.head_shards, cand.block_size);
  auto d = run.distca.find(key);
  if (d == run.distca.end()) {
    LIBRA_ASSIGN_OR_RETURN(Placed pl, placement_for(run, run.ctx.cfg.dp, PlacementMode::kSampler));
    const bool tap_too = std::any_of(run.ctx.candidates.begin(), run.ctx.candidates.end(),
                                     [&](const SimCandidate& c) { return c.pool_size == run.ctx.cfg.dp; });
    std::vector<Variant> variants{Variant::kDistca};
    if (tap_too) variants.push_back(Variant::kLibraTap);
    CandWindow tmp;
    LIBRA_TRY(run_pools(run, pl, tap, variants, tmp, Record::kNothing, ms));
    StepSeries distca, libra_tap;
    for (auto& [k, v] : tmp.steps) (k.first == Variant::kDistca ? distca : libra_tap).emplace(k, std::move(v));
    run.tap_at_dp.emplace(key, std::make_pair(ms, std::move(libra_tap)));
    d = run.distca.emplace(key, std::move(distca)).first;
  }
  cw.steps.insert(d->second.begin(), d->second.end());
  return {};
}

// libra-tap: the sampler placement's pools with the tap config; at P = DP
// the steps distca_steps made with distca's when they are for the same M.
Status sampler_steps(WindowRun& run, const SimCandidate& cand, const PlanConfig& tap,
                     const std::vector<std::int64_t>& ms, CandWindow& cw) {
  if (cand.pool_size == run.ctx.cfg.dp && distca_skip_reason(run.ctx.cfg).empty()) {
    LIBRA_TRY(distca_steps(run, cand, tap, ms, cw));
    const auto& [at_ms, steps] = run.tap_at_dp.at({cand.head_shards, cand.block_size});
    if (at_ms == ms) {
      cw.steps.insert(steps.begin(), steps.end());
      return {};
    }
  }
  return run_pools(run, run.by_p.at(cand.pool_size).at(PlacementMode::kSampler), tap, {Variant::kLibraTap}, cw,
                   Record::kNothing, ms);
}

// The VRSP pools whose plan and prices libra-plus may reuse: tap-split
// reads what tap reads (same_tap_inputs), and its VRSP-refine pool of the
// same index holds the same sequences on the same GPUs (VRSP-refine often
// moves nothing at small P).
SharedPools shared_pools(const Placed& vrsp, const Placed& refine, const PlanConfig& tap, const PlanConfig& plus) {
  SharedPools out{.plus = &plus, .want = {}, .kept = {}};
  if (!same_tap_inputs(tap, plus)) return out;
  const auto& [v, vl] = vrsp;
  const auto& [r, rl] = refine;
  out.want.resize(v.pools.size());
  for (std::size_t k = 0; k < v.pools.size() && k < r.pools.size(); ++k) {
    out.want[k] = v.pools[k] == r.pools[k] && vl.pool_first_replica[k] == rl.pool_first_replica[k];
  }
  return out;
}

// One candidate of one window: placements, every libra variant, distca.
Status run_candidate(WindowRun& run, std::size_t ci, CandWindow& cw) {
  const Ctx& ctx = run.ctx;
  const SimCandidate& cand = ctx.candidates[ci];
  LIBRA_TRY(placement_figures(run, cand.pool_size, cw));
  const auto& placed = run.by_p.at(cand.pool_size);
  const std::vector<std::int64_t>& ms = ctx.chunks[ci];
  // Plans are made at the first listed M above 1 (M = 1 is any plan's
  // unpipelined timing) and re-chunked for the others.
  const auto above_one = std::find_if(ms.begin(), ms.end(), [](std::int64_t m) { return m > 1; });
  const std::int64_t base = above_one == ms.end() ? ms[0] : *above_one;
  const PlanConfig tap = tap_config(ctx, cand.head_shards, cand.block_size, base);
  const PlanConfig plus = plan_config(ctx, cand.head_shards, cand.block_size, base, PlanMode::kTapSplit, true);
  const PlanConfig topo = plan_config(ctx, cand.head_shards, cand.block_size, base, PlanMode::kTapTopo, false);
  LIBRA_TRY(sampler_steps(run, cand, tap, ms, cw));
  SharedPools shared = shared_pools(placed.at(PlacementMode::kVrsp), placed.at(PlacementMode::kVrspRefine), tap, plus);
  LIBRA_TRY(run_pools(run, placed.at(PlacementMode::kVrsp), tap, {Variant::kLibraTapVrsp, Variant::kLibraFull}, cw,
                      Record::kTap, ms, &shared));
  LIBRA_TRY(run_pools(run, placed.at(PlacementMode::kVrspRefine), plus, {Variant::kLibraPlus}, cw, Record::kPlus, ms,
                      &shared));
  auto tp = run.topo_by_p.find(cand.pool_size);
  if (tp == run.topo_by_p.end()) {
    LIBRA_ASSIGN_OR_RETURN(Placed pl, placement_for(run, cand.pool_size, PlacementMode::kVrsp, topo_interleave(ctx)));
    tp = run.topo_by_p.emplace(cand.pool_size, std::move(pl)).first;
  }
  LIBRA_TRY(run_pools(run, tp->second, topo, {Variant::kLibraTopo}, cw, Record::kTopo, ms));
  if (distca_skip_reason(ctx.cfg).empty()) LIBRA_TRY(distca_steps(run, cand, tap, ms, cw));
  return {};
}

}  // namespace

WindowResult simulate_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w,
                             std::size_t part, std::size_t parts) {
  WindowResult out;
  out.timing.on = ctx.cfg.thread_timing;
  const double t0 = out.timing.clock();
  auto f = sequence_workloads(window);
  out.timing.placement += out.timing.clock() - t0;
  if (!f.ok()) {
    out.status = f.error();
    return out;
  }
  WindowRun run{ctx, window, w, std::move(*f), out.timing, {}, {}, {}, {}};
  Status s = part == 0 ? window_baselines(run, out) : Status{};
  if (!s.ok()) out.failed_at = -1;
  out.cand.resize(ctx.candidates.size());
  for (std::size_t ci = part; s.ok() && ci < ctx.candidates.size(); ci += parts) {
    s = run_candidate(run, ci, out.cand[ci]);
    if (!s.ok()) out.failed_at = static_cast<std::int64_t>(ci);
  }
  if (!s.ok()) out.status = s;
  return out;
}

void merge_part(WindowResult& into, WindowResult&& part, std::size_t first, std::size_t parts) {
  if (!part.status.ok() && (into.status.ok() || part.failed_at < into.failed_at)) {
    into.status = part.status;
    into.failed_at = part.failed_at;
  }
  for (std::size_t ci = first; ci < part.cand.size(); ci += parts) into.cand[ci] = std::move(part.cand[ci]);
  Timing& t = into.timing;
  t.placement += part.timing.placement;
  t.plan += part.timing.plan;
  t.cost += part.timing.cost;
  t.plans += part.timing.plans;
  for (const auto& [k, v] : part.timing.by_kind) {
    t.by_kind[k].first += v.first;
    t.by_kind[k].second += v.second;
  }
}

}  // namespace libra::detail
