// Internal to the sim stage: the pieces simulate() is built from, one unit
// each (plan_cost.cpp, baselines.cpp, sweep.cpp, end_to_end.cpp,
// recommend.cpp, paper_figures.cpp), so that a new variant (e.g. a fused
// domain of k pools priced as one TAP domain of k * P slots) is a call to
// price_pool with its own slots and GPUs.
//
//   detail::Ctx ctx{cfg, seq_len, ThroughputTable(cfg.cost.kernel), candidates};
//   auto gpus = detail::pool_gpus(/*first replica*/ 0, /*slots*/ 16, cfg.cp);
//   auto cost = detail::price_pool(ctx, sequences_of_the_domain, detail::tap_config(ctx, h, b), gpus, timing, "fused");
//   double s = detail::time_plan(ctx, *cost, gpus, {window, step}, /*pipelined=*/true, /*backward=*/false);
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "libra/plan.hpp"
#include "libra/relay.hpp"
#include "libra/simulator.hpp"
#include "sim/alltoall.hpp"
#include "sim/step_model.hpp"
#include "tiles/plan_internal.hpp"

namespace libra::detail {

struct Ctx {
  const SimConfig& cfg;
  std::int64_t seq_len;
  ThroughputTable table;
  std::vector<SimCandidate> candidates;
  // Per candidate: the listed M its tiles can take (M divides h_q / H), in
  // SimConfig::chunks order.
  std::vector<std::vector<std::int64_t>> chunks;
};

// What the recommendation minimises, and what picks a variant's M.
inline double score(const SimConfig& cfg, const Stat& s) { return s.mean + cfg.worst_weight * s.worst; }

// Thread CPU time (CLOCK_THREAD_CPUTIME_ID), seconds: what --timing's
// per-phase figures sum, so that waiting on a loaded machine is not counted.
double thread_cpu_seconds();
double process_cpu_seconds();
double wall_seconds();  // steady clock
std::int64_t peak_rss_kb();

struct Timing {
  double placement = 0, plan = 0, cost = 0;  // thread CPU seconds
  std::int64_t plans = 0;
  std::map<std::string, std::pair<double, std::int64_t>> by_kind;  // make_plan seconds and calls
  bool on = true;  // SimConfig::thread_timing: off, every seconds figure stays 0
  // The thread CPU clock where `on`, else 0. A read is a system call here
  // (about 2% of the default run at two reads per plan and per price).
  double clock() const { return on ? thread_cpu_seconds() : 0.0; }
};
void add_timing(SimTiming& total, const Timing& t);

// One micro-batch on one replica: attention seconds per layer and the
// linear part's seconds over the whole model.
struct MicroBatch {
  double attn_fwd = 0, attn_bwd = 0;
  double lin_fwd = 0, lin_bwd = 0;
};
// Per-worker times of one plan, before device noise: a plan is priced once
// and timed many times (variants, DP points).
struct PlanCost {
  int workers = 0;
  std::int64_t chunks = 1;
  std::vector<double> comp_fwd, comp_bwd;              // whole tiles, full head width per call
  // [m][worker]: chunk m's compute (its heads per call; chunks differ in
  // width when tapered, PlanConfig::chunk_split).
  std::vector<std::vector<double>> chunk_comp_fwd, chunk_comp_bwd;
  std::vector<double> disp_fwd, ret_fwd, disp_bwd, ret_bwd;  // whole-step all-to-all, per worker
  // [m][worker]: chunk m's all-to-all times.
  std::vector<std::vector<double>> cdisp_fwd, cret_fwd, cdisp_bwd, cret_bwd;
  // Relayed (libra/relay.hpp): every dispatch above already includes its
  // stage exchange, priced in series before it; the stage alone, for the
  // decomposition.
  bool relayed = false;
  std::vector<double> stage_fwd;  // [m]: the slowest worker's stage of chunk m (M = 1: the whole step)
  std::int64_t comm_bytes = 0, max_send = 0, max_recv = 0;
  std::int64_t max_recv_cross_node = 0;  // the busiest cross-node receiver's bytes
  double imbalance = 0;
  // Parts left unpriced because no reader of this price reads them
  // (PriceReuse::backward, ::chunks): time_plan and decompose throw
  // std::logic_error when asked for them.
  bool has_backward = true;  // false: comp_bwd, chunk_comp_bwd, *disp_bwd, *ret_bwd empty
  bool has_chunks = true;    // false (M > 1): chunk_comp_*, cdisp_*, cret_* empty

  // The byte totals of another price of the same tiles: a re-chunking or a
  // relaying moves the same bytes between the same workers.
  void take_byte_totals(const PlanCost& o) {
    comm_bytes = o.comm_bytes;
    max_send = o.max_send;
    max_recv = o.max_recv;
    max_recv_cross_node = o.max_recv_cross_node;
  }
};

PlanConfig plan_config(const Ctx& ctx, std::int64_t h, std::int64_t b, std::int64_t chunks, PlanMode mode,
                       bool dedup_kv);
PlanConfig tap_config(const Ctx& ctx, std::int64_t h, std::int64_t b, std::int64_t chunks);
// libra-topo's home layout at block size b: SimConfig::home_layout, or when
// unset zigzag where b divides L / (2 CP), else contiguous.
HomeLayout topo_home_layout(const Ctx& ctx, std::int64_t b);
// libra-topo's pools: VRSP with the slots interleaved over the cost model's
// nodes (node_interleaved_slots), so a pool's heaviest sequences do not
// share a node's NICs. Pools are node-aligned here (pool_gpus).
NodeInterleave topo_interleave(const Ctx& ctx);
PlanConfig ulysses_config(const Ctx& ctx);

// GPU ids of a domain's workers: slot p of a domain whose slot 0 sits on
// replica `first` is replica first + p; its CP ranks are GPUs replica * CP + c.
// Any slot count works (a pool, DistCA's whole DP, a fused domain).
std::vector<std::int64_t> pool_gpus(std::int64_t first, std::int64_t slots, std::int64_t cp);

// The bytes the executor sends in each phase of each chunk, as W x W
// matrices [src * W + dst]: [m] for chunk m and, when M > 1, [M] for the
// whole step (every chunk's bytes in one exchange). Forward in: Q + K/V;
// forward out: O + LSE; backward in: Q, dO, O, LSE + K/V; backward out: dQ
// and dK/dV (fp32), each dK/dV cell once with the chunk of its last use.
// With `relays`, a relayed pair's inputs are in the relay's row of fwd_in /
// bwd_in and, sender to relay, in fwd_stage / bwd_stage (empty otherwise).
struct PhaseBytes {
  std::vector<std::vector<std::int64_t>> fwd_in, fwd_out, bwd_in, bwd_out;
  std::vector<std::vector<std::int64_t>> fwd_stage, bwd_stage;
};
PhaseBytes phase_bytes(const Plan& plan, const RelayTable* relays = nullptr);
// The same from the plan's exchange sums (tiles/plan_internal.hpp), which
// the sweep makes once per plan for its relays and its price.
PhaseBytes phase_bytes(const ExchangeSums& sums, const RelayTable* relays = nullptr);
// plan_relays of the plan whose sums these are, on `topology`.
RelayTable relays_of(const ExchangeSums& sums, const PlanTopology& topology);

// A plan's per-worker times on `gpus` (the plan's workers in order).
// With `relays`, as a relayed schedule sends (ScheduleOptions::relay).
PlanCost cost_plan(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus,
                   const RelayTable* relays = nullptr);
// What a price may take from prices already made instead of computing it
// again; each part is what it would compute, bit for bit.
//   PriceReuse r{.direct = &unrelayed};   // a relayed price of the same plan
struct PriceReuse {
  // The same plan's unrelayed price: its compute and return times and its
  // byte totals (relays reroute only the inputs).
  const PlanCost* direct = nullptr;
  // A price of the same tiles at another chunking (rechunk_plan): its
  // whole-step compute times (a tile at full width ignores the chunks).
  const PlanCost* same_tiles = nullptr;
  // false: a chunked price (M > 1) leaves the whole-step exchange unpriced
  // (disp_fwd, ret_fwd, disp_bwd, ret_bwd empty), for a price only timed
  // pipelined (time_plan and decompose then read its chunks alone).
  bool whole_step = true;
  // AlltoallPricer::pairs of the sums' pairs on these GPUs (the same for
  // every chunking of a pool's tiles), for an unrelayed price.
  const AlltoallPricer::Pairs* pairs = nullptr;
  // What the price's readers read, for a price whose readers read less (the
  // sweep: a pool timed forward only, or unpipelined only). false leaves
  // the backward compute and phases, or the chunks of a chunked price,
  // unpriced (PlanCost::has_backward, ::has_chunks); the rest is bit for
  // bit the full price's. No chunks needs the whole step (whole_step).
  bool backward = true;
  bool chunks = true;
};
PlanCost cost_plan(const Ctx& ctx, const Plan& plan, const ExchangeSums& sums, std::span<const std::int64_t> gpus,
                   const RelayTable* relays = nullptr, const PriceReuse& reuse = {});

// The split that names the cut of `split` at M = chunks of tiles `width`
// heads wide: kEqual where the tapered cut is the equal one (4 heads in 4
// chunks: one each), so a tapered shape there is the equal shape's plan and
// price; else `split`.
//   cut_split(4, 4, ChunkSplit::kTapered) == ChunkSplit::kEqual
//   cut_split(8, 4, ChunkSplit::kTapered) == ChunkSplit::kTapered  // 1,3,3,1
ChunkSplit cut_split(std::int32_t width, std::int64_t chunks, ChunkSplit split);

// Runs a planner call, counting its thread CPU time under `kind`.
template <class F>
Result<Plan> timed_plan(Timing& tm, const std::string& kind, F&& f) {
  const double t0 = tm.clock();
  Result<Plan> plan = f();
  const double dt = tm.clock() - t0;
  tm.plan += dt;
  ++tm.plans;
  auto& k = tm.by_kind[kind];
  k.first += dt;
  ++k.second;
  return plan;
}
// plan_relays and cost_plan, counted as cost-model time.
RelayTable timed_relays(const Plan& plan, Timing& tm);
PlanCost timed_cost(const Ctx& ctx, const Plan& plan, std::span<const std::int64_t> gpus, Timing& tm,
                    const RelayTable* relays);

// make_plan over `sequences` (one per slot) and the cost of the plan on `gpus`.
// relay: with plan_relays' relays.
Result<PlanCost> price_pool(const Ctx& ctx, std::span<const PackedSequence> sequences, const PlanConfig& pc,
                            std::span<const std::int64_t> gpus, Timing& tm, const std::string& kind,
                            bool relay = false);
// The same, keeping the plan (to price it at other M with rechunk_plan).
Result<std::pair<Plan, PlanCost>> plan_and_price(const Ctx& ctx, std::span<const PackedSequence> sequences,
                                                 const PlanConfig& pc, std::span<const std::int64_t> gpus, Timing& tm,
                                                 const std::string& kind);
// `plan`'s tiles at `chunks` pipeline chunks cut by `split` (rechunk_plan:
// no placement), priced on `gpus`; with relayed inputs
// (plan_relays of the re-chunked plan) when `relayed`, priced as such a
// schedule sends them.
Result<PlanCost> price_shaped(const Ctx& ctx, const Plan& plan, std::int64_t chunks, ChunkSplit split, bool relayed,
                              std::span<const std::int64_t> gpus, Timing& tm, const std::string& kind);

struct NoiseKey {
  std::uint64_t window = 0, step = 0;
};
// Latency of one domain-step: collectives finish when their slowest worker
// does; compute carries each GPU's noise factor for this step.
double time_plan(const Ctx& ctx, const PlanCost& c, std::span<const std::int64_t> gpus, NoiseKey key, bool pipelined,
                 bool backward);
// The same with each worker's noise factor given (noise_factors: a pool is
// timed at many shapes and M with the same GPUs and key).
double time_plan(const PlanCost& c, std::span<const double> noise, bool pipelined, bool backward);
std::vector<double> noise_factors(const Ctx& ctx, std::span<const std::int64_t> gpus, NoiseKey key);
// Where a pool-step's forward time goes (noise-free).
StepDecomposition decompose(const PlanCost& c, bool pipelined);
// Forward dispatch + return of the slowest worker, unpipelined (figure 14's
// "communication").
double comm_seconds(const PlanCost& c);

double max_of(const std::vector<double>& v);
Stat stat_of(const std::vector<double>& v);
std::string cand_name(const SimCandidate& c);
double seq_tokens(const PackedSequence& s);
std::vector<PackedSequence> pool_of(std::span<const PackedSequence> window, const std::vector<std::int32_t>& idx);

// Collects, per GA step, the slowest of several concurrent domain latencies.
struct StepMax {
  std::vector<double> step;
  void put(std::int64_t g, double v) {
    step[static_cast<std::size_t>(g)] = std::max(step[static_cast<std::size_t>(g)], v);
  }
};

// --- Baselines (baselines.cpp).
// Latency per GA step of Ulysses over sequences in loader order (replica r
// of GA step g runs sequence g * DP + r).
// With `mbs`, each sequence's micro-batch (attention forward and backward,
// linear part) too; with `costs`, each sequence's price.
Result<std::vector<double>> ulysses_steps(const Ctx& ctx, std::span<const PackedSequence> seqs, std::uint64_t window,
                                          Timing& tm, const std::string& kind, std::vector<MicroBatch>* mbs = nullptr,
                                          std::vector<PlanCost>* costs = nullptr);
// The linear part of a micro-batch of `tokens` on one CP group.
double linear_part(const Ctx& ctx, double tokens, bool backward);
// Whether distca can be timed at this DP, and why not.
std::string distca_skip_reason(const SimConfig& cfg);

// --- Candidate sweep of one window (sweep.cpp).
// How libra-topo's pipeliner runs beyond M.
struct TopoShape {
  bool relayed = false;
  ChunkSplit split = ChunkSplit::kEqual;
  auto operator<=>(const TopoShape&) const = default;
};
// libra-topo's shapes SimConfig::relay and chunk_split admit (unset: both
// ways), in tie order: direct before relayed, equal before tapered.
std::vector<TopoShape> admitted_shapes(std::optional<bool> relay, std::optional<ChunkSplit> split);
// What one pool's plans report besides step latencies (CandidateResult's
// per-pool statistics), by the placement and planner that made them.
struct TapPoolStats {  // TAP on VRSP pools (libra-tap-vrsp's plans)
  double intra = 0, bytes = 0, send = 0, recv = 0, comm = 0, recv_cross = 0;
};
struct PlusPoolStats {  // tap-split + per-KV-head dedup on vrsp-refine pools
  double intra = 0, bytes = 0;
};
struct TopoPoolStats {  // tap-topo on interleaved VRSP pools
  double intra = 0, recv_cross = 0;
};
// Step latencies per (variant, M): per GA step (M = 1 for unpipelined variants).
using StepSeries = std::map<std::pair<Variant, std::int64_t>, std::vector<double>>;
// One priced pool of a libra variant: where it ran, its noisy forward
// latency, its decomposition and its micro-batch (for the step model).
struct PoolTiming {
  double fwd = 0;
  StepDecomposition d;
  std::int64_t ga = 0, first_replica = 0, slots = 0;
  MicroBatch mb;
};
// Per (variant, M), per pool of the libra variants.
using PoolSeries = std::map<std::pair<Variant, std::int64_t>, std::vector<PoolTiming>>;
// A candidate's libra-topo pools timed at the end-to-end DP points, so that
// the end-to-end phase (end_to_end.cpp) need not plan them again where the
// recommended candidate runs pools of this P (P = gcd(P_rec, DP), same H
// and B). The recommendation comes after every window, so this is kept for
// one shape, the one libra-topo is recommended at by default: the base
// plan's M, equal chunks, relayed unless --relay false. Elsewhere the phase
// plans afresh; a figure is the same either way.
struct TopoAtDp {
  std::int64_t chunks = 0;
  bool relayed = false;
  std::vector<std::int64_t> dps;  // end_to_end_dps that P divides
  // [DP point][pool]: pipelined forward and backward seconds on the GPUs and
  // GA step layout_window gives the pool at that DP.
  std::vector<std::vector<std::pair<double, double>>> times;
  // [DP point]: every pool's GPUs there price as the sweep's at --dp did
  // (the end-to-end phase prices a P's pools at its first DP point).
  std::vector<char> same_price;
};
struct CandWindow {
  std::map<PlacementMode, double> inter;  // R-1 per placement mode
  double lower_bound = 0;
  std::vector<TapPoolStats> tap;
  std::vector<PlusPoolStats> plus;
  std::vector<TopoPoolStats> topo;
  StepSeries steps;
  PoolSeries pools;
  // The same for libra-topo's other pipeliner shapes (relayed inputs,
  // tapered chunks; SimConfig::relay and chunk_split), by shape; the
  // plain shape (direct, equal) is in steps and pools.
  std::map<TopoShape, StepSeries> shaped_steps;
  std::map<TopoShape, PoolSeries> shaped_pools;
  std::optional<TopoAtDp> topo_at_dp;  // with the end-to-end model only
};
struct WindowResult {
  Status status;
  std::vector<double> ulysses, wlb, wlb_loader;  // per GA step
  std::vector<MicroBatch> ulysses_mb;            // per sequence, in window order (the step model's)
  // Per sequence, ulysses' price on replica i % DP (with the end-to-end
  // model only: its ulysses takes them, e2e_window).
  std::vector<PlanCost> ulysses_costs;
  double tokens = 0;
  std::int64_t wlb_split = 0;
  std::vector<CandWindow> cand;
  Timing timing;
  // The failed candidate's index (-1: the baselines), when status is an error.
  std::int64_t failed_at = 0;
};
// One window, or with parts > 1 its part `part`: the baselines in part 0
// and candidates part, part + parts, ... (the rest of cand left empty), so
// that a few windows' candidates run on several threads. Every candidate's
// results are the same whichever part runs it.
WindowResult simulate_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w,
                             std::size_t part = 0, std::size_t parts = 1);
// Moves part `first`'s candidates (first, first + parts, ...) and timing
// into `into`; the error of the lowest failing candidate wins.
void merge_part(WindowResult& into, WindowResult&& part, std::size_t first, std::size_t parts);
// Mean R-1 of `seeds` random groupings (seeds first .. first + seeds - 1).
Result<double> mean_random_imbalance(std::span<const std::int64_t> f, std::int64_t pool_size, std::uint64_t first,
                                     std::int64_t seeds);
// Whether candidate c can run with `chunks` pipeline chunks.
Status check_candidate(const Ctx& ctx, const SimCandidate& c, std::int64_t chunks);

// --- End-to-end model (end_to_end.cpp, step_model.hpp).
// The coupling settings every end-to-end figure is given for: none, the
// configured span (when it is neither), all; spans as Coupling::span.
std::vector<std::int64_t> coupling_settings(const SimConfig& cfg);
// A micro-batch's cost on each of `stages` pipeline stages, layers split by
// stage_layers: a stage runs its layers' attention and its share of the
// linear part.
MicroBatchCost stage_costs(const MicroBatch& mb, std::int64_t layers, std::int64_t stages);
// The gradient all-reduce of the step at `dp`: one stage's share of
// --grad-bytes-per-gpu.
double step_allreduce_seconds(const SimConfig& cfg, std::int64_t dp);
// The step seconds of one window at one DP, per coupling setting.
struct CouplingSteps {
  std::int64_t coupling = 1;  // Coupling::span
  double ulysses = 0, libra = 0;
};
// The step model's inputs at one DP point, kept for --step-costs-out: every
// replica's micro-batches (GA order) before the stage split.
struct StepTrace {
  std::int64_t dp = 0, pool_size = 1;
  double allreduce = 0;
  std::vector<std::vector<MicroBatch>> ulysses, libra;  // [replica][GA step]
};
struct E2eWindow {
  Status status;
  std::vector<std::vector<CouplingSteps>> steps;  // [DP point][coupling setting]
  std::vector<StepTrace> trace;                   // [DP point], with --step-costs-out only
  std::vector<double> mb_ulysses, mb_libra;       // forward seconds per microbatch at cfg.dp
  double tokens = 0;
  Timing timing;
};
// --scaling-dp with --dp, sorted, without repeats: the end-to-end DP points.
std::vector<std::int64_t> end_to_end_dps(const SimConfig& cfg);
// The sweep's libra-topo times (CandWindow::topo_at_dp) of one window, by P,
// that the end-to-end phase may take for the recommended candidate's pools
// at that P: the same H and B, timed at the same M and shape on the same
// attention shape.
using SweptTopo = std::map<std::int64_t, const TopoAtDp*>;
// Whether a pool's price on GPUs b is its price on a (sweep.cpp): the same
// node and supernode pattern and, with PXN, a shifted by whole nodes.
bool same_price_gpus(const Interconnect& net, std::span<const std::int64_t> a, std::span<const std::int64_t> b);
// `libra` names the libra variant timed (libra-full, libra-topo or
// libra-tap-vrsp), at `chunks` pipeline chunks cut by `split`, relayed or
// not. ctx carries the trained model's attention shape. `ulysses`: the
// sweep's ulysses prices of the window (WindowResult::ulysses_costs) on
// that shape, taken where their GPUs price alike.
E2eWindow e2e_window(const Ctx& ctx, std::span<const PackedSequence> window, std::uint64_t w,
                     const SimCandidate& rec, const std::vector<std::int64_t>& dps, Variant libra,
                     std::int64_t chunks, bool relayed, ChunkSplit split, const SweptTopo& swept = {},
                     const std::vector<PlanCost>* ulysses = nullptr);
// The step of every coupling setting at --dp, summed over windows, from
// per-replica costs (replica-major, micro-batches in GA order).
std::vector<CouplingSteps> steps_at(const SimConfig& cfg, const std::vector<ReplicaCosts>& uly,
                                    const std::vector<ReplicaCosts>& libra, std::int64_t dp, std::int64_t p);
// Writes --step-costs-out: per window and DP point the traces above and the
// step at every coupling setting (docs/simulator.md, "Checking the step").
Status write_step_costs(const std::string& path, const SimConfig& cfg, const std::vector<E2eWindow>& er);
// Folds the windows into res.dp_scaling and the microbatch statistics.
Status fold_end_to_end(const std::vector<E2eWindow>& er, const std::vector<std::int64_t>& dps,
                       const SimCandidate& rec, SimResult& res);

// --- Recommendation (recommend.cpp): sets recommended, runner_up, reason.
void recommend(SimResult& res);

// --- Paper figures (paper_figures.cpp): fills paper_dataset, paper and not_comparable.
void compare_with_paper(SimResult& res);

}  // namespace libra::detail
