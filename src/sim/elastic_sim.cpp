// Elastic pools against plain VRSP on a corpus (libra/elastic_sim.hpp).
// Windows are independent: each is simulated on its own (threads pull window
// indices) and the results are folded in window order, so the figures do not
// depend on the thread count.
#include "libra/elastic_sim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/plan.hpp"
#include "sim/internal.hpp"

namespace libra {

namespace {

// What one placement (VRSP or vrsp-elastic) of one window costs.
struct Side {
  double placement_imbalance = 0;
  double worker_imbalance = 0;
  std::vector<double> bytes, latency;  // per GA step
};

struct WindowOut {
  Status status;
  Side vrsp, elastic;
  std::int64_t fused_domains = 0, fused_steps = 0;
  std::vector<bool> fused_step;  // per GA step
  double lower_bound = 0;
  WindowPlacement runs;  // what the window runs
  ElasticWindowReport report;
};

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Plans every domain of a placement as one pool (a fused domain: k*P slots,
// its workers the GPUs of its pools' replicas in domain order) and prices it.
Status run_side(std::span<const PackedSequence> window, const WindowPlacement& pl, const detail::Ctx& ctx,
                const PlanConfig& pc, std::uint64_t w, Side& out) {
  const SimConfig& cfg = ctx.cfg;
  LIBRA_ASSIGN_OR_RETURN(StepLayout layout, layout_window(pl, cfg.dp));
  const auto ga = static_cast<std::size_t>(layout.ga_steps);
  out.bytes.assign(ga, 0);
  out.latency.assign(ga, 0);
  out.placement_imbalance = pl.imbalance;
  std::int64_t max_worker = 0;
  double total = 0;
  for (std::size_t d = 0; d < pl.domains.size(); ++d) {
    std::vector<PackedSequence> pool;
    for (std::int32_t i : domain_slots(pl, d)) pool.push_back(window[static_cast<std::size_t>(i)]);
    std::vector<std::int64_t> gpus;
    for (std::int32_t k : pl.domains[d]) {
      const std::int64_t first = layout.pool_first_replica[static_cast<std::size_t>(k)];
      const std::int64_t g = layout.pool_ga[static_cast<std::size_t>(k)];
      if (g != layout.pool_ga[static_cast<std::size_t>(pl.domains[d].front())]) {
        return internal_error("elastic: a domain spans two GA steps");
      }
      const std::vector<std::int64_t> pg = detail::pool_gpus(first, layout.pool_size, cfg.cp);
      gpus.insert(gpus.end(), pg.begin(), pg.end());
    }
    LIBRA_ASSIGN_OR_RETURN(Plan plan, make_plan(pool, pc));
    for (std::int64_t f : plan.worker_flops()) {
      max_worker = std::max(max_worker, f);
      total += static_cast<double>(f);
    }
    const auto g = static_cast<std::size_t>(layout.pool_ga[static_cast<std::size_t>(pl.domains[d].front())]);
    out.bytes[g] += static_cast<double>(plan.comm_bytes());
    const detail::PlanCost cost = detail::cost_plan(ctx, plan, gpus);
    out.latency[g] = std::max(out.latency[g], detail::time_plan(ctx, cost, gpus, {w, g}, /*pipelined=*/true,
                                                             /*backward=*/false));
  }
  const double workers = static_cast<double>(pl.pools.size()) * static_cast<double>(layout.pool_size * cfg.cp);
  out.worker_imbalance = total > 0 ? static_cast<double>(max_worker) * workers / total - 1 : 0;
  return {};
}

}  // namespace

struct ElasticPricer::Impl {
  SimConfig cfg;
  SimCandidate cand;
  ElasticOptions elastic;
  bool priced = true;
  std::unique_ptr<detail::Ctx> ctx;
  PlanConfig pc;

  WindowOut window(std::span<const PackedSequence> window, std::uint64_t w) const;
};

WindowOut ElasticPricer::Impl::window(std::span<const PackedSequence> window, std::uint64_t w) const {
  WindowOut out;
  auto run = [&]() -> Status {
    LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> f, sequence_workloads(window));
    // A tap-topo job runs libra-topo's pools: VRSP with node-interleaved slots (the simulator's
    // libra-topo variant), so its pools, and the elastic side's single pools, are priced so.
    const NodeInterleave interleave =
        pc.mode == PlanMode::kTapTopo ? detail::topo_interleave(*ctx) : NodeInterleave{};
    LIBRA_ASSIGN_OR_RETURN(WindowPlacement vrsp,
                           place_window(f, {.pool_size = cand.pool_size, .interleave = interleave}));
    LIBRA_ASSIGN_OR_RETURN(WindowPlacement el,
                           place_window(f, {.pool_size = cand.pool_size, .mode = PlacementMode::kVrspElastic,
                                            .dp = cfg.dp, .elastic = elastic}));
    out.lower_bound = lower_bound_imbalance(f, cand.pool_size);
    LIBRA_TRY(run_side(window, vrsp, *ctx, pc, w, out.vrsp));
    const bool candidate = std::any_of(el.domains.begin(), el.domains.end(), [](const auto& d) { return d.size() > 1; });
    if (candidate) {
      if (interleave.cp > 0) {
        for (const auto& d : el.domains) {
          if (d.size() != 1) continue;  // a fused domain's slots are fixed by domain_slots
          auto& pool = el.pools[static_cast<std::size_t>(d.front())];
          std::vector<std::int64_t> pw;
          for (std::int32_t i : pool) pw.push_back(f[static_cast<std::size_t>(i)]);
          const std::vector<std::int32_t> order = node_interleaved_slots(pw, interleave);
          std::vector<std::int32_t> moved;
          for (std::int32_t from : order) moved.push_back(pool[static_cast<std::size_t>(from)]);
          pool = std::move(moved);
        }
      }
      LIBRA_TRY(run_side(window, el, *ctx, pc, w, out.elastic));
    } else {
      el = vrsp;  // exactly VRSP's placement: the same prices
      out.elastic = out.vrsp;
    }
    const double tv = total(out.vrsp.latency), te = total(out.elastic.latency);
    out.report.candidate = candidate;
    out.report.gain = candidate && te > 0 ? tv / te : 1;
    // The price: fused domains only where the predicted optimizer step is faster. The cost model
    // is deterministic (its device noise is seeded by window and GA step), so this is a pure
    // function of the window, its index and the configuration.
    if (candidate && priced && !(te < tv)) {
      el = vrsp;
      out.elastic = out.vrsp;
    }
    out.report.fused = candidate && (!priced || te < tv);
    out.report.vrsp_s = tv;
    out.report.elastic_s = total(out.elastic.latency);
    LIBRA_ASSIGN_OR_RETURN(StepLayout layout, layout_window(el, cfg.dp));
    out.fused_step.assign(static_cast<std::size_t>(layout.ga_steps), false);
    for (const auto& d : el.domains) {
      if (d.size() < 2) continue;
      ++out.fused_domains;
      out.fused_step[static_cast<std::size_t>(layout.pool_ga[static_cast<std::size_t>(d.front())])] = true;
    }
    out.fused_steps = std::count(out.fused_step.begin(), out.fused_step.end(), true);
    out.runs = std::move(el);
    return {};
  };
  out.status = run();
  return out;
}

// What can be checked before the corpus is read.
static Status check_config(const SimConfig& cfg, const SimCandidate& cand) {
  LIBRA_TRY(validate_cost_model(cfg.cost));
  if (cfg.gbs < 1) return invalid_input(fmt::format("--gbs {}: must be at least 1", cfg.gbs));
  if (cfg.dp < 1 || cfg.gbs % cfg.dp != 0) {
    return invalid_input(fmt::format("--dp {}: must divide --gbs {}", cfg.dp, cfg.gbs));
  }
  if (cand.pool_size < 1 || cfg.dp % cand.pool_size != 0) {
    return invalid_input(fmt::format("--pool-size {}: must divide --dp {}", cand.pool_size, cfg.dp));
  }
  if (cfg.cp < 1) return invalid_input(fmt::format("--cp {}: must be at least 1", cfg.cp));
  return {};
}

Result<ElasticPricer> ElasticPricer::create(const SimConfig& cfg, const SimCandidate& cand,
                                            const ElasticOptions& elastic, std::int64_t seq_len, bool priced,
                                            PlanMode plan_mode) {
  LIBRA_TRY(check_config(cfg, cand));
  if (plan_mode != PlanMode::kTap && plan_mode != PlanMode::kTapTopo) {
    return invalid_input(fmt::format("--elastic-plan-mode {}: must be tap or tap-topo", plan_mode_name(plan_mode)));
  }
  if (seq_len < 1) return invalid_input(fmt::format("--seq-len {}: must be at least 1", seq_len));
  // One plan configuration prices every window: one M.
  if (cfg.chunks.size() != 1) return invalid_input("--chunks: elastic pricing takes one value, not a list");
  if (cfg.chunks[0] < 1 || cfg.chunks[0] > std::numeric_limits<std::int32_t>::max()) {
    return invalid_input(fmt::format("--chunks {}: must be in [1, {}]", cfg.chunks[0],
                                     std::numeric_limits<std::int32_t>::max()));
  }
  auto impl = std::make_shared<Impl>();
  impl->cfg = cfg;
  impl->cand = cand;
  impl->elastic = elastic;
  // Buddy domains sit where the network is fastest for them, and are priced on those GPUs.
  impl->elastic.topology = {.cp = cfg.cp,
                            .gpus_per_node = cfg.cost.net.gpus_per_node,
                            .nodes_per_supernode = cfg.cost.net.nodes_per_supernode};
  impl->priced = priced;
  impl->ctx = std::make_unique<detail::Ctx>(
      detail::Ctx{impl->cfg, seq_len, ThroughputTable(impl->cfg.cost.kernel), {cand}, {cfg.chunks}});
  impl->pc = detail::plan_config(*impl->ctx, cand.head_shards, cand.block_size, cfg.chunks[0], plan_mode, false);
  if (Status s = validate_plan_config(impl->pc); !s.ok()) {
    return invalid_input(
        fmt::format("--head-shards {} --block-size {}: {}", cand.head_shards, cand.block_size, s.message()));
  }
  ElasticPricer p;
  p.impl_ = std::move(impl);
  return p;
}

Result<ElasticPricer::Decision> ElasticPricer::decide(std::span<const PackedSequence> window,
                                                      std::uint64_t window_index) const {
  if (static_cast<std::int64_t>(window.size()) != impl_->cfg.gbs) {
    return invalid_input(fmt::format("elastic pricing: window of {} packed sequences; --gbs is {}", window.size(),
                                     impl_->cfg.gbs));
  }
  WindowOut o = impl_->window(window, window_index);
  if (!o.status.ok()) return o.status.error();
  return Decision{std::move(o.runs), o.report};
}

const ElasticOptions& ElasticPricer::elastic() const { return impl_->elastic; }

SamplerOptions::Placer priced_elastic_placer(ElasticPricer pricer) {
  return [pricer = std::move(pricer)](std::span<const PackedSequence> seqs, std::span<const std::int64_t>,
                                      std::int64_t step) -> Result<WindowPlacement> {
    if (seqs.empty()) {
      return invalid_input("elastic pricing: needs the packed sequences' lengths (a sampler made from workloads "
                           "has none)");
    }
    LIBRA_ASSIGN_OR_RETURN(ElasticPricer::Decision d, pricer.decide(seqs, static_cast<std::uint64_t>(step)));
    return std::move(d.placement);
  };
}

// The windows' statistics, VRSP then elastic, in window order; the first
// failed window's error.
static Status add_window_stats(std::span<const WindowOut> wo, double threshold, ElasticSimResult& r) {
  const std::int64_t windows = r.windows;
  std::vector<double> pv, pe, wv, we, bv, be, lv, le, tv, te, fv, fe;
  double lb = 0, speedup = 0;
  for (const WindowOut& o : wo) {
    if (!o.status.ok()) return o.status.error();
    pv.push_back(o.vrsp.placement_imbalance);
    pe.push_back(o.elastic.placement_imbalance);
    wv.push_back(o.vrsp.worker_imbalance);
    we.push_back(o.elastic.worker_imbalance);
    bv.insert(bv.end(), o.vrsp.bytes.begin(), o.vrsp.bytes.end());
    be.insert(be.end(), o.elastic.bytes.begin(), o.elastic.bytes.end());
    lv.insert(lv.end(), o.vrsp.latency.begin(), o.vrsp.latency.end());
    le.insert(le.end(), o.elastic.latency.begin(), o.elastic.latency.end());
    for (std::size_t g = 0; g < o.fused_step.size(); ++g) {
      if (!o.fused_step[g]) continue;
      fv.push_back(o.vrsp.latency[g]);
      fe.push_back(o.elastic.latency[g]);
    }
    tv.push_back(std::accumulate(o.vrsp.latency.begin(), o.vrsp.latency.end(), 0.0));
    te.push_back(std::accumulate(o.elastic.latency.begin(), o.elastic.latency.end(), 0.0));
    speedup += te.back() > 0 ? tv.back() / te.back() : 1.0;
    r.fused_domains += o.fused_domains;
    r.fused_steps += o.fused_steps;
    r.fused_windows += o.fused_domains > 0 ? 1 : 0;
    r.declined_windows += o.report.candidate && !o.report.fused ? 1 : 0;
    r.per_window.push_back(o.report);
    r.lower_bound_windows += o.lower_bound > threshold ? 1 : 0;
    lb += o.lower_bound;
  }
  r.whole_pool_lower_bound = lb / static_cast<double>(windows);
  r.placement_imbalance = {detail::stat_of(pv), detail::stat_of(pe)};
  r.worker_imbalance = {detail::stat_of(wv), detail::stat_of(we)};
  r.step_bytes = {detail::stat_of(bv), detail::stat_of(be)};
  r.step_latency = {detail::stat_of(lv), detail::stat_of(le)};
  r.window_latency = {detail::stat_of(tv), detail::stat_of(te)};
  r.fused_step_latency = {detail::stat_of(fv), detail::stat_of(fe)};
  r.mean_window_speedup = speedup / static_cast<double>(windows);
  return {};
}

Result<ElasticSimResult> simulate_elastic(const SimConfig& cfg, const SimCandidate& cand,
                                          const ElasticOptions& elastic, bool priced, PlanMode plan_mode) {
  LIBRA_TRY(check_config(cfg, cand));
  if (cfg.max_windows < 0) return invalid_input(fmt::format("--windows {}: must be >= 0", cfg.max_windows));
  if (cfg.threads < 0) return invalid_input(fmt::format("--threads {}: must be >= 0", cfg.threads));
  LIBRA_ASSIGN_OR_RETURN(SimInput in, load_sim_input(cfg));
  const std::int64_t seq_len = in.seq_len;
  const std::vector<PackedSequence>& seqs = in.sequences;
  LIBRA_ASSIGN_OR_RETURN(ElasticPricer pricer, ElasticPricer::create(cfg, cand, elastic, seq_len, priced, plan_mode));
  const std::int64_t full = static_cast<std::int64_t>(seqs.size()) / cfg.gbs;
  if (full < 1) {
    return invalid_input(fmt::format("{}: {} packed sequences at --seq-len {} is shorter than one window of --gbs {}",
                                     cfg.source, seqs.size(), seq_len, cfg.gbs));
  }
  const std::int64_t windows = cfg.max_windows == 0 ? full : std::min(full, cfg.max_windows);

  std::vector<WindowOut> wo(static_cast<std::size_t>(windows));
  {
    const std::int64_t threads =
        std::min(windows, cfg.threads > 0 ? cfg.threads
                                          : std::max<std::int64_t>(1, std::thread::hardware_concurrency()));
    std::atomic<std::int64_t> next{0};
    auto work = [&] {
      for (std::int64_t i; (i = next++) < windows;) {
        const auto window = std::span<const PackedSequence>(seqs).subspan(static_cast<std::size_t>(i * cfg.gbs),
                                                                          static_cast<std::size_t>(cfg.gbs));
        wo[static_cast<std::size_t>(i)] = pricer.impl_->window(window, static_cast<std::uint64_t>(i));
      }
    };
    std::vector<std::thread> pool;
    for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  }

  ElasticSimResult r;
  r.source = cfg.source;
  r.seq_len = seq_len;
  r.gbs = cfg.gbs;
  r.dp = cfg.dp;
  r.cp = cfg.cp;
  r.candidate = cand;
  r.elastic = elastic;
  r.priced = priced;
  r.plan_mode = plan_mode;
  r.windows = windows;
  r.steps = windows * (cfg.gbs / cfg.dp);
  LIBRA_TRY(add_window_stats(wo, elastic.threshold, r));
  return r;
}

std::string elastic_table(const ElasticSimResult& r) {
  std::string out = fmt::format(
      "# elastic pools: {}  L {}  GBS {}  DP {}  CP {}  P {} H {} B {}  k {}  threshold {}  rule {}  tiles {}\n",
      r.source, r.seq_len, r.gbs, r.dp, r.cp, r.candidate.pool_size, r.candidate.head_shards, r.candidate.block_size,
      r.elastic.max_pools, r.elastic.threshold, elastic_rule_name(r.elastic.rule), plan_mode_name(r.plan_mode));
  out += fmt::format("fusing: {}; {} windows vrsp-elastic fused were kept on VRSP (predicted slower)\n",
                     r.priced ? "priced (fused only where the cost model predicts a faster step)" : "unpriced",
                     r.declined_windows);
  out += fmt::format("fused: {} of {} windows, {} of {} GA steps, {} domains; whole-pool bound above the threshold in "
                     "{} windows (mean bound {:.4f})\n",
                     r.fused_windows, r.windows, r.fused_steps, r.steps, r.fused_domains, r.lower_bound_windows,
                     r.whole_pool_lower_bound);
  out += fmt::format("{:<34} {:>12} {:>12} {:>12} {:>12}\n", "", "vrsp mean", "vrsp worst", "elastic mean",
                     "elastic worst");
  auto row = [&](const char* name, const ElasticPair& p, double scale, const char* unit) {
    out += fmt::format("{:<34} {:>12.4f} {:>12.4f} {:>12.4f} {:>12.4f}{}\n", name, p.vrsp.mean * scale,
                       p.vrsp.worst * scale, p.elastic.mean * scale, p.elastic.worst * scale, unit);
  };
  row("placement imbalance (R-1 / domain)", r.placement_imbalance, 1, "");
  row("worker imbalance after TAP", r.worker_imbalance, 1, "");
  row("bytes per GA step and layer", r.step_bytes, 1e-9, "  GB");
  row("latency per GA step and layer", r.step_latency, 1e3, "  ms (forward, pipelined)");
  row("latency of the fused GA steps", r.fused_step_latency, 1e3, "  ms");
  row("latency per optimizer step, layer", r.window_latency, 1e3, "  ms (sum of its GA steps)");
  const double extra = r.step_bytes.vrsp.mean > 0 ? r.step_bytes.elastic.mean / r.step_bytes.vrsp.mean - 1 : 0;
  out += fmt::format("extra bytes {:+.2f}%   optimizer-step speedup vrsp/elastic: mean {:.4f}x, worst window {:.4f}x\n",
                     100 * extra, r.mean_window_speedup,
                     r.window_latency.elastic.worst > 0 ? r.window_latency.vrsp.worst / r.window_latency.elastic.worst
                                                        : 0);
  out += fmt::format("{:>6} {:>9} {:>6} {:>9} {:>12} {:>12} {:>9}\n", "window", "candidate", "fused", "gain",
                     "vrsp ms", "elastic ms", "speedup");
  for (std::size_t w = 0; w < r.per_window.size(); ++w) {
    const auto& x = r.per_window[w];
    if (!x.candidate) continue;  // VRSP's placement exactly: nothing to report
    out += fmt::format("{:>6} {:>9} {:>6} {:>8.4f}x {:>12.3f} {:>12.3f} {:>8.4f}x\n", w, "yes", x.fused ? "yes" : "no",
                       x.gain, 1e3 * x.vrsp_s, 1e3 * x.elastic_s, x.elastic_s > 0 ? x.vrsp_s / x.elastic_s : 1);
  }
  out += "(windows vrsp-elastic does not fuse run VRSP's pools: not listed)\n";
  return out;
}

std::string elastic_json(const ElasticSimResult& r) {
  using J = nlohmann::json;
  auto pair = [](const ElasticPair& p) {
    return J{{"vrsp", {{"mean", p.vrsp.mean}, {"worst", p.vrsp.worst}}},
             {"elastic", {{"mean", p.elastic.mean}, {"worst", p.elastic.worst}}}};
  };
  J j = {{"source", r.source},
         {"seq_len", r.seq_len},
         {"gbs", r.gbs},
         {"dp", r.dp},
         {"cp", r.cp},
         {"pool_size", r.candidate.pool_size},
         {"head_shards", r.candidate.head_shards},
         {"block_size", r.candidate.block_size},
         {"elastic_k", r.elastic.max_pools},
         {"elastic_threshold", r.elastic.threshold},
         {"elastic_rule", std::string(elastic_rule_name(r.elastic.rule))},
         {"windows", r.windows},
         {"steps", r.steps},
         {"fused_windows", r.fused_windows},
         {"fused_steps", r.fused_steps},
         {"fused_domains", r.fused_domains},
         {"lower_bound_windows", r.lower_bound_windows},
         {"whole_pool_lower_bound", r.whole_pool_lower_bound},
         {"placement_imbalance", pair(r.placement_imbalance)},
         {"worker_imbalance", pair(r.worker_imbalance)},
         {"step_bytes", pair(r.step_bytes)},
         {"step_latency_s", pair(r.step_latency)},
         {"window_latency_s", pair(r.window_latency)},
         {"fused_step_latency_s", pair(r.fused_step_latency)},
         {"mean_window_speedup", r.mean_window_speedup},
         {"priced", r.priced},
         {"plan_mode", std::string(plan_mode_name(r.plan_mode))},
         {"declined_windows", r.declined_windows}};
  J per = J::array();
  for (const auto& x : r.per_window) {
    per.push_back({{"candidate", x.candidate}, {"fused", x.fused}, {"gain", x.gain}, {"vrsp_s", x.vrsp_s},
                   {"elastic_s", x.elastic_s}});
  }
  j["per_window"] = per;
  return j.dump() + "\n";
}

}  // namespace libra
