#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "corpus/generator.hpp"
#include "libra/corpus.hpp"
#include "libra/packing.hpp"

namespace libra {
namespace {

// Nearest-rank percentile straight from its definition: the smallest value
// with at least p percent of the values at or below it.
std::int64_t percentile_by_counting(std::vector<std::int64_t> v, double p) {
  std::sort(v.begin(), v.end());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (100.0 * static_cast<double>(i + 1) >= p * static_cast<double>(v.size())) return v[i];
  }
  return v.back();
}

void expect_within(double got, double want, double tolerance) {
  EXPECT_LE(std::abs(got - want), tolerance * want) << "got " << got << ", want " << want << " +- " << tolerance * 100 << "%";
}

TEST(BuiltinCorpus, Paper1mHasThePapersMedianAndP99Within5Percent) {
  auto c = builtin_corpus("paper-1m");
  ASSERT_TRUE(c.ok());
  expect_within(static_cast<double>(percentile_by_counting(c->raw_lengths, 50)), 644, 0.05);
  expect_within(static_cast<double>(percentile_by_counting(c->raw_lengths, 99)), 71'006, 0.05);
  EXPECT_EQ(c->default_seq_len, 1'048'576);
}

TEST(BuiltinCorpus, Paper256kHasThePapersMedianAndP99Within5Percent) {
  auto c = builtin_corpus("paper-256k");
  ASSERT_TRUE(c.ok());
  expect_within(static_cast<double>(percentile_by_counting(c->raw_lengths, 50)), 607, 0.05);
  expect_within(static_cast<double>(percentile_by_counting(c->raw_lengths, 99)), 33'000, 0.05);
  EXPECT_EQ(c->default_seq_len, 262'144);
}

TEST(BuiltinCorpus, OtherSeedsStayCalibrated) {
  for (std::uint64_t seed : {1ULL, 2ULL, 3ULL}) {
    for (const auto& name : builtin_corpus_names()) {
      auto spec = builtin_corpus_spec(name);
      auto c = builtin_corpus(name, seed);
      ASSERT_TRUE(c.ok());
      expect_within(static_cast<double>(percentile_by_counting(c->raw_lengths, 50)), spec->paper_median, 0.05);
      // The v2 tails are flat above the p99 (tail index 0.2 to 0.5), so the
      // nearest-rank p99 of 450K samples has a standard error of ~2.5%
      // (sqrt(0.99 * 0.01 / n) times dQ/du at 0.99): 8% is 3 errors.
      expect_within(static_cast<double>(percentile_by_counting(c->raw_lengths, 99)), spec->paper_p99, 0.08);
    }
  }
}

TEST(BuiltinCorpus, TailReachesItsCapAndPacksIntoEnoughSequences) {
  for (const auto& name : builtin_corpus_names()) {
    auto c = builtin_corpus(name);
    ASSERT_TRUE(c.ok());
    // v1 and v2 cap the tail at L; v3 (the default names) above it, at
    // 1.1 to 5 L, so some samples are split into pieces of exactly L.
    const bool capped_at_l = name.ends_with("-v1") || name.ends_with("-v2");
    const auto [lo, hi] = std::minmax_element(c->raw_lengths.begin(), c->raw_lengths.end());
    EXPECT_GE(*lo, 1);
    if (capped_at_l) {
      EXPECT_LE(*hi, c->default_seq_len);
      EXPECT_GE(*hi, c->default_seq_len * 9 / 10) << name;
    } else {
      EXPECT_GT(*hi, c->default_seq_len * 11 / 10) << name;
      EXPECT_LE(*hi, c->default_seq_len * 5) << name;
    }
    PackOptions o;
    o.seq_len = c->default_seq_len;
    auto packed = pack(c->raw_lengths, o);
    ASSERT_TRUE(packed.ok());
    // The simulator replays >= 20 windows of GBS 128 and more: 4096 sequences.
    EXPECT_GE(packed->sequences.size(), 4096U) << name;
    if (capped_at_l) {
      EXPECT_EQ(packed->overlong_samples, 0) << name;
    } else {
      EXPECT_GT(packed->overlong_samples, 0) << name;
    }
  }
}

TEST(BuiltinCorpus, IsReproducibleAndSeedSelectsTheStream) {
  auto a = builtin_corpus("paper-256k");
  auto b = load_corpus("builtin:paper-256k");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->raw_lengths, b->raw_lengths);
  auto s5 = load_corpus("builtin:paper-256k:5");
  auto d5 = builtin_corpus("paper-256k", 5);
  ASSERT_TRUE(s5.ok() && d5.ok());
  EXPECT_EQ(s5->raw_lengths, d5->raw_lengths);
  EXPECT_EQ(s5->source, "builtin:paper-256k:5");
  EXPECT_NE(s5->raw_lengths, a->raw_lengths);
  // Pinned: the first lengths of the default stream. A change here means the
  // builtin corpora changed for every user; update docs/corpora.md with it.
  const std::vector<std::int64_t> first(a->raw_lengths.begin(), a->raw_lengths.begin() + 8);
  EXPECT_EQ(first, (std::vector<std::int64_t>{18, 69, 676, 111, 2203, 1596, 698, 987}));
}

TEST(BuiltinCorpus, RejectsUnknownNamesAndBadSeeds) {
  auto unknown = load_corpus("builtin:paper-2m");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message(), "builtin:paper-2m: unknown builtin corpus (known: paper-1m, paper-256k, paper-1m-v3, paper-256k-v3, paper-1m-v2, paper-256k-v2, paper-1m-v1, paper-256k-v1)");
  for (const char* bad : {"builtin:paper-1m:", "builtin:paper-1m:-1", "builtin:paper-1m:18446744073709551616",
                          "builtin:paper-1m:1:2", "builtin:paper-1m:0x10"}) {
    auto r = load_corpus(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("seed"), std::string::npos) << r.error().message();
  }
  EXPECT_TRUE(load_corpus("builtin:paper-256k:18446744073709551615").ok());
}

TEST(SplitMix64, MatchesTheReferenceStream) {
  // First outputs of splitmix64 seeded with 0 (Vigna's reference splitmix64.c).
  detail::SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(rng.next(), 0x06C45D188009454FULL);
}

TEST(InverseNormalCdf, InvertsTheErfcBasedCdf) {
  for (double p = 1e-12; p < 1; p = p < 0.01 ? p * 3 : p + 0.01) {
    const double z = detail::inverse_normal_cdf(p);
    const double back = 0.5 * std::erfc(-z / std::sqrt(2.0));
    // Acklam's relative error in z is 1.2e-9; in p it grows with z^2 in the tails.
    EXPECT_NEAR(back / p, 1.0, 2e-9 * (1 + z * z)) << p;
  }
  EXPECT_NEAR(detail::inverse_normal_cdf(0.99), 2.3263478740408408, 1e-8);
}

TEST(LengthModel, QuantilesHitTheCalibrationPoints) {
  const detail::LengthModel m(644, 71'006, 1.2, 1'048'576);
  EXPECT_NEAR(m.quantile(0.5), 644, 1e-6);
  EXPECT_NEAR(m.quantile(0.99), 71'006, 1e-3);
  EXPECT_NEAR(m.quantile(1.0), 1'048'576, 1e-3);
  // With a cap the tail ends there: Q(1) = 1.5 L, and sample() clamps to it.
  const detail::LengthModel capped(644, 71'006, 0.6, 1'048'576, 1.5);
  EXPECT_NEAR(capped.quantile(0.99), 71'006, 1e-3);
  EXPECT_NEAR(capped.quantile(1.0), 1'572'864, 1e-3);
  EXPECT_EQ(capped.sample(1.0), 1'572'864);
  // Closed form of the truncated Pareto at the tail's midpoint v = 1/2.
  const double cut = 1 - std::pow(71'006.0 / 1'572'864.0, 0.6);
  EXPECT_NEAR(capped.quantile(0.995), 71'006 * std::pow(1 - 0.5 * cut, -1 / 0.6), 1e-6 * 71'006);
  double prev = 0;
  for (double u = 0.001; u <= 1.0; u += 0.001) {
    EXPECT_GT(m.quantile(u), prev);
    prev = m.quantile(u);
  }
}

}  // namespace
}  // namespace libra
