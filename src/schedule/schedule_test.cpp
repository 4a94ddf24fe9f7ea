// The per-rank schedules of all W workers, built in one process and run
// symbolically: every head vector carries a label naming what it holds
// (field, slot, token, head), every kernel call checks the labels of what it
// reads and writes labels of what it computes, and dK/dV carry a sum of
// per-(query, key) hashes. The results are compared with what plain
// attention over whole sequences reads and writes, computed here from the
// pool alone.
#include "libra/schedule.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "exec/exec_test_bodies.hpp"
#include "libra/relay.hpp"
#include "libra/splitmix64.hpp"

namespace libra {
namespace {

using exec_test::ExecCase;
using Buf = std::vector<std::uint64_t>;

constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

std::uint64_t label(Field f, std::int64_t slot, std::int64_t token, std::int64_t head) {
  return (static_cast<std::uint64_t>(f) << 56) | (static_cast<std::uint64_t>(slot) << 40) |
         (static_cast<std::uint64_t>(token) << 12) | static_cast<std::uint64_t>(head);
}

// The contribution of query (row, head) to key j's gradient.
std::uint64_t contrib(std::int64_t slot, std::int64_t row, std::int64_t head, std::int64_t key) {
  std::uint64_t z = label(Field::kDk, slot, row, head) * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(key);
  return splitmix64_mix(z);
}

struct Sim {
  std::vector<RankSchedule> s;
  std::vector<std::array<Buf, kNumFields>> home, compute, stage;
  std::string error;

  Buf& buf(int r, Field f, bool at_home) {
    return (at_home ? home : compute)[static_cast<std::size_t>(r)][static_cast<std::size_t>(f)];
  }
  // A segment's side of the buffers: staging where it says so.
  Buf& seg_buf(int r, const Segment& seg, bool at_home) {
    return seg.stage ? stage[static_cast<std::size_t>(r)][static_cast<std::size_t>(seg.field)] : buf(r, seg.field, at_home);
  }
  bool fail(const std::string& e) {
    if (error.empty()) error = e;
    return false;
  }
  // Index of vector (i, j) of a program, bounds-checked against the buffer.
  bool index(const Strided& a, std::int64_t i, std::int64_t j, const Buf& b, std::size_t& out, const char* what) {
    const std::int64_t x = a.offset + i * a.stride + j;
    if (a.offset < 0 || a.run > a.stride || x < 0 || x >= static_cast<std::int64_t>(b.size())) {
      return fail(fmt::format("{}: vector {} outside its buffer of {}", what, x, b.size()));
    }
    out = static_cast<std::size_t>(x);
    return true;
  }
  // Runs (phase, m): pairs every sender's list with its receiver's; in-phase
  // messages land at once, out-phase messages are packed now and applied
  // later in the receiver's apply order.
  using Packed = std::map<std::tuple<int, int, int>, std::vector<std::uint64_t>>;  // (dst, src, m)
  bool exchange(Phase p, int m, Packed* later, bool staging = false) {
    const bool in = p == Phase::kFwdIn || p == Phase::kBwdIn;
    const int W = static_cast<int>(s.size());
    const Pass pass = p == Phase::kFwdIn || p == Phase::kFwdOut ? Pass::kForward : Pass::kBackward;
    auto of = [&](int w) -> const Exchange& {
      const RankSchedule& x = s[static_cast<std::size_t>(w)];
      return staging ? x.stage_exchange(pass, m) : x.exchange(p, m);
    };
    for (int a = 0; a < W; ++a) {
      for (int d = 0; d < W; ++d) {
        const Exchange& xs = of(a);
        const Exchange& xr = of(d);
        const auto& send = xs.send[static_cast<std::size_t>(d)];
        const auto& recv = xr.recv[static_cast<std::size_t>(a)];
        const std::string where = fmt::format("{}{} chunk {} {} -> {}", phase_name(p), staging ? " stage" : "", m, a, d);
        if (send.size() != recv.size()) return fail(where + ": segment counts differ");
        if (xs.send_bytes[static_cast<std::size_t>(d)] != xr.recv_bytes[static_cast<std::size_t>(a)]) {
          return fail(where + ": byte counts differ");
        }
        std::vector<std::uint64_t> wire;
        for (std::size_t k = 0; k < send.size(); ++k) {
          const Segment &x = send[k], &y = recv[k];
          if (x.field != y.field || x.slot != y.slot || x.t0 != y.t0 || x.t1 != y.t1 || x.h0 != y.h0 || x.h1 != y.h1 ||
              x.at.rows != y.at.rows || x.at.run != y.at.run || x.at.rows != x.t1 - x.t0 || x.at.run != x.h1 - x.h0) {
            return fail(where + fmt::format(": segment {} shapes differ", k));
          }
          if (y.add != (y.field == Field::kDk || y.field == Field::kDv)) return fail(where + ": only dK/dV add");
          Buf& src = seg_buf(a, x, in);
          for (std::int64_t i = 0; i < x.at.rows; ++i)
            for (std::int64_t j = 0; j < x.at.run; ++j) {
              std::size_t at = 0;
              if (!index(x.at, i, j, src, at, "send")) return false;
              wire.push_back(src[at]);
            }
        }
        if (in) {
          if (!apply(d, recv, wire, true)) return false;
        } else {
          (*later)[{d, a, m}] = std::move(wire);
        }
      }
    }
    return true;
  }
  bool apply(int d, const std::vector<Segment>& recv, const std::vector<std::uint64_t>& wire, bool in) {
    std::size_t w = 0;
    for (const Segment& y : recv) {
      Buf& dst = seg_buf(d, y, !in);
      for (std::int64_t i = 0; i < y.at.rows; ++i)
        for (std::int64_t j = 0; j < y.at.run; ++j) {
          std::size_t at = 0;
          if (!index(y.at, i, j, dst, at, "recv")) return false;
          if (y.add) {
            dst[at] += wire[w++];
          } else {
            dst[at] = wire[w++];
          }
        }
    }
    return true;
  }
  bool apply_out(Phase p, const Packed& later) {
    for (std::size_t d = 0; d < s.size(); ++d) {
      for (auto [src, m] : s[d].apply_order) {
        auto it = later.find({static_cast<int>(d), src, m});
        if (it == later.end()) return fail("apply order names a missing message");
        if (!apply(static_cast<int>(d), s[d].exchange(p, m).recv[static_cast<std::size_t>(src)], it->second, false)) return false;
      }
    }
    return true;
  }
};

// Runs both passes of the W schedules and checks them against the pool.
void check_case(const ExecCase& c, int W, ScheduleOptions options = {}) {
  SCOPED_TRACE(c.name() + (options.read_home_in_place ? "" : " (nothing read in place)"));
  const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  Sim sim;
  std::optional<Plan> plan;
  if (c.mode != "ulysses-direct") {
    auto mode = parse_plan_mode(c.mode);
    ASSERT_TRUE(mode.ok());
    cfg.mode = *mode;
    auto p = make_plan(pool, cfg);
    ASSERT_TRUE(p.ok()) << p.error().message();
    plan.emplace(*p);
    ASSERT_EQ(plan->num_workers(), W);
  }
  for (int r = 0; r < W; ++r) {
    auto s = plan ? make_rank_schedule(*plan, r, options) : make_ulysses_schedule(pool, cfg, r, options);
    ASSERT_TRUE(s.ok()) << s.error().message();
    sim.s.push_back(std::move(*s));
  }
  const int grp = c.heads_q / c.heads_kv, M = sim.s[0].chunks;
  const std::int64_t lc = c.seq_len / c.cp;

  // Per-pair traffic equals the plan's byte matrix (LSE, which the plan's
  // contract does not count, aside). Relayed, a pair's inputs travel via a
  // node-mate: then each worker's sends (its own, and the stage of what it
  // has relayed, but not what it relays for others) and receipts equal the
  // plan's row and column sums.
  const bool relayed = sim.s[0].relayed;
  for (const RankSchedule& s : sim.s) ASSERT_EQ(s.relayed, relayed);
  if (plan && relayed) {
    for (int a = 0; a < W; ++a) {
      const RankSchedule& s = sim.s[static_cast<std::size_t>(a)];
      std::int64_t sent = 0, received = 0;
      for (int m = 0; m < M; ++m) {
        for (Phase p : {Phase::kFwdIn, Phase::kFwdOut}) {
          const Exchange& x = s.exchange(p, m);
          for (int d = 0; d < W; ++d) {
            if (d == a) continue;
            for (const Segment& seg : x.send[static_cast<std::size_t>(d)])
              if (seg.field != Field::kLse && !seg.stage) sent += seg.at.count() * s.vector_bytes(seg.field);
            for (const Segment& seg : x.recv[static_cast<std::size_t>(d)])
              if (seg.field != Field::kLse) received += seg.at.count() * s.vector_bytes(seg.field);
          }
        }
        for (const auto& list : s.stage_exchange(Pass::kForward, m).send)
          for (const Segment& seg : list) sent += seg.at.count() * s.vector_bytes(seg.field);
      }
      EXPECT_EQ(sent, plan->send_bytes(a)) << "worker " << a;
      EXPECT_EQ(received, plan->recv_bytes(a)) << "worker " << a;
    }
  } else if (plan) {
    for (int a = 0; a < W; ++a) {
      for (int d = 0; d < W; ++d) {
        if (a == d) continue;
        std::int64_t bytes = 0;
        for (Phase p : {Phase::kFwdIn, Phase::kFwdOut})
          for (int m = 0; m < M; ++m)
            for (const Segment& seg : sim.s[static_cast<std::size_t>(a)].exchange(p, m).send[static_cast<std::size_t>(d)])
              if (seg.field != Field::kLse) bytes += seg.at.count() * sim.s[0].vector_bytes(seg.field);
        EXPECT_EQ(bytes, plan->bytes(a, d)) << a << " -> " << d;
      }
    }
  }

  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    const bool bwd = pass == Pass::kBackward;
    // Home buffers hold labels of their own tokens; compute buffers start empty.
    sim.home.assign(static_cast<std::size_t>(W), {});
    sim.compute.assign(static_cast<std::size_t>(W), {});
    sim.stage.assign(static_cast<std::size_t>(W), {});
    for (int r = 0; r < W; ++r) {
      const RankSchedule& s = sim.s[static_cast<std::size_t>(r)];
      for (int fi = 0; fi < kNumFields; ++fi) {
        const Field f = static_cast<Field>(fi);
        Buf& h = sim.buf(r, f, true);
        const bool output = f == Field::kDq || f == Field::kDk || f == Field::kDv || (!bwd && (f == Field::kO || f == Field::kLse));
        const std::int64_t heads = is_kv_field(f) ? c.heads_kv : c.heads_q;
        h.assign(static_cast<std::size_t>(s.home_vectors(f)), kEmpty);
        for (std::int64_t t = 0; t < lc; ++t)
          for (std::int64_t hd = 0; hd < heads; ++hd)
            h[static_cast<std::size_t>(t * heads + hd)] =
                (f == Field::kDk || f == Field::kDv) ? 0 : output ? kEmpty : label(f, s.slot, s.packed_row(t), hd);
        sim.buf(r, f, false).assign(static_cast<std::size_t>(s.compute_vectors(f)), (f == Field::kDk || f == Field::kDv) ? 0 : kEmpty);
        sim.stage[static_cast<std::size_t>(r)][static_cast<std::size_t>(f)].assign(static_cast<std::size_t>(s.stage_vectors(f)), kEmpty);
      }
    }
    // Computed (slot, row, head) counts.
    std::map<std::tuple<int, std::int64_t, int>, int> computed;
    Sim::Packed later;
    const Phase in = bwd ? Phase::kBwdIn : Phase::kFwdIn, out = bwd ? Phase::kBwdOut : Phase::kFwdOut;
    for (int m = 0; m < M; ++m) {
      if (relayed) {
        ASSERT_TRUE(sim.exchange(in, m, nullptr, /*staging=*/true)) << sim.error;
      }
      ASSERT_TRUE(sim.exchange(in, m, nullptr)) << sim.error;
      for (int r = 0; r < W; ++r) {
        const RankSchedule& s = sim.s[static_cast<std::size_t>(r)];
        for (const KernelCall& call : s.calls(pass, m)) {
          const Region& reg = s.regions[static_cast<std::size_t>(call.region)];
          // Slot row of a packed row (the inverse of the region's runs).
          auto slot_row = [](const std::vector<RowRun>& runs, std::int64_t packed) -> std::int64_t {
            for (const RowRun& run : runs)
              if (packed >= run.at && packed < run.at + (run.end - run.begin)) return run.begin + (packed - run.at);
            return -1;
          };
          // Views at home address the worker's own shard: slot row = packed_row(row).
          if (call.q_home || call.kv_home) {
            ASSERT_EQ(reg.slot, s.slot) << "a call reads another slot at home";
          }
          auto q_slot_row = [&](std::int64_t row) { return call.q_home ? s.packed_row(row) : slot_row(reg.q_rows, row); };
          auto kv_slot_row = [&](std::int64_t row) { return call.kv_home ? s.packed_row(row) : slot_row(reg.kv_rows, row); };
          const int nh = call.h1 - call.h0, nk = call.k1 - call.k0;
          ASSERT_TRUE(nk > 0 && nh % nk == 0);
          for (const CallFragment& fr : s.call_fragments(call)) {
            const std::int64_t start = kv_slot_row(fr.kv_row);  // slot position of the sample's key 0
            ASSERT_GE(start, 0);
            ASSERT_EQ(kv_slot_row(fr.kv_row + fr.e - 1), start + fr.e - 1) << "a sample's keys span two runs";
            for (std::int64_t q = fr.a; q < fr.e; ++q) {
              const std::int64_t row = fr.q_row + (q - fr.a);
              const std::int64_t srow = q_slot_row(row);
              ASSERT_EQ(srow, start + q) << "query row maps to another slot row";
              for (int h = call.h0; h < call.h1; ++h) {
                const int kvh = call.k0 + (h - call.h0) / (nh / nk);
                ASSERT_EQ(kvh, h / grp) << "call maps query head " << h << " to KV head " << kvh;
                std::size_t at = 0;
                auto qv = [&](Field f) -> std::uint64_t& {
                  EXPECT_TRUE(sim.index(call.q, row, h - call.h0, sim.buf(r, f, call.q_home), at, "call Q")) << sim.error;
                  return sim.buf(r, f, call.q_home)[at];
                };
                ASSERT_EQ(qv(Field::kQ), label(Field::kQ, reg.slot, srow, h)) << "worker " << r << " chunk " << m;
                if (bwd) {
                  ASSERT_EQ(qv(Field::kDo), label(Field::kDo, reg.slot, srow, h));
                  ASSERT_EQ(qv(Field::kO), label(Field::kO, reg.slot, srow, h));
                  ASSERT_EQ(qv(Field::kLse), label(Field::kLse, reg.slot, srow, h));
                  qv(Field::kDq) = label(Field::kDq, reg.slot, srow, h);
                } else {
                  qv(Field::kO) = label(Field::kO, reg.slot, srow, h);
                  qv(Field::kLse) = label(Field::kLse, reg.slot, srow, h);
                }
                ++computed[{reg.slot, srow, h}];
                const std::int64_t k_first = c.window == kFullCausal || c.window > q ? 0 : q - c.window + 1;
                for (std::int64_t j = k_first; j <= q; ++j) {
                  auto kv = [&](Field f) -> std::uint64_t& {
                    EXPECT_TRUE(sim.index(call.kv, fr.kv_row + j, kvh - call.k0, sim.buf(r, f, call.kv_home), at, "call KV")) << sim.error;
                    return sim.buf(r, f, call.kv_home)[at];
                  };
                  ASSERT_EQ(kv(Field::kK), label(Field::kK, reg.slot, start + j, kvh)) << "worker " << r << " chunk " << m;
                  ASSERT_EQ(kv(Field::kV), label(Field::kV, reg.slot, start + j, kvh));
                  if (bwd) {
                    const std::uint64_t x = contrib(reg.slot, srow, h, start + j);
                    kv(Field::kDk) += x;
                    kv(Field::kDv) += x * 3;
                  }
                }
              }
            }
          }
        }
      }
      ASSERT_TRUE(sim.exchange(out, m, &later)) << sim.error;
    }
    ASSERT_TRUE(sim.apply_out(out, later)) << sim.error;

    // Against whole-sequence attention: every real (slot, row, head) once,
    // padding never; outputs home; dK/dV sums of every (query, key) once.
    for (int slot = 0; slot < c.pool_size; ++slot) {
      const PackedSequence& seq = pool[static_cast<std::size_t>(slot)];
      std::vector<std::uint64_t> dk(static_cast<std::size_t>(c.seq_len * c.heads_kv), 0);
      std::int64_t start = 0;
      for (std::int64_t len : seq) {
        for (std::int64_t q = 0; q < len; ++q) {
          for (int h = 0; h < c.heads_q; ++h) {
            EXPECT_EQ((computed[{slot, start + q, h}]), 1) << "slot " << slot << " row " << start + q << " head " << h;
            const std::int64_t k_first = c.window == kFullCausal || c.window > q ? 0 : q - c.window + 1;
            for (std::int64_t j = k_first; j <= q; ++j) dk[static_cast<std::size_t>((start + j) * c.heads_kv + h / grp)] += contrib(slot, start + q, h, start + j);
          }
        }
        start += len;
      }
      for (std::int64_t t = start; t < c.seq_len; ++t)
        for (int h = 0; h < c.heads_q; ++h) EXPECT_EQ((computed.count({slot, t, h})), 0U) << "padding row " << t;
      for (int cr = 0; cr < c.cp; ++cr) {
        const int r = slot * c.cp + cr;
        for (std::int64_t t = 0; t < lc; ++t) {
          const std::int64_t x = sim.s[static_cast<std::size_t>(r)].packed_row(t);
          for (int h = 0; h < c.heads_q; ++h) {
            const std::size_t i = static_cast<std::size_t>(t * c.heads_q + h);
            if (bwd) {
              EXPECT_EQ(sim.buf(r, Field::kDq, true)[i], x < start ? label(Field::kDq, slot, x, h) : kEmpty);
            } else {
              EXPECT_EQ(sim.buf(r, Field::kO, true)[i], x < start ? label(Field::kO, slot, x, h) : kEmpty);
              EXPECT_EQ(sim.buf(r, Field::kLse, true)[i], x < start ? label(Field::kLse, slot, x, h) : kEmpty);
            }
          }
          if (!bwd) continue;
          for (int h = 0; h < c.heads_kv; ++h) {
            const std::size_t i = static_cast<std::size_t>(t * c.heads_kv + h);
            EXPECT_EQ(sim.buf(r, Field::kDk, true)[i], dk[static_cast<std::size_t>(x * c.heads_kv + h)]) << "dK row " << x << " head " << h;
            EXPECT_EQ(sim.buf(r, Field::kDv, true)[i], dk[static_cast<std::size_t>(x * c.heads_kv + h)] * 3);
          }
        }
      }
    }
  }
}

TEST(RankSchedule, EveryCaseOfTheExecutorMatrixRunsSymbolicallyOnFourWorkers) {
  for (const ExecCase& c : exec_test::case_matrix(4)) check_case(c, 4);
}

TEST(RankSchedule, WithNothingReadInPlaceEveryCaseStillRuns) {
  for (const ExecCase& c : exec_test::case_matrix(4)) check_case(c, 4, {.read_home_in_place = false});
  for (const ExecCase& c : exec_test::case_matrix(8)) check_case(c, 8, {.read_home_in_place = false});
}

// Reading in place must actually remove the copies it claims to: no call of
// a tile on its own home goes through compute buffers, and the message to
// self shrinks to what crosses home shards.
TEST(RankSchedule, InPlaceCallsReplaceTheMessageToSelf) {
  for (const ExecCase& c : exec_test::case_matrix(4)) {
    SCOPED_TRACE(c.name());
    const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
    PlanConfig cfg = exec_test::case_config(c);
    const bool direct = c.mode == "ulysses-direct";
    auto mode = parse_plan_mode(direct ? "ulysses" : c.mode);
    ASSERT_TRUE(mode.ok());
    cfg.mode = *mode;
    auto plan = make_plan(pool, cfg);
    ASSERT_TRUE(plan.ok());
    auto schedule = [&](int r, ScheduleOptions o) {
      return direct ? make_ulysses_schedule(pool, cfg, r, o) : make_rank_schedule(*plan, r, o);
    };
    std::int64_t self_in_place = 0, self_copied = 0, home_calls = 0;
    for (int r = 0; r < plan->num_workers(); ++r) {
      auto a = schedule(r, {}), b = schedule(r, {.read_home_in_place = false});
      ASSERT_TRUE(a.ok() && b.ok());
      for (int p = 0; p < 4; ++p)
        for (int m = 0; m < a->chunks; ++m) {
          self_in_place += a->exchange(static_cast<Phase>(p), m).send_bytes[static_cast<std::size_t>(r)];
          self_copied += b->exchange(static_cast<Phase>(p), m).send_bytes[static_cast<std::size_t>(r)];
          // Messages between workers are the same either way.
          for (int peer = 0; peer < plan->num_workers(); ++peer) {
            if (peer == r) continue;
            EXPECT_EQ(a->exchange(static_cast<Phase>(p), m).send_bytes[static_cast<std::size_t>(peer)],
                      b->exchange(static_cast<Phase>(p), m).send_bytes[static_cast<std::size_t>(peer)]);
          }
        }
      EXPECT_LE(a->compute_q_vectors, b->compute_q_vectors);
      EXPECT_LE(a->compute_kv_vectors, b->compute_kv_vectors);
      for (int m = 0; m < a->chunks; ++m) {
        for (const KernelCall& call : a->calls(Pass::kForward, m)) home_calls += call.q_home;
        for (const KernelCall& call : b->calls(Pass::kForward, m)) EXPECT_FALSE(call.q_home || call.kv_home);
      }
    }
    EXPECT_GT(home_calls, 0);
    EXPECT_LT(self_in_place, self_copied);
  }
}

TEST(RankSchedule, EveryCaseOfTheExecutorMatrixRunsSymbolicallyOnEightWorkers) {
  for (const ExecCase& c : exec_test::case_matrix(8)) check_case(c, 8);
}

TEST(RankSchedule, LargerPoolsWithManyBlocksAndChunks) {
  for (std::uint64_t seed : {11u, 12u, 13u}) {
    ExecCase c;
    c.pool_seed = seed;
    c.pool_size = 3;
    c.cp = 4;
    c.seq_len = 512;
    c.block = 32;
    c.head_shards = 2;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.chunks = 4;
    for (const char* mode : {"tap", "tap-split", "tap-topo"}) {
      c.mode = mode;
      check_case(c, 12);
    }
    // Tapered chunks: 8 query heads a tile in 1, 3, 3, 1 and 4 in 1, 2, 1.
    ExecCase t = c;
    t.chunk_split = ChunkSplit::kTapered;
    for (const char* mode : {"tap", "tap-split", "tap-topo"}) {
      t.mode = mode;
      t.head_shards = 1;
      t.chunks = 4;
      check_case(t, 12);
      t.head_shards = 2;
      t.chunks = 3;
      check_case(t, 12);
    }
  }
}

// The (slot, row, query head) cells worker r's kernel calls compute in each
// chunk of `pass`, read off the calls alone.
std::set<std::tuple<int, int, std::int64_t, int>> computed_by_chunk(const RankSchedule& s, Pass pass) {
  std::set<std::tuple<int, int, std::int64_t, int>> out;  // (chunk, slot, row, head)
  for (int m = 0; m < s.chunks; ++m) {
    for (const KernelCall& call : s.calls(pass, m)) {
      const Region& reg = s.regions[static_cast<std::size_t>(call.region)];
      for (const CallFragment& fr : s.call_fragments(call)) {
        for (std::int64_t q = fr.a; q < fr.e; ++q) {
          const std::int64_t row = fr.q_row + (q - fr.a);
          std::int64_t srow = -1;
          if (call.q_home) {
            srow = s.packed_row(row);
          } else {
            for (const RowRun& run : reg.q_rows)
              if (row >= run.at && row < run.at + (run.end - run.begin)) srow = run.begin + (row - run.at);
          }
          for (int h = call.h0; h < call.h1; ++h) out.insert({m, reg.slot, srow, h});
        }
      }
    }
  }
  return out;
}

// Tapered chunks: chunk m of every worker computes exactly the m-th slice of
// its tiles' heads as the rule cuts it (the ends narrower than the middles),
// in both passes, relayed or not. The symbolic runs above check the labels
// and sums; this checks that each head is computed in its own chunk.
TEST(RankSchedule, TaperedChunksComputeTheirOwnHeadsInEachChunk) {
  int checked = 0;
  for (int world : {4, 8}) {
    std::vector<std::pair<ExecCase, ScheduleOptions>> cases;
    for (const ExecCase& c : exec_test::case_matrix(world)) cases.push_back({c, {}});
    for (const ExecCase& c : exec_test::zigzag_cases(world)) cases.push_back({c, {}});
    for (const ExecCase& c : exec_test::relay_cases(world)) cases.push_back({c, {.relay = true}});
    for (const auto& [c, options] : cases) {
      if (c.chunk_split != ChunkSplit::kTapered) continue;
      SCOPED_TRACE(c.name());
      const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
      PlanConfig cfg = exec_test::case_config(c);
      auto mode = parse_plan_mode(c.mode);
      ASSERT_TRUE(mode.ok());
      cfg.mode = *mode;
      auto plan = make_plan(pool, cfg);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      ASSERT_EQ(plan->config().chunk_split, ChunkSplit::kTapered);
      const int M = c.chunks;
      // The rule's widths, spelled out: ends e = max(1, round(w / (2 (M - 1)))),
      // the rest dealt to the middle chunks, earlier ones first.
      const int w = plan->tiles().front().heads.size();
      std::vector<int> width(static_cast<std::size_t>(M), 0);
      width.front() = width.back() = std::max(1, static_cast<int>(std::lround(w / (2.0 * (M - 1)))));
      for (int left = w - 2 * width.front(), i = 0; left > 0; --left, i = (i + 1) % (M - 2)) ++width[static_cast<std::size_t>(1 + i)];
      ASSERT_LT(width.front(), *std::max_element(width.begin(), width.end())) << "widths all equal: not a tapered test";
      for (int r = 0; r < world; ++r) {
        auto s = make_rank_schedule(*plan, r, options);
        ASSERT_TRUE(s.ok()) << s.error().message();
        ASSERT_EQ(s->chunks, M);
        std::set<std::tuple<int, int, std::int64_t, int>> want;
        for (const Tile& t : plan->tiles()) {
          if (t.worker != r) continue;
          int h = t.heads.begin;
          for (int m = 0; m < M; ++m) {
            for (int k = 0; k < width[static_cast<std::size_t>(m)]; ++k, ++h) {
              for (std::int64_t x = t.begin; x < t.end; ++x) want.insert({m, t.slot, x, h});
            }
          }
        }
        for (Pass pass : {Pass::kForward, Pass::kBackward}) {
          EXPECT_EQ(computed_by_chunk(*s, pass), want) << "worker " << r << (pass == Pass::kForward ? " forward" : " backward");
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 12 * 4 + 12 * 8);  // twelve tapered cases at each size, every worker
}

TEST(RankSchedule, ZigzagHomesRunSymbolicallyWithAndWithoutReadingInPlace) {
  for (int world : {4, 8}) {
    for (const ExecCase& c : exec_test::zigzag_cases(world)) {
      check_case(c, world);
      check_case(c, world, {.read_home_in_place = false});
    }
  }
  // Many blocks per chunk, three slots, CP 4, samples crossing chunks.
  for (std::uint64_t seed : {21u, 22u}) {
    ExecCase c;
    c.pool_seed = seed;
    c.pool_size = 3;
    c.cp = 4;
    c.seq_len = 512;
    c.block = 16;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.chunks = 4;
    c.home_layout = HomeLayout::kZigzag;
    for (const char* mode : {"tap", "tap-split"}) {
      c.mode = mode;
      check_case(c, 12);
    }
  }
}

// Zigzag homes: a home row's packed row follows the chunk rule, padding
// is a suffix of the home, and a sample read in place lies in one home run.
TEST(RankSchedule, ZigzagHomeRowsAreChunksRAnd2CPMinus1MinusR) {
  ExecCase c = exec_test::zigzag_cases(8).front();  // CP 4
  const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  auto plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  const std::int64_t n = c.seq_len / (2 * c.cp);
  for (int r = 0; r < plan->num_workers(); ++r) {
    auto s = make_rank_schedule(*plan, r);
    ASSERT_TRUE(s.ok());
    const int cr = r % c.cp;
    std::int64_t tokens = 0;
    for (std::int64_t l : pool[static_cast<std::size_t>(r / c.cp)]) tokens += l;
    std::int64_t want_tokens = 0;
    for (std::int64_t i = 0; i < s->home_rows; ++i) {
      const std::int64_t want = i < n ? cr * n + i : (2 * c.cp - 1 - cr) * n + (i - n);
      ASSERT_EQ(s->packed_row(i), want) << "worker " << r << " home row " << i;
      ASSERT_EQ(s->home_row(want), i);
      if (want < tokens) {
        EXPECT_EQ(want_tokens, i) << "a token row after padding";
        ++want_tokens;
      }
    }
    EXPECT_EQ(s->home_tokens, want_tokens) << "worker " << r;
  }
}

// Relayed inputs run symbolically like direct ones: every case relays
// something (else the test would prove nothing), the stage lands before
// the main exchange reads it, and every label ends where plain attention
// puts it.
TEST(RankSchedule, RelayedInputsRunSymbolically) {
  for (int world : {4, 8}) {
    for (const ExecCase& c : exec_test::relay_cases(world)) {
      const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
      PlanConfig cfg = exec_test::case_config(c);
      auto mode = parse_plan_mode(c.mode);
      ASSERT_TRUE(mode.ok());
      cfg.mode = *mode;
      auto plan = make_plan(pool, cfg);
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      EXPECT_TRUE(plan_relays(*plan).any()) << c.name() << ": nothing relayed";
      check_case(c, world, {.relay = true});
      check_case(c, world, {.read_home_in_place = false, .relay = true});
    }
  }
}

// The relay rule against brute force on its own terms: per chunk and node,
// no NIC ends above the node's unrelayed maximum, the maximum never rises,
// pairs inside a node and pairs without inputs stay direct, relays stay on
// the sender's node, and the table is the same on every call.
// The relay rule of relay.hpp read literally, per chunk and node: the
// node's pairs largest first (ties by src, dst); while the busiest NIC
// outweighs the chunk's busiest cross-node receiver, move the first pair on
// it that leaves it above the idlest NIC onto the idlest.
std::map<std::tuple<int, int, int>, int> relays_by_the_rule(const std::vector<std::int64_t>& in, int W, int M, int G,
                                                             std::vector<std::int64_t>& direct,
                                                             std::vector<std::int64_t>& relayed) {
  std::map<std::tuple<int, int, int>, int> out;
  for (int m = 0; m < M; ++m) {
    auto bytes = [&](int s, int t) { return in[(static_cast<std::size_t>(m) * W + s) * W + t]; };
    std::int64_t floor = 0;
    for (int t = 0; t < W; ++t) {
      std::int64_t r = 0;
      for (int s = 0; s < W; ++s) r += s / G != t / G ? bytes(s, t) : 0;
      floor = std::max(floor, r);
    }
    std::int64_t most_direct = 0, most_relayed = 0;
    for (int n0 = 0; n0 < W; n0 += G) {
      struct P {
        std::int64_t b;
        int s, t, via;
      };
      std::vector<P> ps;
      std::vector<std::int64_t> load(static_cast<std::size_t>(std::min(W, n0 + G) - n0), 0);
      for (int s = n0; s < n0 + static_cast<int>(load.size()); ++s) {
        for (int t = 0; t < W; ++t) {
          if (s / G == t / G || bytes(s, t) == 0) continue;
          ps.push_back({bytes(s, t), s, t, s});
          load[static_cast<std::size_t>(s - n0)] += bytes(s, t);
        }
      }
      most_direct = std::max(most_direct, *std::max_element(load.begin(), load.end()));
      std::stable_sort(ps.begin(), ps.end(), [](const P& a, const P& b) { return a.b > b.b; });
      for (std::size_t guard = 0; guard < 4 * ps.size() + 16; ++guard) {
        const auto hi = std::max_element(load.begin(), load.end()) - load.begin();
        const auto lo = std::min_element(load.begin(), load.end()) - load.begin();
        if (load[static_cast<std::size_t>(hi)] <= floor) break;
        P* pick = nullptr;
        for (P& p : ps) {
          if (p.via == n0 + hi && load[static_cast<std::size_t>(lo)] + p.b < load[static_cast<std::size_t>(hi)]) {
            pick = &p;
            break;
          }
        }
        if (pick == nullptr) break;
        load[static_cast<std::size_t>(hi)] -= pick->b;
        load[static_cast<std::size_t>(lo)] += pick->b;
        pick->via = n0 + static_cast<int>(lo);
      }
      most_relayed = std::max(most_relayed, *std::max_element(load.begin(), load.end()));
      for (const P& p : ps) {
        if (p.via != p.s) out[{m, p.s, p.t}] = p.via;
      }
    }
    direct.push_back(most_direct);
    relayed.push_back(most_relayed);
  }
  return out;
}

// plan_relays against the rule read literally, on random byte matrices
// with many equal sizes (the tie order) and empty pairs.
TEST(RelayTable, MovesWhatTheRuleReadLiterallyMoves) {
  std::uint64_t state = 38;
  int relayed_pairs = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int G = 1 + static_cast<int>(splitmix64_next(state) % 4), W = G * (2 + static_cast<int>(splitmix64_next(state) % 4));
    const int M = 1 + static_cast<int>(splitmix64_next(state) % 3);
    std::vector<std::int64_t> in(static_cast<std::size_t>(M) * W * W, 0);
    // Each node's first GPU sends the most: its NIC is the one to relieve.
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::uint64_t r = splitmix64_next(state);
      const int src = static_cast<int>(i / static_cast<std::size_t>(W)) % W;
      const std::int64_t heavy = src % G == 0 ? 16 : 1;
      in[i] = r % 3 == 0 ? 0 : heavy * static_cast<std::int64_t>(1 + (r >> 8) % (trial % 2 == 0 ? 4 : 1000)) * 64;
    }
    std::vector<std::int64_t> direct, relayed;
    const auto want = relays_by_the_rule(in, W, M, G, direct, relayed);
    const RelayTable got = plan_relays(in, W, M, G);
    SCOPED_TRACE("trial " + std::to_string(trial));
    EXPECT_EQ(got.relayed_pairs(), static_cast<std::int64_t>(want.size()));
    for (int m = 0; m < M; ++m) {
      for (int s = 0; s < W; ++s) {
        for (int t = 0; t < W; ++t) {
          const auto it = want.find({m, s, t});
          EXPECT_EQ(got.via(m, s, t), it == want.end() ? s : it->second) << m << " " << s << " " << t;
        }
      }
    }
    EXPECT_EQ(got.busiest_nic_direct, direct);
    EXPECT_EQ(got.busiest_nic_relayed, relayed);
    relayed_pairs += static_cast<int>(want.size());
  }
  EXPECT_GT(relayed_pairs, 100);
}

TEST(RelayTable, BalancesEachNodesNicsWithoutRaisingItsMaximum) {
  for (int world : {4, 8}) {
    for (const ExecCase& c : exec_test::relay_cases(world)) {
      SCOPED_TRACE(c.name());
      const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
      PlanConfig cfg = exec_test::case_config(c);
      cfg.mode = *parse_plan_mode(c.mode);
      auto plan = make_plan(pool, cfg);
      ASSERT_TRUE(plan.ok());
      const RelayTable r = plan_relays(*plan), again = plan_relays(*plan);
      const int W = plan->num_workers(), G = cfg.topology.gpus_per_node;
      for (int m = 0; m < cfg.chunks; ++m) {
        std::vector<std::int64_t> before(static_cast<std::size_t>(W), 0), after(before), received(before);
        std::vector<bool> node_relays(static_cast<std::size_t>(W), false);
        for (int s = 0; s < W; ++s) {
          for (int t = 0; t < W; ++t) {
            ASSERT_EQ(r.via(m, s, t), again.via(m, s, t));
            std::int64_t bytes = 0;
            for (const Transfer& x : plan->chunk_transfers(m, s, t))
              if (x.kind != TransferKind::kO) bytes += x.bytes;
            const int v = r.via(m, s, t);
            EXPECT_EQ(v / G, s / G) << "a relay off the sender's node";
            if (s / G == t / G || bytes == 0) {
              EXPECT_EQ(v, s) << "relayed inside a node, or nothing to relay";
              continue;
            }
            before[static_cast<std::size_t>(s)] += bytes;
            after[static_cast<std::size_t>(v)] += bytes;
            received[static_cast<std::size_t>(t)] += bytes;
            if (v != s) node_relays[static_cast<std::size_t>(s / G)] = true;
          }
        }
        for (int n = 0; n < W; n += G) {
          const auto b = before.begin() + n, e = before.begin() + std::min(W, n + G);
          const std::int64_t old_max = *std::max_element(b, e);
          const std::int64_t new_max = *std::max_element(after.begin() + n, after.begin() + std::min(W, n + G));
          EXPECT_LE(new_max, old_max) << "chunk " << m << " node " << n / G;
          // A node relays only while its busiest NIC outweighs the chunk's
          // busiest receiver.
          if (node_relays[static_cast<std::size_t>(n / G)]) {
            EXPECT_GT(old_max, *std::max_element(received.begin(), received.end())) << "chunk " << m << " node " << n / G;
          }
        }
        // The table's own account of the busiest NIC, before and after.
        EXPECT_EQ(r.busiest_nic_direct[static_cast<std::size_t>(m)], *std::max_element(before.begin(), before.end()));
        EXPECT_EQ(r.busiest_nic_relayed[static_cast<std::size_t>(m)], *std::max_element(after.begin(), after.end()));
      }
    }
  }
}

TEST(RankSchedule, IsAPureFunctionOfThePlan) {
  ExecCase c;
  auto pool = exec_test::random_pool(5, 2, c.seq_len);
  auto plan = make_plan(pool, exec_test::case_config(c));
  ASSERT_TRUE(plan.ok());
  for (int r = 0; r < 4; ++r) {
    auto a = make_rank_schedule(*plan, r), b = make_rank_schedule(*plan, r);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->compute_q_vectors, b->compute_q_vectors);
    EXPECT_EQ(a->fragments.size(), b->fragments.size());
    for (int p = 0; p < 4; ++p)
      for (int m = 0; m < a->chunks; ++m) EXPECT_EQ(a->exchange(static_cast<Phase>(p), m).send_bytes, b->exchange(static_cast<Phase>(p), m).send_bytes);
  }
  EXPECT_FALSE(make_rank_schedule(*plan, 4).ok());
  EXPECT_FALSE(make_rank_schedule(*plan, -1).ok());
}

}  // namespace
}  // namespace libra
