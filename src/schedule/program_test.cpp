// The flat programs of all W workers, run symbolically both ways an engine
// reads them (the byte message of the C++ engine, the class messages of
// libra.torch) under a shuffled rank order, against the schedule's segments
// run directly: every buffer must end up with the same labels, fp32 sums
// (here wrapping integer sums of labels) included, applied in the same order.
#include "libra/program.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <random>

#include "exec/exec_test_bodies.hpp"
#include "libra/splitmix64.hpp"

namespace libra {
namespace {

using exec_test::ExecCase;
using Buf = std::vector<std::uint64_t>;
using Bufs = std::vector<std::array<std::array<Buf, kNumFields>, 3>>;  // [worker][home 0 / compute 1 / stage 2][field]

Buf& at(Bufs& b, int w, Loc l, Field f) {
  const std::size_t i = l == Loc::kHome ? 0 : l == Loc::kStage ? 2 : 1;
  return b[static_cast<std::size_t>(w)][i][static_cast<std::size_t>(f)];
}

std::size_t idx(std::int64_t offset, std::int64_t stride, std::int64_t i, std::int64_t j, const Buf& b) {
  const std::int64_t x = offset + i * stride + j;
  EXPECT_TRUE(x >= 0 && x < static_cast<std::int64_t>(b.size())) << x << " outside " << b.size();
  return static_cast<std::size_t>(std::clamp<std::int64_t>(x, 0, static_cast<std::int64_t>(b.size()) - 1));
}

Bufs fresh(const std::vector<RankSchedule>& s) {
  Bufs b(s.size());
  for (std::size_t w = 0; w < s.size(); ++w) {
    for (int f = 0; f < kNumFields; ++f) {
      const Field fl = static_cast<Field>(f);
      Buf& h = b[w][0][static_cast<std::size_t>(f)];
      h.resize(static_cast<std::size_t>(s[w].home_vectors(fl)));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = splitmix64_mix((w << 40) ^ (static_cast<std::uint64_t>(f) << 32) ^ i);
      b[w][1][static_cast<std::size_t>(f)].assign(static_cast<std::size_t>(s[w].compute_vectors(fl)), 0);
      b[w][2][static_cast<std::size_t>(f)].assign(static_cast<std::size_t>(s[w].stage_vectors(fl)), 0);
    }
  }
  return b;
}

// The reference: the schedule's segments, paired by position.
// `staging`: the pass's stage exchange of chunk m instead of (p, m).
void run_segments(const std::vector<RankSchedule>& s, Phase p, int m, Bufs& b,
                  std::map<std::pair<int, int>, Buf>* later, bool staging = false) {
  const bool in = p == Phase::kFwdIn || p == Phase::kBwdIn;
  const int W = static_cast<int>(s.size());
  auto of = [&](int w) -> const Exchange& {
    const RankSchedule& x = s[static_cast<std::size_t>(w)];
    return staging ? x.stage_exchange(p == Phase::kFwdIn ? Pass::kForward : Pass::kBackward, m) : x.exchange(p, m);
  };
  for (int a = 0; a < W; ++a) {
    for (int d = 0; d < W; ++d) {
      Buf wire;
      for (const Segment& x : of(a).send[static_cast<std::size_t>(d)]) {
        Buf& src = at(b, a, x.stage ? Loc::kStage : in ? Loc::kHome : Loc::kCompute, x.field);
        for (std::int64_t i = 0; i < x.at.rows; ++i)
          for (std::int64_t j = 0; j < x.at.run; ++j) wire.push_back(src[idx(x.at.offset, x.at.stride, i, j, src)]);
      }
      if (!in) {
        (*later)[{d * W + a, m}] = wire;
        continue;
      }
      std::size_t k = 0;
      for (const Segment& y : of(d).recv[static_cast<std::size_t>(a)]) {
        Buf& dst = at(b, d, y.stage ? Loc::kStage : Loc::kCompute, y.field);
        for (std::int64_t i = 0; i < y.at.rows; ++i)
          for (std::int64_t j = 0; j < y.at.run; ++j) dst[idx(y.at.offset, y.at.stride, i, j, dst)] = wire.at(k++);
      }
    }
  }
}

void apply_segments(const std::vector<RankSchedule>& s, Phase p, Bufs& b, std::map<std::pair<int, int>, Buf>& later) {
  const int W = static_cast<int>(s.size());
  for (int d = 0; d < W; ++d) {
    for (auto [a, m] : s[static_cast<std::size_t>(d)].apply_order) {
      const Buf& wire = later.at({d * W + a, m});
      std::size_t k = 0;
      for (const Segment& y : s[static_cast<std::size_t>(d)].exchange(p, m).recv[static_cast<std::size_t>(a)]) {
        Buf& dst = at(b, d, Loc::kHome, y.field);
        for (std::int64_t i = 0; i < y.at.rows; ++i)
          for (std::int64_t j = 0; j < y.at.run; ++j) {
            std::uint64_t& v = dst[idx(y.at.offset, y.at.stride, i, j, dst)];
            v = y.add ? v + wire.at(k++) : wire.at(k++);
          }
      }
    }
  }
}

// A message as the engines see it: byte view (one label per vector, at its
// first byte) or class view (one label per vector per class).
struct Msg {
  std::vector<std::uint64_t> bytes;
  std::array<Buf, kNumWireClasses> cls;
};

void move(const Move& mv, Bufs& b, int w, const RankProgram& prog, const Msg* recv, Msg* send, bool byte_view) {
  const std::int64_t vb = prog.class_vector_bytes[static_cast<std::size_t>(wire_class(mv.field))];
  const auto c = static_cast<std::size_t>(wire_class(mv.field));
  for (std::int64_t i = 0; i < mv.rows; ++i) {
    for (std::int64_t j = 0; j < mv.run; ++j) {
      const std::int64_t k = i * mv.run + j;  // vector k of the move on the wire side
      std::uint64_t v = 0;
      if (mv.src == Loc::kWire) {
        v = byte_view ? recv->bytes.at(static_cast<std::size_t>(mv.wire_byte + k * vb))
                      : recv->cls[c].at(static_cast<std::size_t>(mv.src_offset + k));
      } else {
        Buf& src = at(b, w, mv.src, mv.field);
        v = src[idx(mv.src_offset, mv.src_stride, i, j, src)];
      }
      if (mv.dst == Loc::kWire) {
        if (byte_view) {
          send->bytes.at(static_cast<std::size_t>(mv.wire_byte + k * vb)) = v;
        } else {
          send->cls[c].at(static_cast<std::size_t>(mv.dst_offset + k)) = v;
        }
      } else {
        Buf& dst = at(b, w, mv.dst, mv.field);
        std::uint64_t& d = dst[idx(mv.dst_offset, mv.dst_stride, i, j, dst)];
        d = mv.add ? d + v : v;
      }
    }
  }
}

// Posts (phase, chunk) on every worker: gathers and delivers; returns what
// each worker received. Checks every send count against its receipt.
std::vector<Msg> exchange(const std::vector<RankProgram>& prog, const std::vector<const ExchangeProgram*>& x, Bufs& b,
                          bool byte_view) {
  const int W = static_cast<int>(prog.size());
  std::vector<Msg> sent(prog.size()), got(prog.size());
  for (int w = 0; w < W; ++w) {
    const ExchangeProgram& e = *x[static_cast<std::size_t>(w)];
    sent[static_cast<std::size_t>(w)].bytes.assign(static_cast<std::size_t>(e.total_send_bytes), 0);
    got[static_cast<std::size_t>(w)].bytes.assign(static_cast<std::size_t>(e.total_recv_bytes), 0);
    for (std::size_t c = 0; c < kNumWireClasses; ++c) {
      const auto sum = [](const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); };
      sent[static_cast<std::size_t>(w)].cls[c].assign(static_cast<std::size_t>(sum(e.send_vectors[c])), 0);
      got[static_cast<std::size_t>(w)].cls[c].assign(static_cast<std::size_t>(sum(e.recv_vectors[c])), 0);
    }
    for (const Move& mv : e.gather) move(mv, b, w, prog[static_cast<std::size_t>(w)], nullptr, &sent[static_cast<std::size_t>(w)], byte_view);
  }
  // Worker a at rank ga sends to worker d at rank gd (each program has its own order).
  for (int a = 0; a < W; ++a) {
    for (int d = 0; d < W; ++d) {
      const RankProgram &pa = prog[static_cast<std::size_t>(a)], &pd = prog[static_cast<std::size_t>(d)];
      const auto gd = static_cast<std::size_t>(std::find(pa.order.begin(), pa.order.end(), d) - pa.order.begin());
      const auto ga = static_cast<std::size_t>(std::find(pd.order.begin(), pd.order.end(), a) - pd.order.begin());
      const ExchangeProgram &ea = *x[static_cast<std::size_t>(a)], &ed = *x[static_cast<std::size_t>(d)];
      EXPECT_EQ(ea.send_bytes[gd], ed.recv_bytes[ga]) << a << " -> " << d;
      if (ea.send_bytes[gd] != ed.recv_bytes[ga]) continue;
      std::copy_n(sent[static_cast<std::size_t>(a)].bytes.begin() + ea.send_displs[gd], ea.send_bytes[gd],
                  got[static_cast<std::size_t>(d)].bytes.begin() + ed.recv_displs[ga]);
      for (std::size_t c = 0; c < kNumWireClasses; ++c) {
        EXPECT_EQ(ea.send_vectors[c][gd], ed.recv_vectors[c][ga]) << a << " -> " << d << " class " << c;
        if (ea.send_vectors[c][gd] != ed.recv_vectors[c][ga]) continue;
        const auto s0 = std::accumulate(ea.send_vectors[c].begin(), ea.send_vectors[c].begin() + static_cast<std::ptrdiff_t>(gd), std::int64_t{0});
        const auto r0 = std::accumulate(ed.recv_vectors[c].begin(), ed.recv_vectors[c].begin() + static_cast<std::ptrdiff_t>(ga), std::int64_t{0});
        std::copy_n(sent[static_cast<std::size_t>(a)].cls[c].begin() + s0, ea.send_vectors[c][gd],
                    got[static_cast<std::size_t>(d)].cls[c].begin() + r0);
      }
    }
  }
  return got;
}

void check_case(const ExecCase& c, int W, std::uint64_t seed, ScheduleOptions options = {}) {
  SCOPED_TRACE(c.name());
  const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  std::optional<Plan> plan;
  if (c.mode != "ulysses-direct") {
    auto mode = parse_plan_mode(c.mode);
    ASSERT_TRUE(mode.ok());
    cfg.mode = *mode;
    auto p = make_plan(pool, cfg);
    ASSERT_TRUE(p.ok()) << p.error().message();
    plan.emplace(*p);
  }
  std::vector<RankSchedule> s;
  std::vector<RankProgram> prog;
  std::vector<int> order(static_cast<std::size_t>(W));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int r = 0; r < W; ++r) {
    auto x = plan ? make_rank_schedule(*plan, r, options) : make_ulysses_schedule(pool, cfg, r, options);
    ASSERT_TRUE(x.ok()) << x.error().message();
    s.push_back(std::move(*x));
  }
  std::shuffle(order.begin(), order.end(), rng);
  for (int r = 0; r < W; ++r) {
    auto p = make_rank_program(s[static_cast<std::size_t>(r)], order);
    ASSERT_TRUE(p.ok()) << p.error().message();
    EXPECT_EQ(p->order[static_cast<std::size_t>(p->rank)], r);
    prog.push_back(std::move(*p));
  }
  const int M = s[0].chunks;
  for (bool byte_view : {true, false}) {
    for (Pass pass : {Pass::kForward, Pass::kBackward}) {
      SCOPED_TRACE(std::string(byte_view ? "byte" : "class") + (pass == Pass::kForward ? " forward" : " backward"));
      const PassProgram& p0 = prog[0].pass(pass);
      Bufs want = fresh(s), got = fresh(s);
      std::map<std::pair<int, int>, Buf> later;
      std::vector<std::vector<Msg>> outs;
      for (int m = 0; m < M; ++m) {
        std::vector<const ExchangeProgram*> x;
        if (s[0].relayed) {
          // The stage lands in the staging buffers before the main exchange.
          run_segments(s, p0.in_phase, m, want, nullptr, /*staging=*/true);
          for (const RankProgram& p : prog) x.push_back(&p.pass(pass).stage.at(static_cast<std::size_t>(m)));
          std::vector<Msg> staged = exchange(prog, x, got, byte_view);
          for (int w = 0; w < W; ++w) {
            EXPECT_TRUE(x[static_cast<std::size_t>(w)]->local.empty());
            for (const Move& mv : x[static_cast<std::size_t>(w)]->scatter) {
              EXPECT_EQ(mv.dst, Loc::kStage);
              move(mv, got, w, prog[static_cast<std::size_t>(w)], &staged[static_cast<std::size_t>(w)], nullptr, byte_view);
            }
          }
          x.clear();
        }
        run_segments(s, p0.in_phase, m, want, nullptr);
        for (const RankProgram& p : prog) x.push_back(&p.pass(pass).in[static_cast<std::size_t>(m)]);
        std::vector<Msg> in = exchange(prog, x, got, byte_view);
        for (int w = 0; w < W; ++w) {
          for (const Move& mv : x[static_cast<std::size_t>(w)]->local) move(mv, got, w, prog[static_cast<std::size_t>(w)], nullptr, nullptr, byte_view);
          for (const Move& mv : x[static_cast<std::size_t>(w)]->scatter) {
            move(mv, got, w, prog[static_cast<std::size_t>(w)], &in[static_cast<std::size_t>(w)], nullptr, byte_view);
          }
        }
        // The kernel's writes, a function of the inputs a compute row holds
        // (stable once they arrived, as real outputs are final once their
        // chunk computed: the outputs kept are read only at the end).
        for (Bufs* b : {&want, &got}) {
          for (int w = 0; w < W; ++w) {
            for (Field f : {Field::kO, Field::kLse, Field::kDq, Field::kDk, Field::kDv}) {
              Buf& out = at(*b, w, Loc::kCompute, f);
              const Buf& q = at(*b, w, Loc::kCompute, is_kv_field(f) ? Field::kK : Field::kQ);
              for (std::size_t i = 0; i < out.size(); ++i) out[i] = splitmix64_mix(q[i] + static_cast<std::uint64_t>(f));
            }
          }
        }
        run_segments(s, p0.out_phase, m, want, &later);
        x.clear();
        for (const RankProgram& p : prog) x.push_back(&p.pass(pass).out[static_cast<std::size_t>(m)]);
        outs.push_back(exchange(prog, x, got, byte_view));
      }
      apply_segments(s, p0.out_phase, want, later);
      for (int w = 0; w < W; ++w) {
        for (const Move& mv : prog[static_cast<std::size_t>(w)].pass(pass).apply) {
          move(mv, got, w, prog[static_cast<std::size_t>(w)], &outs[static_cast<std::size_t>(mv.chunk)][static_cast<std::size_t>(w)], nullptr, byte_view);
        }
      }
      for (int w = 0; w < W; ++w)
        for (int l = 0; l < 3; ++l)
          for (int f = 0; f < kNumFields; ++f)
            EXPECT_EQ(got[static_cast<std::size_t>(w)][static_cast<std::size_t>(l)][static_cast<std::size_t>(f)],
                      want[static_cast<std::size_t>(w)][static_cast<std::size_t>(l)][static_cast<std::size_t>(f)])
                << "worker " << w << (l == 2 ? " stage " : l ? " compute " : " home ") << field_name(static_cast<Field>(f));
    }
  }
}

TEST(RankProgram, CarriesOutTheScheduleInBothMessageViewsUnderAShuffledRankOrder) {
  std::uint64_t seed = 1;
  for (int W : {4, 8}) {
    for (const ExecCase& c : exec_test::case_matrix(W)) check_case(c, W, seed++);
  }
}

TEST(RankProgram, CarriesOutRelayedSchedulesInBothMessageViews) {
  std::uint64_t seed = 100;
  for (int W : {4, 8}) {
    for (const ExecCase& c : exec_test::relay_cases(W)) check_case(c, W, seed++, {.relay = true});
  }
}

TEST(RankProgram, SendsNothingToItselfAndRefusesABadOrder) {
  const ExecCase c = exec_test::case_matrix(4).front();
  const std::vector<PackedSequence> pool = exec_test::random_pool(c.pool_seed, c.pool_size, c.seq_len);
  PlanConfig cfg = exec_test::case_config(c);
  auto mode = parse_plan_mode(c.mode == "ulysses-direct" ? "ulysses" : c.mode);
  ASSERT_TRUE(mode.ok());
  cfg.mode = *mode;
  auto plan = make_plan(pool, cfg);
  ASSERT_TRUE(plan.ok());
  auto s = make_rank_schedule(*plan, 1);
  ASSERT_TRUE(s.ok());
  auto p = make_rank_program(*s);
  ASSERT_TRUE(p.ok());
  for (const PassProgram& pp : p->passes)
    for (const auto* xs : {&pp.in, &pp.out})
      for (const ExchangeProgram& x : *xs) {
        EXPECT_EQ(x.send_bytes[1], 0);
        EXPECT_EQ(x.recv_bytes[1], 0);
        for (const Move& mv : x.gather) EXPECT_NE(mv.peer, 1);
      }
  const std::vector<int> dup = {0, 0, 2, 3};
  auto bad = make_rank_program(*s, dup);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("permutation"), std::string::npos);
}

}  // namespace
}  // namespace libra
