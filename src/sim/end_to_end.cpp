// The end-to-end step model: DP scaling at fixed GBS and the per-microbatch
// forward times (paper sections 8.2 and 8.3). A window's micro-batches are
// priced per replica (ulysses: each sequence on its own CP group; libra:
// each VRSP pool's slowest worker, for every replica of the pool), split
// over the pipeline stages, and run through the step model
// (step_model.hpp) at every coupling setting.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "libra/io.hpp"

#include "libra/workload.hpp"
#include "sim/internal.hpp"

namespace libra::detail {

std::vector<std::int64_t> coupling_settings(const SimConfig& cfg) {
  std::vector<std::int64_t> out{1};
  if (cfg.coupling != 1 && cfg.coupling != kCoupleAll) out.push_back(cfg.coupling);
  out.push_back(kCoupleAll);
  return out;
}

std::vector<std::int64_t> end_to_end_dps(const SimConfig& cfg) {
  std::vector<std::int64_t> dps = cfg.scaling_dp;
  if (std::find(dps.begin(), dps.end(), cfg.dp) == dps.end()) dps.push_back(cfg.dp);
  std::sort(dps.begin(), dps.end());
  dps.erase(std::unique(dps.begin(), dps.end()), dps.end());
  return dps;
}

MicroBatchCost stage_costs(const MicroBatch& mb, std::int64_t layers, std::int64_t stages) {
  MicroBatchCost out;
  for (std::int64_t s = 0; s < stages; ++s) {
    const double n = static_cast<double>(stage_layers(layers, stages, s));
    const double share = n / static_cast<double>(layers);
    out.push_back({.fwd = n * mb.attn_fwd + share * mb.lin_fwd, .bwd = n * mb.attn_bwd + share * mb.lin_bwd});
  }
  return out;
}

namespace {

struct Window {
  const Ctx& ctx;
  std::span<const PackedSequence> seqs;
  std::uint64_t w = 0;
  std::vector<std::int64_t> f;
  Timing& tm;
};

double lin(const Ctx& ctx, double tokens, bool backward) { return linear_part(ctx, tokens, backward); }

// Whether the sweep's ulysses prices (on replica i % DP) are this phase's
// (on replica 0): the same plans, on GPUs that price alike.
bool takes_swept(const Window& win, const std::vector<PlanCost>* swept) {
  const SimConfig& cfg = win.ctx.cfg;
  if (swept == nullptr || swept->size() != win.seqs.size()) return false;
  const auto gpus = pool_gpus(0, 1, cfg.cp);
  for (std::size_t i = 0; i < win.seqs.size(); ++i) {
    const auto at = pool_gpus(static_cast<std::int64_t>(i) % cfg.dp, 1, cfg.cp);
    if (!same_price_gpus(cfg.cost.net, at, gpus)) return false;
  }
  return true;
}

// Ulysses: every sequence on its own CP group; planned once, timed per DP.
Result<std::vector<PlanCost>> ulysses_costs(Window& win) {
  std::vector<PlanCost> out;
  const PlanConfig upc = ulysses_config(win.ctx);
  for (std::size_t i = 0; i < win.seqs.size(); ++i) {
    auto gpus = pool_gpus(0, 1, win.ctx.cfg.cp);
    LIBRA_ASSIGN_OR_RETURN(PlanCost c, price_pool(win.ctx, win.seqs.subspan(i, 1), upc, gpus, win.tm, "end-to-end ulysses"));
    out.push_back(std::move(c));
  }
  return out;
}

// Per replica, its micro-batches' stage costs at this DP (replica r of GA
// step g runs sequence g * DP + r); forward seconds per micro-batch into
// `fwd` and the micro-batches into `parts` when given.
std::vector<ReplicaCosts> ulysses_replicas(const Window& win, const std::vector<PlanCost>& uly, std::int64_t dp,
                                           std::vector<double>* fwd, std::vector<std::vector<MicroBatch>>* parts) {
  const SimConfig& cfg = win.ctx.cfg;
  std::vector<ReplicaCosts> reps(static_cast<std::size_t>(dp));
  if (parts != nullptr) parts->assign(static_cast<std::size_t>(dp), {});
  for (std::size_t i = 0; i < win.seqs.size(); ++i) {
    const std::int64_t g = static_cast<std::int64_t>(i) / dp, r = static_cast<std::int64_t>(i) % dp;
    auto gpus = pool_gpus(r, 1, cfg.cp);
    const NoiseKey key{win.w, static_cast<std::uint64_t>(g)};
    const double tok = seq_tokens(win.seqs[i]);
    const MicroBatch mb{.attn_fwd = time_plan(win.ctx, uly[i], gpus, key, false, false),
                        .attn_bwd = time_plan(win.ctx, uly[i], gpus, key, false, true),
                        .lin_fwd = lin(win.ctx, tok, false),
                        .lin_bwd = lin(win.ctx, tok, true)};
    reps[static_cast<std::size_t>(r)].push_back(stage_costs(mb, cfg.model.layers, cfg.pp));
    if (parts != nullptr) (*parts)[static_cast<std::size_t>(r)].push_back(mb);
    if (fwd != nullptr) fwd->push_back(static_cast<double>(cfg.model.layers) * mb.attn_fwd + mb.lin_fwd);
  }
  return reps;
}

// The libra plan configuration of the recommended candidate.
struct LibraRun {
  const SimCandidate& rec;
  Variant variant;
  PlanConfig pc;
  bool relayed = false;
  // VRSP pools depend on P only, not on DP: each P is planned once. (Their
  // communication times keep the node locality of the first layout that
  // used them; later layouts shift pools by whole multiples of P x CP GPUs.)
  std::map<std::int64_t, std::vector<PlanCost>> costs;
  // The sweep's times by P (SweptTopo), and per P whether they are taken:
  // decided where P is first priced, as `costs` are made there.
  const SweptTopo& swept;
  std::map<std::int64_t, bool> takes_swept;

  // The sweep's times of p's pools at dp (index *d of their DP points), or
  // nullptr where p's pools are priced here.
  const TopoAtDp* swept_at(std::int64_t p, std::int64_t dp, std::size_t pools, std::size_t& d) {
    const auto it = swept.find(p);
    if (it == swept.end()) return nullptr;
    const TopoAtDp& t = *it->second;
    const auto at = std::find(t.dps.begin(), t.dps.end(), dp);
    if (at == t.dps.end()) return nullptr;
    d = static_cast<std::size_t>(at - t.dps.begin());
    const auto taken = takes_swept.try_emplace(p, t.same_price[d] != 0 && t.times[d].size() == pools).first;
    return taken->second ? &t : nullptr;
  }
};

// Libra: VRSP pools of P = gcd(P_rec, DP); a pool's replicas wait for each
// other at every layer's all-to-all, so each runs the pool's slowest worker.
Result<std::vector<ReplicaCosts>> libra_replicas(Window& win, LibraRun& lr, std::int64_t dp, std::vector<double>* fwd,
                                                 std::vector<std::vector<MicroBatch>>* parts) {
  const SimConfig& cfg = win.ctx.cfg;
  const std::int64_t p = std::gcd(lr.rec.pool_size, dp);
  const double t0 = win.tm.clock();
  const NodeInterleave interleave = lr.variant == Variant::kLibraTopo ? topo_interleave(win.ctx) : NodeInterleave{};
  LIBRA_ASSIGN_OR_RETURN(WindowPlacement pl, place_window(win.f, {.pool_size = p, .mode = PlacementMode::kVrsp,
                                                                  .seed = cfg.seed, .interleave = interleave}));
  LIBRA_ASSIGN_OR_RETURN(StepLayout lay, layout_window(pl, dp));
  win.tm.placement += win.tm.clock() - t0;
  std::size_t d = 0;
  const TopoAtDp* swept = lr.swept_at(p, dp, pl.pools.size(), d);
  auto cached = lr.costs.find(p);
  if (swept == nullptr && cached == lr.costs.end()) {
    std::vector<PlanCost> costs;
    for (std::size_t k = 0; k < pl.pools.size(); ++k) {
      const auto gpus = pool_gpus(lay.pool_first_replica[k], p, cfg.cp);
      LIBRA_ASSIGN_OR_RETURN(PlanCost c, price_pool(win.ctx, pool_of(win.seqs, pl.pools[k]), lr.pc, gpus, win.tm,
                                                    "end-to-end libra", lr.relayed));
      costs.push_back(std::move(c));
    }
    cached = lr.costs.emplace(p, std::move(costs)).first;
  }
  const bool pipelined = variant_pipelined(lr.variant);
  std::vector<ReplicaCosts> reps(static_cast<std::size_t>(dp), ReplicaCosts(static_cast<std::size_t>(cfg.gbs / dp)));
  if (parts != nullptr) parts->assign(reps.size(), std::vector<MicroBatch>(static_cast<std::size_t>(cfg.gbs / dp)));
  for (std::size_t k = 0; k < pl.pools.size(); ++k) {
    const auto pool = pool_of(win.seqs, pl.pools[k]);
    const auto gpus = pool_gpus(lay.pool_first_replica[k], p, cfg.cp);
    const std::int64_t g = lay.pool_ga[k];
    const NoiseKey key{win.w, static_cast<std::uint64_t>(g)};
    MicroBatch mb;
    if (swept != nullptr) {
      std::tie(mb.attn_fwd, mb.attn_bwd) = swept->times[d][k];
    } else {
      mb.attn_fwd = time_plan(win.ctx, cached->second[k], gpus, key, pipelined, false);
      mb.attn_bwd = time_plan(win.ctx, cached->second[k], gpus, key, pipelined, true);
    }
    for (const auto& s : pool) {
      mb.lin_fwd = std::max(mb.lin_fwd, lin(win.ctx, seq_tokens(s), false));
      mb.lin_bwd = std::max(mb.lin_bwd, lin(win.ctx, seq_tokens(s), true));
    }
    const MicroBatchCost stages = stage_costs(mb, cfg.model.layers, cfg.pp);
    for (std::int64_t r = lay.pool_first_replica[k]; r < lay.pool_first_replica[k] + p; ++r) {
      reps[static_cast<std::size_t>(r)][static_cast<std::size_t>(g)] = stages;
      if (parts != nullptr) (*parts)[static_cast<std::size_t>(r)][static_cast<std::size_t>(g)] = mb;
    }
    if (fwd != nullptr) {
      for (const auto& s : pool) {
        fwd->push_back(static_cast<double>(cfg.model.layers) * mb.attn_fwd + lin(win.ctx, seq_tokens(s), false));
      }
    }
  }
  return reps;
}

}  // namespace

// The gradient all-reduce of one stage's share of the parameters over DP.
double step_allreduce_seconds(const SimConfig& cfg, std::int64_t dp) {
  return allreduce_seconds(cfg.cost.net, cfg.model.grad_bytes_per_gpu / static_cast<double>(cfg.pp), dp);
}

// Both modes' steps at every coupling setting. A libra pool couples its P
// replicas anyway, so a coupled span joins whole pools (lcm(span, P)).
std::vector<CouplingSteps> steps_at(const SimConfig& cfg, const std::vector<ReplicaCosts>& uly,
                                         const std::vector<ReplicaCosts>& libra, std::int64_t dp, std::int64_t p) {
  const double ar = step_allreduce_seconds(cfg, dp);
  std::vector<CouplingSteps> out;
  for (std::int64_t span : coupling_settings(cfg)) {
    const std::int64_t libra_span = span == kCoupleAll ? kCoupleAll : std::lcm(span, p);
    out.push_back({.coupling = span,
                   .ulysses = step_seconds(uly, {.span = span}, ar),
                   .libra = step_seconds(libra, {.span = libra_span}, ar)});
  }
  return out;
}

E2eWindow e2e_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w,
                     const SimCandidate& rec, const std::vector<std::int64_t>& dps, Variant libra,
                     std::int64_t chunks, bool relayed, ChunkSplit split, const SweptTopo& swept,
                     const std::vector<PlanCost>* ulysses) {
  E2eWindow out;
  out.timing.on = ctx.cfg.thread_timing;
  for (const auto& s : window) out.tokens += seq_tokens(s);
  auto f = sequence_workloads(window);
  if (!f.ok()) {
    out.status = f.error();
    return out;
  }
  Window win{ctx, window, w, std::move(*f), out.timing};
  const bool swept_uly = takes_swept(win, ulysses);
  Result<std::vector<PlanCost>> own = std::vector<PlanCost>{};
  if (!swept_uly) own = ulysses_costs(win);
  if (!own.ok()) {
    out.status = own.error();
    return out;
  }
  const std::vector<PlanCost>& uly = swept_uly ? *ulysses : *own;
  PlanConfig lpc = plan_config(ctx, rec.head_shards, rec.block_size, chunks,
                               libra == Variant::kLibraTopo ? PlanMode::kTapTopo : PlanMode::kTap, false);
  lpc.chunk_split = split;
  LibraRun lr{rec, libra, lpc, relayed, {}, swept, {}};
  const bool traced = !ctx.cfg.step_costs_out.empty();
  for (std::int64_t dp : dps) {
    const bool at_dp = dp == ctx.cfg.dp;
    StepTrace tr;
    tr.dp = dp;
    tr.pool_size = std::gcd(rec.pool_size, dp);
    const auto ur = ulysses_replicas(win, uly, dp, at_dp ? &out.mb_ulysses : nullptr, traced ? &tr.ulysses : nullptr);
    auto lrp = libra_replicas(win, lr, dp, at_dp ? &out.mb_libra : nullptr, traced ? &tr.libra : nullptr);
    if (!lrp.ok()) {
      out.status = lrp.error();
      return out;
    }
    out.steps.push_back(steps_at(ctx.cfg, ur, *lrp, dp, tr.pool_size));
    if (traced) {
      tr.allreduce = step_allreduce_seconds(ctx.cfg, dp);
      out.trace.push_back(std::move(tr));
    }
  }
  return out;
}

namespace {

MicrobatchStats normalised(const std::vector<double>& v, double libra_mean) {
  MicrobatchStats m;
  for (double x : v) m.values.push_back(x / libra_mean);
  if (!m.values.empty()) {
    m.min = *std::min_element(m.values.begin(), m.values.end());
    m.max = *std::max_element(m.values.begin(), m.values.end());
    m.mean = std::accumulate(m.values.begin(), m.values.end(), 0.0) / static_cast<double>(m.values.size());
  }
  return m;
}

// Throughput and efficiency (against DP_min's throughput x DP / DP_min) of
// every coupling setting at every DP point; the configured one is the
// point's own figure.
void fill_points(const std::vector<std::vector<CouplingSteps>>& total, const std::vector<std::int64_t>& dps,
                 double tokens, const SimCandidate& rec, SimResult& res) {
  for (std::size_t k = 0; k < dps.size(); ++k) {
    DpScalingPoint pt;
    pt.dp = dps[k];
    pt.pool_size = std::gcd(rec.pool_size, dps[k]);
    const double scale = static_cast<double>(dps[k]) / static_cast<double>(dps[0]);
    for (std::size_t c = 0; c < total[k].size(); ++c) {
      CouplingPoint cp{.coupling = total[k][c].coupling,
                       .ulysses_tokens_per_s = tokens / total[k][c].ulysses,
                       .libra_tokens_per_s = tokens / total[k][c].libra};
      cp.ulysses_efficiency = cp.ulysses_tokens_per_s / (scale * tokens / total[0][c].ulysses);
      cp.libra_efficiency = cp.libra_tokens_per_s / (scale * tokens / total[0][c].libra);
      if (cp.coupling == res.config.coupling) {
        pt.ulysses_tokens_per_s = cp.ulysses_tokens_per_s;
        pt.libra_tokens_per_s = cp.libra_tokens_per_s;
        pt.ulysses_efficiency = cp.ulysses_efficiency;
        pt.libra_efficiency = cp.libra_efficiency;
      }
      pt.couplings.push_back(cp);
    }
    res.dp_scaling.push_back(std::move(pt));
  }
}

}  // namespace

Status fold_end_to_end(const std::vector<E2eWindow>& er, const std::vector<std::int64_t>& dps,
                       const SimCandidate& rec, SimResult& res) {
  if (dps.empty() || er.empty()) return {};
  std::vector<std::vector<CouplingSteps>> total;  // summed over windows
  double tokens = 0;
  std::vector<double> mbu, mbl;
  for (const auto& r : er) {
    if (!r.status.ok()) return r.status;
    if (total.empty()) {
      total = r.steps;
    } else {
      for (std::size_t k = 0; k < total.size(); ++k) {
        for (std::size_t c = 0; c < total[k].size(); ++c) {
          total[k][c].ulysses += r.steps[k][c].ulysses;
          total[k][c].libra += r.steps[k][c].libra;
        }
      }
    }
    tokens += r.tokens;
    mbu.insert(mbu.end(), r.mb_ulysses.begin(), r.mb_ulysses.end());
    mbl.insert(mbl.end(), r.mb_libra.begin(), r.mb_libra.end());
    add_timing(res.timing, r.timing);
  }
  fill_points(total, dps, tokens, rec, res);
  const double libra_mean = stat_of(mbl).mean;
  res.microbatch_ulysses = normalised(mbu, libra_mean);
  res.microbatch_libra = normalised(mbl, libra_mean);
  return {};
}

namespace {

nlohmann::json micro_batches(const std::vector<std::vector<MicroBatch>>& reps) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : reps) {
    nlohmann::json mbs = nlohmann::json::array();
    for (const MicroBatch& m : r) mbs.push_back({m.attn_fwd, m.attn_bwd, m.lin_fwd, m.lin_bwd});
    out.push_back(std::move(mbs));
  }
  return out;
}

}  // namespace

// For an independent check of the step model (tests/python/test_step_model.py):
// the micro-batches as [attn_fwd, attn_bwd, lin_fwd, lin_bwd] (per layer,
// per layer, whole model, whole model) and what this model made of them.
Status write_step_costs(const std::string& path, const SimConfig& cfg, const std::vector<E2eWindow>& er) {
  nlohmann::json windows = nlohmann::json::array();
  for (std::size_t w = 0; w < er.size(); ++w) {
    nlohmann::json points = nlohmann::json::array();
    for (std::size_t k = 0; k < er[w].trace.size(); ++k) {
      const StepTrace& t = er[w].trace[k];
      nlohmann::json steps = nlohmann::json::array();
      for (const CouplingSteps& c : er[w].steps[k]) {
        steps.push_back({{"coupling", coupling_name(c.coupling)}, {"span", c.coupling}, {"ulysses", c.ulysses},
                         {"libra", c.libra}});
      }
      points.push_back({{"dp", t.dp}, {"pool_size", t.pool_size}, {"allreduce_s", t.allreduce},
                        {"steps", std::move(steps)}, {"ulysses", micro_batches(t.ulysses)},
                        {"libra", micro_batches(t.libra)}});
    }
    windows.push_back({{"window", w}, {"tokens", er[w].tokens}, {"points", std::move(points)}});
  }
  const nlohmann::json doc = {{"layers", cfg.model.layers}, {"pp", cfg.pp}, {"windows", std::move(windows)}};
  return write_file_atomic(path, doc.dump() + "\n");
}

}  // namespace libra::detail
