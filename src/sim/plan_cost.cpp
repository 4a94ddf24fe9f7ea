// The plan-cost unit: a plan's per-worker compute and communication times
// (cost_model.hpp), and the timing helpers every other unit shares.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <memory>
#include <ctime>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>

#include "sim/alltoall.hpp"
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
  return phase_bytes(exchange_sums(plan.data_as_built()), relays);
}

PhaseBytes phase_bytes(const ExchangeSums& x, const RelayTable* relays) {
  const std::size_t W = static_cast<std::size_t>(x.workers), W2 = W * W;
  const int M = x.chunks;
  const std::int64_t d = x.head_dim, qo = x.head_dim * x.elem_bytes;
  // Byte matrices of the four phases per chunk (chunk M = the whole step,
  // unpipelined: every chunk's bytes in one exchange).
  const int slices = M > 1 ? M + 1 : 1;
  std::vector<std::vector<std::int64_t>> df(static_cast<std::size_t>(slices), std::vector<std::int64_t>(W2, 0));
  auto rf = df, db = df, rb = df;
  const bool relayed = relays != nullptr && relays->any();
  std::vector<std::vector<std::int64_t>> sf, sb;
  if (relayed) sf = sb = df;
  for (int k = 0; k < M; ++k) {
    const std::size_t m = static_cast<std::size_t>(k);
    // Dense on purpose: the tests' reference for the sparse pricing below.
    const std::vector<std::int64_t> qm = x.dense(x.qo_row_heads, k), kvm = x.dense(x.kv_token_heads, k);
    const std::vector<std::int64_t> dkvm = x.dense(x.dkv_rows, k);
    const std::int64_t *q = qm.data(), *kv = kvm.data(), *dkv = dkvm.data();
    for (std::size_t s = 0; s < W; ++s) {
      for (std::size_t t = 0; t < W; ++t) {
        const std::size_t st = s * W + t, ts = t * W + s;
        // Forward in: Q + K/V; backward in: Q, dO, O + LSE (fp32) + K/V.
        const std::int64_t kv_bytes = 2 * qo * kv[st];
        const std::int64_t fin = qo * q[st] + kv_bytes;
        const std::int64_t bin = 3 * qo * q[st] + 4 * q[st] + kv_bytes;
        // A relayed pair's inputs: sender to relay in the stage, relay to
        // receiver in the chunk's exchange.
        const std::size_t via = relayed ? static_cast<std::size_t>(relays->via(k, static_cast<int>(s), static_cast<int>(t))) : s;
        const std::size_t in_at = via * W + t;
        df[m][in_at] += fin;
        db[m][in_at] += bin;
        if (via != s) {
          sf[m][s * W + via] += fin;
          sb[m][s * W + via] += bin;
        }
        // Out: O + LSE of the tiles s computes for t's rows; backward dQ
        // (fp32) and the dK/dV partials (fp32) s returns to t.
        rf[m][st] += qo * q[ts] + 4 * q[ts];
        rb[m][st] += d * 4 * q[ts] + 2 * d * 4 * dkv[st];
      }
    }
  }
  if (slices > 1) {
    const auto whole = static_cast<std::size_t>(M);
    for (auto* v : {&df, &rf, &db, &rb, &sf, &sb}) {
      if (v->empty()) continue;
      for (std::size_t m = 0; m < whole; ++m) {
        for (std::size_t i = 0; i < W2; ++i) (*v)[whole][i] += (*v)[m][i];
      }
    }
  }
  return {std::move(df), std::move(rf), std::move(db), std::move(rb), std::move(sf), std::move(sb)};
}

RelayTable relays_of(const ExchangeSums& x, const PlanTopology& topology) {
  const std::int64_t qo = x.head_dim * x.elem_bytes;
  std::vector<std::int64_t> in(x.qo_row_heads.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = qo * x.qo_row_heads[i] + 2 * qo * x.kv_token_heads[i];
  return plan_relays(x.pairs, in, x.workers, x.chunks, topology.gpus_per_node);
}

namespace {

// A plan's phase bytes over the pairs that can carry any (src * W + dst,
// increasing): per phase and slice (chunk m; M: the whole step), the bytes
// of each pair, as phase_bytes' dense matrices hold them there. Only the
// phases and slices the price reads are kept: the stage phases with relays,
// the return phases unless taken from the direct price, the backward ones
// unless left unpriced, the whole step unless left unpriced, the chunks
// unless left unpriced (then slice 0 is the whole step).
struct SparsePhases {
  enum Phase : std::size_t { kFwdIn, kFwdOut, kBwdIn, kBwdOut, kFwdStage, kBwdStage, kPhases };
  std::vector<std::uint32_t> pairs;
  std::size_t slices = 1;  // kept: M (+ 1 with the whole step)
  std::array<std::size_t, kPhases> slot{};  // where each kept phase's slices start
  // [slot][slice][pair]; not zeroed where every cell is written before it
  // is read (sparse_phases).
  std::unique_ptr<std::int64_t[]> bytes;
  std::int64_t* at(std::size_t phase, std::size_t slice) {
    return bytes.get() + (slot[phase] * slices + slice) * pairs.size();
  }
};

// The phases' pairs: the sums' own and, with relays, the pairs the relays
// send through (relay to receiver, sender to relay), increasing; at[k]:
// where the sums' pair k is among them.
struct PhasePairs {
  std::vector<std::uint32_t> pairs;
  std::vector<std::uint32_t> at;
};
PhasePairs phase_pairs(const ExchangeSums& x, std::span<const std::int32_t> vias) {
  PhasePairs out{x.pairs, {}};
  if (vias.empty()) return out;
  const std::size_t W = static_cast<std::size_t>(x.workers), n = x.pairs.size();
  for (std::size_t m = 0; m < static_cast<std::size_t>(x.chunks); ++m) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t s = x.src[k], t = x.dst[k];
      const auto via = static_cast<std::size_t>(vias[m * n + k]);
      if (via == s) continue;
      out.pairs.push_back(static_cast<std::uint32_t>(via * W + t));
      out.pairs.push_back(static_cast<std::uint32_t>(s * W + via));
    }
  }
  const std::size_t cells = W * W, words = (cells + 63) / 64;
  if (words <= 4 * out.pairs.size()) {
    // Few workers for the pairs listed: marked in a W x W bitset and read
    // back in order (the same sorted set as sort and unique, without a sort
    // of mostly repeated relay pairs).
    std::vector<std::uint64_t> bits(words, 0);
    for (const std::uint32_t p : out.pairs) bits[p / 64] |= std::uint64_t{1} << (p % 64);
    out.pairs.clear();
    for (std::size_t k = 0; k < words; ++k) {
      for (std::uint64_t w = bits[k]; w != 0; w &= w - 1) {
        out.pairs.push_back(static_cast<std::uint32_t>(k * 64 + static_cast<std::size_t>(std::countr_zero(w))));
      }
    }
  } else {
    std::sort(out.pairs.begin(), out.pairs.end());
    out.pairs.erase(std::unique(out.pairs.begin(), out.pairs.end()), out.pairs.end());
  }
  out.at.resize(x.pairs.size());
  for (std::size_t k = 0, j = 0; k < x.pairs.size(); ++k) {
    while (out.pairs[j] != x.pairs[k]) ++j;
    out.at[k] = static_cast<std::uint32_t>(j);
  }
  return out;
}

// Which of a price's phases are priced here (the rest are taken or unread).
struct PhaseSet {
  bool rets = true;      // the return phases
  bool whole = true;     // the whole step's slice (M > 1)
  bool backward = true;  // the backward phases
  bool chunks = true;    // the chunks' slices (else the whole step's alone)
  bool keeps(std::size_t phase, bool relayed) const;
};

bool PhaseSet::keeps(std::size_t phase, bool relayed) const {
  using P = SparsePhases;
  const bool ret = phase == P::kFwdOut || phase == P::kBwdOut, stage = phase == P::kFwdStage || phase == P::kBwdStage;
  const bool bwd = phase == P::kBwdIn || phase == P::kBwdOut || phase == P::kBwdStage;
  return (!ret || rets) && (!stage || relayed) && (!bwd || backward);
}

// Chunk m's unrelayed phase bytes written (not added) over the sums' own
// pairs: sparse_phases' terms, each pair's cell set once. bin, fout and
// bout null where not kept.
void direct_slice(const ExchangeSums& x, std::size_t m, std::int64_t* __restrict fin, std::int64_t* __restrict bin,
                  std::int64_t* __restrict fout, std::int64_t* __restrict bout) {
  const std::size_t n = x.pairs.size();
  const std::int64_t d = x.head_dim, qo = x.head_dim * x.elem_bytes;
  const std::int64_t* q = x.qo_row_heads.data() + m * n;
  const std::int64_t* kv = x.kv_token_heads.data() + m * n;
  const std::uint32_t* rev = x.reverse.data();
  for (std::size_t k = 0; k < n; ++k) fin[k] = qo * q[k] + 2 * qo * kv[k];
  if (bin != nullptr) {
    for (std::size_t k = 0; k < n; ++k) bin[k] = 3 * qo * q[k] + 4 * q[k] + 2 * qo * kv[k];
  }
  if (fout == nullptr) return;
  for (std::size_t k = 0; k < n; ++k) fout[k] = qo * q[rev[k]] + 4 * q[rev[k]];
  if (bout == nullptr) return;
  const std::int64_t* dkv = x.dkv_rows.data() + m * n;
  for (std::size_t k = 0; k < n; ++k) bout[k] = d * 4 * q[rev[k]] + 2 * d * 4 * dkv[k];
}

// Phase p's whole-step slice M: its M chunks' sum (written, not added).
void sum_chunks(SparsePhases& ph, std::size_t p, std::size_t M) {
  const std::size_t n = ph.pairs.size();
  std::int64_t* whole = ph.at(p, M);
  std::copy_n(ph.at(p, 0), n, whole);
  for (std::size_t m = 1; m < M; ++m) {
    const std::int64_t* part = ph.at(p, m);
    for (std::size_t j = 0; j < n; ++j) whole[j] += part[j];
  }
}

// phase_bytes over the pairs the sums touch and, with relays, the pairs
// the relays send through.
SparsePhases sparse_phases(const ExchangeSums& x, const RelayTable* relays, PhaseSet set) {
  const std::size_t W = static_cast<std::size_t>(x.workers);
  const auto M = static_cast<std::size_t>(x.chunks);
  const std::int64_t d = x.head_dim, qo = x.head_dim * x.elem_bytes;
  SparsePhases out;
  // Without the chunks every chunk adds into slice 0, the whole step
  // (integer sums: the same bytes as summing the chunks' slices).
  out.slices = !set.chunks ? 1 : M > 1 && set.whole ? M + 1 : M;
  const std::vector<std::int32_t> vias = relays != nullptr ? relays->vias(x.pairs) : std::vector<std::int32_t>{};
  PhasePairs pp = phase_pairs(x, vias);
  out.pairs = std::move(pp.pairs);
  auto index = [&](std::size_t pair) {
    return static_cast<std::size_t>(std::lower_bound(out.pairs.begin(), out.pairs.end(), pair) - out.pairs.begin());
  };
  const std::size_t n = out.pairs.size(), direct = x.pairs.size();
  std::size_t kept = 0;
  using P = SparsePhases;
  const bool relayed = relays != nullptr, bwd = set.backward;
  for (std::size_t p = 0; p < P::kPhases; ++p) {
    if (set.keeps(p, relayed)) out.slot[p] = kept++;
  }
  // Unrelayed, pair k's cells are its own (j = k), written by the first
  // chunk into its slice and added by the later ones (without the chunks,
  // all into slice 0), and the whole step is its chunks' sum: no cell is
  // read unwritten, so the bytes are not zeroed first. Relayed, several
  // pairs add into one relay pair's cells and some cells get nothing:
  // zeroed.
  const std::size_t cells = kept * out.slices * n;
  out.bytes = std::make_unique_for_overwrite<std::int64_t[]>(cells);
  if (relayed) std::fill_n(out.bytes.get(), cells, 0);
  for (std::size_t m = 0; m < M; ++m) {
    const std::size_t slice = set.chunks ? m : 0;
    if (!relayed && (set.chunks || m == 0)) {
      direct_slice(x, m, out.at(P::kFwdIn, slice), bwd ? out.at(P::kBwdIn, slice) : nullptr,
                   set.rets ? out.at(P::kFwdOut, slice) : nullptr, bwd && set.rets ? out.at(P::kBwdOut, slice) : nullptr);
      continue;
    }
    const std::int64_t* q = x.qo_row_heads.data() + m * direct;
    const std::int64_t* kv = x.kv_token_heads.data() + m * direct;
    const std::int64_t* dkv = bwd && set.rets ? x.dkv_rows.data() + m * direct : nullptr;
    std::int64_t *fin = out.at(P::kFwdIn, slice), *bin = bwd ? out.at(P::kBwdIn, slice) : nullptr;
    std::int64_t* fout = set.rets ? out.at(P::kFwdOut, slice) : nullptr;
    std::int64_t* bout = bwd && set.rets ? out.at(P::kBwdOut, slice) : nullptr;
    std::int64_t* sf = relayed ? out.at(P::kFwdStage, slice) : nullptr;
    std::int64_t* sb = relayed && bwd ? out.at(P::kBwdStage, slice) : nullptr;
    for (std::size_t k = 0; k < direct; ++k) {
      const std::size_t s = x.src[k], t = x.dst[k], ts = x.reverse[k];
      // As phase_bytes: in Q (+ dO, O, LSE) + K/V, out O + LSE (dQ + dK/dV).
      const std::int64_t kv_bytes = 2 * qo * kv[k];
      const std::int64_t f = qo * q[k] + kv_bytes;
      const std::int64_t b = 3 * qo * q[k] + 4 * q[k] + kv_bytes;
      const std::size_t j = relayed ? pp.at[k] : k;
      // Without the chunks a pair's out bytes add up over them in slice 0.
      if (set.rets) {
        fout[j] += qo * q[ts] + 4 * q[ts];
        if (bwd) bout[j] += d * 4 * q[ts] + 2 * d * 4 * dkv[k];
      }
      const std::size_t via = relayed ? static_cast<std::size_t>(vias[m * direct + k]) : s;
      if (via == s) {
        fin[j] += f;
        if (bwd) bin[j] += b;
        continue;
      }
      const std::size_t in_at = index(via * W + t), stage_at = index(s * W + via);
      fin[in_at] += f;
      sf[stage_at] += f;
      if (bwd) {
        bin[in_at] += b;
        sb[stage_at] += b;
      }
    }
  }
  if (out.slices > M) {
    for (std::size_t p = 0; p < P::kPhases; ++p) {
      if (set.keeps(p, relayed)) sum_chunks(out, p, M);
    }
  }
  return out;
}

// The phases' all-to-all times (relayed: each dispatch after its stage);
// the return times are `direct`'s where given (the same plan unrelayed);
// the whole step, the backward phases and the chunks only as `want` says
// (its rets unread).
void price_phases(PlanCost& c, const ExchangeSums& x, const RelayTable* relays, AlltoallPricer& pricer,
                  const PlanCost* direct, PhaseSet want, const AlltoallPricer::Pairs* known_pairs) {
  const bool chunked = c.chunks > 1 && want.chunks;
  const bool whole = want.whole || !chunked, bwd = want.backward;
  const PhaseSet set{.rets = direct == nullptr, .whole = whole, .backward = bwd, .chunks = c.chunks > 1 && want.chunks};
  SparsePhases ph = sparse_phases(x, relays, set);
  const std::size_t n = ph.pairs.size();
  // Unrelayed, the phases' pairs are the sums' own.
  const bool known = known_pairs != nullptr && relays == nullptr && known_pairs->src.size() == ph.pairs.size();
  const AlltoallPricer::Pairs made = known ? AlltoallPricer::Pairs{} : pricer.pairs(ph.pairs);
  const AlltoallPricer::Pairs& pairs = known ? *known_pairs : made;
  auto seconds = [&](std::size_t phase, std::size_t slice) {
    std::vector<double> t;
    pricer.seconds(pairs, {ph.at(phase, slice), n}, t);
    return t;
  };
  c.relayed = relays != nullptr;
  // A relayed dispatch waits for its stage (the executor posts in(m) once
  // stage(m) landed); priced in series, though the stages of later chunks
  // run a chunk ahead, under compute, on NVLink.
  auto dispatch = [&](std::size_t in, std::size_t stage, std::size_t slice, double* staged) {
    std::vector<double> t = seconds(in, slice);
    if (!c.relayed) return t;
    const double s = max_of(seconds(stage, slice));
    if (staged != nullptr) *staged = s;
    for (double& y : t) y += s;
    return t;
  };
  using P = SparsePhases;
  double staged = 0;
  if (whole) {
    const std::size_t at = ph.slices - 1;
    c.disp_fwd = dispatch(P::kFwdIn, P::kFwdStage, at, &staged);
    c.ret_fwd = set.rets ? seconds(P::kFwdOut, at) : direct->ret_fwd;
    if (bwd) {
      c.disp_bwd = dispatch(P::kBwdIn, P::kBwdStage, at, nullptr);
      c.ret_bwd = set.rets ? seconds(P::kBwdOut, at) : direct->ret_bwd;
    }
  }
  if (c.relayed && c.chunks <= 1) c.stage_fwd.push_back(staged);
  if (chunked) {
    for (std::size_t k = 0; k < static_cast<std::size_t>(c.chunks); ++k) {
      c.cdisp_fwd.push_back(dispatch(P::kFwdIn, P::kFwdStage, k, &staged));
      if (c.relayed) c.stage_fwd.push_back(staged);
      c.cret_fwd.push_back(set.rets ? seconds(P::kFwdOut, k) : direct->cret_fwd[k]);
      if (!bwd) continue;
      c.cdisp_bwd.push_back(dispatch(P::kBwdIn, P::kBwdStage, k, nullptr));
      c.cret_bwd.push_back(set.rets ? seconds(P::kBwdOut, k) : direct->cret_bwd[k]);
    }
  }
}

// Plan::comm_bytes, send_bytes, recv_bytes and max_recv_cross_node, from
// the sums' per-pair bytes (the byte matrix is zero off their pairs;
// integer sums, so their order is free).
void add_byte_totals(PlanCost& c, const ExchangeSums& x, const PlanTopology& topo) {
  const auto ws = static_cast<std::size_t>(c.workers);
  std::vector<std::int64_t> send(ws, 0), recv(ws, 0), recv_cross(ws, 0);
  std::vector<int> node(ws);  // across nodes: topo_tier != 0
  for (std::size_t r = 0; r < ws; ++r) node[r] = static_cast<int>(r) / topo.gpus_per_node;
  for (std::size_t j = 0; j < x.pairs.size(); ++j) {
    const std::size_t s = x.src[j], t = x.dst[j];
    const std::int64_t b = x.bytes[j];
    send[s] += b;
    recv[t] += b;
    if (node[s] != node[t]) recv_cross[t] += b;
  }
  for (std::size_t r = 0; r < ws; ++r) {
    c.comm_bytes += send[r];
    c.max_send = std::max(c.max_send, send[r]);
    c.max_recv = std::max(c.max_recv, recv[r]);
    c.max_recv_cross_node = std::max(c.max_recv_cross_node, recv_cross[r]);
  }
}

}  // namespace

// Turns a plan into per-worker compute and communication times, priced as
// the executor sends them (src/schedule/schedule.cpp, field_dtype): forward in
// Q + K/V and out O + LSE; backward in Q, dO, O, LSE + K/V and out dQ plus the
// dK/dV partial sums. LSE, dQ, dK and dV travel in fp32 whatever the data
// type, and a KV head's dK/dV goes home once per (worker, source, rows, head)
// with the chunk of its last use, not of its first.
PlanCost cost_plan(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, const RelayTable* relays) {
  return cost_plan(ctx, plan, exchange_sums(plan.data_as_built()), gpus, relays);
}

namespace {

// Every tile's heads count, or -1 where they differ.
std::int32_t common_heads(std::span<const Tile> tiles) {
  if (tiles.empty()) return -1;
  const std::int32_t h = tiles.front().heads.size();
  for (const Tile& t : tiles) {
    if (t.heads.size() != h) return -1;
  }
  return h;
}

// Each chunk marked `same` (as wide as the one before, in every tile) has
// the chunk before's compute sums.
void copy_same_chunks(const std::vector<char>& same, PlanCost& c) {
  for (std::size_t k = 1; k < same.size(); ++k) {
    if (!same[k]) continue;
    c.chunk_comp_fwd[k] = c.chunk_comp_fwd[k - 1];
    if (c.has_backward) c.chunk_comp_bwd[k] = c.chunk_comp_bwd[k - 1];
  }
}

// add_compute's whole-tile times alone (a price with no chunks): the same
// terms in the same order, so the same sums.
void add_whole_compute(const Ctx& ctx, const Plan& plan, PlanCost& c) {
  std::int64_t shape_rows = -1;
  std::int32_t shape_heads = -1;
  double rate_fwd = 0, rate_bwd = 0;
  for (const Tile& t : plan.tiles()) {
    const auto r = static_cast<std::size_t>(t.worker);
    const std::int64_t rows = t.end - t.begin;
    if (rows != shape_rows || t.heads.size() != shape_heads) {
      shape_rows = rows;
      shape_heads = t.heads.size();
      const double heads = static_cast<double>(t.heads.size());
      rate_fwd = ctx.table.gflops(static_cast<double>(rows), heads, false) * 1e9;
      if (c.has_backward) rate_bwd = ctx.table.gflops(static_cast<double>(rows), heads, true) * 1e9;
    }
    const double fwd = forward_flops(t.flops, ctx.cfg.model.head_dim);
    c.comp_fwd[r] += fwd / rate_fwd;
    if (c.has_backward) c.comp_bwd[r] += 2.5 * fwd / rate_bwd;
  }
}

// c's compute times zeroed, the whole ones `whole`'s where given, for the
// parts c has.
void zero_compute(PlanCost& c, const PlanCost* whole) {
  const std::size_t ws = static_cast<std::size_t>(c.workers);
  if (whole != nullptr) {
    c.comp_fwd = whole->comp_fwd;
    if (c.has_backward) c.comp_bwd = whole->comp_bwd;
  } else {
    c.comp_fwd.assign(ws, 0);
    if (c.has_backward) c.comp_bwd.assign(ws, 0);
  }
  if (!c.has_chunks) return;
  c.chunk_comp_fwd.assign(static_cast<std::size_t>(c.chunks), std::vector<double>(ws, 0));
  if (c.has_backward) c.chunk_comp_bwd = c.chunk_comp_fwd;
}

// A tile shape's rates (GFLOP/s x 1e9), forward and backward, by (rows,
// heads): calls of the same shape repeat (every full block).
class RateCache {
 public:
  explicit RateCache(const ThroughputTable& table) : table_(table) {}
  std::pair<double, double> operator()(std::int64_t rows, double heads) {
    auto key = std::make_pair(rows, static_cast<std::int32_t>(std::lround(heads * 64)));
    auto it = rate_.find(key);
    if (it != rate_.end()) return it->second;
    auto v = std::make_pair(table_.gflops(static_cast<double>(rows), heads, false) * 1e9,
                            table_.gflops(static_cast<double>(rows), heads, true) * 1e9);
    rate_.emplace(key, v);
    return v;
  }

 private:
  const ThroughputTable& table_;
  std::map<std::pair<std::int64_t, std::int32_t>, std::pair<double, double>> rate_;
};

// Per chunk of one tile shape: its rates, its share of the tile's heads and
// whether it is as wide as the chunk before (then it has that one's share
// and rate, hence its times).
struct ChunkShape {
  std::vector<std::pair<double, double>> part;
  std::vector<double> share;
  std::vector<char> same;
  std::vector<std::size_t> distinct;  // the chunks not `same`, in order

  explicit ChunkShape(std::size_t m) : part(m), share(m), same(m, 0) {}
  void set(const Plan& plan, const Tile& t, std::int64_t rows, RateCache& rates) {
    const double heads = static_cast<double>(t.heads.size());
    double part_width = -1;
    distinct.clear();
    for (std::size_t k = 0; k < part.size(); ++k) {
      const double width = static_cast<double>(plan.chunk_heads(t, static_cast<int>(k)).size());
      same[k] = width == part_width;
      if (!same[k]) {
        part[k] = rates(rows, width);
        part_width = width;
        distinct.push_back(k);
      } else {
        part[k] = part[k - 1];
      }
      share[k] = width / heads;
    }
  }
};

// The plan's compute times per worker, whole and per chunk, into c; the
// whole ones `whole`'s where given (a price of the same tiles); the
// backward ones and the chunks' only where c has them (has_backward,
// has_chunks).
void add_compute(const Ctx& ctx, const Plan& plan, PlanCost& c, const PlanCost* whole) {
  zero_compute(c, whole);
  if (!c.has_chunks) {
    if (whole == nullptr) add_whole_compute(ctx, plan, c);
    return;
  }
  const bool with_bwd = c.has_backward;
  RateCache rates(ctx.table);
  // Consecutive tiles mostly share their shape (rows, heads): their rates,
  // whole and per chunk, are looked up once per run of equal shapes; and
  // mostly their FLOPs too: then their times, the same operations on the
  // same operands, are computed once (tf, tb: whole; cf, cb: per chunk).
  const auto M = static_cast<std::size_t>(c.chunks);
  std::int64_t shape_rows = -1;
  std::int32_t shape_heads = -1;
  std::uint64_t times_of = 0;
  std::pair<double, double> full{};
  double tf = 0, tb = 0;
  std::vector<double> cf(M), cb(M);
  ChunkShape cs(M);
  // Each chunk's sums, found once rather than through c's vectors per tile.
  std::vector<double*> fr(M), br(M, nullptr);
  for (std::size_t k = 0; k < M; ++k) {
    fr[k] = c.chunk_comp_fwd[k].data();
    if (with_bwd) br[k] = c.chunk_comp_bwd[k].data();
  }
  // A chunk's width depends on the tile's heads alone, so where every tile
  // has as many heads, a `same` chunk's sums are the chunk before's, term
  // by term: copied at the end.
  const bool same_is_plan_wide = common_heads(plan.tiles()) >= 0;
  for (const Tile& t : plan.tiles()) {
    const auto r = static_cast<std::size_t>(t.worker);
    const std::int64_t rows = t.end - t.begin;
    const double fwd = forward_flops(t.flops, ctx.cfg.model.head_dim);
    const bool new_shape = rows != shape_rows || t.heads.size() != shape_heads;
    if (new_shape) {
      shape_rows = rows;
      shape_heads = t.heads.size();
      if (whole == nullptr) full = rates(rows, static_cast<double>(t.heads.size()));
      cs.set(plan, t, rows, rates);
    }
    if (new_shape || std::bit_cast<std::uint64_t>(fwd) != times_of) {
      times_of = std::bit_cast<std::uint64_t>(fwd);
      const double bwd = 2.5 * fwd;  // 10 d vs 4 d FLOPs per pair (workload.hpp)
      if (whole == nullptr) {
        tf = fwd / full.first;
        if (with_bwd) tb = bwd / full.second;
      }
      for (const std::size_t k : cs.distinct) {
        cf[k] = fwd * cs.share[k] / cs.part[k].first;
        if (with_bwd) cb[k] = bwd * cs.share[k] / cs.part[k].second;
      }
    }
    if (whole == nullptr) {
      c.comp_fwd[r] += tf;
      if (with_bwd) c.comp_bwd[r] += tb;
    }
    if (same_is_plan_wide) {
      for (const std::size_t k : cs.distinct) {
        fr[k][r] += cf[k];
        if (with_bwd) br[k][r] += cb[k];
      }
      continue;
    }
    double f = 0, b = 0;
    for (std::size_t k = 0; k < M; ++k) {
      if (!cs.same[k]) {
        f = cf[k];
        b = cb[k];
      }
      fr[k][r] += f;
      if (with_bwd) br[k][r] += b;
    }
  }
  if (same_is_plan_wide) copy_same_chunks(cs.same, c);
}

// The parts c is priced with are in the prices it takes them from, and a
// price with no chunks has the whole step.
void check_parts(const PlanCost& c, const PriceReuse& reuse) {
  if (!c.has_chunks && !reuse.whole_step) throw std::logic_error("cost_plan: a price with no chunks needs the whole step");
  const auto lacks = [&](const PlanCost* o, bool chunks_too) {
    return o != nullptr && ((c.has_backward && !o->has_backward) || (chunks_too && c.has_chunks && !o->has_chunks));
  };
  if (lacks(reuse.direct, true) || lacks(reuse.same_tiles, false)) {
    throw std::logic_error("cost_plan: a reused price lacks a part this one prices");
  }
}

}  // namespace

PlanCost cost_plan(const Ctx& ctx, const Plan& plan, const ExchangeSums& sums, std::span<const std::int64_t> gpus,
                   const RelayTable* relays, const PriceReuse& reuse) {
  PlanCost c;
  c.workers = plan.num_workers();
  c.chunks = plan.config().chunks;
  c.has_backward = reuse.backward;
  c.has_chunks = reuse.chunks || c.chunks <= 1;
  const PlanCost* direct = reuse.direct;
  if (direct != nullptr && (direct->workers != c.workers || direct->chunks != c.chunks)) {
    throw std::logic_error("cost_plan: the direct price is another plan's");
  }
  check_parts(c, reuse);
  // Its whole-step returns are taken only where it has them.
  if (direct != nullptr && (reuse.whole_step || c.chunks <= 1) && direct->ret_fwd.empty()) direct = nullptr;
  if (direct == nullptr && c.has_backward && sums.dkv_rows.size() != sums.qo_row_heads.size()) {
    throw std::logic_error("cost_plan: the backward returns need the sums' dK/dV rows");
  }
  if (reuse.direct != nullptr) {
    c.comp_fwd = reuse.direct->comp_fwd;
    if (c.has_chunks) c.chunk_comp_fwd = reuse.direct->chunk_comp_fwd;
    if (c.has_backward) {
      c.comp_bwd = reuse.direct->comp_bwd;
      if (c.has_chunks) c.chunk_comp_bwd = reuse.direct->chunk_comp_bwd;
    }
  } else {
    add_compute(ctx, plan, c, reuse.same_tiles);
  }
  AlltoallPricer pricer(ctx.cfg.cost.net, gpus);
  price_phases(c, sums, relays != nullptr && relays->any() ? relays : nullptr, pricer, direct,
               {.whole = reuse.whole_step, .backward = c.has_backward, .chunks = c.has_chunks}, reuse.pairs);
  if (reuse.direct != nullptr) {
    c.take_byte_totals(*reuse.direct);
  } else {
    add_byte_totals(c, sums, plan.config().topology);
  }
  c.imbalance = plan.imbalance();
  return c;
}

ChunkSplit cut_split(std::int32_t width, std::int64_t chunks, ChunkSplit split) {
  // Tapered needs 3 <= M <= width, equal M | width (validate_plan_config).
  if (split != ChunkSplit::kTapered || chunks < 3 || chunks > width || width % chunks != 0) return split;
  const int m = static_cast<int>(chunks);
  for (int k = 1; k < m; ++k) {
    if (chunk_head_offset(width, m, ChunkSplit::kTapered, k) != chunk_head_offset(width, m, ChunkSplit::kEqual, k)) {
      return split;
    }
  }
  return ChunkSplit::kEqual;
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// Latency of one pool-step: collectives finish when their slowest worker
// does; compute carries each GPU's noise factor for this step.
std::vector<double> noise_factors(const Ctx& ctx, std::span<const std::int64_t> gpus, NoiseKey key) {
  std::vector<double> out(gpus.size());
  for (std::size_t r = 0; r < gpus.size(); ++r) {
    out[r] = noise_factor(ctx.cfg.cost.noise, key.window, key.step, static_cast<std::uint64_t>(gpus[r]));
  }
  return out;
}

double time_plan(const Ctx& ctx, const PlanCost& c, std::span<const std::int64_t> gpus, NoiseKey key,
                 bool pipelined, bool backward) {
  return time_plan(c, noise_factors(ctx, gpus.first(static_cast<std::size_t>(c.workers)), key), pipelined, backward);
}

namespace {

// Throws where `c` was priced without what a timing reads (PriceReuse).
void check_priced(const PlanCost& c, bool pipelined, bool backward, const char* what) {
  if (backward && !c.has_backward) throw std::logic_error(std::string(what) + ": the price has no backward part");
  if (pipelined && c.chunks > 1 && !c.has_chunks) throw std::logic_error(std::string(what) + ": the price has no chunks");
}

}  // namespace

double time_plan(const PlanCost& c, std::span<const double> noise, bool pipelined, bool backward) {
  check_priced(c, pipelined, backward, "time_plan");
  const auto ws = static_cast<std::size_t>(c.workers);
  if (noise.size() < ws) throw std::logic_error("time_plan: fewer noise factors than the price's workers");
  auto noisy_max = [&](const std::vector<double>& comp) {
    double m = 0;
    for (std::size_t r = 0; r < ws; ++r) m = std::max(m, comp[r] * noise[r]);
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
  check_priced(c, pipelined, false, "decompose");
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
  const double t0 = tm.clock();
  RelayTable relays = relays_of(exchange_sums(plan.data_as_built()), plan.config().topology);
  tm.cost += tm.clock() - t0;
  return relays;
}

PlanCost timed_cost(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, Timing& tm,
                    const RelayTable* relays) {
  const double t0 = tm.clock();
  PlanCost c = cost_plan(ctx, plan, gpus, relays);
  tm.cost += tm.clock() - t0;
  return c;
}

namespace {

// Relayed: the plan's sums serve its relays and its price.
PlanCost timed_cost(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, Timing& tm, bool relay) {
  if (!relay) return timed_cost(ctx, plan, gpus, tm, nullptr);
  const double t0 = tm.clock();
  const ExchangeSums sums = exchange_sums(plan.data_as_built());
  const RelayTable relays = relays_of(sums, plan.config().topology);
  PlanCost c = cost_plan(ctx, plan, sums, gpus, &relays);
  tm.cost += tm.clock() - t0;
  return c;
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
