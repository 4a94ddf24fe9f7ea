// Before/after check of the planning pipeline's outputs: every plan (its
// fingerprint, both file forms, every list and the derived exchange), every
// rank schedule and every flat program of a wide, fixed set of
// configurations is hashed and compared with hashes recorded from an
// earlier build (golden_hashes.inc). A refactoring that is meant to leave
// the outputs bitwise the same passes; one that changes any byte fails and
// names the configuration and the stage (plan, exchange, schedule, program).
//
// A deliberate change of the outputs (a new plan format, say) records the
// table again, in a commit of its own that says why:
//   LIBRA_GOLDEN_RECORD=$PWD/src/schedule/golden_hashes.inc build/release/src/schedule/libra_schedule_tests
//     --gtest_filter='GoldenHashes.*'
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "exec/exec_test_bodies.hpp"
#include "libra/corpus.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"
#include "libra/program.hpp"
#include "libra/relay.hpp"
#include "libra/schedule.hpp"
#include "libra/splitmix64.hpp"

namespace libra {
namespace {

using exec_test::ExecCase;

struct Golden {
  const char* name;
  std::uint64_t plan, exchange, schedule, program;
};

const std::vector<Golden> kGolden = {
#include "schedule/golden_hashes.inc"
};

// A running hash of 64-bit words (each value fed explicitly, never a
// struct's bytes, so padding cannot enter).
class Hash {
 public:
  Hash& add(std::uint64_t v) {
    h_ = splitmix64_mix(h_ ^ (v + kSplitmix64Gamma + (h_ << 6) + (h_ >> 2)));
    return *this;
  }
  Hash& add(std::int64_t v) { return add(static_cast<std::uint64_t>(v)); }
  Hash& add(int v) { return add(static_cast<std::uint64_t>(static_cast<std::int64_t>(v))); }
  Hash& add(bool v) { return add(std::uint64_t{v ? 1U : 0U}); }
  Hash& add(double v) { return add(std::bit_cast<std::uint64_t>(v)); }
  Hash& add(std::string_view s) {
    add(static_cast<std::uint64_t>(s.size()));
    std::uint64_t w = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      w = (w << 8) | static_cast<unsigned char>(s[i]);
      if (i % 8 == 7) add(std::exchange(w, 0));
    }
    return add(w);
  }
  template <typename T>
  Hash& all(const std::vector<T>& v) {
    add(static_cast<std::uint64_t>(v.size()));
    for (const T& x : v) add(x);
    return *this;
  }
  std::uint64_t value() const { return h_; }

 private:
  std::uint64_t h_ = 0x6c69627261ULL;  // "libra"
};

void hash_range(Hash& h, HeadRange r) { h.add(r.begin).add(r.end); }

void hash_transfer(Hash& h, const Transfer& x) {
  h.add(static_cast<int>(x.kind)).add(x.src).add(x.dst).add(x.slot).add(x.begin).add(x.end);
  hash_range(h, x.heads);
  h.add(x.tile).add(x.group).add(x.bytes).add(x.first_use).add(x.last_use);
}

// The plan's defining content, its files and the lists make_plan builds.
std::uint64_t plan_hash(const Plan& p) {
  Hash h;
  h.add(p.fingerprint()).add(plan_to_binary(p)).add(plan_to_json(p));
  for (const Tile& t : p.tiles()) {
    h.add(t.id).add(t.slot).add(t.block).add(t.shard).add(t.piece).add(t.begin).add(t.end);
    hash_range(h, t.heads);
    hash_range(h, t.kv_heads);
    h.add(t.flops).add(t.home).add(t.worker).add(t.fragment_begin).add(t.fragment_end);
  }
  for (const Fragment& f : p.fragments()) {
    h.add(f.tile).add(f.slot).add(f.sample).add(f.group).add(f.sample_start).add(f.sample_length).add(f.a).add(f.e);
    h.add(f.key_begin);
  }
  for (const KvGroup& g : p.groups()) {
    h.add(g.slot).add(g.sample).add(g.key).add(g.begin).add(g.end);
    hash_range(h, g.kv_heads);
  }
  for (int r = 0; r < p.num_workers(); ++r) {
    for (std::int32_t t : p.worker_tiles(r)) h.add(t);
    h.add(-1);
    for (std::int32_t g : p.worker_groups(r)) h.add(g);
    h.add(-2);
  }
  for (std::int64_t f : p.worker_flops()) h.add(f);
  return h.add(p.imbalance()).add(p.head_width()).value();
}

// The exchange, derived on first use: transfers, chunk lists, byte counts,
// KV uses and spans, bytes by tier, relays.
std::uint64_t exchange_hash(const Plan& p) {
  Hash h;
  const int W = p.num_workers(), M = p.config().chunks;
  h.add(p.comm_bytes()).add(p.busiest_receiver()).add(p.max_recv_cross_node());
  for (std::int64_t b : p.byte_matrix()) h.add(b);
  for (const TierBytes& t : p.tier_bytes()) {
    h.add(t.kept).add(t.send_intra_node).add(t.send_cross_node).add(t.send_cross_supernode);
    h.add(t.recv_intra_node).add(t.recv_cross_node).add(t.recv_cross_supernode);
  }
  for (const Transfer& x : p.all_transfers()) hash_transfer(h, x);
  for (int src = 0; src < W; ++src) {
    h.add(p.send_bytes(src)).add(p.recv_bytes(src));
    for (int dst = 0; dst < W; ++dst) {
      for (const Transfer& x : p.transfers(src, dst)) hash_transfer(h, x);
      for (int m = 0; m < M; ++m) {
        h.add(p.chunk_bytes(m, src, dst));
        for (const Transfer& x : p.chunk_transfers(m, src, dst)) hash_transfer(h, x);
      }
    }
  }
  for (int r = 0; r < W; ++r) {
    for (std::int32_t gid : p.worker_groups(r)) {
      const KvGroup& g = p.groups()[static_cast<std::size_t>(gid)];
      const TokenSpan s = p.kv_span(r, gid);
      h.add(s.begin).add(s.end);
      for (std::int32_t k = g.kv_heads.begin; k < g.kv_heads.end; ++k) {
        const ChunkUse u = p.kv_use(r, gid, k);
        h.add(u.first).add(u.last);
      }
    }
  }
  for (const Tile& t : p.tiles()) {
    for (int m = 0; m < M; ++m) {
      hash_range(h, p.chunk_heads(t, m));
      hash_range(h, p.chunk_kv_heads(t.heads, t.kv_heads, m));
    }
  }
  const RelayTable relays = plan_relays(p);
  h.add(relays.relayed_pairs()).all(relays.busiest_nic_direct).all(relays.busiest_nic_relayed);
  for (int m = 0; m < M; ++m)
    for (int src = 0; src < W; ++src)
      for (int dst = 0; dst < W; ++dst) h.add(relays.via(m, src, dst));
  return h.value();
}

void hash_strided(Hash& h, const Strided& s) { h.add(s.offset).add(s.rows).add(s.run).add(s.stride); }

void hash_exchange(Hash& h, const Exchange& x) {
  for (const auto* lists : {&x.send, &x.recv}) {
    h.add(static_cast<std::uint64_t>(lists->size()));
    for (const std::vector<Segment>& list : *lists) {
      h.add(static_cast<std::uint64_t>(list.size()));
      for (const Segment& s : list) {
        h.add(static_cast<int>(s.field)).add(s.add).add(s.slot).add(s.t0).add(s.t1).add(s.h0).add(s.h1).add(s.stage);
        hash_strided(h, s.at);
      }
    }
  }
  h.all(x.send_bytes).all(x.recv_bytes).all(x.send_displs).all(x.recv_displs);
  h.add(x.total_send_bytes).add(x.total_recv_bytes);
}

void hash_runs(Hash& h, const std::vector<RowRun>& runs) {
  h.add(static_cast<std::uint64_t>(runs.size()));
  for (const RowRun& r : runs) h.add(r.begin).add(r.end).add(r.at);
}

std::uint64_t schedule_hash(const RankSchedule& s) {
  Hash h;
  h.add(s.worker).add(s.workers).add(s.cp).add(s.chunks).add(s.heads_q).add(s.heads_kv).add(s.head_dim);
  h.add(static_cast<int>(s.dtype)).add(s.window).add(s.slot).add(s.home_row0).add(s.home_rows).add(s.home_tokens);
  h.add(s.packed_row(0)).add(s.fingerprint).add(s.what).add(s.relayed);
  for (const Region& r : s.regions) {
    h.add(r.slot);
    hash_range(h, r.q_heads);
    hash_range(h, r.kv_heads);
    hash_runs(h, r.q_rows);
    hash_runs(h, r.kv_rows);
    h.add(r.q_row_count).add(r.kv_row_count).add(r.q_offset).add(r.kv_offset);
  }
  h.add(s.compute_q_vectors).add(s.compute_kv_vectors).add(s.stage_q_vectors).add(s.stage_kv_vectors);
  for (const auto& per_phase : s.exchanges) {
    h.add(static_cast<std::uint64_t>(per_phase.size()));
    for (const Exchange& x : per_phase) hash_exchange(h, x);
  }
  for (const auto& per_pass : s.stage_exchanges) {
    h.add(static_cast<std::uint64_t>(per_pass.size()));
    for (const Exchange& x : per_pass) hash_exchange(h, x);
  }
  for (const auto& per_pass : s.kernel_calls) {
    h.add(static_cast<std::uint64_t>(per_pass.size()));
    for (const auto& calls : per_pass) {
      h.add(static_cast<std::uint64_t>(calls.size()));
      for (const KernelCall& c : calls) {
        h.add(c.region).add(c.h0).add(c.h1).add(c.k0).add(c.k1).add(c.fragment_begin).add(c.fragment_end);
        h.add(c.q_home).add(c.kv_home);
        hash_strided(h, c.q);
        hash_strided(h, c.kv);
      }
    }
  }
  for (const CallFragment& f : s.fragments) h.add(f.q_row).add(f.kv_row).add(f.sample_len).add(f.a).add(f.e);
  for (const auto& [peer, chunk] : s.apply_order) h.add(peer).add(chunk);
  return h.value();
}

void hash_moves(Hash& h, const std::vector<Move>& moves) {
  h.add(static_cast<std::uint64_t>(moves.size()));
  for (const Move& m : moves) {
    h.add(static_cast<int>(m.field)).add(static_cast<int>(m.src)).add(static_cast<int>(m.dst)).add(m.add);
    h.add(m.peer).add(m.chunk).add(m.rows).add(m.run).add(m.src_offset).add(m.src_stride).add(m.dst_offset);
    h.add(m.dst_stride).add(m.wire_byte);
  }
}

void hash_exchange_program(Hash& h, const ExchangeProgram& x) {
  for (const auto& v : x.send_vectors) h.all(v);
  for (const auto& v : x.recv_vectors) h.all(v);
  h.all(x.send_bytes).all(x.send_displs).all(x.recv_bytes).all(x.recv_displs);
  h.add(x.total_send_bytes).add(x.total_recv_bytes);
  hash_moves(h, x.gather);
  hash_moves(h, x.local);
  hash_moves(h, x.scatter);
}

std::uint64_t program_hash(const RankProgram& p) {
  Hash h;
  h.add(p.worker).add(p.workers).add(p.chunks).add(p.rank).all(p.order);
  for (std::int64_t b : p.class_vector_bytes) h.add(b);
  for (const PassProgram& pass : p.passes) {
    h.add(static_cast<int>(pass.in_phase)).add(static_cast<int>(pass.out_phase));
    for (const auto* list : {&pass.in, &pass.out, &pass.stage}) {
      h.add(static_cast<std::uint64_t>(list->size()));
      for (const ExchangeProgram& x : *list) hash_exchange_program(h, x);
    }
    hash_moves(h, pass.apply);
  }
  return h.value();
}

// ---- the configurations -----------------------------------------------------

// One configuration: a case of the executor tests' shape (pool, config,
// mode) plus the nodes of its topology.
struct Config {
  ExecCase c;
  int gpus_per_node = 2;
  std::string name() const { return fmt::format("{} gpn={}", c.name(), gpus_per_node); }
};

PlanConfig plan_config_of(const Config& g) {
  PlanConfig cfg = exec_test::case_config(g.c);
  cfg.topology.gpus_per_node = g.gpus_per_node;
  return cfg;
}

// A configuration drawn from every option the planners and the schedule
// take: modes, pools, CP, lengths, blocks, GQA shapes, chunks and their
// cut, windows, element types, layouts, KV prefixes, dedup, relays, node
// sizes. Not every draw is valid; the caller keeps the valid ones.
Config draw_config(std::uint64_t& state) {
  auto pick = [&](std::uint64_t n) { return static_cast<int>(splitmix64_next(state) % n); };
  Config g;
  ExecCase& c = g.c;
  static const char* kModes[] = {"tap", "tap", "tap-split", "tap-topo", "tap-topo", "ulysses", "ulysses-direct"};
  c.mode = kModes[pick(7)];
  static const int kPools[][2] = {{1, 2}, {2, 2}, {4, 2}, {2, 4}, {3, 2}, {1, 4}, {2, 3}, {3, 4}};
  const auto& pc = kPools[pick(8)];
  c.pool_size = pc[0];
  c.cp = pc[1];
  static const std::int64_t kLengths[] = {96, 192, 256, 384};
  c.seq_len = kLengths[pick(4)];
  c.home_layout = pick(4) == 0 ? HomeLayout::kZigzag : HomeLayout::kContiguous;
  const std::int64_t per_rank = c.seq_len / c.cp;
  static const int kCuts[] = {1, 2, 4, 3};
  c.block = std::max<std::int64_t>(1, per_rank / kCuts[pick(c.home_layout == HomeLayout::kZigzag ? 3 : 4)] /
                                          (c.home_layout == HomeLayout::kZigzag ? 2 : 1));
  static const int kShapes[][4] = {{4, 2, 2, 16}, {8, 2, 4, 8}, {4, 4, 2, 8}, {8, 1, 4, 8},
                                   {8, 4, 8, 8},  {4, 2, 1, 16}, {8, 2, 1, 8}, {12, 4, 3, 8}};
  const auto& sh = kShapes[pick(8)];
  c.heads_q = sh[0];
  c.heads_kv = sh[1];
  c.head_shards = sh[2];
  c.head_dim = sh[3];
  static const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  c.dtype = kTypes[pick(3)];
  static const std::int64_t kWindows[] = {kFullCausal, kFullCausal, 24, 7};
  c.window = kWindows[pick(4)];
  if (pick(3) == 0) {
    c.chunk_split = ChunkSplit::kTapered;
    c.chunks = 3 + pick(2);
  } else {
    static const int kChunks[] = {1, 2, 4, 2};
    c.chunks = kChunks[pick(4)];
  }
  c.dedup_per_kv_head = pick(3) == 0;
  c.kv_prefix = pick(3) == 0;
  c.relay = pick(2) == 0;
  g.gpus_per_node = pick(3) == 0 ? 4 : 2;
  c.pool_seed = splitmix64_next(state) % 1000;
  return g;
}

bool valid(const Config& g) {
  if (g.c.mode == "ulysses-direct") {
    if (g.c.chunks != 1 || g.c.home_layout != HomeLayout::kContiguous) return false;
    return g.c.heads_q % g.c.cp == 0 && (g.c.heads_kv % g.c.cp == 0 || g.c.cp % g.c.heads_kv == 0);
  }
  PlanConfig cfg = plan_config_of(g);
  Result<PlanMode> mode = parse_plan_mode(g.c.mode);
  if (!mode.ok()) return false;
  cfg.mode = *mode;
  return validate_plan_config(cfg).ok();
}

constexpr int kDrawnConfigs = 160;

std::vector<Config> configs() {
  std::vector<Config> out;
  std::uint64_t state = 38;
  for (int tries = 0; static_cast<int>(out.size()) < kDrawnConfigs && tries < 100000; ++tries) {
    Config g = draw_config(state);
    if (valid(g)) out.push_back(g);
  }
  return out;
}

// Every schedule option: in place or through compute buffers, with relays or without.
constexpr ScheduleOptions kOptions[] = {{true, false}, {false, false}, {true, true}, {false, true}};

struct Hashes {
  std::uint64_t plan = 0, exchange = 0, schedule = 0, program = 0;
};

// The schedules (and programs) of every worker in `workers` under every
// option; the program also on a communicator with the ranks reversed.
template <typename MakeSchedule>
void hash_schedules(Hashes& out, int W, const std::vector<int>& workers, MakeSchedule&& make) {
  Hash sh, ph;
  std::vector<int> reversed;
  for (int g = W - 1; g >= 0; --g) reversed.push_back(g);
  for (const ScheduleOptions& o : kOptions) {
    for (int w : workers) {
      Result<RankSchedule> s = make(w, o);
      if (!s.ok()) {
        sh.add(s.error().message());
        continue;
      }
      ASSERT_TRUE(validate_schedule(*s).ok()) << validate_schedule(*s).message();
      sh.add(schedule_hash(*s));
      for (std::span<const int> order : {std::span<const int>(), std::span<const int>(reversed)}) {
        Result<RankProgram> p = make_rank_program(*s, order);
        ph.add(p.ok() ? program_hash(*p) : Hash().add(p.error().message()).value());
      }
    }
  }
  out.schedule = sh.value();
  out.program = ph.value();
}

std::vector<int> all_workers(int W) {
  std::vector<int> w(static_cast<std::size_t>(W));
  for (int i = 0; i < W; ++i) w[static_cast<std::size_t>(i)] = i;
  return w;
}

Hashes hash_plan_and_schedules(const std::vector<PackedSequence>& pool, const PlanConfig& cfg,
                               const std::vector<int>& workers) {
  Hashes out;
  Result<Plan> plan = make_plan(pool, cfg);
  if (!plan.ok()) {
    out.plan = Hash().add(plan.error().message()).value();
    return out;
  }
  out.plan = plan_hash(*plan);
  out.exchange = exchange_hash(*plan);
  hash_schedules(out, plan->num_workers(), workers,
                 [&](int w, const ScheduleOptions& o) { return make_rank_schedule(*plan, w, o); });
  return out;
}

Hashes hash_config(const Config& g) {
  const std::vector<PackedSequence> pool = exec_test::random_pool(g.c.pool_seed, g.c.pool_size, g.c.seq_len);
  PlanConfig cfg = plan_config_of(g);
  const int W = g.c.pool_size * g.c.cp;
  if (g.c.mode == "ulysses-direct") {
    Hashes out;
    hash_schedules(out, W, all_workers(W),
                   [&](int w, const ScheduleOptions& o) { return make_ulysses_schedule(pool, cfg, w, o); });
    return out;
  }
  cfg.mode = *parse_plan_mode(g.c.mode);
  return hash_plan_and_schedules(pool, cfg, all_workers(W));
}

// The paper's shape (docs/tiles.md) at packed length L: CP 8, blocks of
// 8192 rows, 8 head shards, h_q 32, h_kv 4, d 128, bf16, 4 chunks.
PlanConfig paper_config(std::int64_t L) {
  PlanConfig c;
  c.seq_len = L;
  c.cp = 8;
  c.block_size = 8192;
  c.head_shards = 8;
  c.shape = {.heads_q = 32, .heads_kv = 4, .head_dim = 128, .dtype = DType::kBF16};
  c.chunks = 4;
  return c;
}

// Paper-shaped pools: a window of the built-in 256K corpus placed by VRSP
// (and its elastic and refining variants), its heaviest and lightest pools
// planned at 256K tokens with every mode, schedules of a few workers.
struct LargeCase {
  std::string name;
  Hashes hashes;
};

std::uint64_t placement_hash(const WindowPlacement& w) {
  Hash h;
  for (const auto& pool : w.pools) {
    for (std::int32_t i : pool) h.add(i);
    h.add(-1);
  }
  for (const auto& d : w.domains) {
    for (std::int32_t i : d) h.add(i);
    h.add(-1);
  }
  return h.all(w.loads).add(w.imbalance).add(w.pool_imbalance).value();
}

std::vector<LargeCase> large_cases() {
  std::vector<LargeCase> out;
  constexpr std::int64_t L = 262'144;
  Result<std::vector<PackedSequence>> seqs = load_packed_sequences("builtin:paper-256k", L);
  if (!seqs.ok()) {
    ADD_FAILURE() << seqs.error().message();
    return out;
  }
  constexpr std::int64_t P = 4, D = 16;
  const std::vector<PackedSequence> window(seqs->begin(), seqs->begin() + D);
  const std::vector<std::int64_t> f = *sequence_workloads(window);
  std::vector<std::vector<std::int32_t>> planned_pools;
  for (const char* mode : {"vrsp", "vrsp-refine", "vrsp-elastic", "zigzag", "sampler"}) {
    PlacementOptions o;
    o.pool_size = P;
    o.mode = *parse_placement_mode(mode);
    o.dp = 8;
    Result<WindowPlacement> w = place_window(f, o);
    LargeCase lc{fmt::format("place {} D={} P={} dp=8", mode, D, P), {}};
    lc.hashes.plan = w.ok() ? placement_hash(*w) : Hash().add(w.error().message()).value();
    out.push_back(lc);
    if (std::string_view(mode) == "vrsp" && w.ok()) planned_pools = {w->pools.front(), w->pools.back()};
  }
  PlanConfig base = paper_config(L);
  for (std::size_t k = 0; k < planned_pools.size(); ++k) {
    std::vector<PackedSequence> pool;
    for (std::int32_t i : planned_pools[k]) pool.push_back(window[static_cast<std::size_t>(i)]);
    for (const char* mode : {"tap", "tap-split", "tap-topo", "ulysses"}) {
      PlanConfig cfg = base;
      cfg.mode = *parse_plan_mode(mode);
      cfg.kv_prefix = k == 1;
      cfg.chunk_split = k == 1 ? ChunkSplit::kTapered : ChunkSplit::kEqual;
      const int W = static_cast<int>(pool.size()) * cfg.cp;
      out.push_back({fmt::format("vrsp pool {} {} L={} M={}{}", k, mode, L, cfg.chunks, k == 1 ? " kv-prefix tapered" : ""),
                     hash_plan_and_schedules(pool, cfg, {0, W / 2 + 3, W - 1})});
    }
  }
  return out;
}

struct Named {
  std::string name;
  Hashes hashes;
};

std::vector<Named> every_hash() {
  std::vector<Named> out;
  for (const Config& g : configs()) out.push_back({g.name(), hash_config(g)});
  for (LargeCase& lc : large_cases()) out.push_back({std::move(lc.name), lc.hashes});
  return out;
}

std::string golden_table(const std::vector<Named>& all) {
  std::string text = "// Recorded by golden_test.cpp (LIBRA_GOLDEN_RECORD); {name, plan, exchange, schedule, program}.\n";
  for (const Named& n : all) {
    text += fmt::format("{{\"{}\", {:#018x}ULL, {:#018x}ULL, {:#018x}ULL, {:#018x}ULL}},\n", n.name, n.hashes.plan,
                        n.hashes.exchange, n.hashes.schedule, n.hashes.program);
  }
  return text;
}

TEST(GoldenHashes, PlansSchedulesAndProgramsAsRecorded) {
  const std::vector<Named> all = every_hash();
  ASSERT_GE(all.size(), std::size_t{kDrawnConfigs});
  if (const char* path = std::getenv("LIBRA_GOLDEN_RECORD")) {
    std::ofstream(path) << golden_table(all);
    GTEST_SKIP() << "recorded " << all.size() << " configurations in " << path;
  }
  ASSERT_EQ(all.size(), kGolden.size()) << "the configuration list changed; record the table again";
  int mismatches = 0;
  for (std::size_t i = 0; i < all.size() && mismatches < 10; ++i) {
    const Golden& want = kGolden[i];
    const Named& got = all[i];
    ASSERT_EQ(got.name, want.name) << "configuration " << i;
    const std::pair<const char*, std::pair<std::uint64_t, std::uint64_t>> stages[] = {
        {"plan", {got.hashes.plan, want.plan}},
        {"exchange", {got.hashes.exchange, want.exchange}},
        {"schedule", {got.hashes.schedule, want.schedule}},
        {"program", {got.hashes.program, want.program}}};
    for (const auto& [stage, v] : stages) {
      if (v.first == v.second) continue;
      ADD_FAILURE() << got.name << ": the " << stage << " hash changed";
      ++mismatches;
    }
  }
}

// The drawn configurations reach every mode and option the table is meant
// to cover (so a change to the draw cannot quietly narrow it).
TEST(GoldenHashes, ConfigurationsCoverEveryOption) {
  std::set<std::string> seen;
  for (const Config& g : configs()) {
    const ExecCase& c = g.c;
    seen.insert(c.mode);
    if (c.home_layout == HomeLayout::kZigzag) seen.insert("zigzag");
    if (c.kv_prefix) seen.insert("kv-prefix");
    if (c.dedup_per_kv_head) seen.insert("dedup");
    if (c.relay) seen.insert("relay");
    if (c.chunk_split == ChunkSplit::kTapered) seen.insert(fmt::format("tapered {}", c.chunks));
    if (c.window != kFullCausal) seen.insert("window");
    if (c.chunks == 4 && c.chunk_split == ChunkSplit::kEqual) seen.insert("M=4");
    if (c.pool_size * c.cp >= 8) seen.insert("W>=8");
    if (c.head_shards > c.heads_kv) seen.insert("H>hkv");
    seen.insert(dtype_name(c.dtype));
  }
  for (const char* want : {"tap", "tap-split", "tap-topo", "ulysses", "ulysses-direct", "zigzag", "kv-prefix", "dedup",
                           "relay", "tapered 3", "tapered 4", "window", "M=4", "W>=8", "H>hkv", "fp32", "bf16", "fp16"}) {
    EXPECT_TRUE(seen.contains(want)) << want;
  }
}

}  // namespace
}  // namespace libra
