// libra/simulator.hpp: the configuration simulator behind `libra simulate`.
//
// Replays packed sequences, one optimizer-step window of GBS at a time,
// through the real planners (libra::place_window for sequence placement,
// libra::make_plan for SH-Tiles, TAP and the exchange plan) for every
// candidate (P, H, B), and charges the result with the cost model
// (cost_model.hpp). It reports, per candidate, inter-pool imbalance for every
// placement mode, intra-pool imbalance, exchanged bytes and the predicted
// core-attention step latency of every Variant (the paper's baselines and
// Libra configurations); recommends a candidate; models the end-to-end step
// (DP scaling at fixed GBS, per-microbatch forward times); and sets the
// paper's figures beside the runs they can be compared with.
//
//   libra::SimConfig cfg;                 // paper defaults: L = 1M, GBS 128, DP 16, CP 8
//   cfg.source = "builtin:paper-1m";
//   auto in = libra::load_sim_input(cfg);                 // the corpus stage's reader
//   auto r = libra::simulate(in->sequences, in->seq_len, cfg);
//   std::cout << libra::sim_table(*r);   // or sim_json / sim_csv, write_sim_report
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/cost_model.hpp"
#include "libra/corpus.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"
#include "libra/status.hpp"

namespace libra {

// What the simulator times. One name table (variant_name / parse_variant);
// results are looked up by enum, never by position.
enum class Variant {
  kUlysses,       // every sequence on its own CP group, loader order
  kWlb,           // WLB-LLM as the paper reproduces it (no outlier deferral)
  kDistca,        // DistCA's scope: one pool of P = DP, Libra's tiles and pipeliner
  kLibraTap,      // Libra(TAP): loader-order pools
  kLibraTapVrsp,  // Libra(TAP+VRSP)
  kLibraFull,     // Libra(Full): + pipeliner
  kLibraPlus,     // vrsp-refine pools, tap-split, per-KV-head dedup, pipeliner
  kLibraTopo,     // VRSP pools, tap-topo on the cost model's topology, pipeliner
};
std::string_view variant_name(Variant v);  // "ulysses", "wlb", "distca", "libra-tap", ...
[[nodiscard]] Result<Variant> parse_variant(std::string_view name);
std::span<const Variant> all_variants();
// The variants timed per candidate (P, H, B), in output order.
std::span<const Variant> candidate_variants();
// Whether a variant runs the pipeliner (libra-full, libra-plus, libra-topo,
// distca): those are priced at every listed M (SimConfig::chunks).
bool variant_pipelined(Variant v);

struct SimCandidate {
  std::int64_t pool_size = 0;    // P
  std::int64_t head_shards = 0;  // H
  std::int64_t block_size = 0;   // B
  friend bool operator==(const SimCandidate&, const SimCandidate&) = default;
};

struct SimConfig {
  std::string source = "builtin:paper-1m";
  std::int64_t seq_len = 0;  // L; 0 = the corpus' default packed length (load_sim_input)
  std::int64_t gbs = 128;    // D
  std::int64_t dp = 16;
  std::int64_t cp = 8;
  ModelShape model;          // Qwen3-30B-A3B by default
  // Candidates: the cross product of the three lists.
  std::vector<std::int64_t> pool_sizes = {2, 4, 8, 16};
  std::vector<std::int64_t> head_shards = {4, 8};
  std::vector<std::int64_t> block_sizes = {8192, 16384, 32768};
  // M, pipeliner chunks. With several values, every candidate's pipelined
  // variants are priced at each M that divides its heads per tile (h_q / H)
  // and keep the one with the least mean + worst_weight x worst. The paper
  // runs M = 4; measured, M = 2 is faster at 256K and M = 1 on a flat
  // network (docs/simulator.md), so the default chooses among 1, 2 and 4.
  std::vector<std::int64_t> chunks = {1, 2, 4};
  // libra-topo's tap-topo plans send each worker only the causal prefix of
  // a sample's K/V (PlanConfig::kv_prefix); false: whole samples.
  bool kv_prefix = true;
  // Rows each CP rank holds in libra-topo's plans (PlanConfig::home_layout).
  // Unset ("auto"): zigzag wherever the candidate's B divides L / (2 CP),
  // else contiguous; zigzag gives every rank an early and a late chunk, so
  // home-first placement keeps more of the work at home (docs/simulator.md,
  // "Home layout"). The other variants keep the contract's contiguous homes.
  std::optional<HomeLayout> home_layout;
  // libra-topo's cross-node inputs through node-mates (libra/relay.hpp,
  // ScheduleOptions::relay). Unset ("auto"): each candidate is priced both
  // ways at every M and runs relayed where that scores better.
  std::optional<bool> relay;
  // How libra-topo's pipeline chunks cut a tile's heads (PlanConfig::
  // chunk_split). Unset ("auto"): tapered is priced beside equal at every M
  // it admits (3 <= M <= heads per tile) and runs where it scores better;
  // kTapered: tapered wherever M admits it, equal elsewhere; kEqual: never
  // tapered. The other variants keep the contract's equal chunks.
  std::optional<ChunkSplit> chunk_split;
  double tau = 0.03;              // TAP slack (paper: 0.03)
  std::int64_t max_windows = 20;  // 0 = every full window of the corpus
  std::int64_t threads = 0;       // 0 = hardware concurrency
  // Fill SimTiming's thread CPU figures (placement, make_plan, cost model):
  // two clock reads per plan and per price, a system call each (about 2% of
  // the default run). Off, those figures are 0; wall, process CPU and the
  // plan counts are kept either way. The CLI sets it from --timing.
  bool thread_timing = true;
  std::uint64_t seed = 0;         // first seed of the `random` placement baseline
  // Seeded random groupings per window (seeds seed .. seed + n - 1): the
  // random baseline's R-1 is their mean, not one shuffle.
  std::int64_t random_seeds = 32;
  std::vector<std::int64_t> scaling_dp = {1, 2, 4, 8, 16};  // end-to-end DP sweep
  bool end_to_end = true;         // run the DP sweep and microbatch model
  // The training step (docs/simulator.md, "End-to-end step"). How replicas
  // wait for each other per micro-batch: 1 = not at all (they meet at the
  // gradient all-reduce), k = in groups of k consecutive replicas (an
  // expert-parallel all-to-all across EP / CP replicas), 0 = all of them
  // (the paper's framing: the worst pool of each GA step is the DP/PP
  // straggler). Each coupled group pays its slowest member per micro-batch.
  std::int64_t coupling = 0;
  // Pipeline stages S of a 1F1B schedule; layers (attention and linear work)
  // split over them. 4 is an assumption: the paper runs PP without its size.
  std::int64_t pp = 4;
  // KV heads of the trained model in the end-to-end step (0: --heads-kv):
  // the 256K microbenchmark's attention has 16, Qwen3-30B-A3B 4.
  std::int64_t trained_heads_kv = 0;
  // Debug: write the end-to-end step model's inputs and steps to this JSON
  // file (empty: none), for an independent check of the 1F1B model.
  std::string step_costs_out;
  // The recommendation minimises mean + worst_weight * worst libra-full
  // latency (0: mean only, the paper's throughput criterion; > 0 also
  // weighs the worst step, i.e. PP bubbles).
  double worst_weight = 0;
  // DistCA pools span every replica: skipped above this many GPUs (its W x W
  // plans grow quadratically; the DP 1024 scale run would need ~GBs).
  std::int64_t distca_max_gpus = 1024;
  std::string hardware = "h200-fa3";  // the profile `cost` was built from
  CostModel cost;
};

// Model presets by name: "qwen3-30b-a3b" (the paper's model: h_q 32,
// h_kv 4, d 128, bf16, 48 layers, 3.3B active parameters).
[[nodiscard]] Result<ModelShape> model_preset(std::string_view name);

// Hardware profiles (compute-to-bandwidth ratio and topology), by name:
//   "h200-fa3": H200, FlashAttention-3-class kernel (600/450 TFLOP/s fwd/bwd
//               peak), NVLink 360 GB/s, RoCE 45 GB/s per GPU, 8 GPUs per node,
//               4 nodes per supernode, 7.5 GB/s per GPU across supernodes;
//   "h200-fa2": the same machine with a FlashAttention-2-class kernel (about
//               0.6x the FA3 rates: 350/260 TFLOP/s).
// docs/simulator.md gives the sources and the figure-14 calibration.
[[nodiscard]] Result<CostModel> hardware_profile(std::string_view name);
std::vector<std::string> hardware_profile_names();

// --- Settings: one schema for the JSON config and the CLI flags. A setting's
// JSON key is its flag without the dashes, '-' -> '_' ("--gbs" <-> "gbs").
enum class SettingType { kInt, kUint, kNumber, kIntList, kString, kBool };
struct SimSetting {
  std::string_view key;   // JSON key, e.g. "pool_sizes"
  std::string_view flag;  // CLI flag, e.g. "--pool-sizes"
  SettingType type;
  std::string_view help;
};
std::span<const SimSetting> sim_settings();
// Applies one setting from JSON (`value`) or from a flag's text (`text`,
// lists comma-separated). `where` names the place in messages (the flag,
// "--gbs"). Integers are plain decimal (core/decimal.hpp) and fit the type.
[[nodiscard]] Status apply_sim_setting(const SimSetting& setting, std::string_view text, const std::string& where,
                                       SimConfig& config);
// Applies a JSON config file (keys from sim_settings(), plus "comment";
// "model" and "hardware" presets apply before the keys they contain).
// Unknown keys are errors.
[[nodiscard]] Status apply_sim_config_json(std::string_view json, const std::string& name, SimConfig& config);
// Every setting's current value as a JSON config (applies back to the same config).
std::string sim_config_json(const SimConfig& config);

struct Stat {
  double mean = 0;
  double worst = 0;
};

// The end-to-end step at --dp of a libra variant on one candidate, at one
// coupling setting (SimConfig::coupling), priced on the sweep's own pools
// and attention shape: what the recommendation ranks candidates by.
struct StepAtDp {
  std::int64_t coupling = 1;
  double ulysses_tokens_per_s = 0;
  double libra_tokens_per_s = 0;
};

// Core-attention forward latency of one layer for one GA step (the slowest
// GPU across DP), seconds, mean and worst over every step of every window.
struct VariantLatency {
  Variant variant;
  Stat seconds;
  // The M `seconds` come from: the best of the listed M for a pipelined
  // variant (ties: the earlier in the list), 1 for the others.
  std::int64_t chunks = 1;
  // Every M priced, in SimConfig::chunks order ((1, seconds) when not pipelined);
  // for libra-topo at each M its best admitted shape (relayed or not, equal or
  // tapered chunks).
  std::vector<std::pair<std::int64_t, Stat>> by_chunks;
  // libra-topo only: `seconds` are of relayed inputs (SimConfig::relay)
  // and of chunks cut this way (SimConfig::chunk_split).
  bool relayed = false;
  ChunkSplit chunk_split = ChunkSplit::kEqual;
  // libra-full, libra-topo, libra-tap-vrsp with --end-to-end: the step at
  // --dp per coupling setting (none, the configured span, all).
  std::vector<StepAtDp> step_at_dp = {};
};

struct CandidateResult {
  SimCandidate candidate;
  // Inter-pool imbalance R - 1 of every placement mode (all_placement_modes order).
  std::vector<std::pair<PlacementMode, Stat>> inter_imbalance;
  Stat lower_bound;             // of R - 1 (placement::imbalance_lower_bound)
  Stat intra_imbalance;         // TAP on VRSP pools, over pools
  Stat intra_imbalance_plus;    // tap-split + per-KV-head dedup on vrsp-refine pools
  Stat comm_bytes;              // exchanged bytes per pool per layer (TAP, VRSP pools)
  Stat comm_bytes_plus;
  Stat max_send_bytes;          // busiest worker of a pool
  Stat max_recv_bytes;
  Stat comm_seconds;            // libra-tap-vrsp dispatch + return (forward, slowest worker), per pool-step
  Stat intra_imbalance_topo;    // tap-topo on VRSP pools, over pools
  Stat max_recv_cross_node;     // the busiest cross-node receiver of a pool (tap, VRSP pools)
  Stat max_recv_cross_node_topo;  // the same with tap-topo
  HomeLayout home_layout_topo = HomeLayout::kContiguous;  // libra-topo's homes (SimConfig::home_layout)
  std::vector<VariantLatency> latency;  // candidate_variants(); distca absent when skipped
  const VariantLatency* find(Variant v) const;
  const Stat& inter(PlacementMode mode) const;
};

// Where one pool-step's forward core-attention time goes (seconds, the
// slowest worker of each phase, without device noise): total = first
// dispatch + compute + exposed chunk transfers + last return.
struct StepDecomposition {
  double total = 0;
  double compute = 0;          // the slowest worker's compute summed over chunks (the pipeliner's kernels)
  double chunk_loss = 0;       // compute minus the same tiles in whole-shard kernel calls
  double comm = 0;             // every dispatch and return, exposed or hidden
  double first_dispatch = 0;   // exposed: nothing computes before it
  double exposed_chunks = 0;   // exposed: chunk transfers longer than the compute they overlap
  double last_return = 0;      // exposed: nothing computes after it
  double workload_bound = 0;   // the pool's FLOPs spread evenly, whole-shard kernels, no communication
  double recv_cross_node = 0;  // bytes: the busiest cross-node receiver of the pool
};

struct SkippedCandidate {
  SimCandidate candidate;
  std::string reason;
  // 0: the whole candidate; else only this M (the candidate runs with the
  // other listed M).
  std::int64_t chunks = 0;
};

// End-to-end figures at one coupling setting (SimConfig::coupling).
struct CouplingPoint {
  std::int64_t coupling = 1;  // 1 none, k a span of k replicas, 0 all
  double ulysses_tokens_per_s = 0;
  double libra_tokens_per_s = 0;
  double ulysses_efficiency = 0;  // throughput / (dp / dp_min * throughput at the smallest DP)
  double libra_efficiency = 0;
};
struct DpScalingPoint {
  std::int64_t dp = 0;
  std::int64_t pool_size = 0;  // Libra's P at this DP (gcd of the chosen P and DP)
  // At the configured coupling (SimConfig::coupling).
  double ulysses_tokens_per_s = 0;
  double libra_tokens_per_s = 0;
  double ulysses_efficiency = 0;  // throughput / (dp / dp_min * throughput at the smallest DP)
  double libra_efficiency = 0;
  // Every coupling setting: none, the configured span (when it is neither), all.
  std::vector<CouplingPoint> couplings;
};

struct MicrobatchStats {
  double min = 0, max = 0, mean = 0;  // normalised to Libra's mean
  std::vector<double> values;         // every microbatch, normalised
};

// One paper figure beside the run's value. Only figures of the run's dataset
// and setting are listed (paper_figures.cpp holds the table, as data).
struct PaperComparison {
  std::string figure;    // "fig. 4", "sec. 8.4", ...
  std::string what;
  double paper = 0;
  double measured = 0;
  std::string note;      // why the two differ in setting, when they do
};

struct SimTiming {
  double load_s = 0, total_s = 0, end_to_end_s = 0;  // wall
  double cpu_s = 0;                                  // process CPU time (all threads)
  double placement_s = 0, plan_s = 0, cost_s = 0;    // thread CPU time, summed over threads
  std::int64_t plans = 0;  // make_plan calls
  std::int64_t peak_rss_kb = 0;
  // make_plan thread CPU seconds and calls, by what they served.
  std::map<std::string, std::pair<double, std::int64_t>> by_kind;
};

// Calibration statistics of a corpus (docs/corpora.md): over every full
// window of `gbs` sequences, the mean R-1 of `seeds` seeded random groupings
// at each pool size, and VRSP's R-1.
struct CalibrationStats {
  std::int64_t windows = 0;
  std::vector<std::pair<std::int64_t, double>> random;  // (P, mean R-1)
  std::vector<std::pair<std::int64_t, double>> vrsp;
};
struct SimResult {
  SimConfig config;
  std::int64_t seq_len = 0;
  std::int64_t windows = 0;
  std::int64_t steps = 0;  // GA steps simulated (windows x GBS/DP)
  std::vector<CandidateResult> candidates;
  std::vector<SkippedCandidate> skipped;
  Stat ulysses;  // core-attention forward latency per layer per step
  Stat wlb;             // wlb_repack over the whole window, sorted: its heaviest sequences land in GA step 0
  Stat wlb_loader;      // wlb_repack within each GA step's own DP sequences (samples stay in their loader step)
  std::int64_t wlb_split_samples = 0;  // samples the repacker had to cut to fit GBS sequences
  std::string distca_skipped;          // why distca was not timed, when it was not
  std::int64_t recommended = -1;       // index in candidates
  std::int64_t runner_up = -1;
  // What to run: the fastest of libra-full, libra-topo and libra-tap-vrsp
  // (M = 1) on the recommended candidate, or ulysses where it beats them all.
  Variant recommended_variant = Variant::kLibraFull;
  // The libra variant the end-to-end model ran (recommended_variant unless
  // that is ulysses: then the fastest libra variant, to show the gap).
  Variant end_to_end_variant = Variant::kLibraFull;
  // The M end_to_end_variant runs at on the recommended candidate (its
  // VariantLatency::chunks): the end-to-end model and the decomposition use it.
  std::int64_t end_to_end_chunks = 1;
  // For the recommended candidate and end_to_end_variant: the mean over
  // every pool-step and the pool that set the worst step.
  StepDecomposition mean_step, worst_step;
  std::string recommendation_reason;
  std::string paper_dataset;           // "1m", "256k" or "" (no paper figures apply)
  std::vector<PaperComparison> paper;
  std::vector<std::string> not_comparable;  // paper figures deliberately not set beside a number, and why
  std::vector<DpScalingPoint> dp_scaling;
  MicrobatchStats microbatch_ulysses, microbatch_libra;
  // Random (mean of random_seeds groupings) and VRSP R-1 at P = 8 and 64
  // over the simulated windows (figures 4 and 8), whatever the candidates.
  CalibrationStats calibration;
  SimTiming timing;
};

// Progress: called with (phase, done, total) windows of that phase, from the
// calling thread; phases "windows" then "end-to-end".
using SimProgress = std::function<void(std::string_view phase, std::int64_t done, std::int64_t total)>;

// Packed sequences of config.source at config.seq_len (or the builtin's
// default length), through the corpus stage's load_packed_sequences.
struct SimInput {
  std::vector<PackedSequence> sequences;
  std::int64_t seq_len = 0;
};
[[nodiscard]] Result<SimInput> load_sim_input(const SimConfig& config);

// Runs the simulation over `sequences` packed at `seq_len` (config.source
// and config.seq_len are only reported). Pure: the same inputs give the same
// result for any thread count. Errors (one line, naming the flag and the
// rule): P not dividing DP or breaking the contract for every candidate, DP
// not dividing GBS, CP not dividing h_q, zero bandwidth, fewer sequences than
// one window. Candidates that break a rule while others do not are skipped
// and listed in SimResult::skipped.
[[nodiscard]] Result<SimResult> simulate(std::span<const PackedSequence> sequences, std::int64_t seq_len,
                                         const SimConfig& config, const SimProgress& progress = {});
// load_sim_input + simulate.
[[nodiscard]] Result<SimResult> simulate(const SimConfig& config, const SimProgress& progress = {});

[[nodiscard]] Result<CalibrationStats> calibration_stats(std::span<const PackedSequence> sequences, std::int64_t gbs,
                                                         std::span<const std::int64_t> pool_sizes,
                                                         std::int64_t seeds);

// Outputs.
std::string sim_table(const SimResult& result);  // the terminal table
std::string sim_json(const SimResult& result);
std::string sim_csv(const SimResult& result);    // one row per candidate
// Writes DIR/index.md, DIR/*.dat, DIR/sim-plots.gp (render with `gnuplot
// sim-plots.gp` inside DIR: the CLI does, without a shell), result.json/csv.
// `rendered` says whether the PNGs exist, for index.md's note.
[[nodiscard]] Status write_sim_report(const SimResult& result, const std::string& dir, bool rendered = true);

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
