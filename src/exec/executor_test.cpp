#include "libra/executor.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "exec/exec_test_bodies.hpp"
#include "libra/io.hpp"

namespace libra {
namespace {

using exec_test::ExecCase;

void expect_all_ok(const std::vector<Status>& st, const std::string& what) {
  for (std::size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << what << ": rank " << r << ": " << st[r].message();
}

TEST(PlanExecutor, MatchesTheReferenceOnFourRanksInProcess) {
  for (const ExecCase& c : exec_test::case_matrix(4)) {
    expect_all_ok(run_in_process(4, [&](Communicator& comm) { return exec_test::exec_case(comm, c); }), c.name());
  }
}

TEST(PlanExecutor, MatchesTheReferenceOnEightRanksInProcess) {
  for (const ExecCase& c : exec_test::case_matrix(8)) {
    expect_all_ok(run_in_process(8, [&](Communicator& comm) { return exec_test::exec_case(comm, c); }), c.name());
  }
}

TEST(PlanExecutor, ZigzagHomesMatchTheReferenceOnFourAndEightRanks) {
  for (int world : {4, 8}) {
    for (const ExecCase& c : exec_test::zigzag_cases(world)) {
      expect_all_ok(run_in_process(world, [&](Communicator& comm) { return exec_test::exec_case(comm, c); }), c.name());
    }
  }
}

TEST(PlanExecutor, RelayedInputsMatchTheReferenceOnFourAndEightRanks) {
  for (int world : {4, 8}) {
    for (const ExecCase& c : exec_test::relay_cases(world)) {
      expect_all_ok(run_in_process(world, [&](Communicator& comm) { return exec_test::exec_case(comm, c); }), c.name());
    }
  }
}

// One rank asked to relay and the others not would run different exchanges:
// the schedule fingerprint stops every rank with one mismatch error instead.
TEST(PlanExecutor, RanksThatDisagreeOnRelayingStopWithAMismatch) {
  ExecCase c = exec_test::relay_cases(4).front();
  auto pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  Result<Plan> plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  auto st = run_in_process(4, [&](Communicator& comm) {
    ExecOptions o;
    o.relay = comm.rank() != 3;
    return make_plan_executor(comm, *plan, o).status();
  });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kMismatch) << s.message();
  }
}

TEST(UlyssesExecutor, RefusesZigzagHomesOnEveryRank) {
  ExecCase c = exec_test::zigzag_cases(4).front();
  c.mode = "ulysses-direct";
  const std::vector<Status> st = run_in_process(4, [&](Communicator& comm) { return exec_test::exec_case(comm, c); });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("home layout zigzag is not supported by the direct Ulysses schedule"), std::string::npos)
        << s.message();
  }
}

TEST(PlanExecutor, MismatchedPlanStopsEveryRankWithOneError) {
  ExecCase c;
  for (int w : {4, 8}) {
    c.pool_size = w / 2;
    expect_all_ok(run_in_process(w, [&](Communicator& comm) { return exec_test::mismatch_case(comm, c); }),
                  "mismatch");
  }
}

TEST(PlanExecutor, RejectsAPoolCommunicatorOfTheWrongSize) {
  ExecCase c;
  auto pool = exec_test::random_pool(3, 2, c.seq_len);
  Result<Plan> plan = make_plan(pool, exec_test::case_config(c));
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  auto st = run_in_process(3, [&](Communicator& comm) { return make_plan_executor(comm, *plan, {}).status(); });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("has 3 ranks but the plan has 4 workers"), std::string::npos) << s.message();
  }
}

// One rank holding a valid plan for another pool size used to return its
// size error alone, leaving the others in the fingerprint collective until
// the timeout ("no data from rank 3"); now every rank gets the size error.
TEST(PlanExecutor, OneRankWithAPlanForAnotherPoolSizeFailsEveryRankAtOnce) {
  ExecCase c;
  auto pool4 = exec_test::random_pool(3, 2, c.seq_len);  // P 2 x CP 2 = 4 workers
  auto pool2 = exec_test::random_pool(3, 1, c.seq_len);  // P 1 x CP 2 = 2 workers
  Result<Plan> plan4 = make_plan(pool4, exec_test::case_config(c));
  Result<Plan> plan2 = make_plan(pool2, exec_test::case_config(c));
  ASSERT_TRUE(plan4.ok() && plan2.ok());
  auto st = run_in_process(
      4, [&](Communicator& comm) { return make_plan_executor(comm, comm.rank() == 3 ? *plan2 : *plan4, {}).status(); },
      30000);
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("has 4 ranks but the plan has 2 workers"), std::string::npos) << s.message();
  }
}

TEST(PlanExecutor, RejectsInputsOfTheWrongSizeOnEveryRank) {
  ExecCase c;
  auto pool = exec_test::random_pool(3, 2, c.seq_len);
  Result<Plan> plan = make_plan(pool, exec_test::case_config(c));
  ASSERT_TRUE(plan.ok());
  auto st = run_in_process(4, [&](Communicator& comm) -> Status {
    LIBRA_ASSIGN_OR_RETURN(auto ex, make_plan_executor(comm, *plan, {}));
    const PlanConfig cfg = exec_test::case_config(c);
    auto q = harness_home_tensor(1, cfg, comm.rank(), 0), k = harness_home_tensor(1, cfg, comm.rank(), 1);
    if (comm.rank() == 2) q.pop_back();
    return ex->forward({q, k, k}).status();
  });
  for (std::size_t r = 0; r < st.size(); ++r) {
    ASSERT_FALSE(st[r].ok());
    // Every rank holds rank 2's message, naming rank 2.
    EXPECT_NE(st[r].message().find("q has"), std::string::npos) << st[r].message();
    EXPECT_NE(st[r].message().find("(rank(s) 2 of 4)"), std::string::npos) << st[r].message();
  }
}

TEST(PlanExecutor, TraceShowsEachChunkDispatchedBeforeThePreviousComputes) {
  ExecCase c;
  c.chunks = 4;
  c.heads_q = 8;
  c.head_shards = 2;
  std::vector<TraceRecorder> traces(4);
  auto st = run_in_process(4, [&](Communicator& comm) -> Status {
    TraceRecorder& tr = traces[static_cast<std::size_t>(comm.rank())];
    LIBRA_TRY(exec_test::exec_case(comm, c, &tr));
    return write_trace(comm, tr, testing::TempDir() + "/libra_exec_trace.json");
  });
  expect_all_ok(st, "trace");
  for (const TraceRecorder& tr : traces) {
    auto ev = tr.events();
    auto find = [&](const std::string& name) -> const TraceRecorder::Event* {
      for (const auto& e : ev)
        if (e.name == name) return &e;
      return nullptr;
    };
    for (const char* pass : {"fwd", "bwd"}) {
      for (int m = 0; m < 4; ++m) {
        const auto* comp = find(fmt::format("{} compute chunk {}", pass, m));
        ASSERT_NE(comp, nullptr) << pass << " chunk " << m;
        if (m + 1 < 4) {
          // Chunk m+1's input (when this rank has remote input) is posted
          // before chunk m computes.
          if (const auto* in = find(fmt::format("{} input chunk {}", pass, m + 1))) {
            EXPECT_LE(in->begin_us, comp->begin_us);
          }
        }
      }
    }
  }
  // The file is valid Chrome trace JSON with events from every rank.
  auto text = read_file(testing::TempDir() + "/libra_exec_trace.json");
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  std::set<int> pids;
  for (const auto& e : j["traceEvents"]) pids.insert(e["pid"].template get<int>());
  EXPECT_EQ(pids.size(), 4u);
}

// Runs forward and backward of `plan` on 4 in-process ranks; returns each
// rank's outputs concatenated.
std::vector<std::vector<float>> run_plan(const Plan& plan, const PlanConfig& cfg) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(plan.num_workers()));
  auto st = run_in_process(plan.num_workers(), [&](Communicator& comm) -> Status {
    LIBRA_ASSIGN_OR_RETURN(auto ex, make_plan_executor(comm, plan, {}));
    const int r = comm.rank();
    auto q = harness_home_tensor(3, cfg, r, 0), k = harness_home_tensor(3, cfg, r, 1), v = harness_home_tensor(3, cfg, r, 2),
         d_o = harness_home_tensor(3, cfg, r, 3);
    LIBRA_ASSIGN_OR_RETURN(ForwardOutputs f, ex->forward({q, k, v}));
    LIBRA_ASSIGN_OR_RETURN(BackwardOutputs g, ex->backward({q, k, v}, f, d_o));
    auto& o = out[static_cast<std::size_t>(r)];
    for (const auto* t : {&f.o, &f.lse, &g.dq, &g.dk, &g.dv}) o.insert(o.end(), t->begin(), t->end());
    return Status();
  });
  expect_all_ok(st, "run_plan");
  return out;
}

// The caller-owned forms write every element: outputs filled with NaN
// beforehand come back equal, bit for bit, to the allocating forms', and
// padding rows are 0 (the second slot ends with 86 rows of padding on its
// last CP rank). The same holds with nothing read in place.
TEST(PlanExecutor, CallerOwnedOutputsNeedNoInitialisation) {
  ExecCase c;
  c.chunks = 2;
  const std::vector<PackedSequence> pool = {{200, 30, 26}, {120, 40, 10}};
  const PlanConfig cfg = exec_test::case_config(c);
  Result<Plan> plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok());
  const auto direct = run_plan(*plan, cfg);
  for (bool in_place : {true, false}) {
    std::vector<std::vector<float>> into(static_cast<std::size_t>(plan->num_workers()));
    auto st = run_in_process(plan->num_workers(), [&](Communicator& comm) -> Status {
      const int r = comm.rank();
      LIBRA_ASSIGN_OR_RETURN(RankSchedule s, make_rank_schedule(*plan, r, {.read_home_in_place = in_place}));
      LIBRA_ASSIGN_OR_RETURN(auto ex, make_schedule_executor(comm, std::move(s), {}));
      auto q = harness_home_tensor(3, cfg, r, 0), k = harness_home_tensor(3, cfg, r, 1),
           v = harness_home_tensor(3, cfg, r, 2), d_o = harness_home_tensor(3, cfg, r, 3);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> o(ex->q_elements(), nan), lse(ex->lse_elements(), nan), dq(ex->q_elements(), nan),
          dk(ex->kv_elements(), nan), dv(ex->kv_elements(), nan);
      LIBRA_TRY(ex->forward_into({q, k, v}, {o, lse}));
      LIBRA_TRY(ex->backward_into({q, k, v}, o, lse, d_o, {dq, dk, dv}));
      auto& out = into[static_cast<std::size_t>(r)];
      for (const auto* t : {&o, &lse, &dq, &dk, &dv}) out.insert(out.end(), t->begin(), t->end());
      return Status();
    });
    expect_all_ok(st, "forward_into");
    if (in_place) {
      EXPECT_EQ(into, direct);
    } else {
      // Another summation order of dK/dV: equal to rounding.
      for (std::size_t r = 0; r < into.size(); ++r) {
        ASSERT_EQ(into[r].size(), direct[r].size());
        for (std::size_t i = 0; i < into[r].size(); ++i) ASSERT_NEAR(into[r][i], direct[r][i], 1e-5) << r << " " << i;
      }
    }
  }
  // Padding rows of the last rank's home: 0 in o (the first part of its output).
  const std::int64_t lc = c.seq_len / c.cp, padding = c.seq_len - 170;
  const auto& last = direct.back();
  for (std::int64_t i = (lc - padding) * c.heads_q * c.head_dim; i < lc * c.heads_q * c.head_dim; ++i) {
    ASSERT_EQ(last[static_cast<std::size_t>(i)], 0.0f);
  }
}

// Tensors already in the plan's type are used where they lie: bf16 inputs
// and a bf16 O give bit for bit what fp32 tensors give after rounding (the
// executor rounds fp32 inputs to bf16 itself). A tensor of a third type is
// refused on every rank with one line.
TEST(PlanExecutor, SixteenBitHomeTensorsNeedNoConversion) {
  ExecCase c;
  c.chunks = 2;
  c.dtype = DType::kBF16;
  const std::vector<PackedSequence> pool = exec_test::random_pool(4, 2, c.seq_len);
  const PlanConfig cfg = exec_test::case_config(c);
  Result<Plan> plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok());
  const auto direct = run_plan(*plan, cfg);
  auto bits = [](const std::vector<float>& x, DType t) {
    std::vector<std::uint16_t> b(x.size());
    store_all_from_f32(x.data(), static_cast<std::int64_t>(x.size()), t, b.data());
    return b;
  };
  std::vector<std::vector<float>> typed(static_cast<std::size_t>(plan->num_workers()));
  std::vector<std::string> refusals(typed.size());
  auto st = run_in_process(plan->num_workers(), [&](Communicator& comm) -> Status {
    LIBRA_ASSIGN_OR_RETURN(auto ex, make_plan_executor(comm, *plan, {}));
    const int r = comm.rank();
    const DType bf = DType::kBF16;
    auto q = bits(harness_home_tensor(3, cfg, r, 0), bf), k = bits(harness_home_tensor(3, cfg, r, 1), bf),
         v = bits(harness_home_tensor(3, cfg, r, 2), bf), d_o = bits(harness_home_tensor(3, cfg, r, 3), bf);
    const AttentionInputs in{{q, bf}, {k, bf}, {v, bf}};
    std::vector<std::uint16_t> o(ex->q_elements(), 0x7fc0);
    std::vector<float> lse(ex->lse_elements()), dq(ex->q_elements()), dk(ex->kv_elements()), dv(ex->kv_elements());
    LIBRA_TRY(ex->forward_into(in, {HomeOutput(o, bf), lse}));
    LIBRA_TRY(ex->backward_into(in, {o, bf}, lse, {d_o, bf}, {dq, dk, dv}));
    std::vector<float> o32(o.size());
    load_all_as_f32(o.data(), static_cast<std::int64_t>(o.size()), bf, o32.data());
    auto& out = typed[static_cast<std::size_t>(r)];
    for (const auto* t : {&o32, &lse, &dq, &dk, &dv}) out.insert(out.end(), t->begin(), t->end());
    // fp16 bits for a bf16 plan: refused before any exchange.
    Status bad = ex->forward_into({{q, r == 1 ? DType::kF16 : bf}, {k, bf}, {v, bf}}, {HomeOutput(o, bf), lse});
    refusals[static_cast<std::size_t>(r)] = bad.ok() ? "" : bad.error().message();
    return Status();
  });
  expect_all_ok(st, "16-bit tensors");
  EXPECT_EQ(typed, direct);
  for (const std::string& m : refusals) {
    EXPECT_NE(m.find("q is fp16 but the plan's type for it is bf16"), std::string::npos) << m;
    EXPECT_EQ(m, refusals[0]);
  }
}

// A backend that fails its n-th forward call, or sleeps in its first: a
// kernel error in the middle of a pass, after exchanges were posted, with
// slow peers.
class FailingBackend final : public AttentionBackend {
 public:
  FailingBackend(int fail_at, int first_call_ms) : fail_at_(fail_at), sleep_ms_(first_call_ms) {}
  std::string_view name() const override { return "failing"; }
  Device device() const override { return Device::kCpu; }
  Status supports(DType t) const override { return cpu_->supports(t); }
  std::size_t forward_workspace_bytes(const AttentionForward&) const override { return 0; }
  std::size_t backward_workspace_bytes(const AttentionBackward&) const override { return 0; }
  Status forward(const AttentionForward& a, std::span<std::byte> ws) override {
    if (++calls_ == fail_at_) return internal_error("backend failed on purpose");
    if (calls_ == 1) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    return cpu_->forward(a, ws);
  }
  Status backward(const AttentionBackward& a, std::span<std::byte> ws) override { return cpu_->backward(a, ws); }

 private:
  std::unique_ptr<AttentionBackend> cpu_ = make_cpu_backend();
  int fail_at_, sleep_ms_, calls_ = 0;
};

// Rank 1 fails on its first kernel call of chunk 1, after posting chunk
// 0's outputs, which its slow peers receive only later. It must wait out
// what it posted before its buffers go away: the in-process communicator
// copies straight from them (the asan preset runs this; without the wait it
// reports a use after free). The peers then stop with an error, not a crash.
TEST(PlanExecutor, AKernelErrorMidPassLeavesNoExchangeOnFreedBuffers) {
  ExecCase c;
  c.chunks = 2;
  const std::vector<PackedSequence> pool = exec_test::random_pool(6, 2, c.seq_len);
  const PlanConfig cfg = exec_test::case_config(c);
  Result<Plan> plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok());
  Result<RankSchedule> s1 = make_rank_schedule(*plan, 1);
  ASSERT_TRUE(s1.ok());
  const int chunk0_calls = static_cast<int>(s1->calls(Pass::kForward, 0).size());
  auto st = run_in_process(
      plan->num_workers(),
      [&](Communicator& comm) -> Status {
        const bool failing_rank = comm.rank() == 1;
        FailingBackend backend(failing_rank ? chunk0_calls + 1 : 1 << 30, failing_rank ? 0 : 300);
        ExecOptions o;
        o.backend = &backend;
        Status result;
        {
          LIBRA_ASSIGN_OR_RETURN(auto ex, make_plan_executor(comm, *plan, o));
          const int r = comm.rank();
          auto q = harness_home_tensor(3, cfg, r, 0), k = harness_home_tensor(3, cfg, r, 1),
               v = harness_home_tensor(3, cfg, r, 2);
          result = ex->forward({q, k, v}).status();
        }
        // The executor and its buffers are gone; the communicator lives on
        // while the peers catch up.
        if (failing_rank) std::this_thread::sleep_for(std::chrono::milliseconds(600));
        return result;
      },
      /*timeout_ms=*/2000);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_NE(st[1].message().find("backend failed on purpose"), std::string::npos) << st[1].message();
  for (std::size_t r = 0; r < st.size(); ++r) EXPECT_FALSE(st[r].ok()) << "rank " << r;
}

TEST(PlanExecutor, APlanSavedToAFileGivesTheSameNumbersAsPlanningInProcess) {
  ExecCase c;
  c.chunks = 2;
  c.heads_q = 8;
  c.mode = "tap-split";
  auto pool = exec_test::random_pool(9, 2, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  cfg.mode = PlanMode::kTapSplit;
  Result<Plan> plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok());
  const auto direct = run_plan(*plan, cfg);
  for (const char* name : {"/libra_exec_saved.bin", "/libra_exec_saved.json"}) {
    const std::string path = testing::TempDir() + name;
    ASSERT_TRUE(save_plan(*plan, path).ok());
    Result<Plan> loaded = load_plan(path);
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    EXPECT_EQ(loaded->fingerprint(), plan->fingerprint());
    // Bit for bit: the same schedule, kernel calls and summation order.
    EXPECT_EQ(run_plan(*loaded, loaded->config()), direct) << name;
  }
}

// A tapered plan (format version 4) saved and loaded runs bit for bit as
// the plan it was saved from.
TEST(PlanExecutor, ATaperedPlanSavedToAFileGivesTheSameNumbers) {
  ExecCase c;
  c.chunks = 4;
  c.chunk_split = ChunkSplit::kTapered;
  c.heads_q = 8;
  c.head_shards = 1;
  c.mode = "tap-topo";
  auto pool = exec_test::random_pool(10, 2, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  cfg.mode = PlanMode::kTapTopo;
  Result<Plan> plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan_format_version(plan->config()), 4U);
  const auto direct = run_plan(*plan, cfg);
  for (const char* name : {"/libra_exec_tapered.bin", "/libra_exec_tapered.json"}) {
    const std::string path = testing::TempDir() + name;
    ASSERT_TRUE(save_plan(*plan, path).ok());
    Result<Plan> loaded = load_plan(path);
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    EXPECT_EQ(loaded->config().chunk_split, ChunkSplit::kTapered);
    EXPECT_EQ(loaded->fingerprint(), plan->fingerprint());
    EXPECT_EQ(run_plan(*loaded, loaded->config()), direct) << name;
  }
}

// Whether the chunks of tile `t` end some KV head's reads in another chunk
// than the equal cut's offsets would. Only such a case notices, against the
// reference, KV uses (Plan::kv_use) worked out from the wrong cut: a KV
// head's dK/dV then goes home before the last chunk that adds to it. A
// first use late by one chunk no case here can notice: the executor copies
// the inputs a rank keeps when it posts the next chunk, a chunk ahead of
// their use (schedule_test's symbolic runs check arrival chunk by chunk).
bool tapered_cut_moves_a_kv_last_use(const Plan& plan, const Tile& t, const ExecCase& c) {
  const int w = t.heads.size(), group = c.heads_q / c.heads_kv;
  std::map<int, int> tapered, equal;  // KV head -> the last chunk reading it
  for (int m = 0; m < c.chunks; ++m) {
    const HeadRange h = plan.chunk_heads(t, m);
    for (int q = h.begin; q < h.end; ++q) tapered[q / group] = m;
    const int e0 = chunk_head_offset(w, c.chunks, ChunkSplit::kEqual, m);
    const int e1 = chunk_head_offset(w, c.chunks, ChunkSplit::kEqual, m + 1);
    for (int q = t.heads.begin + e0; q < t.heads.begin + e1; ++q) equal[q / group] = m;
  }
  return tapered != equal;
}

// The tapered cases of the shared lists (run against the reference above,
// in process and under MPI) are tapered plans whose chunks really differ
// in width, and they cover M 3 and 4, tap-topo, ulysses, zigzag homes and
// relayed inputs: a case list that lost its cut would fail here. Each list
// has a case whose cut moves a KV head's last use away from the equal
// cut's (tapered_cut_moves_a_kv_last_use).
TEST(PlanExecutor, TaperedCasesCutTheirChunksUnevenly) {
  for (int world : {4, 8}) {
    std::vector<ExecCase> cases;
    const std::pair<const char*, std::vector<ExecCase>> lists[] = {{"case_matrix", exec_test::case_matrix(world)},
                                                                   {"zigzag_cases", exec_test::zigzag_cases(world)},
                                                                   {"relay_cases", exec_test::relay_cases(world)}};
    std::set<std::string> covered;
    for (const auto& [list, more] : lists) {
      cases.insert(cases.end(), more.begin(), more.end());
      bool moved = false;
      for (const ExecCase& c : more) {
        if (c.chunk_split != ChunkSplit::kTapered) continue;
        PlanConfig cfg = exec_test::case_config(c);
        Result<PlanMode> mode = parse_plan_mode(c.mode);
        ASSERT_TRUE(mode.ok());
        cfg.mode = *mode;
        Result<Plan> plan = make_plan(exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len), cfg);
        ASSERT_TRUE(plan.ok()) << c.name() << ": " << plan.error().message();
        for (const Tile& t : plan->tiles()) moved = moved || tapered_cut_moves_a_kv_last_use(*plan, t, c);
      }
      EXPECT_TRUE(moved) << list << " at W = " << world << ": no tapered case moves a KV head's last use";
    }
    for (const ExecCase& c : cases) {
      if (c.chunk_split != ChunkSplit::kTapered) continue;
      SCOPED_TRACE(c.name());
      PlanConfig cfg = exec_test::case_config(c);
      Result<PlanMode> mode = parse_plan_mode(c.mode);
      ASSERT_TRUE(mode.ok());
      cfg.mode = *mode;
      Result<Plan> plan = make_plan(exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len), cfg);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      ASSERT_EQ(plan->config().chunk_split, ChunkSplit::kTapered);
      const Tile& t = plan->tiles().front();
      const int w = t.heads.size();
      ASSERT_GE(w, 4);
      // Chunk 0 and chunk M-1 narrower than chunk 1.
      EXPECT_LT(plan->chunk_heads(t, 0).size(), plan->chunk_heads(t, 1).size());
      EXPECT_LT(plan->chunk_heads(t, c.chunks - 1).size(), plan->chunk_heads(t, 1).size());
      covered.insert("M" + std::to_string(c.chunks));
      covered.insert(c.mode);
      if (c.relay) covered.insert("relay");
      if (c.home_layout == HomeLayout::kZigzag) covered.insert("zigzag");
      if (w >= 8 && c.chunks == 4) covered.insert("8 heads in 4");
    }
    for (const char* want : {"M3", "M4", "tap", "tap-split", "tap-topo", "ulysses", "relay", "zigzag", "8 heads in 4"}) {
      EXPECT_EQ(covered.count(want), 1U) << "no tapered case with " << want << " at W = " << world;
    }
  }
}

// fp16 storage end to end (the case matrix has fp16 cases too): the
// kernel accepts it and the results are within the fp16 tolerance.
TEST(PlanExecutor, Fp16EndToEnd) {
  ASSERT_TRUE(make_cpu_backend()->supports(DType::kF16).ok());
  for (const char* mode : {"tap", "tap-split", "tap-topo", "ulysses-direct"}) {
    ExecCase c;
    c.mode = mode;
    c.dtype = DType::kF16;
    c.window = 40;
    c.chunks = mode == std::string("ulysses-direct") ? 1 : 2;
    expect_all_ok(run_in_process(4, [&](Communicator& comm) { return exec_test::exec_case(comm, c); }), c.name());
  }
}

// The registries name what `libra exec` can run on: one line each in
// src/exec/registry.cpp.
TEST(Registry, MakesRegisteredBackendsByNameAndNamesThemOnAnUnknownOne) {
  ASSERT_FALSE(attention_backends().empty());
  for (const BackendEntry& b : attention_backends()) {
    Result<std::unique_ptr<AttentionBackend>> made = make_backend(b.name);
    ASSERT_TRUE(made.ok()) << made.error().message();
    EXPECT_NE(*made, nullptr);
  }
  Result<std::unique_ptr<AttentionBackend>> cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->device(), Device::kCpu);
  Result<std::unique_ptr<AttentionBackend>> none = make_backend("nope");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message(), "backend nope: not one of the registered backends (cpu)");
}

TEST(Registry, FindsTheLaunchedWorldFromTheLaunchersEnvironment) {
  ASSERT_FALSE(launched_worlds().empty());
  EXPECT_STREQ(launched_worlds()[0].name, "mpi");
  // The test runs without a launcher unless ctest itself was started by one.
  if (launched_worlds()[0].launched()) GTEST_SKIP() << "started by mpirun";
  EXPECT_EQ(launched_world(), nullptr);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  const LaunchedWorld* w = launched_world();
  const int rank = w ? w->launcher_rank() : -2;
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ASSERT_NE(w, nullptr);
  EXPECT_STREQ(w->name, "mpi");
  EXPECT_EQ(rank, 1);
}

TEST(CpuBackend, RejectsViewsOfAnotherDeviceAndReportsItsTypes) {
  auto be = make_cpu_backend();
  EXPECT_EQ(be->device(), Device::kCpu);
  EXPECT_TRUE(be->supports(DType::kF32).ok());
  EXPECT_TRUE(be->supports(DType::kBF16).ok());
  EXPECT_TRUE(be->supports(DType::kF16).ok());
  Status bad = be->supports(static_cast<DType>(7));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("is not supported by the kernel"), std::string::npos) << bad.message();
  std::vector<float> q(16, 0.5f), o(16), lse(4);
  const QueryFragment f{0, 0, 4, 0, 4};
  AttentionForward a{ConstView{q.data(), DType::kF32, 4, 1, 4, 4}, ConstView{q.data(), DType::kF32, 4, 1, 4, 4},
                     ConstView{q.data(), DType::kF32, 4, 1, 4, 4}, View{o.data(), DType::kF32, 4, 1, 4, 4},
                     View{lse.data(), DType::kF32, 4, 1, 1, 1}, {&f, 1}};
  ASSERT_TRUE(be->forward(a, {}).ok());
  // Uniform scores: every output row is the mean of V's rows, 0.5.
  for (float x : o) EXPECT_FLOAT_EQ(x, 0.5f);
  a.k.device = Device::kCuda;
  Status s = be->forward(a, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor k is on device cuda"), std::string::npos) << s.message();
}

TEST(ScheduleExecutor, RefusesASchedulePointingOutsideItsBuffers) {
  ExecCase c;
  auto pool = exec_test::random_pool(3, 2, c.seq_len);
  Result<Plan> plan = make_plan(pool, exec_test::case_config(c));
  ASSERT_TRUE(plan.ok());
  Result<RankSchedule> s = make_rank_schedule(*plan, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(validate_schedule(*s).ok());
  RankSchedule bad = *s;
  for (auto& segs : bad.exchanges[0][0].send) {
    if (!segs.empty()) {
      segs[0].at.offset = bad.home_vectors(segs[0].field);
      break;
    }
  }
  Status v = validate_schedule(bad);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("outside its buffer"), std::string::npos) << v.message();
}

TEST(UlyssesExecutor, RejectsHeadCountsTheGroupCannotSplit) {
  ExecCase c;
  c.heads_q = 6;
  c.heads_kv = 3;
  c.cp = 4;
  c.seq_len = 256;
  c.head_shards = 1;
  auto pool = exec_test::random_pool(3, 1, c.seq_len);
  auto st = run_in_process(4, [&](Communicator& comm) {
    return make_ulysses_executor(comm, pool, exec_test::case_config(c), {}).status();
  });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("6"), std::string::npos) << s.message();
  }
}

TEST(AgreeOnFingerprint, NamesEveryGroupOfRanks) {
  auto st = run_in_process(4, [](Communicator& comm) -> Status {
    Status s = agree_on_fingerprint(comm, comm.rank() == 1 ? 0xbeefu : 0xabcu, "plan");
    if (s.ok()) return internal_error("mismatch accepted");
    if (s.message().find("rank(s) 0,2,3 hold 0000000000000abc; rank(s) 1 hold 000000000000beef") == std::string::npos) {
      return internal_error(s.message());
    }
    return Status();
  });
  expect_all_ok(st, "fingerprint");
}

TEST(Harness, HomeTensorsTileTheWholeSlotTensor) {
  PlanConfig cfg = exec_test::case_config(ExecCase{});
  auto a = harness_home_tensor(5, cfg, 2, 0), b = harness_home_tensor(5, cfg, 3, 0);
  auto other_slot = harness_home_tensor(5, cfg, 0, 0);
  EXPECT_EQ(a.size(), static_cast<std::size_t>(cfg.seq_len / 2 * cfg.shape.heads_q * cfg.shape.head_dim));
  EXPECT_NE(a, b);
  EXPECT_NE(a, other_slot);
  EXPECT_EQ(harness_home_tensor(5, cfg, 2, 0), a);  // deterministic
  for (float x : a) {
    EXPECT_GE(x, -1.0f);
    EXPECT_LT(x, 1.0f);
  }
}

TEST(Harness, ZigzagHomeTensorsHoldChunksRAnd2CPMinus1MinusR) {
  PlanConfig cfg = exec_test::case_config(ExecCase{});
  cfg.cp = 4;
  cfg.block_size = 8;
  PlanConfig zz = cfg;
  zz.home_layout = HomeLayout::kZigzag;
  // The whole slot tensor, row by row, from the contiguous homes.
  const std::int64_t width = cfg.shape.heads_q * cfg.shape.head_dim, n = cfg.seq_len / 8;
  std::vector<float> whole;
  for (int c = 0; c < 4; ++c) {
    auto h = harness_home_tensor(5, cfg, 4 + c, 0);  // slot 1
    whole.insert(whole.end(), h.begin(), h.end());
  }
  for (int c = 0; c < 4; ++c) {
    std::vector<float> want(whole.begin() + c * n * width, whole.begin() + (c + 1) * n * width);
    want.insert(want.end(), whole.begin() + (7 - c) * n * width, whole.begin() + (8 - c) * n * width);
    EXPECT_EQ(harness_home_tensor(5, zz, 4 + c, 0), want) << "cp rank " << c;
  }
}

TEST(Harness, CompareHomeMeasuresAgainstTheTensorScale) {
  std::vector<double> ref = {0, 0, 1, -2, 3, 4};
  std::vector<float> got = {1.0f, -2.5f};
  ErrorStats e = compare_home(got, ref, 1, 1, 2);  // row 1 = {1, -2}
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.max_ref, 2.0);
  EXPECT_DOUBLE_EQ(e.rel(), 0.25);
}

}  // namespace
}  // namespace libra
