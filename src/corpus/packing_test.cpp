#include "libra/packing.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>

namespace libra {
namespace {

std::int64_t sum(const PackedSequence& s) { return std::accumulate(s.begin(), s.end(), std::int64_t{0}); }

// The samples an overlong policy should leave, written out independently of
// the packer: split gives floor(l/L) pieces of L and the nonzero remainder.
std::vector<std::int64_t> expected_items(const std::vector<std::int64_t>& lengths, std::int64_t L, OverlongPolicy p) {
  std::vector<std::int64_t> out;
  for (std::int64_t l : lengths) {
    if (l <= L) {
      out.push_back(l);
    } else if (p == OverlongPolicy::kSplit) {
      for (std::int64_t k = 0; k < l / L; ++k) out.push_back(L);
      if (l % L != 0) out.push_back(l % L);
    } else if (p == OverlongPolicy::kTruncate) {
      out.push_back(L);
    }
  }
  return out;
}

std::vector<std::int64_t> flatten(const std::vector<PackedSequence>& seqs) {
  std::vector<std::int64_t> out;
  for (const auto& s : seqs) out.insert(out.end(), s.begin(), s.end());
  return out;
}

// Best-fit decreasing the slow, obvious way: scan every bin.
std::vector<PackedSequence> naive_bfd(std::vector<std::int64_t> items, std::int64_t L) {
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return items[a] > items[b]; });
  std::vector<PackedSequence> bins;
  for (std::size_t i : order) {
    std::int64_t best_room = std::numeric_limits<std::int64_t>::max();
    std::size_t best = bins.size();
    for (std::size_t b = 0; b < bins.size(); ++b) {
      const std::int64_t room = L - sum(bins[b]);
      if (room >= items[i] && room < best_room) {
        best_room = room;
        best = b;
      }
    }
    if (best == bins.size()) bins.emplace_back();
    bins[best].push_back(items[i]);
  }
  return bins;
}

TEST(SequentialPacker, PacksTheHandWorkedExample) {
  const std::vector<std::int64_t> lengths = {300, 1000, 100, 700, 200, 900, 500, 400, 800, 600};
  PackOptions o;
  o.seq_len = 1000;
  auto r = pack(lengths, o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const std::vector<PackedSequence> expected = {{300}, {1000}, {100, 700, 200}, {900}, {500, 400}, {800}, {600}};
  EXPECT_EQ(r->sequences, expected);
  EXPECT_EQ(r->input_tokens, 5500);
  EXPECT_EQ(r->output_tokens, 5500);
  EXPECT_EQ(r->dropped_tokens, 0);
}

TEST(BestFitDecreasingPacker, PacksTheHandWorkedExample) {
  const std::vector<std::int64_t> lengths = {300, 1000, 100, 700, 200, 900, 500, 400, 800, 600};
  PackOptions o;
  o.seq_len = 1000;
  o.packer = PackerKind::kBestFitDecreasing;
  auto r = pack(lengths, o);
  ASSERT_TRUE(r.ok());
  const std::vector<PackedSequence> expected = {{1000}, {900, 100}, {800, 200}, {700, 300}, {600, 400}, {500}};
  EXPECT_EQ(r->sequences, expected);
}

TEST(Pack, HandlesOverlongSamplesByPolicy) {
  const std::vector<std::int64_t> lengths = {2500, 10, 990};
  PackOptions o;
  o.seq_len = 1000;
  auto split = pack(lengths, o);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->sequences, (std::vector<PackedSequence>{{1000}, {1000}, {500, 10}, {990}}));
  EXPECT_EQ(split->overlong_samples, 1);
  EXPECT_EQ(split->dropped_tokens, 0);
  o.overlong = OverlongPolicy::kTruncate;
  auto trunc = pack(lengths, o);
  ASSERT_TRUE(trunc.ok());
  EXPECT_EQ(trunc->sequences, (std::vector<PackedSequence>{{1000}, {10, 990}}));
  EXPECT_EQ(trunc->dropped_tokens, 1500);
  EXPECT_EQ(trunc->output_tokens, 2000);
  o.overlong = OverlongPolicy::kDrop;
  auto drop = pack(lengths, o);
  ASSERT_TRUE(drop.ok());
  EXPECT_EQ(drop->sequences, (std::vector<PackedSequence>{{10, 990}}));
  EXPECT_EQ(drop->dropped_tokens, 2500);
}

TEST(Pack, RejectsBadLengthsAndSeqLen) {
  PackOptions o;
  o.seq_len = 0;
  EXPECT_FALSE(pack(std::vector<std::int64_t>{1}, o).ok());
  o.seq_len = kMaxSeqLen + 1;
  EXPECT_FALSE(pack(std::vector<std::int64_t>{1}, o).ok());
  o.seq_len = 10;
  auto neg = pack(std::vector<std::int64_t>{3, -1}, o);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.error().message().find("sample 1 has length -1"), std::string::npos);
  EXPECT_FALSE(pack(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max(), 1}, o).ok());
}

TEST(Pack, BoundsWhatSplittingAdds) {
  PackOptions o;
  o.seq_len = 1;
  auto huge = pack(std::vector<std::int64_t>{std::int64_t{1} << 60}, o);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message().find("extra pieces"), std::string::npos);
  // Up to the limit is fine: one sample split into kMaxSplitPieces + 1 pieces.
  auto at_limit = pack(std::vector<std::int64_t>{kMaxSplitPieces + 1}, o);
  ASSERT_TRUE(at_limit.ok());
  EXPECT_EQ(at_limit->sequences.size(), static_cast<std::size_t>(kMaxSplitPieces + 1));
  o.overlong = OverlongPolicy::kTruncate;
  auto truncated = pack(std::vector<std::int64_t>{std::int64_t{1} << 60}, o);
  ASSERT_TRUE(truncated.ok());
  EXPECT_EQ(truncated->dropped_tokens, (std::int64_t{1} << 60) - 1);
}

TEST(Pack, ParsesPolicyAndPackerNames) {
  EXPECT_EQ(*parse_overlong_policy("truncate"), OverlongPolicy::kTruncate);
  EXPECT_EQ(*parse_packer_kind("bfd"), PackerKind::kBestFitDecreasing);
  auto bad = parse_overlong_policy("chop");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("split, truncate, drop"), std::string::npos);
  EXPECT_FALSE(parse_packer_kind("ffd").ok());
}

rc::Gen<OverlongPolicy> gen_policy() {
  return rc::gen::element(OverlongPolicy::kSplit, OverlongPolicy::kTruncate, OverlongPolicy::kDrop);
}

RC_GTEST_PROP(SequentialPacker, KeepsLoaderOrderFitsLAndOpensSequencesOnlyWhenNeeded, ()) {
  const auto lengths = *rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 5000));
  const std::int64_t L = *rc::gen::inRange<std::int64_t>(1, 3000);
  PackOptions o;
  o.seq_len = L;
  o.overlong = *gen_policy();
  auto r = pack(lengths, o);
  RC_ASSERT(r.ok());
  const auto items = expected_items(lengths, L, o.overlong);
  // Loader order: the sequences read in order are exactly the item stream.
  RC_ASSERT(flatten(r->sequences) == items);
  for (std::size_t i = 0; i < r->sequences.size(); ++i) {
    RC_ASSERT(!r->sequences[i].empty());
    RC_ASSERT(sum(r->sequences[i]) <= L);
    // A new sequence starts only because the next sample did not fit.
    if (i + 1 < r->sequences.size()) RC_ASSERT(sum(r->sequences[i]) + r->sequences[i + 1].front() > L);
  }
  const std::int64_t in = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  const std::int64_t out = std::accumulate(items.begin(), items.end(), std::int64_t{0});
  RC_ASSERT(r->input_tokens == in);
  RC_ASSERT(r->output_tokens == out);
  RC_ASSERT(r->dropped_tokens == in - out);
  if (o.overlong == OverlongPolicy::kSplit) RC_ASSERT(r->dropped_tokens == 0);
}

RC_GTEST_PROP(BestFitDecreasingPacker, ConservesTheMultisetFitsLAndMatchesNaiveBfd, ()) {
  const auto lengths = *rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 5000));
  const std::int64_t L = *rc::gen::inRange<std::int64_t>(1, 3000);
  PackOptions o;
  o.seq_len = L;
  o.overlong = *gen_policy();
  o.packer = PackerKind::kBestFitDecreasing;
  auto r = pack(lengths, o);
  RC_ASSERT(r.ok());
  auto items = expected_items(lengths, L, o.overlong);
  auto got = flatten(r->sequences);
  RC_ASSERT(r->sequences == naive_bfd(items, L));
  std::sort(items.begin(), items.end());
  std::sort(got.begin(), got.end());
  RC_ASSERT(got == items);
  for (const auto& s : r->sequences) RC_ASSERT(!s.empty() && sum(s) <= L);
}

}  // namespace
}  // namespace libra
