// plan_flags' wording of a refused chunk cut: the line the user sees for a
// bad --chunks/--chunk-split pair, written out here by hand, and the
// messages name_chunk_flags must pass on untouched.
#include "plan_flags.hpp"

#include <gtest/gtest.h>

namespace {

using libra::ChunkSplit;
using libra::PlanConfig;
using libra::Status;
using libra::cli::name_chunk_flags;
using libra::cli::PlanFlags;
using libra::cli::plan_config_from;

// 4 query heads a tile (H 1), as tests/cli's plan.tapered_two_chunks.
PlanFlags flags(int chunks, const char* split) {
  PlanFlags f;
  f.seq_len = 4;
  f.cp = 2;
  f.block = 2;
  f.head_shards = 1;
  f.heads_q = 4;
  f.heads_kv = 1;
  f.head_dim = 2;
  f.chunks = chunks;
  f.chunk_split = split;
  return f;
}

PlanConfig config_of(const PlanFlags& f) {
  libra::Result<PlanConfig> c = plan_config_from(f);
  EXPECT_TRUE(c.ok()) << c.error().message();
  return *c;
}

Status named(const PlanFlags& f, const PlanConfig& c) {
  return name_chunk_flags(f, c, libra::validate_plan_config(c));
}

TEST(NameChunkFlags, ATaperedCutTheChunksCannotTakeNamesBothFlagsAndTheRule) {
  const PlanFlags two = flags(2, "tapered");
  Status s = named(two, config_of(two));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), libra::ErrorCode::kInvalidInput);
  EXPECT_EQ(s.error().message(),
            "--chunks 2 --chunk-split tapered: tapered chunks need 3 <= chunks <= heads_q / head_shards = 4 (chunks is 2)");

  const PlanFlags five = flags(5, "tapered");
  s = named(five, config_of(five));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(),
            "--chunks 5 --chunk-split tapered: tapered chunks need 3 <= chunks <= heads_q / head_shards = 4 (chunks is 5)");

  // Ulysses cuts heads_q / cp = 2 heads a tile.
  const PlanFlags three = flags(3, "tapered");
  PlanConfig ulysses = config_of(three);
  ulysses.mode = libra::PlanMode::kUlysses;
  s = named(three, ulysses);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(),
            "--chunks 3 --chunk-split tapered: mode ulysses: tapered chunks need 3 <= chunks <= heads_q / cp = 2 "
            "(chunks is 3)");
}

TEST(NameChunkFlags, OtherVerdictsPassThroughUnchanged) {
  // A valid tapered cut, and the equal cut's own rule.
  const PlanFlags ok = flags(3, "tapered");
  EXPECT_TRUE(named(ok, config_of(ok)).ok());
  const PlanFlags equal = flags(3, "equal");
  Status s = named(equal, config_of(equal));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), "plan config: chunks 3 must divide heads_q / head_shards = 4");

  // Another rule fails (one equal chunk fails too): not the cut's fault.
  PlanFlags odd = flags(2, "tapered");
  odd.seq_len = 5;
  s = named(odd, config_of(odd));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), libra::validate_plan_config(config_of(odd)).error().message());
  EXPECT_EQ(s.error().message().rfind("--chunks", 0), std::string::npos);
}

TEST(NameChunkFlags, AMessageWithoutThePlanConfigLeadIsKeptWhole) {
  const PlanFlags two = flags(2, "tapered");
  const Status s = name_chunk_flags(two, config_of(two), libra::invalid_input("tapered chunks need more heads"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), libra::ErrorCode::kInvalidInput);
  EXPECT_EQ(s.error().message(), "tapered chunks need more heads");
}

}  // namespace
