// vrsp-elastic: hand-computed windows, and properties over random windows
// checked against naive recomputation (not against the planner's own
// figures): step-equivalence, domains of at most k pools of one GA step,
// exactly VRSP without outliers, never worse than VRSP, determinism.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "libra/placement.hpp"
#include "libra/sampler.hpp"

namespace libra {
namespace {

using Lists = std::vector<std::vector<std::int32_t>>;

PlacementOptions elastic(std::int64_t p, std::int64_t dp, std::int64_t k = 2, double threshold = 0.05,
                         ElasticRule rule = ElasticRule::kBuddy) {
  return {.pool_size = p, .mode = PlacementMode::kVrspElastic, .dp = dp,
          .elastic = {.max_pools = k, .threshold = threshold, .rule = rule}};
}

// Worked by hand in the comments: F = 12 1 1 1 4 4 4 5, P = 2, DP = 4
// (two pools per GA step), mean pool load 8. VRSP: pools [0,3] [7,2] [4,6]
// [5,1], loads 13 6 8 5, R-1 = 0.625: only pool 0 is above 1.05 * 8.
const std::vector<std::int64_t> kWindow = {12, 1, 1, 1, 4, 4, 4, 5};

TEST(Elastic, BuddyRuleHandComputed) {
  // One fused domain at the buddy positions of GA step 0 (pools 0 and 1),
  // singletons 2 and 3. Greedy by load per pool: 12 -> D{0,1} (6 per pool),
  // 5 -> {2}, 4 -> {3}, 4 -> {3} (full at 8), 4 -> {2} (5 < 6; full at 9),
  // 1, 1, 1 -> D{0,1} (15, full). The domain's 12 1 1 1 split by VRSP into
  // [0,3] and [1,2]. Worst domain: pool 2 at 9 per pool: 9/8 - 1.
  auto r = place_window(kWindow, elastic(2, 4));
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->pools, (Lists{{0, 3}, {1, 2}, {7, 6}, {4, 5}}));
  EXPECT_EQ(r->loads, (std::vector<std::int64_t>{13, 2, 9, 8}));
  EXPECT_EQ(r->domains, (Lists{{0, 1}, {2}, {3}}));
  EXPECT_DOUBLE_EQ(r->imbalance, 0.125);
  EXPECT_DOUBLE_EQ(r->pool_imbalance, 0.625);
  EXPECT_EQ(domain_slots(*r, 0), (std::vector<std::int32_t>{0, 3, 1, 2}));
}

TEST(Elastic, LightestRuleHandComputed) {
  // VRSP's pools; GA step 0 (pools 0, 1): 13 is above 8.4, fused with 6:
  // 19 / 2 = 9.5 per pool. GA step 1: 8 is not above 8.4.
  auto r = place_window(kWindow, elastic(2, 4, 2, 0.05, ElasticRule::kLightest));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pools, (Lists{{0, 3}, {7, 2}, {4, 6}, {5, 1}}));
  EXPECT_EQ(r->domains, (Lists{{0, 1}, {2}, {3}}));
  EXPECT_DOUBLE_EQ(r->imbalance, 9.5 / 8 - 1);
}

TEST(Elastic, OnePoolPerGaStepOrHighThresholdIsVrsp) {
  const auto vrsp = place_window(kWindow, {.pool_size = 2, .mode = PlacementMode::kVrsp});
  for (const auto& o : {elastic(2, 2), elastic(2, 0), elastic(2, 4, 1), elastic(2, 4, 2, 0.7)}) {
    auto r = place_window(kWindow, o);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->pools, vrsp->pools);
    EXPECT_EQ(r->domains, (Lists{{0}, {1}, {2}, {3}}));
    EXPECT_EQ(r->imbalance, vrsp->imbalance);
  }
}

TEST(Elastic, BadSettings) {
  auto k0 = place_window(kWindow, elastic(2, 4, 0));
  ASSERT_FALSE(k0.ok());
  EXPECT_NE(k0.error().message().find("at least 1"), std::string::npos);
  EXPECT_FALSE(place_window(kWindow, elastic(2, 4, 2, -0.1)).ok());
  EXPECT_FALSE(place_window(kWindow, elastic(2, 3)).ok());   // P does not divide DP
  EXPECT_FALSE(place_window(kWindow, elastic(2, 16)).ok());  // DP does not divide D
  EXPECT_EQ(*parse_elastic_rule("lightest"), ElasticRule::kLightest);
  EXPECT_FALSE(parse_elastic_rule("random").ok());
  EXPECT_EQ(*parse_placement_mode("vrsp-elastic"), PlacementMode::kVrspElastic);
}

TEST(Elastic, SamplerPassesItsDp) {
  std::vector<std::int64_t> w = kWindow;
  w.insert(w.end(), kWindow.begin(), kWindow.end());
  auto s = PlacementSampler::from_workloads(
      w, {.gbs = 8, .dp = 4, .placement = {.pool_size = 2, .mode = PlacementMode::kVrspElastic}});
  ASSERT_TRUE(s.ok());
  auto step = s->at(1);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->placement.domains, (Lists{{0, 1}, {2}, {3}}));
  EXPECT_EQ(step->order.front(), 8);  // global indices: window 1 starts at 8
}

// Buddy positions on a topology, worked by hand. Pool q of a GA step holds
// replicas [q*P, (q+1)*P), replica r GPUs [r*cp, (r+1)*cp).
TEST(Elastic, BuddyStartsOnTheTopologyHandComputed) {
  using V = std::vector<std::int64_t>;
  // No topology: domains tile the step from position 0.
  EXPECT_EQ(buddy_domain_starts(6, 1, 2, {}), (V{0, 2, 4}));
  EXPECT_EQ(buddy_domain_starts(7, 2, 3, {}), (V{0, 3}));
  EXPECT_EQ(buddy_domain_starts(6, 1, 1, {}), V{});
  EXPECT_EQ(buddy_domain_starts(1, 4, 2, {}), V{});
  // P = 1, cp 8, 8 GPUs per node: pool q is node q; 3 nodes per supernode:
  // supernodes {0,1,2} {3,4,5}. Pairs (0,1) and (3,4) stay on one supernode;
  // (2,3) would straddle, so pools 2 and 5 stay unfused.
  EXPECT_EQ(buddy_domain_starts(6, 1, 2, {.cp = 8, .gpus_per_node = 8, .nodes_per_supernode = 3}), (V{0, 3}));
  // Nodes too: cp 4, 12 GPUs per node (replicas 0-2 on node 0, 3-5 on node
  // 1), one big supernode: (0,1) and (3,4) stay on a node.
  EXPECT_EQ(buddy_domain_starts(6, 1, 2, {.cp = 4, .gpus_per_node = 12, .nodes_per_supernode = 100}), (V{0, 3}));
  // The default machine (8 GPUs per node, 4 nodes per supernode) at P = 8, cp 8: a pool is 8 nodes,
  // a domain 16 nodes on 4 whole supernodes; aligned tiling is already the best.
  EXPECT_EQ(buddy_domain_starts(4, 8, 2, {.cp = 8, .gpus_per_node = 8, .nodes_per_supernode = 4}), (V{0, 2}));
  // P = 2, cp 8: a pool is 2 nodes, a domain 4 nodes = one supernode when it starts at an even pool.
  EXPECT_EQ(buddy_domain_starts(5, 2, 2, {.cp = 8, .gpus_per_node = 8, .nodes_per_supernode = 4}), (V{0, 2}));
  // No aligned choice exists (P = 3, cp 8: pools of 3 nodes, supernodes of 4): each domain of 6
  // nodes touches 2 or 3 supernodes; positions 0 (nodes 0-5: 2) and 2 (nodes 6-11: 2; position 1,
  // nodes 3-8, touches 3) are taken.
  EXPECT_EQ(buddy_domain_starts(4, 3, 2, {.cp = 8, .gpus_per_node = 8, .nodes_per_supernode = 4}), (V{0, 2}));
}

// Against a naive recount of every candidate position's supernodes and nodes (GPU by GPU): the
// starts' domains are disjoint, inside the step, each touches the fewest (supernodes, nodes) any k
// adjacent pools touch, and no further such domain fits between them (left-to-right greedy).
RC_GTEST_PROP(Elastic, BuddyStartsAreBestAndMaximal, ()) {
  const auto ppg = *rc::gen::inRange<std::int64_t>(1, 13);
  const auto p = *rc::gen::inRange<std::int64_t>(1, 5);
  const auto k = *rc::gen::inRange<std::int64_t>(1, 5);
  const ElasticOptions::Topology t{.cp = *rc::gen::inRange<std::int64_t>(1, 9),
                                   .gpus_per_node = *rc::gen::inRange<std::int64_t>(1, 13),
                                   .nodes_per_supernode = *rc::gen::inRange<std::int64_t>(1, 5)};
  auto touch = [&](std::int64_t q) {
    std::vector<std::int64_t> sn, nodes;
    for (std::int64_t g = q * p * t.cp; g < (q + k) * p * t.cp; ++g) {
      nodes.push_back(g / t.gpus_per_node);
      sn.push_back(g / t.gpus_per_node / t.nodes_per_supernode);
    }
    auto distinct = [](std::vector<std::int64_t> v) {
      std::sort(v.begin(), v.end());
      return static_cast<std::int64_t>(std::unique(v.begin(), v.end()) - v.begin());
    };
    return std::make_pair(distinct(sn), distinct(nodes));
  };
  const std::vector<std::int64_t> starts = buddy_domain_starts(ppg, p, k, t);
  if (k < 2 || k > ppg) {
    RC_ASSERT(starts.empty());
    return;
  }
  auto best = touch(0);
  for (std::int64_t q = 1; q + k <= ppg; ++q) best = std::min(best, touch(q));
  std::vector<bool> used(static_cast<std::size_t>(ppg), false);
  for (std::size_t j = 0; j < starts.size(); ++j) {
    RC_ASSERT(starts[j] >= 0 && starts[j] + k <= ppg);
    if (j > 0) RC_ASSERT(starts[j] >= starts[j - 1] + k);
    RC_ASSERT(touch(starts[j]) == best);
    for (std::int64_t q = starts[j]; q < starts[j] + k; ++q) used[static_cast<std::size_t>(q)] = true;
  }
  RC_ASSERT(!starts.empty());
  for (std::int64_t q = 0; q + k <= ppg; ++q) {
    bool free = true;
    for (std::int64_t x = q; x < q + k; ++x) free = free && !used[static_cast<std::size_t>(x)];
    // The left-to-right scan visits every position outside a taken domain: a free best window
    // would have been taken.
    if (free) RC_ASSERT(touch(q) != best);
  }
  const std::vector<std::int64_t> plain = buddy_domain_starts(ppg, p, k, {});
  RC_ASSERT(static_cast<std::int64_t>(plain.size()) == ppg / k);
}

TEST(Elastic, BuddyDomainsFollowTheTopology) {
  // P = 1, DP 6 (one GA step of 6 pools), two outliers (100, 90; mean 38.3): two fused domains.
  const std::vector<std::int64_t> w = {100, 90, 10, 10, 10, 10};
  PlacementOptions o = elastic(1, 6);
  auto flat = place_window(w, o);
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->domains, (Lists{{0, 1}, {2, 3}, {4}, {5}}));
  o.elastic.topology = {.cp = 8, .gpus_per_node = 8, .nodes_per_supernode = 3};
  auto topo = place_window(w, o);
  ASSERT_TRUE(topo.ok());
  // The second domain moves to pools 3, 4 (one supernode). Greedy by load per pool: 100 -> {0,1},
  // 90 -> {3,4}, 10 -> {2}, 10 -> {5}, 10 -> {3,4} (45 < 50), 10 -> {0,1}.
  EXPECT_EQ(topo->domains, (Lists{{0, 1}, {2}, {3, 4}, {5}}));
  EXPECT_EQ(topo->loads, (std::vector<std::int64_t>{100, 10, 10, 90, 10, 10}));
  o.elastic.topology.cp = -1;
  EXPECT_FALSE(place_window(w, o).ok());
}

// Random windows with long tails: a few heavy outliers among light ones.
struct Case {
  std::vector<std::int64_t> w;
  std::int64_t p, dp, k;
  double threshold;
  ElasticRule rule;
};

rc::Gen<Case> gen_case() {
  return rc::gen::exec([] {
    Case c;
    c.p = *rc::gen::inRange<std::int64_t>(1, 6);
    const auto ppg = *rc::gen::inRange<std::int64_t>(1, 5);
    const auto ga = *rc::gen::inRange<std::int64_t>(1, 4);
    c.dp = c.p * ppg;
    c.k = *rc::gen::inRange<std::int64_t>(1, 5);
    c.threshold = *rc::gen::elementOf(std::vector<double>{0.0, 0.05, 0.3});
    c.rule = *rc::gen::elementOf(std::vector<ElasticRule>{ElasticRule::kBuddy, ElasticRule::kLightest});
    const auto d = static_cast<std::size_t>(c.dp * ga);
    c.w = *rc::gen::container<std::vector<std::int64_t>>(
        d, rc::gen::weightedOneOf<std::int64_t>({{8, rc::gen::inRange<std::int64_t>(0, 1000)},
                                                 {1, rc::gen::inRange<std::int64_t>(1000, 100000)}}));
    if (std::all_of(c.w.begin(), c.w.end(), [](std::int64_t x) { return x == 0; })) c.w[0] = 1;
    return c;
  });
}

// Step-equivalence: pools of exactly P, every sequence exactly once; returns the pools' loads.
std::vector<std::int64_t> check_pools(const Case& c, const WindowPlacement& got) {
  RC_ASSERT(got.pools.size() == c.w.size() / static_cast<std::size_t>(c.p));
  std::vector<int> seen(c.w.size(), 0);
  std::vector<std::int64_t> loads;
  for (const auto& pool : got.pools) {
    RC_ASSERT(static_cast<std::int64_t>(pool.size()) == c.p);
    std::int64_t load = 0;
    for (std::int32_t i : pool) {
      ++seen.at(static_cast<std::size_t>(i));
      load += c.w[static_cast<std::size_t>(i)];
    }
    loads.push_back(load);
  }
  RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  RC_ASSERT(loads == got.loads);
  return loads;
}

// Domains: a partition of the pools, at most k pools, one GA step each;
// the buddy rule uses the fixed positions [j*k', (j+1)*k') of a step.
void check_domains(const Case& c, const WindowPlacement& got) {
  const std::size_t num_pools = c.w.size() / static_cast<std::size_t>(c.p);
  const std::int64_t ppg = c.dp / c.p;
  std::vector<int> in(num_pools, 0);
  const std::int64_t kk = std::min(c.k, ppg);
  for (const auto& d : got.domains) {
    RC_ASSERT(!d.empty());
    RC_ASSERT(static_cast<std::int64_t>(d.size()) <= c.k);
    RC_ASSERT(std::is_sorted(d.begin(), d.end()));
    for (std::int32_t q : d) {
      ++in.at(static_cast<std::size_t>(q));
      RC_ASSERT(q / ppg == d.front() / ppg);
    }
    if (c.rule == ElasticRule::kBuddy && d.size() > 1) {
      RC_ASSERT(static_cast<std::int64_t>(d.size()) == kk);
      RC_ASSERT((d.front() % ppg) % kk == 0);
      RC_ASSERT(d.back() - d.front() == kk - 1);
    }
  }
  RC_ASSERT(std::all_of(in.begin(), in.end(), [](int s) { return s == 1; }));
}

RC_GTEST_PROP(Elastic, Properties, ()) {
  const Case c = *gen_case();
  const auto got = place_window(c.w, elastic(c.p, c.dp, c.k, c.threshold, c.rule));
  RC_ASSERT(got.ok());
  const auto vrsp = place_window(c.w, {.pool_size = c.p, .mode = PlacementMode::kVrsp});
  const std::size_t num_pools = c.w.size() / static_cast<std::size_t>(c.p);
  const std::int64_t ppg = c.dp / c.p;

  const std::vector<std::int64_t> loads = check_pools(c, *got);
  check_domains(c, *got);
  const std::int64_t kk = std::min(c.k, ppg);

  // The figures, recomputed naively in doubles.
  const double sum = static_cast<double>(std::accumulate(c.w.begin(), c.w.end(), std::int64_t{0}));
  const double mean = sum / static_cast<double>(num_pools);
  double worst = 0;
  for (const auto& d : got->domains) {
    double l = 0;
    for (std::int32_t q : d) l += static_cast<double>(loads[static_cast<std::size_t>(q)]);
    worst = std::max(worst, l / static_cast<double>(d.size()));
  }
  RC_ASSERT(std::abs(got->imbalance - (worst / mean - 1)) <= 1e-9);
  const double max_pool = static_cast<double>(*std::max_element(loads.begin(), loads.end()));
  RC_ASSERT(std::abs(got->pool_imbalance - (max_pool / mean - 1)) <= 1e-9);

  // Never worse than VRSP; exactly VRSP when VRSP has no pool above the
  // threshold or nothing can fuse.
  RC_ASSERT(got->imbalance <= vrsp->imbalance);
  if (vrsp->imbalance <= c.threshold || kk < 2) {
    RC_ASSERT(got->pools == vrsp->pools);
    RC_ASSERT(got->domains.size() == num_pools);
    RC_ASSERT(got->imbalance == vrsp->imbalance);
  }
  // Independent lower bound: the heaviest sequence's domain has at most k
  // pools, so it carries at least (F_max + the k*P - 1 lightest) / k per pool.
  std::vector<std::int64_t> sorted = c.w;
  std::sort(sorted.begin(), sorted.end());
  const auto take = std::min<std::size_t>(static_cast<std::size_t>(kk * c.p) - 1, sorted.size() - 1);
  const double floor =
      (static_cast<double>(sorted.back()) +
       static_cast<double>(std::accumulate(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(take),
                                           std::int64_t{0}))) /
      static_cast<double>(kk);
  RC_ASSERT(got->imbalance >= std::max(0.0, floor / mean - 1) - 1e-9);

  // Deterministic.
  const auto again = place_window(c.w, elastic(c.p, c.dp, c.k, c.threshold, c.rule));
  RC_ASSERT(again->pools == got->pools && again->domains == got->domains);
}

// Brute force over every placement of a tiny window into labelled pools of
// exactly P (pool k at GA step k / ppg) and every grouping of each GA step's
// pools into domains of at most k pools: the least possible worst domain
// load per pool, as a fraction num/den. No rule can report less.
double brute_elastic_optimum(const std::vector<std::int64_t>& w, std::int64_t p, std::int64_t ppg, std::int64_t k) {
  const std::size_t num_pools = w.size() / static_cast<std::size_t>(p);
  std::vector<std::int64_t> load(num_pools, 0), count(num_pools, 0);
  double best = 1e300;
  // The best grouping of one GA step's loads: partitions of the step's pools
  // into blocks of at most k, minimising the largest block mean.
  auto best_grouping = [k](std::vector<std::int64_t> step) {
    double out = 1e300;
    std::vector<int> block(step.size(), -1);
    auto rec = [&](auto&& self, std::size_t i, int blocks) -> void {
      if (i == step.size()) {
        double worst = 0;
        for (int b = 0; b < blocks; ++b) {
          double sum = 0;
          int n = 0;
          for (std::size_t j = 0; j < step.size(); ++j) {
            if (block[j] == b) sum += static_cast<double>(step[j]), ++n;
          }
          if (n > k) return;
          worst = std::max(worst, sum / n);
        }
        out = std::min(out, worst);
        return;
      }
      for (int b = 0; b <= blocks; ++b) {
        block[i] = b;
        self(self, i + 1, std::max(blocks, b + 1));
      }
    };
    rec(rec, 0, 0);
    return out;
  };
  auto place = [&](auto&& self, std::size_t i) -> void {
    if (i == w.size()) {
      double worst = 0;
      for (std::size_t first = 0; first < num_pools; first += static_cast<std::size_t>(ppg)) {
        worst = std::max(worst, best_grouping(std::vector<std::int64_t>(
                                    load.begin() + static_cast<std::ptrdiff_t>(first),
                                    load.begin() + static_cast<std::ptrdiff_t>(first + static_cast<std::size_t>(ppg)))));
      }
      best = std::min(best, worst);
      return;
    }
    for (std::size_t c = 0; c < num_pools; ++c) {
      if (count[c] == p) continue;
      load[c] += w[i];
      ++count[c];
      self(self, i + 1);
      load[c] -= w[i];
      --count[c];
    }
  };
  place(place, 0);
  const double mean = static_cast<double>(std::accumulate(w.begin(), w.end(), std::int64_t{0})) /
                      static_cast<double>(num_pools);
  return best / mean - 1;
}

TEST(Elastic, BruteForceOptimumOfTheHandWindow) {
  // kWindow, P = 2, two pools per GA step, k = 2. Best: fuse both steps,
  // 12 1 1 1 (7.5 per pool) and 4 4 4 5 (8.5 per pool): 8.5/8 - 1. Any
  // domain of 12 with a 4 or more holds at least 18/2 = 9. The buddy rule
  // fuses only the one pool VRSP leaves above the threshold: 0.125.
  EXPECT_DOUBLE_EQ(brute_elastic_optimum(kWindow, 2, 2, 2), 0.0625);
  auto r = place_window(kWindow, elastic(2, 4));
  EXPECT_DOUBLE_EQ(r->imbalance, 0.125);
}

RC_GTEST_PROP(Elastic, NeverBelowTheBruteForceOptimum, ()) {
  const auto p = *rc::gen::inRange<std::int64_t>(1, 3);
  const auto ppg = *rc::gen::inRange<std::int64_t>(2, 4);
  const auto ga = p == 1 ? *rc::gen::inRange<std::int64_t>(1, 3) : std::int64_t{1};
  const auto k = *rc::gen::inRange<std::int64_t>(2, 4);
  const auto d = static_cast<std::size_t>(p * ppg * ga);
  auto w = *rc::gen::container<std::vector<std::int64_t>>(
      d, rc::gen::weightedOneOf<std::int64_t>({{4, rc::gen::inRange<std::int64_t>(1, 100)},
                                               {1, rc::gen::inRange<std::int64_t>(100, 2000)}}));
  const double opt = brute_elastic_optimum(w, p, ppg, k);
  for (ElasticRule rule : {ElasticRule::kBuddy, ElasticRule::kLightest}) {
    const auto got = place_window(w, elastic(p, p * ppg, k, 0.0, rule));
    RC_ASSERT(got.ok());
    RC_ASSERT(got->imbalance >= opt - 1e-9);
  }
}

}  // namespace
}  // namespace libra
