// The configuration simulator: windows -> real planners -> cost model.
//
// Work is split by window: every window is simulated independently (all
// candidates, all baselines) into a WindowResult, windows run on a pool of
// threads pulling window indices from an atomic counter, and the results are
// folded in window order, so the output does not depend on the thread count.
#include "libra/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "libra/packing.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"
#include "libra/workload.hpp"
#include "sim/plan_pricer.hpp"

namespace libra {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Per-worker times of one plan, before device noise: what the timing
// functions need, so that a plan is evaluated once and timed many times.
struct PlanCost {
  int workers = 0;
  std::int64_t chunks = 1;
  std::vector<double> comp_fwd, comp_bwd;              // whole tiles, full head width per call
  std::vector<double> chunk_comp_fwd, chunk_comp_bwd;  // one chunk (heads / M per call)
  std::vector<double> disp_fwd, ret_fwd, disp_bwd, ret_bwd;  // whole-step all-to-all, per worker
  // [m][worker]: chunk m's all-to-all times.
  std::vector<std::vector<double>> cdisp_fwd, cret_fwd, cdisp_bwd, cret_bwd;
  std::int64_t comm_bytes = 0, max_send = 0, max_recv = 0;
  double imbalance = 0;
};

struct Timing {
  double placement = 0, plan = 0, cost = 0;
  std::int64_t plans = 0;
  std::map<std::string, std::pair<double, std::int64_t>> by_kind;  // make_plan seconds and calls
};

// Folds one thread's timing into the run's totals.
void add_timing(SimTiming& total, const Timing& t) {
  total.placement_s += t.placement;
  total.plan_s += t.plan;
  total.cost_s += t.cost;
  total.plans += t.plans;
  for (const auto& [k, v] : t.by_kind) {
    auto& dst = total.by_kind[k];
    dst.first += v.first;
    dst.second += v.second;
  }
}

struct Ctx {
  const SimConfig& cfg;
  std::int64_t seq_len;
  ThroughputTable table;
  std::vector<SimCandidate> candidates;
};

PlanConfig plan_config(const Ctx& ctx, std::int64_t h, std::int64_t b, std::int64_t chunks, PlanMode mode,
                       bool dedup_kv) {
  PlanConfig pc;
  pc.seq_len = ctx.seq_len;
  pc.cp = static_cast<int>(ctx.cfg.cp);
  pc.block_size = b;
  pc.head_shards = static_cast<int>(h);
  pc.shape = {.heads_q = static_cast<int>(ctx.cfg.model.heads_q),
              .heads_kv = static_cast<int>(ctx.cfg.model.heads_kv),
              .head_dim = static_cast<int>(ctx.cfg.model.head_dim),
              .dtype = ctx.cfg.model.elem_bytes == 4 ? DType::kF32 : DType::kBF16};
  pc.tau = ctx.cfg.tau;
  pc.chunks = static_cast<int>(chunks);
  pc.mode = mode;
  pc.dedup_per_kv_head = dedup_kv;
  return pc;
}

// Ulysses: one slot, the sequence's own CP group, heads split over CP.
PlanConfig ulysses_config(const Ctx& ctx) {
  return plan_config(ctx, 1, ctx.seq_len / ctx.cfg.cp, 1, PlanMode::kUlysses, false);
}

// Turns a plan into per-worker compute and communication times. The forward
// pass moves Q and KV out and O back; the backward pass moves Q, dO and KV
// out and dQ plus the dK/dV partial sums (KV reversed) back.
PlanCost cost_plan(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus) {
  PlanCost c;
  const int w = plan.num_workers();
  const std::size_t ws = static_cast<std::size_t>(w);
  c.workers = w;
  c.chunks = plan.config().chunks;
  const double d = static_cast<double>(ctx.cfg.model.head_dim);
  c.comp_fwd.assign(ws, 0);
  c.comp_bwd.assign(ws, 0);
  c.chunk_comp_fwd.assign(ws, 0);
  c.chunk_comp_bwd.assign(ws, 0);
  const double m = static_cast<double>(c.chunks);
  // Calls of the same shape repeat (every full block); cache their rates.
  std::map<std::pair<std::int64_t, std::int32_t>, std::pair<double, double>> rate;
  auto rates = [&](std::int64_t rows, double heads) {
    auto key = std::make_pair(rows, static_cast<std::int32_t>(std::lround(heads * 64)));
    auto it = rate.find(key);
    if (it != rate.end()) return it->second;
    auto v = std::make_pair(ctx.table.gflops(static_cast<double>(rows), heads, false) * 1e9,
                            ctx.table.gflops(static_cast<double>(rows), heads, true) * 1e9);
    rate.emplace(key, v);
    return v;
  };
  for (const Tile& t : plan.tiles()) {
    const auto r = static_cast<std::size_t>(t.worker);
    const std::int64_t rows = t.end - t.begin;
    const double heads = static_cast<double>(t.heads.size());
    const double fwd = forward_flops(t.flops, ctx.cfg.model.head_dim);
    const double bwd = 2.5 * fwd;  // 10 d vs 4 d FLOPs per pair (workload.hpp)
    (void)d;
    auto full = rates(rows, heads);
    c.comp_fwd[r] += fwd / full.first;
    c.comp_bwd[r] += bwd / full.second;
    auto part = rates(rows, heads / m);
    c.chunk_comp_fwd[r] += fwd / m / part.first;
    c.chunk_comp_bwd[r] += bwd / m / part.second;
  }
  // Byte matrices by kind, whole step and per chunk.
  auto kind_matrices = [&](auto&& transfers_of) {
    std::vector<std::int64_t> q(ws * ws, 0), kv(ws * ws, 0), o(ws * ws, 0);
    for (int s = 0; s < w; ++s) {
      for (int t = 0; t < w; ++t) {
        if (s == t) continue;
        for (const Transfer& x : transfers_of(s, t)) {
          auto& mtx = x.kind == TransferKind::kQ ? q : x.kind == TransferKind::kKv ? kv : o;
          mtx[static_cast<std::size_t>(s) * ws + static_cast<std::size_t>(t)] += x.bytes;
        }
      }
    }
    std::vector<std::int64_t> df(ws * ws), rf(ws * ws), db(ws * ws), rb(ws * ws);
    for (std::size_t s = 0; s < ws; ++s) {
      for (std::size_t t = 0; t < ws; ++t) {
        const std::size_t i = s * ws + t;
        df[i] = q[i] + kv[i];
        rf[i] = o[i];
        db[i] = 2 * q[i] + kv[i];
        rb[i] = o[i] + kv[t * ws + s];
      }
    }
    return std::array<std::vector<double>, 4>{alltoall_seconds(ctx.cfg.cost.net, df, gpus),
                                              alltoall_seconds(ctx.cfg.cost.net, rf, gpus),
                                              alltoall_seconds(ctx.cfg.cost.net, db, gpus),
                                              alltoall_seconds(ctx.cfg.cost.net, rb, gpus)};
  };
  auto whole = kind_matrices([&](int s, int t) { return plan.transfers(s, t); });
  c.disp_fwd = std::move(whole[0]);
  c.ret_fwd = std::move(whole[1]);
  c.disp_bwd = std::move(whole[2]);
  c.ret_bwd = std::move(whole[3]);
  if (c.chunks > 1) {
    for (int k = 0; k < c.chunks; ++k) {
      auto part = kind_matrices([&](int s, int t) { return plan.chunk_transfers(k, s, t); });
      c.cdisp_fwd.push_back(std::move(part[0]));
      c.cret_fwd.push_back(std::move(part[1]));
      c.cdisp_bwd.push_back(std::move(part[2]));
      c.cret_bwd.push_back(std::move(part[3]));
    }
  }
  c.comm_bytes = plan.comm_bytes();
  for (int r = 0; r < w; ++r) {
    c.max_send = std::max(c.max_send, plan.send_bytes(r));
    c.max_recv = std::max(c.max_recv, plan.recv_bytes(r));
  }
  c.imbalance = plan.imbalance();
  return c;
}

struct NoiseKey {
  std::uint64_t window = 0, step = 0;
};

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// Latency of one pool-step: collectives finish when their slowest worker
// does; compute carries each GPU's noise factor for this step.
double time_plan(const Ctx& ctx, const PlanCost& c, std::span<const std::int64_t> gpus, NoiseKey key,
                 bool pipelined, bool backward) {
  const auto ws = static_cast<std::size_t>(c.workers);
  auto noisy_max = [&](const std::vector<double>& comp) {
    double m = 0;
    for (std::size_t r = 0; r < ws; ++r) {
      m = std::max(m, comp[r] * noise_factor(ctx.cfg.cost.noise, key.window, key.step,
                                              static_cast<std::uint64_t>(gpus[r])));
    }
    return m;
  };
  if (!pipelined || c.chunks <= 1) {
    const PhaseSeconds s{max_of(backward ? c.disp_bwd : c.disp_fwd), noisy_max(backward ? c.comp_bwd : c.comp_fwd),
                         max_of(backward ? c.ret_bwd : c.ret_fwd)};
    return serial_seconds(s);
  }
  const double comp = noisy_max(backward ? c.chunk_comp_bwd : c.chunk_comp_fwd);
  std::vector<PhaseSeconds> chunks;
  for (std::size_t k = 0; k < c.cdisp_fwd.size(); ++k) {
    chunks.push_back({max_of(backward ? c.cdisp_bwd[k] : c.cdisp_fwd[k]), comp,
                      max_of(backward ? c.cret_bwd[k] : c.cret_fwd[k])});
  }
  return pipelined_seconds(chunks);
}

// GPU ids of a pool's workers: slot p of a pool whose slot 0 sits on replica
// `first` is replica first + p; its CP ranks are GPUs replica * CP + c.
std::vector<std::int64_t> pool_gpus(std::int64_t first, std::int64_t slots, std::int64_t cp) {
  std::vector<std::int64_t> g;
  for (std::int64_t p = 0; p < slots; ++p) {
    for (std::int64_t c = 0; c < cp; ++c) g.push_back((first + p) * cp + c);
  }
  return g;
}

// Collects, per GA step, the slowest of several concurrent pool latencies.
struct StepMax {
  std::vector<double> step;
  void put(std::int64_t g, double v) { step[static_cast<std::size_t>(g)] = std::max(step[static_cast<std::size_t>(g)], v); }
};

struct CandWindow {
  bool valid = false;
  std::vector<double> inter;  // per placement mode
  double lower_bound = 0;
  std::vector<double> intra, intra_plus, bytes, bytes_plus, send, recv;  // per pool
  std::map<std::string, std::vector<double>> steps;  // variant -> per GA step latency
};

struct WindowResult {
  Status status;
  std::vector<double> ulysses, wlb;  // per GA step
  std::int64_t wlb_split = 0;
  std::vector<CandWindow> cand;
  Timing timing;
};

Result<PlanCost> planned(const Ctx& ctx, std::span<const PackedSequence> pool, const PlanConfig& pc,
                         std::span<const std::int64_t> gpus, Timing& tm, const std::string& kind) {
  auto t0 = Clock::now();
  auto plan = make_plan(pool, pc);
  const double dt = since(t0);
  tm.plan += dt;
  ++tm.plans;
  auto& k = tm.by_kind[kind];
  k.first += dt;
  ++k.second;
  if (!plan.ok()) return plan.error();
  t0 = Clock::now();
  PlanCost c = cost_plan(ctx, *plan, gpus);
  tm.cost += since(t0);
  return c;
}

// Sequences of one pool, in slot order.
std::vector<PackedSequence> pool_of(std::span<const PackedSequence> window, const std::vector<std::int32_t>& idx) {
  std::vector<PackedSequence> out;
  out.reserve(idx.size());
  for (std::int32_t i : idx) out.push_back(window[static_cast<std::size_t>(i)]);
  return out;
}

// Latency per GA step of Ulysses over sequences in loader order (replica r
// of GA step g runs sequence g * DP + r).
Result<std::vector<double>> ulysses_steps(const Ctx& ctx, std::span<const PackedSequence> seqs, std::uint64_t window,
                                          Timing& tm, const std::string& kind) {
  const std::int64_t dp = ctx.cfg.dp;
  const std::int64_t ga = static_cast<std::int64_t>(seqs.size()) / dp;
  StepMax sm{std::vector<double>(static_cast<std::size_t>(ga), 0.0)};
  const PlanConfig pc = ulysses_config(ctx);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(seqs.size()); ++i) {
    const std::int64_t g = i / dp, r = i % dp;
    auto gpus = pool_gpus(r, 1, ctx.cfg.cp);
    LIBRA_ASSIGN_OR_RETURN(PlanCost c, planned(ctx, seqs.subspan(static_cast<std::size_t>(i), 1), pc, gpus, tm, kind));
    sm.put(g, time_plan(ctx, c, gpus, {window, static_cast<std::uint64_t>(g)}, false, false));
  }
  return sm.step;
}

WindowResult simulate_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w) {
  WindowResult out;
  const SimConfig& cfg = ctx.cfg;
  const std::int64_t ga = cfg.gbs / cfg.dp;
  Timing& tm = out.timing;
  auto fail = [&](const Error& e) {
    out.status = e;
    return out;
  };
  auto t0 = Clock::now();
  auto f = sequence_workloads(window);
  tm.placement += since(t0);
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

  // distca: one pool of P = DP per GA step in loader order, Libra's tiles and
  // pipeliner; computed once per (H, B).
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<double>> distca;
  auto placement_for = [&](std::int64_t p, PlacementMode mode) -> Result<std::pair<WindowPlacement, StepLayout>> {
    auto t1 = Clock::now();
    LIBRA_ASSIGN_OR_RETURN(WindowPlacement pl, place_window(*f, {.pool_size = p, .mode = mode, .seed = cfg.seed}));
    LIBRA_ASSIGN_OR_RETURN(StepLayout lay, layout_window(pl, cfg.dp));
    tm.placement += since(t1);
    return std::make_pair(std::move(pl), std::move(lay));
  };
  // Runs every pool of a placement through make_plan and collects step
  // latencies for the given variants (name, pipelined).
  struct Variant {
    std::string name;
    bool pipelined;
  };
  auto run_pools = [&](const std::pair<WindowPlacement, StepLayout>& pl, const PlanConfig& pc,
                       const std::vector<Variant>& variants, CandWindow* cw, bool plus) -> Status {
    const auto& [placement, layout] = pl;
    std::vector<StepMax> sms(variants.size(), StepMax{std::vector<double>(static_cast<std::size_t>(ga), 0.0)});
    for (std::size_t k = 0; k < placement.pools.size(); ++k) {
      const auto pool = pool_of(window, placement.pools[k]);
      const auto gpus = pool_gpus(layout.pool_first_replica[k], static_cast<std::int64_t>(pool.size()), cfg.cp);
      LIBRA_ASSIGN_OR_RETURN(PlanCost c, planned(ctx, pool, pc, gpus, tm, variants[0].name));
      const std::int64_t g = layout.pool_ga[k];
      for (std::size_t v = 0; v < variants.size(); ++v) {
        sms[v].put(g, time_plan(ctx, c, gpus, {w, static_cast<std::uint64_t>(g)}, variants[v].pipelined, false));
      }
      if (cw != nullptr) {
        (plus ? cw->intra_plus : cw->intra).push_back(c.imbalance);
        (plus ? cw->bytes_plus : cw->bytes).push_back(static_cast<double>(c.comm_bytes));
        if (!plus) {
          cw->send.push_back(static_cast<double>(c.max_send));
          cw->recv.push_back(static_cast<double>(c.max_recv));
        }
      }
    }
    for (std::size_t v = 0; v < variants.size(); ++v) {
      if (cw != nullptr) cw->steps[variants[v].name] = std::move(sms[v].step);
    }
    return {};
  };

  std::map<std::int64_t, std::vector<std::pair<WindowPlacement, StepLayout>>> by_p;  // per P, per mode
  out.cand.resize(ctx.candidates.size());
  for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) {
    const SimCandidate& cand = ctx.candidates[ci];
    CandWindow& cw = out.cand[ci];
    auto it = by_p.find(cand.pool_size);
    if (it == by_p.end()) {
      std::vector<std::pair<WindowPlacement, StepLayout>> modes;
      for (PlacementMode mode : all_placement_modes()) {
        auto pl = placement_for(cand.pool_size, mode);
        if (!pl.ok()) return fail(pl.error());
        modes.push_back(std::move(*pl));
      }
      it = by_p.emplace(cand.pool_size, std::move(modes)).first;
    }
    const auto& modes = it->second;
    auto mode_index = [&](PlacementMode m) {
      const auto all = all_placement_modes();
      return static_cast<std::size_t>(std::find(all.begin(), all.end(), m) - all.begin());
    };
    for (const auto& m : modes) cw.inter.push_back(m.first.imbalance);
    cw.lower_bound = imbalance_lower_bound(*f, cand.pool_size) - 1.0;

    const PlanConfig tap = plan_config(ctx, cand.head_shards, cand.block_size, cfg.chunks, PlanMode::kTap, false);
    const PlanConfig plus =
        plan_config(ctx, cand.head_shards, cand.block_size, cfg.chunks, PlanMode::kTapSplit, true);
    Status s = run_pools(modes[mode_index(PlacementMode::kSampler)], tap, {{"libra-tap", false}}, &cw, false);
    // libra-tap's pools are not the ones whose bytes we report: reset.
    cw.intra.clear();
    cw.bytes.clear();
    cw.send.clear();
    cw.recv.clear();
    if (s.ok()) {
      s = run_pools(modes[mode_index(PlacementMode::kVrsp)], tap,
                    {{"libra-tap-vrsp", false}, {"libra-full", true}}, &cw, false);
    }
    if (s.ok()) {
      s = run_pools(modes[mode_index(PlacementMode::kVrspRefine)], plus, {{"libra-plus", true}}, &cw, true);
    }
    if (s.ok()) {
      const auto key = std::make_pair(cand.head_shards, cand.block_size);
      auto d = distca.find(key);
      if (d == distca.end()) {
        auto pl = placement_for(cfg.dp, PlacementMode::kSampler);
        if (!pl.ok()) return fail(pl.error());
        CandWindow tmp;
        s = run_pools(*pl, tap, {{"distca", true}}, &tmp, false);
        if (s.ok()) d = distca.emplace(key, tmp.steps["distca"]).first;
      }
      if (s.ok()) cw.steps["distca"] = d->second;
    }
    if (!s.ok()) return fail(s.error());
    cw.valid = true;
  }
  return out;
}

Stat stat_of(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.worst = *std::max_element(v.begin(), v.end());
  return s;
}

std::string cand_name(const SimCandidate& c) {
  return fmt::format("P={} H={} B={}", c.pool_size, c.head_shards, c.block_size);
}

// Checks a candidate against DP and the planning contract.
Status check_candidate(const Ctx& ctx, const SimCandidate& c) {
  if (c.pool_size < 1 || ctx.cfg.dp % c.pool_size != 0) {
    return invalid_input(fmt::format("--pool-size {}: must divide --dp {}", c.pool_size, ctx.cfg.dp));
  }
  Status s = validate_plan_config(plan_config(ctx, c.head_shards, c.block_size, ctx.cfg.chunks, PlanMode::kTap, false));
  if (!s.ok()) {
    return invalid_input(fmt::format("--head-shards {} --block-size {}: {}", c.head_shards, c.block_size,
                                     s.message()));
  }
  return {};
}

// ----- End-to-end step model -------------------------------------------------

struct E2eWindow {
  Status status;
  std::vector<double> ulysses_time, libra_time;  // per DP point: the optimizer step's seconds
  std::vector<double> ulysses_sync, libra_sync;  // the same when every layer syncs all replicas
  std::vector<double> mb_ulysses, mb_libra;       // forward seconds per microbatch at cfg.dp
  double tokens = 0;
  Timing timing;
};

double seq_tokens(const PackedSequence& s) {
  return static_cast<double>(std::accumulate(s.begin(), s.end(), std::int64_t{0}));
}

E2eWindow e2e_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w,
                     const SimCandidate& rec, const std::vector<std::int64_t>& dps) {
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
    auto c = planned(ctx, window.subspan(i, 1), upc, gpus, tm, "end-to-end ulysses");
    if (!c.ok()) {
      out.status = c.error();
      return out;
    }
    uly.push_back(std::move(*c));
  }
  const PlanConfig lpc = plan_config(ctx, rec.head_shards, rec.block_size, cfg.chunks, PlanMode::kTap, false);
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
    auto t0 = Clock::now();
    auto pl = place_window(*f, {.pool_size = p, .mode = PlacementMode::kVrsp, .seed = cfg.seed});
    if (!pl.ok()) {
      out.status = pl.error();
      return out;
    }
    auto lay = layout_window(*pl, dp);
    tm.placement += since(t0);
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
        auto c = planned(ctx, pool_of(window, pl->pools[k]), lpc, gpus, tm, "end-to-end libra");
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
      const double af = time_plan(ctx, *c, gpus, key, true, false);
      const double ab = time_plan(ctx, *c, gpus, key, true, true);
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

}  // namespace

const VariantLatency* CandidateResult::find(std::string_view name) const {
  for (const auto& v : latency) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

Result<ModelShape> model_preset(std::string_view name) {
  if (name == "qwen3-30b-a3b") return ModelShape{};
  return invalid_input(fmt::format("--model '{}': unknown preset; known: qwen3-30b-a3b", name));
}

Result<SimResult> simulate(const SimConfig& cfg, const SimProgress& progress) {
  const auto t_start = Clock::now();
  SimResult res;
  res.config = cfg;
  LIBRA_TRY(validate_cost_model(cfg.cost));
  if (cfg.gbs < 1) return invalid_input(fmt::format("--gbs {}: must be at least 1", cfg.gbs));
  if (cfg.dp < 1 || cfg.gbs % cfg.dp != 0) {
    return invalid_input(fmt::format("--dp {}: must divide --gbs {}", cfg.dp, cfg.gbs));
  }
  if (cfg.cp < 1) return invalid_input(fmt::format("--cp {}: must be at least 1", cfg.cp));
  if (cfg.chunks < 1) return invalid_input(fmt::format("--chunks {}: must be at least 1", cfg.chunks));
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
  if (cfg.threads < 0) return invalid_input(fmt::format("--threads {}: must be >= 0", cfg.threads));
  for (std::int64_t d : cfg.scaling_dp) {
    if (d < 1 || cfg.gbs % d != 0) {
      return invalid_input(fmt::format("--scaling-dp {}: every value must divide --gbs {}", d, cfg.gbs));
    }
  }

  // Corpus -> packed sequences at L.
  auto t0 = Clock::now();
  LIBRA_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(cfg.source));
  std::int64_t seq_len = cfg.seq_len != 0 ? cfg.seq_len : corpus.default_seq_len;
  if (seq_len < 1) {
    return invalid_input(fmt::format("--seq-len: required for {} (it has no default packed length)", cfg.source));
  }
  std::vector<PackedSequence> seqs;
  if (corpus.kind == CorpusKind::kRaw) {
    LIBRA_ASSIGN_OR_RETURN(PackResult packed, pack(corpus.raw_lengths, {.seq_len = seq_len}));
    seqs = std::move(packed.sequences);
  } else {
    for (std::size_t i = 0; i < corpus.packed.size(); ++i) {
      const double t = seq_tokens(corpus.packed[i]);
      if (t > static_cast<double>(seq_len)) {
        return invalid_input(fmt::format("{}: packed sequence {} holds {} tokens, more than --seq-len {}", cfg.source,
                                         i + 1, static_cast<std::int64_t>(t), seq_len));
      }
    }
    seqs = std::move(corpus.packed);
  }
  res.timing.load_s = since(t0);
  res.seq_len = seq_len;
  const std::int64_t full_windows = static_cast<std::int64_t>(seqs.size()) / cfg.gbs;
  if (full_windows < 1) {
    return invalid_input(fmt::format("{}: {} packed sequences at --seq-len {} is shorter than one window of --gbs {}",
                                     cfg.source, seqs.size(), seq_len, cfg.gbs));
  }
  const std::int64_t windows = cfg.max_windows == 0 ? full_windows : std::min(full_windows, cfg.max_windows);
  res.windows = windows;
  res.steps = windows * (cfg.gbs / cfg.dp);

  Ctx ctx{cfg, seq_len, ThroughputTable(cfg.cost.kernel), {}};
  // Candidates: cross product; invalid ones are skipped unless all are.
  Status first_error;
  for (std::int64_t p : cfg.pool_sizes) {
    for (std::int64_t h : cfg.head_shards) {
      for (std::int64_t b : cfg.block_sizes) {
        SimCandidate c{p, h, b};
        if (std::find(ctx.candidates.begin(), ctx.candidates.end(), c) != ctx.candidates.end()) continue;
        Status s = check_candidate(ctx, c);
        if (s.ok()) {
          ctx.candidates.push_back(c);
        } else {
          if (first_error.ok()) first_error = s;
          res.skipped.push_back({c, s.message()});
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

  const std::int64_t threads =
      cfg.threads > 0 ? cfg.threads : std::max<std::int64_t>(1, static_cast<std::int64_t>(std::thread::hardware_concurrency()));
  const std::int64_t total_units = windows * (cfg.end_to_end ? 2 : 1);
  std::atomic<std::int64_t> done{0};

  // Runs fn(window index) for every window on `threads` threads.
  auto parallel = [&](auto&& fn) {
    std::atomic<std::int64_t> next{0};
    const std::int64_t target = done.load() + windows;
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
      if (progress) progress(done.load(), total_units);
    }
    while (done.load() < target) {
      if (progress) progress(done.load(), total_units);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (auto& th : pool) th.join();
    if (progress) progress(done.load(), total_units);
  };
  auto window_span = [&](std::int64_t i) {
    return std::span<const PackedSequence>(seqs).subspan(static_cast<std::size_t>(i * cfg.gbs),
                                                         static_cast<std::size_t>(cfg.gbs));
  };

  std::vector<WindowResult> wr(static_cast<std::size_t>(windows));
  parallel([&](std::int64_t i) {
    wr[static_cast<std::size_t>(i)] = simulate_window(ctx, window_span(i), static_cast<std::uint64_t>(i));
  });
  for (const auto& r : wr) {
    if (!r.status.ok()) return r.status.error();
    add_timing(res.timing, r.timing);
  }

  // Fold windows in order.
  std::vector<double> uly, wlb;
  for (const auto& r : wr) {
    uly.insert(uly.end(), r.ulysses.begin(), r.ulysses.end());
    wlb.insert(wlb.end(), r.wlb.begin(), r.wlb.end());
    res.wlb_split_samples += r.wlb_split;
  }
  res.ulysses = stat_of(uly);
  res.wlb = stat_of(wlb);
  const auto modes = all_placement_modes();
  for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) {
    CandidateResult cr;
    cr.candidate = ctx.candidates[ci];
    std::vector<std::vector<double>> inter(modes.size());
    std::vector<double> lb, intra, intra_plus, bytes, bytes_plus, send, recv;
    std::map<std::string, std::vector<double>> steps;
    for (const auto& r : wr) {
      const CandWindow& cw = r.cand[ci];
      for (std::size_t m = 0; m < modes.size(); ++m) inter[m].push_back(cw.inter[m]);
      lb.push_back(cw.lower_bound);
      auto app = [](std::vector<double>& a, const std::vector<double>& b) { a.insert(a.end(), b.begin(), b.end()); };
      app(intra, cw.intra);
      app(intra_plus, cw.intra_plus);
      app(bytes, cw.bytes);
      app(bytes_plus, cw.bytes_plus);
      app(send, cw.send);
      app(recv, cw.recv);
      for (const auto& [name, v] : cw.steps) app(steps[name], v);
    }
    for (std::size_t m = 0; m < modes.size(); ++m) {
      cr.inter_imbalance.emplace_back(std::string(placement_mode_name(modes[m])), stat_of(inter[m]));
    }
    cr.lower_bound = stat_of(lb);
    cr.intra_imbalance = stat_of(intra);
    cr.intra_imbalance_plus = stat_of(intra_plus);
    cr.comm_bytes = stat_of(bytes);
    cr.comm_bytes_plus = stat_of(bytes_plus);
    cr.max_send_bytes = stat_of(send);
    cr.max_recv_bytes = stat_of(recv);
    for (const char* name : {"libra-tap", "libra-tap-vrsp", "libra-full", "libra-plus", "distca"}) {
      cr.latency.push_back({name, stat_of(steps[name])});
    }
    res.candidates.push_back(std::move(cr));
  }

  // Recommendation: the least predicted mean step latency of libra-full
  // (ties: the earlier candidate, i.e. the smaller P, H, B in list order).
  std::vector<std::size_t> order(res.candidates.size());
  std::iota(order.begin(), order.end(), 0);
  auto full_mean = [&](std::size_t i) { return res.candidates[i].find("libra-full")->seconds.mean; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return full_mean(a) < full_mean(b); });
  res.recommended = static_cast<std::int64_t>(order[0]);
  const CandidateResult& best = res.candidates[order[0]];
  const auto inter_vrsp = [](const CandidateResult& c) { return c.inter_imbalance[0].second.mean; };
  if (order.size() > 1) {
    res.runner_up = static_cast<std::int64_t>(order[1]);
    const CandidateResult& second = res.candidates[order[1]];
    res.recommendation_reason = fmt::format(
        "{} predicts {:.3f} ms mean / {:.3f} ms worst per layer-step (libra-full), {:.1f}% below runner-up {} "
        "({:.3f} ms); inter-pool R-1 {:.4f} vs {:.4f}, intra-pool R-1 {:.4f} vs {:.4f}, bytes per pool {:.1f} vs "
        "{:.1f} MB",
        cand_name(best.candidate), best.find("libra-full")->seconds.mean * 1e3,
        best.find("libra-full")->seconds.worst * 1e3, 100.0 * (1.0 - full_mean(order[0]) / full_mean(order[1])),
        cand_name(second.candidate), full_mean(order[1]) * 1e3, inter_vrsp(best), inter_vrsp(second),
        best.intra_imbalance.mean, second.intra_imbalance.mean, best.comm_bytes.mean / 1e6,
        second.comm_bytes.mean / 1e6);
  } else {
    res.recommendation_reason =
        fmt::format("{} is the only valid candidate ({:.3f} ms mean per layer-step, libra-full)",
                    cand_name(best.candidate), full_mean(order[0]) * 1e3);
  }

  // Paper comparison (paper section 8.4 and figure 8), recommended candidate.
  auto speed = [&](const char* v, bool worst) {
    const Stat& s = best.find(v)->seconds;
    return worst ? res.ulysses.worst / s.worst : res.ulysses.mean / s.mean;
  };
  res.paper = {
      {"libra-tap mean-straggler speedup over ulysses", 0, 0, speed("libra-tap", false)},
      {"libra-tap-vrsp mean-straggler speedup over ulysses", 0, 0, speed("libra-tap-vrsp", false)},
      {"libra-full mean-straggler speedup over ulysses", 2.91, 2.57, speed("libra-full", false)},
      {"libra-tap worst-step speedup over ulysses", 0, 0, speed("libra-tap", true)},
      {"libra-tap-vrsp worst-step speedup over ulysses", 0, 0, speed("libra-tap-vrsp", true)},
      {"libra-full worst-step speedup over ulysses", 3.14, 2.90, speed("libra-full", true)},
      {"libra-full mean latency reduction vs wlb (%)", 15.9, 0, 100.0 * (1.0 - best.find("libra-full")->seconds.mean / res.wlb.mean)},
      {"libra-full worst latency reduction vs wlb (%)", 68.4, 0, 100.0 * (1.0 - best.find("libra-full")->seconds.worst / res.wlb.worst)},
      {"libra-full mean latency reduction vs distca (%)", 53.7, 0, 100.0 * (1.0 - best.find("libra-full")->seconds.mean / best.find("distca")->seconds.mean)},
  };
  for (const auto& c : res.candidates) {
    if (c.candidate.pool_size != 8) continue;
    res.paper.push_back({fmt::format("inter-pool R-1 at P=8, random"), 1.077, 0.525, c.inter_imbalance[2].second.mean});
    res.paper.push_back({fmt::format("inter-pool R-1 at P=8, vrsp"), 0.0050, 0.0066, c.inter_imbalance[0].second.mean});
    break;
  }

  // End-to-end: DP sweep and microbatch distribution with the recommended
  // candidate.
  if (cfg.end_to_end && !cfg.scaling_dp.empty()) {
    std::vector<std::int64_t> dps = cfg.scaling_dp;
    if (std::find(dps.begin(), dps.end(), cfg.dp) == dps.end()) dps.push_back(cfg.dp);
    std::sort(dps.begin(), dps.end());
    dps.erase(std::unique(dps.begin(), dps.end()), dps.end());
    auto t1 = Clock::now();
    std::vector<E2eWindow> er(static_cast<std::size_t>(windows));
    parallel([&](std::int64_t i) {
      er[static_cast<std::size_t>(i)] =
          e2e_window(ctx, window_span(i), static_cast<std::uint64_t>(i), best.candidate, dps);
    });
    res.timing.end_to_end_s = since(t1);
    std::vector<double> ut(dps.size(), 0), lt(dps.size(), 0), us(dps.size(), 0), ls(dps.size(), 0);
    double tokens = 0;
    std::vector<double> mbu, mbl;
    for (const auto& r : er) {
      if (!r.status.ok()) return r.status.error();
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
      pt.pool_size = std::gcd(best.candidate.pool_size, dps[k]);
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
    const auto& top = res.dp_scaling.back();
    res.paper.push_back({fmt::format("end-to-end speedup over ulysses at DP={}", top.dp), 1.79, 2.54,
                         top.libra_tokens_per_s / top.ulysses_tokens_per_s});
    res.paper.push_back({fmt::format("ulysses scaling efficiency at DP={} (%)", top.dp), 0, 27.6,
                         100.0 * top.ulysses_efficiency});
    res.paper.push_back({fmt::format("libra scaling efficiency at DP={} (%)", top.dp), 0, 70.3,
                         100.0 * top.libra_efficiency});
    res.paper.push_back({fmt::format("end-to-end speedup at DP={}, replicas synced per layer", top.dp), 1.79, 2.54,
                         top.libra_sync_tokens_per_s / top.ulysses_sync_tokens_per_s});
    res.paper.push_back({fmt::format("ulysses scaling efficiency at DP={}, synced per layer (%)", top.dp), 0, 27.6,
                         100.0 * top.ulysses_sync_efficiency});
    res.paper.push_back({fmt::format("libra scaling efficiency at DP={}, synced per layer (%)", top.dp), 0, 70.3,
                         100.0 * top.libra_sync_efficiency});
    res.paper.push_back({"microbatch forward time, ulysses max (x libra mean)", 6.98, 23.1, res.microbatch_ulysses.max});
    res.paper.push_back({"microbatch forward time, ulysses mean (x libra mean)", 0, 4.14, res.microbatch_ulysses.mean});
    res.paper.push_back({"microbatch forward time, ulysses min (x libra mean)", 0, 0.02, res.microbatch_ulysses.min});
    res.paper.push_back({"microbatch forward time, libra max (x libra mean)", 2.63, 1.57, res.microbatch_libra.max});
    res.paper.push_back({"microbatch forward time, libra min (x libra mean)", 0, 0.52, res.microbatch_libra.min});
  }
  res.timing.total_s = since(t_start);
  return res;
}

}  // namespace libra

// ----- Pricing for other units (sim/plan_pricer.hpp) -------------------------

namespace libra::sim_detail {

struct PlanPricer::Impl {
  Ctx ctx;
};

PlanPricer::PlanPricer(const SimConfig& config, std::int64_t seq_len)
    : impl_(std::make_unique<Impl>(Impl{Ctx{config, seq_len, ThroughputTable(config.cost.kernel), {}}})) {}

PlanPricer::~PlanPricer() = default;

double PlanPricer::forward_seconds(const Plan& plan, std::span<const std::int64_t> gpus, std::uint64_t window,
                                   std::uint64_t step, bool pipelined) const {
  const PlanCost c = cost_plan(impl_->ctx, plan, gpus);
  return time_plan(impl_->ctx, c, gpus, {window, step}, pipelined, false);
}

}  // namespace libra::sim_detail
