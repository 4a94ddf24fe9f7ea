// Tests of tap-topo: against an exhaustive search over every placement of
// small pools (independent code: token-by-token FLOPs and bytes, the
// simulator's link formula written out), determinism tile for tile, balance
// within tau, files, and the bytes-by-tier summary.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "libra/plan.hpp"
#include "libra/splitmix64.hpp"
#include "tiles/plan_internal.hpp"

namespace {

using libra::PackedSequence;
using libra::Plan;
using libra::PlanConfig;
using libra::PlanMode;
using libra::PlanTopology;

PlanConfig small_config(PlanMode mode, double tau) {
  PlanConfig c;
  c.seq_len = 8;
  c.cp = 2;
  c.block_size = 2;
  c.head_shards = 1;
  c.shape.heads_q = 1;
  c.shape.heads_kv = 1;
  c.shape.head_dim = 1;
  c.shape.dtype = libra::DType::kBF16;
  c.tau = tau;
  c.mode = mode;
  // Two GPUs per node, one node per supernode: slot p is node p, and the
  // two nodes talk across the spine, so all three tiers matter.
  c.topology.gpus_per_node = 2;
  c.topology.nodes_per_supernode = 1;
  c.topology.intra_node_gbps = 8;
  c.topology.inter_node_gbps = 2;
  c.topology.inter_supernode_gbps = 1;
  c.topology.congestion_per_node = 0;
  return c;
}

// ---- the independent model ------------------------------------------------

struct RefTile {
  int slot;
  std::int64_t begin, end;
  std::int64_t flops;
  int home;
};

struct RefPool {
  std::vector<RefTile> tiles;
  std::vector<std::vector<std::int64_t>> sample_of_token;  // [slot][token] -> sample index
  std::vector<std::vector<std::int64_t>> lengths;
};

RefPool ref_pool(const std::vector<PackedSequence>& pool, const PlanConfig& c) {
  RefPool rp;
  const std::int64_t shard = c.seq_len / c.cp;
  for (std::size_t p = 0; p < pool.size(); ++p) {
    std::vector<std::int64_t> owner, pos;
    for (std::size_t j = 0; j < pool[p].size(); ++j) {
      for (std::int64_t k = 0; k < pool[p][j]; ++k) {
        owner.push_back(static_cast<std::int64_t>(j));
        pos.push_back(k);
      }
    }
    const auto T = static_cast<std::int64_t>(owner.size());
    for (std::int64_t b = 0; b * c.block_size < T; ++b) {
      RefTile t{static_cast<int>(p), b * c.block_size, std::min(T, (b + 1) * c.block_size), 0, 0};
      for (std::int64_t x = t.begin; x < t.end; ++x) t.flops += pos[static_cast<std::size_t>(x)] + 1;  // keys 0..pos
      t.home = static_cast<int>(p) * c.cp + static_cast<int>(t.begin / shard);
      rp.tiles.push_back(t);
    }
    rp.sample_of_token.push_back(owner);
    rp.lengths.push_back(pool[p]);
  }
  return rp;
}

double link_seconds(const PlanTopology& t, const std::array<double, 3>& x, int workers) {
  const int nodes = (workers + t.gpus_per_node - 1) / t.gpus_per_node;
  const double nic = t.inter_node_gbps * 1e9 / (1 + t.congestion_per_node * std::max(0, nodes - 2));
  return std::max({x[0] / (t.intra_node_gbps * 1e9), (x[1] + x[2]) / nic, x[2] / (t.inter_supernode_gbps * 1e9)});
}

int tier(const PlanTopology& t, int a, int b) {
  if (a / t.gpus_per_node == b / t.gpus_per_node) return 0;
  return a / t.gpus_per_node / t.nodes_per_supernode == b / t.gpus_per_node / t.nodes_per_supernode ? 1 : 2;
}

// The slowest worker's link time of a placement: every token of every
// sample a worker's tiles touch comes from the worker it resides on (once
// per worker), Q goes home -> worker and O back, 2 bytes an element.
double slowest_link(const RefPool& rp, const PlanConfig& c, const std::vector<int>& sigma) {
  const int W = static_cast<int>(rp.lengths.size()) * c.cp;
  const std::int64_t shard = c.seq_len / c.cp;
  std::vector<std::vector<std::int64_t>> bytes(static_cast<std::size_t>(W), std::vector<std::int64_t>(static_cast<std::size_t>(W), 0));
  std::set<std::array<std::int64_t, 3>> held;  // (worker, slot, sample)
  for (std::size_t i = 0; i < rp.tiles.size(); ++i) {
    const RefTile& t = rp.tiles[i];
    const int r = sigma[i];
    if (r != t.home) {
      bytes[static_cast<std::size_t>(t.home)][static_cast<std::size_t>(r)] += (t.end - t.begin) * 2;
      bytes[static_cast<std::size_t>(r)][static_cast<std::size_t>(t.home)] += (t.end - t.begin) * 2;
    }
    for (std::int64_t x = t.begin; x < t.end; ++x) {
      held.insert({r, t.slot, rp.sample_of_token[static_cast<std::size_t>(t.slot)][static_cast<std::size_t>(x)]});
    }
  }
  for (const auto& [r, p, j] : held) {
    const auto& owner = rp.sample_of_token[static_cast<std::size_t>(p)];
    for (std::size_t x = 0; x < owner.size(); ++x) {
      if (owner[x] != j) continue;
      const int src = static_cast<int>(p) * c.cp + static_cast<int>(static_cast<std::int64_t>(x) / shard);
      if (src != r) bytes[static_cast<std::size_t>(src)][static_cast<std::size_t>(r)] += 4;  // K and V
    }
  }
  double worst = 0;
  for (int r = 0; r < W; ++r) {
    std::array<double, 3> s{0, 0, 0}, v{0, 0, 0};
    for (int o = 0; o < W; ++o) {
      if (o == r) continue;
      s[static_cast<std::size_t>(tier(c.topology, r, o))] += static_cast<double>(bytes[static_cast<std::size_t>(r)][static_cast<std::size_t>(o)]);
      v[static_cast<std::size_t>(tier(c.topology, o, r))] += static_cast<double>(bytes[static_cast<std::size_t>(o)][static_cast<std::size_t>(r)]);
    }
    worst = std::max({worst, link_seconds(c.topology, s, W), link_seconds(c.topology, v, W)});
  }
  return worst;
}

bool within_capacity(const RefPool& rp, const PlanConfig& c, const std::vector<int>& sigma, int W) {
  std::int64_t total = 0;
  std::vector<std::int64_t> load(static_cast<std::size_t>(W), 0);
  for (std::size_t i = 0; i < rp.tiles.size(); ++i) {
    total += rp.tiles[i].flops;
    load[static_cast<std::size_t>(sigma[i])] += rp.tiles[i].flops;
  }
  const double cap = (1.0 + c.tau) * static_cast<double>(total) / W;
  for (std::int64_t l : load) {
    if (static_cast<double>(l) > cap) return false;
  }
  return true;
}

// The plan's tiles (tap-topo may split a tile into pieces of its rows) as
// the reference's, FLOPs and homes from the tokens, and their workers.
std::pair<RefPool, std::vector<int>> pieces_of(const RefPool& rp, const Plan& plan, const PlanConfig& c) {
  RefPool out = rp;
  out.tiles.clear();
  std::vector<int> sigma;
  const std::int64_t shard = c.seq_len / c.cp;
  for (const libra::Tile& t : plan.tiles()) {
    RefTile r{t.slot, t.begin, t.end, 0, t.slot * c.cp + static_cast<int>(t.begin / shard)};
    const auto& owner = rp.sample_of_token[static_cast<std::size_t>(t.slot)];
    for (std::int64_t x = t.begin; x < t.end; ++x) {
      std::int64_t first = x;
      while (first > 0 && owner[static_cast<std::size_t>(first - 1)] == owner[static_cast<std::size_t>(x)]) --first;
      r.flops += x - first + 1;
    }
    out.tiles.push_back(r);
    sigma.push_back(t.worker);
  }
  return {out, sigma};
}

std::vector<int> workers_of(const Plan& p) {
  std::vector<int> w;
  for (const libra::Tile& t : p.tiles()) w.push_back(t.worker);
  return w;
}

std::vector<PackedSequence> random_pool(std::uint64_t seed, int slots, std::int64_t seq_len) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 99;
  std::vector<PackedSequence> pool;
  for (int p = 0; p < slots; ++p) {
    PackedSequence seq;
    std::int64_t left = seq_len - static_cast<std::int64_t>(libra::splitmix64_next(s) % 3);
    while (left > 0) {
      const std::int64_t l = std::min<std::int64_t>(left, 1 + static_cast<std::int64_t>(libra::splitmix64_next(s) % static_cast<std::uint64_t>(seq_len)));
      seq.push_back(l);
      left -= l;
    }
    pool.push_back(seq);
  }
  return pool;
}

TEST(TapTopoPlacement, NearTheExhaustiveOptimumOnSmallPools) {
  // Every placement of up to 8 tiles on 4 workers (4^8 of them): the least
  // slowest-worker link time among those within capacity, against tap-topo
  // and tap on the same pool. tap-topo may split a tile (a piece is not in
  // the search); its pieces are priced by the same reference.
  int cases = 0, optimal = 0, feasible_cases = 0, split_cases = 0;
  double ratio_sum = 0, worst_ratio = 1, tap_ratio_sum = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const auto pool = random_pool(seed, 2, 8);
    for (double tau : {0.0, 0.3}) {
      const PlanConfig c = small_config(PlanMode::kTapTopo, tau);
      const RefPool rp = ref_pool(pool, c);
      const int W = 4;
      const std::size_t n = rp.tiles.size();
      std::vector<int> sigma(n, 0);
      double best = std::numeric_limits<double>::infinity();
      for (std::size_t code = 0; code < (std::size_t{1} << (2 * n)); ++code) {
        for (std::size_t i = 0; i < n; ++i) sigma[i] = static_cast<int>((code >> (2 * i)) & 3U);
        if (!within_capacity(rp, c, sigma, W)) continue;
        best = std::min(best, slowest_link(rp, c, sigma));
      }
      auto topo = libra::make_plan(pool, c);
      ASSERT_TRUE(topo.ok()) << topo.error().message();
      PlanConfig tc = c;
      tc.mode = PlanMode::kTap;
      auto tap = libra::make_plan(pool, tc);
      ASSERT_TRUE(tap.ok());
      ASSERT_EQ(tap->tiles().size(), n);
      // Our tile order matches the reference's (slot, block), H = 1.
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(tap->tiles()[i].flops, rp.tiles[i].flops) << seed;
      const auto [pieces, ws] = pieces_of(rp, *topo, c);
      for (std::size_t i = 0; i < pieces.tiles.size(); ++i) {
        ASSERT_EQ(topo->tiles()[i].flops, pieces.tiles[i].flops) << seed;
      }
      const bool split = pieces.tiles.size() > n;
      split_cases += split;
      ++cases;
      if (!std::isfinite(best)) continue;  // nothing fits under C: nothing to compare
      ++feasible_cases;
      // tap-topo keeps within C wherever a placement of whole tiles does.
      EXPECT_TRUE(within_capacity(pieces, c, ws, W)) << "seed " << seed << " tau " << tau;
      if (!within_capacity(pieces, c, ws, W)) continue;
      const double got = slowest_link(pieces, c, ws);
      if (!split) {
        EXPECT_GE(got, best * (1 - 1e-12)) << "the exhaustive search missed a placement";
      }
      const double ratio = best > 0 ? got / best : (got == 0 ? 1.0 : 1e9);
      ratio_sum += ratio;
      worst_ratio = std::max(worst_ratio, ratio);
      optimal += ratio <= 1 + 1e-12;
      const double tap_got = slowest_link(rp, c, workers_of(*tap));
      tap_ratio_sum += best > 0 ? tap_got / best : (tap_got == 0 ? 1.0 : 1e9);
    }
  }
  ASSERT_GE(feasible_cases, 30);
  const double mean = ratio_sum / feasible_cases;
  RecordProperty("optimal", optimal);
  std::printf("tap-topo vs exhaustive: %d of %d feasible cases optimal, mean ratio %.3f, worst %.3f; tap mean %.3f; "
              "%d of %d cases split a tile\n",
              optimal, feasible_cases, mean, worst_ratio, tap_ratio_sum / feasible_cases, split_cases, cases);
  EXPECT_LE(mean, tap_ratio_sum / feasible_cases);
  // Measured: 35 of 40 optimal, mean 1.025, worst 1.400 (tap: mean 1.600).
  EXPECT_GE(optimal, feasible_cases * 3 / 4);
  EXPECT_LE(mean, 1.1);
  EXPECT_LE(worst_ratio, 1.5);
}

PlanConfig paper_like(PlanMode mode) {
  PlanConfig c;
  c.seq_len = 1 << 16;
  c.cp = 8;
  c.block_size = 1024;
  c.head_shards = 8;
  c.shape.heads_q = 32;
  c.shape.heads_kv = 4;
  c.shape.head_dim = 128;
  c.chunks = 4;
  c.mode = mode;
  return c;
}

std::vector<PackedSequence> long_tail_pool(std::uint64_t seed, int slots, std::int64_t seq_len) {
  std::uint64_t s = seed * 0x2545f4914f6cdd1dULL + 7;
  std::vector<PackedSequence> pool;
  for (int p = 0; p < slots; ++p) {
    PackedSequence seq;
    std::int64_t left = seq_len;
    if (libra::splitmix64_next(s) % 3 == 0) {
      const std::int64_t big = seq_len / 4 + static_cast<std::int64_t>(libra::splitmix64_next(s) % static_cast<std::uint64_t>(seq_len * 3 / 4));
      seq.push_back(big);
      left -= big;
    }
    while (left > 0) {
      const std::int64_t l = std::min<std::int64_t>(left, 64 + static_cast<std::int64_t>(libra::splitmix64_next(s) % 4000));
      seq.push_back(l);
      left -= l;
    }
    pool.push_back(seq);
  }
  return pool;
}

TEST(TapTopoPlacement, DeterministicTileForTile) {
  const auto pool = long_tail_pool(3, 4, 1 << 16);
  const PlanConfig c = paper_like(PlanMode::kTapTopo);
  auto a = libra::make_plan(pool, c);
  auto b = libra::make_plan(pool, c);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(workers_of(*a), workers_of(*b));
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  // A copy of the config gives the same plan; the files bring it back.
  auto j = libra::plan_from_json(libra::plan_to_json(*a));
  ASSERT_TRUE(j.ok()) << j.error().message();
  EXPECT_EQ(j->fingerprint(), a->fingerprint());
  EXPECT_EQ(j->config().topology, c.topology);
  auto bin = libra::plan_from_binary(libra::plan_to_binary(*a));
  ASSERT_TRUE(bin.ok()) << bin.error().message();
  EXPECT_EQ(bin->fingerprint(), a->fingerprint());
  EXPECT_EQ(bin->config().topology, c.topology);
}

// Every mode's plan hashes its topology (tap-topo places by it, the others
// relay and report by it); a plan of another mode on the default topology
// hashes what it always did (docs/plan-format.md, version 5).
TEST(TapTopoPlacement, TopologyIsPartOfEveryFingerprint) {
  const auto pool = long_tail_pool(5, 2, 1 << 16);
  PlanConfig c = paper_like(PlanMode::kTapTopo);
  PlanConfig flat = c;
  flat.topology.inter_node_gbps = flat.topology.intra_node_gbps;
  flat.topology.inter_supernode_gbps = flat.topology.intra_node_gbps;
  flat.topology.congestion_per_node = 0;
  auto a = libra::make_plan(pool, c);
  auto b = libra::make_plan(pool, flat);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  c.mode = flat.mode = PlanMode::kTap;
  auto ta = libra::make_plan(pool, c);
  auto tb = libra::make_plan(pool, flat);
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_NE(ta->fingerprint(), tb->fingerprint());
  EXPECT_EQ(libra::plan_format_version(ta->config()), 1U);
  EXPECT_EQ(libra::plan_format_version(tb->config()), 5U);
}

TEST(TapTopoPlacement, StaysWithinTauAndCutsCrossNodeBytes) {
  // Four slots of eight workers: four nodes. Wherever tap meets tau,
  // tap-topo does too; across the pools its busiest cross-node receiver
  // takes fewer bytes than tap's.
  std::int64_t tap_cross = 0, topo_cross = 0;
  int tap_within = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const auto pool = long_tail_pool(seed, 4, 1 << 16);
    auto tap = libra::make_plan(pool, paper_like(PlanMode::kTap));
    auto topo = libra::make_plan(pool, paper_like(PlanMode::kTapTopo));
    ASSERT_TRUE(tap.ok() && topo.ok());
    if (tap->imbalance() <= 0.03 + 1e-12) {
      ++tap_within;
      EXPECT_LE(topo->imbalance(), 0.03 + 1e-12) << "seed " << seed;
    }
    tap_cross += tap->max_recv_cross_node();
    topo_cross += topo->max_recv_cross_node();
  }
  EXPECT_GT(tap_within, 0);
  EXPECT_LT(topo_cross, tap_cross);
}

// Issue 20's 256K setting scaled down: CP 4, four blocks of a slot per
// worker, H = 4 (tiles up to half a worker's mean load).
PlanConfig coarse_tiles_config() {
  PlanConfig c = paper_like(PlanMode::kTapTopo);
  c.cp = 4;
  c.block_size = 4096;
  c.head_shards = 4;
  c.shape.heads_kv = 16;
  c.chunks = 2;
  return c;
}

TEST(TapTopoPlacement, CoarseTilesAreSplitNotHandedBackToTap) {
  // Issue 20's 256K setting scaled down: CP 4, four blocks of a slot per
  // worker, H = 4, eight slots on four 8-GPU nodes. A tile is then up to
  // half a worker's mean load against a headroom of 3%: the home-first
  // packings leave their last tiles no room, and without splitting them
  // tap-topo fell back to TAP's own placement in most pools.
  PlanConfig c = coarse_tiles_config();
  std::int64_t tap_cross = 0, topo_cross = 0;
  int split = 0;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const auto pool = long_tail_pool(seed, 8, c.seq_len);
    PlanConfig tc = c;
    tc.mode = PlanMode::kTap;
    auto tap = libra::make_plan(pool, tc);
    auto topo = libra::make_plan(pool, c);
    ASSERT_TRUE(tap.ok() && topo.ok());
    EXPECT_LE(topo->imbalance(), c.tau + 1e-12) << "seed " << seed;
    split += topo->tiles().size() > tap->tiles().size();
    tap_cross += tap->max_recv_cross_node();
    topo_cross += topo->max_recv_cross_node();
  }
  std::printf("coarse tiles: tap-topo / tap busiest cross-node receiver %.3f; %d of 8 pools split a tile\n",
              static_cast<double>(topo_cross) / static_cast<double>(tap_cross), split);
  EXPECT_GT(split, 0);
  EXPECT_LE(2 * topo_cross, tap_cross);
}

TEST(PlanTierBytes, SplitsTheByteMatrixByTier) {
  const auto pool = long_tail_pool(9, 4, 1 << 16);
  for (PlanMode m : {PlanMode::kTap, PlanMode::kTapTopo, PlanMode::kUlysses}) {
    PlanConfig c = paper_like(m);
    c.topology.gpus_per_node = 4;  // two nodes per slot
    c.topology.nodes_per_supernode = 2;
    auto plan = libra::make_plan(pool, c);
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    const int W = plan->num_workers();
    std::int64_t max_recv = -1;
    int busiest = -1;
    for (int r = 0; r < W; ++r) {
      const libra::TierBytes& t = plan->tier_bytes()[static_cast<std::size_t>(r)];
      std::int64_t intra = 0, cross = 0, spine = 0, rintra = 0, rcross = 0, rspine = 0;
      for (int o = 0; o < W; ++o) {
        const int k = tier(c.topology, r, o);
        (k == 0 ? intra : cross) += plan->bytes(r, o);
        (k == 0 ? rintra : rcross) += plan->bytes(o, r);
        if (k == 2) {
          spine += plan->bytes(r, o);
          rspine += plan->bytes(o, r);
        }
      }
      EXPECT_EQ(t.send_intra_node, intra);
      EXPECT_EQ(t.send_cross_node, cross);
      EXPECT_EQ(t.send_cross_supernode, spine);
      EXPECT_EQ(t.recv_intra_node, rintra);
      EXPECT_EQ(t.recv_cross_node, rcross);
      EXPECT_EQ(t.recv_cross_supernode, rspine);
      EXPECT_EQ(intra + cross, plan->send_bytes(r));
      if (plan->recv_bytes(r) > max_recv) {
        max_recv = plan->recv_bytes(r);
        busiest = r;
      }
      // Kept: Q/O of tiles on their home, KV tokens that reside on r.
      std::int64_t kept = 0;
      for (std::int32_t id : plan->worker_tiles(r)) {
        const libra::Tile& tl = plan->tiles()[static_cast<std::size_t>(id)];
        if (tl.home == r) kept += 2 * (tl.end - tl.begin) * tl.heads.size() * c.shape.head_dim * 2;
      }
      for (std::int32_t g : plan->worker_groups(r)) {
        const libra::KvGroup& grp = plan->groups()[static_cast<std::size_t>(g)];
        const std::int64_t shard = c.seq_len / c.cp;
        for (std::int64_t x = grp.begin; x < grp.end; ++x) {
          if (grp.slot * c.cp + x / shard == r) kept += 2 * grp.kv_heads.size() * c.shape.head_dim * 2;
        }
      }
      EXPECT_EQ(t.kept, kept) << "worker " << r;
    }
    EXPECT_EQ(plan->busiest_receiver(), busiest);
  }
}

TEST(TapTopoPlacement, RejectsABadTopology) {
  PlanConfig c = paper_like(PlanMode::kTapTopo);
  c.topology.inter_node_gbps = 0;
  auto s = libra::validate_plan_config(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "plan config: topology inter_node_gbps 0.000000 must be a finite number > 0");
  c = paper_like(PlanMode::kTapTopo);
  c.topology.gpus_per_node = 0;
  EXPECT_FALSE(libra::validate_plan_config(c).ok());
}

}  // namespace

// The slowest worker's link time of a plan's bytes by tier.
double plan_slowest_link(const Plan& plan, const PlanConfig& c) {
  const int W = plan.num_workers();
  double worst = 0;
  for (const libra::TierBytes& b : plan.tier_bytes()) {
    const auto tiers = [](std::int64_t intra, std::int64_t cross, std::int64_t spine) {
      return std::array<double, 3>{static_cast<double>(intra), static_cast<double>(cross - spine), static_cast<double>(spine)};
    };
    worst = std::max({worst, link_seconds(c.topology, tiers(b.send_intra_node, b.send_cross_node, b.send_cross_supernode), W),
                      link_seconds(c.topology, tiers(b.recv_intra_node, b.recv_cross_node, b.recv_cross_supernode), W)});
  }
  return worst;
}

TEST(TapTopoPlacement, LinksNoSlowerThanTapWhereTapFits) {
  // TAP's placement is tap-topo's last candidate, stepped only while its
  // slowest link can still win: where TAP fits under C, tap-topo's slowest
  // link is no slower, and in the pools where TAP's own placement is the
  // fastest, tap-topo returns it.
  int fits = 0, tap_kept = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    for (int slots : {2, 4}) {
      const auto pool = long_tail_pool(seed, slots, 1 << 16);
      PlanConfig c = paper_like(PlanMode::kTapTopo);
      auto topo = libra::make_plan(pool, c);
      c.mode = PlanMode::kTap;
      auto tap = libra::make_plan(pool, c);
      ASSERT_TRUE(topo.ok() && tap.ok());
      if (tap->imbalance() > c.tau + 1e-12) continue;
      ++fits;
      EXPECT_LE(plan_slowest_link(*topo, c), plan_slowest_link(*tap, c) * (1 + 1e-12)) << "seed " << seed;
      tap_kept += workers_of(*topo) == workers_of(*tap);
    }
  }
  EXPECT_GT(fits, 60);
  EXPECT_GT(tap_kept, 0);  // measured: 3 of 120 pools
}

// The placement of a plan tile for tile: rows and worker.
std::vector<std::array<std::int64_t, 4>> placement(const Plan& p) {
  std::vector<std::array<std::int64_t, 4>> out;
  for (const libra::Tile& t : p.tiles()) out.push_back({t.slot, t.begin, t.end, t.worker});
  return out;
}

TEST(TapTopoPlacement, EarlyStopsPlaceAsEveryCandidateRunToItsEnd) {
  // tap-topo's candidates after the first stop once they cannot win (topo.cpp's
  // Stop; D, TAP's own placement, did before): the plan must be the one
  // every candidate run to its end gives, tile for tile, also in the pools
  // where a later candidate wins. Pools as in the tests above, and coarse
  // tiles (CoarseTilesAreSplitNotHandedBackToTap's), where candidates split
  // tiles and the mean-capped and heaviest-first ones run (measured over the
  // 120 pools: B, the mean-capped pair and C stop 48, 29 and 16 times and
  // win 47, 5 and 12 pools). Checked: fails when a candidate stops on a link
  // as slow as the best's (>=), on one 0.1% faster, or before a later
  // none_within() has read it. Likewise B made from A's home pass
  // (topo_shares_home_pass): all 120 pools share it, 2302 homes kept as A
  // kept them and 898 redone; fails when A's tiles of a redone home are not
  // taken back, or their K/V groups left marked.
  struct Restore {
    ~Restore() {
      libra::detail::topo_stops_early = true;
      libra::detail::topo_shares_home_pass = true;
    }
  } restore;
  const PlanConfig coarse = coarse_tiles_config();
  int pools = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    for (int slots : {2, 4, 8}) {
      const PlanConfig c = slots == 8 ? coarse : paper_like(PlanMode::kTapTopo);
      const auto pool = long_tail_pool(seed, slots, c.seq_len);
      libra::detail::topo_stops_early = true;
      libra::detail::topo_shares_home_pass = true;
      auto stopped = libra::make_plan(pool, c);
      libra::detail::topo_stops_early = false;
      libra::detail::topo_shares_home_pass = false;
      auto full = libra::make_plan(pool, c);
      ASSERT_TRUE(stopped.ok() && full.ok());
      EXPECT_EQ(placement(*stopped), placement(*full)) << "seed " << seed << " slots " << slots;
      EXPECT_EQ(stopped->fingerprint(), full->fingerprint());
      ++pools;
    }
  }
  EXPECT_EQ(pools, 120);
}
