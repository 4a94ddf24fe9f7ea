// Tapered pipeline chunks (ChunkSplit::kTapered): chunk_head_offset against
// an independent reading of the rule, validation, and tapered plans of every
// mode against brute force over their tiles (chunk heads, chunk bytes, the
// chunk each KV head arrives with), re-chunking, and plan files.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "libra/plan.hpp"
#include "tiles/plan_test_util.hpp"

namespace {

using libra::ChunkSplit;
using libra::HeadRange;
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

// The widths the rule gives, read from its statement and nothing else: the
// two ends are e = max(1, round(w / (2 (M - 1)))) wide (halves round up),
// and the w - 2e heads left are dealt to the middle chunks one at a time,
// first middle chunk first, so earlier ones are one head wider where the
// rest does not divide. Equal: w / M each.
std::vector<int> rule_widths(int w, int M, ChunkSplit split) {
  if (split == ChunkSplit::kEqual) return std::vector<int>(static_cast<std::size_t>(M), w / M);
  const int e = static_cast<int>(std::max(1L, std::lround(static_cast<double>(w) / (2.0 * (M - 1)))));
  std::vector<int> out(static_cast<std::size_t>(M), 0);
  out.front() = out.back() = e;
  for (int left = w - 2 * e, i = 0; left > 0; --left, i = (i + 1) % (M - 2)) ++out[static_cast<std::size_t>(1 + i)];
  return out;
}

std::vector<int> widths_of(int w, int M, ChunkSplit split) {
  std::vector<int> out;
  for (int m = 0; m < M; ++m) {
    out.push_back(libra::chunk_head_offset(w, M, split, m + 1) - libra::chunk_head_offset(w, M, split, m));
  }
  return out;
}

// The examples of the rule's documentation (plan.hpp, docs/tiles.md).
static_assert(libra::chunk_head_offset(8, 4, ChunkSplit::kTapered, 1) == 1);
static_assert(libra::chunk_head_offset(8, 4, ChunkSplit::kTapered, 3) == 7);
static_assert(libra::chunk_head_offset(8, 4, ChunkSplit::kEqual, 3) == 6);

TEST(ChunkSplit, OffsetsFollowTheRuleOnTheDocumentedExamples) {
  EXPECT_EQ(widths_of(8, 4, ChunkSplit::kTapered), (std::vector<int>{1, 3, 3, 1}));
  EXPECT_EQ(widths_of(8, 3, ChunkSplit::kTapered), (std::vector<int>{2, 4, 2}));
  EXPECT_EQ(widths_of(16, 4, ChunkSplit::kTapered), (std::vector<int>{3, 5, 5, 3}));
  EXPECT_EQ(widths_of(8, 4, ChunkSplit::kEqual), (std::vector<int>{2, 2, 2, 2}));
  // Where the middles do not divide, the earlier ones are wider.
  EXPECT_EQ(widths_of(9, 4, ChunkSplit::kTapered), (std::vector<int>{2, 3, 2, 2}));
  EXPECT_EQ(widths_of(12, 5, ChunkSplit::kTapered), (std::vector<int>{2, 3, 3, 2, 2}));
  // M = w: one head each.
  EXPECT_EQ(widths_of(5, 5, ChunkSplit::kTapered), (std::vector<int>{1, 1, 1, 1, 1}));
}

TEST(ChunkSplit, OffsetsFollowTheRuleForEveryWidthAndChunkCount) {
  int tapered_cuts = 0, narrower_ends = 0;
  for (int w = 1; w <= 96; ++w) {
    for (int M = 1; M <= w; ++M) {
      for (ChunkSplit split : {ChunkSplit::kEqual, ChunkSplit::kTapered}) {
        if (split == ChunkSplit::kEqual && w % M != 0) continue;
        if (split == ChunkSplit::kTapered && M < 3) continue;
        SCOPED_TRACE(testing::Message() << "w " << w << " M " << M << " " << libra::chunk_split_name(split));
        const std::vector<int> want = rule_widths(w, M, split);
        int at = 0;
        EXPECT_EQ(libra::chunk_head_offset(w, M, split, 0), 0);
        for (int m = 0; m < M; ++m) {
          at += want[static_cast<std::size_t>(m)];
          ASSERT_EQ(libra::chunk_head_offset(w, M, split, m + 1), at) << "chunk " << m;
        }
        ASSERT_EQ(at, w);
        // Outside [0, M]: clamped to the tile.
        EXPECT_EQ(libra::chunk_head_offset(w, M, split, -1), 0);
        EXPECT_EQ(libra::chunk_head_offset(w, M, split, M + 1), w);
        const std::vector<int> got = widths_of(w, M, split);
        for (int x : got) ASSERT_GT(x, 0);
        if (split == ChunkSplit::kEqual) continue;
        ++tapered_cuts;
        // Ends equal, no wider than any middle chunk; middles within one
        // head of each other, wider ones first.
        EXPECT_EQ(got.front(), got.back());
        const auto mid_lo = std::min_element(got.begin() + 1, got.end() - 1);
        const auto mid_hi = std::max_element(got.begin() + 1, got.end() - 1);
        EXPECT_LE(got.front(), *mid_lo);
        EXPECT_LE(*mid_hi - *mid_lo, 1);
        EXPECT_TRUE(std::is_sorted(got.begin() + 1, got.end() - 1, std::greater<>()));
        narrower_ends += got.front() < *mid_lo ? 1 : 0;
      }
    }
  }
  EXPECT_EQ(tapered_cuts, 94 * 95 / 2);  // M in [3, w] for w in [3, 96]
  EXPECT_GT(narrower_ends, tapered_cuts / 3);
}

TEST(ChunkSplit, NamesParseAndAnUnknownNameIsOneLine) {
  for (ChunkSplit s : {ChunkSplit::kEqual, ChunkSplit::kTapered}) {
    auto p = libra::parse_chunk_split(libra::chunk_split_name(s));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, s);
  }
  EXPECT_EQ(libra::chunk_split_name(ChunkSplit::kTapered), "tapered");
  auto bad = libra::parse_chunk_split("uneven");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "chunk split 'uneven': must be equal or tapered");
}

// L 16, d 4, bf16, tau 0.03 (plan_config) with M chunks cut by `split`, on
// nodes of 2 GPUs in supernodes of 2 nodes.
PlanConfig config(int cp, std::int64_t B, int H, int hq, int hkv, int M, ChunkSplit split, PlanMode mode = PlanMode::kTap) {
  PlanConfig c = plan_config(16, cp, B, H, hq, hkv, 4, 2, 0.03);
  c.chunks = M;
  c.chunk_split = split;
  c.mode = mode;
  if (mode == PlanMode::kTapTopo) {  // other modes on their own topology are version 5
    c.topology.gpus_per_node = 2;
    c.topology.nodes_per_supernode = 2;
  }
  return c;
}

const std::vector<PackedSequence> kPool = {{9, 3, 4}, {16}, {2, 12, 2}, {5, 5}};

TEST(ChunkSplit, ValidationNamesTheRuleInOneLine) {
  struct Bad {
    PlanConfig c;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {config(2, 4, 1, 8, 2, 2, ChunkSplit::kTapered),
       "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 8 (chunks is 2)"},
      {config(2, 4, 1, 8, 2, 1, ChunkSplit::kTapered),
       "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 8 (chunks is 1)"},
      {config(2, 4, 2, 8, 2, 5, ChunkSplit::kTapered),
       "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 4 (chunks is 5)"},
      {config(2, 4, 1, 8, 2, 3, ChunkSplit::kEqual), "plan config: chunks 3 must divide heads_q / head_shards = 8"},
      // Ulysses cuts h_q / cp heads a tile (and h_q / H must take M too).
      {config(2, 4, 1, 8, 2, 5, ChunkSplit::kTapered, PlanMode::kUlysses),
       "plan config: mode ulysses: tapered chunks need 3 <= chunks <= heads_q / cp = 4 (chunks is 5)"},
      {config(4, 4, 1, 8, 2, 3, ChunkSplit::kTapered, PlanMode::kUlysses),
       "plan config: mode ulysses: tapered chunks need 3 <= chunks <= heads_q / cp = 2 (chunks is 3)"},
      {config(4, 4, 1, 8, 2, 4, ChunkSplit::kEqual, PlanMode::kUlysses),
       "plan config: mode ulysses: chunks 4 must divide heads_q / cp = 2"},
  };
  for (const Bad& b : cases) {
    const libra::Status s = libra::validate_plan_config(b.c);
    ASSERT_FALSE(s.ok()) << b.message;
    EXPECT_EQ(s.error().message(), b.message);
    auto p = libra::make_plan(kPool, b.c);
    ASSERT_FALSE(p.ok()) << b.message;
    EXPECT_EQ(p.error().message(), b.message);
    EXPECT_EQ(p.error().message().find('\n'), std::string::npos);
    EXPECT_EQ(p.error().code(), libra::ErrorCode::kInvalidInput);
  }
  // An enum value outside the two cuts (a corrupted config).
  PlanConfig odd = config(2, 4, 1, 8, 2, 4, static_cast<ChunkSplit>(7));
  const libra::Status s = libra::validate_plan_config(odd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), "plan config: unknown chunk split 7");
  // The bounds themselves are valid.
  EXPECT_TRUE(libra::validate_plan_config(config(2, 4, 1, 8, 2, 3, ChunkSplit::kTapered)).ok());
  EXPECT_TRUE(libra::validate_plan_config(config(2, 4, 1, 8, 2, 8, ChunkSplit::kTapered)).ok());
  // rechunk_plan checks the new cut the same way.
  auto plan = libra::make_plan(kPool, config(2, 4, 2, 8, 2, 2, ChunkSplit::kEqual));
  ASSERT_TRUE(plan.ok());
  auto re = libra::rechunk_plan(*plan, 5, ChunkSplit::kTapered);
  ASSERT_FALSE(re.ok());
  EXPECT_EQ(re.error().message(), "plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 4 (chunks is 5)");
}

// ---------------------------------------------------------------------------
// Tapered plans against brute force over their tiles.

// The query heads of chunk m of `t`, from the rule's widths.
HeadRange brute_chunk_heads(const Tile& t, const PlanConfig& c, int m) {
  const std::vector<int> w = rule_widths(t.heads.size(), c.chunks, c.chunk_split);
  int at = 0;
  for (int i = 0; i < m; ++i) at += w[static_cast<std::size_t>(i)];
  return {t.heads.begin + at, t.heads.begin + at + w[static_cast<std::size_t>(m)]};
}

// (worker, group, KV head) -> first and last chunk its tiles read it in.
using KvUse = std::map<std::tuple<int, int, int>, std::pair<int, int>>;

// KvUse by brute force over tiles, fragments and chunk heads.
KvUse brute_kv_use(const Plan& plan) {
  const PlanConfig& c = plan.config();
  const int group = c.shape.heads_q / c.shape.heads_kv;
  KvUse use;
  for (const Tile& t : plan.tiles()) {
    for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
      const int g = plan.fragments()[static_cast<std::size_t>(f)].group;
      for (int m = 0; m < c.chunks; ++m) {
        const HeadRange ch = brute_chunk_heads(t, c, m);
        for (int h = ch.begin; h < ch.end; ++h) {
          auto [it, fresh] = use.try_emplace({t.worker, g, h / group}, m, m);
          if (!fresh) {
            it->second.first = std::min(it->second.first, m);
            it->second.second = std::max(it->second.second, m);
          }
        }
      }
    }
  }
  return use;
}

// plan.kv_use against brute force; returns how many uses first appear after chunk 0.
int check_kv_use(const Plan& plan, const KvUse& use) {
  int later = 0;
  for (const auto& [key, fl] : use) {
    const auto& [r, g, k] = key;
    const libra::ChunkUse u = plan.kv_use(r, g, k);
    EXPECT_EQ(u.first, fl.first) << "worker " << r << " group " << g << " KV head " << k;
    EXPECT_EQ(u.last, fl.second) << "worker " << r << " group " << g << " KV head " << k;
    later += fl.first > 0 ? 1 : 0;
  }
  for (int r = 0; r < plan.num_workers(); ++r) {
    for (std::int32_t g : plan.worker_groups(r)) {
      const libra::KvGroup& kg = plan.groups()[static_cast<std::size_t>(g)];
      for (int k = kg.kv_heads.begin; k < kg.kv_heads.end; ++k) {
        EXPECT_EQ(plan.kv_use(r, g, k).used(), use.count({r, g, k}) == 1) << "worker " << r << " group " << g << " KV head " << k;
      }
    }
  }
  return later;
}

// A KV item of chunk m to worker d: its bytes, its cells sent once (recorded in `cells`), and every head
// arriving with the first chunk that reads it on d.
void check_kv_item(const Transfer& x, int m, int M, int d, const KvUse& use, std::int64_t de,
                   std::set<std::tuple<int, std::int64_t, int>>& cells) {
  EXPECT_EQ(x.bytes, 2 * (x.end - x.begin) * x.heads.size() * de);
  for (std::int64_t tok = x.begin; tok < x.end; ++tok)
    for (int k = x.heads.begin; k < x.heads.end; ++k) {
      EXPECT_TRUE(cells.insert({x.group, tok, k}).second) << "KV cell sent twice";
    }
  int first = M, last = -1;
  for (int k = x.heads.begin; k < x.heads.end; ++k) {
    auto it = use.find({d, x.group, k});
    if (it == use.end()) {
      ADD_FAILURE() << "KV head " << k << " of group " << x.group << " sent to worker " << d << ", which never reads it";
      continue;
    }
    EXPECT_EQ(it->second.first, m) << "KV head " << k << " of group " << x.group << " to worker " << d
                                   << " arrives in chunk " << m << ", first read in " << it->second.first;
    first = std::min(first, it->second.first);
    last = std::max(last, it->second.second);
  }
  EXPECT_EQ(x.first_use, first);
  EXPECT_EQ(x.last_use, last);
}

// The chunks of step s -> d carry exactly the step: every Q/O item's bytes, every KV cell once.
void check_pair_chunks(const Plan& plan, const KvUse& use, int s, int d) {
  const PlanConfig& c = plan.config();
  const int M = c.chunks;
  const std::int64_t de = c.shape.head_dim * c.shape.elem_bytes();
  // Whole-step items, and the cells (token, head) of each KV item.
  std::map<int, std::int64_t> qo_bytes;  // (kind, tile) folded: tile * 3 + kind
  std::set<std::tuple<int, std::int64_t, int>> kv_cells, kv_chunk_cells;  // (group, token, KV head)
  std::int64_t whole = 0;
  for (const Transfer& x : plan.transfers(s, d)) {
    whole += x.bytes;
    if (x.kind == TransferKind::kKv) {
      for (std::int64_t tok = x.begin; tok < x.end; ++tok)
        for (int k = x.heads.begin; k < x.heads.end; ++k) kv_cells.insert({x.group, tok, k});
    } else {
      qo_bytes[x.tile * 3 + static_cast<int>(x.kind)] += x.bytes;
    }
  }
  std::int64_t chunks_total = 0;
  for (int m = 0; m < M; ++m) {
    std::int64_t in_chunk = 0;
    for (const Transfer& x : plan.chunk_transfers(m, s, d)) {
      in_chunk += x.bytes;
      EXPECT_GT(x.heads.size(), 0);
      if (x.kind == TransferKind::kKv) {
        check_kv_item(x, m, M, d, use, de, kv_chunk_cells);
      } else {
        const Tile& t = plan.tiles()[static_cast<std::size_t>(x.tile)];
        EXPECT_EQ(x.heads, plan.chunk_heads(t, m)) << "tile " << t.id << " chunk " << m;
        EXPECT_EQ(x.heads, brute_chunk_heads(t, c, m)) << "tile " << t.id << " chunk " << m;
        EXPECT_EQ(x.bytes, (x.end - x.begin) * x.heads.size() * de);
        EXPECT_EQ(x.first_use, m);
        EXPECT_EQ(x.last_use, m);
        qo_bytes[x.tile * 3 + static_cast<int>(x.kind)] -= x.bytes;
      }
    }
    EXPECT_EQ(in_chunk, plan.chunk_bytes(m, s, d)) << "chunk " << m << " " << s << " -> " << d;
    chunks_total += in_chunk;
  }
  for (const auto& [key, left] : qo_bytes) EXPECT_EQ(left, 0) << "tile " << key / 3 << " kind " << key % 3;
  EXPECT_EQ(kv_chunk_cells, kv_cells) << s << " -> " << d;
  EXPECT_EQ(chunks_total, whole);
  EXPECT_EQ(whole, plan.bytes(s, d));
}

// Checks every chunk cut of `plan` against brute force; returns how many
// (worker, group, KV head) uses first appear after chunk 0 (a tapered cut
// moves some).
int check_chunks(const Plan& plan) {
  const PlanConfig& c = plan.config();
  // Chunk heads: the rule's cut of every tile's heads.
  for (const Tile& t : plan.tiles()) {
    for (int m = 0; m < c.chunks; ++m) EXPECT_EQ(plan.chunk_heads(t, m), brute_chunk_heads(t, c, m)) << "tile " << t.id << " chunk " << m;
  }
  const KvUse use = brute_kv_use(plan);
  const int later = check_kv_use(plan, use);
  for (int s = 0; s < plan.num_workers(); ++s) {
    for (int d = 0; d < plan.num_workers(); ++d) check_pair_chunks(plan, use, s, d);
  }
  return later;
}

struct Shape {
  int cp, H, hq, hkv, M;
  PlanMode mode;
  bool dedup = false, prefix = false;
};

// Shapes whose tapered widths differ from the equal cut (w >= 4, M = 3 or 4;
// ulysses cuts h_q / cp), KV heads spanning chunks (h_kv 4 with 8 query
// heads in 1,3,3,1), H > h_kv, dedup per KV head and the KV prefix.
std::vector<Shape> tapered_shapes() {
  std::vector<Shape> out;
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo}) {
    out.push_back({2, 1, 8, 2, 4, mode});
    out.push_back({2, 1, 8, 4, 4, mode});
    out.push_back({2, 1, 8, 2, 3, mode});
    out.push_back({2, 2, 8, 2, 3, mode});
    out.push_back({2, 1, 16, 4, 4, mode});
    out.push_back({2, 1, 8, 4, 3, mode, true});
    out.push_back({2, 1, 8, 2, 4, mode, false, true});
  }
  out.push_back({2, 2, 16, 1, 4, PlanMode::kTap, true});  // H > h_kv, 8 heads a tile
  out.push_back({2, 1, 8, 2, 3, PlanMode::kUlysses});     // 4 heads a tile: 1, 2, 1
  out.push_back({2, 1, 16, 4, 4, PlanMode::kUlysses});    // 8 heads a tile: 1, 3, 3, 1
  out.push_back({2, 1, 16, 2, 3, PlanMode::kUlysses, false, true});
  return out;
}

PlanConfig shape_config(const Shape& sh, ChunkSplit split) {
  PlanConfig c = config(sh.cp, 4, sh.H, sh.hq, sh.hkv, sh.M, split, sh.mode);
  c.dedup_per_kv_head = sh.dedup;
  c.kv_prefix = sh.prefix;
  return c;
}

std::string shape_name(const Shape& sh) {
  return std::string(libra::plan_mode_name(sh.mode)) + " cp " + std::to_string(sh.cp) + " H " + std::to_string(sh.H) +
         " hq " + std::to_string(sh.hq) + " hkv " + std::to_string(sh.hkv) + " M " + std::to_string(sh.M) +
         (sh.dedup ? " dedup" : "") + (sh.prefix ? " kv-prefix" : "");
}

TEST(TaperedPlan, ChunkCutsMatchBruteForceInEveryMode) {
  int later = 0;
  for (const Shape& sh : tapered_shapes()) {
    SCOPED_TRACE(shape_name(sh));
    const PlanConfig c = shape_config(sh, ChunkSplit::kTapered);
    auto plan = libra::make_plan(kPool, c);
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    EXPECT_EQ(plan->config().chunk_split, ChunkSplit::kTapered);
    // The cut really is tapered: chunk 0 narrower than chunk 1.
    const Tile& t0 = plan->tiles().front();
    EXPECT_LT(plan->chunk_heads(t0, 0).size(), plan->chunk_heads(t0, 1).size());
    later += check_chunks(*plan);
    // No placement reads the cut: the tiles, workers and whole-step bytes
    // are the equal cut's at a chunk count that divides.
    PlanConfig eq = c;
    eq.chunk_split = ChunkSplit::kEqual;
    eq.chunks = 1;
    auto equal = libra::make_plan(kPool, eq);
    ASSERT_TRUE(equal.ok()) << equal.error().message();
    EXPECT_EQ(workers_of(*plan), workers_of(*equal));
    EXPECT_EQ(std::vector<std::int64_t>(plan->byte_matrix().begin(), plan->byte_matrix().end()),
              std::vector<std::int64_t>(equal->byte_matrix().begin(), equal->byte_matrix().end()));
    EXPECT_NE(plan->fingerprint(), equal->fingerprint());
  }
  EXPECT_GT(later, 0) << "no KV head ever arrived after chunk 0: the cases test nothing about later chunks";
}

// Equal plans go through the same checks (the brute force reads the rule for
// both cuts), so the checker is not written to the tapered cut alone.
TEST(TaperedPlan, EqualPlansPassTheSameBruteForce) {
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapTopo, PlanMode::kUlysses}) {
    for (int M : {1, 2, 4}) {
      const PlanConfig c = config(2, 4, 1, 8, 4, M, ChunkSplit::kEqual, mode);
      auto plan = libra::make_plan(kPool, c);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      check_chunks(*plan);
    }
  }
}

rc::Gen<std::vector<PackedSequence>> gen_pool(int slots, std::int64_t L) {
  return rc::gen::exec([slots, L] {
    std::vector<PackedSequence> pool;
    for (int p = 0; p < slots; ++p) pool.push_back(draw_packed_sequence(L));
    return pool;
  });
}

RC_GTEST_PROP(TaperedPlan, ChunkCutsMatchBruteForceOnRandomPools, ()) {
  const int P = *rc::gen::inRange(1, 4);
  const int cp = *rc::gen::element(1, 2, 4);
  const std::int64_t B = *rc::gen::element(1, 2, 4);
  const std::int64_t L = cp * B * *rc::gen::inRange(1, 4);
  const int hkv = *rc::gen::element(1, 2, 4);
  const int hq = hkv * *rc::gen::element(2, 4, 8);
  const PlanMode mode = *rc::gen::element(PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo, PlanMode::kUlysses);
  std::vector<int> shards;
  for (int H = 1; H <= hq; ++H) {
    if (hq % H == 0 && (H % hkv == 0 || hkv % H == 0)) shards.push_back(H);
  }
  const int H = *rc::gen::elementOf(shards);
  if (mode == PlanMode::kUlysses) RC_PRE(hq % cp == 0 && (cp % hkv == 0 || hkv % cp == 0));
  // Every mode cuts h_q / H heads; ulysses' tiles are h_q / cp wide.
  const int width = mode == PlanMode::kUlysses ? std::min(hq / cp, hq / H) : hq / H;
  RC_PRE(width >= 3);
  PlanConfig c = plan_config(L, cp, B, H, hq, hkv, 1, 2, 0.0);  // head_dim, dtype and tau drawn here:
  c.shape.head_dim = *rc::gen::inRange(1, 4);
  c.shape.dtype = *rc::gen::element(libra::DType::kBF16, libra::DType::kF32);
  if (*rc::gen::inRange(0, 4) == 0) c.shape.window = *rc::gen::inRange<std::int64_t>(1, 6);
  c.tau = *rc::gen::element(0.0, 0.03, 0.2);
  c.mode = mode;
  c.chunks = *rc::gen::inRange(3, width + 1);
  c.chunk_split = ChunkSplit::kTapered;
  c.dedup_per_kv_head = *rc::gen::arbitrary<bool>();
  c.kv_prefix = mode != PlanMode::kUlysses && *rc::gen::arbitrary<bool>();
  c.topology.gpus_per_node = *rc::gen::element(1, 2, 4);
  const std::vector<PackedSequence> pool = *gen_pool(P, L);
  auto plan = libra::make_plan(pool, c);
  if (!plan.ok()) RC_FAIL(plan.error().message());
  check_chunks(*plan);
  RC_ASSERT(!::testing::Test::HasFailure());
}

// rechunk_plan(make_plan(pool, equal M0), M, tapered) is make_plan with the
// tapered config: the same plan, fingerprint and chunk lists.
TEST(TaperedPlan, RechunkEqualsPlanningTapered) {
  for (const Shape& sh : tapered_shapes()) {
    SCOPED_TRACE(shape_name(sh));
    const PlanConfig tapered = shape_config(sh, ChunkSplit::kTapered);
    auto direct = libra::make_plan(kPool, tapered);
    ASSERT_TRUE(direct.ok()) << direct.error().message();
    for (int m0 : {1, 2}) {
      PlanConfig eq = tapered;
      eq.chunk_split = ChunkSplit::kEqual;
      eq.chunks = m0;
      auto equal = libra::make_plan(kPool, eq);
      ASSERT_TRUE(equal.ok()) << equal.error().message();
      auto re = libra::rechunk_plan(*equal, sh.M, ChunkSplit::kTapered);
      ASSERT_TRUE(re.ok()) << re.error().message();
      EXPECT_EQ(re->fingerprint(), direct->fingerprint());
      EXPECT_EQ(re->config().chunks, sh.M);
      EXPECT_EQ(re->config().chunk_split, ChunkSplit::kTapered);
      EXPECT_EQ(workers_of(*re), workers_of(*direct));
      const int W = direct->num_workers();
      for (int m = 0; m < sh.M; ++m) {
        for (int s = 0; s < W; ++s) {
          for (int d = 0; d < W; ++d) {
            ASSERT_EQ(re->chunk_bytes(m, s, d), direct->chunk_bytes(m, s, d));
            const auto a = re->chunk_transfers(m, s, d), b = direct->chunk_transfers(m, s, d);
            ASSERT_EQ(a.size(), b.size());
            for (std::size_t i = 0; i < a.size(); ++i) {
              EXPECT_EQ(std::tie(a[i].kind, a[i].begin, a[i].end, a[i].heads.begin, a[i].heads.end, a[i].bytes,
                                 a[i].first_use, a[i].last_use),
                        std::tie(b[i].kind, b[i].begin, b[i].end, b[i].heads.begin, b[i].heads.end, b[i].bytes,
                                 b[i].first_use, b[i].last_use));
            }
          }
        }
      }
      // The two-argument form keeps the plan's own cut; back to equal is the
      // equal plan again.
      auto same_cut = libra::rechunk_plan(*direct, sh.M);
      ASSERT_TRUE(same_cut.ok());
      EXPECT_EQ(same_cut->fingerprint(), direct->fingerprint());
      auto back = libra::rechunk_plan(*direct, m0, ChunkSplit::kEqual);
      ASSERT_TRUE(back.ok()) << back.error().message();
      EXPECT_EQ(back->fingerprint(), equal->fingerprint());
    }
  }
}

// ---------------------------------------------------------------------------
// Plan files: the fingerprint from the canonical words of
// docs/plan-format.md, computed here independently of libra.

std::uint64_t doc_hash(const std::vector<std::uint64_t>& words) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::uint64_t x : words) {
    h ^= x;
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

std::uint64_t doc_fingerprint(const Plan& plan) {
  const PlanConfig& c = plan.config();
  const bool own_topology = c.mode != PlanMode::kTapTopo && !(c.topology == libra::PlanTopology{});
  const std::uint64_t version = own_topology ? 5 : c.chunk_split != ChunkSplit::kEqual ? 4 : c.kv_prefix ? 3 : c.home_layout != libra::HomeLayout::kContiguous ? 2 : 1;
  std::vector<std::uint64_t> w = {0x4e4c50415242494cULL, version};
  const std::uint64_t dtype = c.shape.dtype == libra::DType::kF32 ? 4 : c.shape.dtype == libra::DType::kBF16 ? 2 : 258;
  for (std::uint64_t x : {static_cast<std::uint64_t>(c.seq_len), static_cast<std::uint64_t>(c.cp),
                          static_cast<std::uint64_t>(c.block_size), static_cast<std::uint64_t>(c.head_shards),
                          static_cast<std::uint64_t>(c.shape.heads_q), static_cast<std::uint64_t>(c.shape.heads_kv),
                          static_cast<std::uint64_t>(c.shape.head_dim), dtype, static_cast<std::uint64_t>(c.shape.window),
                          std::bit_cast<std::uint64_t>(c.tau), static_cast<std::uint64_t>(c.chunks)}) {
    w.push_back(x);
  }
  const std::map<PlanMode, std::uint64_t> mode = {
      {PlanMode::kTap, 0}, {PlanMode::kUlysses, 1}, {PlanMode::kTapSplit, 2}, {PlanMode::kTapTopo, 3}};
  w.push_back(mode.at(c.mode));
  w.push_back(c.dedup_per_kv_head ? 1 : 0);
  if (version >= 2) w.push_back(c.home_layout == libra::HomeLayout::kZigzag ? 1 : 0);
  if (version >= 3) w.push_back(c.kv_prefix ? 1 : 0);
  if (version >= 4) w.push_back(c.chunk_split == ChunkSplit::kTapered ? 1 : 0);
  if (c.mode == PlanMode::kTapTopo || version == 5) {
    const libra::PlanTopology& t = c.topology;
    for (std::uint64_t x : {static_cast<std::uint64_t>(t.gpus_per_node), static_cast<std::uint64_t>(t.nodes_per_supernode),
                            std::bit_cast<std::uint64_t>(t.intra_node_gbps), std::bit_cast<std::uint64_t>(t.inter_node_gbps),
                            std::bit_cast<std::uint64_t>(t.inter_supernode_gbps),
                            std::bit_cast<std::uint64_t>(t.congestion_per_node)}) {
      w.push_back(x);
    }
  }
  w.push_back(plan.pool().size());
  for (const PackedSequence& seq : plan.pool()) {
    w.push_back(seq.size());
    for (std::int64_t l : seq) w.push_back(static_cast<std::uint64_t>(l));
  }
  w.push_back(plan.tiles().size());
  for (const Tile& t : plan.tiles()) {
    w.push_back(static_cast<std::uint64_t>(t.slot) << 32 | static_cast<std::uint64_t>(t.block));
    w.push_back(static_cast<std::uint64_t>(t.shard) << 32 | static_cast<std::uint64_t>(t.worker));
    w.push_back(static_cast<std::uint64_t>(t.begin));
    w.push_back(static_cast<std::uint64_t>(t.end));
  }
  return doc_hash(w);
}

std::uint32_t binary_version(const std::string& bin) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(bin[8 + static_cast<std::size_t>(i)]);
  return v;
}

TEST(TaperedPlanFile, IsVersionFourAndRoundTripsThroughJsonAndBinary) {
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapSplit, PlanMode::kTapTopo, PlanMode::kUlysses}) {
    for (int variant = 0; variant < 3; ++variant) {
      PlanConfig c = config(2, 4, 1, 8, 2, mode == PlanMode::kUlysses ? 3 : 4, ChunkSplit::kTapered, mode);
      c.kv_prefix = variant == 1 && mode != PlanMode::kUlysses;
      if (variant == 2) {
        c.home_layout = libra::HomeLayout::kZigzag;
        c.block_size = 2;
      }
      SCOPED_TRACE(std::string(libra::plan_mode_name(mode)) + " variant " + std::to_string(variant));
      auto plan = libra::make_plan(kPool, c);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      EXPECT_EQ(libra::plan_format_version(plan->config()), 4U);
      EXPECT_EQ(plan->fingerprint(), doc_fingerprint(*plan));
      const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));
      EXPECT_EQ(j["version"], 4);
      EXPECT_EQ(j["config"]["chunk_split"], "tapered");
      EXPECT_EQ(j["config"]["kv_prefix"], c.kv_prefix);
      EXPECT_EQ(j["config"]["home_layout"], std::string(libra::home_layout_name(c.home_layout)));
      const std::string bin = libra::plan_to_binary(*plan);
      EXPECT_EQ(binary_version(bin), 4U);
      for (const auto& loaded : {libra::plan_from_json(j.dump()), libra::plan_from_binary(bin)}) {
        ASSERT_TRUE(loaded.ok()) << loaded.error().message();
        EXPECT_EQ(loaded->fingerprint(), plan->fingerprint());
        EXPECT_EQ(loaded->config().chunk_split, ChunkSplit::kTapered);
        EXPECT_EQ(loaded->config().kv_prefix, c.kv_prefix);
        EXPECT_EQ(loaded->config().home_layout, c.home_layout);
        EXPECT_EQ(workers_of(*loaded), workers_of(*plan));
        for (int m = 0; m < c.chunks; ++m) {
          EXPECT_EQ(loaded->chunk_heads(loaded->tiles()[0], m), plan->chunk_heads(plan->tiles()[0], m));
          EXPECT_EQ(loaded->chunk_bytes(m, 0, 1), plan->chunk_bytes(m, 0, 1));
        }
      }
    }
  }
}

TEST(TaperedPlanFile, EqualPlansKeepTheirVersionFingerprintAndFile) {
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapTopo, PlanMode::kUlysses}) {
    for (int variant = 0; variant < 3; ++variant) {
      PlanConfig c = config(2, 4, 1, 8, 2, 4, ChunkSplit::kEqual, mode);
      c.kv_prefix = variant == 2 && mode != PlanMode::kUlysses;
      if (variant == 1) {
        c.home_layout = libra::HomeLayout::kZigzag;
        c.block_size = 2;
      }
      const std::uint32_t want_version = c.kv_prefix ? 3 : c.home_layout == libra::HomeLayout::kZigzag ? 2 : 1;
      SCOPED_TRACE(std::string(libra::plan_mode_name(mode)) + " variant " + std::to_string(variant));
      auto plan = libra::make_plan(kPool, c);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      // The documented words of versions 1-3: no chunk_split word.
      EXPECT_EQ(plan->fingerprint(), doc_fingerprint(*plan));
      const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));
      EXPECT_EQ(j["version"], want_version);
      EXPECT_FALSE(j["config"].contains("chunk_split"));
      EXPECT_EQ(binary_version(libra::plan_to_binary(*plan)), want_version);
      // The same tiles cut tapered: another fingerprint, version 4.
      auto tapered = libra::rechunk_plan(*plan, 4, ChunkSplit::kTapered);
      ASSERT_TRUE(tapered.ok()) << tapered.error().message();
      EXPECT_NE(tapered->fingerprint(), plan->fingerprint());
      EXPECT_EQ(tapered->fingerprint(), doc_fingerprint(*tapered));
    }
  }
}

TEST(TaperedPlanFile, RejectsACutThatDisagreesWithTheVersionInOneLine) {
  auto plan = libra::make_plan(kPool, config(2, 4, 1, 8, 2, 4, ChunkSplit::kTapered));
  ASSERT_TRUE(plan.ok());
  const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));
  auto expect_error = [](const libra::Result<Plan>& r, const std::string& want) {
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_EQ(r.error().message(), want);
  };
  {
    auto k = j;
    k["config"]["chunk_split"] = "equal";  // a version-4 file that is not tapered
    expect_error(libra::plan_from_json(k.dump(), "t.json"), "t.json: config: home_layout contiguous is format version 1, the file says 4");
  }
  {
    auto k = j;
    k["version"] = 3;
    k["config"]["kv_prefix"] = true;
    expect_error(libra::plan_from_json(k.dump(), "t.json"),
                 "t.json: config: field 'chunk_split' belongs to format version 4 and later; the file says version 3");
  }
  {
    auto k = j;  // a tapered cut in a version-1 file
    k["version"] = 1;
    k["config"].erase("home_layout");
    k["config"].erase("kv_prefix");
    expect_error(libra::plan_from_json(k.dump(), "t.json"),
                 "t.json: config: field 'chunk_split' belongs to format version 4 and later; the file says version 1");
  }
  {
    // The binary chunk-split word: 2 is no cut (the fingerprint is fixed
    // up, so only the decoder can refuse it).
    const std::string bin = libra::plan_to_binary(*plan);
    std::vector<std::uint64_t> words((bin.size() - 32) / 8);
    std::memcpy(words.data(), bin.data() + 32, words.size() * 8);
    ASSERT_EQ(words[1], 4U);
    ASSERT_EQ(words[17], 1U);  // magic, version, 11 config words, mode, dedup, layout, prefix: then the split
    words[17] = 2;
    std::string k = bin;
    std::memcpy(k.data() + 32, words.data(), words.size() * 8);
    const std::uint64_t h = doc_hash(words);
    std::memcpy(k.data() + 16, &h, 8);
    auto r = libra::plan_from_binary(k, "t.bin");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message(), "t.bin: malformed binary plan at word 18: chunk split");
  }
  {
    auto k = j;
    k["config"]["chunk_split"] = "uneven";
    expect_error(libra::plan_from_json(k.dump(), "t.json"), "t.json: config: chunk split 'uneven': must be equal or tapered");
  }
  {
    auto k = j;
    k["config"].erase("chunk_split");
    auto r = libra::plan_from_json(k.dump(), "t.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("chunk_split"), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
  }
  {
    // A tapered cut the chunk count cannot take (M = 2).
    auto k = j;
    k["config"]["chunks"] = 2;
    expect_error(libra::plan_from_json(k.dump(), "t.json"),
                 "t.json: plan config: tapered chunks need 3 <= chunks <= heads_q / head_shards = 8 (chunks is 2)");
  }
}

}  // namespace
