#include "libra/simulator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace libra {
namespace {

std::vector<std::int64_t> sorted_samples(std::span<const PackedSequence> seqs) {
  std::vector<std::int64_t> all;
  for (const auto& s : seqs) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  return all;
}

TEST(WlbRepack, KeepsTheStepsSamplesAndTheTokenCap) {
  std::vector<PackedSequence> window = {{90, 5, 5}, {50, 40, 10}, {30, 30, 30, 10}, {100}};
  auto r = wlb_repack(window, 100, 4);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->split_samples, 0);
  EXPECT_EQ(sorted_samples(r->sequences), sorted_samples(window));
  for (const auto& s : r->sequences) EXPECT_LE(std::accumulate(s.begin(), s.end(), std::int64_t{0}), 100);
}

TEST(WlbRepack, HandComputedGreedy) {
  // Samples by decreasing length: 6, 4, 3, 3, 2, 2 into 2 sequences of 10.
  // 6 -> seq0 (F 36); 4 -> seq1 (16); 3 -> seq1 (25); 3 -> seq1 (34);
  // 2 -> seq1 (38, room 0 after? 4+3+3=10 full) -> seq0 (40); 2 -> seq0 (44).
  std::vector<PackedSequence> window = {{6, 2, 2}, {4, 3, 3}};
  auto r = wlb_repack(window, 10, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sequences[0], (PackedSequence{6, 2, 2}));
  EXPECT_EQ(r->sequences[1], (PackedSequence{4, 3, 3}));
}

}  // namespace
}  // namespace libra
