// make_rank_program: a schedule's segments laid out as messages and flattened
// into moves (libra/program.hpp). Every position is a prefix sum over the
// schedule's lists in their own order, so the sender's gather and the
// receiver's scatter of the same segment land on the same bytes.
#include "libra/program.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace libra {

namespace {

bool is_in(Phase p) { return p == Phase::kFwdIn || p == Phase::kBwdIn; }

struct Layout {
  // [class][rank]: first head vector of the (rank, class) piece in the class
  // message, and first byte of it in the byte message.
  std::array<std::vector<std::int64_t>, kNumWireClasses> vector0, byte0;
};

// Counts, displacements and piece starts of one side of an exchange.
Layout lay_out(const RankSchedule& s, const RankProgram& p, const std::vector<std::vector<Segment>>& lists,
               std::array<std::vector<std::int64_t>, kNumWireClasses>& vectors, std::vector<std::int64_t>& bytes,
               std::vector<std::int64_t>& displs, std::int64_t& total) {
  const auto W = static_cast<std::size_t>(s.workers);
  Layout l;
  for (int c = 0; c < kNumWireClasses; ++c) {
    vectors[static_cast<std::size_t>(c)].assign(W, 0);
    l.vector0[static_cast<std::size_t>(c)].assign(W, 0);
    l.byte0[static_cast<std::size_t>(c)].assign(W, 0);
  }
  bytes.assign(W, 0);
  displs.assign(W, 0);
  for (std::size_t g = 0; g < W; ++g) {
    if (static_cast<int>(g) == p.rank) continue;  // kept, never sent
    for (const Segment& seg : lists[static_cast<std::size_t>(p.order[g])]) {
      vectors[static_cast<std::size_t>(wire_class(seg.field))][g] += seg.at.count();
    }
  }
  std::int64_t byte = 0;
  std::array<std::int64_t, kNumWireClasses> vec{};
  for (std::size_t g = 0; g < W; ++g) {
    displs[g] = byte;
    for (std::size_t c = 0; c < kNumWireClasses; ++c) {
      l.byte0[c][g] = byte;
      l.vector0[c][g] = vec[c];
      byte += vectors[c][g] * p.class_vector_bytes[c];
      vec[c] += vectors[c][g];
    }
    bytes[g] = byte - displs[g];
  }
  total = byte;
  return l;
}

// The moves of one side's segments to or from rank g's pieces, in segment
// order; `wire_src` true for receipts.
void wire_moves(const RankSchedule& s, const RankProgram& p, const Layout& l, const std::vector<Segment>& segs, int g,
                int chunk, bool receipt, Loc buffer, std::vector<Move>& out) {
  std::array<std::int64_t, kNumWireClasses> vec{}, byte{};
  for (std::size_t c = 0; c < kNumWireClasses; ++c) {
    vec[c] = l.vector0[c][static_cast<std::size_t>(g)];
    byte[c] = l.byte0[c][static_cast<std::size_t>(g)];
  }
  for (const Segment& seg : segs) {
    const auto c = static_cast<std::size_t>(wire_class(seg.field));
    Move mv;
    mv.field = seg.field;
    mv.peer = g;
    mv.chunk = chunk;
    mv.rows = seg.at.rows;
    mv.run = seg.at.run;
    mv.wire_byte = byte[c];
    if (receipt) {
      mv.src = Loc::kWire;
      mv.dst = seg.stage ? Loc::kStage : buffer;
      mv.add = seg.add;
      mv.src_offset = vec[c];
      mv.src_stride = seg.at.run;
      mv.dst_offset = seg.at.offset;
      mv.dst_stride = seg.at.stride;
    } else {
      mv.src = seg.stage ? Loc::kStage : buffer;
      mv.dst = Loc::kWire;
      mv.src_offset = seg.at.offset;
      mv.src_stride = seg.at.stride;
      mv.dst_offset = vec[c];
      mv.dst_stride = seg.at.run;
    }
    vec[c] += seg.at.count();
    byte[c] += seg.at.count() * p.class_vector_bytes[c];
    if (mv.rows > 0 && mv.run > 0) out.push_back(mv);
  }
  (void)s;
}

// The data a worker sends itself: segment k of its send list to segment k of
// its receive list (validate_schedule checks they match).
void local_moves(const Exchange& x, int worker, int chunk, Loc from, Loc to, int rank, std::vector<Move>& out) {
  const auto& a = x.send[static_cast<std::size_t>(worker)];
  const auto& b = x.recv[static_cast<std::size_t>(worker)];
  for (std::size_t k = 0; k < a.size() && k < b.size(); ++k) {
    Move mv;
    mv.field = a[k].field;
    mv.src = from;
    mv.dst = to;
    mv.add = b[k].add;
    mv.peer = rank;
    mv.chunk = chunk;
    mv.rows = a[k].at.rows;
    mv.run = a[k].at.run;
    mv.src_offset = a[k].at.offset;
    mv.src_stride = a[k].at.stride;
    mv.dst_offset = b[k].at.offset;
    mv.dst_stride = b[k].at.stride;
    if (mv.rows > 0 && mv.run > 0) out.push_back(mv);
  }
}

}  // namespace

Result<RankProgram> make_rank_program(const RankSchedule& s, std::span<const int> order) {
  RankProgram p;
  p.worker = s.worker;
  p.workers = s.workers;
  p.chunks = s.chunks;
  if (order.empty()) {
    for (int g = 0; g < s.workers; ++g) p.order.push_back(g);
  } else {
    p.order.assign(order.begin(), order.end());
  }
  std::vector<int> sorted = p.order;
  std::sort(sorted.begin(), sorted.end());
  bool perm = sorted.size() == static_cast<std::size_t>(s.workers);
  for (std::size_t i = 0; perm && i < sorted.size(); ++i) perm = sorted[i] == static_cast<int>(i);
  if (!perm) {
    return invalid_input(fmt::format("program: the rank order must be a permutation of the schedule's {} workers",
                                     s.workers));
  }
  p.rank = static_cast<int>(std::find(p.order.begin(), p.order.end(), s.worker) - p.order.begin());
  p.class_vector_bytes = {s.head_dim * dtype_bytes(s.dtype), 4, s.head_dim * 4};
  std::vector<int> rank_of(static_cast<std::size_t>(s.workers));
  for (int g = 0; g < s.workers; ++g) rank_of[static_cast<std::size_t>(p.order[static_cast<std::size_t>(g)])] = g;

  for (int pass = 0; pass < 2; ++pass) {
    PassProgram& pp = p.passes[static_cast<std::size_t>(pass)];
    pp.in_phase = pass == 0 ? Phase::kFwdIn : Phase::kBwdIn;
    pp.out_phase = pass == 0 ? Phase::kFwdOut : Phase::kBwdOut;
    std::vector<Layout> out_recv(static_cast<std::size_t>(s.chunks));
    for (Phase ph : {pp.in_phase, pp.out_phase}) {
      const bool in = is_in(ph);
      auto& per_chunk = in ? pp.in : pp.out;
      per_chunk.resize(static_cast<std::size_t>(s.chunks));
      for (int m = 0; m < s.chunks; ++m) {
        const Exchange& x = s.exchange(ph, m);
        ExchangeProgram& e = per_chunk[static_cast<std::size_t>(m)];
        const Layout send = lay_out(s, p, x.send, e.send_vectors, e.send_bytes, e.send_displs, e.total_send_bytes);
        const Layout recv = lay_out(s, p, x.recv, e.recv_vectors, e.recv_bytes, e.recv_displs, e.total_recv_bytes);
        const Loc send_buf = in ? Loc::kHome : Loc::kCompute;
        for (int g = 0; g < s.workers; ++g) {
          if (g == p.rank) continue;
          const auto w = static_cast<std::size_t>(p.order[static_cast<std::size_t>(g)]);
          wire_moves(s, p, send, x.send[w], g, m, false, send_buf, e.gather);
          if (in) wire_moves(s, p, recv, x.recv[w], g, m, true, Loc::kCompute, e.scatter);
        }
        if (in) {
          local_moves(x, s.worker, m, Loc::kHome, Loc::kCompute, p.rank, e.local);
        } else {
          out_recv[static_cast<std::size_t>(m)] = recv;
        }
      }
    }
    if (s.relayed) {
      pp.stage.resize(static_cast<std::size_t>(s.chunks));
      for (int m = 0; m < s.chunks; ++m) {
        const Exchange& x = s.stage_exchange(static_cast<Pass>(pass), m);
        ExchangeProgram& e = pp.stage[static_cast<std::size_t>(m)];
        const Layout send = lay_out(s, p, x.send, e.send_vectors, e.send_bytes, e.send_displs, e.total_send_bytes);
        const Layout recv = lay_out(s, p, x.recv, e.recv_vectors, e.recv_bytes, e.recv_displs, e.total_recv_bytes);
        for (int g = 0; g < s.workers; ++g) {
          if (g == p.rank) continue;  // a worker never relays for itself
          const auto w = static_cast<std::size_t>(p.order[static_cast<std::size_t>(g)]);
          wire_moves(s, p, send, x.send[w], g, m, false, Loc::kHome, e.gather);
          wire_moves(s, p, recv, x.recv[w], g, m, true, Loc::kStage, e.scatter);
        }
      }
    }
    for (auto [peer, m] : s.apply_order) {
      const Exchange& x = s.exchange(pp.out_phase, m);
      if (peer == s.worker) {
        local_moves(x, s.worker, m, Loc::kCompute, Loc::kHome, p.rank, pp.apply);
      } else {
        wire_moves(s, p, out_recv[static_cast<std::size_t>(m)], x.recv[static_cast<std::size_t>(peer)],
                   rank_of[static_cast<std::size_t>(peer)], m, true, Loc::kHome, pp.apply);
      }
    }
  }
  return p;
}

}  // namespace libra
