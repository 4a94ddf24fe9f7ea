#include "libra/cost_model.hpp"
#include "libra/simulator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace libra {
namespace {

// A 2 x 2 table with round numbers, so every expectation is hand-computed.
KernelProfile tiny_profile() {
  KernelProfile p;
  p.entries = {{1024, 1, 100, 50}, {4096, 1, 300, 150}, {1024, 4, 200, 100}, {4096, 4, 400, 200}};
  return p;
}

TEST(ThroughputTable, InterpolatesInLogSpaceBetweenTablePoints) {
  ThroughputTable t(tiny_profile());
  EXPECT_DOUBLE_EQ(t.gflops(1024, 1, false), 100);
  EXPECT_DOUBLE_EQ(t.gflops(4096, 4, true), 200);
  // 2048 is halfway between 1024 and 4096 in log2: (100 + 300) / 2.
  EXPECT_DOUBLE_EQ(t.gflops(2048, 1, false), 200);
  // Heads 2 is halfway between 1 and 4 in log2: rows give 200 and 300.
  EXPECT_DOUBLE_EQ(t.gflops(2048, 2, false), 250);
  EXPECT_DOUBLE_EQ(t.gflops(2048, 2, true), 125);
}

TEST(ThroughputTable, ShortBlocksFallProportionallyLongBlocksStayFlat) {
  ThroughputTable t(tiny_profile());
  EXPECT_DOUBLE_EQ(t.gflops(512, 1, false), 50);    // half the shortest block: half the rate
  EXPECT_DOUBLE_EQ(t.gflops(1 << 20, 8, false), 400);  // beyond the table: flat
  EXPECT_DOUBLE_EQ(t.gflops(4096, 0.5, false), 150);   // half the fewest heads: half the rate
}

TEST(ComputeSeconds, FlopsOverThroughput) {
  // 1e12 FLOPs at 400 GFLOP/s = 2.5 s; backward at 200 GFLOP/s = 5 s.
  EXPECT_DOUBLE_EQ(compute_seconds(tiny_profile(), 1e12, 4096, 4), 2.5);
  EXPECT_DOUBLE_EQ(compute_seconds(tiny_profile(), 1e12, 4096, 4, true), 5.0);
  EXPECT_DOUBLE_EQ(compute_seconds(tiny_profile(), 0, 4096, 4), 0.0);
}

TEST(AnalyticProfile, HasThePaperFigure5Shape) {
  AnalyticKernel k;  // 600 TFLOP/s peak, half rate at 512 tokens, half_heads 0.25
  ThroughputTable t(analytic_profile(k));
  // At a table point the formula holds exactly: 600e3 * 512/1024 * 1/1.25.
  EXPECT_NEAR(t.gflops(512, 1, false), 600e3 * 0.5 / 1.25, 1e-6);
  // Short blocks lose efficiency fast, fewer heads cost little.
  const double full = t.gflops(8192, 32, false);
  EXPECT_LT(t.gflops(1024, 32, false) / full, 0.72);
  EXPECT_GT(t.gflops(8192, 4, false) / full, 0.93);
}

TEST(KernelProfile, RoundTripsThroughJsonAndRejectsBadEntries) {
  KernelProfile p = tiny_profile();
  p.device = "test";
  auto back = parse_kernel_profile(kernel_profile_json(p), "p.json");
  ASSERT_TRUE(back.ok()) << back.error().message();
  ASSERT_EQ(back->entries.size(), 4u);
  EXPECT_DOUBLE_EQ(back->entries[3].fwd_gflops, 400);
  EXPECT_EQ(back->device, "test");

  auto bad = parse_kernel_profile(R"({"version":1,"entries":[{"block_len":0,"heads":1,"fwd_gflops":1,"bwd_gflops":1}]})",
                                  "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("p.json: entries[0]"), std::string::npos);
  EXPECT_FALSE(parse_kernel_profile(R"({"version":2,"entries":[]})", "p.json").ok());
  EXPECT_FALSE(parse_kernel_profile("not json", "p.json").ok());
}

TEST(KernelProfile, LoadsEveryProfileShippedInData) {
  const char* root = std::getenv("LIBRA_SOURCE_DIR");
  if (root == nullptr) GTEST_SKIP() << "LIBRA_SOURCE_DIR not set";
  const auto dir = std::filesystem::path(root) / "data" / "profiles";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no data/profiles";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    auto p = load_kernel_profile(e.path().string());
    ASSERT_TRUE(p.ok()) << p.error().message();
    ThroughputTable t(*p);
    // Every table point reads back exactly.
    for (const auto& entry : p->entries) {
      EXPECT_NEAR(t.gflops(static_cast<double>(entry.block_len), static_cast<double>(entry.heads), false),
                  entry.fwd_gflops, 1e-9 * entry.fwd_gflops)
          << e.path();
    }
  }
}

TEST(AlltoallSeconds, IntraAndInterNodeLinksHandComputed) {
  Interconnect net{.gpus_per_node = 8, .intra_node_gbps = 100, .inter_node_gbps = 10, .congestion_per_node = 0,
                   .latency_us = 5};
  // Workers 0,1 on node 0 (GPUs 0, 1); workers 2,3 on node 1 (GPUs 8, 9).
  std::vector<std::int64_t> gpus = {0, 1, 8, 9};
  std::vector<std::int64_t> bytes(16, 0);
  bytes[0 * 4 + 1] = 1'000'000'000;  // intra: 0.01 s
  bytes[0 * 4 + 2] = 1'000'000'000;  // inter: 0.1 s
  bytes[3 * 4 + 0] = 2'000'000'000;  // inter: 0.2 s
  bytes[2 * 4 + 2] = 9'000'000'000;  // stays on worker 2: free
  auto t = alltoall_seconds(net, bytes, gpus);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_NEAR(t[0], 0.2 + 2 * 5e-6, 1e-12);  // receives 0.2 s inter; sent 2 messages
  EXPECT_NEAR(t[1], 0.01 + 5e-6, 1e-12);
  EXPECT_NEAR(t[2], 0.1 + 5e-6, 1e-12);
  EXPECT_NEAR(t[3], 0.2 + 5e-6, 1e-12);
}

TEST(AlltoallSeconds, NodeMajorNumberingDecidesTheLink) {
  Interconnect net{.gpus_per_node = 2, .intra_node_gbps = 100, .inter_node_gbps = 10, .congestion_per_node = 0,
                   .latency_us = 0};
  std::vector<std::int64_t> bytes = {0, 1'000'000'000, 0, 0};
  std::vector<std::int64_t> same_node = {2, 3};   // node 1, node 1
  std::vector<std::int64_t> across = {1, 2};      // node 0, node 1
  EXPECT_NEAR(alltoall_seconds(net, bytes, same_node)[0], 0.01, 1e-12);
  EXPECT_NEAR(alltoall_seconds(net, bytes, across)[0], 0.1, 1e-12);
}

// Three tiers by hand: 2 GPUs per node, 2 nodes per supernode (GPUs 0-3 in
// supernode 0, 4-7 in supernode 1); NVLink 100, NIC 10, spine share 2 GB/s.
// Every worker sends 1 GB to every other worker (a uniform all-to-all).
TEST(AlltoallSeconds, TopologyTiersHandComputed) {
  Interconnect net{.gpus_per_node = 2, .nodes_per_supernode = 2, .intra_node_gbps = 100, .inter_node_gbps = 10,
                   .inter_supernode_gbps = 2, .congestion_per_node = 0, .latency_us = 0};
  auto uniform = [](std::size_t w) {
    std::vector<std::int64_t> b(w * w, 1'000'000'000);
    for (std::size_t i = 0; i < w; ++i) b[i * w + i] = 0;
    return b;
  };
  // One node (GPUs 0, 1): 1 GB over NVLink = 0.01 s.
  std::vector<std::int64_t> one_node = {0, 1};
  for (double t : alltoall_seconds(net, uniform(2), one_node)) EXPECT_NEAR(t, 0.01, 1e-12);
  // Two nodes of one supernode (GPUs 0-3): each GPU sends 1 GB on NVLink
  // (0.01 s) and 2 GB through its NIC (0.2 s): the NIC is the busiest link.
  std::vector<std::int64_t> two_nodes = {0, 1, 2, 3};
  for (double t : alltoall_seconds(net, uniform(4), two_nodes)) EXPECT_NEAR(t, 0.2, 1e-12);
  // Across two supernodes (GPUs 0-7): 1 GB NVLink, 6 GB through the NIC
  // (0.6 s), of which 4 GB leave the supernode: 4 / 2 = 2 s, the busiest.
  std::vector<std::int64_t> two_sn = {0, 1, 2, 3, 4, 5, 6, 7};
  for (double t : alltoall_seconds(net, uniform(8), two_sn)) EXPECT_NEAR(t, 2.0, 1e-12);
  // With a fast spine the NIC decides again: 6 GB / 10 = 0.6 s.
  net.inter_supernode_gbps = 1000;
  for (double t : alltoall_seconds(net, uniform(8), two_sn)) EXPECT_NEAR(t, 0.6, 1e-12);
  // The same pool placed at GPUs 2-9 spans supernodes 0, 1 and 2 (GPU 8, 9).
  net.inter_supernode_gbps = 2;
  std::vector<std::int64_t> shifted = {2, 3, 4, 5, 6, 7, 8, 9};
  auto t = alltoall_seconds(net, uniform(8), shifted);
  // GPU 2 (supernode 0): 1 GB NVLink, 6 GB NIC, 6 GB cross-supernode: 3 s.
  EXPECT_NEAR(t[0], 3.0, 1e-12);
  // GPU 4 (supernode 1, with 5, 6, 7): 1 NVLink + 2 same-supernode + 4 cross: 2 s.
  EXPECT_NEAR(t[2], 2.0, 1e-12);
  // Congestion: two nodes run at the NIC's speed (0.2 s as above); the
  // 4-node pool (GPUs 0-7, fast spine) at 10 / (1 + 0.5 x 2) = 5 GB/s:
  // 6 GB / 5 GB/s = 1.2 s; one node has no NIC traffic to slow.
  net.congestion_per_node = 0.5;
  net.inter_supernode_gbps = 1000;
  for (double x : alltoall_seconds(net, uniform(4), two_nodes)) EXPECT_NEAR(x, 0.2, 1e-12);
  for (double x : alltoall_seconds(net, uniform(8), two_sn)) EXPECT_NEAR(x, 1.2, 1e-12);
  for (double x : alltoall_seconds(net, uniform(2), one_node)) EXPECT_NEAR(x, 0.01, 1e-12);
}

// PXN by hand: 2 GPUs per node, workers on GPUs 0, 1 (node 0) and 2, 3
// (node 1); NVLink 100, NIC 10 GB/s.
TEST(AlltoallSeconds, PxnRelaysThroughTheNodeMateOnTheReceiversRail) {
  Interconnect net{.gpus_per_node = 2, .intra_node_gbps = 100, .inter_node_gbps = 10, .congestion_per_node = 0,
                   .latency_us = 0};
  const std::vector<std::int64_t> gpus = {0, 1, 2, 3};
  std::vector<std::int64_t> bytes(16, 0);
  bytes[0 * 4 + 2] = 1'000'000'000;  // GPU 0 -> GPU 2: the same rail (local 0)
  bytes[0 * 4 + 3] = 1'000'000'000;  // GPU 0 -> GPU 3: rail 1, relayed by GPU 1
  // Own NIC: GPU 0 sends 2 GB through its NIC (0.2 s); GPU 1 idles.
  auto own = alltoall_seconds(net, bytes, gpus);
  EXPECT_NEAR(own[0], 0.2, 1e-12);
  EXPECT_NEAR(own[1], 0.0, 1e-12);
  EXPECT_NEAR(own[2], 0.1, 1e-12);
  EXPECT_NEAR(own[3], 0.1, 1e-12);
  // PXN: GPU 0's NIC sends 1 GB (0.1 s) and its NVLink 1 GB to GPU 1
  // (0.01 s); GPU 1 receives that over NVLink and sends it on (0.1 s).
  net.pxn = true;
  auto pxn = alltoall_seconds(net, bytes, gpus);
  EXPECT_NEAR(pxn[0], 0.1, 1e-12);
  EXPECT_NEAR(pxn[1], 0.1, 1e-12);
  EXPECT_NEAR(pxn[2], 0.1, 1e-12);
  EXPECT_NEAR(pxn[3], 0.1, 1e-12);
  // A rail with no worker of this all-to-all on the sender's node: the
  // sender's own NIC (GPU 1 is not in {0, 2, 3}).
  const std::vector<std::int64_t> three = {0, 2, 3};
  std::vector<std::int64_t> b3(9, 0);
  b3[0 * 3 + 1] = 1'000'000'000;
  b3[0 * 3 + 2] = 1'000'000'000;
  EXPECT_NEAR(alltoall_seconds(net, b3, three)[0], 0.2, 1e-12);
  // A uniform all-to-all: every NIC carries the same bytes either way, and
  // NVLink is faster than the NIC, so the times are the same.
  const std::vector<std::int64_t> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<std::int64_t> u(64, 1'000'000'000);
  for (std::size_t i = 0; i < 8; ++i) u[i * 8 + i] = 0;
  net.pxn = false;
  const auto a = alltoall_seconds(net, u, eight);
  net.pxn = true;
  const auto b = alltoall_seconds(net, u, eight);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_NEAR(a[i], b[i], 1e-12) << i;
}

TEST(HardwareProfile, Fa2HasTheSameNetworkAndASlowerKernel) {
  auto fa3 = hardware_profile("h200-fa3");
  auto fa2 = hardware_profile("h200-fa2");
  ASSERT_TRUE(fa3.ok() && fa2.ok());
  EXPECT_EQ(fa2->net.inter_node_gbps, fa3->net.inter_node_gbps);
  const double r3 = profile_gflops(fa3->kernel, 8192, 4, false), r2 = profile_gflops(fa2->kernel, 8192, 4, false);
  EXPECT_NEAR(r2 / r3, 350.0 / 600.0, 1e-9);
  EXPECT_FALSE(hardware_profile("h100").ok());
}

TEST(Overlap, PipelinerExposesOnlyFirstDispatchAndLastReturnWhenComputeCovers) {
  // Chunk times d=1, c=3, r=1, M=4: 1 + 3 + 3 + 3 + 3 + 1 = 14 = d + M c + r.
  EXPECT_DOUBLE_EQ(pipelined_seconds({1, 3, 1}, 4), 14);
  // Serial over the whole step: 4 + 12 + 4 = 20.
  EXPECT_DOUBLE_EQ(serial_seconds({4, 12, 4}), 20);
  // Communication-bound, d=2, c=1, r=2, M=3:
  //   2 + max(1, 2) + max(1, 2+2) + max(1, 2) + 2 = 12.
  EXPECT_DOUBLE_EQ(pipelined_seconds({2, 1, 2}, 3), 12);
  // One chunk is the serial schedule.
  EXPECT_DOUBLE_EQ(pipelined_seconds({4, 12, 4}, 1), 20);
}

TEST(Overlap, UnequalChunksFollowTheSameSchedule) {
  // d = {1, 2}, c = {5, 1}, r = {1, 3}: 1 + max(5, 2) + max(1, 1) + 3 = 10.
  std::vector<PhaseSeconds> chunks = {{1, 5, 1}, {2, 1, 3}};
  EXPECT_DOUBLE_EQ(pipelined_seconds(chunks), 10);
  std::vector<PhaseSeconds> equal(4, PhaseSeconds{2, 1, 2});
  EXPECT_DOUBLE_EQ(pipelined_seconds(equal), pipelined_seconds({2, 1, 2}, 4));
}

TEST(DeviceNoise, DeterministicSeededAndOffAtZero) {
  DeviceNoise n{.sigma = 0.02, .seed = 7};
  EXPECT_EQ(noise_factor(n, 3, 4, 5), noise_factor(n, 3, 4, 5));
  EXPECT_NE(noise_factor(n, 3, 4, 5), noise_factor(n, 3, 4, 6));
  EXPECT_NE(noise_factor(n, 3, 4, 5), noise_factor({.sigma = 0.02, .seed = 8}, 3, 4, 5));
  EXPECT_EQ(noise_factor({.sigma = 0, .seed = 7}, 3, 4, 5), 1.0);
}

TEST(DeviceNoise, DefaultReproducesThePaperMeanSpreadOn256Gpus) {
  // Paper section 3.3: 256 GPUs, 500 steps, fastest and slowest discarded,
  // (slowest - fastest) / fastest averages 7.01%.
  DeviceNoise n;
  double sum_spread = 0;
  double sum_factor = 0;
  for (std::uint64_t step = 0; step < 500; ++step) {
    std::vector<double> f;
    for (std::uint64_t g = 0; g < 256; ++g) f.push_back(noise_factor(n, 0, step, g));
    std::sort(f.begin(), f.end());
    sum_spread += (f[254] - f[1]) / f[1];
    for (double x : f) sum_factor += x;
  }
  EXPECT_NEAR(sum_spread / 500, 0.0701, 0.004);
  EXPECT_NEAR(sum_factor / (500 * 256), 1.0, 0.001);
}

TEST(StepModel, LinearAndAllreduceHandComputed) {
  ModelShape m;  // 3.3e9 active parameters
  StepModel s{.linear_tflops = 400};
  // Forward: 2 * 3.3e9 * 1e6 tokens / 8 GPUs / 4e14 = 2.0625 s; backward twice that.
  EXPECT_NEAR(linear_seconds(s, m, 1e6, 8, false), 2.0625, 1e-12);
  EXPECT_NEAR(linear_seconds(s, m, 1e6, 8, true), 4.125, 1e-12);
  Interconnect net{.gpus_per_node = 8, .intra_node_gbps = 360, .inter_node_gbps = 45, .latency_us = 10};
  EXPECT_NEAR(allreduce_seconds(net, 7.6e9, 16), 2.0 * 15 / 16 * 7.6e9 / 45e9 + 30 * 10e-6, 1e-12);
  EXPECT_EQ(allreduce_seconds(net, 7.6e9, 1), 0.0);
}

TEST(ValidateCostModel, ZeroBandwidthNamesTheFlag) {
  CostModel m;
  EXPECT_TRUE(validate_cost_model(m).ok());
  m.net.inter_node_gbps = 0;
  Status s = validate_cost_model(m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--inter-node-gbps"), std::string::npos);
  m = CostModel{};
  m.net.intra_node_gbps = -1;
  EXPECT_NE(validate_cost_model(m).message().find("--intra-node-gbps"), std::string::npos);
}

}  // namespace
}  // namespace libra
