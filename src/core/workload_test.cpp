#include "libra/workload.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace libra {
namespace {

// Brute-force reference: count every (query, key) pair one by one.
std::int64_t brute_pairs(std::int64_t a, std::int64_t e, std::int64_t w) {
  std::int64_t total = 0;
  for (std::int64_t q = a; q < e; ++q) {
    for (std::int64_t k = 0; k <= q; ++k) {
      if (q - k < w) ++total;
    }
  }
  return total;
}

std::int64_t brute_block(const std::vector<std::int64_t>& lengths, std::int64_t begin, std::int64_t end,
                         std::int64_t w) {
  std::int64_t total = 0;
  std::int64_t offset = 0;
  for (std::int64_t l : lengths) {
    for (std::int64_t x = offset; x < offset + l; ++x) {
      if (x >= begin && x < end) total += brute_pairs(x - offset, x - offset + 1, w);
    }
    offset += l;
  }
  return total;
}

TEST(WorkloadProxy, SumsSquares) {
  std::vector<std::int64_t> seq = {3000, 500, 12};
  EXPECT_EQ(*workload_proxy(seq), 3000 * 3000 + 500 * 500 + 12 * 12);
  EXPECT_EQ(*workload_proxy(std::vector<std::int64_t>{}), 0);
}

TEST(WorkloadProxy, RejectsNonPositiveAndOverflow) {
  EXPECT_FALSE(workload_proxy(std::vector<std::int64_t>{4, 0}).ok());
  EXPECT_FALSE(workload_proxy(std::vector<std::int64_t>{-1}).ok());
  EXPECT_FALSE(workload_proxy(std::vector<std::int64_t>{std::int64_t{1} << 32}).ok());
  std::vector<std::int64_t> many(3, std::int64_t{2'000'000'000});  // each square fits, the sum does not
  EXPECT_FALSE(workload_proxy(many).ok());
}

TEST(CausalPairs, HandComputed) {
  EXPECT_EQ(*causal_pairs(0, 4), 1 + 2 + 3 + 4);
  EXPECT_EQ(*causal_pairs(2, 4), 3 + 4);
  EXPECT_EQ(*causal_pairs(3, 3), 0);
  EXPECT_EQ(*causal_pairs(0, 6, 2), 1 + 2 + 2 + 2 + 2 + 2);
  EXPECT_EQ(*causal_pairs(4, 6, 1), 2);
  EXPECT_EQ(*causal_pairs(0, 3, 100), 6);
}

TEST(CausalPairs, RejectsBadRanges) {
  EXPECT_FALSE(causal_pairs(-1, 3).ok());
  EXPECT_FALSE(causal_pairs(4, 3).ok());
  EXPECT_FALSE(causal_pairs(0, 3, 0).ok());
}

TEST(CausalPairs, LargeValuesExactAndOverflowReported) {
  // One 1M-token sample: 1'048'576 * 1'048'577 / 2.
  EXPECT_EQ(*causal_pairs(0, 1'048'576), std::int64_t{1'048'576} * 1'048'577 / 2);
  EXPECT_EQ(*causal_pairs(0, std::int64_t{1} << 31), (std::int64_t{1} << 30) * ((std::int64_t{1} << 31) + 1));
  auto huge = causal_pairs(0, std::numeric_limits<std::int64_t>::max() / 2);
  EXPECT_FALSE(huge.ok());
}

RC_GTEST_PROP(CausalPairs, MatchesBruteForce, ()) {
  const auto e = *rc::gen::inRange<std::int64_t>(0, 120);
  const auto a = *rc::gen::inRange<std::int64_t>(0, e + 1);
  const auto w = *rc::gen::oneOf(rc::gen::just(kFullCausal), rc::gen::inRange<std::int64_t>(1, 140));
  RC_ASSERT(*causal_pairs(a, e, w) == brute_pairs(a, e, w));
}

RC_GTEST_PROP(BlockPairs, MatchesBruteForceAcrossSamples, ()) {
  const auto lengths = *rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 40));
  std::int64_t total = 0;
  for (auto l : lengths) total += l;
  const auto end = *rc::gen::inRange<std::int64_t>(0, total + 20);  // may run into padding
  const auto begin = *rc::gen::inRange<std::int64_t>(0, end + 1);
  const auto w = *rc::gen::oneOf(rc::gen::just(kFullCausal), rc::gen::inRange<std::int64_t>(1, 50));
  RC_ASSERT(*block_pairs(lengths, begin, end, w) == brute_block(lengths, begin, end, w));
}

RC_GTEST_PROP(BlockPairs, WholeSequenceEqualsSumOfSampleTriangles, ()) {
  const auto lengths = *rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 5000));
  std::int64_t total = 0;
  std::int64_t triangles = 0;
  for (auto l : lengths) {
    total += l;
    triangles += l * (l + 1) / 2;
  }
  RC_ASSERT(*block_pairs(lengths, 0, total) == triangles);
}

TEST(Flops, ForwardAndBackwardPerPair) {
  EXPECT_DOUBLE_EQ(forward_flops(10, 128), 4.0 * 128 * 10);
  EXPECT_DOUBLE_EQ(backward_flops(10, 128), 2.5 * forward_flops(10, 128));
}

}  // namespace
}  // namespace libra
