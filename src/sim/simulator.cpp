// The configuration simulator: windows -> real planners -> cost model.
//
// Work is split by window: every window is simulated independently (all
// candidates, all baselines; sweep.cpp) into a WindowResult, windows run on a
// pool of threads pulling window indices from an atomic counter, and the
// results are folded in window order, so the output does not depend on the
// thread count. The end-to-end model (end_to_end.cpp), the recommendation
// (recommend.cpp) and the paper comparison (paper_figures.cpp) follow.
#include "libra/io.hpp"
#include "libra/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>

#include "libra/workload.hpp"
#include "sim/internal.hpp"

namespace libra {

using namespace detail;

Result<SimInput> load_sim_input(const SimConfig& cfg) {
  std::int64_t seq_len = cfg.seq_len;
  if (seq_len == 0 && cfg.source.rfind("builtin:", 0) == 0) {
    std::string name = cfg.source.substr(8);
    name = name.substr(0, name.find(':'));
    LIBRA_ASSIGN_OR_RETURN(BuiltinSpec spec, builtin_corpus_spec(name));
    seq_len = spec.default_seq_len;
  }
  if (seq_len < 1) {
    return invalid_input(fmt::format("--seq-len: required for {} (it has no default packed length)", cfg.source));
  }
  SimInput in;
  in.seq_len = seq_len;
  LIBRA_ASSIGN_OR_RETURN(in.sequences, load_packed_sequences(cfg.source, seq_len));
  return in;
}

Result<CalibrationStats> calibration_stats(std::span<const PackedSequence> sequences, std::int64_t gbs,
                                           std::span<const std::int64_t> pool_sizes, std::int64_t seeds) {
  if (gbs < 1) return invalid_input(fmt::format("--gbs {}: must be at least 1", gbs));
  CalibrationStats st;
  st.windows = static_cast<std::int64_t>(sequences.size()) / gbs;
  if (st.windows < 1) return invalid_input(fmt::format("{} sequences: fewer than one window of {}", sequences.size(), gbs));
  std::vector<double> rnd(pool_sizes.size(), 0), vr(pool_sizes.size(), 0);
  for (std::int64_t w = 0; w < st.windows; ++w) {
    LIBRA_ASSIGN_OR_RETURN(auto f, sequence_workloads(sequences.subspan(static_cast<std::size_t>(w * gbs),
                                                                        static_cast<std::size_t>(gbs))));
    for (std::size_t k = 0; k < pool_sizes.size(); ++k) {
      LIBRA_ASSIGN_OR_RETURN(double r, mean_random_imbalance(f, pool_sizes[k], 0, seeds));
      rnd[k] += r;
      LIBRA_ASSIGN_OR_RETURN(WindowPlacement v, place_window(f, {.pool_size = pool_sizes[k], .mode = PlacementMode::kVrsp}));
      vr[k] += v.imbalance;
    }
  }
  const double n = static_cast<double>(st.windows);
  for (std::size_t k = 0; k < pool_sizes.size(); ++k) {
    st.random.emplace_back(pool_sizes[k], rnd[k] / n);
    st.vrsp.emplace_back(pool_sizes[k], vr[k] / n);
  }
  return st;
}

Result<SimResult> simulate(const SimConfig& cfg, const SimProgress& progress) {
  const double t0 = wall_seconds();
  LIBRA_ASSIGN_OR_RETURN(SimInput in, load_sim_input(cfg));
  const double load = wall_seconds() - t0;
  LIBRA_ASSIGN_OR_RETURN(SimResult r, simulate(in.sequences, in.seq_len, cfg, progress));
  r.timing.load_s = load;
  r.timing.total_s += load;
  return r;
}

namespace {

// Values the planners take as int, and the model's shape: checked before
// anything narrows them or prices an empty model.
Status validate_model(const SimConfig& cfg) {
  std::vector<std::pair<const char*, std::int64_t>> narrowed = {{"--cp", cfg.cp},
                                                                 {"--heads-q", cfg.model.heads_q},
                                                                 {"--heads-kv", cfg.model.heads_kv},
                                                                 {"--head-dim", cfg.model.head_dim},
                                                                 {"--elem-bytes", cfg.model.elem_bytes}};
  for (std::int64_t m : cfg.chunks) narrowed.insert(narrowed.begin() + 1, {"--chunks", m});
  for (auto [flag, v] : narrowed) {
    if (v > std::numeric_limits<std::int32_t>::max()) {
      return invalid_input(fmt::format("{} {}: must be at most {}", flag, v, std::numeric_limits<std::int32_t>::max()));
    }
  }
  if (cfg.chunks.empty()) return invalid_input("--chunks: give at least one value");
  for (std::int64_t m : cfg.chunks) {
    if (m < 1) return invalid_input(fmt::format("--chunks {}: must be at least 1", m));
  }
  // 0 layers would price an empty model: 100% scaling efficiency, silently.
  if (cfg.end_to_end && cfg.model.layers < 1) {
    return invalid_input(fmt::format("--layers {}: must be at least 1 (or --no-end-to-end)", cfg.model.layers));
  }
  if (cfg.model.elem_bytes != 2 && cfg.model.elem_bytes != 4) {
    return invalid_input(fmt::format("--elem-bytes {}: must be 2 (bf16, fp16) or 4 (fp32)", cfg.model.elem_bytes));
  }
  if (cfg.model.heads_q < 1 || cfg.model.heads_kv < 1 || cfg.model.heads_q % cfg.model.heads_kv != 0) {
    return invalid_input(fmt::format("--heads-kv {}: must be positive and divide --heads-q {}", cfg.model.heads_kv,
                                     cfg.model.heads_q));
  }
  if (cfg.model.heads_q % cfg.cp != 0) {
    return invalid_input(
        fmt::format("--cp {}: must divide --heads-q {} (the ulysses baseline splits heads over CP)", cfg.cp,
                    cfg.model.heads_q));
  }
  return {};
}

// The run's shape: batch, parallelism, windows, seeds, threads.
Status validate_run(const SimConfig& cfg) {
  LIBRA_TRY(validate_cost_model(cfg.cost));
  if (cfg.gbs < 1) return invalid_input(fmt::format("--gbs {}: must be at least 1", cfg.gbs));
  if (cfg.dp < 1 || cfg.gbs % cfg.dp != 0) {
    return invalid_input(fmt::format("--dp {}: must divide --gbs {}", cfg.dp, cfg.gbs));
  }
  if (cfg.cp < 1) return invalid_input(fmt::format("--cp {}: must be at least 1", cfg.cp));
  LIBRA_TRY(validate_model(cfg));
  if (cfg.max_windows < 0) return invalid_input(fmt::format("--windows {}: must be >= 0", cfg.max_windows));
  // Each seed is a full grouping per window: a bound keeps a typo (2^40)
  // from becoming a run that never ends.
  if (cfg.random_seeds < 1 || cfg.random_seeds > 1000000) {
    return invalid_input(fmt::format("--random-seeds {}: must be in [1, 1000000]", cfg.random_seeds));
  }
  if (cfg.coupling < 0) return invalid_input(fmt::format("--coupling {}: must be none, all or a span >= 1", cfg.coupling));
  if (cfg.end_to_end && (cfg.pp < 1 || cfg.pp > cfg.model.layers)) {
    return invalid_input(fmt::format("--pp {}: must be in [1, --layers {}]", cfg.pp, cfg.model.layers));
  }
  const std::int64_t tkv = cfg.trained_heads_kv;
  if (tkv < 0 || (tkv > 0 && cfg.model.heads_q % tkv != 0)) {
    return invalid_input(fmt::format("--trained-heads-kv {}: must be 0 (--heads-kv) or divide --heads-q {}", tkv,
                                     cfg.model.heads_q));
  }
  // A negative or infinite size prints negative throughputs, inf and -nan%.
  if (!(cfg.model.active_params > 0) || !std::isfinite(cfg.model.active_params)) {
    return invalid_input(fmt::format("--active-params {}: must be a finite number > 0", cfg.model.active_params));
  }
  if (!(cfg.model.grad_bytes_per_gpu >= 0) || !std::isfinite(cfg.model.grad_bytes_per_gpu)) {
    return invalid_input(fmt::format("--grad-bytes-per-gpu {}: must be a finite number >= 0", cfg.model.grad_bytes_per_gpu));
  }
  if (!(cfg.worst_weight >= 0) || !std::isfinite(cfg.worst_weight)) {
    return invalid_input(fmt::format("--worst-weight {}: must be a non-negative number", cfg.worst_weight));
  }
  if (cfg.threads < 0) return invalid_input(fmt::format("--threads {}: must be >= 0", cfg.threads));
  // The sweep is checked only when it runs (--no-end-to-end skips it).
  for (std::int64_t d : cfg.end_to_end ? cfg.scaling_dp : std::vector<std::int64_t>{}) {
    if (d < 1 || cfg.gbs % d != 0) {
      return invalid_input(fmt::format("--scaling-dp {}: every value must divide --gbs {}", d, cfg.gbs));
    }
  }
  // distca is timed up to this many GPUs; 0 never times it (a documented
  // way to skip its cost), a negative count is a typo.
  if (cfg.distca_max_gpus < 0) {
    return invalid_input(fmt::format("--distca-max-gpus {}: must be >= 0 (0: never time distca)", cfg.distca_max_gpus));
  }
  return {};
}

// The listed M without repeats, in the order given (ties go to the earlier).
std::vector<std::int64_t> unique_chunks(const std::vector<std::int64_t>& chunks) {
  std::vector<std::int64_t> out;
  for (std::int64_t m : chunks) {
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  return out;
}

// Candidates: the cross product; invalid ones are skipped unless all are,
// and so is an M a candidate's tiles cannot take while another M can.
Status collect_candidates(Ctx& ctx, SimResult& res) {
  const SimConfig& cfg = ctx.cfg;
  Status first_error;
  for (std::int64_t p : cfg.pool_sizes) {
    for (std::int64_t h : cfg.head_shards) {
      for (std::int64_t b : cfg.block_sizes) {
        SimCandidate c{p, h, b};
        if (std::find(ctx.candidates.begin(), ctx.candidates.end(), c) != ctx.candidates.end()) continue;
        std::vector<std::int64_t> ok;
        std::vector<SkippedCandidate> without;
        Status first_m_error;
        for (std::int64_t m : cfg.chunks) {
          Status s = check_candidate(ctx, c, m);
          if (s.ok()) {
            ok.push_back(m);
          } else {
            if (first_m_error.ok()) first_m_error = s;
            without.push_back({c, s.message(), m});
          }
        }
        if (!ok.empty()) {
          ctx.candidates.push_back(c);
          ctx.chunks.push_back(std::move(ok));
          res.skipped.insert(res.skipped.end(), without.begin(), without.end());
        } else {
          if (first_error.ok()) first_error = first_m_error;
          res.skipped.push_back({c, first_m_error.message()});
        }
      }
    }
  }
  if (ctx.candidates.empty()) {
    if (!first_error.ok()) return first_error.error();
    return invalid_input("--pool-size/--head-shards/--block-size: no candidates given");
  }
  return {};
}

// Runs fn(window index) for every window on `threads` threads pulling
// indices from one counter; progress counts this phase's windows only and
// is reported from the calling thread, which works too.
template <class Fn>
void for_each_window(std::int64_t threads, std::int64_t windows, std::string_view phase, const SimProgress& progress,
                     Fn&& fn) {
  std::atomic<std::int64_t> next{0}, done{0};
  std::vector<std::thread> pool;
  const std::int64_t n = std::min(threads, windows);
  for (std::int64_t t = 1; t < n; ++t) {
    pool.emplace_back([&] {
      for (std::int64_t i; (i = next++) < windows;) {
        fn(i);
        ++done;
      }
    });
  }
  for (std::int64_t i; (i = next++) < windows;) {
    fn(i);
    ++done;
    if (progress) progress(phase, done.load(), windows);
  }
  while (done.load() < windows) {
    if (progress) progress(phase, done.load(), windows);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& th : pool) th.join();
  if (progress) progress(phase, done.load(), windows);
}

void append(std::vector<double>& a, const std::vector<double>& b) { a.insert(a.end(), b.begin(), b.end()); }

// The candidate-independent baselines, every window's steps in order.
void fold_baselines(const std::vector<WindowResult>& wr, SimResult& res) {
  std::vector<double> uly, wlb, wlb_loader;
  for (const auto& r : wr) {
    append(uly, r.ulysses);
    append(wlb, r.wlb);
    append(wlb_loader, r.wlb_loader);
    res.wlb_split_samples += r.wlb_split;
  }
  res.ulysses = stat_of(uly);
  res.wlb = stat_of(wlb);
  res.wlb_loader = stat_of(wlb_loader);
}

// Stat of one per-pool figure over every window's pools, in window order.
template <class PoolStats, class Field>
Stat pool_stat(const std::vector<WindowResult>& wr, std::size_t ci, std::vector<PoolStats> CandWindow::*pools,
               Field field) {
  std::vector<double> v;
  for (const auto& r : wr) {
    for (const PoolStats& p : r.cand[ci].*pools) v.push_back(p.*field);
  }
  return stat_of(v);
}

// Every window's step series of one candidate, concatenated in window order.
struct CandSeries {
  StepSeries steps;
  std::map<TopoShape, StepSeries> shaped_steps;
};
CandSeries concat_series(const std::vector<WindowResult>& wr, std::size_t ci) {
  CandSeries out;
  for (const auto& r : wr) {
    const CandWindow& cw = r.cand[ci];
    for (const auto& [key, s] : cw.steps) append(out.steps[key], s);
    for (const auto& [sh, by] : cw.shaped_steps) {
      for (const auto& [key, s] : by) append(out.shaped_steps[sh][key], s);
    }
  }
  return out;
}

// The candidate's imbalance, bytes and communication figures.
void fold_pool_stats(const std::vector<WindowResult>& wr, std::size_t ci, CandidateResult& cr) {
  for (PlacementMode mode : all_placement_modes()) {
    std::vector<double> v;
    for (const auto& r : wr) v.push_back(r.cand[ci].inter.at(mode));
    cr.inter_imbalance.emplace_back(mode, stat_of(v));
  }
  std::vector<double> lb;
  for (const auto& r : wr) lb.push_back(r.cand[ci].lower_bound);
  cr.lower_bound = stat_of(lb);
  cr.intra_imbalance = pool_stat(wr, ci, &CandWindow::tap, &TapPoolStats::intra);
  cr.intra_imbalance_plus = pool_stat(wr, ci, &CandWindow::plus, &PlusPoolStats::intra);
  cr.comm_bytes = pool_stat(wr, ci, &CandWindow::tap, &TapPoolStats::bytes);
  cr.comm_bytes_plus = pool_stat(wr, ci, &CandWindow::plus, &PlusPoolStats::bytes);
  cr.max_send_bytes = pool_stat(wr, ci, &CandWindow::tap, &TapPoolStats::send);
  cr.max_recv_bytes = pool_stat(wr, ci, &CandWindow::tap, &TapPoolStats::recv);
  cr.comm_seconds = pool_stat(wr, ci, &CandWindow::tap, &TapPoolStats::comm);
  cr.intra_imbalance_topo = pool_stat(wr, ci, &CandWindow::topo, &TopoPoolStats::intra);
  cr.max_recv_cross_node = pool_stat(wr, ci, &CandWindow::tap, &TapPoolStats::recv_cross);
  cr.max_recv_cross_node_topo = pool_stat(wr, ci, &CandWindow::topo, &TopoPoolStats::recv_cross);
}

// A variant at M: the best-scoring of `shapes` priced (ties: the earlier).
std::optional<std::pair<Stat, TopoShape>> best_shape(const SimConfig& cfg, const CandSeries& series, Variant v,
                                                     std::int64_t m, const std::vector<TopoShape>& shapes) {
  std::optional<std::pair<Stat, TopoShape>> best;
  for (const TopoShape& sh : shapes) {
    auto by = series.shaped_steps.find(sh);
    if (sh != TopoShape{} && by == series.shaped_steps.end()) continue;
    const StepSeries& from = sh == TopoShape{} ? series.steps : by->second;
    auto it = from.find({v, m});
    if (it == from.end()) continue;
    const Stat st = stat_of(it->second);
    if (!best || score(cfg, st) < score(cfg, best->first)) best = std::make_pair(st, sh);
  }
  return best;
}

// Each variant at its best M by the recommendation's score (ties: the
// earlier M in the list); unpipelined variants have only M = 1.
// libra-topo: at each M the best shape SimConfig admits (ties: the earlier
// in admitted_shapes' order); forced tapered chunks fall back to equal ones
// where M does not admit them.
VariantLatency variant_latency(const SimConfig& cfg, const CandSeries& series, Variant v,
                               const std::vector<std::int64_t>& chunks) {
  const std::vector<std::int64_t> one{1};
  const bool topo = v == Variant::kLibraTopo;
  VariantLatency vl{v, {}, 0, {}, false, ChunkSplit::kEqual, {}};
  for (std::int64_t m : variant_pipelined(v) ? chunks : one) {
    auto best = best_shape(cfg, series, v, m,
                           topo ? admitted_shapes(cfg.relay, cfg.chunk_split) : std::vector<TopoShape>{TopoShape{}});
    if (!best && topo && cfg.chunk_split == ChunkSplit::kTapered) {
      best = best_shape(cfg, series, v, m, admitted_shapes(cfg.relay, ChunkSplit::kEqual));
    }
    if (!best) continue;
    vl.by_chunks.emplace_back(m, best->first);
    if (vl.chunks == 0 || score(cfg, best->first) < score(cfg, vl.seconds)) {
      vl.seconds = best->first;
      vl.chunks = m;
      vl.relayed = best->second.relayed;
      vl.chunk_split = best->second.split;
    }
  }
  return vl;
}

// Ulysses' replicas of one window at --dp (replica r of GA step g runs
// sequence g * DP + r).
std::vector<ReplicaCosts> ulysses_replica_costs(const SimConfig& cfg, const WindowResult& r) {
  std::vector<ReplicaCosts> reps(static_cast<std::size_t>(cfg.dp));
  for (std::size_t i = 0; i < r.ulysses_mb.size(); ++i) {
    reps[i % static_cast<std::size_t>(cfg.dp)].push_back(stage_costs(r.ulysses_mb[i], cfg.model.layers, cfg.pp));
  }
  return reps;
}

// A libra variant's replicas of one window at --dp: every replica of a pool
// runs the pool's micro-batch.
std::vector<ReplicaCosts> libra_replica_costs(const SimConfig& cfg, const std::vector<PoolTiming>& pools) {
  std::vector<ReplicaCosts> reps(static_cast<std::size_t>(cfg.dp), ReplicaCosts(static_cast<std::size_t>(cfg.gbs / cfg.dp)));
  for (const PoolTiming& pt : pools) {
    const MicroBatchCost st = stage_costs(pt.mb, cfg.model.layers, cfg.pp);
    for (std::int64_t r = pt.first_replica; r < pt.first_replica + pt.slots; ++r) {
      reps[static_cast<std::size_t>(r)][static_cast<std::size_t>(pt.ga)] = st;
    }
  }
  return reps;
}

// The step model at --dp for a libra variant as priced in the sweep (its M
// and shape), every coupling setting, over every window.
std::vector<StepAtDp> variant_steps(const SimConfig& cfg, const std::vector<WindowResult>& wr, std::size_t ci,
                                    const VariantLatency& vl, std::int64_t pool_size) {
  const TopoShape shape{.relayed = vl.relayed, .split = vl.chunk_split};
  std::vector<CouplingSteps> total;
  double tokens = 0;
  for (const auto& r : wr) {
    const CandWindow& cw = r.cand[ci];
    auto shaped = cw.shaped_pools.find(shape);
    if (shape != TopoShape{} && shaped == cw.shaped_pools.end()) return {};
    const PoolSeries& priced = shape == TopoShape{} ? cw.pools : shaped->second;
    auto it = priced.find({vl.variant, vl.chunks});
    if (it == priced.end()) return {};
    const auto steps = steps_at(cfg, ulysses_replica_costs(cfg, r), libra_replica_costs(cfg, it->second), cfg.dp,
                                pool_size);
    if (total.empty()) total.assign(steps.size(), CouplingSteps{});
    for (std::size_t c = 0; c < steps.size(); ++c) {
      total[c].coupling = steps[c].coupling;
      total[c].ulysses += steps[c].ulysses;
      total[c].libra += steps[c].libra;
    }
    tokens += r.tokens;
  }
  std::vector<StepAtDp> out;
  for (const CouplingSteps& c : total) out.push_back({c.coupling, tokens / c.ulysses, tokens / c.libra});
  return out;
}

CandidateResult fold_candidate(const Ctx& ctx, const std::vector<WindowResult>& wr, std::size_t ci) {
  CandidateResult cr;
  cr.candidate = ctx.candidates[ci];
  fold_pool_stats(wr, ci, cr);
  cr.home_layout_topo = topo_home_layout(ctx, cr.candidate.block_size);
  const CandSeries series = concat_series(wr, ci);
  for (Variant v : candidate_variants()) {
    VariantLatency vl = variant_latency(ctx.cfg, series, v, ctx.chunks[ci]);
    const bool recommendable = v == Variant::kLibraFull || v == Variant::kLibraTopo || v == Variant::kLibraTapVrsp;
    if (vl.chunks != 0 && recommendable && ctx.cfg.end_to_end) {
      vl.step_at_dp = variant_steps(ctx.cfg, wr, ci, vl, cr.candidate.pool_size);
    }
    if (vl.chunks != 0) cr.latency.push_back(std::move(vl));
  }
  return cr;
}

// Figures 4 and 8: R-1 at P = 8 and 64 over the simulated windows.
Status fold_calibration(std::span<const PackedSequence> seqs, std::int64_t windows, SimResult& res) {
  const SimConfig& cfg = res.config;
  std::vector<std::int64_t> ps;
  for (std::int64_t p : {8, 64}) {
    if (p <= cfg.gbs && cfg.gbs % p == 0) ps.push_back(p);
  }
  if (ps.empty()) return {};
  LIBRA_ASSIGN_OR_RETURN(res.calibration, calibration_stats(seqs.first(static_cast<std::size_t>(windows * cfg.gbs)),
                                                            cfg.gbs, ps, cfg.random_seeds));
  return {};
}

void add_step(StepDecomposition& m, const StepDecomposition& d) {
  m.total += d.total;
  m.compute += d.compute;
  m.chunk_loss += d.chunk_loss;
  m.comm += d.comm;
  m.first_dispatch += d.first_dispatch;
  m.exposed_chunks += d.exposed_chunks;
  m.last_return += d.last_return;
  m.workload_bound += d.workload_bound;
  m.recv_cross_node += d.recv_cross_node;
}

// The decomposition of the recommended candidate's libra variant: the mean
// over every pool-step and the pool that set the worst step.
void fold_decomposition(const std::vector<WindowResult>& wr, const TopoShape& shape, SimResult& res) {
  std::size_t pools = 0;
  double worst = -1;
  StepDecomposition& m = res.mean_step;
  for (const auto& r : wr) {
    const CandWindow& cw = r.cand[static_cast<std::size_t>(res.recommended)];
    auto shaped = cw.shaped_pools.find(shape);
    if (shape != TopoShape{} && shaped == cw.shaped_pools.end()) continue;
    const PoolSeries& priced = shape == TopoShape{} ? cw.pools : shaped->second;
    auto it = priced.find({res.end_to_end_variant, res.end_to_end_chunks});
    if (it == priced.end()) continue;
    for (const PoolTiming& pt : it->second) {
      ++pools;
      add_step(m, pt.d);
      if (pt.fwd > worst) {
        worst = pt.fwd;
        res.worst_step = pt.d;
      }
    }
  }
  if (pools == 0) return;
  const double n = static_cast<double>(pools);
  for (double* x : {&m.total, &m.compute, &m.chunk_loss, &m.comm, &m.first_dispatch, &m.exposed_chunks,
                    &m.last_return, &m.workload_bound, &m.recv_cross_node}) {
    *x /= n;
  }
}

// The sweep's libra-topo times of window i that the end-to-end phase may
// take (SweptTopo): the recommended variant libra-topo at equal chunks on
// the sweep's attention shape; per P the candidate of the recommended H and
// B, timed at the recommended M and relaying.
SweptTopo swept_topo(const Ctx& ctx, const SimConfig& trained, const std::vector<WindowResult>& wr, std::size_t i,
                     const VariantLatency& e2e, const SimResult& res) {
  SweptTopo out;
  if (res.end_to_end_variant != Variant::kLibraTopo || e2e.chunk_split != ChunkSplit::kEqual ||
      trained.model.heads_kv != ctx.cfg.model.heads_kv) {
    return out;
  }
  const SimCandidate& best = res.candidates[static_cast<std::size_t>(res.recommended)].candidate;
  for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) {
    const SimCandidate& c = ctx.candidates[ci];
    const auto& t = wr[i].cand[ci].topo_at_dp;
    if (c.head_shards != best.head_shards || c.block_size != best.block_size || !t) continue;
    if (t->chunks == res.end_to_end_chunks && t->relayed == e2e.relayed) out.emplace(c.pool_size, &*t);
  }
  return out;
}

// End-to-end: DP sweep and microbatch distribution with the recommended
// candidate and variant, on the trained model's attention shape.
Status run_end_to_end(const Ctx& ctx, std::span<const PackedSequence> seqs, std::int64_t threads,
                      const SimProgress& progress, const VariantLatency& e2e, const std::vector<WindowResult>& wr,
                      SimResult& res) {
  SimConfig trained = ctx.cfg;
  if (trained.trained_heads_kv > 0) trained.model.heads_kv = trained.trained_heads_kv;
  const Ctx tctx{trained, ctx.seq_len, ctx.table, ctx.candidates, ctx.chunks};
  const SimCandidate& best = res.candidates[static_cast<std::size_t>(res.recommended)].candidate;
  {
    PlanConfig pc = plan_config(tctx, best.head_shards, best.block_size, e2e.chunks, PlanMode::kTap, false);
    pc.chunk_split = e2e.chunk_split;
    Status s = validate_plan_config(pc);
    if (!s.ok()) return invalid_input(fmt::format("--trained-heads-kv {}: {}", trained.model.heads_kv, s.message()));
  }
  const std::vector<std::int64_t> dps = end_to_end_dps(trained);
  // The sweep's prices are on its attention shape.
  const bool same_shape = trained.model.heads_kv == ctx.cfg.model.heads_kv;
  const std::int64_t windows = res.windows, gbs = trained.gbs;
  const double t1 = wall_seconds();
  std::vector<E2eWindow> er(static_cast<std::size_t>(windows));
  for_each_window(threads, windows, "end-to-end", progress, [&](std::int64_t i) {
    er[static_cast<std::size_t>(i)] =
        e2e_window(tctx, seqs.subspan(static_cast<std::size_t>(i * gbs), static_cast<std::size_t>(gbs)),
                   static_cast<std::uint64_t>(i), best, dps, res.end_to_end_variant, res.end_to_end_chunks,
                   e2e.relayed, e2e.chunk_split, swept_topo(ctx, trained, wr, static_cast<std::size_t>(i), e2e, res),
                   same_shape ? &wr[static_cast<std::size_t>(i)].ulysses_costs : nullptr);
  });
  res.timing.end_to_end_s = wall_seconds() - t1;
  LIBRA_TRY(fold_end_to_end(er, dps, best, res));
  if (!trained.step_costs_out.empty()) LIBRA_TRY(write_step_costs(trained.step_costs_out, trained, er));
  return {};
}

}  // namespace

Result<SimResult> simulate(std::span<const PackedSequence> seqs, std::int64_t seq_len, const SimConfig& cfg,
                           const SimProgress& progress) {
  const double t_start = wall_seconds();
  const double cpu_start = process_cpu_seconds();
  SimResult res;
  res.config = cfg;
  LIBRA_TRY(validate_run(cfg));
  if (!cfg.step_costs_out.empty()) {
    Status w = check_writable(cfg.step_costs_out);
    if (!w.ok()) return invalid_input(fmt::format("--step-costs-out {}", w.message()));
  }
  res.config.chunks = unique_chunks(cfg.chunks);
  if (seq_len < 1) return invalid_input(fmt::format("--seq-len {}: must be positive", seq_len));
  res.seq_len = seq_len;
  const std::int64_t full_windows = static_cast<std::int64_t>(seqs.size()) / cfg.gbs;
  if (full_windows < 1) {
    return invalid_input(fmt::format("{}: {} packed sequences at --seq-len {} is shorter than one window of --gbs {}",
                                     cfg.source, seqs.size(), seq_len, cfg.gbs));
  }
  const std::int64_t windows = cfg.max_windows == 0 ? full_windows : std::min(full_windows, cfg.max_windows);
  res.windows = windows;
  res.steps = windows * (cfg.gbs / cfg.dp);

  Ctx ctx{res.config, seq_len, ThroughputTable(cfg.cost.kernel), {}, {}};
  LIBRA_TRY(collect_candidates(ctx, res));
  // The ulysses baseline must be plannable too.
  LIBRA_TRY(validate_plan_config(ulysses_config(ctx)));
  res.distca_skipped = distca_skip_reason(cfg);

  const std::int64_t threads =
      cfg.threads > 0 ? cfg.threads : std::max<std::int64_t>(1, static_cast<std::int64_t>(std::thread::hardware_concurrency()));
  auto window_span = [&](std::int64_t i) {
    return seqs.subspan(static_cast<std::size_t>(i * cfg.gbs), static_cast<std::size_t>(cfg.gbs));
  };

  // Fewer windows than threads: each window's candidates are split into
  // parts that run side by side (results do not depend on the split).
  const auto parts = static_cast<std::size_t>(std::clamp<std::int64_t>(
      (threads + windows - 1) / std::max<std::int64_t>(windows, 1), 1,
      std::max<std::int64_t>(1, static_cast<std::int64_t>(ctx.candidates.size()))));
  std::vector<WindowResult> wr(static_cast<std::size_t>(windows) * parts);
  for_each_window(threads, windows * static_cast<std::int64_t>(parts), "windows", progress, [&](std::int64_t k) {
    const std::int64_t i = k / static_cast<std::int64_t>(parts);
    wr[static_cast<std::size_t>(k)] = simulate_window(ctx, window_span(i), static_cast<std::uint64_t>(i),
                                                      static_cast<std::size_t>(k) % parts, parts);
  });
  for (std::size_t i = 0; parts > 1 && i < static_cast<std::size_t>(windows); ++i) {
    // Window i's parts sit at i * parts ..; the earlier windows' are merged.
    if (i > 0) wr[i] = std::move(wr[i * parts]);
    for (std::size_t p = 1; p < parts; ++p) merge_part(wr[i], std::move(wr[i * parts + p]), p, parts);
  }
  wr.resize(static_cast<std::size_t>(windows));
  for (const auto& r : wr) {
    if (!r.status.ok()) return r.status.error();
    add_timing(res.timing, r.timing);
  }
  fold_baselines(wr, res);
  for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) res.candidates.push_back(fold_candidate(ctx, wr, ci));
  LIBRA_TRY(fold_calibration(seqs, windows, res));

  recommend(res);
  const VariantLatency& e2e = *res.candidates[static_cast<std::size_t>(res.recommended)].find(res.end_to_end_variant);
  res.end_to_end_chunks = e2e.chunks;
  fold_decomposition(wr, TopoShape{.relayed = e2e.relayed, .split = e2e.chunk_split}, res);

  if (cfg.end_to_end && !cfg.scaling_dp.empty()) {
    LIBRA_TRY(run_end_to_end(ctx, seqs, threads, progress, e2e, wr, res));
  }
  compare_with_paper(res);
  res.timing.total_s = wall_seconds() - t_start;
  res.timing.cpu_s = process_cpu_seconds() - cpu_start;
  res.timing.peak_rss_kb = peak_rss_kb();
  return res;
}

}  // namespace libra
