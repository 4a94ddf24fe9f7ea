// Test bodies shared by the in-process GoogleTest program
// (src/exec/executor_test.cpp) and the MPI test program
// (tests/mpi/exec_mpi_test.cpp): each takes a Communicator and returns a
// Status, so the same body runs over W threads and over W MPI processes.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <cstdint>
#include <string>
#include <vector>

#include "libra/comm.hpp"
#include "exec/harness.hpp"
#include "libra/executor.hpp"
#include "libra/plan.hpp"
#include "libra/relay.hpp"
#include "libra/splitmix64.hpp"

namespace libra::exec_test {

// All-to-all-v with a different size per (sender, receiver), two
// exchanges in flight waited on out of order, allgather, barrier, split and
// gather_strings.
inline Status comm_basics(Communicator& comm) {
  const int r = comm.rank(), w = comm.size();
  // Rank a sends (a + 2 * b) % 5 int32 values a * 1000 + b * 10 + i to rank b.
  auto count = [](int a, int b) { return (a + 2 * b) % 5; };
  struct Buffers {
    std::vector<std::int32_t> send, recv;
    std::vector<std::int64_t> sc, sd, rc, rd;
  };
  auto make = [&](int salt) {
    Buffers b;
    for (int p = 0; p < w; ++p) {
      b.sd.push_back(static_cast<std::int64_t>(b.send.size()) * 4);
      for (int i = 0; i < count(r, p); ++i) b.send.push_back(salt + r * 1000 + p * 10 + i);
      b.sc.push_back(count(r, p) * 4);
      b.rd.push_back(std::accumulate(b.rc.begin(), b.rc.end(), std::int64_t{0}));
      b.rc.push_back(count(p, r) * 4);
    }
    b.recv.assign(static_cast<std::size_t>((b.rd.back() + b.rc.back()) / 4), -1);
    return b;
  };
  Buffers one = make(0), two = make(500000);
  auto spec = [](Buffers& b) {
    return AllToAllV{std::as_bytes(std::span<const std::int32_t>(b.send)), b.sc, b.sd,
                     std::as_writable_bytes(std::span<std::int32_t>(b.recv)), b.rc, b.rd};
  };
  LIBRA_ASSIGN_OR_RETURN(PendingExchange x1, comm.post(spec(one)));
  LIBRA_ASSIGN_OR_RETURN(PendingExchange x2, comm.post(spec(two)));
  LIBRA_TRY(comm.progress());
  LIBRA_TRY(comm.wait(x2));
  LIBRA_TRY(comm.wait(x1));
  for (const auto& [b, salt] : {std::pair<const Buffers*, int>{&one, 0}, {&two, 500000}}) {
    std::size_t at = 0;
    for (int p = 0; p < w; ++p) {
      for (int i = 0; i < count(p, r); ++i, ++at) {
        const std::int32_t want = salt + p * 1000 + r * 10 + i;
        if (b->recv[at] != want) {
          return internal_error(fmt::format("rank {}: element {} from rank {} is {}, expected {}", r, i, p, b->recv[at], want));
        }
      }
    }
  }
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, comm.allgather(static_cast<std::uint64_t>(r * r + 1)));
  for (int i = 0; i < w; ++i) {
    if (all[static_cast<std::size_t>(i)] != static_cast<std::uint64_t>(i * i + 1)) {
      return internal_error(fmt::format("rank {}: allgather[{}] = {}", r, i, all[static_cast<std::size_t>(i)]));
    }
  }
  LIBRA_TRY(comm.barrier());
  // Split into two colours, reversed order inside each.
  LIBRA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, comm.split(r % 2, -r));
  const int members = (w + 1 - r % 2) / 2;
  if (sub->size() != members) return internal_error(fmt::format("rank {}: split size {} != {}", r, sub->size(), members));
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> sub_all, sub->allgather(static_cast<std::uint64_t>(r)));
  for (std::size_t i = 1; i < sub_all.size(); ++i) {
    if (sub_all[i] >= sub_all[i - 1]) return internal_error(fmt::format("rank {}: split not ordered by key", r));
  }
  if (sub_all[static_cast<std::size_t>(sub->rank())] != static_cast<std::uint64_t>(r)) {
    return internal_error(fmt::format("rank {}: split rank {} does not hold this rank", r, sub->rank()));
  }
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::string> strs, gather_strings(comm, 0, std::string(static_cast<std::size_t>(r), 'x')));
  if (r == 0) {
    for (int i = 0; i < w; ++i) {
      if (strs[static_cast<std::size_t>(i)] != std::string(static_cast<std::size_t>(i), 'x')) {
        return internal_error(fmt::format("gather_strings[{}] wrong", i));
      }
    }
  }
  // agree_on_status: rank w-1 fails, every rank learns it.
  Status local = r == w - 1 ? invalid_input("deliberate") : Status();
  Status agreed = agree_on_status(comm, local, "test step");
  if (agreed.ok()) return internal_error(fmt::format("rank {}: agree_on_status missed a failure", r));
  if (r != w - 1 && agreed.message().find(std::to_string(w - 1)) == std::string::npos) {
    return internal_error(fmt::format("rank {}: agreement message does not name rank {}: {}", r, w - 1, agreed.message()));
  }
  return Status();
}

struct ExecCase {
  std::uint64_t pool_seed = 1;
  std::uint64_t data_seed = 7;
  int pool_size = 2;  // P
  int cp = 2;
  std::int64_t seq_len = 256;
  std::int64_t block = 32;
  int head_shards = 2;
  int heads_q = 4, heads_kv = 2, head_dim = 16;
  DType dtype = DType::kF32;
  std::int64_t window = kFullCausal;
  int chunks = 1;
  ChunkSplit chunk_split = ChunkSplit::kEqual;  // kTapered: narrow first and last chunks
  std::string mode = "tap";  // tap | tap-split | tap-topo | ulysses (plan) | ulysses-direct
  bool dedup_per_kv_head = false;
  HomeLayout home_layout = HomeLayout::kContiguous;
  bool kv_prefix = false;
  bool relay = false;  // ExecOptions::relay
  std::string name() const {
    return fmt::format("{} P={} CP={} L={} B={} H={} hq={} hkv={} d={} {} w={} M={} seed={}{}{}", mode, pool_size, cp,
                       seq_len, block, head_shards, heads_q, heads_kv, head_dim, dtype_name(dtype),
                       window == kFullCausal ? std::string("full") : std::to_string(window), chunks, pool_seed,
                       home_layout == HomeLayout::kContiguous ? "" : " zigzag", kv_prefix ? " kv-prefix" : "") +
           (chunk_split == ChunkSplit::kEqual ? "" : " tapered") + (relay ? " relay" : "");
  }
};

// A random packed pool: every slot gets one long-tail sample of 40-95% of
// the packed length (it spans CP ranks), then short samples; some slots end
// with padding. Deterministic in the seed (splitmix64, no std distributions).
inline std::vector<PackedSequence> random_pool(std::uint64_t seed, int slots, std::int64_t seq_len) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 12345;
  auto next = [&]() { return splitmix64_next(s); };
  auto below = [&](std::int64_t n) { return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); };
  std::vector<PackedSequence> pool(static_cast<std::size_t>(slots));
  for (auto& seq : pool) {
    std::int64_t left = seq_len - (below(3) == 0 ? below(seq_len / 8 + 1) : 0);  // sometimes padding
    const std::int64_t big = std::max<std::int64_t>(1, seq_len * (40 + below(56)) / 100);
    std::vector<std::int64_t> lens;
    lens.push_back(std::min(big, left));
    left -= lens.back();
    while (left > 0) {
      std::int64_t l = std::min(left, 1 + below(seq_len / 6));
      lens.push_back(l);
      left -= l;
    }
    // The long sample at a random position.
    std::size_t at = static_cast<std::size_t>(below(static_cast<std::int64_t>(lens.size())));
    std::swap(lens[0], lens[at]);
    seq = lens;
  }
  return pool;
}

inline PlanConfig case_config(const ExecCase& c) {
  PlanConfig cfg;
  cfg.seq_len = c.seq_len;
  cfg.cp = c.cp;
  cfg.block_size = c.block;
  cfg.head_shards = c.head_shards;
  cfg.shape.heads_q = c.heads_q;
  cfg.shape.heads_kv = c.heads_kv;
  cfg.shape.head_dim = c.head_dim;
  cfg.shape.dtype = c.dtype;
  cfg.shape.window = c.window;
  cfg.chunks = c.chunks;
  cfg.chunk_split = c.chunk_split;
  cfg.dedup_per_kv_head = c.dedup_per_kv_head;
  cfg.home_layout = c.home_layout;
  cfg.kv_prefix = c.kv_prefix;
  // Nodes of two GPUs, so tap-topo's cases have tiers to choose between.
  cfg.topology.gpus_per_node = 2;
  cfg.topology.nodes_per_supernode = 2;
  return cfg;
}

// Runs forward and backward of one case through run_check (the check
// `libra exec` runs: every home gathered on rank 0 and compared there with
// the naive double-precision reference on whole sequences); rank 0 returns
// the verdict. A world of several pools runs one case per pool.
inline Status exec_case(Communicator& comm, const ExecCase& c, TraceRecorder* trace = nullptr) {
  const int pools = comm.size() / (c.pool_size * c.cp);
  const std::vector<PackedSequence> sequences = random_pool(c.pool_seed, c.pool_size * std::max(1, pools), c.seq_len);
  CheckJob job;
  job.config = case_config(c);
  job.ulysses_direct = c.mode == "ulysses-direct";
  if (!job.ulysses_direct) {
    LIBRA_ASSIGN_OR_RETURN(job.config.mode, parse_plan_mode(c.mode));
  }
  job.sequences = sequences;
  job.pool_size = c.pool_size;
  job.seed = c.data_seed;
  job.relay = c.relay;
  job.reference = ReferenceKind::kNaive;
  job.trace = trace;
  LIBRA_ASSIGN_OR_RETURN(CheckReport report, run_check(comm, job));
  const Tolerance tol = tolerance_for(c.dtype);
  const double tols[kCheckedTensors] = {tol.o, tol.lse, tol.dq, tol.dk, tol.dv};
  for (const PoolResult& p : report.pool_results) {
    for (int i = 0; i < kCheckedTensors; ++i) {
      const ErrorStats& e = p.errors[static_cast<std::size_t>(i)];
      if (!(e.rel() <= tols[i])) {
        return internal_error(fmt::format("{}: pool {}: {} max abs error {:.3g} (relative {:.3g}) exceeds tolerance {:.1g}",
                                          c.name(), p.pool, kCheckedTensorNames[i], e.max_abs, e.rel(), tols[i]));
      }
    }
  }
  return Status();
}

// Every rank but the last plans the pool of `c`; the last plans a pool with
// one sample changed. Every rank must fail with the same mismatch error that
// names the odd rank, and nobody may hang.
inline Status mismatch_case(Communicator& comm, const ExecCase& c) {
  std::vector<PackedSequence> pool = random_pool(c.pool_seed, c.pool_size, c.seq_len);
  const int odd = comm.size() - 1;
  if (comm.rank() == odd) {
    auto& seq = pool.back();
    if (seq.size() >= 2) {
      seq[0] += 1;
      seq[1] -= 1;
      if (seq[1] == 0) seq.erase(seq.begin() + 1);
    } else {
      seq[0] -= 1;
    }
  }
  PlanConfig cfg = case_config(c);
  LIBRA_ASSIGN_OR_RETURN(cfg.mode, parse_plan_mode(c.mode == "ulysses-direct" ? "tap" : c.mode));
  LIBRA_ASSIGN_OR_RETURN(Plan plan, make_plan(pool, cfg));
  Result<std::unique_ptr<Executor>> ex = make_plan_executor(comm, plan, {});
  if (ex.ok()) return internal_error(fmt::format("rank {}: a mismatched plan was accepted", comm.rank()));
  const std::string& msg = ex.error().message();
  if (ex.error().code() != ErrorCode::kMismatch || msg.find(fmt::format("rank(s) {} hold", odd)) == std::string::npos) {
    return internal_error(fmt::format("rank {}: unexpected error for a mismatched plan: {}", comm.rank(), msg));
  }
  // Every rank holds the same text: compare a hash of it.
  const std::uint64_t h = fingerprint_of(msg);
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, comm.allgather(h));
  for (std::uint64_t x : all) {
    if (x != h) return internal_error(fmt::format("rank {}: ranks report different mismatch messages", comm.rank()));
  }
  return Status();
}

// Makes the cases of a matrix: a case of `mode` on P slots with the next
// pool seed; the rest as ExecCase's defaults.
struct CaseMaker {
  int P;
  std::uint64_t seed = 1;
  ExecCase base(const char* mode) {
    ExecCase c;
    c.mode = mode;
    c.pool_size = P;
    c.pool_seed = seed++;
    return c;
  }
};

// Every mode: GQA at M 1, 2, 4; a sliding window with MHA; H > h_kv in bf16; fp16 storage.
inline void add_mode_cases(CaseMaker& mk, const char* mode, std::vector<ExecCase>& cases) {
  for (int chunks : {1, 2, 4}) {
    ExecCase c = mk.base(mode);
    c.chunks = chunks;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_shards = 2;  // 4 query heads per tile -> M up to 4
    cases.push_back(c);
  }
  // Sliding window with MHA.
  ExecCase w = mk.base(mode);
  w.heads_q = 4;
  w.heads_kv = 4;
  w.window = 24;
  w.chunks = 2;
  cases.push_back(w);
  // H > h_kv (shards share a KV head), bf16.
  ExecCase b = mk.base(mode);
  b.heads_q = 8;
  b.heads_kv = 1;
  b.head_shards = 4;
  b.chunks = 2;
  b.dtype = DType::kBF16;
  cases.push_back(b);
  // fp16 storage, GQA, two chunks.
  ExecCase h = mk.base(mode);
  h.heads_q = 8;
  h.heads_kv = 2;
  h.chunks = mode == std::string("ulysses-direct") ? 1 : 2;
  h.dtype = DType::kF16;
  cases.push_back(h);
}

// Dedup per KV head, and the KV causal prefix: each worker receives (and
// returns dK/dV for) only the keys its tiles read; M up to 4 so that heads
// arrive in later chunks, a window, and H > h_kv with dedup per KV head.
inline void add_dedup_and_prefix_cases(CaseMaker& mk, std::vector<ExecCase>& cases) {
  ExecCase dedup = mk.base("tap");
  dedup.heads_q = 8;
  dedup.heads_kv = 2;
  dedup.head_shards = 4;
  dedup.chunks = 2;
  dedup.dedup_per_kv_head = true;
  cases.push_back(dedup);
  for (const char* mode : {"tap", "tap-topo"}) {
    for (int chunks : {1, 4}) {
      ExecCase c = mk.base(mode);
      c.chunks = chunks;
      c.heads_q = 8;
      c.heads_kv = 2;
      c.kv_prefix = true;
      cases.push_back(c);
    }
    ExecCase w = mk.base(mode);
    w.heads_q = w.heads_kv = 4;
    w.window = 24;
    w.chunks = 2;
    w.kv_prefix = true;
    cases.push_back(w);
  }
  ExecCase both = dedup;
  both.pool_seed = mk.seed++;
  both.dtype = DType::kBF16;
  both.kv_prefix = true;
  cases.push_back(both);
  // Without the dedup, shards sharing a KV head hold prefixes of different
  // lengths of the same rows in one buffer place: their dK/dV go home once.
  for (const char* mode : {"tap", "tap-topo"}) {
    ExecCase shared = dedup;
    shared.mode = mode;
    shared.pool_seed = mk.seed++;
    shared.dedup_per_kv_head = false;
    shared.kv_prefix = true;
    cases.push_back(shared);
  }
}

// Tapered chunks (first and last chunk narrower): 8 query heads a tile in
// 4 chunks (1, 3, 3, 1) and in 3 (2, 4, 2), 4 in 3 (1, 2, 1); KV heads
// whose query heads span chunks (h_kv 4), H > h_kv in bf16, the KV
// prefix, and ulysses as a plan (h_q / CP = 8 heads a tile).
inline void add_tapered_cases(CaseMaker& mk, std::vector<ExecCase>& cases) {
  for (const char* mode : {"tap", "tap-split", "tap-topo", "ulysses"}) {
    ExecCase c = mk.base(mode);
    c.heads_q = 8;
    c.heads_kv = mode == std::string("tap-split") ? 4 : 2;
    c.head_shards = 1;
    c.chunks = 4;
    c.chunk_split = ChunkSplit::kTapered;
    if (mode == std::string("ulysses")) {
      c.heads_q = 16;  // 16 / CP 2 = 8 heads a tile
      c.heads_kv = 2;
    }
    cases.push_back(c);
  }
  for (const char* mode : {"tap", "tap-topo"}) {
    ExecCase c = mk.base(mode);
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_shards = mode == std::string("tap") ? 1 : 2;
    c.chunks = 3;
    c.chunk_split = ChunkSplit::kTapered;
    c.kv_prefix = mode == std::string("tap-topo");
    cases.push_back(c);
  }
  ExecCase tapered_shared = mk.base("tap");
  tapered_shared.heads_q = 16;
  tapered_shared.heads_kv = 1;
  tapered_shared.head_shards = 2;  // H > h_kv, 8 query heads a tile
  tapered_shared.chunks = 4;
  tapered_shared.chunk_split = ChunkSplit::kTapered;
  tapered_shared.dtype = DType::kBF16;
  cases.push_back(tapered_shared);
}

// The case matrix shared by both test programs: W = 4 (P = 2, CP = 2) and
// W = 8 (P = 4, CP = 2); GQA, MHA, H > h_kv, a sliding window, bf16, and
// M in {1, 2, 4}; tap, tap-split, tap-topo, ulysses as a plan and direct Ulysses;
// tapered chunks (M 3 and 4) in every plan mode.
inline std::vector<ExecCase> case_matrix(int world) {
  std::vector<ExecCase> cases;
  CaseMaker mk{world / 2};
  for (const char* mode : {"tap", "tap-split", "tap-topo", "ulysses", "ulysses-direct"}) add_mode_cases(mk, mode, cases);
  add_dedup_and_prefix_cases(mk, cases);
  add_tapered_cases(mk, cases);
  return cases;
}

// Zigzag homes (Megatron's load-balanced CP layout) on `world` ranks: P = 2
// with CP = world / 2; every plan mode, GQA, H > h_kv, a window, bf16, M up
// to 4, dedup per KV head, tapered chunks.
inline std::vector<ExecCase> zigzag_cases(int world) {
  std::vector<ExecCase> cases;
  std::uint64_t seed = 101;
  auto base = [&](const char* mode) {
    ExecCase c;
    c.mode = mode;
    c.pool_size = 2;
    c.cp = world / 2;
    c.block = c.seq_len / (2 * c.cp) / 2;  // two blocks per chunk
    c.pool_seed = seed++;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.home_layout = HomeLayout::kZigzag;
    return c;
  };
  for (const char* mode : {"tap", "tap-split", "tap-topo", "ulysses"}) {
    for (int chunks : {1, 4}) {
      ExecCase c = base(mode);
      c.chunks = chunks;
      if (std::string(mode) == "ulysses") c.chunks = chunks == 4 ? 2 : 1;  // h_q / cp query heads per tile
      cases.push_back(c);
    }
    ExecCase w = base(mode);
    w.heads_q = w.heads_kv = 4;
    w.window = 24;
    w.chunks = std::string(mode) == "ulysses" ? 1 : 2;
    cases.push_back(w);
    ExecCase b = base(mode);
    b.heads_kv = 1;
    b.head_shards = 4;
    b.chunks = 2;
    b.dtype = DType::kBF16;
    cases.push_back(b);
  }
  ExecCase dedup = base("tap");
  dedup.head_shards = 4;
  dedup.chunks = 2;
  dedup.dedup_per_kv_head = true;
  cases.push_back(dedup);
  // A sample's causal prefix can span both of a rank's zigzag chunks.
  ExecCase prefix = base("tap");
  prefix.chunks = 4;
  prefix.kv_prefix = true;
  cases.push_back(prefix);
  // The simulator's libra-topo default: tap-topo on zigzag homes, KV prefix.
  ExecCase topo_prefix = base("tap-topo");
  topo_prefix.chunks = 2;
  topo_prefix.head_shards = 4;
  topo_prefix.kv_prefix = true;
  cases.push_back(topo_prefix);
  // Tapered chunks on zigzag homes: 8 query heads a tile in 3 chunks
  // (2, 4, 2), so KV head 1 (query heads 4-7) arrives with chunk 1.
  ExecCase tapered = base("tap");
  tapered.head_shards = 1;
  tapered.chunks = 3;
  tapered.chunk_split = ChunkSplit::kTapered;
  cases.push_back(tapered);
  // KV heads of two query heads, 8 a tile in 1, 3, 3, 1 (libra-topo's
  // default with the KV prefix): KV heads 0 and 3 are read by two chunks
  // each, where the equal cut reads each in one (executor_test.cpp,
  // tapered_cut_moves_a_kv_last_use).
  ExecCase groups = base("tap-topo");
  groups.heads_kv = 4;
  groups.head_shards = 1;
  groups.chunks = 4;
  groups.chunk_split = ChunkSplit::kTapered;
  groups.kv_prefix = true;
  cases.push_back(groups);
  return cases;
}

// Relayed inputs (ExecOptions::relay) on `world` ranks, nodes of two GPUs:
// the contract's TAP (most cross-node traffic), tap-split and tap-topo, M 1,
// 2 and 4 (stages run a chunk ahead), zigzag homes with the KV prefix, GQA
// with H > h_kv in bf16, a window, and tapered chunks (M 3 and 4).
inline std::vector<ExecCase> relay_cases(int world) {
  std::vector<ExecCase> cases;
  std::uint64_t seed = 201;
  auto base = [&](const char* mode) {
    ExecCase c;
    c.mode = mode;
    c.pool_size = world / 2;
    c.pool_seed = seed++;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.relay = true;
    return c;
  };
  // Each case takes the next pool seed whose plan relays something, so that
  // no case passes by running no relay at all.
  auto relaying = [&](ExecCase c) {
    for (int tries = 0; tries < 512; ++tries, c.pool_seed = seed++) {
      PlanConfig cfg = case_config(c);
      Result<PlanMode> mode = parse_plan_mode(c.mode);
      if (!mode.ok()) break;
      cfg.mode = *mode;
      Result<Plan> plan = make_plan(random_pool(c.pool_seed, c.pool_size, c.seq_len), cfg);
      if (plan.ok() && plan_relays(*plan).any()) break;
    }
    return c;
  };
  for (const char* mode : {"tap", "tap-split", "tap-topo"}) {
    for (int chunks : {1, 2, 4}) {
      ExecCase c = base(mode);
      c.chunks = chunks;
      cases.push_back(c);
    }
  }
  ExecCase zig = base("tap-topo");
  zig.pool_size = 2;
  zig.cp = world / 2;
  zig.block = zig.seq_len / (2 * zig.cp) / 2;
  zig.home_layout = HomeLayout::kZigzag;
  zig.kv_prefix = true;
  zig.chunks = 2;
  cases.push_back(zig);
  ExecCase b = base("tap");
  b.heads_kv = 1;
  b.head_shards = 4;
  b.chunks = 2;
  b.dtype = DType::kBF16;
  b.kv_prefix = true;
  cases.push_back(b);
  ExecCase w = base("tap");
  w.heads_q = w.heads_kv = 4;
  w.window = 24;
  w.chunks = 2;
  cases.push_back(w);
  for (ExecCase& c : cases) c = relaying(c);
  // Tapered chunks, relayed (seeds after the cases above, which keep theirs):
  // tap-topo with 8 query heads a tile in 1, 3, 3, 1, and tap in 2, 4, 2
  // (KV head 1 arrives with chunk 1).
  ExecCase tt = base("tap-topo");
  tt.head_shards = 1;
  tt.chunks = 4;
  tt.chunk_split = ChunkSplit::kTapered;
  cases.push_back(relaying(tt));
  ExecCase t3 = base("tap");
  t3.head_shards = 1;
  t3.chunks = 3;
  t3.chunk_split = ChunkSplit::kTapered;
  cases.push_back(relaying(t3));
  // KV heads of two query heads in 1, 3, 3, 1: read by two chunks where the
  // equal cut reads each in one (tapered_cut_moves_a_kv_last_use).
  ExecCase groups = base("tap-split");
  groups.heads_kv = 4;
  groups.head_shards = 1;
  groups.chunks = 4;
  groups.chunk_split = ChunkSplit::kTapered;
  cases.push_back(relaying(groups));
  return cases;
}

}  // namespace libra::exec_test
