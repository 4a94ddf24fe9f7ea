// Tests of SH-Tiles, TAP placement, the exchange plan and chunks against
// hand computations and an independent, deliberately naive reference
// implementation of planning contract sections 4-7.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/plan.hpp"
#include "tiles/plan_internal.hpp"
#include "tiles/plan_test_util.hpp"

namespace {

using libra::PackedSequence;
using libra::Plan;
using libra::PlanConfig;
using libra::PlanMode;
using libra::Tile;
using libra::Transfer;
using libra::TransferKind;
using libra::test_util::draw_packed_sequence;
using libra::test_util::plan_config;
using libra::test_util::workers_of;

Plan plan_or_die(const std::vector<PackedSequence>& pool, const PlanConfig& c) {
  auto p = libra::make_plan(pool, c);
  if (!p.ok()) {
    ADD_FAILURE() << p.error().message();
    std::abort();
  }
  return *p;
}

// ---------------------------------------------------------------------------
// The reference: contract sections 4-7 written the obvious way: token-by-
// token pair counts, linear scans for samples and committed groups, a
// std::stable_sort for the order, and per-token byte accounting.
namespace ref {

struct RTile {
  int p, b, h;
  std::int64_t begin, end;
  std::int64_t f;
  int home;
  std::vector<int> samples;  // K(t): samples j of slot p that intersect the block
  int sigma = -1;
};

struct Result {
  std::vector<RTile> tiles;
  std::vector<std::int64_t> loads;
  std::int64_t comm = 0;
  std::vector<std::vector<std::int64_t>> matrix;
};

// The sample holding position x of a slot (linear scan), or -1 for padding.
int sample_of(const PackedSequence& seq, std::int64_t x, std::int64_t* start) {
  std::int64_t o = 0;
  for (std::size_t j = 0; j < seq.size(); ++j) {
    if (x >= o && x < o + seq[j]) {
      *start = o;
      return static_cast<int>(j);
    }
    o += seq[j];
  }
  return -1;
}

std::int64_t sample_start(const PackedSequence& seq, int j) {
  std::int64_t o = 0;
  for (int k = 0; k < j; ++k) o += seq[static_cast<std::size_t>(k)];
  return o;
}

// The sizes the reference works with, from the pool and the config.
struct Dims {
  const std::vector<PackedSequence>& pool;
  const PlanConfig& c;
  int P, W, H, hq;
  std::int64_t d, e, per_worker, v_kv;

  Dims(const std::vector<PackedSequence>& pool_, const PlanConfig& c_)
      : pool(pool_), c(c_), P(static_cast<int>(pool_.size())), W(P * c_.cp), H(c_.head_shards),
        hq(c_.shape.heads_q), d(c_.shape.head_dim), e(c_.shape.elem_bytes()), per_worker(c_.seq_len / c_.cp) {
    const std::int64_t kappa = H <= c.shape.heads_kv ? c.shape.heads_kv / H : 1;
    v_kv = 2 * kappa * d * e;
  }
  // The worker whose home holds position x of slot p.
  int resides(int p, std::int64_t x) const { return p * c.cp + static_cast<int>(x / per_worker); }
  // Bytes of sample j's KV that worker r lacks.
  std::int64_t V_g(int p, int j, int r) const {
    const PackedSequence& seq = pool[static_cast<std::size_t>(p)];
    const std::int64_t o = sample_start(seq, j);
    std::int64_t n = 0;
    for (std::int64_t x = o; x < o + seq[static_cast<std::size_t>(j)]; ++x) n += resides(p, x) != r ? 1 : 0;
    return v_kv * n;
  }
  std::int64_t V_QO(const RTile& t) const { return 2 * (t.end - t.begin) * (hq / H) * d * e; }
};

// Every (slot, block, head shard) tile with its FLOPs, home and samples.
std::vector<RTile> make_tiles(const Dims& D) {
  const PlanConfig& c = D.c;
  std::vector<RTile> tiles;
  for (int p = 0; p < D.P; ++p) {
    std::int64_t T = 0;
    for (std::int64_t l : D.pool[static_cast<std::size_t>(p)]) T += l;
    for (int b = 0; static_cast<std::int64_t>(b) * c.block_size < T; ++b) {
      for (int h = 0; h < D.H; ++h) {
        RTile t{p, b, h, b * c.block_size, std::min((b + 1) * c.block_size, T), 0, 0, {}, -1};
        std::int64_t pairs = 0;
        for (std::int64_t x = t.begin; x < t.end; ++x) {
          std::int64_t o = 0;
          const int j = sample_of(D.pool[static_cast<std::size_t>(p)], x, &o);
          pairs += std::min(x - o + 1, c.shape.window);
          if (std::find(t.samples.begin(), t.samples.end(), j) == t.samples.end()) t.samples.push_back(j);
        }
        t.f = (D.hq / D.H) * pairs;
        t.home = p * c.cp + static_cast<int>(b * c.block_size / D.per_worker);
        tiles.push_back(t);
      }
    }
  }
  return tiles;
}

using Committed = std::vector<std::vector<std::tuple<int, int, int>>>;  // per worker: (slot, sample, head shard)

// Greedy placement, heaviest tile first: the cheapest worker under the capacity, else the least loaded.
Committed place(const Dims& D, Result& res) {
  std::int64_t sum = 0;
  for (const RTile& t : res.tiles) sum += t.f;
  const double C = (1 + D.c.tau) * static_cast<double>(sum) / D.W;
  std::vector<int> order(res.tiles.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return res.tiles[static_cast<std::size_t>(a)].f > res.tiles[static_cast<std::size_t>(b)].f;
  });
  Committed committed(static_cast<std::size_t>(D.W));
  res.loads.assign(static_cast<std::size_t>(D.W), 0);
  for (int i : order) {
    RTile& t = res.tiles[static_cast<std::size_t>(i)];
    std::vector<std::tuple<std::int64_t, std::int64_t, int>> head, all;
    for (int r = 0; r < D.W; ++r) {
      std::int64_t dc = r != t.home ? D.V_QO(t) : 0;
      for (int j : t.samples) {
        const auto g = std::make_tuple(t.p, j, t.h);
        const auto& cr = committed[static_cast<std::size_t>(r)];
        if (std::find(cr.begin(), cr.end(), g) == cr.end()) dc += D.V_g(t.p, j, r);
      }
      const std::int64_t load = res.loads[static_cast<std::size_t>(r)];
      if (static_cast<double>(load + t.f) <= C) head.emplace_back(dc, load, r);
      all.emplace_back(load, dc, r);
    }
    const int r = !head.empty() ? std::get<2>(*std::min_element(head.begin(), head.end()))
                                : std::get<2>(*std::min_element(all.begin(), all.end()));
    t.sigma = r;
    res.loads[static_cast<std::size_t>(r)] += t.f;
    for (int j : t.samples) {
      const auto g = std::make_tuple(t.p, j, t.h);
      auto& cr = committed[static_cast<std::size_t>(r)];
      if (std::find(cr.begin(), cr.end(), g) == cr.end()) cr.push_back(g);
    }
  }
  return committed;
}

// Bytes between workers: each committed group's KV rows from their homes, each remote tile's Q and O.
void byte_matrix(const Dims& D, const Committed& committed, Result& res) {
  res.matrix.assign(static_cast<std::size_t>(D.W), std::vector<std::int64_t>(static_cast<std::size_t>(D.W), 0));
  for (int r = 0; r < D.W; ++r) {
    for (const auto& [p, j, h] : committed[static_cast<std::size_t>(r)]) {
      const PackedSequence& seq = D.pool[static_cast<std::size_t>(p)];
      const std::int64_t o = sample_start(seq, j);
      for (std::int64_t x = o; x < o + seq[static_cast<std::size_t>(j)]; ++x) {
        const int src = D.resides(p, x);
        if (src != r) res.matrix[static_cast<std::size_t>(src)][static_cast<std::size_t>(r)] += D.v_kv;
      }
    }
  }
  for (const RTile& t : res.tiles) {
    if (t.sigma == t.home) continue;
    res.matrix[static_cast<std::size_t>(t.home)][static_cast<std::size_t>(t.sigma)] += D.V_QO(t) / 2;
    res.matrix[static_cast<std::size_t>(t.sigma)][static_cast<std::size_t>(t.home)] += D.V_QO(t) / 2;
  }
  for (const auto& row : res.matrix) {
    for (std::int64_t v : row) res.comm += v;
  }
}

Result run(const std::vector<PackedSequence>& pool, const PlanConfig& c) {
  const Dims D(pool, c);
  Result res;
  res.tiles = make_tiles(D);
  const Committed committed = place(D, res);
  byte_matrix(D, committed, res);
  return res;
}

}  // namespace ref

void expect_matches_reference(const std::vector<PackedSequence>& pool, const PlanConfig& c) {
  const Plan plan = plan_or_die(pool, c);
  const ref::Result want = ref::run(pool, c);
  ASSERT_EQ(plan.tiles().size(), want.tiles.size());
  for (std::size_t i = 0; i < want.tiles.size(); ++i) {
    const Tile& t = plan.tiles()[i];
    const ref::RTile& w = want.tiles[i];
    ASSERT_EQ(t.id, static_cast<std::int32_t>(i));
    ASSERT_EQ(std::make_tuple(t.slot, t.block, t.shard, t.begin, t.end, t.flops, t.home, t.worker),
              std::make_tuple(w.p, w.b, w.h, w.begin, w.end, w.f, w.home, w.sigma))
        << "tile " << i;
  }
  EXPECT_EQ(std::vector<std::int64_t>(plan.worker_flops().begin(), plan.worker_flops().end()), want.loads);
  EXPECT_EQ(plan.comm_bytes(), want.comm);
  const int W = plan.num_workers();
  for (int s = 0; s < W; ++s) {
    for (int d = 0; d < W; ++d) {
      ASSERT_EQ(plan.bytes(s, d), want.matrix[static_cast<std::size_t>(s)][static_cast<std::size_t>(d)])
          << s << " -> " << d;
    }
  }
}

// ---------------------------------------------------------------------------
// Hand-computed pools.

TEST(TapPlacement, MatchesHandComputedPoolWithTies) {
  // P = 3 slots, CP = 1 (worker r holds slot r), L = 4, B = 2, H = h_q = h_kv = 1,
  // d = 1, e = 2 (bf16; byte counts below are worked for e = 1, the checks double them), tau = 0. Pool: slot 0 = [4], slot 1 = [1], slot 2 = [1].
  // Tiles: t0 = (0,0) rows [0,2): 1+2 = 3; t1 = (0,1) rows [2,4): 3+4 = 7;
  //        t2 = (1,0): 1; t3 = (2,0): 1.  Sum 12, C = 12/3 = 4.
  // v_kv = 2*1*1*1 = 2 B/token; V_Q+V_O = 2 B per row.
  // Order: t1(7), t0(3), t2(1), t3(1) (t2 before t3 by id).
  //  t1: 7 > 4 everywhere -> fallback min(load, dcomm, r): loads all 0,
  //      dcomm r0 = 0 (home, sample local), r1 = r2 = 4*2 + 4 = 12 -> r0.
  //  t0: r0 full (10 > 4); r1, r2 both dcomm 12 and load 0 -> r1 by id.
  //  t2: r0 full; r1: 3+1 = 4 <= 4, dcomm 0 (its home); r2: 2 + 2 = 4 -> r1.
  //  t3: r0, r1 full (5 > 4); r2 -> r2.
  // Loads 7, 4, 1 -> imbalance 7/4 - 1. Exchange: r1 fetches slot 0's
  // sample (8 B from r0), t0's Q (2 B, 0->1) and O (2 B, 1->0): total 12.
  const std::vector<PackedSequence> pool = {{4}, {1}, {1}};
  const PlanConfig c = plan_config(4, 1, 2, 1, 1, 1, 1, 2, 0.0);
  const Plan p = plan_or_die(pool, c);
  EXPECT_EQ(workers_of(p), (std::vector<int>{1, 0, 1, 2}));
  EXPECT_EQ(std::vector<std::int64_t>(p.worker_flops().begin(), p.worker_flops().end()),
            (std::vector<std::int64_t>{7, 4, 1}));
  EXPECT_DOUBLE_EQ(p.imbalance(), 0.75);
  EXPECT_EQ(p.comm_bytes(), 24);
  EXPECT_EQ(p.bytes(0, 1), 20);
  EXPECT_EQ(p.bytes(1, 0), 4);
  EXPECT_EQ(p.bytes(0, 2) + p.bytes(2, 0) + p.bytes(1, 2) + p.bytes(2, 1), 0);
  expect_matches_reference(pool, c);
}

TEST(TapPlacement, MatchesHandComputedTwoSamplePool) {
  // P = 1, CP = 2, L = 8, B = 2, H = h_q = h_kv = 2, d = 1, e = 2 (bf16; byte counts below are worked for e = 1, the checks double them), tau = 0.
  // Slot 0 = [4, 4]: worker 0 holds sample 0, worker 1 sample 1.
  // Blocks: 3, 7, 3, 7 pairs (x 1 head); C = 40 / 2 = 20.
  // Order: (b1,h0) (b1,h1) (b3,h0) (b3,h1) (b0,h0) (b0,h1) (b2,h0) (b2,h1).
  // Every tile goes to the worker holding its sample while it has headroom:
  // b1 tiles -> 0 (14), b3 tiles: 0 would reach 21 > 20 -> 1 (14); b0 -> 0
  // (17, then exactly 20 <= C), b2 -> 1. Nothing moves.
  const std::vector<PackedSequence> pool = {{4, 4}};
  const PlanConfig c = plan_config(8, 2, 2, 2, 2, 2, 1, 2, 0.0);
  const Plan p = plan_or_die(pool, c);
  EXPECT_EQ(workers_of(p), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(p.comm_bytes(), 0);
  EXPECT_DOUBLE_EQ(p.imbalance(), 0.0);
  expect_matches_reference(pool, c);
}

TEST(TapPlacement, MatchesHandComputedGroupedQueryAttention) {
  // GQA with H > h_kv: P = 1, CP = 2, L = 4, B = 2, H = 2, h_q = 4, h_kv = 1,
  // d = 2, e = 2 (bf16), tau = 0.03. Slot 0 = [3] (position 3 is padding).
  // h_kv divides H: each shard uses 1 KV head, v_kv = 2*1*2*2 = 8 B/token.
  // Blocks: b0 rows [0,2) 1+2 = 3 pairs, b1 row [2,3) 3 pairs; x 2 heads -> f = 6 each.
  // C = 1.03 * 24 / 2 = 12.36. Worker 0 holds tokens 0,1; worker 1 token 2.
  // Groups (sample 0, shard h): V at r0 = 1 token * 8 = 8, at r1 = 2 * 8 = 16.
  // V_Q+V_O: b0 2 rows * 2 heads * 2 * 2 * 2 = 32, b1 16.
  // Order by id (all f = 6): t0 (b0,h0): r0 8 vs r1 48 -> r0; t1 (b0,h1): r0 8 -> r0 (load 12);
  // t2 (b1,h0): r0 would be 18 > C -> r1 (16); t3 -> r1.
  // Traffic: r0 fetches token 2 for both shards (2 * 8 B from r1), r1 fetches tokens 0,1
  // for both shards (2 * 16 B from r0): total 48; the shared KV head travels twice.
  const std::vector<PackedSequence> pool = {{3}};
  PlanConfig c = plan_config(4, 2, 2, 2, 4, 1, 2, 2, 0.03);
  const Plan p = plan_or_die(pool, c);
  EXPECT_EQ(workers_of(p), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.tiles()[1].heads, (libra::HeadRange{2, 4}));
  EXPECT_EQ(p.tiles()[1].kv_heads, (libra::HeadRange{0, 1}));
  EXPECT_EQ(p.comm_bytes(), 48);
  EXPECT_EQ(p.bytes(1, 0), 16);
  EXPECT_EQ(p.bytes(0, 1), 32);
  expect_matches_reference(pool, c);

  // Per-KV-head dedup: one group per (sample, KV head 0): 8 + 16 = 24 bytes.
  c.dedup_per_kv_head = true;
  const Plan q = plan_or_die(pool, c);
  EXPECT_EQ(workers_of(q), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(q.comm_bytes(), 24);
  EXPECT_EQ(q.bytes(1, 0), 8);
  EXPECT_EQ(q.bytes(0, 1), 16);
  EXPECT_EQ(q.groups().size(), 1U);
}

TEST(TapPlacement, SlidingWindowCountsBandPairs) {
  // Window 2: query q sees min(q+1, 2) keys. Slot 0 = [4], B = 4: 1+2+2+2 = 7.
  const std::vector<PackedSequence> pool = {{4}};
  PlanConfig c = plan_config(4, 1, 4, 1, 1, 1, 1, 2, 0.03);
  c.shape.window = 2;
  const Plan p = plan_or_die(pool, c);
  ASSERT_EQ(p.tiles().size(), 1U);
  EXPECT_EQ(p.tiles()[0].flops, 7);
  EXPECT_EQ(p.fragments()[0].key_begin, 0);
  expect_matches_reference(pool, c);
}

TEST(UlyssesPlacement, MatchesHandComputedHeadSplit) {
  // P = 1, CP = 2, h_q = h_kv = 2, L = 4, B = 2, d = 1, e = 2 (bf16; byte counts below are worked for e = 1, the checks double them). Slot 0 = [4].
  // Tiles (b, c) with one head each: worker = c. Loads 3+7 = 10 each.
  // Worker 1 gets b0's Q for head 1 (2 B) and returns O (2 B); worker 0 gets
  // b1's Q for head 0 and returns O; each fetches the other half of the
  // sample's K/V for its head: 2 tokens * 2 B. Each direction: 2 + 2 + 4 = 8.
  const std::vector<PackedSequence> pool = {{4}};
  PlanConfig c = plan_config(4, 2, 2, 2, 2, 2, 1, 2, 0.03);
  c.mode = PlanMode::kUlysses;
  const Plan p = plan_or_die(pool, c);
  EXPECT_EQ(workers_of(p), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(std::vector<std::int64_t>(p.worker_flops().begin(), p.worker_flops().end()),
            (std::vector<std::int64_t>{10, 10}));
  EXPECT_EQ(p.comm_bytes(), 32);
  EXPECT_EQ(p.bytes(0, 1), 16);
  EXPECT_EQ(p.bytes(1, 0), 16);
}

TEST(TapSplitPlacement, MatchesHandComputedSplit) {
  // P = 2, CP = 1 (worker r holds slot r), L = B = 4, H = h_q = h_kv = 1,
  // d = 1, e = 2 (bf16; byte counts below are worked for e = 1, the checks double them), tau = 0.2. Slot 0 = [4]: one tile, f = 1+2+3+4 = 10;
  // slot 1 = [1]: f = 1. C = 1.2 * 11 / 2 = 6.6.
  // Plain TAP: 10 > C everywhere -> fallback worker 0 (load tie, dcomm 0
  // against 4*2 + 2*4 = 16); slot 1's tile -> worker 1. Loads 10, 1.
  // tap-split: worker 0 (least loaded, lowest dcomm) takes the largest
  // suffix that fits: [3,4) = 4 ([2,4) = 7 > 6.6). The rest [0,3) = 6 fits
  // worker 1 (6 <= 6.6; worker 0 would reach 10). Slot 1's tile: worker 1
  // would reach 7 > C -> worker 0 (5). Loads 5, 6: imbalance 6/5.5 - 1.
  // Exchange 0->1: Q rows 0-2 (3 B), slot 0's sample (4 tokens * 2 B),
  // slot 1's O (1 B) = 12; 1->0: O rows 0-2 (3 B), slot 1's token (2 B),
  // slot 1's Q (1 B) = 6.
  const std::vector<PackedSequence> pool = {{4}, {1}};
  PlanConfig c = plan_config(4, 1, 4, 1, 1, 1, 1, 2, 0.2);
  const Plan tap = plan_or_die(pool, c);
  EXPECT_EQ(workers_of(tap), (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(tap.imbalance(), 10.0 / 5.5 - 1);
  c.mode = PlanMode::kTapSplit;
  const Plan p = plan_or_die(pool, c);
  ASSERT_EQ(p.tiles().size(), 3U);
  EXPECT_EQ(workers_of(p), (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(p.tiles()[0].end, 3);
  EXPECT_EQ(p.tiles()[1].begin, 3);
  EXPECT_EQ(p.tiles()[1].piece, 1);
  EXPECT_EQ(p.tiles()[0].flops, 6);
  EXPECT_EQ(p.tiles()[1].flops, 4);
  EXPECT_DOUBLE_EQ(p.imbalance(), 6 / 5.5 - 1);
  EXPECT_EQ(p.bytes(0, 1), 24);
  EXPECT_EQ(p.bytes(1, 0), 12);
}

TEST(TapSplitPlacement, MeetsTauOnPaperPoolsWhereTapOvershoots) {
  // Pools of 8 consecutive builtin:paper-256k sequences at paper shape with
  // coarse tiles (one block per worker, B = L/CP): single tiles then exceed
  // the per-worker target and TAP's fallback overshoots on many pools.
  auto seqs = libra::load_packed_sequences("builtin:paper-256k", 262'144);
  ASSERT_TRUE(seqs.ok()) << seqs.error().message();
  PlanConfig c = plan_config(262'144, 8, 32'768, 8, 32, 4, 128, 2, 0.03);
  c.chunks = 4;
  int tap_over = 0;
  for (std::size_t k = 0; k < 20; ++k) {
    const std::vector<PackedSequence> pool(seqs->begin() + static_cast<std::ptrdiff_t>(8 * k),
                                           seqs->begin() + static_cast<std::ptrdiff_t>(8 * k + 8));
    c.mode = PlanMode::kTap;
    const Plan tap = plan_or_die(pool, c);
    c.mode = PlanMode::kTapSplit;
    const Plan split = plan_or_die(pool, c);
    tap_over += tap.imbalance() > c.tau + 1e-12 ? 1 : 0;
    EXPECT_LE(split.imbalance(), c.tau + 1e-12) << "pool " << k;
  }
  EXPECT_GT(tap_over, 0) << "no pool exercises the split";
}

// Pools of more than 64 workers (the committed-group bitset takes several
// words a group), with a last run of fewer than 8 workers for the
// least-loaded scan (W = 300 is not a multiple of 8), and above 256
// workers (the tournament tree): the same choices as the naive reference.
TEST(TapPlacement, MatchesNaiveReferenceOnWidePools) {
  std::mt19937_64 rng(20261203);
  for (const auto& [P, cp] : {std::pair{9, 8}, std::pair{17, 8}, std::pair{75, 4}}) {
    for (const double tau : {0.0, 0.03, 0.2}) {
      const std::int64_t B = 4, L = cp * B * 2;
      const PlanConfig c = plan_config(L, cp, B, 4, 8, 2, 2, 2, tau);
      std::vector<PackedSequence> pool;
      for (int p = 0; p < P; ++p) {
        PackedSequence seq;
        for (std::int64_t left = std::uniform_int_distribution<std::int64_t>(1, L)(rng); left > 0;) {
          const std::int64_t l = std::uniform_int_distribution<std::int64_t>(1, left)(rng);
          seq.push_back(l);
          left -= l;
        }
        pool.push_back(seq);
      }
      SCOPED_TRACE("W " + std::to_string(P * cp) + ", tau " + std::to_string(tau));
      expect_matches_reference(pool, c);
    }
  }
}

// ---------------------------------------------------------------------------
// Random pools and configurations.

struct Case {
  std::vector<PackedSequence> pool;
  PlanConfig config;
};

rc::Gen<Case> gen_case(PlanMode mode) {
  return rc::gen::exec([mode] {
    Case k;
    const int P = *rc::gen::inRange(1, 4);
    const int cp = *rc::gen::inRange(1, 4);
    const std::int64_t B = *rc::gen::inRange(1, 9);
    const std::int64_t blocks_per_worker = *rc::gen::inRange(1, 4);
    const std::int64_t L = cp * B * blocks_per_worker;
    const int hkv = *rc::gen::element(2, 4);
    const int hq = hkv * *rc::gen::element(2, 4);
    std::vector<int> shards;
    for (int H = 1; H <= hq; ++H) {
      if (hq % H == 0 && (H % hkv == 0 || hkv % H == 0) && (mode != PlanMode::kUlysses || true)) shards.push_back(H);
    }
    const int H = *rc::gen::elementOf(shards);
    std::vector<int> chunks;
    const int width = mode == PlanMode::kUlysses ? hq / cp : hq / H;
    for (int M = 1; M <= std::max(width, 1); ++M) {
      if (width > 0 && width % M == 0 && (hq / H) % M == 0) chunks.push_back(M);
    }
    k.config = plan_config(L, cp, B, H, hq, hkv, *rc::gen::inRange(1, 4), *rc::gen::element(2, 4),
                      *rc::gen::element(0.0, 0.03, 0.2));
    k.config.mode = mode;
    k.config.chunks = chunks.empty() ? 1 : *rc::gen::elementOf(chunks);
    if (*rc::gen::inRange(0, 4) == 0) k.config.shape.window = *rc::gen::inRange<std::int64_t>(1, 6);
    for (int p = 0; p < P; ++p) k.pool.push_back(draw_packed_sequence(L));
    return k;
  });
}

bool ulysses_ok(const PlanConfig& c) {
  const int hq = c.shape.heads_q, hkv = c.shape.heads_kv;
  return hq % c.cp == 0 && (c.cp % hkv == 0 || hkv % c.cp == 0) && (hq / c.cp) % c.chunks == 0;
}

RC_GTEST_PROP(TapPlacement, MatchesNaiveReferenceOnRandomPools, ()) {
  const Case k = *gen_case(PlanMode::kTap);
  const Plan plan = plan_or_die(k.pool, k.config);
  const ref::Result want = ref::run(k.pool, k.config);
  RC_ASSERT(plan.tiles().size() == want.tiles.size());
  for (std::size_t i = 0; i < want.tiles.size(); ++i) {
    const Tile& t = plan.tiles()[i];
    const ref::RTile& w = want.tiles[i];
    RC_ASSERT(std::make_tuple(t.slot, t.block, t.shard, t.begin, t.end, t.flops, t.home, t.worker) ==
              std::make_tuple(w.p, w.b, w.h, w.begin, w.end, w.f, w.home, w.sigma));
  }
  RC_ASSERT(std::vector<std::int64_t>(plan.worker_flops().begin(), plan.worker_flops().end()) == want.loads);
  RC_ASSERT(plan.comm_bytes() == want.comm);
  const int W = plan.num_workers();
  for (int s = 0; s < W; ++s) {
    for (int d = 0; d < W; ++d) {
      RC_ASSERT(plan.bytes(s, d) == want.matrix[static_cast<std::size_t>(s)][static_cast<std::size_t>(d)]);
    }
  }
}

// The worker whose home holds row x of slot p.
int home_of(const PlanConfig& c, int p, std::int64_t x) {
  return p * c.cp + static_cast<int>(x / (c.seq_len / c.cp));
}

// Every (slot, row, query head) of every real token is computed exactly once.
void check_coverage(const std::vector<PackedSequence>& pool, const PlanConfig& c, const Plan& plan) {
  std::map<std::tuple<int, std::int64_t, int>, int> covered;
  for (const Tile& t : plan.tiles()) {
    for (std::int64_t x = t.begin; x < t.end; ++x) {
      for (int h = t.heads.begin; h < t.heads.end; ++h) ++covered[{t.slot, x, h}];
    }
  }
  std::size_t expected = 0;
  for (const PackedSequence& seq : pool) {
    std::int64_t T = 0;
    for (std::int64_t l : seq) T += l;
    expected += static_cast<std::size_t>(T) * static_cast<std::size_t>(c.shape.heads_q);
  }
  RC_ASSERT(covered.size() == expected);
  for (const auto& [key, n] : covered) RC_ASSERT(n == 1);
}

// Tiles in (slot, block, shard, piece) order with ids in that order; the
// pieces of a (slot, block, shard) numbered from 0, the first at the
// block's first row and each continuing the last (what make_plan takes
// from its placers without checking them row by row).
void check_tile_order(const PlanConfig& c, const Plan& plan) {
  for (std::size_t i = 0; i < plan.tiles().size(); ++i) {
    const Tile& t = plan.tiles()[i];
    RC_ASSERT(t.id == static_cast<std::int32_t>(i));
    if (t.piece == 0) {
      RC_ASSERT(t.begin == t.block * c.block_size);
    } else {
      RC_ASSERT(i > 0);
      const Tile& prev = plan.tiles()[i - 1];
      RC_ASSERT(prev.slot == t.slot && prev.block == t.block && prev.shard == t.shard);
      RC_ASSERT(prev.piece + 1 == t.piece && prev.end == t.begin);
    }
    RC_ASSERT(t.begin < t.end && t.end <= (t.block + 1) * c.block_size);
    if (i > 0) {
      const Tile& prev = plan.tiles()[i - 1];
      RC_ASSERT(std::tie(prev.slot, prev.block, prev.shard, prev.piece) < std::tie(t.slot, t.block, t.shard, t.piece));
    }
  }
}

// Loads are the sums of the tiles' FLOPs; compute lists hold each tile once.
// Byte matrix: diagonal zero, entries = transfer sums, total = comm_bytes.
void check_loads_and_bytes(const PlanConfig& c, const Plan& plan) {
  const int W = plan.num_workers();
  std::vector<std::int64_t> loads(static_cast<std::size_t>(W), 0);
  std::size_t listed = 0;
  for (const Tile& t : plan.tiles()) loads[static_cast<std::size_t>(t.worker)] += t.flops;
  for (int r = 0; r < W; ++r) {
    RC_ASSERT(loads[static_cast<std::size_t>(r)] == plan.worker_flops()[static_cast<std::size_t>(r)]);
    for (std::int32_t id : plan.worker_tiles(r)) RC_ASSERT(plan.tiles()[static_cast<std::size_t>(id)].worker == r);
    listed += plan.worker_tiles(r).size();
  }
  RC_ASSERT(listed == plan.tiles().size());
  const std::int64_t d = c.shape.head_dim, e = c.shape.elem_bytes();
  std::int64_t total = 0;
  for (int s = 0; s < W; ++s) {
    for (int t = 0; t < W; ++t) {
      std::int64_t sum = 0;
      for (const Transfer& x : plan.transfers(s, t)) {
        RC_ASSERT(x.src == s && x.dst == t && s != t);
        const std::int64_t per = (x.kind == TransferKind::kKv ? 2 : 1) * d * e;
        RC_ASSERT(x.bytes == (x.end - x.begin) * x.heads.size() * per);
        sum += x.bytes;
      }
      RC_ASSERT(sum == plan.bytes(s, t));
      total += sum;
    }
  }
  RC_ASSERT(total == plan.comm_bytes());
}

// What each worker holds after the exchange, replayed from the transfers.
struct Held {
  std::set<std::tuple<int, int, std::int64_t, int>> q_at;   // (worker, slot, row, head)
  std::set<std::tuple<int, int, std::int64_t, int>> kv_at;  // (worker, slot, token, kv head)
  std::set<std::tuple<int, int, std::int64_t, int>> o_at;   // (home, slot, row, head)
  std::map<std::tuple<int, int>, std::int64_t> kv_group_tokens;  // (dst, group): tokens received
};

// Replays the transfers: KV from the rows' homes, Q and O between a tile's home and worker.
Held replay_transfers(const PlanConfig& c, const Plan& plan) {
  Held held;
  for (const Transfer& x : plan.all_transfers()) {
    for (std::int64_t tok = x.begin; tok < x.end; ++tok) {
      for (int h = x.heads.begin; h < x.heads.end; ++h) {
        if (x.kind == TransferKind::kQ) held.q_at.insert({x.dst, x.slot, tok, h});
        if (x.kind == TransferKind::kKv) held.kv_at.insert({x.dst, x.slot, tok, h});
        if (x.kind == TransferKind::kO) held.o_at.insert({x.dst, x.slot, tok, h});
      }
    }
    if (x.kind == TransferKind::kKv) {
      RC_ASSERT(home_of(c, x.slot, x.begin) == x.src && home_of(c, x.slot, x.end - 1) == x.src);
      held.kv_group_tokens[{x.dst, x.group}] += x.end - x.begin;
    } else {
      const Tile& t = plan.tiles()[static_cast<std::size_t>(x.tile)];
      RC_ASSERT(t.home != t.worker);
      const bool direction_ok = x.kind == TransferKind::kQ ? (x.src == t.home && x.dst == t.worker)
                                                           : (x.src == t.worker && x.dst == t.home);
      RC_ASSERT(direction_ok);
      RC_ASSERT(x.begin == t.begin && x.end == t.end && x.heads == t.heads);
      RC_ASSERT(home_of(c, t.slot, t.begin) == t.home && home_of(c, t.slot, t.end - 1) == t.home);
    }
  }
  return held;
}

// What a worker holds of a group: the whole sample, or with kv_prefix the
// keys up to its last query row of the sample, recounted here from the
// fragments. Each fetched group arrives exactly once: the tokens received
// equal the held tokens that do not reside on the destination.
void check_kv_groups(const PlanConfig& c, const Plan& plan, const Held& held) {
  std::map<std::pair<int, std::int32_t>, std::int64_t> held_end;
  for (const libra::Fragment& f : plan.fragments()) {
    const int r = plan.tiles()[static_cast<std::size_t>(f.tile)].worker;
    std::int64_t& end = held_end[{r, f.group}];
    end = std::max(end, f.sample_start + (c.kv_prefix ? f.e : f.sample_length));
  }
  for (const auto& [key, end] : held_end) {
    const libra::KvGroup& g = plan.groups()[static_cast<std::size_t>(key.second)];
    RC_ASSERT(plan.kv_span(key.first, key.second) == (libra::TokenSpan{g.begin, end}));
  }
  for (const auto& [key, n] : held.kv_group_tokens) {
    const auto& [dst, gid] = key;
    const libra::KvGroup& g = plan.groups()[static_cast<std::size_t>(gid)];
    std::int64_t remote = 0;
    const std::int64_t end = held_end.at({dst, gid});
    for (std::int64_t x = g.begin; x < end; ++x) remote += home_of(c, g.slot, x) != dst ? 1 : 0;
    RC_ASSERT(n == remote);
    const auto wg = plan.worker_groups(dst);
    RC_ASSERT(std::binary_search(wg.begin(), wg.end(), gid));
  }
}

// Every tile's worker holds its Q rows and the keys its fragments see, its home gets its O back, and its
// FLOPs are its fragments' (query, key) pairs times its heads.
void check_tile_inputs(const PlanConfig& c, const Plan& plan, const Held& held) {
  const int group = c.shape.heads_q / c.shape.heads_kv;
  for (const Tile& t : plan.tiles()) {
    const int r = t.worker;
    for (std::int64_t x = t.begin; x < t.end; ++x) {
      for (int h = t.heads.begin; h < t.heads.end; ++h) {
        RC_ASSERT(home_of(c, t.slot, x) == r || held.q_at.count({r, t.slot, x, h}) == 1);
        RC_ASSERT(t.home == r || held.o_at.count({t.home, t.slot, x, h}) == 1);
      }
    }
    std::int64_t pairs = 0;
    for (std::int32_t fi = t.fragment_begin; fi < t.fragment_end; ++fi) {
      const libra::Fragment& f = plan.fragments()[static_cast<std::size_t>(fi)];
      RC_ASSERT(f.tile == t.id);
      for (std::int64_t q = f.a; q < f.e; ++q) pairs += std::min(q + 1, c.shape.window);
      for (std::int64_t key = f.key_begin; key < f.e; ++key) {
        const std::int64_t tok = f.sample_start + key;
        for (int h = t.heads.begin; h < t.heads.end; ++h) {
          const int kvh = h / group;
          RC_ASSERT(kvh >= t.kv_heads.begin && kvh < t.kv_heads.end);
          RC_ASSERT(home_of(c, t.slot, tok) == r || held.kv_at.count({r, t.slot, tok, kvh}) == 1);
        }
      }
    }
    RC_ASSERT(t.flops == pairs * t.heads.size());
  }
}

// Chunks: each carries 1/M of the Q/O bytes of every pair, the KV bytes
// add up to the total, and chunk m's Q/O heads are the m-th slice.
void check_chunk_bytes(const PlanConfig& c, const Plan& plan) {
  const int W = plan.num_workers();
  const int M = c.chunks;
  for (int s = 0; s < W; ++s) {
    for (int t = 0; t < W; ++t) {
      std::int64_t qo = 0, kv = 0;
      for (const Transfer& x : plan.transfers(s, t)) (x.kind == TransferKind::kKv ? kv : qo) += x.bytes;
      std::int64_t kv_sum = 0, all = 0;
      for (int m = 0; m < M; ++m) {
        std::int64_t cqo = 0, ckv = 0;
        for (const Transfer& x : plan.chunk_transfers(m, s, t)) {
          (x.kind == TransferKind::kKv ? ckv : cqo) += x.bytes;
          RC_ASSERT(x.heads.size() > 0);
          if (x.kind != TransferKind::kKv) {
            const Tile& tile = plan.tiles()[static_cast<std::size_t>(x.tile)];
            RC_ASSERT(x.heads == plan.chunk_heads(tile, m));
          }
        }
        RC_ASSERT(cqo * M == qo);
        kv_sum += ckv;
        all += cqo + ckv;
        RC_ASSERT(cqo + ckv == plan.chunk_bytes(m, s, t));
      }
      RC_ASSERT(kv_sum == kv);
      RC_ASSERT(all == plan.bytes(s, t));
    }
  }
}

// Replays a plan like an executor would and checks every invariant the
// executor relies on. Works for every mode and option.
void check_plan_invariants(const std::vector<PackedSequence>& pool, const PlanConfig& c, const Plan& plan) {
  check_coverage(pool, c, plan);
  check_tile_order(c, plan);
  check_loads_and_bytes(c, plan);
  const Held held = replay_transfers(c, plan);
  check_kv_groups(c, plan, held);
  check_tile_inputs(c, plan, held);
  check_chunk_bytes(c, plan);
}

RC_GTEST_PROP(PlanInvariants, HoldForTapOnRandomPools, ()) {
  Case k = *gen_case(PlanMode::kTap);
  k.config.dedup_per_kv_head = *rc::gen::arbitrary<bool>();
  check_plan_invariants(k.pool, k.config, plan_or_die(k.pool, k.config));
}

RC_GTEST_PROP(PlanInvariants, HoldForTapSplitOnRandomPools, ()) {
  Case k = *gen_case(PlanMode::kTapSplit);
  k.config.dedup_per_kv_head = *rc::gen::arbitrary<bool>();
  check_plan_invariants(k.pool, k.config, plan_or_die(k.pool, k.config));
}

RC_GTEST_PROP(PlanInvariants, HoldWithKvPrefixOnRandomPools, ()) {
  Case k = *gen_case(*rc::gen::element(PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo));
  k.config.dedup_per_kv_head = *rc::gen::arbitrary<bool>();
  k.config.kv_prefix = true;
  check_plan_invariants(k.pool, k.config, plan_or_die(k.pool, k.config));
}

// The prefix changes no tile and no Q/O item; it only cuts KV items (never
// adds one), and it cuts something whenever a worker holds a sample whose
// last rows it does not compute.
RC_GTEST_PROP(KvPrefix, SameTilesNeverMoreBytes, ()) {
  Case k = *gen_case(*rc::gen::element(PlanMode::kTap, PlanMode::kTapTopo));
  const Plan whole = plan_or_die(k.pool, k.config);
  k.config.kv_prefix = true;
  const Plan prefix = plan_or_die(k.pool, k.config);
  RC_ASSERT(workers_of(whole) == workers_of(prefix));
  RC_ASSERT(whole.fingerprint() != prefix.fingerprint());
  const int W = whole.num_workers();
  for (int s = 0; s < W; ++s) {
    for (int d = 0; d < W; ++d) {
      std::int64_t qo_a = 0, qo_b = 0, kv_a = 0, kv_b = 0;
      for (const Transfer& x : whole.transfers(s, d)) (x.kind == TransferKind::kKv ? kv_a : qo_a) += x.bytes;
      for (const Transfer& x : prefix.transfers(s, d)) (x.kind == TransferKind::kKv ? kv_b : qo_b) += x.bytes;
      RC_ASSERT(qo_a == qo_b);
      RC_ASSERT(kv_b <= kv_a);
    }
  }
}

TEST(KvPrefix, HandComputedTwoRankSample) {
  // One slot, CP 2, L 8: sample 0 is rows [0, 8) over both ranks. With B 2,
  // H 1 and tau 0 TAP moves tiles between the two ranks; every worker
  // holding the sample needs keys [0, e) for its last row e only.
  PlanConfig c = plan_config(8, 2, 2, 1, 1, 1, 1, 4, 0.0);
  c.kv_prefix = true;
  const Plan plan = plan_or_die({{8}}, c);
  for (int r = 0; r < 2; ++r) {
    std::int64_t last = 0;
    for (std::int32_t id : plan.worker_tiles(r)) last = std::max(last, plan.tiles()[static_cast<std::size_t>(id)].end);
    EXPECT_EQ(plan.kv_span(r, 0), (libra::TokenSpan{0, last})) << "worker " << r;
    // Rank 0 holds rows [0, 4): it receives exactly the rows [4, last).
    std::int64_t got = 0;
    for (const Transfer& x : plan.transfers(1 - r, r)) {
      if (x.kind == TransferKind::kKv) got += x.end - x.begin;
    }
    const std::int64_t own_begin = 4 * r, own_end = 4 * r + 4;
    const std::int64_t want = last - std::min(last, own_end) + std::max<std::int64_t>(0, std::min(last, own_begin));
    EXPECT_EQ(got, want) << "worker " << r;
  }
}

RC_GTEST_PROP(PlanInvariants, HoldForUlyssesOnRandomPools, ()) {
  Case k = *gen_case(PlanMode::kUlysses);
  RC_PRE(ulysses_ok(k.config));
  check_plan_invariants(k.pool, k.config, plan_or_die(k.pool, k.config));
  const Plan plan = plan_or_die(k.pool, k.config);
  for (const Tile& t : plan.tiles()) RC_ASSERT(t.worker == t.slot * k.config.cp + t.shard);
}

RC_GTEST_PROP(TapSplitPlacement, NeverWorseThanTapAndTapUnchangedByOption, ()) {
  Case k = *gen_case(PlanMode::kTap);
  const Plan tap = plan_or_die(k.pool, k.config);
  k.config.mode = PlanMode::kTapSplit;
  const Plan split = plan_or_die(k.pool, k.config);
  // When no TAP tile needed the fallback (every load <= C), tap-split is
  // TAP tile for tile; otherwise it is never worse.
  std::int64_t total = 0, tap_max = 0;
  for (std::int64_t f : tap.worker_flops()) {
    total += f;
    tap_max = std::max(tap_max, f);
  }
  const double C = (1 + k.config.tau) * static_cast<double>(total) / tap.num_workers();
  if (static_cast<double>(tap_max) <= C) {
    RC_ASSERT(workers_of(tap) == workers_of(split));
    RC_ASSERT(tap.comm_bytes() == split.comm_bytes());
  }
  RC_ASSERT(split.imbalance() <= tap.imbalance());
}

// What the simulator prices of a plan: its tiles, loads and exchange sums
// (at its own M and re-chunked to one chunk).
void expect_same_priced(const Plan& a, const Plan& b) {
  RC_ASSERT(workers_of(a) == workers_of(b));
  RC_ASSERT(a.tiles().size() == b.tiles().size());
  for (std::size_t i = 0; i < a.tiles().size(); ++i) {
    const Tile &x = a.tiles()[i], &y = b.tiles()[i];
    RC_ASSERT(std::tie(x.slot, x.block, x.shard, x.piece, x.begin, x.end, x.flops, x.home) ==
              std::tie(y.slot, y.block, y.shard, y.piece, y.begin, y.end, y.flops, y.home));
  }
  RC_ASSERT(std::ranges::equal(a.worker_flops(), b.worker_flops()));
  RC_ASSERT(a.comm_bytes() == b.comm_bytes());
  auto sums_equal = [](const Plan& p, const Plan& q) {
    const libra::detail::ExchangeSums x = libra::detail::exchange_sums(p.data_as_built());
    const libra::detail::ExchangeSums y = libra::detail::exchange_sums(q.data_as_built());
    return x.pairs == y.pairs && x.reverse == y.reverse && x.qo_row_heads == y.qo_row_heads &&
           x.kv_token_heads == y.kv_token_heads && x.dkv_rows == y.dkv_rows && x.bytes == y.bytes;
  };
  RC_ASSERT(sums_equal(a, b));
  const auto a1 = libra::rechunk_plan(a, 1), b1 = libra::rechunk_plan(b, 1);
  RC_ASSERT(a1.ok() && b1.ok());
  RC_ASSERT(sums_equal(*a1, *b1));
}

// The simulator prices one plan for libra-tap-vrsp and libra-plus where
// same_tap_plan says tap-split (or tap) makes tap's plan: planning again
// must give the same tiles and exchange. Drawn near the rule's edges: tau
// 0 (TAP often misses C, and tap-split then splits), dedup_per_kv_head at
// H < h_kv (renames keys), H = h_kv (inert) and H > h_kv (merges), another
// pool or setting.
RC_GTEST_PROP(SameTapPlan, SaysSameOnlyWherePlanningAgainGivesTapsPlan, ()) {
  const Case k = *gen_case(PlanMode::kTap);
  const Plan tap = plan_or_die(k.pool, k.config);
  PlanConfig c = k.config;
  c.mode = *rc::gen::element(PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo);
  c.dedup_per_kv_head = *rc::gen::arbitrary<bool>();
  std::vector<PackedSequence> pool = k.pool;
  switch (*rc::gen::inRange(0, 6)) {
    case 0: c.tau = c.tau == 0 ? 0.03 : 0; break;
    case 1: pool.back() = draw_packed_sequence(c.seq_len); break;
    case 2: c.kv_prefix = true; break;
    default: break;
  }
  const bool same = libra::detail::same_tap_plan(tap, pool, c);
  const bool inputs = libra::detail::same_tap_inputs(k.config, c) && pool == k.pool;
  RC_ASSERT(inputs || !same);
  if (c.mode == PlanMode::kTap) RC_ASSERT(same == inputs);
  RC_CLASSIFY(same, "same");
  RC_CLASSIFY(!same && c.mode == PlanMode::kTapSplit && c.dedup_per_kv_head == false && c.tau == k.config.tau &&
                  pool == k.pool && !c.kv_prefix,
              "tap-split splits");
  if (!same) return;
  expect_same_priced(plan_or_die(pool, c), tap);
}

// The rule's cases by hand: tap-split with dedup_per_kv_head at H = h_kv on
// a pool TAP balances within C; with H > h_kv (merged keys); with tau 0
// where TAP misses C and tap-split cuts a tile.
TEST(SameTapPlan, HandPickedCases) {
  const std::vector<PackedSequence> pool = {{9, 3, 4}, {16}, {2, 12, 2}, {5, 5}};
  PlanConfig tc = plan_config(16, 2, 4, 2, 8, 2, 4, 2, 0.5);
  const Plan tap = plan_or_die(pool, tc);
  PlanConfig plus = tc;
  plus.mode = PlanMode::kTapSplit;
  plus.dedup_per_kv_head = true;
  EXPECT_TRUE(libra::detail::same_tap_plan(tap, pool, plus));
  EXPECT_EQ(workers_of(plan_or_die(pool, plus)), workers_of(tap));
  std::vector<PackedSequence> other = pool;
  other[3] = {4, 6};
  EXPECT_FALSE(libra::detail::same_tap_plan(tap, other, plus));
  PlanConfig merged = tc;
  merged.head_shards = 4;
  const Plan tap4 = plan_or_die(pool, merged);
  merged.mode = PlanMode::kTapSplit;
  merged.dedup_per_kv_head = true;
  EXPECT_FALSE(libra::detail::same_tap_plan(tap4, pool, merged));
  EXPECT_NE(plan_or_die(pool, merged).comm_bytes(), tap4.comm_bytes());
  // One slot of one 12-token sample on 2 workers in blocks of 4: 10, 26
  // and 42 pairs, so TAP's 42 misses C = 39 at tau 0, and tap-split cuts it.
  PlanConfig tight = plan_config(16, 2, 4, 1, 2, 2, 4, 2, 0.0);
  const std::vector<PackedSequence> one = {{12}};
  const Plan tap0 = plan_or_die(one, tight);
  tight.mode = PlanMode::kTapSplit;
  EXPECT_FALSE(libra::detail::same_tap_plan(tap0, one, tight));
  EXPECT_NE(plan_or_die(one, tight).tiles().size(), tap0.tiles().size());
}

RC_GTEST_PROP(DedupPerKvHead, NeverMoreBytesWhenSharedHeadsAreOnlyGrouped, ()) {
  // With H <= h_kv shards never share a KV head: the option changes nothing.
  Case k = *gen_case(PlanMode::kTap);
  RC_PRE(k.config.head_shards <= k.config.shape.heads_kv);
  const Plan a = plan_or_die(k.pool, k.config);
  k.config.dedup_per_kv_head = true;
  const Plan b = plan_or_die(k.pool, k.config);
  RC_ASSERT(workers_of(a) == workers_of(b));
  RC_ASSERT(a.comm_bytes() == b.comm_bytes());
}

// kv_use and the chunk lists' first_use/last_use against a brute force over
// tiles, fragments and chunk heads: every KV head arrives with the chunk of
// its first use on the receiving worker.
TEST(PlanChunks, KvUseRecordsFirstAndLastChunkOfEveryKvHead) {
  const std::vector<PackedSequence> pool = {{9, 3, 4}, {16}, {2, 12, 2}, {5, 5}};
  struct Shape {
    int H, hq, hkv, M;
    bool dedup;
    PlanMode mode;
  };
  for (const Shape sh : {Shape{1, 8, 2, 4, false, PlanMode::kTap}, Shape{2, 8, 2, 2, false, PlanMode::kTap},
                         Shape{4, 8, 1, 2, false, PlanMode::kTap}, Shape{4, 8, 2, 2, true, PlanMode::kTap},
                         Shape{2, 8, 2, 4, false, PlanMode::kTapSplit}, Shape{2, 8, 4, 4, false, PlanMode::kUlysses}}) {
    PlanConfig c = plan_config(16, 2, 4, sh.H, sh.hq, sh.hkv, 4, 2, 0.0);
    c.chunks = sh.M;
    c.dedup_per_kv_head = sh.dedup;
    c.mode = sh.mode;
    const Plan p = plan_or_die(pool, c);
    const int grp = sh.hq / sh.hkv, W = p.num_workers();
    auto brute = [&](int r, std::int32_t gid, std::int32_t k) {
      libra::ChunkUse u;
      for (const Tile& t : p.tiles()) {
        if (t.worker != r) continue;
        bool has = false;
        for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) has |= p.fragments()[static_cast<std::size_t>(f)].group == gid;
        if (!has) continue;
        for (int m = 0; m < sh.M; ++m) {
          const libra::HeadRange ch = p.chunk_heads(t, m);
          for (std::int32_t i = ch.begin; i < ch.end; ++i) {
            if (i / grp != k) continue;
            if (!u.used()) u = {m, m};
            u.first = std::min(u.first, m);
            u.last = std::max(u.last, m);
          }
        }
      }
      return u;
    };
    for (int r = 0; r < W; ++r) {
      for (std::int32_t gid : p.worker_groups(r)) {
        const libra::KvGroup& g = p.groups()[static_cast<std::size_t>(gid)];
        for (std::int32_t k = g.kv_heads.begin; k < g.kv_heads.end; ++k) {
          const libra::ChunkUse a = p.kv_use(r, gid, k), b = brute(r, gid, k);
          EXPECT_EQ(a.first, b.first);
          EXPECT_EQ(a.last, b.last);
        }
      }
    }
    for (int m = 0; m < sh.M; ++m) {
      for (int s = 0; s < W; ++s) {
        for (int d = 0; d < W; ++d) {
          for (const libra::Transfer& x : p.chunk_transfers(m, s, d)) {
            if (x.kind != libra::TransferKind::kKv) {
              EXPECT_EQ(x.first_use, m);
              EXPECT_EQ(x.last_use, m);
              continue;
            }
            int first = sh.M, last = -1;
            for (std::int32_t k = x.heads.begin; k < x.heads.end; ++k) {
              const libra::ChunkUse b = brute(d, x.group, k);
              ASSERT_TRUE(b.used()) << "KV head " << k << " of group " << x.group << " sent to a worker that never reads it";
              first = std::min(first, b.first);
              last = std::max(last, b.last);
              EXPECT_EQ(b.first, m) << "KV head " << k << " arrives in chunk " << m << ", first read in " << b.first;
            }
            EXPECT_EQ(x.first_use, first);
            EXPECT_EQ(x.last_use, last);
          }
        }
      }
    }
  }
}

TEST(PlanChunks, GroupedQueryKvHeadTravelsWithFirstChunk) {
  // h_q = 8, h_kv = 2, H = 1: one shard of 8 query heads using KV heads 0,1
  // (query heads 0-3 -> KV 0, 4-7 -> KV 1). M = 4 chunks of 2 query heads:
  // KV head 0 first used by chunk 0, KV head 1 by chunk 2.
  const std::vector<PackedSequence> pool = {{4}, {4}};
  PlanConfig c = plan_config(4, 1, 4, 1, 8, 2, 1, 2, 0.0);
  c.chunks = 4;
  const Plan p = plan_or_die(pool, c);
  const libra::HeadRange shard{0, 8}, kv{0, 2};
  EXPECT_EQ(p.chunk_kv_heads(shard, kv, 0), (libra::HeadRange{0, 1}));
  EXPECT_EQ(p.chunk_kv_heads(shard, kv, 1).size(), 0);
  EXPECT_EQ(p.chunk_kv_heads(shard, kv, 2), (libra::HeadRange{1, 2}));
  EXPECT_EQ(p.chunk_kv_heads(shard, kv, 3).size(), 0);
  EXPECT_EQ(p.chunk_heads(p.tiles()[0], 3), (libra::HeadRange{6, 8}));
  // Where M divides the KV heads of a shard, KV splits evenly.
  c.chunks = 2;
  const Plan q = plan_or_die(pool, c);
  EXPECT_EQ(q.chunk_kv_heads(shard, kv, 0), (libra::HeadRange{0, 1}));
  EXPECT_EQ(q.chunk_kv_heads(shard, kv, 1), (libra::HeadRange{1, 2}));
}

// ---------------------------------------------------------------------------
// Bad input: one line naming the rule.

struct BadCase {
  const char* name;
  PlanConfig config;
  std::vector<PackedSequence> pool;
  const char* message_part;
};

TEST(PlanErrors, RejectsImpossibleConfigurationsAndPools) {
  const PlanConfig good = plan_config(16, 2, 4, 2, 4, 2, 8, 2, 0.03);
  std::vector<BadCase> cases;
  auto with = [&](auto f) {
    PlanConfig c = good;
    f(c);
    return c;
  };
  cases.push_back({"L by cp", with([](PlanConfig& c) { c.cp = 3; }), {{4}}, "seq_len 16 must be divisible by cp 3"});
  cases.push_back({"L/cp by B", with([](PlanConfig& c) { c.block_size = 3; }), {{4}}, "divisible by block_size 3"});
  cases.push_back({"H | h_q", with([](PlanConfig& c) { c.head_shards = 3; }), {{4}}, "head_shards 3 must divide heads_q 4"});
  cases.push_back({"H vs h_kv", with([](PlanConfig& c) {
                     c.shape.heads_q = 12;
                     c.shape.heads_kv = 4;
                     c.head_shards = 6;
                   }),
                   {{4}},
                   "one must divide the other"});
  cases.push_back({"M | h_q/H", with([](PlanConfig& c) { c.chunks = 3; }), {{4}}, "chunks 3 must divide"});
  cases.push_back({"h_kv | h_q", with([](PlanConfig& c) { c.shape.heads_kv = 3; }), {{4}}, "heads_kv 3 must divide"});
  cases.push_back({"zero cp", with([](PlanConfig& c) { c.cp = 0; }), {{4}}, "cp 0 must be positive"});
  cases.push_back({"negative B", with([](PlanConfig& c) { c.block_size = -4; }), {{4}}, "must be positive"});
  cases.push_back({"negative tau", with([](PlanConfig& c) { c.tau = -1; }), {{4}}, "tau"});
  cases.push_back({"ulysses cp | h_q", with([](PlanConfig& c) {
                     c.mode = PlanMode::kUlysses;
                     c.cp = 8;
                     c.seq_len = 32;
                   }),
                   {{4}},
                   "cp 8 must divide heads_q 4"});
  cases.push_back({"too long", good, {{10, 7}}, "longer than seq_len 16"});
  cases.push_back({"empty pool", good, {}, "pool: empty"});
  cases.push_back({"empty slot", good, {{4}, {}}, "pool slot 1: packed sequence is empty"});
  cases.push_back({"bad length", good, {{4, 0}}, "sample 1: length 0 must be positive"});
  cases.push_back({"overflow", with([](PlanConfig& c) {
                     c.seq_len = std::int64_t{1} << 62;
                     c.block_size = std::int64_t{1} << 60;
                   }),
                   {{std::int64_t{1} << 61}},
                   "64-bit range"});
  for (const BadCase& b : cases) {
    auto p = libra::make_plan(b.pool, b.config);
    ASSERT_FALSE(p.ok()) << b.name;
    EXPECT_NE(p.error().message().find(b.message_part), std::string::npos) << b.name << ": " << p.error().message();
    EXPECT_EQ(p.error().message().find('\n'), std::string::npos) << b.name;
    EXPECT_EQ(p.error().code(), libra::ErrorCode::kInvalidInput) << b.name;
  }
}

TEST(PlanMode, ParsesAndNamesEveryMode) {
  for (PlanMode m : {PlanMode::kTap, PlanMode::kUlysses, PlanMode::kTapSplit}) {
    auto parsed = libra::parse_plan_mode(libra::plan_mode_name(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_FALSE(libra::parse_plan_mode("vrsp").ok());
}

}  // namespace

// No placement reads M, so re-chunking a plan's tiles is make_plan at the new
// M: the simulator prices every M of a candidate from one placement.
TEST(PlanChunks, RechunkEqualsPlanningAgainAtThatM) {
  const std::vector<PackedSequence> pool = {{9, 3, 4}, {16}, {2, 12, 2}, {5, 5}};
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo}) {
    for (int option = 0; option < 3; ++option) {
      PlanConfig c = plan_config(16, 2, 4, 2, 8, 2, 4, 2, 0.03);
      c.mode = mode;
      c.dedup_per_kv_head = option == 1;
      c.kv_prefix = option == 2;
      // Two workers per node: a pool of four slots spans four nodes, so
      // tap-topo's placement differs from tap's.
      c.topology.gpus_per_node = 2;
      c.topology.nodes_per_supernode = 2;
      c.chunks = 4;
      const Plan four = plan_or_die(pool, c);
      for (int m : {1, 2, 4}) {
        c.chunks = m;
        const Plan direct = plan_or_die(pool, c);
        auto re = libra::rechunk_plan(four, m);
        ASSERT_TRUE(re.ok()) << re.error().message();
        EXPECT_EQ(re->fingerprint(), direct.fingerprint()) << libra::plan_mode_name(mode) << " M=" << m;
        EXPECT_EQ(re->config().chunks, m);
        EXPECT_EQ(workers_of(*re), workers_of(direct));
        for (int k = 0; k < m; ++k) {
          for (int s = 0; s < direct.num_workers(); ++s) {
            for (int d = 0; d < direct.num_workers(); ++d) {
              EXPECT_EQ(re->chunk_bytes(k, s, d), direct.chunk_bytes(k, s, d));
            }
          }
        }
      }
      auto bad = libra::rechunk_plan(four, 3);
      ASSERT_FALSE(bad.ok());
      EXPECT_NE(bad.error().message().find("chunks 3 must divide"), std::string::npos) << bad.error().message();
    }
  }
}

// Keys that merge shards (dedup_per_kv_head, H > h_kv): a re-chunked plan's
// per-entry K/V uses are made again from the base plan's fragments, and
// equal those of planning again at that M, head by head.
TEST(PlanChunks, RechunkWithMergedKeysEqualsPlanningAgain) {
  const std::vector<PackedSequence> pool = {{9, 3, 4}, {16}, {2, 12, 2}, {5, 5}};
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo}) {
    for (bool prefix : {false, true}) {
      PlanConfig c = plan_config(16, 2, 4, 4, 8, 2, 4, 2, 0.03);  // 4 shards of 2 query heads, 2 KV heads
      c.mode = mode;
      c.dedup_per_kv_head = true;
      c.kv_prefix = prefix;
      c.chunks = 2;
      const Plan two = plan_or_die(pool, c);
      c.chunks = 1;
      const Plan direct = plan_or_die(pool, c);
      auto re = libra::rechunk_plan(two, 1);
      ASSERT_TRUE(re.ok()) << re.error().message();
      EXPECT_EQ(re->fingerprint(), direct.fingerprint()) << libra::plan_mode_name(mode);
      for (int r = 0; r < direct.num_workers(); ++r) {
        const auto groups = direct.worker_groups(r);
        ASSERT_EQ(re->worker_groups(r).size(), groups.size());
        for (const std::int32_t gid : groups) {
          const libra::KvGroup& g = direct.groups()[static_cast<std::size_t>(gid)];
          EXPECT_EQ(re->kv_span(r, gid), direct.kv_span(r, gid));
          for (std::int32_t k = g.kv_heads.begin; k < g.kv_heads.end; ++k) {
            const libra::ChunkUse a = re->kv_use(r, gid, k), b = direct.kv_use(r, gid, k);
            EXPECT_EQ(std::tie(a.first, a.last), std::tie(b.first, b.last)) << r << " " << gid << " " << k;
          }
        }
        for (int d = 0; d < direct.num_workers(); ++d) EXPECT_EQ(re->chunk_bytes(0, r, d), direct.chunk_bytes(0, r, d));
      }
    }
  }
}

namespace {

// Threads start with different accessors: whichever comes first derives the
// exchange.
std::int64_t first_access(const Plan& p, int which) {
  const int W = p.num_workers(), M = p.config().chunks;
  switch (which % 4) {
    case 0: return p.comm_bytes();
    case 1: return static_cast<std::int64_t>(p.all_transfers().size());
    case 2: return p.chunk_bytes(M - 1, W - 1, 0);
    default: return p.tier_bytes()[0].kept;
  }
}

// Everything a consumer reads of a plan's exchange, in a fixed order.
std::vector<std::int64_t> exchange_signature(const Plan& p, int first_accessor) {
  std::vector<std::int64_t> v;
  const int W = p.num_workers(), M = p.config().chunks;
  auto put = [&](const Transfer& x) {
    v.insert(v.end(), {static_cast<std::int64_t>(x.kind), x.src, x.dst, x.slot, x.begin, x.end, x.heads.begin, x.heads.end,
                       x.tile, x.group, x.bytes, x.first_use, x.last_use});
  };
  first_access(p, first_accessor);
  v.push_back(p.comm_bytes());
  v.push_back(p.busiest_receiver());
  v.push_back(p.max_recv_cross_node());
  for (const libra::TierBytes& t : p.tier_bytes()) {
    v.insert(v.end(), {t.kept, t.send_intra_node, t.send_cross_node, t.send_cross_supernode, t.recv_intra_node,
                       t.recv_cross_node, t.recv_cross_supernode});
  }
  for (int s = 0; s < W; ++s) {
    v.push_back(p.send_bytes(s));
    v.push_back(p.recv_bytes(s));
    for (int d = 0; d < W; ++d) {
      v.push_back(p.bytes(s, d));
      for (const Transfer& x : p.transfers(s, d)) put(x);
      for (int m = 0; m < M; ++m) {
        v.push_back(p.chunk_bytes(m, s, d));
        for (const Transfer& x : p.chunk_transfers(m, s, d)) put(x);
      }
    }
  }
  for (const Transfer& x : p.all_transfers()) put(x);
  return v;
}

}  // namespace

// A plan derives its exchange on first use. Threads sharing a fresh plan
// (the simulator and Python do) must all see the one exchange, identical to
// what a single thread sees, stored once.
TEST(PlanExchange, DerivedOnceAndIdenticalAcrossThreads) {
  auto seqs = libra::load_packed_sequences("builtin:paper-256k", 262'144);
  ASSERT_TRUE(seqs.ok()) << seqs.error().message();
  const std::vector<PackedSequence> pool(seqs->begin(), seqs->begin() + 8);
  PlanConfig c = plan_config(262'144, 8, 8192, 8, 32, 4, 128, 2, 0.03);
  c.chunks = 4;
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapTopo}) {
    c.mode = mode;
    const std::vector<std::int64_t> want = exchange_signature(plan_or_die(pool, c), 0);
    ASSERT_GT(want.size(), 1000U);
    // Fresh plans, so that the threads race for the first access.
    for (int round = 0; round < 10; ++round) {
      const Plan shared = plan_or_die(pool, c);
      constexpr int kThreads = 8;
      std::vector<std::vector<std::int64_t>> got(kThreads);
      std::vector<const Transfer*> storage(kThreads);
      std::atomic<int> ready{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          ready.fetch_add(1);
          while (ready.load() < kThreads) std::this_thread::yield();
          if (round == 0) {
            got[static_cast<std::size_t>(t)] = exchange_signature(shared, t);
          } else {
            first_access(shared, t);
          }
          storage[static_cast<std::size_t>(t)] = shared.all_transfers().data();
        });
      }
      for (std::thread& th : threads) th.join();
      for (int t = 0; t < kThreads; ++t) {
        if (round == 0) {
          EXPECT_EQ(got[static_cast<std::size_t>(t)], want) << libra::plan_mode_name(mode) << " thread " << t;
        }
        EXPECT_EQ(storage[static_cast<std::size_t>(t)], storage[0]) << "thread " << t;
      }
      EXPECT_EQ(exchange_signature(shared, 0), want) << libra::plan_mode_name(mode) << " round " << round;
    }
  }
}
