// libra/elastic_sim.hpp: what elastic pools (placement mode vrsp-elastic)
// buy and cost on a corpus, next to plain VRSP.
//
// Replays every full window of a corpus twice through the real planners:
// VRSP pools, and vrsp-elastic domains (a fused domain planned by make_plan
// as one pool of k*P slots). Reports how often fusing happens, the
// worst-domain imbalance before and after TAP (per worker, normalised to the
// window's mean load per worker), the bytes TAP exchanges per GA step and the
// predicted core-attention latency per GA step (the simulator's cost model).
//
//   libra::SimConfig cfg;  cfg.source = "builtin:paper-1m";      // gbs 128, dp 16, cp 8
//   libra::Result<libra::ElasticSimResult> r =
//       libra::simulate_elastic(cfg, {.pool_size = 8, .head_shards = 8, .block_size = 16384}, {});
//   std::cout << libra::elastic_table(*r);
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "libra/placement.hpp"
#include "libra/plan.hpp"
#include "libra/sampler.hpp"
#include "libra/simulator.hpp"
#include "libra/status.hpp"

namespace libra {

// One figure with and without elastic pools: mean and worst over windows
// (imbalances) or GA steps (bytes, latency).
struct ElasticPair {
  Stat vrsp, elastic;
};

// One window's priced fusing decision (the simulator's per-window report).
struct ElasticWindowReport {
  bool candidate = false;  // vrsp-elastic fuses pools in this window
  bool fused = false;      // and the window runs fused (priced: only when predicted faster)
  double gain = 1;         // predicted VRSP time / fused time of the candidate (1 when no candidate)
  double vrsp_s = 0;       // predicted optimizer-step latency (one layer, forward), VRSP
  double elastic_s = 0;    // the same for what the window runs
};

struct ElasticSimResult {
  std::string source;
  std::int64_t seq_len = 0, gbs = 0, dp = 0, cp = 0;
  SimCandidate candidate;
  ElasticOptions elastic;
  std::int64_t windows = 0;
  std::int64_t steps = 0;          // GA steps (windows x GBS/DP)
  std::int64_t fused_windows = 0;  // windows with at least one fused domain
  std::int64_t fused_steps = 0;    // GA steps with at least one fused domain
  std::int64_t fused_domains = 0;  // over all windows
  std::int64_t lower_bound_windows = 0;  // windows whose whole-pool bound exceeds the threshold
  // Placement level: VRSP's R - 1 over pools, vrsp-elastic's over domains.
  ElasticPair placement_imbalance;
  // After TAP: the window's most loaded worker over its mean worker load - 1.
  ElasticPair worker_imbalance;
  // Bytes TAP exchanges per GA step and layer (forward), summed over the
  // step's pools or domains.
  ElasticPair step_bytes;
  // Predicted forward core-attention latency of one layer per GA step
  // (pipelined, libra-full): the slowest pool or domain of the step.
  ElasticPair step_latency;
  // The same over the GA steps where vrsp-elastic fused pools only.
  ElasticPair fused_step_latency;
  // The same summed over the window's GA steps (they run one after another):
  // the optimizer step's core-attention time of one layer, over windows.
  ElasticPair window_latency;
  double mean_window_speedup = 0;  // mean over windows of vrsp time / elastic time
  double whole_pool_lower_bound = 0;  // mean over windows of VRSP's bound (placement.hpp)
  // Priced fusing (the default): a window keeps its fused domains only when
  // the cost model predicts its optimizer step faster with them than with
  // VRSP's pools (compute, exposed exchange on the domain's GPUs, the
  // domain's real TAP plan); otherwise it runs VRSP's pools. Unpriced: every
  // window vrsp-elastic fuses runs fused.
  bool priced = true;
  PlanMode plan_mode = PlanMode::kTap;  // the tile placement every pool and domain is planned with
  std::int64_t declined_windows = 0;  // windows vrsp-elastic fused but pricing kept on VRSP
  // Per window, in order: the elastic report.
  using Window = ElasticWindowReport;
  std::vector<Window> per_window;
};

// Priced fusing as one pure function of (window, window index, configuration),
// for the simulator and a training job's sampler alike, so every rank and the
// simulator's report decide the same. For one window: VRSP's placement and
// vrsp-elastic's (buddy domains at buddy_domain_starts on the configuration's
// topology: config.cp, config.cost.net), each pool or domain planned by
// make_plan (TAP on the domain's k*P slots) and priced by the cost model on
// the GPUs it occupies (compute with the seeded device noise of (window
// index, GA step), exposed exchange on the network tiers); the window runs
// fused only when its optimizer step (the sum of its GA steps' slowest pool
// or domain) is predicted faster than VRSP's. Unpriced: whenever vrsp-elastic
// fuses.
class ElasticPricer {
 public:
  // config: gbs, dp, cp, model, chunks, tau, cost (hardware and topology);
  // its source, seq_len and candidate lists are not read. seq_len: L of the
  // packed sequences. plan_mode: the tile placement the job plans pools and
  // domains with, kTap or kTapTopo (topology-aware, on config's network).
  // Errors: as simulate_elastic for the configuration; another plan mode.
  [[nodiscard]] static Result<ElasticPricer> create(const SimConfig& config, const SimCandidate& candidate,
                                                    const ElasticOptions& elastic, std::int64_t seq_len,
                                                    bool priced = true, PlanMode plan_mode = PlanMode::kTap);
  struct Decision {
    WindowPlacement placement;  // what the window runs (VRSP's pools when not fused)
    ElasticWindowReport report;
  };
  // window: the GBS packed sequences of one optimizer step; window_index
  // keys the device noise (the simulator's window i, the sampler's step i).
  [[nodiscard]] Result<Decision> decide(std::span<const PackedSequence> window, std::uint64_t window_index) const;
  // The elastic options with the topology the buddy positions use.
  const ElasticOptions& elastic() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
  friend Result<ElasticSimResult> simulate_elastic(const SimConfig&, const SimCandidate&, const ElasticOptions&,
                                                   bool, PlanMode);
};

// The sampler's placer (SamplerOptions::placer) that places each window by
// pricer.decide(window, step): a training job's vrsp-elastic with priced
// fusing. It needs the sequences (a sampler made with create, not
// from_workloads).
SamplerOptions::Placer priced_elastic_placer(ElasticPricer pricer);

// Errors: as libra::simulate for the configuration and the candidate; a
// bad elastic setting as place_window. Identical results for any thread count.
[[nodiscard]] Result<ElasticSimResult> simulate_elastic(const SimConfig& config, const SimCandidate& candidate,
                                                        const ElasticOptions& elastic, bool priced = true,
                                                        PlanMode plan_mode = PlanMode::kTap);

std::string elastic_table(const ElasticSimResult& result);
std::string elastic_json(const ElasticSimResult& result);

}  // namespace libra
