// Home layouts: the one packed-row <-> home-row mapping (HomeMap) against
// the layouts' definitions written out naively, zigzag plans' placement and
// exchange against that mapping, and zigzag plan files.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "libra/plan.hpp"

namespace {

using libra::HomeLayout;
using libra::HomeMap;
using libra::PackedSequence;
using libra::Plan;
using libra::PlanConfig;
using libra::PlanMode;

// Packed rows of CP rank c's home, in home order, from the definitions:
// contiguous = the c-th of cp equal parts; zigzag = chunks c and 2cp-1-c of
// 2cp equal chunks, concatenated.
std::vector<std::int64_t> naive_home(std::int64_t L, int cp, HomeLayout layout, int c) {
  std::vector<std::int64_t> rows;
  if (layout == HomeLayout::kContiguous) {
    for (std::int64_t x = c * (L / cp); x < (c + 1) * (L / cp); ++x) rows.push_back(x);
    return rows;
  }
  const std::int64_t n = L / (2 * cp);
  for (std::int64_t chunk : {std::int64_t{c}, std::int64_t{2 * cp - 1 - c}}) {
    for (std::int64_t x = chunk * n; x < (chunk + 1) * n; ++x) rows.push_back(x);
  }
  return rows;
}

RC_GTEST_PROP(HomeMap, MatchesTheLayoutDefinitionsAndItsRunsAreMaximal, ()) {
  const int cp = *rc::gen::inRange(1, 9);
  const std::int64_t n = *rc::gen::inRange(1, 12);
  const std::int64_t L = 2 * cp * n;
  for (HomeLayout layout : {HomeLayout::kContiguous, HomeLayout::kZigzag}) {
    const HomeMap map(L, cp, layout);
    RC_ASSERT(map.rows() == L / cp);
    std::vector<int> seen(static_cast<std::size_t>(L), 0);
    for (int c = 0; c < cp; ++c) {
      const std::vector<std::int64_t> want = naive_home(L, cp, layout, c);
      for (std::int64_t i = 0; i < map.rows(); ++i) {
        const std::int64_t x = map.packed_row(c, i);
        RC_ASSERT(x == want[static_cast<std::size_t>(i)]);
        const libra::HomeSpot h = map.locate(x);
        RC_ASSERT(h.rank == c);
        RC_ASSERT(h.row == i);
        ++seen[static_cast<std::size_t>(x)];
      }
    }
    RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; }));
    for (std::int64_t x = 0; x < L; ++x) {
      const libra::HomeSpot h = map.locate(x);
      RC_ASSERT(h.run_end > x && h.run_end <= L);
      for (std::int64_t y = x; y < h.run_end; ++y) {
        RC_ASSERT(map.locate(y).rank == h.rank);
        RC_ASSERT(map.locate(y).row == h.row + (y - x));
        RC_ASSERT(map.locate(y).run_end == h.run_end);
      }
      if (h.run_end < L) {
        const libra::HomeSpot next = map.locate(h.run_end);
        RC_ASSERT(next.rank != h.rank || next.row != h.row + (h.run_end - x));
      }
    }
  }
}

TEST(HomeMap, ZigzagWithOneRankIsTheContiguousLayout) {
  const HomeMap z(12, 1, HomeLayout::kZigzag);
  for (std::int64_t x = 0; x < 12; ++x) {
    EXPECT_EQ(z.locate(x).row, x);
    EXPECT_EQ(z.locate(x).run_end, 12);
  }
}

TEST(HomeLayout, ParsesAndNamesEveryLayout) {
  for (HomeLayout l : {HomeLayout::kContiguous, HomeLayout::kZigzag}) {
    auto parsed = libra::parse_home_layout(libra::home_layout_name(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  auto bad = libra::parse_home_layout("striped");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "home layout 'striped': must be contiguous or zigzag");
}

PlanConfig zigzag_config(int cp, PlanMode mode) {
  PlanConfig c;
  c.seq_len = 96;
  c.cp = cp;
  c.block_size = 96 / (2 * cp) / 2;  // two blocks per chunk
  c.head_shards = 2;
  c.shape = {.heads_q = 8, .heads_kv = 2, .head_dim = 4, .dtype = libra::DType::kBF16};
  c.chunks = 2;
  c.mode = mode;
  c.home_layout = HomeLayout::kZigzag;
  return c;
}

rc::Gen<std::vector<PackedSequence>> pool_gen(int slots, std::int64_t L) {
  return rc::gen::container<std::vector<PackedSequence>>(
      static_cast<std::size_t>(slots), rc::gen::map(rc::gen::container<std::vector<std::int64_t>>(
                                                        rc::gen::inRange<std::int64_t>(1, L / 2)),
                                                    [L](std::vector<std::int64_t> v) {
                                                      PackedSequence s;
                                                      std::int64_t t = 0;
                                                      for (std::int64_t l : v) {
                                                        if (t + l > L) break;
                                                        s.push_back(l);
                                                        t += l;
                                                      }
                                                      if (s.empty()) s.push_back(L / 3 + 1);
                                                      return s;
                                                    }));
}

// Every row of a tile lives on its Q home; every KV item comes from the
// worker holding its rows as one home run; each worker's fetched rows plus
// its own cover every group it holds exactly once; Q/O items move exactly
// the tiles off their home.
void check_zigzag_plan(const Plan& plan) {
  const PlanConfig& c = plan.config();
  const HomeMap map = c.home_map();
  for (const libra::Tile& t : plan.tiles()) {
    for (std::int64_t x = t.begin; x < t.end; ++x) RC_ASSERT(t.slot * c.cp + map.locate(x).rank == t.home);
  }
  const int W = plan.num_workers();
  std::map<std::pair<int, std::int32_t>, std::vector<int>> cover;  // (worker, group) -> rows seen
  std::int64_t qo = 0;
  for (const libra::Transfer& x : plan.all_transfers()) {
    if (x.kind == libra::TransferKind::kKv) {
      const libra::HomeSpot h = map.locate(x.begin);
      RC_ASSERT(x.slot * c.cp + h.rank == x.src);
      RC_ASSERT(x.end <= h.run_end);
      auto& seen = cover[{x.dst, x.group}];
      const libra::KvGroup& g = plan.groups()[static_cast<std::size_t>(x.group)];
      seen.resize(static_cast<std::size_t>(g.end - g.begin), 0);
      for (std::int64_t y = x.begin; y < x.end; ++y) ++seen[static_cast<std::size_t>(y - g.begin)];
    } else {
      const libra::Tile& t = plan.tiles()[static_cast<std::size_t>(x.tile)];
      RC_ASSERT(t.worker != t.home);
      RC_ASSERT((x.kind == libra::TransferKind::kQ ? x.src : x.dst) == t.home);
      ++qo;
    }
  }
  std::int64_t off_home = 0;
  for (const libra::Tile& t : plan.tiles()) off_home += t.worker != t.home;
  RC_ASSERT(qo == 2 * off_home);
  for (int r = 0; r < W; ++r) {
    for (std::int32_t gid : plan.worker_groups(r)) {
      const libra::KvGroup& g = plan.groups()[static_cast<std::size_t>(gid)];
      auto& seen = cover[{r, gid}];
      seen.resize(static_cast<std::size_t>(g.end - g.begin), 0);
      for (std::int64_t y = g.begin; y < g.end; ++y) {
        if (g.slot * c.cp + map.locate(y).rank == r) ++seen[static_cast<std::size_t>(y - g.begin)];
      }
      RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; }));
    }
  }
}

RC_GTEST_PROP(ZigzagPlan, TilesSitOnTheirHomesAndKvComesFromWhereItLives, ()) {
  const PlanMode mode = *rc::gen::element(PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kUlysses);
  // Ulysses splits h_q = 8 over the CP ranks.
  const int cp = mode == PlanMode::kUlysses ? *rc::gen::element(1, 2, 4) : *rc::gen::element(1, 2, 3, 4);
  PlanConfig c = zigzag_config(cp, mode);
  if (mode == PlanMode::kUlysses) c.chunks = 1;
  c.dedup_per_kv_head = *rc::gen::arbitrary<bool>();
  c.shape.window = *rc::gen::element(libra::kFullCausal, std::int64_t{5});
  const auto pool = *pool_gen(*rc::gen::inRange(1, 4), c.seq_len);
  auto plan = libra::make_plan(pool, c);
  RC_ASSERT(plan.ok());
  check_zigzag_plan(*plan);
  // The same tiles as the contiguous plan (homes and placement aside), so
  // the same total work.
  PlanConfig cc = c;
  cc.home_layout = HomeLayout::kContiguous;
  auto contiguous = libra::make_plan(pool, cc);
  RC_ASSERT(contiguous.ok());
  if (mode != PlanMode::kTapSplit) {
    RC_ASSERT(plan->tiles().size() == contiguous->tiles().size());
    for (std::size_t i = 0; i < plan->tiles().size(); ++i) {
      RC_ASSERT(plan->tiles()[i].begin == contiguous->tiles()[i].begin);
      RC_ASSERT(plan->tiles()[i].flops == contiguous->tiles()[i].flops);
    }
  }
  std::int64_t a = 0, b = 0;
  for (std::int64_t f : plan->worker_flops()) a += f;
  for (std::int64_t f : contiguous->worker_flops()) b += f;
  RC_ASSERT(a == b);
  RC_ASSERT(plan->fingerprint() != contiguous->fingerprint());
}

TEST(ZigzagPlan, WithOneRankPerSlotItPlacesLikeContiguous) {
  const std::vector<PackedSequence> pool = {{40, 3, 9}, {7, 7, 30}, {96}, {1, 2, 3, 4, 5}};
  PlanConfig z = zigzag_config(1, PlanMode::kTap);
  PlanConfig c = z;
  c.home_layout = HomeLayout::kContiguous;
  auto a = libra::make_plan(pool, z), b = libra::make_plan(pool, c);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tiles().size(), b->tiles().size());
  for (std::size_t i = 0; i < a->tiles().size(); ++i) {
    EXPECT_EQ(a->tiles()[i].worker, b->tiles()[i].worker);
    EXPECT_EQ(a->tiles()[i].home, b->tiles()[i].home);
  }
  EXPECT_EQ(std::vector<std::int64_t>(a->byte_matrix().begin(), a->byte_matrix().end()),
            std::vector<std::int64_t>(b->byte_matrix().begin(), b->byte_matrix().end()));
}

TEST(ZigzagPlan, RejectsLengthsTheChunksCannotCut) {
  const std::vector<PackedSequence> pool = {{8}};
  PlanConfig c = zigzag_config(2, PlanMode::kTap);
  c.seq_len = 36;  // 36 / 2 = 18 rows per rank, but 36 / 4 = 9 rows per chunk
  c.block_size = 6;
  auto p = libra::make_plan(pool, c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message(),
            "plan config: home_layout zigzag: seq_len / (2 cp) = 9 must be divisible by block_size 6");
  c.seq_len = 34;
  c.block_size = 1;
  p = libra::make_plan(pool, c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message(), "plan config: home_layout zigzag: seq_len 34 must be divisible by 2 cp = 4");
  c.home_layout = static_cast<HomeLayout>(7);
  c.seq_len = 36;
  p = libra::make_plan(pool, c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message(), "plan config: unknown home layout 7");
}

TEST(HomeLayout, TheZigzagRuleAloneIsTheValidatorsRule) {
  // What the simulator asks to choose zigzag homes: the same rule and words.
  EXPECT_TRUE(libra::check_zigzag_homes(36, 2, 3).ok());
  EXPECT_EQ(libra::check_zigzag_homes(36, 2, 6).message(),
            "plan config: home_layout zigzag: seq_len / (2 cp) = 9 must be divisible by block_size 6");
  EXPECT_EQ(libra::check_zigzag_homes(34, 2, 1).message(),
            "plan config: home_layout zigzag: seq_len 34 must be divisible by 2 cp = 4");
  EXPECT_FALSE(libra::check_zigzag_homes(36, 2, 0).ok());  // no division by zero
}

TEST(ZigzagPlanFile, RoundTripsAsVersionTwoAndContiguousStaysVersionOne) {
  const std::vector<PackedSequence> pool = {{40, 3, 9}, {7, 7, 30}};
  PlanConfig z = zigzag_config(2, PlanMode::kTap);
  auto plan = libra::make_plan(pool, z);
  ASSERT_TRUE(plan.ok());
  const std::string json = libra::plan_to_json(*plan), bin = libra::plan_to_binary(*plan);
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["config"]["home_layout"], "zigzag");
  EXPECT_EQ(bin[8], 2);
  for (auto loaded : {libra::plan_from_json(json, "z.json"), libra::plan_from_binary(bin, "z.bin")}) {
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    EXPECT_EQ(loaded->fingerprint(), plan->fingerprint());
    EXPECT_EQ(loaded->config().home_layout, HomeLayout::kZigzag);
    for (std::size_t i = 0; i < plan->tiles().size(); ++i) EXPECT_EQ(loaded->tiles()[i].home, plan->tiles()[i].home);
  }
  // The default layout: format 1, no home_layout field, no extra word.
  PlanConfig c = z;
  c.home_layout = HomeLayout::kContiguous;
  auto contiguous = libra::make_plan(pool, c);
  ASSERT_TRUE(contiguous.ok());
  const nlohmann::json cj = nlohmann::json::parse(libra::plan_to_json(*contiguous));
  EXPECT_EQ(cj["version"], 1);
  EXPECT_FALSE(cj["config"].contains("home_layout"));
  const std::string cbin = libra::plan_to_binary(*contiguous);
  EXPECT_EQ(cbin[8], 1);
  EXPECT_EQ(cbin.size() + 8, bin.size());

  auto expect_error = [](const libra::Result<Plan>& r, const std::string& part) {
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(r.error().message().find(part), std::string::npos) << r.error().message();
  };
  nlohmann::json k = j;
  k["config"]["home_layout"] = "contiguous";
  expect_error(libra::plan_from_json(k.dump(), "z.json"),
               "z.json: config: home_layout contiguous is format version 1, the file says 2");
  k = cj;
  k["config"]["home_layout"] = "zigzag";
  expect_error(libra::plan_from_json(k.dump(), "c.json"), "c.json: config: home_layout zigzag is format version 2, the file says 1");
  k = j;
  k["config"].erase("home_layout");
  expect_error(libra::plan_from_json(k.dump(), "z.json"), "z.json: config: missing field 'home_layout'");
  k = j;
  k["config"]["home_layout"] = "diagonal";
  expect_error(libra::plan_from_json(k.dump(), "z.json"), "z.json: config: home layout 'diagonal': must be contiguous or zigzag");
}

}  // namespace
