// libra/simulator.hpp: the configuration simulator behind `libra simulate`.
//
// Replays a corpus, one optimizer-step window of GBS packed sequences at a
// time, through the real planners (libra::place_window for sequence
// placement, libra::make_plan for SH-Tiles, TAP and the exchange plan) for
// every candidate (P, H, B), and charges the result with the cost model
// (cost_model.hpp). It reports, per candidate, inter-pool imbalance for every
// placement mode, intra-pool imbalance, exchanged bytes and the predicted
// core-attention step latency of the paper's baselines (ulysses, wlb, distca)
// and Libra configurations; recommends the fastest candidate; and models the
// end-to-end step (DP scaling at fixed GBS, per-microbatch forward times).
//
//   libra::SimConfig cfg;                 // paper defaults: L = 1M, GBS 128, DP 16, CP 8
//   cfg.source = "builtin:paper-1m";
//   libra::Result<libra::SimResult> r = libra::simulate(cfg);
//   std::cout << libra::sim_table(*r);   // or sim_json / sim_csv, write_sim_report
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "libra/cost_model.hpp"
#include "libra/corpus.hpp"
#include "libra/status.hpp"

namespace libra {

struct SimCandidate {
  std::int64_t pool_size = 0;    // P
  std::int64_t head_shards = 0;  // H
  std::int64_t block_size = 0;   // B
  friend bool operator==(const SimCandidate&, const SimCandidate&) = default;
};

struct SimConfig {
  std::string source = "builtin:paper-1m";
  std::int64_t seq_len = 0;  // L; 0 = the corpus' default packed length
  std::int64_t gbs = 128;    // D
  std::int64_t dp = 16;
  std::int64_t cp = 8;
  ModelShape model;          // Qwen3-30B-A3B by default
  // Candidates: the cross product of the three lists.
  std::vector<std::int64_t> pool_sizes = {2, 4, 8, 16};
  std::vector<std::int64_t> head_shards = {4, 8};
  std::vector<std::int64_t> block_sizes = {8192, 16384, 32768};
  std::int64_t chunks = 4;        // M, pipeliner chunks (paper: 4)
  double tau = 0.03;              // TAP slack (paper: 0.03)
  std::int64_t max_windows = 20;  // 0 = every full window of the corpus
  std::int64_t threads = 0;       // 0 = hardware concurrency
  std::uint64_t seed = 0;         // the `random` placement baseline
  std::vector<std::int64_t> scaling_dp = {1, 2, 4, 8, 16};  // end-to-end DP sweep
  bool end_to_end = true;         // run the DP sweep and microbatch model
  CostModel cost;
};

// Model presets by name: "qwen3-30b-a3b" (the paper's model: h_q 32,
// h_kv 4, d 128, bf16, 48 layers, 3.3B active parameters).
[[nodiscard]] Result<ModelShape> model_preset(std::string_view name);

// Applies a JSON config file over `config` (keys as the CLI flags without
// dashes, with '_' for '-', e.g. {"gbs":128,"pool_sizes":[4,8],
// "inter_node_gbps":45,"model":"qwen3-30b-a3b"}). Unknown keys are errors.
[[nodiscard]] Status apply_sim_config_json(std::string_view json, const std::string& name, SimConfig& config);

struct Stat {
  double mean = 0;
  double worst = 0;
};

// Core-attention forward latency of one layer for one GA step (the slowest
// GPU across DP), seconds, mean and worst over every step of every window.
struct VariantLatency {
  std::string name;  // "libra-tap", "libra-tap-vrsp", "libra-full", "libra-plus", "distca"
  Stat seconds;
};

struct CandidateResult {
  SimCandidate candidate;
  // Inter-pool imbalance R - 1 of every placement mode (placement order).
  std::vector<std::pair<std::string, Stat>> inter_imbalance;
  Stat lower_bound;             // of R - 1 (placement::imbalance_lower_bound)
  Stat intra_imbalance;         // TAP on VRSP pools, over pools
  Stat intra_imbalance_plus;    // tap-split + per-KV-head dedup on vrsp-refine pools
  Stat comm_bytes;              // exchanged bytes per pool per layer (TAP, VRSP pools)
  Stat comm_bytes_plus;
  Stat max_send_bytes;          // busiest worker of a pool
  Stat max_recv_bytes;
  std::vector<VariantLatency> latency;
  const VariantLatency* find(std::string_view name) const;
};

struct SkippedCandidate {
  SimCandidate candidate;
  std::string reason;
};

struct DpScalingPoint {
  std::int64_t dp = 0;
  std::int64_t pool_size = 0;  // Libra's P at this DP (min of the chosen P and DP)
  double ulysses_tokens_per_s = 0;
  double libra_tokens_per_s = 0;
  double ulysses_efficiency = 0;  // throughput / (dp * throughput at the smallest DP)
  double libra_efficiency = 0;
  // The same when every layer synchronises all DP replicas (e.g. an MoE
  // whose expert-parallel all-to-all spans the replicas): each GA step then
  // costs its slowest replica or pool.
  double ulysses_sync_tokens_per_s = 0;
  double libra_sync_tokens_per_s = 0;
  double ulysses_sync_efficiency = 0;
  double libra_sync_efficiency = 0;
};

struct MicrobatchStats {
  double min = 0, max = 0, mean = 0;  // normalised to Libra's mean
  std::vector<double> values;         // every microbatch, normalised
};

struct PaperComparison {
  std::string what;
  double paper_256k = 0, paper_1m = 0, measured = 0;
};

struct SimTiming {
  double load_s = 0, placement_s = 0, plan_s = 0, cost_s = 0, end_to_end_s = 0, total_s = 0;
  std::int64_t plans = 0;  // make_plan calls
  // make_plan seconds (summed over threads) and calls, by what they served.
  std::map<std::string, std::pair<double, std::int64_t>> by_kind;
};

struct SimResult {
  SimConfig config;
  std::int64_t seq_len = 0;
  std::int64_t windows = 0;
  std::int64_t steps = 0;  // GA steps simulated (windows x GBS/DP)
  std::vector<CandidateResult> candidates;
  std::vector<SkippedCandidate> skipped;
  Stat ulysses;  // core-attention forward latency per layer per step
  Stat wlb;
  std::int64_t wlb_split_samples = 0;  // samples the repacker had to cut to fit GBS sequences
  std::int64_t recommended = -1;       // index in candidates
  std::int64_t runner_up = -1;
  std::string recommendation_reason;
  std::vector<PaperComparison> paper;  // speedups over ulysses, recommended candidate
  std::vector<DpScalingPoint> dp_scaling;
  MicrobatchStats microbatch_ulysses, microbatch_libra;
  SimTiming timing;
};

// Progress: called with (done, total) work units, from the calling thread.
using SimProgress = std::function<void(std::int64_t done, std::int64_t total)>;

// Runs the simulation. Errors (one line, naming the flag and the rule):
// P not dividing DP or breaking the contract for every candidate, DP not
// dividing GBS, CP not dividing h_q, zero bandwidth, a corpus shorter than
// one window. Candidates that break a rule while others do not are skipped
// and listed in SimResult::skipped. Identical results for any thread count.
[[nodiscard]] Result<SimResult> simulate(const SimConfig& config, const SimProgress& progress = {});

// Outputs.
std::string sim_table(const SimResult& result);  // the terminal table
std::string sim_json(const SimResult& result);
std::string sim_csv(const SimResult& result);    // one row per candidate
// Writes DIR/index.md, DIR/*.dat and, when gnuplot is on PATH, DIR/*.png.
[[nodiscard]] Status write_sim_report(const SimResult& result, const std::string& dir);

// WLB-LLM baseline (as the paper reproduces it): repacks the raw samples of
// one step into exactly `count` packed sequences of at most seq_len tokens,
// balancing F = sum l^2: samples by decreasing length (ties: input order),
// each into the sequence of least F that still has room (ties: lowest
// index). No outlier deferral: every sample stays in its step. A sample that
// fits nowhere is cut, its first piece filling the sequence with the most
// room; `split_samples` counts such cuts.
struct WlbRepack {
  std::vector<PackedSequence> sequences;
  std::int64_t split_samples = 0;
};
[[nodiscard]] Result<WlbRepack> wlb_repack(std::span<const PackedSequence> window, std::int64_t seq_len,
                                           std::int64_t count);

}  // namespace libra
