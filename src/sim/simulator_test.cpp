#include "libra/simulator.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <thread>
#include <filesystem>
#include <numeric>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/io.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"
#include "sim/internal.hpp"

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
  c.chunks = {2};
  c.max_windows = 1;
  c.threads = 1;
  c.scaling_dp = {1, 2, 4};
  c.cost.noise.sigma = 0;
  return c;
}

// The settings table's entry for JSON key `key`, or nullptr.
const SimSetting* setting_named(std::string_view key) {
  for (const SimSetting& s : sim_settings()) {
    if (s.key == key) return &s;
  }
  return nullptr;
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
    const PlacementMode mode = all_placement_modes()[m];
    EXPECT_EQ(c.inter_imbalance[m].first, mode);
    if (mode == PlacementMode::kRandom) {
      // The mean over seeds 0 .. random_seeds - 1, not one shuffle.
      double sum = 0;
      for (std::uint64_t seed = 0; seed < 32; ++seed) {
        sum += place_window(*f, {.pool_size = 2, .mode = mode, .seed = seed})->imbalance;
      }
      EXPECT_DOUBLE_EQ(c.inter(mode).mean, sum / 32);
      continue;
    }
    auto pl = place_window(*f, {.pool_size = 2, .mode = mode, .seed = 0});
    ASSERT_TRUE(pl.ok());
    EXPECT_DOUBLE_EQ(c.inter(mode).mean, pl->imbalance);
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

// Without thread timing (the CLI's default: --timing off) the run reads no
// thread CPU clock: the same report and plan counts, every seconds figure 0.
TEST(Simulate, ThreadTimingOffChangesOnlyTheSecondsFigures) {
  SimConfig on = tiny_config();
  SimConfig off = on;
  off.thread_timing = false;
  auto a = simulate(on);
  auto b = simulate(off);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(sim_json(*a), sim_json(*b));
  EXPECT_EQ(a->timing.plans, b->timing.plans);
  EXPECT_GT(a->timing.plan_s + a->timing.cost_s, 0.0);
  EXPECT_EQ(b->timing.placement_s, 0.0);
  EXPECT_EQ(b->timing.plan_s, 0.0);
  EXPECT_EQ(b->timing.cost_s, 0.0);
  ASSERT_EQ(a->timing.by_kind.size(), b->timing.by_kind.size());
  for (const auto& [kind, v] : b->timing.by_kind) {
    EXPECT_EQ(v.first, 0.0) << kind;
    EXPECT_EQ(v.second, a->timing.by_kind.at(kind).second) << kind;
  }
}

// libra-plus's figures where the sweep prices libra-tap-vrsp's plans for
// it and where it does not: H = h_kv (the KV dedup changes nothing) and at
// P = 2 VRSP-refine moves nothing, so at tau 0.2, where TAP meets C on both
// pools (3% and 8% over the mean), libra-plus makes no plan of its own; at
// tau 0.03 TAP misses C and tap-split plans afresh. Either way the figures
// are tap-split's with the dedup planned afresh on the VRSP-refine pools.
TEST(Simulate, LibraPlusFromSharedPlansIsWhatTapSplitPlans) {
  for (const auto& [tau, own_plans] : {std::pair{0.2, 0}, std::pair{0.03, 2}}) {
    SimConfig cfg = tiny_config();
    cfg.tau = tau;
    auto r = simulate(cfg);
    ASSERT_TRUE(r.ok()) << r.error().message();
    const CandidateResult& c = r->candidates[0];
    const auto plus = r->timing.by_kind.find("libra-plus");
    EXPECT_EQ(plus == r->timing.by_kind.end() ? 0 : plus->second.second, own_plans) << "tau " << tau;
    const auto window = first_window();
    auto f = sequence_workloads(window);
    ASSERT_TRUE(f.ok());
    auto refine = place_window(*f, {.pool_size = 2, .mode = PlacementMode::kVrspRefine});
    ASSERT_TRUE(refine.ok());
    PlanConfig pc = tiny_plan_config(PlanMode::kTapSplit, 2, 16, 2);
    pc.dedup_per_kv_head = true;
    pc.tau = tau;
    double sum_imb = 0, worst_imb = 0, sum_bytes = 0;
    for (const auto& idx : refine->pools) {
      std::vector<PackedSequence> pool;
      for (auto i : idx) pool.push_back(window[static_cast<std::size_t>(i)]);
      auto plan = make_plan(pool, pc);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      sum_imb += plan->imbalance();
      worst_imb = std::max(worst_imb, plan->imbalance());
      sum_bytes += static_cast<double>(plan->comm_bytes());
    }
    const double pools = static_cast<double>(refine->pools.size());
    EXPECT_DOUBLE_EQ(c.intra_imbalance_plus.mean, sum_imb / pools) << "tau " << tau;
    EXPECT_DOUBLE_EQ(c.intra_imbalance_plus.worst, worst_imb) << "tau " << tau;
    EXPECT_DOUBLE_EQ(c.comm_bytes_plus.mean, sum_bytes / pools) << "tau " << tau;
    EXPECT_GT(c.comm_bytes_plus.mean, 0);
  }
}

// The end-to-end phase takes libra-topo's times from the sweep where the
// recommended candidate runs pools of a swept P (CandWindow::topo_at_dp),
// and ulysses' prices from the ulysses baseline: every figure as planning
// afresh gives, bit for bit, with fewer plans. With PXN, pools priced on
// GPUs 2, 3 (half a node) are not taken for GPUs 0, 1 (same_price_gpus):
// libra-topo's P = 1 and ulysses are planned afresh.
TEST(Simulate, EndToEndTakesSweptTopoTimesAsPlanningAfreshGives) {
  for (const auto& [pxn, planned] : {std::pair{false, 0}, std::pair{true, 4}}) {
    SimConfig cfg = tiny_config();
    cfg.pool_sizes = {1, 2, 4};
    cfg.chunks = {1, 2};
    cfg.cost.noise.sigma = 0.05;  // every GPU and GA step its own factor
    cfg.cost.net.gpus_per_node = 4;  // P = 4 spans two nodes
    cfg.cost.net.pxn = pxn;
    detail::Ctx ctx{cfg, cfg.seq_len, ThroughputTable(cfg.cost.kernel), {}, {}};
    for (std::int64_t p : cfg.pool_sizes) {
      ctx.candidates.push_back({.pool_size = p, .head_shards = 2, .block_size = 16});
      ctx.chunks.push_back({1, 2});
    }
    const auto window = first_window();
    const detail::WindowResult wr = detail::simulate_window(ctx, window, 0);
    ASSERT_TRUE(wr.status.ok()) << wr.status.message();
    detail::SweptTopo swept;
    for (std::size_t ci = 0; ci < ctx.candidates.size(); ++ci) {
      const auto& t = wr.cand[ci].topo_at_dp;
      ASSERT_TRUE(t.has_value());
      EXPECT_EQ(t->chunks, 2);
      EXPECT_TRUE(t->relayed);
      swept.emplace(ctx.candidates[ci].pool_size, &*t);
    }
    const std::vector<std::int64_t> dps = detail::end_to_end_dps(cfg);
    const SimCandidate& rec = ctx.candidates.back();  // P = 4: P 1, 2 and 4 at DP 1, 2 and 4
    const detail::E2eWindow fresh =
        detail::e2e_window(ctx, window, 0, rec, dps, Variant::kLibraTopo, 2, true, ChunkSplit::kEqual);
    ASSERT_EQ(wr.ulysses_costs.size(), window.size());
    const detail::E2eWindow taken = detail::e2e_window(ctx, window, 0, rec, dps, Variant::kLibraTopo, 2, true,
                                                       ChunkSplit::kEqual, swept, &wr.ulysses_costs);
    ASSERT_TRUE(fresh.status.ok() && taken.status.ok());
    auto plans = [](const detail::E2eWindow& e, const std::string& kind) {
      const auto it = e.timing.by_kind.find(kind);
      return it == e.timing.by_kind.end() ? std::int64_t{0} : it->second.second;
    };
    EXPECT_EQ(plans(fresh, "end-to-end libra"), 7) << "pxn " << pxn;  // 4 + 2 + 1 pools
    EXPECT_EQ(plans(taken, "end-to-end libra"), planned) << "pxn " << pxn;
    EXPECT_EQ(plans(fresh, "end-to-end ulysses"), 4) << "pxn " << pxn;
    EXPECT_EQ(plans(taken, "end-to-end ulysses"), planned) << "pxn " << pxn;
    ASSERT_EQ(fresh.steps.size(), dps.size());
    ASSERT_EQ(taken.steps.size(), dps.size());
    for (std::size_t k = 0; k < dps.size(); ++k) {
      ASSERT_EQ(fresh.steps[k].size(), taken.steps[k].size());
      for (std::size_t c = 0; c < fresh.steps[k].size(); ++c) {
        EXPECT_EQ(fresh.steps[k][c].libra, taken.steps[k][c].libra) << "DP " << dps[k] << " pxn " << pxn;
        EXPECT_EQ(fresh.steps[k][c].ulysses, taken.steps[k][c].ulysses) << "DP " << dps[k] << " pxn " << pxn;
      }
    }
    EXPECT_EQ(fresh.mb_libra, taken.mb_libra) << "pxn " << pxn;
    EXPECT_EQ(fresh.mb_libra.size(), window.size());
    EXPECT_EQ(fresh.mb_ulysses, taken.mb_ulysses) << "pxn " << pxn;
  }
}

TEST(Simulate, LatencyWithFreeCommunicationIsTheSlowestWorkersCompute) {
  SimConfig cfg = tiny_config();
  cfg.cost.net.intra_node_gbps = 1e15;  // communication costs (almost) nothing
  cfg.cost.net.inter_node_gbps = 1e15;
  cfg.cost.net.inter_supernode_gbps = 1e15;
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
  const auto* v = r->candidates[0].find(Variant::kLibraTapVrsp);
  ASSERT_NE(v, nullptr);
  EXPECT_NEAR(v->seconds.mean, libra, libra * 1e-9);
}

TEST(Simulate, EndToEndAtDp1IsTheSumOfMicrobatchesHandComputed) {
  SimConfig cfg = tiny_config();
  cfg.pp = 1;  // one stage: the 1F1B schedule is the micro-batches back to back
  cfg.cost.net.intra_node_gbps = 1e15;
  cfg.cost.net.inter_node_gbps = 1e15;
  cfg.cost.net.inter_supernode_gbps = 1e15;
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
  EXPECT_DOUBLE_EQ(p.ulysses_efficiency, 1.0);
  // Waiting for every replica at every micro-batch can only cost
  // throughput; at DP 1 there is no one to wait for.
  for (const auto& q : r->dp_scaling) {
    ASSERT_EQ(q.couplings.size(), 2u);  // none, all
    const CouplingPoint& none = q.couplings[0];
    const CouplingPoint& all = q.couplings[1];
    EXPECT_EQ(none.coupling, 1);
    EXPECT_EQ(all.coupling, 0);
    EXPECT_LE(all.ulysses_tokens_per_s, none.ulysses_tokens_per_s * (1 + 1e-12));
    EXPECT_LE(all.libra_tokens_per_s, none.libra_tokens_per_s * (1 + 1e-12));
    if (q.dp == 1) {
      EXPECT_EQ(all.ulysses_tokens_per_s, none.ulysses_tokens_per_s);
    }
  }
  // The configured coupling (all, the default) is the point's own figure.
  EXPECT_EQ(r->dp_scaling.back().ulysses_tokens_per_s, r->dp_scaling.back().couplings[1].ulysses_tokens_per_s);
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

TEST(Recommend, WorstWeightTradesMeanForTheWorstStep) {
  SimConfig cfg = tiny_config();
  cfg.max_windows = 0;
  cfg.pool_sizes = {1, 2, 4};
  cfg.head_shards = {1, 2};
  cfg.cost.noise.sigma = 0.05;
  cfg.end_to_end = false;
  auto argmin = [](const SimResult& r, double w) {
    std::size_t best = 0;
    auto score = [&](std::size_t i) {
      const Stat& s = r.candidates[i].find(Variant::kLibraFull)->seconds;
      return s.mean + w * s.worst;
    };
    for (std::size_t i = 1; i < r.candidates.size(); ++i) {
      if (score(i) < score(best)) best = i;
    }
    return static_cast<std::int64_t>(best);
  };
  for (double w : {0.0, 1.0, 1e6}) {
    cfg.worst_weight = w;
    auto r = simulate(cfg);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->recommended, argmin(*r, w)) << w;
    if (w > 0) {
      EXPECT_NE(r->recommendation_reason.find("x worst"), std::string::npos);
    }
  }
  cfg.worst_weight = -1;
  EXPECT_FALSE(simulate(cfg).ok());
}

// By the mean alone, a winner whose worst step is over 10% above the
// runner-up's is flagged, with the flag that weighs the worst step in; within
// 10%, or with a worst weight, nothing is added.
TEST(Recommend, FlagsAMeanWinnerWithAMuchWorseWorstStep) {
  auto result = [](double worst0, double worst1, double ww) {
    SimResult r;
    r.config.worst_weight = ww;
    r.config.chunks = {2};
    r.ulysses = {1.0, 1.0};
    for (double worst : {worst0, worst1}) {
      CandidateResult c;
      c.candidate = {.pool_size = 8, .head_shards = 8, .block_size = 8192};
      for (PlacementMode m : all_placement_modes()) c.inter_imbalance.emplace_back(m, Stat{});
      c.latency.push_back({Variant::kLibraFull, {0.100 + 0.001 * static_cast<double>(r.candidates.size()), worst}, 2, {}});
      r.candidates.push_back(c);
    }
    detail::recommend(r);
    return r;
  };
  const SimResult flagged = result(0.150, 0.120, 0);
  EXPECT_EQ(flagged.recommended, 0);
  EXPECT_NE(flagged.recommendation_reason.find("; its worst step is 25% above the runner-up's (--worst-weight W"),
            std::string::npos)
      << flagged.recommendation_reason;
  EXPECT_EQ(result(0.130, 0.120, 0).recommendation_reason.find("worst step is"), std::string::npos);
  EXPECT_EQ(result(0.150, 0.120, 1e-9).recommendation_reason.find("worst step is"), std::string::npos);
}

// The recommendation and the end-to-end model of a list of M run the chosen
// M: as the single-M run at that M does.
static void expect_end_to_end_runs_the_chosen_m(const SimResult& r, const std::map<std::int64_t, SimResult>& single) {
  const CandidateResult& rec = r.candidates[static_cast<std::size_t>(r.recommended)];
  EXPECT_EQ(r.end_to_end_chunks, rec.find(r.end_to_end_variant)->chunks);
  const SimResult& at = single.at(r.end_to_end_chunks);
  ASSERT_EQ(r.dp_scaling.size(), at.dp_scaling.size());
  if (at.recommended >= 0 && at.candidates[static_cast<std::size_t>(at.recommended)].candidate == rec.candidate &&
      at.end_to_end_variant == r.end_to_end_variant) {
    for (std::size_t i = 0; i < at.dp_scaling.size(); ++i) {
      EXPECT_EQ(r.dp_scaling[i].libra_tokens_per_s, at.dp_scaling[i].libra_tokens_per_s);
    }
  }
  if (variant_pipelined(r.end_to_end_variant) && r.recommended_variant != Variant::kUlysses) {
    EXPECT_NE(r.recommendation_reason.find("at M = " + std::to_string(r.end_to_end_chunks)), std::string::npos)
        << r.recommendation_reason;
  }
}

// JSON: the chosen and every priced M per candidate; one M (one_m) keeps the
// old form.
static void expect_json_reports_every_priced_m(const SimResult& r, const std::vector<std::int64_t>& list,
                                               const SimResult& one_m) {
  const auto j = nlohmann::json::parse(sim_json(r));
  EXPECT_EQ(j["config"]["chunks"], nlohmann::json(list));
  EXPECT_EQ(j["end_to_end_chunks"], r.end_to_end_chunks);
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& e = j["candidates"][i];
    for (Variant v : candidate_variants()) {
      const VariantLatency* l = r.candidates[i].find(v);
      const std::string name(variant_name(v));
      if (!variant_pipelined(v)) {
        EXPECT_FALSE(e["chunks"].contains(name));
        continue;
      }
      EXPECT_EQ(e["chunks"][name], l->chunks);
      EXPECT_EQ(e["latency_by_chunks"][name].size(), l->by_chunks.size());
      EXPECT_EQ(e["latency_by_chunks"][name][std::to_string(l->chunks)]["mean"].get<double>(), l->seconds.mean);
    }
  }
  EXPECT_EQ(j["skipped"][0]["chunks"], 4);
  const auto one = nlohmann::json::parse(sim_json(one_m));
  EXPECT_EQ(one["config"]["chunks"], 2);
  EXPECT_FALSE(one.contains("end_to_end_chunks"));
  EXPECT_FALSE(one["candidates"][0].contains("chunks"));
  EXPECT_FALSE(one["candidates"][0].contains("latency_by_chunks"));
}

// The independent path: one run per M. A list of M must report, per
// candidate and pipelined variant, exactly the single-M runs' latencies and
// keep the M with the least mean + W x worst (ties: the earlier listed).
TEST(Recommend, ChosenMIsTheArgminOfSeparateSingleMRuns) {
  SimConfig cfg = tiny_config();
  cfg.max_windows = 0;
  cfg.pool_sizes = {1, 2, 4};
  cfg.head_shards = {1, 2};  // h_q 4: H = 1 takes M 1, 2, 4; H = 2 only 1, 2
  cfg.cost.noise.sigma = 0.05;
  cfg.scaling_dp = {2, 4};
  const std::vector<std::int64_t> list = {4, 1, 2};
  for (double w : {0.0, 1.0}) {
    cfg.worst_weight = w;
    std::map<std::int64_t, SimResult> single;
    for (std::int64_t m : list) {
      cfg.chunks = {m};
      auto r = simulate(cfg);
      ASSERT_TRUE(r.ok()) << r.error().message();
      single.emplace(m, std::move(*r));
    }
    cfg.chunks = list;
    auto r = simulate(cfg);
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_EQ(r->candidates.size(), 6u);
    ASSERT_EQ(single.at(1).candidates.size(), 6u);
    ASSERT_EQ(single.at(4).candidates.size(), 3u);  // H = 2 cannot take M = 4
    // M = 4 is skipped for the three H = 2 candidates only.
    ASSERT_EQ(r->skipped.size(), 3u);
    for (const auto& sk : r->skipped) {
      EXPECT_EQ(sk.candidate.head_shards, 2);
      EXPECT_EQ(sk.chunks, 4);
      EXPECT_NE(sk.reason.find("chunks 4 must divide heads_q / head_shards = 2"), std::string::npos) << sk.reason;
    }
    auto single_lat = [&](std::int64_t m, const SimCandidate& c, Variant v) -> const Stat* {
      for (const auto& k : single.at(m).candidates) {
        if (k.candidate == c) return &k.find(v)->seconds;
      }
      return nullptr;
    };
    int differ = 0;
    for (const auto& k : r->candidates) {
      for (Variant v : candidate_variants()) {
        const VariantLatency* l = k.find(v);
        ASSERT_NE(l, nullptr);
        if (!variant_pipelined(v)) {
          EXPECT_EQ(l->chunks, 1);
          EXPECT_EQ(l->seconds.mean, single_lat(1, k.candidate, v)->mean);
          EXPECT_EQ(l->seconds.worst, single_lat(1, k.candidate, v)->worst);
          continue;
        }
        std::int64_t best = 0;
        double best_score = 0;
        std::size_t priced = 0;
        for (std::int64_t m : list) {
          const Stat* s = single_lat(m, k.candidate, v);
          if (s == nullptr) continue;  // this M does not divide h_q / H
          const double sc = s->mean + w * s->worst;
          if (best == 0 || sc < best_score) {
            best = m;
            best_score = sc;
          }
          ASSERT_LT(priced, l->by_chunks.size());
          EXPECT_EQ(l->by_chunks[priced].first, m);
          EXPECT_EQ(l->by_chunks[priced].second.mean, s->mean) << variant_name(v) << " M=" << m;
          EXPECT_EQ(l->by_chunks[priced].second.worst, s->worst) << variant_name(v) << " M=" << m;
          ++priced;
        }
        EXPECT_EQ(priced, l->by_chunks.size());
        EXPECT_EQ(l->chunks, best) << detail::cand_name(k.candidate) << " " << variant_name(v);
        EXPECT_EQ(l->seconds.mean, single_lat(best, k.candidate, v)->mean);
        if (best != list.front()) ++differ;
      }
    }
    EXPECT_GT(differ, 0) << "every variant kept the first M: the choice is not exercised";
    expect_end_to_end_runs_the_chosen_m(*r, single);
    expect_json_reports_every_priced_m(*r, list, single.at(2));
  }
}

TEST(SimSettings, ChunksTakeAListAndRejectBadValues) {
  SimConfig c = tiny_config();
  ASSERT_TRUE(apply_sim_config_json(R"({"chunks": [1, 2]})", "c.json", c).ok());
  EXPECT_EQ(c.chunks, (std::vector<std::int64_t>{1, 2}));
  ASSERT_TRUE(apply_sim_config_json(R"({"chunks": 2})", "c.json", c).ok());
  EXPECT_EQ(c.chunks, (std::vector<std::int64_t>{2}));
  // One M is written back as a number, as before lists were accepted.
  EXPECT_NE(sim_config_json(c).find("\"chunks\": 2,"), std::string::npos);
  Status empty = apply_sim_config_json(R"({"chunks": []})", "c.json", c);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("\"chunks\": must be an integer or a non-empty array"), std::string::npos);
  auto expect_error = [](SimConfig cfg, const std::string& needle) {
    auto r = simulate(cfg);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
  };
  c = tiny_config();
  c.chunks = {2, 0};
  expect_error(c, "--chunks 0: must be at least 1");
  c.chunks = {2, 4294967298};
  expect_error(c, "--chunks 4294967298: must be at most 2147483647");
  c.chunks = {3, 4};  // neither divides h_q / H = 2: nothing runs
  expect_error(c, "--head-shards 2 --block-size 16: plan config: chunks 3 must divide heads_q / head_shards = 2");
  c.chunks = {2, 2};  // repeats count once
  auto r = simulate(c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.chunks, (std::vector<std::int64_t>{2}));
}

TEST(SimSettings, HomeLayoutIsAutoZigzagOrContiguousForLibraTopoOnly) {
  // auto: zigzag where B divides L / 2CP (64 / 4 = 16), else contiguous.
  SimConfig c = tiny_config();
  c.block_sizes = {16, 32};
  auto aut = simulate(c);
  ASSERT_TRUE(aut.ok()) << aut.error().message();
  ASSERT_EQ(aut->candidates.size(), 2u);
  EXPECT_EQ(aut->candidates[0].home_layout_topo, HomeLayout::kZigzag);
  EXPECT_EQ(aut->candidates[1].home_layout_topo, HomeLayout::kContiguous);
  // The layout is libra-topo's alone: every other variant prices the same.
  c.home_layout = HomeLayout::kContiguous;
  auto contiguous = simulate(c);
  ASSERT_TRUE(contiguous.ok());
  EXPECT_EQ(contiguous->candidates[0].home_layout_topo, HomeLayout::kContiguous);
  for (Variant v : candidate_variants()) {
    if (v == Variant::kLibraTopo) continue;
    const VariantLatency* a = aut->candidates[0].find(v);
    const VariantLatency* b = contiguous->candidates[0].find(v);
    ASSERT_TRUE(a && b) << variant_name(v);
    EXPECT_EQ(a->seconds.mean, b->seconds.mean) << variant_name(v);
  }
  // An explicit zigzag skips the candidate it does not fit, and says why.
  c.home_layout = HomeLayout::kZigzag;
  auto zigzag = simulate(c);
  ASSERT_TRUE(zigzag.ok()) << zigzag.error().message();
  ASSERT_EQ(zigzag->candidates.size(), 1u);
  ASSERT_EQ(zigzag->skipped.size(), 1u);
  EXPECT_EQ(zigzag->skipped[0].reason,
            "--head-shards 2 --block-size 32: plan config: home_layout zigzag: seq_len / (2 cp) = 16 must be "
            "divisible by block_size 32");
  // Settings: auto, zigzag, contiguous; anything else names the value.
  const SimSetting* st = setting_named("home_layout");
  ASSERT_NE(st, nullptr);
  SimConfig d;
  EXPECT_NE(sim_config_json(d).find("\"home_layout\": \"auto\""), std::string::npos);
  ASSERT_TRUE(apply_sim_setting(*st, "zigzag", "--home-layout", d).ok());
  EXPECT_EQ(d.home_layout, HomeLayout::kZigzag);
  ASSERT_TRUE(apply_sim_config_json(R"({"home_layout": "auto"})", "c.json", d).ok());
  EXPECT_FALSE(d.home_layout.has_value());
  Status bad = apply_sim_setting(*st, "striped", "--home-layout", d);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), "--home-layout 'striped': must be auto, zigzag or contiguous");
}

TEST(Variants, NameTableRoundTrips) {
  std::set<std::string_view> names;
  for (Variant v : all_variants()) {
    const std::string_view n = variant_name(v);
    EXPECT_TRUE(names.insert(n).second) << n;
    auto back = parse_variant(n);
    ASSERT_TRUE(back.ok()) << n;
    EXPECT_EQ(*back, v);
  }
  EXPECT_EQ(names.size(), 8u);
  EXPECT_FALSE(parse_variant("libra-ful").ok());
  // Every candidate variant is timed and found by enum.
  auto r = simulate(tiny_config());
  ASSERT_TRUE(r.ok());
  for (Variant v : candidate_variants()) EXPECT_NE(r->candidates[0].find(v), nullptr) << variant_name(v);
}

TEST(SimSettings, EveryJsonKeyIsAFlagAndBack) {
  std::set<std::string> keys, flags;
  for (const SimSetting& st : sim_settings()) {
    std::string flag = "--" + std::string(st.key);
    std::replace(flag.begin(), flag.end(), '_', '-');
    EXPECT_EQ(st.flag, flag) << st.key;  // the flag <-> key rule, both ways
    EXPECT_TRUE(keys.insert(std::string(st.key)).second);
    EXPECT_TRUE(flags.insert(std::string(st.flag)).second);
    EXPECT_FALSE(st.help.empty());
  }
  // The effective-config dump has exactly the schema's keys (but the
  // profile path and dtype, which it writes as their effect) and applies back.
  SimConfig c;
  c.gbs = 64;
  c.pool_sizes = {4, 8};
  c.cost.net.inter_supernode_gbps = 7;
  c.worst_weight = 0.5;
  const std::string dumped = sim_config_json(c);
  SimConfig back;
  ASSERT_TRUE(apply_sim_config_json(dumped, "dump.json", back).ok()) << dumped;
  EXPECT_EQ(sim_config_json(back), dumped);
  EXPECT_EQ(back.pool_sizes, c.pool_sizes);
  EXPECT_EQ(back.cost.net.inter_supernode_gbps, 7);
  auto j = nlohmann::json::parse(dumped);
  for (const SimSetting& st : sim_settings()) {
    if (st.key == "kernel_profile" || st.key == "dtype") continue;
    EXPECT_TRUE(j.contains(std::string(st.key))) << st.key;
  }
  EXPECT_EQ(j.size() + 2, sim_settings().size());
}

TEST(SimSettings, FlagTextAndJsonGiveTheSameConfig) {
  const SimConfig defaults;
  const std::string default_json = sim_config_json(defaults);
  for (const SimSetting& st : sim_settings()) {
    std::string text, json;
    switch (st.type) {
      case SettingType::kInt: text = json = "3"; break;
      case SettingType::kUint: text = json = "5"; break;
      case SettingType::kNumber: text = json = "2.5"; break;
      case SettingType::kIntList: text = "2,4"; json = "[2,4]"; break;
      case SettingType::kBool:  // the opposite of the default
        text = json = nlohmann::json::parse(default_json)[std::string(st.key)].get<bool>() ? "false" : "true";
        break;
      case SettingType::kString: continue;  // presets and paths: covered by the CLI tests
    }
    SimConfig a, b;
    ASSERT_TRUE(apply_sim_setting(st, text, std::string(st.flag), a).ok()) << st.flag;
    ASSERT_TRUE(apply_sim_config_json("{\"" + std::string(st.key) + "\":" + json + "}", "c.json", b).ok()) << st.key;
    EXPECT_EQ(sim_config_json(a), sim_config_json(b)) << st.key;
    EXPECT_NE(sim_config_json(a), default_json) << st.key << " changed nothing";
  }
  SimConfig c;
  const SimSetting& gbs = sim_settings()[4];
  ASSERT_EQ(gbs.key, "gbs");
  Status big = apply_sim_setting(gbs, "4294967298x", "--gbs", c);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.message(), "--gbs: '4294967298x' is not a decimal integer (digits only, an optional '-'; no '+' or 0x)");
  Status huge = apply_sim_setting(gbs, "99999999999999999999", "--gbs", c);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.message().find("--gbs: 99999999999999999999 is out of range"), std::string::npos);
  EXPECT_TRUE(apply_sim_setting(gbs, "064", "--gbs", c).ok());  // decimal, never octal
  EXPECT_EQ(c.gbs, 64);
}

TEST(Simulate, ValuesTheShapeNarrowsToIntAreCheckedFirst) {
  SimConfig c = tiny_config();
  c.head_shards = {4294967298};  // would narrow to 2, a valid H
  auto r = simulate(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("--head-shards 4294967298"), std::string::npos) << r.error().message();
  c = tiny_config();
  c.chunks = {4294967298};
  r = simulate(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("--chunks 4294967298: must be at most 2147483647"), std::string::npos);
}

TEST(Simulate, PureOverSequencesAndLoadedThroughTheCorpusReader) {
  SimConfig cfg = tiny_config();
  auto in = load_sim_input(cfg);
  ASSERT_TRUE(in.ok()) << in.error().message();
  EXPECT_EQ(in->sequences, kTiny);
  auto a = simulate(in->sequences, in->seq_len, cfg);
  auto b = simulate(cfg);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(sim_json(*a), sim_json(*b));
}

TEST(SimTiming, ThreadCpuTimeDoesNotCountWaiting) {
  const double cpu0 = detail::thread_cpu_seconds(), wall0 = detail::wall_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(detail::thread_cpu_seconds() - cpu0, 0.05);
  EXPECT_GE(detail::wall_seconds() - wall0, 0.19);
}

// Calibration targets of the builtin corpora (docs/corpora.md): the paper's
// random-grouping R-1 at P = 8 and 64 (figure 4) and VRSP's R-1 at P = 8
// (figure 8), GBS 128, over every full window, 32 seeded groupings each.
// Tolerances: random P = 8 within 25%, P = 64 within 15%, VRSP within a
// factor 1.6 (what one tail index can fit; docs/corpora.md gives the misses).
TEST(CorpusCalibration, BuiltinsMatchThePapersInterPoolFigures) {
  // Targets: figure 4 (random grouping, GBS 128) and figure 8 (VRSP), the
  // paper's numbers. Tolerances (docs/corpora.md, "Calibration"): 10% on
  // every statistic, except random R-1 at P = 8 on 256K, which the
  // two-parameter tail misses by 12-13% (the fit's best; 15% asserted).
  struct Target {
    const char* source;
    double random8, random64, vrsp8;
    double tol_random8;
  };
  for (const Target& t : {Target{"builtin:paper-1m", 0.90, 0.08, 0.0066, 0.10},
                          Target{"builtin:paper-256k", 1.08, 0.09, 0.0050, 0.15}}) {
    SimConfig cfg;
    cfg.source = t.source;
    auto in = load_sim_input(cfg);
    ASSERT_TRUE(in.ok());
    const std::vector<std::int64_t> ps = {8, 64};
    auto st = calibration_stats(in->sequences, 128, ps, 32);
    ASSERT_TRUE(st.ok()) << st.error().message();
    EXPECT_GE(st->windows, 32) << t.source;
    EXPECT_NEAR(st->random[0].second, t.random8, t.tol_random8 * t.random8) << t.source;
    EXPECT_NEAR(st->random[1].second, t.random64, 0.10 * t.random64) << t.source;
    EXPECT_NEAR(st->vrsp[0].second, t.vrsp8, 0.10 * t.vrsp8) << t.source;
  }
  // The v1 corpora keep their old statistics (VRSP at its lower bound).
  SimConfig v1;
  v1.source = "builtin:paper-1m-v1";
  auto in = load_sim_input(v1);
  ASSERT_TRUE(in.ok());
  const std::vector<std::int64_t> p8 = {8};
  auto st = calibration_stats(in->sequences, 128, p8, 4);
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->vrsp[0].second, 0.08);
}

// The default topology reproduces the paper's figure-14 growth of
// communication time with P on 256K (0.07, 0.17, 0.47, 0.77 at P = 4, 8, 16,
// 32: ratios 2.43, 6.71, 11.0 to P = 4), within 10%: the busiest worker's
// forward dispatch + return on VRSP pools (docs/simulator.md).
TEST(TopologyCalibration, CommunicationGrowsWithPAsInFigure14) {
  SimConfig cfg;
  ASSERT_TRUE(apply_sim_config_json(R"({"source": "builtin:paper-256k", "seq_len": 262144, "heads_kv": 16, "cp": 4,
      "dp": 32, "pool_size": [4, 8, 16, 32], "head_shards": 8, "block_size": 16384, "windows": 2,
      "end_to_end": false, "distca_max_gpus": 1, "chunks": 4})", "fig14.json", cfg).ok());
  auto r = simulate(cfg);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->candidates.size(), 4u);
  const double base = r->candidates[0].comm_seconds.mean;
  const double want[] = {0.17 / 0.07, 0.47 / 0.07, 0.77 / 0.07};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(r->candidates[static_cast<std::size_t>(i + 1)].comm_seconds.mean / base, want[i], 0.1 * want[i])
        << "P=" << r->candidates[static_cast<std::size_t>(i + 1)].candidate.pool_size;
  }
}


// A change detector for refactors (issue 38): the JSON reports of small
// configurations covering every variant, shape and the step model, hashed
// (FNV-1a). Refactors must leave them bitwise the same; update the hashes
// only with an intended model change, and say so in the commit.
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

TEST(Simulate, ReportsHashTheSameAcrossRefactors) {
  SimConfig a = tiny_config();
  a.source = "tiny";
  a.max_windows = 0;
  a.pool_sizes = {1, 2, 4};
  a.head_shards = {1, 2};
  a.chunks = {1, 2, 4};
  a.cost.noise.sigma = 0.05;
  SimConfig b = a;  // one stage, uncoupled, a span; a zero-latency flat network, relays forced
  b.pp = 1;
  b.coupling = 2;
  b.relay = true;
  b.chunk_split = ChunkSplit::kTapered;
  b.cost.net.inter_node_gbps = 360;
  b.cost.net.latency_us = 0;
  SimConfig c = a;  // attention score, no end-to-end
  c.end_to_end = false;
  c.worst_weight = 0.5;
  c.kv_prefix = false;
  const std::map<std::string, std::uint64_t> want = {
      {"a", 6729384003883118878ull}, {"b", 632710347079578431ull}, {"c", 14137921968166627186ull}};
  for (const auto& [name, cfg] : std::map<std::string, SimConfig>{{"a", a}, {"b", b}, {"c", c}}) {
    auto r = simulate(kTiny, 64, cfg);
    ASSERT_TRUE(r.ok()) << name << ": " << r.error().message();
    EXPECT_EQ(fnv1a(sim_json(*r)), want.at(name)) << name;
  }
}

}  // namespace
}  // namespace libra

// ---- issue 20: the simulator prices what the executor sends -------------

#include "libra/schedule.hpp"
#include "sim/internal.hpp"

namespace {

// The executor's own byte counts (libra::make_rank_schedule, independent of
// the simulator): per phase and chunk, what every worker sends every peer.
// relay: of relayed schedules; stage: their stage exchange of the pass of
// `phase` instead of the phase's own.
std::vector<std::vector<std::int64_t>> schedule_bytes(const libra::Plan& plan, libra::Phase phase, bool relay = false,
                                                      bool stage = false) {
  const int W = plan.num_workers();
  const int M = plan.config().chunks;
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(M),
                                             std::vector<std::int64_t>(static_cast<std::size_t>(W * W), 0));
  for (int r = 0; r < W; ++r) {
    auto s = libra::make_rank_schedule(plan, r, {.relay = relay});
    EXPECT_TRUE(s.ok()) << s.error().message();
    for (int m = 0; m < M; ++m) {
      const libra::Pass pass = phase == libra::Phase::kFwdIn ? libra::Pass::kForward : libra::Pass::kBackward;
      const libra::Exchange& x = stage ? s->stage_exchange(pass, m) : s->exchange(phase, m);
      for (int peer = 0; peer < W; ++peer) {
        if (peer != r) out[static_cast<std::size_t>(m)][static_cast<std::size_t>(r * W + peer)] = x.send_bytes[static_cast<std::size_t>(peer)];
      }
    }
  }
  return out;
}

// The pricing tests' pool shape: GQA with H > h_kv, bf16, nodes of two GPUs.
libra::PlanConfig priced_config(libra::PlanMode mode, libra::HomeLayout layout, bool kv_prefix, int chunks) {
  libra::PlanConfig c;
  c.home_layout = layout;
  c.kv_prefix = kv_prefix;
  c.seq_len = 256;
  c.cp = 2;
  c.block_size = 32;
  c.head_shards = 4;
  c.shape = {.heads_q = 16, .heads_kv = 2, .head_dim = 8, .dtype = libra::DType::kBF16};
  c.chunks = chunks;
  c.mode = mode;
  c.topology.gpus_per_node = 2;
  return c;
}

// The PlanCost tests' setting: a pool of mixed lengths on 4 workers (P 2,
// CP 2) in nodes of two GPUs and supernodes of two nodes, and each mode's
// plan at M = chunks as the sweep configures it (tap-topo: zigzag homes and
// kv_prefix; tap-split: dedup per KV head).
struct PricedPool {
  std::vector<libra::PackedSequence> pool = {
      {256}, {128, 100, 28}, std::vector<std::int64_t>(8, 32), {30, 100, 90, 36}};
  libra::SimConfig cfg = two_gpu_nodes();
  libra::detail::Ctx ctx{cfg, 256, libra::ThroughputTable(cfg.cost.kernel), {}, {}};
  std::vector<std::int64_t> gpus = libra::detail::pool_gpus(0, 4, 2);

  static libra::SimConfig two_gpu_nodes() {
    libra::SimConfig c;
    c.cost.net.gpus_per_node = 2;
    c.cost.net.nodes_per_supernode = 2;
    return c;
  }
  libra::Result<libra::Plan> plan(libra::PlanMode mode, int chunks) const {
    const bool topo = mode == libra::PlanMode::kTapTopo;
    libra::PlanConfig pc =
        priced_config(mode, topo ? libra::HomeLayout::kZigzag : libra::HomeLayout::kContiguous, topo, chunks);
    pc.dedup_per_kv_head = mode == libra::PlanMode::kTapSplit;
    return libra::make_plan(pool, pc);
  }
};

}  // namespace

TEST(PlanCost, PricesTheBytesTheExecutorSends) {
  // GQA with H > h_kv (shards share a KV head: dK/dV go home once), bf16
  // (LSE, dQ, dK/dV travel in fp32), M = 2 and 4, tap and tap-topo.
  const std::vector<libra::PackedSequence> pool = {{200, 40, 16}, {60, 60, 60, 76}, {256}, {30, 100, 90}};
  // tap-topo also as libra-topo runs it: zigzag homes, KV causal prefix.
  struct Priced {
    libra::PlanMode mode;
    libra::HomeLayout layout;
    bool kv_prefix;
  };
  for (const auto& [mode, layout, kv_prefix] :
       {Priced{libra::PlanMode::kTap, libra::HomeLayout::kContiguous, false},
        Priced{libra::PlanMode::kTapTopo, libra::HomeLayout::kContiguous, false},
        Priced{libra::PlanMode::kTapTopo, libra::HomeLayout::kZigzag, true}}) {
    for (int chunks : {1, 2, 4}) {
      auto plan = libra::make_plan(pool, priced_config(mode, layout, kv_prefix, chunks));
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const libra::detail::PhaseBytes pb = libra::detail::phase_bytes(*plan);
      const std::pair<libra::Phase, const std::vector<std::vector<std::int64_t>>*> phases[] = {
          {libra::Phase::kFwdIn, &pb.fwd_in},
          {libra::Phase::kFwdOut, &pb.fwd_out},
          {libra::Phase::kBwdIn, &pb.bwd_in},
          {libra::Phase::kBwdOut, &pb.bwd_out}};
      for (const auto& [phase, priced] : phases) {
        const auto sent = schedule_bytes(*plan, phase);
        for (int m = 0; m < chunks; ++m) {
          EXPECT_EQ((*priced)[static_cast<std::size_t>(m)], sent[static_cast<std::size_t>(m)])
              << libra::plan_mode_name(mode) << " " << libra::home_layout_name(layout) << " prefix " << kv_prefix
              << " M=" << chunks << " phase " << static_cast<int>(phase) << " chunk " << m;
        }
        if (chunks > 1) {
          std::vector<std::int64_t> sum(sent[0].size(), 0);
          for (const auto& v : sent) {
            for (std::size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
          }
          EXPECT_EQ(priced->back(), sum);
        }
      }
    }
  }
}

// Relayed: the relay's row carries the pair's inputs, the stage matrices the
// sender-to-relay bytes, each exactly what relayed schedules send; outputs
// as without relays. A relayed dispatch is its stage's slowest worker plus
// the main exchange.
TEST(PlanCost, PricesTheBytesARelayedExecutorSends) {
  // Slot 0's one long sample overloads node 0's senders, so every M relays.
  const std::vector<libra::PackedSequence> pool = {
      {256}, {128, 128}, std::vector<std::int64_t>(8, 32), std::vector<std::int64_t>(16, 16)};
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapTopo}) {
    for (int chunks : {1, 2, 4}) {
      const bool topo = mode == libra::PlanMode::kTapTopo;
      auto plan = libra::make_plan(
          pool, priced_config(mode, topo ? libra::HomeLayout::kZigzag : libra::HomeLayout::kContiguous, topo, chunks));
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const libra::RelayTable relays = libra::plan_relays(*plan);
      ASSERT_TRUE(relays.any()) << "nothing relayed: the test would prove nothing";
      const libra::detail::PhaseBytes pb = libra::detail::phase_bytes(*plan, &relays);
      struct Check {
        libra::Phase phase;
        bool stage;
        const std::vector<std::vector<std::int64_t>>* priced;
      };
      for (const Check& k : {Check{libra::Phase::kFwdIn, false, &pb.fwd_in}, Check{libra::Phase::kFwdOut, false, &pb.fwd_out},
                             Check{libra::Phase::kBwdIn, false, &pb.bwd_in}, Check{libra::Phase::kBwdOut, false, &pb.bwd_out},
                             Check{libra::Phase::kFwdIn, true, &pb.fwd_stage}, Check{libra::Phase::kBwdIn, true, &pb.bwd_stage}}) {
        const auto sent = schedule_bytes(*plan, k.phase, true, k.stage);
        for (int m = 0; m < chunks; ++m) {
          EXPECT_EQ((*k.priced)[static_cast<std::size_t>(m)], sent[static_cast<std::size_t>(m)])
              << libra::plan_mode_name(mode) << " M=" << chunks << " phase " << static_cast<int>(k.phase)
              << (k.stage ? " stage" : "") << " chunk " << m;
        }
      }
    }
  }
}

namespace libra {

TEST(SimSettings, CouplingPipelineAndTrainedHeadsAreStatedAndChecked) {
  const SimSetting* coupling = nullptr;
  for (const SimSetting& st : sim_settings()) {
    if (st.key == "coupling") coupling = &st;
  }
  ASSERT_NE(coupling, nullptr);
  SimConfig c = tiny_config();
  for (const auto& [text, span] : std::vector<std::pair<std::string, std::int64_t>>{{"none", 1}, {"all", 0}, {"3", 3}}) {
    ASSERT_TRUE(apply_sim_setting(*coupling, text, "--coupling", c).ok()) << text;
    EXPECT_EQ(c.coupling, span) << text;
  }
  for (const char* bad : {"0", "-2", "some", "2x"}) {
    const Status s = apply_sim_setting(*coupling, bad, "--coupling", c);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--coupling"), std::string::npos) << s.message();
  }
  SimConfig p = tiny_config();
  p.pp = 0;
  auto r = simulate(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("--pp 0"), std::string::npos) << r.error().message();
  p.pp = 49;  // more stages than the 48 layers
  ASSERT_FALSE(simulate(p).ok());
  p.pp = 4;
  p.trained_heads_kv = 3;  // does not divide h_q 4
  r = simulate(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("--trained-heads-kv 3"), std::string::npos) << r.error().message();
  // A span of the coupling settings beside none and all, the configured one the point's own.
  p.trained_heads_kv = 1;
  p.coupling = 2;
  r = simulate(p);
  ASSERT_TRUE(r.ok()) << r.error().message();
  for (const DpScalingPoint& q : r->dp_scaling) {
    ASSERT_EQ(q.couplings.size(), 3u);
    EXPECT_EQ(q.couplings[1].coupling, 2);
    EXPECT_EQ(q.libra_tokens_per_s, q.couplings[1].libra_tokens_per_s);
  }
}

TEST(SimSettings, RelayIsAutoOnOrOffAndOnlyLibraTopoRelays) {
  SimConfig c = tiny_config();
  c.cost.net.gpus_per_node = 2;  // pools of 2 slots x CP 2 span two nodes
  auto aut = simulate(c);
  ASSERT_TRUE(aut.ok()) << aut.error().message();
  c.relay = false;
  auto off = simulate(c);
  c.relay = true;
  auto on = simulate(c);
  ASSERT_TRUE(off.ok() && on.ok());
  const VariantLatency* t_off = off->candidates[0].find(Variant::kLibraTopo);
  const VariantLatency* t_on = on->candidates[0].find(Variant::kLibraTopo);
  const VariantLatency* t_auto = aut->candidates[0].find(Variant::kLibraTopo);
  ASSERT_TRUE(t_off && t_on && t_auto);
  EXPECT_FALSE(t_off->relayed);
  EXPECT_TRUE(t_on->relayed);
  // auto takes the better of the two (ties: direct).
  const bool relayed_wins = t_on->seconds.mean < t_off->seconds.mean;
  EXPECT_EQ(t_auto->relayed, relayed_wins);
  EXPECT_EQ(t_auto->seconds.mean, relayed_wins ? t_on->seconds.mean : t_off->seconds.mean);
  for (Variant v : candidate_variants()) {
    if (v == Variant::kLibraTopo) continue;
    const VariantLatency* a = off->candidates[0].find(v);
    const VariantLatency* b = on->candidates[0].find(v);
    if (a == nullptr || b == nullptr) continue;
    EXPECT_FALSE(b->relayed);
    EXPECT_EQ(a->seconds.mean, b->seconds.mean) << variant_name(v);
  }
  const SimSetting* st = setting_named("relay");
  ASSERT_NE(st, nullptr);
  SimConfig d;
  EXPECT_NE(sim_config_json(d).find("\"relay\": \"auto\""), std::string::npos);
  ASSERT_TRUE(apply_sim_setting(*st, "off", "--relay", d).ok());
  EXPECT_EQ(d.relay, std::optional<bool>(false));
  ASSERT_TRUE(apply_sim_config_json(R"({"relay": "auto"})", "c.json", d).ok());
  EXPECT_FALSE(d.relay.has_value());
  Status bad = apply_sim_setting(*st, "yes", "--relay", d);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), "--relay 'yes': must be auto, on or off");
}

}  // namespace libra

// Tapered chunks (1, 2, 1 of a tile's 4 heads at M = 3): every chunk's
// priced bytes are what tapered schedules send, direct and relayed.
TEST(PlanCost, PricesTaperedChunksAsTheExecutorRunsThem) {
  const std::vector<libra::PackedSequence> pool = {
      {256}, {128, 128}, std::vector<std::int64_t>(8, 32), std::vector<std::int64_t>(16, 16)};
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapTopo}) {
    const bool topo = mode == libra::PlanMode::kTapTopo;
    libra::PlanConfig pc =
        priced_config(mode, topo ? libra::HomeLayout::kZigzag : libra::HomeLayout::kContiguous, topo, 3);
    pc.chunk_split = libra::ChunkSplit::kTapered;
    auto plan = libra::make_plan(pool, pc);
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    const libra::Tile& t0 = plan->tiles()[0];
    ASSERT_EQ(plan->chunk_heads(t0, 0).size(), 1);
    ASSERT_EQ(plan->chunk_heads(t0, 1).size(), 2);
    ASSERT_EQ(plan->chunk_heads(t0, 2).size(), 1);
    for (bool relay : {false, true}) {
      const libra::RelayTable relays = libra::plan_relays(*plan);
      if (relay) {
        ASSERT_TRUE(relays.any()) << "nothing relayed: the test would prove nothing";
      }
      const libra::detail::PhaseBytes pb = libra::detail::phase_bytes(*plan, relay ? &relays : nullptr);
      const std::pair<libra::Phase, const std::vector<std::vector<std::int64_t>>*> phases[] = {
          {libra::Phase::kFwdIn, &pb.fwd_in},
          {libra::Phase::kFwdOut, &pb.fwd_out},
          {libra::Phase::kBwdIn, &pb.bwd_in},
          {libra::Phase::kBwdOut, &pb.bwd_out}};
      for (const auto& [phase, priced] : phases) {
        const auto sent = schedule_bytes(*plan, phase, relay);
        for (int m = 0; m < 3; ++m) {
          EXPECT_EQ((*priced)[static_cast<std::size_t>(m)], sent[static_cast<std::size_t>(m)])
              << libra::plan_mode_name(mode) << " relay " << relay << " phase " << static_cast<int>(phase)
              << " chunk " << m;
        }
      }
    }
  }
}

namespace libra {

// The tiny corpus with tiles of 8 query heads (H = 1): at M = 4 tapered
// chunks are 1, 3, 3, 1 heads wide.
SimConfig tapered_config() {
  SimConfig c = tiny_config();
  c.model.heads_q = 8;
  c.head_shards = {1};
  c.chunks = {1, 2, 4};
  c.cost.net.gpus_per_node = 2;
  return c;
}

TEST(SimSettings, ChunkSplitIsAutoEqualOrTaperedAndOnlyLibraTopoTapers) {
  SimConfig c = tapered_config();
  auto aut = simulate(c);
  ASSERT_TRUE(aut.ok()) << aut.error().message();
  c.chunk_split = ChunkSplit::kEqual;
  auto equal = simulate(c);
  c.chunk_split = ChunkSplit::kTapered;
  c.chunks = {4};  // M = 4 alone: the forced split has nothing to fall back to
  auto tapered = simulate(c);
  c.chunks = {1, 2};  // no M admits tapered chunks: equal ones run
  auto fallback = simulate(c);
  ASSERT_TRUE(equal.ok() && tapered.ok() && fallback.ok());
  const VariantLatency* t_fb = fallback->candidates[0].find(Variant::kLibraTopo);
  ASSERT_TRUE(t_fb);
  EXPECT_EQ(t_fb->chunk_split, ChunkSplit::kEqual);
  const VariantLatency* t_eq = equal->candidates[0].find(Variant::kLibraTopo);
  const VariantLatency* t_tp = tapered->candidates[0].find(Variant::kLibraTopo);
  const VariantLatency* t_auto = aut->candidates[0].find(Variant::kLibraTopo);
  ASSERT_TRUE(t_eq && t_tp && t_auto);
  EXPECT_EQ(t_eq->chunk_split, ChunkSplit::kEqual);
  EXPECT_EQ(t_tp->chunk_split, ChunkSplit::kTapered);
  EXPECT_EQ(t_tp->chunks, 4);
  // auto: the best of every (M, shape) priced, which is the better of the
  // equal-only run and the tapered M = 4 shapes.
  const double best = std::min(t_eq->seconds.mean, t_tp->seconds.mean);
  EXPECT_EQ(t_auto->seconds.mean, best);
  EXPECT_EQ(t_auto->chunk_split == ChunkSplit::kTapered, t_tp->seconds.mean < t_eq->seconds.mean);
  for (Variant v : candidate_variants()) {
    if (v == Variant::kLibraTopo) continue;
    const VariantLatency* a = equal->candidates[0].find(v);
    const VariantLatency* b = aut->candidates[0].find(v);
    if (a == nullptr || b == nullptr) continue;
    EXPECT_EQ(b->chunk_split, ChunkSplit::kEqual) << variant_name(v);
    EXPECT_EQ(a->seconds.mean, b->seconds.mean) << variant_name(v);
  }
  const SimSetting* st = setting_named("chunk_split");
  ASSERT_NE(st, nullptr);
  SimConfig d;
  EXPECT_NE(sim_config_json(d).find("\"chunk_split\": \"auto\""), std::string::npos);
  ASSERT_TRUE(apply_sim_setting(*st, "tapered", "--chunk-split", d).ok());
  EXPECT_EQ(d.chunk_split, std::optional<ChunkSplit>(ChunkSplit::kTapered));
  ASSERT_TRUE(apply_sim_config_json(R"({"chunk_split": "auto"})", "c.json", d).ok());
  EXPECT_FALSE(d.chunk_split.has_value());
  Status bad = apply_sim_setting(*st, "uneven", "--chunk-split", d);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), "--chunk-split 'uneven': must be auto, equal or tapered");
}

}  // namespace libra

// Per chunk and pair, each kind's bytes in `x` as the plan's chunk lists
// hold them, and nothing off x's pairs.
static void expect_chunk_lists(const libra::Plan& plan, const libra::detail::ExchangeSums& x, const std::string& at) {
  const int W = plan.num_workers();
  for (int m = 0; m < plan.config().chunks; ++m) {
    for (int s = 0; s < W; ++s) {
      for (int t = 0; t < W; ++t) {
        std::int64_t q = 0, kv = 0;
        for (const libra::Transfer& tr : plan.chunk_transfers(m, s, t)) {
          (tr.kind == libra::TransferKind::kKv ? kv : q) += tr.kind == libra::TransferKind::kO ? 0 : tr.bytes;
        }
        const std::ptrdiff_t j = x.find(static_cast<std::uint32_t>(s * W + t));
        if (j < 0) {
          EXPECT_EQ(q + kv, 0) << at << " chunk " << m;
          continue;
        }
        EXPECT_EQ(x.reverse[static_cast<std::size_t>(j)], x.find(static_cast<std::uint32_t>(t * W + s))) << at;
        const std::size_t i = static_cast<std::size_t>(m) * x.pairs.size() + static_cast<std::size_t>(j);
        EXPECT_EQ(x.qo_row_heads[i] * x.head_dim * x.elem_bytes, q) << at << " chunk " << m;
        EXPECT_EQ(2 * x.kv_token_heads[i] * x.head_dim * x.elem_bytes, kv) << at << " chunk " << m;
      }
    }
  }
}

// exchange_sums from the layout's sums by key (ExchangeLayout::by_key) are
// the sums of walking every fetch, for every chunking of plans whose keys
// hold one KV head, share one (H > h_kv) or hold both (H 1).
TEST(PlanCost, SumsByKeyAreTheFetchWalksSums) {
  const PricedPool pp;
  int by_key = 0;  // chunkings priced by key
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapSplit, libra::PlanMode::kTapTopo}) {
    for (int shards : {1, 2, 4, 8}) {
      const bool topo = mode == libra::PlanMode::kTapTopo;
      libra::PlanConfig pc =
          priced_config(mode, topo ? libra::HomeLayout::kZigzag : libra::HomeLayout::kContiguous, topo, 2);
      pc.head_shards = shards;
      pc.dedup_per_kv_head = mode == libra::PlanMode::kTapSplit;
      auto plan = libra::make_plan(pp.pool, pc);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const libra::detail::ExchangeLayout layout = libra::detail::exchange_layout(plan->data_as_built());
      libra::detail::ExchangeLayout walk = layout;
      walk.by_key = false;
      for (int m : {1, 2, 3, 4}) {
        for (libra::ChunkSplit split : {libra::ChunkSplit::kEqual, libra::ChunkSplit::kTapered}) {
          auto re = libra::rechunk_plan(*plan, m, split);
          if (!re.ok()) continue;  // M must divide (equal) or fit (tapered) the shard's heads
          const std::string at = std::string(libra::plan_mode_name(mode)) + " H=" + std::to_string(shards) +
                                 " M=" + std::to_string(m) + (split == libra::ChunkSplit::kTapered ? " tapered" : "");
          for (bool dkv : {false, true}) {
            const auto x = libra::detail::exchange_sums(re->data_as_built(), layout, dkv);
            const auto y = libra::detail::exchange_sums(re->data_as_built(), walk, dkv);
            EXPECT_EQ(x.kv_token_heads, y.kv_token_heads) << at;
            EXPECT_EQ(x.dkv_rows, y.dkv_rows) << at;
            EXPECT_EQ(x.qo_row_heads, y.qo_row_heads) << at;
          }
          by_key += layout.by_key && !layout.key_rows.empty();
        }
      }
    }
  }
  EXPECT_GT(by_key, 20);
}

// The simulator prices a plan from its exchange sums (exchange_sums, no
// transfer lists) over the pairs they touch: the same bytes as the plan's
// derived exchange (byte matrix, chunk lists, relays) and the same times
// as alltoall_seconds over phase_bytes' dense matrices, bit for bit.
TEST(PlanCost, SumsAndSparsePricingMatchTheDerivedExchange) {
  const PricedPool pp;
  const libra::detail::Ctx& ctx = pp.ctx;
  const libra::SimConfig& cfg = pp.cfg;
  const std::vector<std::int64_t>& gpus = pp.gpus;
  int relayed = 0;  // relayed prices checked
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapSplit, libra::PlanMode::kTapTopo}) {
    for (int chunks : {1, 2, 4}) {
      auto plan = pp.plan(mode, chunks);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const std::string at = std::string(libra::plan_mode_name(mode)) + " M=" + std::to_string(chunks);
      const libra::detail::ExchangeSums x = libra::detail::exchange_sums(plan->data_as_built());
      const int W = plan->num_workers();
      // Byte matrix and, per chunk, each kind's bytes as the chunk lists hold them.
      EXPECT_EQ(x.dense(x.bytes, 0), std::vector<std::int64_t>(plan->byte_matrix().begin(), plan->byte_matrix().end())) << at;
      EXPECT_TRUE(std::is_sorted(x.pairs.begin(), x.pairs.end())) << at;
      expect_chunk_lists(*plan, x, at);
      // A re-chunked plan's sums from this plan's layout (as PoolPrices makes them).
      auto re = libra::rechunk_plan(*plan, chunks == 4 ? 2 : 4);
      ASSERT_TRUE(re.ok()) << re.error().message();
      const auto layout = libra::detail::exchange_layout(plan->data_as_built());
      expect_chunk_lists(*re, libra::detail::exchange_sums(re->data_as_built(), layout), at + " re-chunked");
      const libra::RelayTable relays = libra::plan_relays(*plan);
      const libra::RelayTable from_sums = libra::detail::relays_of(x, plan->config().topology);
      for (int m = 0; m < chunks; ++m) {
        for (int s = 0; s < W; ++s) {
          for (int t = 0; t < W; ++t) EXPECT_EQ(from_sums.via(m, s, t), relays.via(m, s, t)) << at;
        }
      }
      // Direct and (where anything is) relayed prices against dense pricing.
      for (const libra::RelayTable* r : {static_cast<const libra::RelayTable*>(nullptr), &relays}) {
        if (r != nullptr && !r->any()) continue;
        relayed += r != nullptr;
        const libra::detail::PlanCost c = libra::detail::cost_plan(ctx, *plan, gpus, r);
        const libra::detail::PhaseBytes pb = libra::detail::phase_bytes(*plan, r);
        auto dense = [&](const std::vector<std::int64_t>& mtx) { return libra::alltoall_seconds(cfg.cost.net, mtx, gpus); };
        auto with_stage = [&](const std::vector<std::vector<std::int64_t>>& in,
                              const std::vector<std::vector<std::int64_t>>& stage, std::size_t k) {
          std::vector<double> t = dense(in[k]);
          if (r == nullptr) return t;
          const std::vector<double> s = dense(stage[k]);
          const double slowest = *std::max_element(s.begin(), s.end());
          for (double& y : t) y += slowest;
          return t;
        };
        const std::size_t whole = pb.fwd_in.size() - 1;
        EXPECT_EQ(c.disp_fwd, with_stage(pb.fwd_in, pb.fwd_stage, whole)) << at;
        EXPECT_EQ(c.ret_fwd, dense(pb.fwd_out[whole])) << at;
        EXPECT_EQ(c.disp_bwd, with_stage(pb.bwd_in, pb.bwd_stage, whole)) << at;
        EXPECT_EQ(c.ret_bwd, dense(pb.bwd_out[whole])) << at;
        for (std::size_t k = 0; chunks > 1 && k < static_cast<std::size_t>(chunks); ++k) {
          EXPECT_EQ(c.cdisp_fwd[k], with_stage(pb.fwd_in, pb.fwd_stage, k)) << at;
          EXPECT_EQ(c.cret_fwd[k], dense(pb.fwd_out[k])) << at;
          EXPECT_EQ(c.cdisp_bwd[k], with_stage(pb.bwd_in, pb.bwd_stage, k)) << at;
          EXPECT_EQ(c.cret_bwd[k], dense(pb.bwd_out[k])) << at;
        }
        EXPECT_EQ(c.comm_bytes, plan->comm_bytes()) << at;
        EXPECT_EQ(c.max_recv_cross_node, plan->max_recv_cross_node()) << at;
      }
    }
  }
  EXPECT_GT(relayed, 0) << "no relayed plan: the relayed path went unchecked";
}

namespace {

// Two prices of one plan agree field by field; `whole`: the whole step
// too, else `reused` left it unpriced.
void expect_same_price(const libra::detail::PlanCost& fresh, const libra::detail::PlanCost& reused, bool whole,
                       const std::string& at) {
  EXPECT_EQ(reused.comp_fwd, fresh.comp_fwd) << at;
  EXPECT_EQ(reused.comp_bwd, fresh.comp_bwd) << at;
  EXPECT_EQ(reused.chunk_comp_fwd, fresh.chunk_comp_fwd) << at;
  EXPECT_EQ(reused.chunk_comp_bwd, fresh.chunk_comp_bwd) << at;
  EXPECT_EQ(reused.cdisp_fwd, fresh.cdisp_fwd) << at;
  EXPECT_EQ(reused.cret_fwd, fresh.cret_fwd) << at;
  EXPECT_EQ(reused.cdisp_bwd, fresh.cdisp_bwd) << at;
  EXPECT_EQ(reused.cret_bwd, fresh.cret_bwd) << at;
  EXPECT_EQ(reused.relayed, fresh.relayed) << at;
  EXPECT_EQ(reused.stage_fwd, fresh.stage_fwd) << at;
  EXPECT_EQ(reused.comm_bytes, fresh.comm_bytes) << at;
  EXPECT_EQ(reused.max_send, fresh.max_send) << at;
  EXPECT_EQ(reused.max_recv, fresh.max_recv) << at;
  EXPECT_EQ(reused.max_recv_cross_node, fresh.max_recv_cross_node) << at;
  const std::vector<double> none;
  EXPECT_EQ(reused.disp_fwd, whole ? fresh.disp_fwd : none) << at;
  EXPECT_EQ(reused.ret_fwd, whole ? fresh.ret_fwd : none) << at;
  EXPECT_EQ(reused.disp_bwd, whole ? fresh.disp_bwd : none) << at;
  EXPECT_EQ(reused.ret_bwd, whole ? fresh.ret_bwd : none) << at;
}

}  // namespace

// What cost_plan takes from prices already made (PriceReuse: a relayed
// price's compute and returns from the direct price, a re-chunking's whole
// compute from another chunking's, the whole step left unpriced) is what it
// computes afresh; and a plan's whole-step compute and returns are its M = 1
// re-chunking's (the sweep prices M = 1 relayed from the base price's).
TEST(PlanCost, ReusedPartsEqualPricingAfresh) {
  const PricedPool pp;
  const libra::detail::Ctx& ctx = pp.ctx;
  const std::vector<std::int64_t>& gpus = pp.gpus;
  int relayed = 0;  // relayed prices checked
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapSplit, libra::PlanMode::kTapTopo}) {
    for (int chunks : {2, 4}) {
      auto plan = pp.plan(mode, chunks);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const auto base = libra::detail::cost_plan(ctx, *plan, gpus);
      for (int other : {1, chunks == 4 ? 2 : 4}) {
        const std::string at = std::string(libra::plan_mode_name(mode)) + " M=" + std::to_string(chunks) + " as " +
                                std::to_string(other);
        auto re = libra::rechunk_plan(*plan, other);
        ASSERT_TRUE(re.ok()) << re.error().message();
        const libra::detail::ExchangeSums x = libra::detail::exchange_sums(re->data_as_built());
        const bool whole = other <= 1;
        const auto fresh = libra::detail::cost_plan(ctx, *re, x, gpus);
        expect_same_price(fresh, libra::detail::cost_plan(ctx, *re, x, gpus, nullptr, {.same_tiles = &base, .whole_step = whole}),
                          whole, at);
        if (other == 1) {
          EXPECT_EQ(fresh.comp_fwd, base.comp_fwd) << at;
          EXPECT_EQ(fresh.chunk_comp_fwd.at(0), base.comp_fwd) << at;
          EXPECT_EQ(fresh.chunk_comp_bwd.at(0), base.comp_bwd) << at;
          EXPECT_EQ(fresh.ret_fwd, base.ret_fwd) << at;
          EXPECT_EQ(fresh.ret_bwd, base.ret_bwd) << at;
        }
        const libra::RelayTable relays = libra::detail::relays_of(x, re->config().topology);
        if (!relays.any()) continue;
        ++relayed;
        expect_same_price(libra::detail::cost_plan(ctx, *re, x, gpus, &relays),
                          libra::detail::cost_plan(ctx, *re, x, gpus, &relays, {.direct = &fresh, .whole_step = whole}),
                          whole, at + " relayed");
      }
    }
  }
  EXPECT_GT(relayed, 0) << "no relayed plan: the relayed path went unchecked";
}

// A tapered cut that cuts the tiles as the equal one does (cut_split says
// kEqual) prices as the equal chunking, afresh and relayed: the sweep
// prices libra-topo's tapered shape there as its equal shape. Where the cuts
// differ (8 heads in 4 chunks: 1, 3, 3, 1), the prices differ too.
TEST(PlanCost, TaperedCutLikeEqualPricesAsEqual) {
  using libra::ChunkSplit;
  using libra::detail::cut_split;
  EXPECT_EQ(cut_split(4, 4, ChunkSplit::kTapered), ChunkSplit::kEqual);
  EXPECT_EQ(cut_split(5, 5, ChunkSplit::kTapered), ChunkSplit::kEqual);
  EXPECT_EQ(cut_split(8, 4, ChunkSplit::kTapered), ChunkSplit::kTapered);
  EXPECT_EQ(cut_split(4, 3, ChunkSplit::kTapered), ChunkSplit::kTapered);  // 1, 2, 1; equal needs 3 | 4
  EXPECT_EQ(cut_split(6, 3, ChunkSplit::kTapered), ChunkSplit::kEqual);    // 2, 2, 2
  EXPECT_EQ(cut_split(8, 2, ChunkSplit::kEqual), ChunkSplit::kEqual);
  const PricedPool pp;
  int same = 0, differ = 0, relayed = 0;
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapSplit, libra::PlanMode::kTapTopo}) {
    for (int shards : {2, 4}) {  // 8 and 4 heads a tile (16 query heads)
      const bool topo = mode == libra::PlanMode::kTapTopo;
      libra::PlanConfig pc =
          priced_config(mode, topo ? libra::HomeLayout::kZigzag : libra::HomeLayout::kContiguous, topo, 2);
      pc.dedup_per_kv_head = mode == libra::PlanMode::kTapSplit;
      pc.head_shards = shards;
      auto plan = libra::make_plan(pp.pool, pc);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const int width = plan->head_width();
      for (int m = 3; m <= width; ++m) {
        const std::string at = std::string(libra::plan_mode_name(mode)) + " width " + std::to_string(width) +
                               " M=" + std::to_string(m);
        auto tapered = libra::rechunk_plan(*plan, m, ChunkSplit::kTapered);
        ASSERT_TRUE(tapered.ok()) << tapered.error().message();
        const auto xt = libra::detail::exchange_sums(tapered->data_as_built());
        const auto ct = libra::detail::cost_plan(pp.ctx, *tapered, xt, pp.gpus);
        if (cut_split(width, m, ChunkSplit::kTapered) != ChunkSplit::kEqual) {
          if (width % m != 0) continue;
          auto equal = libra::rechunk_plan(*plan, m, ChunkSplit::kEqual);
          ASSERT_TRUE(equal.ok()) << equal.error().message();
          EXPECT_NE(libra::detail::cost_plan(pp.ctx, *equal, pp.gpus).chunk_comp_fwd, ct.chunk_comp_fwd) << at;
          ++differ;
          continue;
        }
        ++same;
        auto equal = libra::rechunk_plan(*plan, m, ChunkSplit::kEqual);
        ASSERT_TRUE(equal.ok()) << equal.error().message();
        const auto xe = libra::detail::exchange_sums(equal->data_as_built());
        expect_same_price(ct, libra::detail::cost_plan(pp.ctx, *equal, xe, pp.gpus), true, at);
        EXPECT_EQ(xe.dkv_rows, xt.dkv_rows) << at;
        const libra::RelayTable rt = libra::detail::relays_of(xt, tapered->config().topology);
        const libra::RelayTable re = libra::detail::relays_of(xe, equal->config().topology);
        if (!rt.any()) continue;
        ++relayed;
        expect_same_price(libra::detail::cost_plan(pp.ctx, *tapered, xt, pp.gpus, &rt),
                          libra::detail::cost_plan(pp.ctx, *equal, xe, pp.gpus, &re), true, at + " relayed");
      }
    }
  }
  EXPECT_GT(same, 0);
  EXPECT_GT(differ, 0);
  EXPECT_GT(relayed, 0) << "no relayed plan: the relayed path went unchecked";
}

namespace {

// A noise factor per worker (uneven, so a timing that reads the wrong
// worker's differs): what time_plan multiplies each worker's compute by.
std::vector<double> uneven_noise(std::int64_t workers) {
  std::vector<double> noise(static_cast<std::size_t>(workers));
  for (std::size_t r = 0; r < noise.size(); ++r) noise[r] = 1.0 + 0.25 * static_cast<double>((r * 3) % 5) - 0.5;
  return noise;
}

// `part` (priced with PriceReuse::backward bwd, ::chunks ch) is `full` in
// every part it has, and times as it; the parts it lacks are empty, and
// timing them throws.
void expect_part_of(const libra::detail::PlanCost& full, const libra::detail::PlanCost& part, bool bwd, bool ch,
                    const std::string& at) {
  const std::vector<double> none;
  const std::vector<std::vector<double>> no_chunks;
  EXPECT_EQ(part.comp_fwd, full.comp_fwd) << at;
  EXPECT_EQ(part.disp_fwd, full.disp_fwd) << at;
  EXPECT_EQ(part.ret_fwd, full.ret_fwd) << at;
  EXPECT_EQ(part.comp_bwd, bwd ? full.comp_bwd : none) << at;
  EXPECT_EQ(part.disp_bwd, bwd ? full.disp_bwd : none) << at;
  EXPECT_EQ(part.ret_bwd, bwd ? full.ret_bwd : none) << at;
  EXPECT_EQ(part.chunk_comp_fwd, ch ? full.chunk_comp_fwd : no_chunks) << at;
  EXPECT_EQ(part.cdisp_fwd, ch ? full.cdisp_fwd : no_chunks) << at;
  EXPECT_EQ(part.cret_fwd, ch ? full.cret_fwd : no_chunks) << at;
  EXPECT_EQ(part.chunk_comp_bwd, ch && bwd ? full.chunk_comp_bwd : no_chunks) << at;
  EXPECT_EQ(part.cdisp_bwd, ch && bwd ? full.cdisp_bwd : no_chunks) << at;
  EXPECT_EQ(part.cret_bwd, ch && bwd ? full.cret_bwd : no_chunks) << at;
  EXPECT_EQ(part.comm_bytes, full.comm_bytes) << at;
  EXPECT_EQ(part.max_send, full.max_send) << at;
  EXPECT_EQ(part.max_recv, full.max_recv) << at;
  EXPECT_EQ(part.max_recv_cross_node, full.max_recv_cross_node) << at;
  EXPECT_EQ(part.imbalance, full.imbalance) << at;
  const std::vector<double> noise = uneven_noise(full.workers);
  for (const bool pipelined : {false, true}) {
    for (const bool backward : {false, true}) {
      if ((backward && !bwd) || (pipelined && !ch)) {
        EXPECT_THROW((void)libra::detail::time_plan(part, noise, pipelined, backward), std::logic_error) << at;
        continue;
      }
      EXPECT_EQ(libra::detail::time_plan(part, noise, pipelined, backward),
                libra::detail::time_plan(full, noise, pipelined, backward))
          << at;
    }
    if (pipelined && !ch) {
      EXPECT_THROW((void)libra::detail::decompose(part, pipelined), std::logic_error) << at;
    } else {
      EXPECT_EQ(libra::detail::decompose(part, pipelined).total, libra::detail::decompose(full, pipelined).total) << at;
    }
  }
}

}  // namespace

// A price made for readers that read less (PriceReuse::backward false: a
// pool timed forward only; ::chunks false: one timed unpipelined only) is
// the full price's in every part it has, bit for bit, with its sums made
// without the dK/dV rows where it has no backward; its timings are the full
// price's, and a timing of a part it lacks throws.
TEST(PlanCost, PricesForFewerReadersArePartsOfTheFullPrice) {
  const PricedPool pp;
  int relayed = 0;
  for (libra::PlanMode mode : {libra::PlanMode::kTap, libra::PlanMode::kTapSplit, libra::PlanMode::kTapTopo}) {
    for (int chunks : {2, 4}) {
      auto plan = pp.plan(mode, chunks);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      const libra::Plan::Data& d = plan->data_as_built();
      const libra::detail::ExchangeLayout layout = libra::detail::exchange_layout(d);
      const libra::detail::ExchangeSums full_sums = libra::detail::exchange_sums(d, layout);
      const libra::detail::ExchangeSums fwd_sums = libra::detail::exchange_sums(d, layout, false);
      EXPECT_TRUE(fwd_sums.dkv_rows.empty());
      EXPECT_EQ(fwd_sums.kv_token_heads, full_sums.kv_token_heads);
      EXPECT_EQ(fwd_sums.qo_row_heads, full_sums.qo_row_heads);
      const libra::RelayTable relays = libra::detail::relays_of(full_sums, plan->config().topology);
      relayed += relays.any() ? 1 : 0;
      for (const libra::RelayTable* r : {static_cast<const libra::RelayTable*>(nullptr), &relays}) {
        const auto full = libra::detail::cost_plan(pp.ctx, *plan, full_sums, pp.gpus, r);
        for (const bool bwd : {false, true}) {
          for (const bool ch : {false, true}) {
            const std::string at = std::string(libra::plan_mode_name(mode)) + " M=" + std::to_string(chunks) +
                                   (r != nullptr ? " relayed" : "") + (bwd ? "" : " forward only") +
                                   (ch ? "" : " whole only");
            const auto c = libra::detail::cost_plan(pp.ctx, *plan, bwd ? full_sums : fwd_sums, pp.gpus, r,
                                                    {.backward = bwd, .chunks = ch});
            expect_part_of(full, c, bwd, ch, at);
            const std::vector<std::vector<double>> no_chunks;
            if (!bwd) {
              // The backward returns cannot be priced from sums without dK/dV rows.
              EXPECT_THROW((void)libra::detail::cost_plan(pp.ctx, *plan, fwd_sums, pp.gpus, r), std::logic_error) << at;
            }
            if (r != nullptr || !ch) continue;
            // A re-chunking priced forward only from this forward-only price
            // (the sweep's libra-plus and distca at M = 4 or 2).
            auto re = libra::rechunk_plan(*plan, chunks == 4 ? 2 : 4);
            ASSERT_TRUE(re.ok()) << re.error().message();
            const auto rx = libra::detail::exchange_sums(re->data_as_built(), layout, bwd);
            const auto fresh = libra::detail::cost_plan(pp.ctx, *re, libra::detail::exchange_sums(re->data_as_built()),
                                                        pp.gpus);
            const auto reused = libra::detail::cost_plan(
                pp.ctx, *re, rx, pp.gpus, nullptr, {.same_tiles = &c, .whole_step = false, .backward = bwd});
            EXPECT_EQ(reused.comp_fwd, fresh.comp_fwd) << at;
            EXPECT_EQ(reused.chunk_comp_fwd, fresh.chunk_comp_fwd) << at;
            EXPECT_EQ(reused.cdisp_fwd, fresh.cdisp_fwd) << at;
            EXPECT_EQ(reused.cret_fwd, fresh.cret_fwd) << at;
            EXPECT_EQ(reused.cdisp_bwd, bwd ? fresh.cdisp_bwd : no_chunks) << at;
            const std::vector<double> noise = uneven_noise(fresh.workers);
            EXPECT_EQ(libra::detail::time_plan(reused, noise, true, false),
                      libra::detail::time_plan(fresh, noise, true, false))
                << at;
          }
        }
      }
    }
  }
  EXPECT_GT(relayed, 0) << "no relayed plan: the relayed path went unchecked";
}
