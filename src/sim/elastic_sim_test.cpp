// simulate_elastic: with nothing to fuse both sides must agree exactly;
// fusing counts match the placement API's domains; thread-count independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "libra/elastic_sim.hpp"
#include "libra/sampler.hpp"

namespace libra {
namespace {

SimConfig small_config() {
  SimConfig c;
  c.source = "builtin:paper-256k";
  c.seq_len = 8192;
  c.gbs = 8;
  c.dp = 4;
  c.cp = 2;
  c.model.heads_q = 4;
  c.model.heads_kv = 2;
  c.model.head_dim = 16;
  c.chunks = {2};
  c.max_windows = 6;
  c.threads = 1;
  return c;
}
constexpr SimCandidate kCand{.pool_size = 2, .head_shards = 2, .block_size = 1024};

void expect_same(const ElasticPair& p) {
  EXPECT_EQ(p.vrsp.mean, p.elastic.mean);
  EXPECT_EQ(p.vrsp.worst, p.elastic.worst);
}

TEST(ElasticSim, NothingToFuseGivesVrspOnBothSides) {
  {
    auto r = simulate_elastic(small_config(), kCand, {.threshold = 1e9});
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(r->fused_windows, 0);
    expect_same(r->placement_imbalance);
    expect_same(r->worker_imbalance);
    expect_same(r->step_bytes);
    expect_same(r->step_latency);
    expect_same(r->window_latency);
  }
  SimConfig one = small_config();
  one.dp = 2;  // one pool per GA step
  auto r = simulate_elastic(one, kCand, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->fused_domains, 0);
  expect_same(r->step_latency);
}

TEST(ElasticSim, FusingMatchesThePlacementAndIsThreadIndependent) {
  const SimConfig cfg = small_config();
  // Unpriced: every window the placement fuses runs fused.
  auto r = simulate_elastic(cfg, kCand, {}, /*priced=*/false);
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto seqs = load_packed_sequences(cfg.source, cfg.seq_len);
  ASSERT_TRUE(seqs.ok());
  std::int64_t windows = 0, domains = 0;
  for (std::int64_t w = 0; w < cfg.max_windows; ++w) {
    std::vector<PackedSequence> win(seqs->begin() + w * cfg.gbs, seqs->begin() + (w + 1) * cfg.gbs);
    auto f = sequence_workloads(win);
    ASSERT_TRUE(f.ok());
    auto pl = place_window(*f, {.pool_size = 2, .mode = PlacementMode::kVrspElastic, .dp = cfg.dp});
    ASSERT_TRUE(pl.ok());
    std::int64_t fused = 0;
    for (const auto& d : pl->domains) fused += d.size() > 1 ? 1 : 0;
    domains += fused;
    windows += fused > 0 ? 1 : 0;
  }
  EXPECT_GT(domains, 0);  // the test corpus must exercise fusing
  EXPECT_EQ(r->fused_domains, domains);
  EXPECT_EQ(r->fused_windows, windows);
  EXPECT_EQ(r->steps, cfg.max_windows * 2);
  // Two GA steps per window: the optimizer step is the sum of both.
  EXPECT_NEAR(r->window_latency.vrsp.mean, 2 * r->step_latency.vrsp.mean, 1e-12);
  SimConfig threaded = cfg;
  threaded.threads = 3;
  auto t = simulate_elastic(threaded, kCand, {}, /*priced=*/false);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(elastic_json(*t), elastic_json(*r));
  auto p1 = simulate_elastic(cfg, kCand, {}), p3 = simulate_elastic(threaded, kCand, {});
  ASSERT_TRUE(p1.ok() && p3.ok());
  EXPECT_EQ(elastic_json(*p3), elastic_json(*p1));
}

// Priced fusing: no window predicted slower than VRSP; a declined window is VRSP's exactly; unpriced
// runs every candidate fused, and the per-window report says what pricing saw.
TEST(ElasticSim, PricedFusingIsNeverSlowerThanVrspWindowByWindow) {
  for (double congestion : {-1.0, 0.0}) {  // the fitted network, and one without NIC congestion
    SimConfig cfg = small_config();
    if (congestion >= 0) cfg.cost.net.congestion_per_node = congestion;
    auto priced = simulate_elastic(cfg, kCand, {});
    auto unpriced = simulate_elastic(cfg, kCand, {}, /*priced=*/false);
    ASSERT_TRUE(priced.ok() && unpriced.ok());
    ASSERT_EQ(priced->per_window.size(), static_cast<std::size_t>(cfg.max_windows));
    std::int64_t candidates = 0, fused = 0;
    for (std::size_t w = 0; w < priced->per_window.size(); ++w) {
      const auto& p = priced->per_window[w];
      const auto& u = unpriced->per_window[w];
      EXPECT_LE(p.elastic_s, p.vrsp_s) << "window " << w;
      EXPECT_EQ(p.candidate, u.candidate);
      EXPECT_EQ(u.fused, u.candidate);
      EXPECT_EQ(p.fused, p.candidate && u.elastic_s < u.vrsp_s);
      EXPECT_EQ(p.elastic_s, p.fused ? u.elastic_s : p.vrsp_s);
      EXPECT_NEAR(p.gain, u.elastic_s > 0 ? u.vrsp_s / u.elastic_s : 1, 1e-12);
      candidates += p.candidate ? 1 : 0;
      fused += p.fused ? 1 : 0;
    }
    EXPECT_GT(candidates, 0);
    EXPECT_EQ(priced->fused_windows, fused);
    EXPECT_EQ(priced->declined_windows, candidates - fused);
    EXPECT_GE(priced->mean_window_speedup, 1.0);
  }
}

// The training side: a sampler placing by priced_elastic_placer fuses exactly the windows the
// simulator's report fuses, runs VRSP's placement where pricing declines, and never fuses a window
// predicted slower than VRSP.
TEST(ElasticSim, SamplerDecidesLikeTheSimulatorReport) {
  std::int64_t fused_total = 0, declined_total = 0;  // the test must see both decisions
  for (double congestion : {-1.0, 0.0}) {
    // The outlier-heavy corpus with the real model shape at L = 64K: compute-bound enough that some
    // windows win by fusing (a domain of 2 x 2 replicas x cp 2 sits on one node) and some lose.
    SimConfig cfg = small_config();
    cfg.source = "builtin:paper-256k-v1";
    cfg.seq_len = 65536;
    cfg.model = ModelShape{};
    if (congestion >= 0) cfg.cost.net.congestion_per_node = congestion;
    constexpr SimCandidate kBig{.pool_size = 2, .head_shards = 2, .block_size = 4096};
    auto report = simulate_elastic(cfg, kBig, {});
    ASSERT_TRUE(report.ok());
    auto seqs = load_packed_sequences(cfg.source, cfg.seq_len);
    ASSERT_TRUE(seqs.ok());
    auto pricer = ElasticPricer::create(cfg, kBig, {}, cfg.seq_len);
    ASSERT_TRUE(pricer.ok()) << pricer.error().message();
    std::vector<PackedSequence> head(seqs->begin(), seqs->begin() + cfg.max_windows * cfg.gbs);
    SamplerOptions so{.gbs = cfg.gbs, .dp = cfg.dp,
                      .placement = {.pool_size = kBig.pool_size, .mode = PlacementMode::kVrspElastic}};
    so.placer = priced_elastic_placer(*pricer);
    auto sampler = PlacementSampler::create(head, so);
    ASSERT_TRUE(sampler.ok());
    ASSERT_EQ(sampler->num_steps(), cfg.max_windows);
    std::int64_t fused_windows = 0;
    for (std::int64_t w = 0; w < cfg.max_windows; ++w) {
      auto step = sampler->at(w);
      ASSERT_TRUE(step.ok()) << step.error().message();
      const auto& x = report->per_window[static_cast<std::size_t>(w)];
      const bool fused = std::any_of(step->placement.domains.begin(), step->placement.domains.end(),
                                     [](const auto& d) { return d.size() > 1; });
      EXPECT_EQ(fused, x.fused) << "window " << w;
      if (fused) {
        EXPECT_LT(x.elastic_s, x.vrsp_s) << "window " << w;
      }
      if (!fused) {
        std::vector<std::int64_t> f;
        for (std::int64_t i = 0; i < cfg.gbs; ++i) f.push_back(sampler->workloads()[static_cast<std::size_t>(w * cfg.gbs + i)]);
        auto vrsp = place_window(f, {.pool_size = kBig.pool_size});
        ASSERT_TRUE(vrsp.ok());
        EXPECT_EQ(step->placement.pools, vrsp->pools) << "window " << w;
      }
      fused_windows += fused ? 1 : 0;
      auto d = pricer->decide(std::span<const PackedSequence>(head).subspan(static_cast<std::size_t>(w * cfg.gbs),
                                                                            static_cast<std::size_t>(cfg.gbs)),
                              static_cast<std::uint64_t>(w));
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d->report.vrsp_s, x.vrsp_s);
      EXPECT_EQ(d->report.elastic_s, x.elastic_s);
      EXPECT_EQ(d->placement.domains, step->placement.domains);
    }
    EXPECT_EQ(fused_windows, report->fused_windows);
    fused_total += fused_windows;
    declined_total += report->declined_windows;
  }
  EXPECT_GT(fused_total, 0);
  EXPECT_GT(declined_total, 0);
  // A sampler built from workloads has no lengths to price.
  auto pricer = ElasticPricer::create(small_config(), kCand, {}, 8192);
  ASSERT_TRUE(pricer.ok());
  SamplerOptions so{.gbs = 8, .dp = 4, .placement = {.pool_size = 2, .mode = PlacementMode::kVrspElastic}};
  so.placer = priced_elastic_placer(*pricer);
  auto s = PlacementSampler::from_workloads(std::vector<std::int64_t>(8, 1), so);
  ASSERT_TRUE(s.ok());
  auto st = s->at(0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("elastic pricing"), std::string::npos);
}

// With tap-topo tiles the pricer runs libra-topo's pools: VRSP with node-interleaved slots. Two
// slots of cp 2 per 4-GPU node, P = 4: a pool spans 2 nodes, so the interleave is not the identity.
TEST(ElasticSim, TapTopoPricesAndRunsInterleavedVrspPools) {
  SimConfig cfg = small_config();
  cfg.source = "builtin:paper-256k-v1";
  cfg.seq_len = 65536;
  cfg.model = ModelShape{};
  cfg.gbs = 16;
  cfg.dp = 8;
  cfg.cost.net.gpus_per_node = 4;
  const SimCandidate cand{.pool_size = 4, .head_shards = 2, .block_size = 4096};
  auto pricer = ElasticPricer::create(cfg, cand, {}, cfg.seq_len, true, PlanMode::kTapTopo);
  ASSERT_TRUE(pricer.ok()) << pricer.error().message();
  auto seqs = load_packed_sequences(cfg.source, cfg.seq_len);
  ASSERT_TRUE(seqs.ok());
  const NodeInterleave where{.cp = 2, .gpus_per_node = 4};
  std::int64_t moved = 0, declined = 0;
  for (std::int64_t w = 0; w < cfg.max_windows; ++w) {
    const auto window = std::span<const PackedSequence>(*seqs).subspan(static_cast<std::size_t>(w * cfg.gbs),
                                                                       static_cast<std::size_t>(cfg.gbs));
    auto d = pricer->decide(window, static_cast<std::uint64_t>(w));
    ASSERT_TRUE(d.ok()) << d.error().message();
    auto f = sequence_workloads(window);
    auto plain = place_window(*f, {.pool_size = 4});
    auto inter = place_window(*f, {.pool_size = 4, .interleave = where});
    ASSERT_TRUE(plain.ok() && inter.ok());
    moved += plain->pools != inter->pools ? 1 : 0;
    if (!d->report.fused) {
      ++declined;
      EXPECT_EQ(d->placement.pools, inter->pools) << "window " << w;
    }
    for (const auto& dom : d->placement.domains) {  // single pools in interleaved order
      if (dom.size() != 1) continue;
      const auto& pool = d->placement.pools[static_cast<std::size_t>(dom.front())];
      std::vector<std::int64_t> pw;
      for (std::int32_t i : pool) pw.push_back((*f)[static_cast<std::size_t>(i)]);
      auto order = node_interleaved_slots(pw, where);
      std::vector<std::int32_t> identity(order.size());
      std::iota(identity.begin(), identity.end(), 0);
      EXPECT_EQ(order, identity) << "window " << w << ": a single pool is not in interleaved order";
    }
  }
  EXPECT_GT(moved, 0);
  EXPECT_GT(declined, 0);
}

TEST(ElasticSim, BadInput) {
  SimConfig c = small_config();
  c.dp = 3;
  auto r = simulate_elastic(c, kCand, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("--dp 3"), std::string::npos);
  auto k = simulate_elastic(small_config(), kCand, {.max_pools = 0});
  EXPECT_FALSE(k.ok());
  auto b = simulate_elastic(small_config(), {.pool_size = 2, .head_shards = 3, .block_size = 1024}, {});
  EXPECT_FALSE(b.ok());
  auto m = simulate_elastic(small_config(), kCand, {}, true, PlanMode::kUlysses);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message().find("must be tap or tap-topo"), std::string::npos);
}

}  // namespace
}  // namespace libra
