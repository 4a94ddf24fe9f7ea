// The plan-cost unit: a plan's per-worker compute and communication times
// (cost_model.hpp), and the timing helpers every other unit shares.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <numeric>
#include <tuple>

#include "sim/internal.hpp"

namespace libra::detail {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::int64_t peak_rss_kb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::int64_t>(ru.ru_maxrss);
}

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

PlanConfig plan_config(const Ctx& ctx, std::int64_t h, std::int64_t b, std::int64_t chunks, PlanMode mode,
                       bool dedup_kv) {
  // simulate() has checked every narrowed value against INT32_MAX.
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
  pc.kv_prefix = mode == PlanMode::kTapTopo && ctx.cfg.kv_prefix;
  if (mode == PlanMode::kTapTopo) pc.home_layout = topo_home_layout(ctx, b);
  // tap-topo places by the cost model's own network; the other modes only
  // report bytes by tier with it.
  const Interconnect& net = ctx.cfg.cost.net;
  pc.topology = {.gpus_per_node = static_cast<int>(net.gpus_per_node),
                 .nodes_per_supernode = static_cast<int>(net.nodes_per_supernode),
                 .intra_node_gbps = net.intra_node_gbps,
                 .inter_node_gbps = net.inter_node_gbps,
                 .inter_supernode_gbps = net.inter_supernode_gbps,
                 .congestion_per_node = net.congestion_per_node};
  return pc;
}

NodeInterleave topo_interleave(const Ctx& ctx) {
  return {.cp = ctx.cfg.cp, .gpus_per_node = ctx.cfg.cost.net.gpus_per_node};
}

HomeLayout topo_home_layout(const Ctx& ctx, std::int64_t b) {
  if (ctx.cfg.home_layout) return *ctx.cfg.home_layout;
  // simulate() has checked cp against INT32_MAX.
  const bool fits = check_zigzag_homes(ctx.seq_len, static_cast<int>(ctx.cfg.cp), b).ok();
  return fits ? HomeLayout::kZigzag : HomeLayout::kContiguous;
}

PlanConfig tap_config(const Ctx& ctx, std::int64_t h, std::int64_t b, std::int64_t chunks) {
  return plan_config(ctx, h, b, chunks, PlanMode::kTap, false);
}

// Ulysses: one slot, the sequence's own CP group, heads split over CP.
PlanConfig ulysses_config(const Ctx& ctx) {
  return plan_config(ctx, 1, ctx.seq_len / ctx.cfg.cp, 1, PlanMode::kUlysses, false);
}

PhaseBytes phase_bytes(const Plan& plan, const RelayTable* relays) {
  const int w = plan.num_workers();
  const std::size_t ws = static_cast<std::size_t>(w);
  const PlanConfig& pc = plan.config();
  const std::int64_t d = pc.shape.head_dim;
  const int M = pc.chunks;
  // Byte matrices of the four phases per chunk (chunk M = the whole step,
  // unpipelined: every chunk's bytes in one exchange).
  const int slices = M > 1 ? M + 1 : 1;
  std::vector<std::vector<std::int64_t>> df(static_cast<std::size_t>(slices), std::vector<std::int64_t>(ws * ws, 0));
  auto rf = df, db = df, rb = df;
  const bool relayed = relays != nullptr && relays->any();
  std::vector<std::vector<std::int64_t>> sf, sb;
  if (relayed) sf = sb = df;
  auto at = [&](int s, int t) { return static_cast<std::size_t>(s) * ws + static_cast<std::size_t>(t); };
  // dK/dV cells (worker, source, begin, end, KV head) -> last chunk; the
  // executor adds every head shard's partial of one head into one buffer
  // place, so a cell goes home once.
  struct Cell {
    std::int32_t dst, src;
    std::int64_t begin, end;
    std::int32_t head;
    std::int32_t last;
    std::int64_t bytes;  // fp32 dK + dV of one head
  };
  std::vector<Cell> cells;
  const int whole = slices - 1;
  // Pair by pair (a cell's worker and source are the pair's), every chunk of
  // the pair, then its cells: small sorts instead of one over the plan.
  for (int s = 0; s < w; ++s) {
    for (int t = 0; t < w; ++t) {
      if (s == t) continue;
      cells.clear();
      for (int k = 0; k < M; ++k) {
        // Inputs of a relayed pair: sender to relay in the stage, relay to
        // receiver in the chunk's exchange.
        const int via = relayed ? relays->via(k, s, t) : s;
        const std::size_t in_at = at(via, t);
        for (const Transfer& x : plan.chunk_transfers(k, s, t)) {
          const std::int64_t rows = x.end - x.begin;
          const std::int64_t heads = x.heads.size();
          // The chunk's slice and, when pipelined, the whole step's (no
          // allocation per transfer: this loop is the simulator's hottest).
          const std::array<std::size_t, 2> both{static_cast<std::size_t>(k), static_cast<std::size_t>(whole)};
          const std::span<const std::size_t> targets(both.data(), slices > 1 ? 2 : 1);
          if (x.kind == TransferKind::kQ) {
            const std::int64_t lse = rows * heads * 4;
            for (std::size_t i : targets) {
              df[i][in_at] += x.bytes;
              db[i][in_at] += 3 * x.bytes + lse;  // Q, dO, O + LSE
              if (via != s) {
                sf[i][at(s, via)] += x.bytes;
                sb[i][at(s, via)] += 3 * x.bytes + lse;
              }
            }
          } else if (x.kind == TransferKind::kO) {
            const std::int64_t lse = rows * heads * 4;
            for (std::size_t i : targets) {
              rf[i][at(s, t)] += x.bytes + lse;
              rb[i][at(s, t)] += rows * heads * d * 4;  // dQ in fp32
            }
          } else {
            for (std::size_t i : targets) {
              df[i][in_at] += x.bytes;
              db[i][in_at] += x.bytes;
              if (via != s) {
                sf[i][at(s, via)] += x.bytes;
                sb[i][at(s, via)] += x.bytes;
              }
            }
            for (std::int32_t kh = x.heads.begin; kh < x.heads.end; ++kh) {
              const ChunkUse u = plan.kv_use(t, x.group, kh);
              cells.push_back({t, s, x.begin, x.end, kh, u.used() ? u.last : k, 2 * rows * d * 4});
            }
          }
        }
      }
      // Cells of one (worker, source, first row, head) are one place of the
      // compute buffer: with kv_prefix, shards sharing a KV head may hold
      // prefixes of different lengths there, and the longest goes home (as
      // src/schedule/schedule.cpp returns it).
      std::sort(cells.begin(), cells.end(), [](const Cell& x, const Cell& y) {
        return std::tie(x.begin, x.head, x.end, x.last) < std::tie(y.begin, y.head, y.end, y.last);
      });
      for (std::size_t i = 0; i < cells.size();) {
        std::size_t j = i;
        std::int32_t last = cells[i].last;
        std::int64_t bytes = 0;
        while (j < cells.size() && cells[j].begin == cells[i].begin && cells[j].head == cells[i].head) {
          last = std::max(last, cells[j].last);
          bytes = std::max(bytes, cells[j].bytes);
          ++j;
        }
        rb[static_cast<std::size_t>(last)][at(t, s)] += bytes;
        if (slices > 1) rb[static_cast<std::size_t>(whole)][at(t, s)] += bytes;
        i = j;
      }
    }
  }
  return {std::move(df), std::move(rf), std::move(db), std::move(rb), std::move(sf), std::move(sb)};
}

// Turns a plan into per-worker compute and communication times, priced as
// the executor sends them (src/schedule/schedule.cpp, field_dtype): forward in
// Q + K/V and out O + LSE; backward in Q, dO, O, LSE + K/V and out dQ plus the
// dK/dV partial sums. LSE, dQ, dK and dV travel in fp32 whatever the data
// type, and a KV head's dK/dV goes home once per (worker, source, rows, head)
// with the chunk of its last use, not of its first.
PlanCost cost_plan(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, const RelayTable* relays) {
  PlanCost c;
  const int w = plan.num_workers();
  const std::size_t ws = static_cast<std::size_t>(w);
  c.workers = w;
  c.chunks = plan.config().chunks;
  c.comp_fwd.assign(ws, 0);
  c.comp_bwd.assign(ws, 0);
  c.chunk_comp_fwd.assign(static_cast<std::size_t>(c.chunks), std::vector<double>(ws, 0));
  c.chunk_comp_bwd = c.chunk_comp_fwd;
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
    auto full = rates(rows, heads);
    c.comp_fwd[r] += fwd / full.first;
    c.comp_bwd[r] += bwd / full.second;
    // Chunks of one width share a rate lookup (every chunk, when equal).
    std::pair<double, double> part{};
    double part_width = -1;
    for (int k = 0; k < c.chunks; ++k) {
      const double width = static_cast<double>(plan.chunk_heads(t, k).size());
      if (width != part_width) {
        part = rates(rows, width);
        part_width = width;
      }
      const double share = width / heads;
      c.chunk_comp_fwd[static_cast<std::size_t>(k)][r] += fwd * share / part.first;
      c.chunk_comp_bwd[static_cast<std::size_t>(k)][r] += bwd * share / part.second;
    }
  }
  const PhaseBytes pb = phase_bytes(plan, relays);
  const auto& df = pb.fwd_in;
  const auto& rf = pb.fwd_out;
  const auto& db = pb.bwd_in;
  const auto& rb = pb.bwd_out;
  const std::size_t whole = df.size() - 1;
  auto seconds = [&](const std::vector<std::int64_t>& mtx) { return alltoall_seconds(ctx.cfg.cost.net, mtx, gpus); };
  c.relayed = !pb.fwd_stage.empty();
  // A relayed dispatch waits for its stage (the executor posts in(m) once
  // stage(m) landed); priced in series, though the stages of later chunks
  // run a chunk ahead, under compute, on NVLink.
  auto dispatch = [&](const std::vector<std::vector<std::int64_t>>& in,
                      const std::vector<std::vector<std::int64_t>>& stage, std::size_t i, double* staged) {
    std::vector<double> t = seconds(in[i]);
    if (!c.relayed) return t;
    const double s = max_of(seconds(stage[i]));
    if (staged != nullptr) *staged = s;
    for (double& x : t) x += s;
    return t;
  };
  double staged = 0;
  c.disp_fwd = dispatch(df, pb.fwd_stage, whole, &staged);
  c.ret_fwd = seconds(rf[whole]);
  c.disp_bwd = dispatch(db, pb.bwd_stage, whole, nullptr);
  c.ret_bwd = seconds(rb[whole]);
  if (c.relayed && c.chunks <= 1) c.stage_fwd.push_back(staged);
  if (c.chunks > 1) {
    for (int k = 0; k < c.chunks; ++k) {
      const auto i = static_cast<std::size_t>(k);
      c.cdisp_fwd.push_back(dispatch(df, pb.fwd_stage, i, &staged));
      if (c.relayed) c.stage_fwd.push_back(staged);
      c.cret_fwd.push_back(seconds(rf[i]));
      c.cdisp_bwd.push_back(dispatch(db, pb.bwd_stage, i, nullptr));
      c.cret_bwd.push_back(seconds(rb[i]));
    }
  }
  c.comm_bytes = plan.comm_bytes();
  for (int r = 0; r < w; ++r) {
    c.max_send = std::max(c.max_send, plan.send_bytes(r));
    c.max_recv = std::max(c.max_recv, plan.recv_bytes(r));
  }
  c.max_recv_cross_node = plan.max_recv_cross_node();
  c.imbalance = plan.imbalance();
  return c;
}

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
  std::vector<PhaseSeconds> chunks;
  for (std::size_t k = 0; k < c.cdisp_fwd.size(); ++k) {
    const double comp = noisy_max(backward ? c.chunk_comp_bwd[k] : c.chunk_comp_fwd[k]);
    chunks.push_back({max_of(backward ? c.cdisp_bwd[k] : c.cdisp_fwd[k]), comp,
                      max_of(backward ? c.cret_bwd[k] : c.cret_fwd[k])});
  }
  return pipelined_seconds(chunks);
}

StepDecomposition decompose(const PlanCost& c, bool pipelined) {
  StepDecomposition d;
  const double whole = max_of(c.comp_fwd);
  double sum = 0;
  for (double x : c.comp_fwd) sum += x;
  d.workload_bound = c.workers > 0 ? sum / c.workers : 0;
  d.recv_cross_node = static_cast<double>(c.max_recv_cross_node);
  if (!pipelined || c.chunks <= 1) {
    d.first_dispatch = max_of(c.disp_fwd);
    d.last_return = max_of(c.ret_fwd);
    d.compute = whole;
    d.comm = d.first_dispatch + d.last_return;
    d.total = d.first_dispatch + d.compute + d.last_return;
    return d;
  }
  const std::size_t m = c.cdisp_fwd.size();
  std::vector<PhaseSeconds> chunks;
  for (std::size_t k = 0; k < m; ++k) {
    const double disp = max_of(c.cdisp_fwd[k]), ret = max_of(c.cret_fwd[k]);
    const double comp = max_of(c.chunk_comp_fwd[k]);
    d.compute += comp;
    d.comm += disp + ret;
    chunks.push_back({disp, comp, ret});
  }
  d.chunk_loss = d.compute - whole;
  d.first_dispatch = chunks.front().dispatch;
  d.last_return = chunks.back().ret;
  for (std::size_t k = 0; k < m; ++k) {
    const double overlap = (k + 1 < m ? chunks[k + 1].dispatch : 0.0) + (k > 0 ? chunks[k - 1].ret : 0.0);
    d.exposed_chunks += std::max(0.0, overlap - chunks[k].compute);
  }
  d.total = pipelined_seconds(chunks);
  return d;
}

double comm_seconds(const PlanCost& c) { return max_of(c.disp_fwd) + max_of(c.ret_fwd); }

std::vector<std::int64_t> pool_gpus(std::int64_t first, std::int64_t slots, std::int64_t cp) {
  std::vector<std::int64_t> g;
  g.reserve(static_cast<std::size_t>(slots * cp));
  for (std::int64_t p = 0; p < slots; ++p) {
    for (std::int64_t c = 0; c < cp; ++c) g.push_back((first + p) * cp + c);
  }
  return g;
}

RelayTable timed_relays(const Plan& plan, Timing& tm) {
  const double t0 = thread_cpu_seconds();
  RelayTable relays = plan_relays(plan);
  tm.cost += thread_cpu_seconds() - t0;
  return relays;
}

PlanCost timed_cost(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, Timing& tm,
                    const RelayTable* relays) {
  const double t0 = thread_cpu_seconds();
  PlanCost c = cost_plan(ctx, plan, gpus, relays);
  tm.cost += thread_cpu_seconds() - t0;
  return c;
}

namespace {

PlanCost timed_cost(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, Timing& tm, bool relay) {
  if (!relay) return timed_cost(ctx, plan, gpus, tm, nullptr);
  const RelayTable relays = timed_relays(plan, tm);
  return timed_cost(ctx, plan, gpus, tm, &relays);
}

}  // namespace

Result<std::pair<Plan, PlanCost>> plan_and_price(const Ctx& ctx, std::span<const PackedSequence> sequences,
                                                 const PlanConfig& pc, std::span<const std::int64_t> gpus, Timing& tm,
                                                 const std::string& kind) {
  LIBRA_ASSIGN_OR_RETURN(Plan plan, timed_plan(tm, kind, [&] { return make_plan(sequences, pc); }));
  PlanCost c = timed_cost(ctx, plan, gpus, tm, nullptr);
  return std::make_pair(std::move(plan), std::move(c));
}

Result<PlanCost> price_pool(const Ctx& ctx, std::span<const PackedSequence> sequences, const PlanConfig& pc,
                            std::span<const std::int64_t> gpus, Timing& tm, const std::string& kind, bool relay) {
  if (relay) {
    LIBRA_ASSIGN_OR_RETURN(Plan plan, timed_plan(tm, kind, [&] { return make_plan(sequences, pc); }));
    return timed_cost(ctx, plan, gpus, tm, true);
  }
  LIBRA_ASSIGN_OR_RETURN(auto pc_cost, plan_and_price(ctx, sequences, pc, gpus, tm, kind));
  return std::move(pc_cost.second);
}

Result<PlanCost> price_shaped(const Ctx& ctx, const Plan& plan, std::int64_t chunks, ChunkSplit split, bool relayed,
                              std::span<const std::int64_t> gpus, Timing& tm, const std::string& kind) {
  if (chunks == plan.config().chunks && split == plan.config().chunk_split) {
    return timed_cost(ctx, plan, gpus, tm, relayed);
  }
  // simulate() has checked every M against INT32_MAX.
  // `kind` names the shape (sweep.cpp: "libra-topo relayed tapered").
  const std::string label = kind + " (M " + std::to_string(chunks) + ")";
  LIBRA_ASSIGN_OR_RETURN(Plan re, timed_plan(tm, label, [&] { return rechunk_plan(plan, static_cast<int>(chunks), split); }));
  return timed_cost(ctx, re, gpus, tm, relayed);
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

double seq_tokens(const PackedSequence& s) {
  return static_cast<double>(std::accumulate(s.begin(), s.end(), std::int64_t{0}));
}

std::vector<PackedSequence> pool_of(std::span<const PackedSequence> window, const std::vector<std::int32_t>& idx) {
  std::vector<PackedSequence> out;
  out.reserve(idx.size());
  for (std::int32_t i : idx) out.push_back(window[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace libra::detail
