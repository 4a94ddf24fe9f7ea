#include "libra/simulator.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/io.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"

namespace libra {
namespace {

std::vector<std::int64_t> sorted_samples(std::span<const PackedSequence> seqs) {
  std::vector<std::int64_t> all;
  for (const auto& s : seqs) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  return all;
}

TEST(WlbRepack, KeepsTheStepsSamplesAndTheTokenCap) {
  std::vector<PackedSequence> window = {{90, 5, 5}, {50, 40, 10}, {30, 30, 30, 10}, {100}};
  auto r = wlb_repack(window, 100, 4);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->split_samples, 0);
  EXPECT_EQ(sorted_samples(r->sequences), sorted_samples(window));
  for (const auto& s : r->sequences) EXPECT_LE(std::accumulate(s.begin(), s.end(), std::int64_t{0}), 100);
}

TEST(WlbRepack, HandComputedGreedy) {
  // Samples by decreasing length: 6, 4, 3, 3, 2, 2 into 2 sequences of 10.
  // 6 -> seq0 (F 36); 4 -> seq1 (16); 3 -> seq1 (25); 3 -> seq1 (34);
  // 2 -> seq1 (38, room 0 after? 4+3+3=10 full) -> seq0 (40); 2 -> seq0 (44).
  std::vector<PackedSequence> window = {{6, 2, 2}, {4, 3, 3}};
  auto r = wlb_repack(window, 10, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sequences[0], (PackedSequence{6, 2, 2}));
  EXPECT_EQ(r->sequences[1], (PackedSequence{4, 3, 3}));
}

// A tiny packed corpus, two windows of GBS = 4 at L = 64.
const std::vector<PackedSequence> kTiny = {{40, 10, 5}, {8, 8, 8, 8, 8, 8}, {64}, {20, 20, 20},
                                           {3, 3, 3},   {50, 14},           {16, 16, 16, 16}, {30, 2}};

std::string tiny_corpus_path() {
  static const std::string path = [] {
    auto p = std::filesystem::temp_directory_path() / ("libra_sim_tiny_" + std::to_string(::getpid()) + ".jsonl");
    EXPECT_TRUE(write_file_atomic(p.string(), format_packed_jsonl(kTiny)).ok());
    return p.string();
  }();
  return path;
}

// Removes the tiny corpus file when the test program ends.
class TinyCorpusCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove(tiny_corpus_path(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kCleanup = ::testing::AddGlobalTestEnvironment(new TinyCorpusCleanup);

SimConfig tiny_config() {
  SimConfig c;
  c.source = tiny_corpus_path();
  c.seq_len = 64;
  c.gbs = 4;
  c.dp = 4;
  c.cp = 2;
  c.model.heads_q = 4;
  c.model.heads_kv = 2;
  c.model.head_dim = 8;
  c.model.elem_bytes = 2;
  c.pool_sizes = {2};
  c.head_shards = {2};
  c.block_sizes = {16};
  c.chunks = 2;
  c.max_windows = 1;
  c.threads = 1;
  c.scaling_dp = {1, 2, 4};
  c.cost.noise.sigma = 0;
  return c;
}

PlanConfig tiny_plan_config(PlanMode mode, int h, std::int64_t b, int chunks) {
  PlanConfig pc;
  pc.seq_len = 64;
  pc.cp = 2;
  pc.block_size = b;
  pc.head_shards = h;
  pc.shape = {.heads_q = 4, .heads_kv = 2, .head_dim = 8, .dtype = DType::kBF16};
  pc.chunks = chunks;
  pc.mode = mode;
  return pc;
}

std::vector<PackedSequence> first_window() { return {kTiny.begin(), kTiny.begin() + 4}; }

TEST(Simulate, ReportsWhatThePlannersReturnDirectly) {
  auto r = simulate(tiny_config());
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->candidates.size(), 1u);
  const CandidateResult& c = r->candidates[0];

  const auto window = first_window();
  auto f = sequence_workloads(window);
  ASSERT_TRUE(f.ok());
  // Inter-pool imbalance of every placement mode, straight from place_window.
  ASSERT_EQ(c.inter_imbalance.size(), all_placement_modes().size());
  for (std::size_t m = 0; m < all_placement_modes().size(); ++m) {
    auto pl = place_window(*f, {.pool_size = 2, .mode = all_placement_modes()[m], .seed = 0});
    ASSERT_TRUE(pl.ok());
    EXPECT_EQ(c.inter_imbalance[m].first, placement_mode_name(all_placement_modes()[m]));
    EXPECT_DOUBLE_EQ(c.inter_imbalance[m].second.mean, pl->imbalance);
  }
  // Intra-pool imbalance and bytes: make_plan on each VRSP pool.
  auto vrsp = place_window(*f, {.pool_size = 2, .mode = PlacementMode::kVrsp});
  ASSERT_TRUE(vrsp.ok());
  double sum_imb = 0, worst_imb = 0, sum_bytes = 0, worst_send = 0;
  for (const auto& idx : vrsp->pools) {
    std::vector<PackedSequence> pool;
    for (auto i : idx) pool.push_back(window[static_cast<std::size_t>(i)]);
    auto plan = make_plan(pool, tiny_plan_config(PlanMode::kTap, 2, 16, 2));
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    sum_imb += plan->imbalance();
    worst_imb = std::max(worst_imb, plan->imbalance());
    sum_bytes += static_cast<double>(plan->comm_bytes());
    for (int w = 0; w < plan->num_workers(); ++w) {
      worst_send = std::max(worst_send, static_cast<double>(plan->send_bytes(w)));
    }
  }
  const double pools = static_cast<double>(vrsp->pools.size());
  EXPECT_DOUBLE_EQ(c.intra_imbalance.mean, sum_imb / pools);
  EXPECT_DOUBLE_EQ(c.intra_imbalance.worst, worst_imb);
  EXPECT_DOUBLE_EQ(c.comm_bytes.mean, sum_bytes / pools);
  EXPECT_DOUBLE_EQ(c.max_send_bytes.worst, worst_send);
  EXPECT_GT(c.comm_bytes.mean, 0);
}

TEST(Simulate, LatencyWithFreeCommunicationIsTheSlowestWorkersCompute) {
  SimConfig cfg = tiny_config();
  cfg.cost.net.intra_node_gbps = 1e15;  // communication costs (almost) nothing
  cfg.cost.net.inter_node_gbps = 1e15;
  cfg.cost.net.latency_us = 0;
  auto r = simulate(cfg);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ThroughputTable table(cfg.cost.kernel);
  // Reference: one call per tile, FLOPs = 4 d f_t over the profile's rate.
  auto slowest = [&](const Plan& plan) {
    std::vector<double> t(static_cast<std::size_t>(plan.num_workers()), 0.0);
    for (const Tile& tile : plan.tiles()) {
      t[static_cast<std::size_t>(tile.worker)] +=
          table.seconds(4.0 * 8 * static_cast<double>(tile.flops), static_cast<double>(tile.end - tile.begin),
                        static_cast<double>(tile.heads.size()));
    }
    return *std::max_element(t.begin(), t.end());
  };
  const auto window = first_window();
  // Ulysses: GA = 1, every replica's own sequence; the step is the slowest.
  double uly = 0;
  for (const auto& s : window) {
    auto plan = make_plan(std::vector<PackedSequence>{s}, tiny_plan_config(PlanMode::kUlysses, 1, 32, 1));
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    uly = std::max(uly, slowest(*plan));
  }
  EXPECT_NEAR(r->ulysses.mean, uly, uly * 1e-9);
  // libra-tap-vrsp: VRSP pools, TAP, no overlap.
  auto f = sequence_workloads(window);
  auto vrsp = place_window(*f, {.pool_size = 2, .mode = PlacementMode::kVrsp});
  double libra = 0;
  for (const auto& idx : vrsp->pools) {
    std::vector<PackedSequence> pool;
    for (auto i : idx) pool.push_back(window[static_cast<std::size_t>(i)]);
    auto plan = make_plan(pool, tiny_plan_config(PlanMode::kTap, 2, 16, 2));
    libra = std::max(libra, slowest(*plan));
  }
  const auto* v = r->candidates[0].find("libra-tap-vrsp");
  ASSERT_NE(v, nullptr);
  EXPECT_NEAR(v->seconds.mean, libra, libra * 1e-9);
}

TEST(Simulate, EndToEndAtDp1IsTheSumOfMicrobatchesHandComputed) {
  SimConfig cfg = tiny_config();
  cfg.cost.net.intra_node_gbps = 1e15;
  cfg.cost.net.inter_node_gbps = 1e15;
  cfg.cost.net.latency_us = 0;
  auto r = simulate(cfg);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->dp_scaling.size(), 3u);
  ThroughputTable table(cfg.cost.kernel);
  // DP = 1: one replica runs the 4 sequences back to back; each costs
  // layers x (slowest CP worker's forward + backward) + linear fwd + bwd,
  // and there is no all-reduce.
  double time = 0, tokens = 0;
  for (const auto& s : first_window()) {
    auto plan = make_plan(std::vector<PackedSequence>{s}, tiny_plan_config(PlanMode::kUlysses, 1, 32, 1));
    ASSERT_TRUE(plan.ok());
    std::vector<double> fwd(2, 0.0), bwd(2, 0.0);
    for (const Tile& t : plan->tiles()) {
      const double rows = static_cast<double>(t.end - t.begin), heads = t.heads.size();
      fwd[static_cast<std::size_t>(t.worker)] += table.seconds(4.0 * 8 * static_cast<double>(t.flops), rows, heads);
      bwd[static_cast<std::size_t>(t.worker)] +=
          table.seconds(10.0 * 8 * static_cast<double>(t.flops), rows, heads, true);
    }
    const double tok = static_cast<double>(std::accumulate(s.begin(), s.end(), std::int64_t{0}));
    tokens += tok;
    time += 48.0 * (std::max(fwd[0], fwd[1]) + std::max(bwd[0], bwd[1])) +
            6.0 * 3.3e9 * tok / 2.0 / (400e12);  // 2 fwd + 4 bwd FLOPs per active parameter, over CP = 2
  }
  const DpScalingPoint& p = r->dp_scaling[0];
  EXPECT_EQ(p.dp, 1);
  EXPECT_NEAR(p.ulysses_tokens_per_s, tokens / time, tokens / time * 1e-9);
  EXPECT_NEAR(p.ulysses_sync_tokens_per_s, p.ulysses_tokens_per_s, p.ulysses_tokens_per_s * 1e-12);
  EXPECT_DOUBLE_EQ(p.ulysses_efficiency, 1.0);
  // Waiting for every replica at every layer can only cost throughput.
  for (const auto& q : r->dp_scaling) {
    EXPECT_LE(q.ulysses_sync_tokens_per_s, q.ulysses_tokens_per_s * (1 + 1e-12));
    EXPECT_LE(q.libra_sync_tokens_per_s, q.libra_tokens_per_s * (1 + 1e-12));
  }
}

TEST(Simulate, IdenticalResultsForAnyThreadCount) {
  SimConfig cfg = tiny_config();
  cfg.max_windows = 0;  // both windows
  cfg.pool_sizes = {1, 2, 4};
  cfg.head_shards = {1, 2};
  cfg.cost.noise.sigma = 0.05;
  cfg.threads = 1;
  auto one = simulate(cfg);
  cfg.threads = 2;
  auto two = simulate(cfg);
  cfg.threads = 5;
  auto five = simulate(cfg);
  ASSERT_TRUE(one.ok() && two.ok() && five.ok());
  EXPECT_EQ(one->windows, 2);
  EXPECT_EQ(sim_json(*one), sim_json(*two));
  EXPECT_EQ(sim_json(*one), sim_json(*five));
  EXPECT_EQ(sim_csv(*one), sim_csv(*five));
}

TEST(Simulate, SkipsInvalidCandidatesAndSaysWhy) {
  SimConfig cfg = tiny_config();
  cfg.pool_sizes = {2, 3};     // 3 does not divide DP 4
  cfg.block_sizes = {16, 12};  // 12 does not divide L/CP = 32
  auto r = simulate(cfg);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->candidates.size(), 1u);
  ASSERT_EQ(r->skipped.size(), 3u);
  EXPECT_NE(r->skipped[0].reason.find("--block-size 12"), std::string::npos) << r->skipped[0].reason;
  EXPECT_NE(r->skipped[1].reason.find("--pool-size 3: must divide --dp 4"), std::string::npos);
}

TEST(Simulate, ImpossibleConfigurationsNameTheFlag) {
  auto expect_error = [](SimConfig cfg, const std::string& needle) {
    auto r = simulate(cfg);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
  };
  SimConfig c = tiny_config();
  c.pool_sizes = {3};
  expect_error(c, "--pool-size 3: must divide --dp 4");
  c = tiny_config();
  c.head_shards = {3};
  expect_error(c, "--head-shards 3");
  c = tiny_config();
  c.cost.net.inter_node_gbps = 0;
  expect_error(c, "--inter-node-gbps 0");
  c = tiny_config();
  c.gbs = 16;
  c.dp = 4;
  expect_error(c, "shorter than one window of --gbs 16");
  c = tiny_config();
  c.dp = 3;
  expect_error(c, "--dp 3: must divide --gbs 4");
}

TEST(SimReport, WritesDataFilesAndAnIndexPage) {
  auto r = simulate(tiny_config());
  ASSERT_TRUE(r.ok());
  const auto dir = std::filesystem::temp_directory_path() / ("libra_sim_report_" + std::to_string(::getpid())) / "a";
  ASSERT_TRUE(write_sim_report(*r, dir.string()).ok());
  auto index = read_file((dir / "index.md").string());
  ASSERT_TRUE(index.ok());
  EXPECT_NE(index->find("Recommendation:"), std::string::npos);
  auto imb = read_file((dir / "sim-imbalance.dat").string());
  ASSERT_TRUE(imb.ok());
  EXPECT_NE(imb->find("\n2 0.209993 0.430385"), std::string::npos) << *imb;  // hand-computed, see tiny corpus
  EXPECT_TRUE(std::filesystem::exists(dir / "result.json"));
  EXPECT_NE(sim_table(*r).find("P=2 H=2 B=16 *"), std::string::npos);
  std::filesystem::remove_all(dir.parent_path());
  // A path under a regular file cannot become a directory.
  Status bad = write_sim_report(*r, tiny_corpus_path() + "/x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--report"), std::string::npos);
}

TEST(SimConfigJson, AppliesKeysAndRejectsUnknownOnes) {
  SimConfig c;
  ASSERT_TRUE(apply_sim_config_json(R"({"gbs": 64, "pool_sizes": [4, 8], "block_size": 8192,
                                         "inter_node_gbps": 25, "model": "qwen3-30b-a3b", "heads_kv": 8})",
                                    "cfg.json", c)
                  .ok());
  EXPECT_EQ(c.gbs, 64);
  EXPECT_EQ(c.pool_sizes, (std::vector<std::int64_t>{4, 8}));
  EXPECT_EQ(c.block_sizes, (std::vector<std::int64_t>{8192}));
  EXPECT_EQ(c.cost.net.inter_node_gbps, 25);
  EXPECT_EQ(c.model.heads_kv, 8);
  Status bad = apply_sim_config_json(R"({"gbss": 64})", "cfg.json", c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("cfg.json: \"gbss\": unknown key"), std::string::npos);
  EXPECT_FALSE(apply_sim_config_json(R"({"gbs": "x"})", "cfg.json", c).ok());
}

}  // namespace
}  // namespace libra
