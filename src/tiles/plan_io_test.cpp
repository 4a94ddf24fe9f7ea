// Plan files: round trips through JSON and binary, and rejection of files
// of another version, with a wrong fingerprint or inconsistent content.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "libra/io.hpp"
#include "libra/plan.hpp"

namespace {

using libra::PackedSequence;
using libra::Plan;
using libra::PlanConfig;
using libra::PlanMode;

PlanConfig small_config(PlanMode mode) {
  PlanConfig c;
  c.seq_len = 64;
  c.cp = 2;
  c.block_size = 8;
  c.head_shards = 4;
  c.shape = {.heads_q = 8, .heads_kv = 2, .head_dim = 16, .dtype = libra::DType::kBF16};
  c.chunks = 2;
  c.mode = mode;
  return c;
}

const std::vector<PackedSequence> kPool = {{40, 3, 9}, {7, 7}, {64}, {1, 2, 3, 4, 5}};

void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  ASSERT_EQ(a.tiles().size(), b.tiles().size());
  for (std::size_t i = 0; i < a.tiles().size(); ++i) {
    const libra::Tile& x = a.tiles()[i];
    const libra::Tile& y = b.tiles()[i];
    EXPECT_EQ(std::tie(x.slot, x.block, x.shard, x.piece, x.begin, x.end, x.flops, x.home, x.worker),
              std::tie(y.slot, y.block, y.shard, y.piece, y.begin, y.end, y.flops, y.home, y.worker));
  }
  EXPECT_EQ(std::vector<std::int64_t>(a.byte_matrix().begin(), a.byte_matrix().end()),
            std::vector<std::int64_t>(b.byte_matrix().begin(), b.byte_matrix().end()));
  EXPECT_EQ(a.all_transfers().size(), b.all_transfers().size());
  EXPECT_EQ(a.config().tau, b.config().tau);
}

TEST(PlanFile, RoundTripsThroughJsonAndBinaryInEveryMode) {
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kUlysses, PlanMode::kTapSplit}) {
    PlanConfig c = small_config(mode);
    c.tau = 0.1 / 3;  // not exactly representable in decimal
    c.shape.window = mode == PlanMode::kUlysses ? 5 : libra::kFullCausal;
    auto plan = libra::make_plan(kPool, c);
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    auto from_json = libra::plan_from_json(libra::plan_to_json(*plan));
    ASSERT_TRUE(from_json.ok()) << from_json.error().message();
    expect_same_plan(*plan, *from_json);
    auto from_bin = libra::plan_from_binary(libra::plan_to_binary(*plan));
    ASSERT_TRUE(from_bin.ok()) << from_bin.error().message();
    expect_same_plan(*plan, *from_bin);
  }
}

// kv_prefix plans are format version 3 (version 2's words plus one), carry
// the option through both files, and re-derive the same clipped exchange.
TEST(PlanFile, KvPrefixIsVersionThreeAndRoundTrips) {
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kTapTopo}) {
    PlanConfig c = small_config(mode);
    c.kv_prefix = true;
    auto plan = libra::make_plan(kPool, c);
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));
    EXPECT_EQ(j["version"], 3);
    EXPECT_EQ(j["config"]["kv_prefix"], true);
    EXPECT_EQ(j["config"]["home_layout"], "contiguous");
    for (const auto& loaded : {libra::plan_from_json(j.dump()), libra::plan_from_binary(libra::plan_to_binary(*plan))}) {
      ASSERT_TRUE(loaded.ok()) << loaded.error().message();
      EXPECT_TRUE(loaded->config().kv_prefix);
      expect_same_plan(*plan, *loaded);
    }
    // A version-3 file that does not ask for the prefix is not what this
    // libra writes (such a plan is version 1): refused, one line.
    auto k = j;
    k["config"]["kv_prefix"] = false;
    auto r = libra::plan_from_json(k.dump(), "k.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message().find("k.json: config: home_layout contiguous is format version 1, the file says 3"), 0U)
        << r.error().message();
  }
  // Without the option nothing changes: format 1, no kv_prefix field.
  auto plain = libra::make_plan(kPool, small_config(PlanMode::kTap));
  ASSERT_TRUE(plain.ok());
  const nlohmann::json pj = nlohmann::json::parse(libra::plan_to_json(*plain));
  EXPECT_EQ(pj["version"], 1);
  EXPECT_FALSE(pj["config"].contains("kv_prefix"));
}

TEST(PlanFile, FingerprintIsStableAndContentSensitive) {
  const PlanConfig c = small_config(PlanMode::kTap);
  auto a = libra::make_plan(kPool, c);
  auto b = libra::make_plan(kPool, c);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  PlanConfig c2 = c;
  c2.tau = 0.04;
  std::vector<PackedSequence> pool2 = kPool;
  pool2[3][0] = 2;
  pool2[3][1] = 1;
  auto other_tau = libra::make_plan(kPool, c2);
  auto other_pool = libra::make_plan(pool2, c);
  ASSERT_TRUE(other_tau.ok() && other_pool.ok());
  EXPECT_NE(a->fingerprint(), other_tau->fingerprint());
  EXPECT_NE(a->fingerprint(), other_pool->fingerprint());
}

TEST(PlanFile, SavesAtomicallyAndLoadsByContent) {
  auto plan = libra::make_plan(kPool, small_config(PlanMode::kTapSplit));
  ASSERT_TRUE(plan.ok());
  const auto dir = std::filesystem::temp_directory_path() / ("libra_plan_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const char* name : {"p.json", "p.bin", "p.plan"}) {
    const std::string path = (dir / name).string();
    ASSERT_TRUE(libra::save_plan(*plan, path).ok());
    auto loaded = libra::load_plan(path);
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    expect_same_plan(*plan, *loaded);
  }
  auto bytes = libra::read_file((dir / "p.bin").string());
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->substr(0, 8), "LIBRAPLN");
  EXPECT_EQ(libra::plan_format_for_path("x.json"), libra::PlanFileFormat::kJson);
  EXPECT_EQ(libra::plan_format_for_path("x.bin"), libra::PlanFileFormat::kBinary);
  std::filesystem::remove_all(dir);
}

TEST(PlanFile, RejectsOtherVersionsAndTamperedContent) {
  auto plan = libra::make_plan(kPool, small_config(PlanMode::kTap));
  ASSERT_TRUE(plan.ok());
  const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));

  auto expect_error = [](const libra::Result<Plan>& r, const std::string& part) {
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(r.error().message().find(part), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
  };
  {
    auto k = j;
    k["version"] = 6;
    expect_error(libra::plan_from_json(k.dump(), "p.json"), "p.json: plan format version 6; this libra reads versions 1 to 5");
  }
  {
    auto k = j;
    const int w = k["tiles"][0]["worker"].get<int>();
    k["tiles"][0]["worker"] = (w + 1) % plan->num_workers();
    k.erase("worker_flops");
    k.erase("byte_matrix");
    k.erase("comm_bytes");
    k["tiles"][0].erase("flops");
    expect_error(libra::plan_from_json(k.dump(), "p.json"), "does not match");
  }
  {
    auto k = j;
    k["comm_bytes"] = k["comm_bytes"].get<std::int64_t>() + 1;
    expect_error(libra::plan_from_json(k.dump(), "p.json"), "comm_bytes");
  }
  {
    auto k = j;
    k["tiles"].erase(k["tiles"].size() - 1);
    expect_error(libra::plan_from_json(k.dump(), "p.json"), "not covered");
  }
  {
    auto k = j;
    k["config"]["cp"] = 3;
    expect_error(libra::plan_from_json(k.dump(), "p.json"), "p.json: plan config: seq_len 64 must be divisible by cp 3");
  }
  expect_error(libra::plan_from_json("{\"format\": ", "p.json"), "p.json: not valid JSON");
  expect_error(libra::plan_from_json("[1]", "p.json"), "not a libra plan");

  const std::string bin = libra::plan_to_binary(*plan);
  {
    std::string k = bin;
    k[8] = 7;  // version
    expect_error(libra::plan_from_binary(k, "p.bin"), "p.bin: plan format version 7");
  }
  {
    std::string k = bin;
    k[k.size() - 1] ^= 1;  // last tile's end row
    expect_error(libra::plan_from_binary(k, "p.bin"), "fingerprint");
  }
  expect_error(libra::plan_from_binary(bin.substr(0, bin.size() - 3), "p.bin"), "truncated");
  expect_error(libra::plan_from_binary("hello", "p.bin"), "not a libra binary plan");
}

// Issue 21: these summaries loaded without complaint when they disagreed
// with the tiles, and a nonzero flags word was accepted.
TEST(PlanFile, RejectsStatedSummariesThatDisagreeWithTheTilesAndAFlagsWord) {
  auto plan = libra::make_plan(kPool, small_config(PlanMode::kTap));
  ASSERT_TRUE(plan.ok());
  const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));
  ASSERT_TRUE(libra::plan_from_json(j.dump(), "p.json").ok());
  auto expect_error = [](const libra::Result<Plan>& r, const std::string& part) {
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(r.error().message().find(part), std::string::npos) << r.error().message();
  };
  for (const char* key : {"num_workers", "pool_size"}) {
    auto k = j;
    k[key] = k[key].get<std::int64_t>() + 1;
    expect_error(libra::plan_from_json(k.dump(), "p.json"), std::string("p.json: field '") + key + "' disagrees");
  }
  {
    auto k = j;
    k["imbalance"] = k["imbalance"].get<double>() + 0.25;
    expect_error(libra::plan_from_json(k.dump(), "p.json"), "p.json: field 'imbalance' disagrees");
  }
  std::string bin = libra::plan_to_binary(*plan);
  ASSERT_TRUE(libra::plan_from_binary(bin, "p.bin").ok());
  bin[12] = 1;
  expect_error(libra::plan_from_binary(bin, "p.bin"), "p.bin: binary plan header: flags word is 1, expected 0");
}

// Every field of PlanConfig, the topology included, as one comparable tuple.
auto config_fields(const PlanConfig& c) {
  const libra::PlanTopology& t = c.topology;
  return std::make_tuple(c.seq_len, c.cp, c.block_size, c.head_shards, c.shape.heads_q, c.shape.heads_kv,
                         c.shape.head_dim, c.shape.dtype, c.shape.window, c.tau, c.chunks, c.chunk_split, c.mode,
                         c.dedup_per_kv_head, c.home_layout, c.kv_prefix, t.gpus_per_node, t.nodes_per_supernode,
                         t.intra_node_gbps, t.inter_node_gbps, t.inter_supernode_gbps, t.congestion_per_node);
}

// Issue 35 (F3): a tap plan's topology (what relays and bytes by tier
// follow) was outside its files and fingerprint, so a saved plan came back
// with gpus_per_node 8. Each field changed alone must change the
// fingerprint and come back from both files.
TEST(PlanFile, EveryConfigFieldChangesTheFingerprintAndSurvivesBothFiles) {
  using Edit = void (*)(PlanConfig&);
  const std::pair<const char*, Edit> edits[] = {
      {"seq_len", [](PlanConfig& c) { c.seq_len = 128; }},
      {"cp", [](PlanConfig& c) { c.cp = 4; }},
      {"block_size", [](PlanConfig& c) { c.block_size = 4; }},
      {"head_shards", [](PlanConfig& c) { c.head_shards = 2; }},
      {"heads_q", [](PlanConfig& c) { c.shape.heads_q = 16; }},
      {"heads_kv", [](PlanConfig& c) { c.shape.heads_kv = 4; }},
      {"head_dim", [](PlanConfig& c) { c.shape.head_dim = 32; }},
      {"dtype", [](PlanConfig& c) { c.shape.dtype = libra::DType::kF32; }},
      {"window", [](PlanConfig& c) { c.shape.window = 5; }},
      {"tau", [](PlanConfig& c) { c.tau = 0.05; }},
      {"chunks", [](PlanConfig& c) { c.chunks = 1; }},
      {"chunk_split", [](PlanConfig& c) { c.chunks = 3, c.shape.heads_q = 24, c.head_shards = 2,
                                          c.chunk_split = libra::ChunkSplit::kTapered; }},
      {"mode", [](PlanConfig& c) { c.mode = PlanMode::kTapSplit; }},
      {"dedup_per_kv_head", [](PlanConfig& c) { c.dedup_per_kv_head = true; }},
      {"home_layout", [](PlanConfig& c) { c.home_layout = libra::HomeLayout::kZigzag; }},
      {"kv_prefix", [](PlanConfig& c) { c.kv_prefix = true; }},
      {"gpus_per_node", [](PlanConfig& c) { c.topology.gpus_per_node = 2; }},
      {"nodes_per_supernode", [](PlanConfig& c) { c.topology.nodes_per_supernode = 2; }},
      {"intra_node_gbps", [](PlanConfig& c) { c.topology.intra_node_gbps = 100; }},
      {"inter_node_gbps", [](PlanConfig& c) { c.topology.inter_node_gbps = 10; }},
      {"inter_supernode_gbps", [](PlanConfig& c) { c.topology.inter_supernode_gbps = 1; }},
      {"congestion_per_node", [](PlanConfig& c) { c.topology.congestion_per_node = 0; }},
  };
  for (PlanMode mode : {PlanMode::kTap, PlanMode::kUlysses, PlanMode::kTapTopo}) {
    const PlanConfig base = small_config(mode);
    auto b = libra::make_plan(kPool, base);
    ASSERT_TRUE(b.ok()) << b.error().message();
    for (const auto& [name, edit] : edits) {
      PlanConfig c = base;
      edit(c);
      auto plan = libra::make_plan(kPool, c);
      if (!plan.ok()) continue;  // a field this mode does not accept alone (ulysses' windows, cuts)
      SCOPED_TRACE(std::string(libra::plan_mode_name(mode)) + " " + name);
      EXPECT_NE(plan->fingerprint(), b->fingerprint());
      for (const auto& loaded : {libra::plan_from_json(libra::plan_to_json(*plan), "p.json"),
                                 libra::plan_from_binary(libra::plan_to_binary(*plan), "p.bin")}) {
        ASSERT_TRUE(loaded.ok()) << loaded.error().message();
        EXPECT_EQ(loaded->fingerprint(), plan->fingerprint());
        EXPECT_TRUE(config_fields(loaded->config()) == config_fields(plan->config()));
      }
    }
  }
}

// The topology of a plan of another mode than tap-topo is version 5; on the
// default topology such a plan keeps its old version, words and file.
TEST(PlanFile, ATopologyOfItsOwnIsVersionFiveOtherwiseNothingChanges) {
  PlanConfig c = small_config(PlanMode::kTap);
  auto plain = libra::make_plan(kPool, c);
  ASSERT_TRUE(plain.ok());
  const nlohmann::json pj = nlohmann::json::parse(libra::plan_to_json(*plain));
  EXPECT_EQ(pj["version"], 1);
  EXPECT_FALSE(pj["config"].contains("topology"));
  c.topology.gpus_per_node = 2;
  auto topo = libra::make_plan(kPool, c);
  ASSERT_TRUE(topo.ok());
  const nlohmann::json tj = nlohmann::json::parse(libra::plan_to_json(*topo));
  EXPECT_EQ(tj["version"], 5);
  EXPECT_EQ(tj["config"]["topology"]["gpus_per_node"], 2);
  EXPECT_EQ(tj["config"]["kv_prefix"], false);
  EXPECT_EQ(tj["config"]["chunk_split"], "equal");
  // Same tiles: only tap-topo places by the topology.
  ASSERT_EQ(topo->tiles().size(), plain->tiles().size());
  for (std::size_t i = 0; i < topo->tiles().size(); ++i) EXPECT_EQ(topo->tiles()[i].worker, plain->tiles()[i].worker);
}

// Issue 35 (F11): fields of a later version in an older file, a topology
// where the version has none, and unknown topology keys loaded silently.
TEST(PlanFile, RefusesFieldsTheVersionDoesNotHave) {
  PlanConfig c = small_config(PlanMode::kTap);
  auto plan = libra::make_plan(kPool, c);
  ASSERT_TRUE(plan.ok());
  const nlohmann::json j = nlohmann::json::parse(libra::plan_to_json(*plan));
  auto expect_error = [](nlohmann::json k, const std::string& part) {
    auto r = libra::plan_from_json(k.dump(), "p.json");
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(r.error().message().find(part), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
  };
  {
    auto k = j;
    k["config"]["kv_prefix"] = false;
    expect_error(k, "p.json: config: field 'kv_prefix' belongs to format version 3 and later; the file says version 1");
  }
  {
    auto k = j;
    k["config"]["chunk_split"] = "equal";
    expect_error(k, "p.json: config: field 'chunk_split' belongs to format version 4 and later");
  }
  {
    auto k = j;
    k["config"]["topology"] = {{"gpus_per_node", 2}};
    expect_error(k, "p.json: config: field 'topology' belongs to tap-topo plans and format version 5");
  }
  c.topology.gpus_per_node = 2;
  auto topo = libra::make_plan(kPool, c);
  ASSERT_TRUE(topo.ok());
  const nlohmann::json t = nlohmann::json::parse(libra::plan_to_json(*topo));
  ASSERT_TRUE(libra::plan_from_json(t.dump(), "p.json").ok());
  {
    auto k = t;
    k["config"]["topology"]["gpus_pre_node"] = 4;
    expect_error(k, "p.json: config.topology: unknown field 'gpus_pre_node'");
  }
  {
    auto k = t;
    k["config"].erase("topology");
    expect_error(k, "p.json: config: missing field 'topology'");
  }
  {
    auto k = t;
    k["config"]["topology"]["gpus_per_node"] = 8;  // the default again: a version-1 plan
    expect_error(k, "is format version 1, the file says 5");
  }
}

RC_GTEST_PROP(PlanFile, BinaryParserNeverCrashesOnCorruptedBytes, ()) {
  static const std::string bin = [] {
    auto plan = libra::make_plan(kPool, small_config(PlanMode::kTapSplit));
    return libra::plan_to_binary(*plan);
  }();
  std::string k = bin;
  const auto flips = *rc::gen::inRange<std::size_t>(1, 4);
  for (std::size_t i = 0; i < flips; ++i) {
    const auto at = *rc::gen::inRange<std::size_t>(0, k.size());
    k[at] = static_cast<char>(*rc::gen::arbitrary<unsigned char>());
  }
  const auto cut = *rc::gen::inRange<std::size_t>(0, k.size() + 1);
  auto r = libra::plan_from_binary(k.substr(0, cut), "p.bin");
  if (r.ok()) RC_ASSERT(r->fingerprint() == libra::plan_from_binary(bin)->fingerprint());
}

}  // namespace
