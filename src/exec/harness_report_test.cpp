// The report of a run (harness.hpp): the check's verdict and the JSON of
// `libra exec --json`, on reports written by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "exec/harness.hpp"

namespace libra {
namespace {

// Two pools; pool 1's dQ is 0.5 off a reference of magnitude 4.
CheckReport two_pools() {
  CheckReport r;
  r.ranks = 8;
  r.pool_ranks = 4;
  r.pool_size = 2;
  r.pools = 2;
  r.forward_wall = {0.30, 0.25};
  r.forward_compute = {0.20, 0.15};
  PoolResult a, b;
  a.pool = 3;
  a.samples = 5;
  a.tokens_per_slot = {512, 500};
  a.planned = true;
  a.tiles = 32;
  a.comm_bytes = 4096;
  a.imbalance = 0.125;
  a.relayed_pairs = 7;
  b = a;
  b.pool = 4;
  b.reference = ReferenceKind::kKernel;
  for (std::size_t i = 0; i < kCheckedTensors; ++i) {
    a.errors[i] = {1e-6, 1.0};
    b.errors[i] = {2e-6, 4.0};
  }
  b.errors[2] = {0.5, 4.0};
  r.pool_results = {a, b};
  return r;
}

TEST(HarnessReport, VerdictMergesPoolsAndNamesTheFirstTensorBeyond) {
  const CheckReport r = two_pools();
  const CheckVerdict v = check_verdict(r, Tolerance{1e-5, 1e-5, 1e-5, 1e-5, 1e-5});
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.first_failed, 2);  // dQ
  // O: max |err| 2e-6 over max |ref| 4 (the largest of each over the pools).
  EXPECT_DOUBLE_EQ(v.total[0].rel(), 2e-6 / 4.0);
  EXPECT_DOUBLE_EQ(v.total[2].rel(), 0.5 / 4.0);
  EXPECT_TRUE(v.within(r.pool_results[0].errors, 2));
  EXPECT_FALSE(v.within(r.pool_results[1].errors, 2));
  const CheckVerdict loose = check_verdict(r, uniform_tolerance(0.125));
  EXPECT_TRUE(loose.ok);  // 0.5 / 4 is exactly the tolerance: within
  EXPECT_EQ(loose.first_failed, -1);
  EXPECT_FALSE(check_verdict(r, uniform_tolerance(0.1249)).ok);
}

TEST(HarnessReport, JsonHoldsTheRunPoolsTimingsTraceAndCheck) {
  const CheckReport r = two_pools();
  RunDescription run;
  run.config.seq_len = 512;
  run.config.cp = 2;
  run.config.chunks = 4;
  run.config.chunk_split = ChunkSplit::kTapered;
  run.config.shape = {.heads_q = 8, .heads_kv = 2, .head_dim = 16, .dtype = DType::kF32};
  run.mode = "tap-topo, relayed inputs";
  run.chunk_widths = {1, 3, 3, 1};
  run.source = "pool.jsonl";
  run.relay = true;
  run.trace = "t.json";
  const CheckVerdict v = check_verdict(r, uniform_tolerance(1e-3));
  const auto j = nlohmann::ordered_json::parse(run_report_json(run, r, &v));
  std::vector<std::string> keys;
  for (const auto& [k, _] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"ranks", "pool_ranks", "pool_size", "cp", "mode", "chunks", "chunk_split",
                                            "chunk_widths", "seq_len", "heads_q", "heads_kv", "head_dim", "dtype",
                                            "window", "threads", "source", "length_scale", "pools", "forward",
                                            "backward", "executor_cpu_over_kernel_cpu", "trace", "check"}));
  EXPECT_EQ(j["mode"], "tap-topo, relayed inputs");
  EXPECT_EQ(j["chunk_split"], "tapered");
  EXPECT_EQ(j["chunk_widths"], nlohmann::json({1, 3, 3, 1}));
  EXPECT_EQ(j["dtype"], "fp32");
  EXPECT_TRUE(j["window"].is_null());
  EXPECT_EQ(j["pools"][1]["pool"], 4);
  EXPECT_EQ(j["pools"][1]["relayed_pairs"], 7);
  EXPECT_EQ(j["pools"][0]["tokens_per_slot"], nlohmann::json({512, 500}));
  EXPECT_DOUBLE_EQ(j["forward"]["wall_s"].get<double>(), 0.30);
  EXPECT_DOUBLE_EQ(j["forward"]["compute_mean_s"].get<double>(), 0.15);
  EXPECT_EQ(j["trace"], "t.json");
  const auto& c = j["check"];
  EXPECT_EQ(c["within_tolerance"], false);
  EXPECT_EQ(c["tensors"]["dQ"]["ok"], false);
  EXPECT_EQ(c["tensors"]["O"]["ok"], true);
  EXPECT_DOUBLE_EQ(c["tensors"]["dQ"]["relative_error"].get<double>(), 0.125);
  EXPECT_EQ(c["pools"][0]["reference"], "naive fp64");
  EXPECT_EQ(c["pools"][1]["reference"], "fp32 kernel in one process");
  EXPECT_EQ(c["pools"][0]["tensors"]["dQ"]["ok"], true);

  // No check, no trace, the equal cut, a window: none of their keys.
  run.config.chunk_split = ChunkSplit::kEqual;
  run.config.shape.window = 40;
  run.trace.clear();
  run.relay = false;
  const auto plain = nlohmann::ordered_json::parse(run_report_json(run, r, nullptr));
  EXPECT_FALSE(plain.contains("chunk_split") || plain.contains("chunk_widths") || plain.contains("trace") ||
               plain.contains("check") || plain["pools"][0].contains("relayed_pairs"));
  EXPECT_EQ(plain["window"], 40);
  EXPECT_DOUBLE_EQ(wall_overhead(r.forward_wall, r.forward_compute), 0.30 / 0.20 - 1);
}

}  // namespace
}  // namespace libra
