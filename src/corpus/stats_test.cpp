#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>

#include "libra/corpus.hpp"

namespace libra {
namespace {

TEST(Distribution, NearestRankOnAHandExample) {
  // 100..1000: mean 550, population sd 100 * sqrt(8.25), nearest-rank
  // median = 5th value, p90 = 9th, p99 = 10th.
  const std::vector<std::int64_t> v = {300, 1000, 100, 700, 200, 900, 500, 400, 800, 600};
  const Distribution d = distribution_of(v);
  EXPECT_EQ(d.count, 10);
  EXPECT_DOUBLE_EQ(d.mean, 550);
  EXPECT_DOUBLE_EQ(d.median, 500);
  EXPECT_DOUBLE_EQ(d.p90, 900);
  EXPECT_DOUBLE_EQ(d.p99, 1000);
  EXPECT_DOUBLE_EQ(d.max, 1000);
  EXPECT_NEAR(d.cv, 100 * std::sqrt(8.25) / 550, 1e-12);
}

TEST(Distribution, SingleValueAndEmpty) {
  const Distribution one = distribution_of(std::vector<std::int64_t>{7});
  EXPECT_EQ(one.median, 7);
  EXPECT_EQ(one.p99, 7);
  EXPECT_EQ(one.cv, 0);
  EXPECT_EQ(distribution_of({}).count, 0);
}

RC_GTEST_PROP(Distribution, PercentilesAndMomentsMatchTheirDefinitions, ()) {
  const auto v = *rc::gen::nonEmpty(
      rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 1'000'000'000)));
  const Distribution d = distribution_of(v);
  // Nearest rank by definition: the smallest value x with count(v <= x) >= p% of n.
  auto by_definition = [&](int p) {
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    for (std::int64_t x : v) {
      const auto at_most = std::count_if(v.begin(), v.end(), [&](std::int64_t y) { return y <= x; });
      if (100 * at_most >= p * static_cast<std::int64_t>(v.size())) best = std::min(best, x);
    }
    return static_cast<double>(best);
  };
  RC_ASSERT(d.median == by_definition(50));
  RC_ASSERT(d.p90 == by_definition(90));
  RC_ASSERT(d.p99 == by_definition(99));
  RC_ASSERT(d.max == static_cast<double>(*std::max_element(v.begin(), v.end())));
  long double sum = 0, sq = 0;
  for (auto x : v) sum += static_cast<long double>(x);
  const long double mean = sum / static_cast<long double>(v.size());
  for (auto x : v) sq += (static_cast<long double>(x) - mean) * (static_cast<long double>(x) - mean);
  const double cv = static_cast<double>(std::sqrt(sq / static_cast<long double>(v.size())) / mean);
  RC_ASSERT(std::abs(d.mean - static_cast<double>(mean)) <= 1e-9 * static_cast<double>(mean));
  RC_ASSERT(std::abs(d.cv - cv) <= 1e-9 + 1e-9 * cv);
}

TEST(CorpusStats, PackedCorpusReportsTokensAndWorkloadPerSequence) {
  Corpus c;
  c.kind = CorpusKind::kPacked;
  c.source = "p";
  c.packed = {{300}, {1000}, {100, 700, 200}, {900}, {500, 400}, {800}, {600}};
  auto s = corpus_stats(c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->samples, 10);
  EXPECT_EQ(s->total_tokens, 5500);
  ASSERT_TRUE(s->workloads && s->tokens_per_sequence);
  EXPECT_EQ(s->tokens_per_sequence->count, 7);
  // F by hand: 90000, 1000000, 540000, 810000, 410000, 640000, 360000.
  EXPECT_DOUBLE_EQ(s->workloads->mean, 3'850'000.0 / 7);
  EXPECT_DOUBLE_EQ(s->workloads->median, 540'000);
  EXPECT_DOUBLE_EQ(s->workloads->max, 1'000'000);
  EXPECT_DOUBLE_EQ(s->tokens_per_sequence->median, 900);
}

TEST(CorpusStats, RawCorpusHasNoPackedFigures) {
  Corpus c;
  c.source = "r";
  c.raw_lengths = {5, 6};
  auto s = corpus_stats(c);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->workloads.has_value());
  EXPECT_EQ(s->total_tokens, 11);
}

TEST(CorpusStats, RejectsImpossibleCorpora) {
  Corpus c;
  c.source = "r";
  EXPECT_EQ(corpus_stats(c).error().message(), "r: the corpus has no samples");
  c.raw_lengths = {5, 0};
  EXPECT_EQ(corpus_stats(c).error().message(), "r: sample 1 has length 0; lengths must be positive");
  c.raw_lengths = {std::numeric_limits<std::int64_t>::max(), 1};
  EXPECT_EQ(corpus_stats(c).error().message(), "r: total token count exceeds the 64-bit range");
  Corpus p;
  p.kind = CorpusKind::kPacked;
  p.source = "p";
  p.packed = {{1}, {}};
  EXPECT_EQ(corpus_stats(p).error().message(), "p: packed sequence 1 is empty");
  p.packed = {{3'037'000'500}};
  EXPECT_FALSE(corpus_stats(p).ok());
}

}  // namespace
}  // namespace libra
