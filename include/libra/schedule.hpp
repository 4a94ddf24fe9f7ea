// libra/schedule.hpp: the per-rank execution schedule of a plan, as a value.
//
// Defines `libra::RankSchedule`, everything one worker does to run a
// libra::Plan forward and backward, derived by a pure function from the plan
// alone (no communicator, no data): per pass and pipeline chunk m, the bytes
// it exchanges with every peer (one all-to-all-v per (phase, chunk)), where
// each piece of a message comes from and lands in, the kernel calls, the
// order in which returned partial sums are added, and every buffer size.
// The executors (libra/executor.hpp) run it on a Communicator and an
// AttentionBackend; the PyTorch binding turns it into index tensors; tests
// build all W schedules in one process and check them against the plan.
//
//   libra::Result<libra::Plan> plan = libra::make_plan(pool, cfg);
//   libra::Result<libra::RankSchedule> s = libra::make_rank_schedule(*plan, /*worker=*/3);
//   const libra::Exchange& x = s->exchange(libra::Phase::kFwdIn, /*chunk=*/0);
//   for (int peer = 0; peer < s->workers; ++peer)
//     for (const libra::Segment& seg : x.send[peer]) gather(seg.field, seg.at);  // -> x.send_bytes[peer]
//   for (const libra::KernelCall& c : s->calls(libra::Pass::kForward, 0)) run(c, s->call_fragments(c));
//
// ---- Buffers ------------------------------------------------------------
// Every tensor is a row-major array of "head vectors": `width` elements per
// (row, head), width = head_dim for Q, K, V, O, dO, dQ, dK, dV and 1 for LSE.
// All offsets, runs and strides below count head vectors, so one program
// addresses Q, O, dO, dQ and LSE alike (and K, V, dK, dV alike); multiply by
// width * dtype_bytes for bytes.
//
// Home buffers of worker r (= slot * cp + c): THD [L/CP tokens, heads,
// width], the tokens of its slot that the plan's home layout gives CP rank
// c (HomeMap, libra/plan.hpp; contiguous: packed positions [c * L/CP, (c+1)
// * L/CP) = home_row0 .. home_row0 + home_rows), all heads: h_q heads for
// the Q family (Q, O, LSE, dO, dQ), h_kv for the KV family (K, V, dK, dV).
// Head vector (t, h) is at home_row(t) * heads + h (contiguous: home_row(t)
// = t - home_row0). Every segment addressing home rows covers packed rows
// of one home run (HomeSpot), so its rows are consecutive at home.
//
// Compute buffers of worker r: the concatenation of its regions, one per slot
// it computes on. A region packs only the rows the worker needs: for the Q
// family the rows of its tiles (q_rows), for the KV family the tokens of the
// samples they attend to (kv_rows), each a sorted list of runs of slot rows
// [begin, end) stored from packed row `at` on; heads q_heads (Q family, at
// q_offset) and kv_heads (KV family, at kv_offset). Head vector (t, h) of
// the Q family is at q_offset + q_row(t) * q_heads.size() + (h -
// q_heads.begin), q_row(t) = run.at + t - run.begin for the run holding t.
// Sizes: compute_q_vectors and compute_kv_vectors. dK/dV must be zeroed
// before the backward pass (the kernel adds into them).
//
// Data read in place (ScheduleOptions::read_home_in_place, the default): a
// tile computed on its own Q home, and a sample whose tokens all lie in this
// worker's home shard, are not copied at all. Their kernel calls carry
// q_home / kv_home and address the home buffers directly (fragment rows are
// then home rows, home_row(t)); the kernel writes O, LSE, dQ and adds dK/dV
// at home. Only data that crosses workers, or a sample split across home
// shards (whose keys must be contiguous), goes through compute buffers and
// the message to self.
//
// Element types: Q, K, V, O, dO are stored and sent in `dtype`; LSE, dQ, dK
// and dV in fp32 (field_dtype). Home dK/dV are fp32 sums.
//
// ---- Exchanges ------------------------------------------------------------
// Phases: kFwdIn (Q, K, V: home -> compute), kFwdOut (O, LSE: compute ->
// home), kBwdIn (Q, dO, O, LSE, K, V), kBwdOut (dQ assigned; dK, dV added).
// The message to peer p in (phase, chunk m) is the concatenation of
// send[p]'s segments in order, each `at.count()` head vectors of its field;
// the peer's recv[r] lists the same segments (same fields and shapes, same
// order) with its own destination programs. The peer may be r itself (data
// that stays on the worker travels through the same path as a message to
// self). Byte counts per peer are send_bytes / recv_bytes; displacements are
// their prefix sums (send_displs / recv_displs), ready for MPI_Alltoallv,
// NCCL grouped send/recv or torch all_to_all_single.
//
// Pipeline (paper section 6.3), the same loop for both passes: post in(0);
// for m: post in(m+1), wait in(m), unpack, compute calls(m), pack and post
// out(m); then wait every out(m) and unpack them in `apply_order` (fixed:
// peer, then chunk), so fp32 sums of dK/dV do not depend on arrival order.
// A KV head arrives with the chunk of its first use and its dK/dV goes home
// with the chunk of its last (Plan::kv_use, recorded by the tiles stage).
// Relayed (`relayed`): stage(m) must land before in(m) is posted, so the
// loop runs it a chunk ahead: post and wait stage(0), post in(0), post
// stage(1); for m: wait stage(m+1), post in(m+1), post stage(m+2), then as
// above. The staging buffer holds every chunk's relayed inputs apart.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "libra/dtype.hpp"
#include "libra/plan.hpp"
#include "libra/status.hpp"
#include "libra/tensor_view.hpp"

namespace libra {

enum class Field : std::uint8_t { kQ, kK, kV, kO, kLse, kDo, kDq, kDk, kDv };
inline constexpr int kNumFields = 9;
[[nodiscard]] const char* field_name(Field f);  // "Q", "K", "V", "O", "LSE", "dO", "dQ", "dK", "dV"
// K, V, dK, dV: h_kv heads; the others h_q.
[[nodiscard]] constexpr bool is_kv_field(Field f) {
  return f == Field::kK || f == Field::kV || f == Field::kDk || f == Field::kDv;
}
// Element type a field is stored and sent in for a data type `data`.
[[nodiscard]] constexpr DType field_dtype(Field f, DType data) {
  return (f == Field::kLse || f == Field::kDq || f == Field::kDk || f == Field::kDv) ? DType::kF32 : data;
}

enum class Phase : std::uint8_t { kFwdIn = 0, kFwdOut = 1, kBwdIn = 2, kBwdOut = 3 };
enum class Pass : std::uint8_t { kForward = 0, kBackward = 1 };
[[nodiscard]] const char* phase_name(Phase p);  // "fwd in", "fwd out", "bwd in", "bwd out"

// An index program over head vectors: rows x run vectors at
// offset + i * stride + [0, run), i in [0, rows).
struct Strided {
  std::int64_t offset = 0;
  std::int64_t rows = 0;
  std::int64_t run = 0;
  std::int64_t stride = 0;
  std::int64_t count() const { return rows * run; }
  friend bool operator==(const Strided&, const Strided&) = default;
};

// One piece of a message: rows [t0, t1) x heads [h0, h1) of `field` of one
// slot; `at` addresses it in this worker's buffer (home for sends of an In
// phase and receives of an Out phase, compute otherwise).
struct Segment {
  Field field = Field::kQ;
  bool add = false;  // receive side: dst += value (dK/dV partial sums)
  std::int32_t slot = 0;
  std::int64_t t0 = 0, t1 = 0;
  std::int32_t h0 = 0, h1 = 0;
  Strided at;
  // `at` addresses the staging buffer: the relay's side of a relayed input
  // (receipt of the stage exchange, send of the main one; libra/relay.hpp).
  bool stage = false;
};

// One all-to-all-v of one worker: lists indexed by peer.
struct Exchange {
  std::vector<std::vector<Segment>> send, recv;  // [peer]
  std::vector<std::int64_t> send_bytes, recv_bytes, send_displs, recv_displs;  // [peer]
  std::int64_t total_send_bytes = 0, total_recv_bytes = 0;
};

// Slot rows [begin, end) stored at packed rows [at, at + end - begin).
struct RowRun {
  std::int64_t begin = 0, end = 0, at = 0;
};

// A compute region: see "Compute buffers" above.
struct Region {
  std::int32_t slot = 0;
  HeadRange q_heads, kv_heads;
  std::vector<RowRun> q_rows, kv_rows;
  std::int64_t q_row_count = 0, kv_row_count = 0;  // packed rows
  std::int64_t q_offset = 0, kv_offset = 0;        // head vectors
  // Packed row of slot row t, or -1 when no run holds it.
  std::int64_t q_row(std::int64_t t) const { return find(q_rows, t); }
  std::int64_t kv_row(std::int64_t t) const { return find(kv_rows, t); }
  static std::int64_t find(const std::vector<RowRun>& runs, std::int64_t t);
};

// A query fragment of a kernel call (the varlen convention of
// libra/tensor_view.hpp): sample-local queries [a, e) at rows q_row.. of the
// call's Q view, the sample's keys 0 .. e-1 at rows kv_row.. of its K view.
using CallFragment = QueryFragment;

// One kernel call on views of the compute buffers: the region's packed Q
// family rows x query heads [h0, h1) at q.offset (row stride q.stride), its
// packed KV family rows x KV heads [k0, k1); query head i of the call uses
// KV head i / ((h1 - h0) / (k1 - k0)). Fragment rows are packed rows.
// q_home (kv_home): the Q family (KV family) views address the home buffers
// instead, rows = home_rows, stride = heads_q (heads_kv), and fragment rows
// are home rows.
struct KernelCall {
  std::int32_t region = 0;
  std::int32_t h0 = 0, h1 = 0, k0 = 0, k1 = 0;
  Strided q, kv;  // rows = region rows, run = heads of the call, stride = the region's heads
  std::int32_t fragment_begin = 0, fragment_end = 0;  // into RankSchedule::fragments
  bool q_home = false, kv_home = false;
};

struct RankSchedule {
  int worker = 0, workers = 0, cp = 0, chunks = 1;
  int heads_q = 0, heads_kv = 0;
  std::int64_t head_dim = 0;
  DType dtype = DType::kF32;
  std::int64_t window = kFullCausal;
  std::int32_t slot = 0;
  std::int64_t home_row0 = 0, home_rows = 0;  // home_row0: the packed row at home row 0
  // Home rows [0, home_tokens) hold tokens of samples; the rest is padding,
  // which no exchange or kernel call writes. (Padding ends the packed
  // sequence; both layouts put a rank's later packed rows after its earlier
  // ones, so padding is a suffix of every home.)
  std::int64_t home_tokens = 0;
  HomeMap home_map{1, 1, HomeLayout::kContiguous};
  // The home row of packed row t of this worker's slot (t must be at home here).
  std::int64_t home_row(std::int64_t t) const { return home_map.locate(t).row; }
  // The packed row at home row i.
  std::int64_t packed_row(std::int64_t i) const { return home_map.packed_row(worker % cp, i); }
  std::vector<Region> regions;
  std::int64_t compute_q_vectors = 0, compute_kv_vectors = 0;
  // [phase][chunk]
  std::array<std::vector<Exchange>, 4> exchanges;
  // ScheduleOptions::relay with a plan that relays: per pass and chunk the
  // stage exchange, which moves relayed inputs over NVLink from their
  // sender's home into the relay's staging buffer (sizes stage_q_vectors,
  // stage_kv_vectors) before the chunk's main In exchange sends them on.
  // Empty otherwise, and then no stage exchange is posted at all.
  bool relayed = false;
  std::array<std::vector<Exchange>, 2> stage_exchanges;  // [pass][chunk]
  std::int64_t stage_q_vectors = 0, stage_kv_vectors = 0;
  // [pass][chunk]
  std::array<std::vector<std::vector<KernelCall>>, 2> kernel_calls;
  std::vector<CallFragment> fragments;
  // Out phases: the (peer, chunk) order in which received pieces are applied.
  std::vector<std::pair<std::int32_t, std::int32_t>> apply_order;
  // What every rank must agree on before running (plan fingerprint, or a hash
  // of pool and config for the Ulysses schedule).
  std::uint64_t fingerprint = 0;
  std::string what;  // "plan" or "ulysses pool and configuration", for messages

  const Exchange& exchange(Phase p, int m) const { return exchanges[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)]; }
  // The stage exchange of (pass, chunk); only when `relayed`.
  const Exchange& stage_exchange(Pass p, int m) const {
    return stage_exchanges[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
  }
  std::span<const KernelCall> calls(Pass p, int m) const {
    return kernel_calls[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
  }
  std::span<const CallFragment> call_fragments(const KernelCall& c) const {
    return std::span<const CallFragment>(fragments).subspan(static_cast<std::size_t>(c.fragment_begin),
                                                            static_cast<std::size_t>(c.fragment_end - c.fragment_begin));
  }
  std::int64_t width(Field f) const { return f == Field::kLse ? 1 : head_dim; }
  // Head vectors of a field's home buffer.
  std::int64_t home_vectors(Field f) const { return home_rows * (is_kv_field(f) ? heads_kv : heads_q); }
  std::int64_t compute_vectors(Field f) const { return is_kv_field(f) ? compute_kv_vectors : compute_q_vectors; }
  std::int64_t stage_vectors(Field f) const { return is_kv_field(f) ? stage_kv_vectors : stage_q_vectors; }
  // Bytes of one head vector of a field as stored and sent.
  std::int64_t vector_bytes(Field f) const { return width(f) * dtype_bytes(field_dtype(f, dtype)); }
};

// The fields of one phase's segments for a Q-family or KV-family item, in
// message order.
[[nodiscard]] std::span<const Field> phase_fields(Phase p, bool kv);

struct ScheduleOptions {
  // Kernel calls read and write data already on the worker at home (see
  // "Data read in place"); false routes everything through compute buffers,
  // for a backend that can only address buffers it owns.
  bool read_home_in_place = true;
  // Send cross-node inputs through node-mates chosen by libra::plan_relays
  // (libra/relay.hpp). Every rank must agree: it is part of the schedule's
  // fingerprint. Off by default; a plan without relays runs as without it.
  bool relay = false;
};

// Worker `worker`'s schedule of `plan`. Pure and deterministic.
[[nodiscard]] Result<RankSchedule> make_rank_schedule(const Plan& plan, int worker, const ScheduleOptions& options = {});

// Every segment program, kernel view and fragment of `s` inside its
// buffers, and byte counts consistent with the segments; the error names
// the first that is not (src/schedule/validate.cpp).
[[nodiscard]] Status validate_schedule(const RankSchedule& s);

// The Ulysses baseline as a schedule, written from its definition (no
// plan): inside each slot's CP group, every rank receives all L rows of its
// h_q/CP query heads (and the KV heads they use), computes whole samples,
// and sends the outputs (backward: dQ, and dK/dV partial sums) back. One
// chunk. Checks cp | h_q and that h_kv and cp divide one another; the
// contiguous home layout only (a zigzag plan runs as mode ulysses).
[[nodiscard]] Result<RankSchedule> make_ulysses_schedule(std::span<const PackedSequence> pool, const PlanConfig& config,
                                                         int worker, const ScheduleOptions& options = {});

}  // namespace libra
