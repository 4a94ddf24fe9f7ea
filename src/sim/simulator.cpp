// The configuration simulator: windows -> real planners -> cost model.
//
// Work is split by window: every window is simulated independently (all
// candidates, all baselines; sweep.cpp) into a WindowResult, windows run on a
// pool of threads pulling window indices from an atomic counter, and the
// results are folded in window order, so the output does not depend on the
// thread count. The end-to-end model (end_to_end.cpp), the recommendation
// (recommend.cpp) and the paper comparison (paper_figures.cpp) follow.
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

Result<SimResult> simulate(std::span<const PackedSequence> seqs, std::int64_t seq_len, const SimConfig& cfg,
                           const SimProgress& progress) {
  const double t_start = wall_seconds();
  const double cpu_start = process_cpu_seconds();
  SimResult res;
  res.config = cfg;
  LIBRA_TRY(validate_cost_model(cfg.cost));
  if (cfg.gbs < 1) return invalid_input(fmt::format("--gbs {}: must be at least 1", cfg.gbs));
  if (cfg.dp < 1 || cfg.gbs % cfg.dp != 0) {
    return invalid_input(fmt::format("--dp {}: must divide --gbs {}", cfg.dp, cfg.gbs));
  }
  if (cfg.cp < 1) return invalid_input(fmt::format("--cp {}: must be at least 1", cfg.cp));
  // Values the planners take as int: checked before anything narrows them.
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
  // The listed M without repeats, in the order given (ties go to the earlier).
  std::vector<std::int64_t> chunk_list;
  for (std::int64_t m : cfg.chunks) {
    if (m < 1) return invalid_input(fmt::format("--chunks {}: must be at least 1", m));
    if (std::find(chunk_list.begin(), chunk_list.end(), m) == chunk_list.end()) chunk_list.push_back(m);
  }
  res.config.chunks = chunk_list;
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
  if (cfg.max_windows < 0) return invalid_input(fmt::format("--windows {}: must be >= 0", cfg.max_windows));
  // Each seed is a full grouping per window: a bound keeps a typo (2^40)
  // from becoming a run that never ends.
  if (cfg.random_seeds < 1 || cfg.random_seeds > 1000000) {
    return invalid_input(fmt::format("--random-seeds {}: must be in [1, 1000000]", cfg.random_seeds));
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
  for (std::int64_t d : cfg.scaling_dp) {
    if (d < 1 || cfg.gbs % d != 0) {
      return invalid_input(fmt::format("--scaling-dp {}: every value must divide --gbs {}", d, cfg.gbs));
    }
  }

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
  // Candidates: cross product; invalid ones are skipped unless all are, and
  // so is an M a candidate's tiles cannot take while another M can.
  Status first_error;
  for (std::int64_t p : cfg.pool_sizes) {
    for (std::int64_t h : cfg.head_shards) {
      for (std::int64_t b : cfg.block_sizes) {
        SimCandidate c{p, h, b};
        if (std::find(ctx.candidates.begin(), ctx.candidates.end(), c) != ctx.candidates.end()) continue;
        std::vector<std::int64_t> ok;
        std::vector<SkippedCandidate> without;
        Status first_m_error;
        for (std::int64_t m : chunk_list) {
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
  // The ulysses baseline must be plannable too.
  LIBRA_TRY(validate_plan_config(ulysses_config(ctx)));
  res.distca_skipped = distca_skip_reason(cfg);

  const std::int64_t threads =
      cfg.threads > 0 ? cfg.threads : std::max<std::int64_t>(1, static_cast<std::int64_t>(std::thread::hardware_concurrency()));

  // Runs fn(window index) for every window on `threads` threads; progress
  // counts this phase's windows only.
  auto parallel = [&](std::string_view phase, auto&& fn) {
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
    // The calling thread works too, and reports progress between windows.
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
  };
  auto window_span = [&](std::int64_t i) {
    return seqs.subspan(static_cast<std::size_t>(i * cfg.gbs), static_cast<std::size_t>(cfg.gbs));
  };

  std::vector<WindowResult> wr(static_cast<std::size_t>(windows));
  parallel("windows", [&](std::int64_t i) {
    wr[static_cast<std::size_t>(i)] = simulate_window(ctx, window_span(i), static_cast<std::uint64_t>(i));
  });
  for (const auto& r : wr) {
    if (!r.status.ok()) return r.status.error();
    add_timing(res.timing, r.timing);
  }

  // Fold windows in order.
  std::vector<double> uly, wlb, wlb_loader;
  for (const auto& r : wr) {
    uly.insert(uly.end(), r.ulysses.begin(), r.ulysses.end());
    wlb.insert(wlb.end(), r.wlb.begin(), r.wlb.end());
    wlb_loader.insert(wlb_loader.end(), r.wlb_loader.begin(), r.wlb_loader.end());
    res.wlb_split_samples += r.wlb_split;
  }
  res.ulysses = stat_of(uly);
  res.wlb = stat_of(wlb);
  res.wlb_loader = stat_of(wlb_loader);
  const auto modes = all_placement_modes();
  for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) {
    CandidateResult cr;
    cr.candidate = ctx.candidates[ci];
    std::vector<std::vector<double>> inter(modes.size());
    std::vector<double> lb, intra, intra_plus, bytes, bytes_plus, send, recv, comm;
    std::vector<double> intra_topo, recv_cross, recv_cross_topo;
    std::map<std::pair<Variant, std::int64_t>, std::vector<double>> steps;
    std::map<TopoShape, std::map<std::pair<Variant, std::int64_t>, std::vector<double>>> shaped_steps;
    auto app = [](std::vector<double>& a, const std::vector<double>& b) { a.insert(a.end(), b.begin(), b.end()); };
    for (const auto& r : wr) {
      const CandWindow& cw = r.cand[ci];
      for (std::size_t m = 0; m < modes.size(); ++m) inter[m].push_back(cw.inter[m]);
      lb.push_back(cw.lower_bound);
      app(intra, cw.intra);
      app(intra_plus, cw.intra_plus);
      app(bytes, cw.bytes);
      app(bytes_plus, cw.bytes_plus);
      app(send, cw.send);
      app(recv, cw.recv);
      app(comm, cw.comm);
      app(intra_topo, cw.intra_topo);
      app(recv_cross, cw.recv_cross);
      app(recv_cross_topo, cw.recv_cross_topo);
      for (const auto& [key, s] : cw.steps) app(steps[key], s);
      for (const auto& [sh, by] : cw.shaped_steps) {
        for (const auto& [key, s] : by) app(shaped_steps[sh][key], s);
      }
    }
    for (std::size_t m = 0; m < modes.size(); ++m) cr.inter_imbalance.emplace_back(modes[m], stat_of(inter[m]));
    cr.lower_bound = stat_of(lb);
    cr.intra_imbalance = stat_of(intra);
    cr.intra_imbalance_plus = stat_of(intra_plus);
    cr.comm_bytes = stat_of(bytes);
    cr.comm_bytes_plus = stat_of(bytes_plus);
    cr.max_send_bytes = stat_of(send);
    cr.max_recv_bytes = stat_of(recv);
    cr.comm_seconds = stat_of(comm);
    cr.intra_imbalance_topo = stat_of(intra_topo);
    cr.max_recv_cross_node = stat_of(recv_cross);
    cr.max_recv_cross_node_topo = stat_of(recv_cross_topo);
    cr.home_layout_topo = topo_home_layout(ctx, cr.candidate.block_size);
    // Each variant at its best M by the recommendation's score (ties: the
    // earlier M in the list); unpipelined variants have only M = 1.
    // libra-topo: at each M the best shape SimConfig admits (ties: the
    // earlier in admitted_shapes' order); forced tapered chunks fall back
    // to equal ones where M does not admit them.
    for (Variant v : candidate_variants()) {
      const std::vector<std::int64_t> one{1};
      const bool topo = v == Variant::kLibraTopo;
      VariantLatency vl{v, {}, 0, {}};
      for (std::int64_t m : variant_pipelined(v) ? ctx.chunks[ci] : one) {
        std::optional<std::pair<Stat, TopoShape>> best;
        auto consider = [&](const std::vector<TopoShape>& shapes) {
          for (const TopoShape& sh : shapes) {
            auto by = shaped_steps.find(sh);
            if (sh != TopoShape{} && by == shaped_steps.end()) continue;
            const auto& from = sh == TopoShape{} ? steps : by->second;
            auto it = from.find({v, m});
            if (it == from.end()) continue;
            const Stat st = stat_of(it->second);
            if (!best || score(cfg, st) < score(cfg, best->first)) best = std::make_pair(st, sh);
          }
        };
        consider(topo ? admitted_shapes(cfg.relay, cfg.chunk_split) : std::vector<TopoShape>{TopoShape{}});
        if (!best && topo && cfg.chunk_split == ChunkSplit::kTapered) {
          consider(admitted_shapes(cfg.relay, ChunkSplit::kEqual));
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
      if (vl.chunks != 0) cr.latency.push_back(std::move(vl));
    }
    res.candidates.push_back(std::move(cr));
  }

  // Figures 4 and 8: R-1 at P = 8 and 64 over the simulated windows.
  {
    std::vector<std::int64_t> ps;
    for (std::int64_t p : {8, 64}) {
      if (p <= cfg.gbs && cfg.gbs % p == 0) ps.push_back(p);
    }
    if (!ps.empty()) {
      LIBRA_ASSIGN_OR_RETURN(res.calibration,
                             calibration_stats(seqs.first(static_cast<std::size_t>(windows * cfg.gbs)), cfg.gbs, ps,
                                               cfg.random_seeds));
    }
  }

  recommend(res);
  const CandidateResult& best = res.candidates[static_cast<std::size_t>(res.recommended)];
  res.end_to_end_chunks = best.find(res.end_to_end_variant)->chunks;
  const bool e2e_relayed = best.find(res.end_to_end_variant)->relayed;
  const ChunkSplit e2e_split = best.find(res.end_to_end_variant)->chunk_split;
  const TopoShape e2e_shape{.relayed = e2e_relayed, .split = e2e_split};
  {
    // The decomposition of the recommended candidate's libra variant.
    std::size_t pools = 0;
    double worst = -1;
    StepDecomposition& m = res.mean_step;
    for (const auto& r : wr) {
      const CandWindow& cw = r.cand[static_cast<std::size_t>(res.recommended)];
      auto shaped = cw.shaped_pools.find(e2e_shape);
      if (e2e_shape != TopoShape{} && shaped == cw.shaped_pools.end()) continue;
      const auto& priced = e2e_shape == TopoShape{} ? cw.pools : shaped->second;
      auto it = priced.find({res.end_to_end_variant, res.end_to_end_chunks});
      if (it == priced.end()) continue;
      for (const auto& [t, d] : it->second) {
        ++pools;
        m.total += d.total;
        m.compute += d.compute;
        m.chunk_loss += d.chunk_loss;
        m.comm += d.comm;
        m.first_dispatch += d.first_dispatch;
        m.exposed_chunks += d.exposed_chunks;
        m.last_return += d.last_return;
        m.workload_bound += d.workload_bound;
        m.recv_cross_node += d.recv_cross_node;
        if (t > worst) {
          worst = t;
          res.worst_step = d;
        }
      }
    }
    if (pools > 0) {
      const double n = static_cast<double>(pools);
      for (double* x : {&m.total, &m.compute, &m.chunk_loss, &m.comm, &m.first_dispatch, &m.exposed_chunks,
                        &m.last_return, &m.workload_bound, &m.recv_cross_node}) {
        *x /= n;
      }
    }
  }

  // End-to-end: DP sweep and microbatch distribution with the recommended
  // candidate.
  if (cfg.end_to_end && !cfg.scaling_dp.empty()) {
    std::vector<std::int64_t> dps = cfg.scaling_dp;
    if (std::find(dps.begin(), dps.end(), cfg.dp) == dps.end()) dps.push_back(cfg.dp);
    std::sort(dps.begin(), dps.end());
    dps.erase(std::unique(dps.begin(), dps.end()), dps.end());
    const double t1 = wall_seconds();
    std::vector<E2eWindow> er(static_cast<std::size_t>(windows));
    parallel("end-to-end", [&](std::int64_t i) {
      er[static_cast<std::size_t>(i)] =
          e2e_window(ctx, window_span(i), static_cast<std::uint64_t>(i), best.candidate, dps, res.end_to_end_variant,
                     res.end_to_end_chunks, e2e_relayed, e2e_split);
    });
    res.timing.end_to_end_s = wall_seconds() - t1;
    LIBRA_TRY(fold_end_to_end(er, dps, best.candidate, res));
  }
  compare_with_paper(res);
  res.timing.total_s = wall_seconds() - t_start;
  res.timing.cpu_s = process_cpu_seconds() - cpu_start;
  res.timing.peak_rss_kb = peak_rss_kb();
  return res;
}

}  // namespace libra
