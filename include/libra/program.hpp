// libra/program.hpp: the flat exchange program of a rank schedule, the one
// thing every engine carries out.
//
// Defines `libra::RankProgram`, derived by a pure function from a
// RankSchedule (libra/schedule.hpp): per pass and pipeline chunk, the moves
// that gather each send message from the buffers, scatter each receipt into
// them, copy the data a worker keeps for itself, and, for the Out phases,
// every chunk's receipts in the schedule's fixed application order. A move
// is plain integers (a field, where it reads and writes, rows x run head
// vectors at an offset and stride on each side), so the C++ engine
// (src/exec/executor.cpp) carries it out with memcpy and fp32 adds, and
// libra.torch expands it into index tensors for index_select / index_copy_ /
// index_add_ on any device (python/src/bind_schedule.cpp). Neither derives
// anything from the schedule's segments itself.
//
//   libra::Result<libra::RankSchedule> s = libra::make_rank_schedule(plan, worker);
//   libra::Result<libra::RankProgram> p = libra::make_rank_program(*s);
//   const libra::ExchangeProgram& x = p->pass(libra::Pass::kForward).in[0];
//   for (const libra::Move& mv : x.gather) ...   // buffer -> x's byte message at mv.wire_byte
//
// Messages. A (phase, chunk) message carries head vectors of three element
// classes (wire_class): 0 data (Q, K, V, O, dO: the plan's dtype, head_dim
// wide), 1 LSE (fp32, 1 wide), 2 gradients (dQ, dK, dV: fp32, head_dim
// wide). Two views of the same order:
//   - the byte message (C++ engine, one all-to-all-v per (phase, chunk)):
//     one block per communicator rank in rank order, each block its class-0,
//     class-1, class-2 pieces in that order; counts and displacements in
//     send_bytes / send_displs, recv_bytes / recv_displs;
//   - the class messages (torch, one all_to_all_single per class the phase
//     carries, since a collective takes one element type): class c's pieces
//     of every rank in rank order, counts in send_vectors[c] / recv_vectors[c].
// A move's wire side gives both: wire_byte (byte offset in the byte
// message) and its src_offset or dst_offset (head vector in the class
// message). Within a (rank, class) piece, vectors follow the schedule's
// segment order, which both sides list alike, so every send matches its
// receipt. The data a worker sends itself never travels: its count is 0 and
// `local` moves copy it straight from source to destination.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "libra/schedule.hpp"
#include "libra/status.hpp"

namespace libra {

inline constexpr int kNumWireClasses = 3;
// 0 data, 1 LSE, 2 gradients (see "Messages").
[[nodiscard]] constexpr int wire_class(Field f) {
  return f == Field::kLse ? 1 : (f == Field::kDq || f == Field::kDk || f == Field::kDv) ? 2 : 0;
}

// Where a move reads or writes: the home or compute buffer of its field, or
// the message of its (phase, chunk).
// kStage: the staging buffer of relayed inputs (RankSchedule::relayed).
enum class Loc : std::uint8_t { kHome = 0, kCompute = 1, kWire = 2, kStage = 3 };

// rows x run head vectors of `field`: row i reads run vectors at
// src_offset + i * src_stride and writes them at dst_offset + i * dst_stride
// (dst += src when `add`: fp32 dK/dV partial sums). A wire side's offset is
// its position in the class message (stride = run) and wire_byte its byte
// offset in the byte message; wire_byte is -1 for moves between buffers.
struct Move {
  Field field = Field::kQ;
  Loc src = Loc::kHome, dst = Loc::kCompute;
  bool add = false;
  std::int32_t peer = 0;   // communicator rank the wire side goes to or came from (own rank: local)
  std::int32_t chunk = 0;  // the chunk whose message the wire side is in
  std::int64_t rows = 0, run = 0;
  std::int64_t src_offset = 0, src_stride = 0, dst_offset = 0, dst_stride = 0;
  std::int64_t wire_byte = -1;
  friend bool operator==(const Move&, const Move&) = default;
};

// One (phase, chunk) all-to-all-v of one rank, indexed by communicator rank.
struct ExchangeProgram {
  std::array<std::vector<std::int64_t>, kNumWireClasses> send_vectors, recv_vectors;  // [class][rank]
  std::vector<std::int64_t> send_bytes, send_displs, recv_bytes, recv_displs;        // [rank]
  std::int64_t total_send_bytes = 0, total_recv_bytes = 0;
  std::vector<Move> gather;   // buffers -> send message, when posting
  std::vector<Move> local;    // In phases: the data kept, buffer -> buffer, when posting
  std::vector<Move> scatter;  // In phases: receive message -> compute buffers, after the wait
};

// One pass: in(m) brings chunk m's inputs, out(m) returns its outputs.
struct PassProgram {
  Phase in_phase = Phase::kFwdIn, out_phase = Phase::kFwdOut;
  std::vector<ExchangeProgram> in, out;  // [chunk]
  // Relayed schedules only (else empty): stage(m), home -> staging buffer,
  // must have landed before in(m) is posted (libra/schedule.hpp, Pipeline).
  std::vector<ExchangeProgram> stage;  // [chunk]
  // The Out phase's receipts of every chunk (src kWire, `chunk` naming the
  // message) and the outputs kept (src kCompute), in the schedule's
  // apply_order: fp32 sums do not depend on arrival order.
  std::vector<Move> apply;
};

struct RankProgram {
  int worker = 0, workers = 0, chunks = 1;
  int rank = 0;             // this worker's communicator rank
  std::vector<int> order;   // order[g]: the worker at communicator rank g
  std::array<std::int64_t, kNumWireClasses> class_vector_bytes{};  // bytes of one head vector per class
  std::array<PassProgram, 2> passes;
  const PassProgram& pass(Pass p) const { return passes[static_cast<std::size_t>(p)]; }
};

// The program of schedule `s` on a communicator whose rank g holds worker
// order[g] (empty: rank g = worker g). Pure. Errors when order is not a
// permutation of the schedule's workers.
[[nodiscard]] Result<RankProgram> make_rank_program(const RankSchedule& s, std::span<const int> order = {});

}  // namespace libra
