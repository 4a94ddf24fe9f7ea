#include "libra/sampler.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace libra {
namespace {

std::vector<std::int64_t> ramp(std::size_t n) {
  std::vector<std::int64_t> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<std::int64_t>((i * 7919) % 101 + 1);
  return w;
}

TEST(PlacementSampler, CutsWindowsAndDropsTheTail) {
  SamplerOptions o{.gbs = 8, .dp = 4, .placement = {.pool_size = 2}};
  auto s = PlacementSampler::from_workloads(ramp(27), o);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->num_steps(), 3);
  EXPECT_EQ(s->dropped_tail(), 3);
  for (std::int64_t step = 0; step < 3; ++step) {
    auto st = s->at(step);
    ASSERT_TRUE(st.ok());
    std::vector<std::int64_t> got = st->order;
    std::sort(got.begin(), got.end());
    std::vector<std::int64_t> want(8);
    std::iota(want.begin(), want.end(), step * 8);
    EXPECT_EQ(got, want);  // the step trains on exactly its own window
  }
  EXPECT_FALSE(s->at(3).ok());
  EXPECT_FALSE(s->at(-1).ok());
}

TEST(PlacementSampler, OrderIsTheLayoutOfTheWindowPlacement) {
  SamplerOptions o{.gbs = 16, .dp = 8, .placement = {.pool_size = 4}};
  const auto w = ramp(48);
  auto s = PlacementSampler::from_workloads(w, o);
  ASSERT_TRUE(s.ok());
  auto st = s->at(2);
  ASSERT_TRUE(st.ok());
  auto placed = place_window(std::span<const std::int64_t>(w).subspan(32, 16), {.pool_size = 4});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(st->placement.pools, placed->pools);
  // GA-major, replica-minor: GA index 0 holds pools 0 and 1, GA index 1 pools 2 and 3.
  std::vector<std::int64_t> want;
  for (const auto& pool : placed->pools) {
    for (std::int32_t i : pool) want.push_back(32 + i);
  }
  EXPECT_EQ(st->order, want);
  EXPECT_EQ(st->layout.ga_steps, 2);
}

TEST(PlacementSampler, ResumesFromAStepIndexAlone) {
  SamplerOptions o{.gbs = 8, .dp = 0, .placement = {.pool_size = 4, .mode = PlacementMode::kRandom, .seed = 42}};
  const auto w = ramp(80);
  auto a = PlacementSampler::from_workloads(w, o);
  ASSERT_TRUE(a.ok());
  std::vector<std::vector<std::int64_t>> run;
  while (auto st = a->next()) run.push_back(st->order);
  EXPECT_FALSE(a->last_error().has_value());
  ASSERT_EQ(run.size(), 10u);
  EXPECT_NE(run[0], run[1]);  // different windows
  // A fresh sampler (a restarted job) seeking to step 6 reproduces 6..9.
  auto b = PlacementSampler::from_workloads(w, o);
  b->seek(6);
  for (std::size_t step = 6; step < 10; ++step) {
    auto st = b->next();
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->order, run[step]);
  }
  EXPECT_FALSE(b->next().has_value());
  // The random mode's seed is derived from (seed, step): same as placing the
  // window by hand with step_seed.
  auto manual = place_window(std::span<const std::int64_t>(w).subspan(24, 8),
                             {.pool_size = 4, .mode = PlacementMode::kRandom, .seed = step_seed(42, 3)});
  EXPECT_EQ(a->at(3)->placement.pools, manual->pools);
  EXPECT_NE(step_seed(42, 3), step_seed(42, 4));
  EXPECT_NE(step_seed(42, 3), step_seed(43, 3));
  EXPECT_EQ(a->options().dp, 4);  // dp = 0 means dp = pool_size
}

TEST(PlacementSampler, WrapsPackedSequences) {
  std::vector<PackedSequence> seqs = {{4}, {1, 1}, {3}, {2, 2, 2}};
  auto s = PlacementSampler::create(seqs, {.gbs = 4, .dp = 2, .placement = {.pool_size = 2}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->workloads(), (std::vector<std::int64_t>{16, 2, 9, 12}));
  auto st = s->at(0);
  // VRSP: 0 (16) -> pool 0, 3 (12) -> pool 1, 2 (9) -> pool 1, 1 (2) -> pool 0.
  EXPECT_EQ(st->order, (std::vector<std::int64_t>{0, 1, 3, 2}));
  EXPECT_EQ(s->sequence(st->order[1]), (PackedSequence{1, 1}));
}

RC_GTEST_PROP(PlacementSampler, EveryStepIsAPermutationOfItsWindow, ()) {
  const auto p = *rc::gen::inRange<std::int64_t>(1, 5);
  const auto dp = p * *rc::gen::inRange<std::int64_t>(1, 4);
  const auto gbs = dp * *rc::gen::inRange<std::int64_t>(1, 4);
  const auto n = *rc::gen::inRange<std::int64_t>(gbs, 4 * gbs + 3);
  const auto mode = *rc::gen::elementOf(std::vector<PlacementMode>(all_placement_modes().begin(),
                                                                   all_placement_modes().end()));
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  auto w = *rc::gen::container<std::vector<std::int64_t>>(static_cast<std::size_t>(n),
                                                          rc::gen::inRange<std::int64_t>(1, 1000));
  const SamplerOptions o{.gbs = gbs, .dp = dp, .placement = {.pool_size = p, .mode = mode, .seed = seed}};
  auto s = PlacementSampler::from_workloads(w, o);
  RC_ASSERT(s.ok());
  RC_ASSERT(s->num_steps() == n / gbs);
  RC_ASSERT(s->dropped_tail() == n % gbs);
  for (std::int64_t step = 0; step < s->num_steps(); ++step) {
    auto st = s->at(step);
    RC_ASSERT(st.ok());
    std::vector<std::int64_t> got = st->order;
    std::sort(got.begin(), got.end());
    std::vector<std::int64_t> want(static_cast<std::size_t>(gbs));
    std::iota(want.begin(), want.end(), step * gbs);
    RC_ASSERT(got == want);
    // Replica r at GA index g trains on the sequence of pool g*(DP/P) + r/P, slot r%P.
    for (std::int64_t g = 0; g < gbs / dp; ++g) {
      for (std::int64_t r = 0; r < dp; ++r) {
        const auto pool = static_cast<std::size_t>(g * (dp / p) + r / p);
        const auto slot = static_cast<std::size_t>(r % p);
        RC_ASSERT(st->order[static_cast<std::size_t>(g * dp + r)] == step * gbs + st->placement.pools[pool][slot]);
      }
    }
  }
}

TEST(PlacementSampler, RejectsImpossibleConfigurations) {
  auto err = [](std::size_t n, SamplerOptions o) {
    auto s = PlacementSampler::from_workloads(ramp(n), o);
    return s.ok() ? std::string("ok") : s.error().message();
  };
  EXPECT_EQ(err(16, {.gbs = 12, .dp = 3, .placement = {.pool_size = 3}}), "ok");
  EXPECT_NE(err(16, {.gbs = 10, .dp = 4, .placement = {.pool_size = 4}}).find("must divide --gbs 10"), std::string::npos);
  EXPECT_NE(err(16, {.gbs = 16, .dp = 6, .placement = {.pool_size = 4}}).find("must divide --dp 6"), std::string::npos);
  EXPECT_NE(err(48, {.gbs = 24, .dp = 16, .placement = {.pool_size = 4}}).find("--dp 16: must divide --gbs 24"),
            std::string::npos);
  EXPECT_NE(err(7, {.gbs = 8, .dp = 4, .placement = {.pool_size = 4}}).find("fewer than --gbs 8"), std::string::npos);
  EXPECT_NE(err(7, {.gbs = 0, .placement = {.pool_size = 4}}).find("--gbs 0"), std::string::npos);
  EXPECT_NE(err(7, {.gbs = 4, .placement = {.pool_size = 0}}).find("--pool-size 0"), std::string::npos);
  EXPECT_NE(err(7, {.gbs = std::int64_t{1} << 40, .placement = {.pool_size = 1}}).find("limit"), std::string::npos);
  // A window of zero workloads is reported at the step that holds it.
  std::vector<std::int64_t> w = {1, 2, 3, 4, 0, 0, 0, 0};
  auto s = PlacementSampler::from_workloads(w, {.gbs = 4, .placement = {.pool_size = 2}});
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->next().has_value());
  EXPECT_FALSE(s->next().has_value());
  ASSERT_TRUE(s->last_error().has_value());
  EXPECT_NE(s->last_error()->message().find("step 1"), std::string::npos);
}

}  // namespace
}  // namespace libra
