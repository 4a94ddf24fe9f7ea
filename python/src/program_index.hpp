// python/src/program_index.hpp: a rank program's handle (libra/program.hpp
// with its schedule) and its index arrays, everything libra.torch indexes
// with in one micro-batch, built in C++ without the GIL (program_index.cpp).
//
//   ProgramHandle h = ...;                       // rank_program's result
//   std::shared_ptr<const IndexArrays> ix = index_arrays(h);   // GIL released inside
//   ix->data;   // int32: cu_seqlens and the descriptor tables (used as they are), then the head-vector
//               // rows as strided runs, five columns of ix->runs int32 (expanded on the device)
//   expand_runs(ix->data.data() + ix->small, ix->runs, out, ix->rows);   // the rows, on the host
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "binding.hpp"
#include "libra/program.hpp"
#include "libra/schedule.hpp"

namespace libra_py {

struct IndexArrays;

// The worker's home rows (binding.hpp's HomeRows) with the cu_seqlens as int32, what PlanRuntime
// takes as they are (RankProgram.home: numpy views sharing this memory).
struct HomeArrays {
  HomeRows rows;
  std::vector<std::int32_t> cu, packed_cu;
};

struct ProgramHandle {
  libra::RankSchedule schedule;
  libra::RankProgram program;
  std::uint64_t plan_fingerprint = 0;
  bool relay = false;
  std::shared_ptr<const HomeArrays> home;  // built with the program (rank_program, GIL released)
  // index_arrays' result, built once (Planner's thread builds it before the runtime asks).
  std::shared_ptr<std::mutex> index_lock = std::make_shared<std::mutex>();
  std::shared_ptr<const IndexArrays> index;
};

// The rows: one int32 head-vector position per entry, rows[0 .. IndexArrays::rows), kept on the host
// as runs, each the entries rows[first .. first + count) = base + (k / len) * stride + k % len for
// k = 0 .. count - 1 (one Move side, or one fragment's q or kv rows: a few ints where the rows take
// one per head vector), in rows order. The device expands them once per micro-batch (index.py), in
// one kernel launch; expand_runs is the same on the host.
struct Run {
  std::int32_t first = 0, count = 0, base = 0, len = 0, stride = 0;
};

// s_off / d_off, q_off / kv_off below count entries of the rows; cu_*_off, table_off and bounds_off
// int32 entries of IndexArrays::data.
//
// One index op's rows: n source positions at rows[s_off..] and n destination
// positions at rows[d_off..], head vectors of `field` (index_select from the
// source, index_put_ or index_add_ into the destination, in that order); a
// side whose rows are 0 .. n-1 is flagged, so the runtime can take a slice
// (or the whole message) instead.
struct GroupRec {
  int field = 0, src = 0, dst = 0, cls = 0;
  bool add = false;
  I64 s_off = 0, d_off = 0, n = 0;
  int identity = 0;  // 1: the source rows are 0 .. n-1; 2: the destination rows are (or both)
  I64 s_cut = -1, d_cut = -1;  // each side's index in IndexArrays::cuts (-1: no entries)
};

// send / recv: per class, the index in IndexArrays::counts of the vectors sent to (received from)
// each peer (equal count vectors are one entry: most classes of most exchanges move nothing, and O's
// and LSE's move the same counts).
struct ExchangeRec {
  std::array<std::size_t, libra::kNumWireClasses> send{}, recv{};
  std::vector<GroupRec> gather, local, scatter;
};

// The kernel calls of one chunk on one (q buffer, kv buffer) pair and head
// widths, merged into one varlen call, positions in joined buffers (a field's
// home vectors, then its compute vectors); or (IndexArrays::joined, q_home and
// kv_home true) consecutive such pairs of the same widths, joined into one
// call: q vectors [total_q * hq] (row-major:
// query, head; the LSE's positions are the same, read head-major as flash-attn
// lays its LSE out), kv vectors [total_k * hkv], cu_seqlens [seqs + 1] at
// cu_q_off / cu_k_off.
struct PairRec {
  bool q_home = false, kv_home = false;
  I64 hq = 0, hkv = 0, seqs = 0, total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  I64 q_off = 0, kv_off = 0, cu_q_off = 0, cu_k_off = 0;
};

// A chunk's kernel descriptor table (python/libra/torch/descriptors.py):
// rows x 10 int64 at table_off, bounds (5 int64) at bounds_off (each int64
// two int32 entries, in the machine's order; table_off is even).
struct DescRec {
  I64 table_off = 0, rows = 0, bounds_off = 0;
};

struct IndexArrays {
  I64 runs = 0;   // how many
  I64 rows = 0;   // entries the runs expand to
  I64 small = 0;  // data's entries before the runs' columns
  // The small array (cu_seqlens, descriptor tables), then the runs as five columns of `runs` int32
  // (first, count, base, len, stride): one buffer, so one copy reaches the device.
  std::vector<std::int32_t> data;
  // Where each group side (a group's source or destination rows) with entries starts, in rows order,
  // then where the merged calls' rows start (they follow every group's: one last piece, which no
  // record takes; a pair's rows are viewed by offset): they tile the rows, so one split cuts them all.
  std::vector<I64> cuts;
  std::array<std::array<std::vector<ExchangeRec>, 3>, 2> exchanges;  // [pass][in, out, stage][chunk]
  std::array<std::vector<GroupRec>, 2> apply;                        // [pass]
  std::array<std::vector<std::vector<PairRec>>, 2> varlen;           // [pass][chunk]
  std::array<std::vector<std::vector<PairRec>>, 2> joined;           // [pass][chunk]: varlen's, joined
  std::array<std::vector<DescRec>, 2> descriptors;                   // [pass][chunk]
  std::vector<bool> shared;  // [chunk]: backward's calls are forward's (its varlen, joined, descriptors the same)
  std::vector<std::vector<I64>> counts;  // the distinct per-peer count vectors (ExchangeRec::send, recv)
  double build_seconds = 0;                                          // thread CPU time of the build
};

// Builds (once; later calls return the same) h's index arrays. Call without the GIL.
std::shared_ptr<const IndexArrays> index_arrays(ProgramHandle& h);

// h's index arrays if they are built and no thread is building them now, else null; never waits
// (callable with the GIL held).
std::shared_ptr<const IndexArrays> built_index(ProgramHandle& h);

// The Python view of `ix`: (runs as an int32 [runs, 5] numpy array (a strided view of data's columns),
// data as an int32 one, layout dict), the arrays writable and sharing ix's memory; the layout's
// passes hold the merged calls' and descriptor records only of the kinds in `kinds` (bits: 1 varlen,
// 2 joined, 4 descriptors).
py::tuple index_arrays_py(std::shared_ptr<const IndexArrays> ix, unsigned kinds = 7);

// h.home as a dict of numpy views (program.cpp's RankProgram.home).
py::dict home_py(const ProgramHandle& h);

// Writes the rows of `runs` runs (cols: five columns of `runs` int32, IndexArrays::data's layout) into
// out[0 .. n). Throws std::invalid_argument (naming the run) unless the runs tile [0, n) in order
// with count > 0, len > 0 and every position in [0, 2^31). Call without the GIL.
void expand_runs(const std::int32_t* cols, I64 runs, std::int32_t* out, I64 n);

}  // namespace libra_py
