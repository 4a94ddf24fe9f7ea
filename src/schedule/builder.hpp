// Internal to the schedule stage: the pieces both schedules are assembled
// from (the plan's in schedule.cpp, direct Ulysses's in ulysses.cpp). A
// Builder turns "rows x heads of a slot travel from src to dst in (phase,
// chunk)" into the segments of this worker's side; a CallList merges one
// chunk's kernel calls; the rest lays out regions and the schedule's header.
//
//   RankSchedule s = schedule_header(config, workers, worker);
//   Builder b(s);
//   b.item(Phase::kFwdIn, m, {src, dst}, /*kv=*/false, {slot, t0, t1, h0, h1}, {nullptr, region});
//   b.finish();   // byte counts, displacements, apply order
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "libra/plan.hpp"
#include "libra/schedule.hpp"

namespace libra::schedule_detail {

std::uint64_t mix64(std::uint64_t h, std::uint64_t v);

// The fields of the schedule that follow from the configuration and the
// worker alone: sizes, shape, slot and home rows (home_tokens, fingerprint
// and what are the caller's).
RankSchedule schedule_header(const PlanConfig& config, int workers, int worker);

// Home rows of CP rank c that hold tokens (samples are packed from row 0,
// padding follows them).
std::int64_t home_tokens(const PackedSequence& seq, const HomeMap& map, int c);

// A slot's row ranges, sorted and merged into runs packed from row 0; `count`
// receives the rows they hold.
using RowRanges = std::vector<std::pair<std::int64_t, std::int64_t>>;  // [begin, end) each
std::vector<RowRun> pack_runs(RowRanges ranges, std::int64_t& count);

// Regions laid out one after another in the compute buffers.
void assign_offsets(RankSchedule& s);

// Rows [t0, t1) x heads [h0, h1) of one slot.
struct Rect {
  std::int32_t slot = 0;
  std::int64_t t0 = 0, t1 = 0;
  std::int32_t h0 = 0, h1 = 0;
};

// Who sends an item and who receives it.
struct Route {
  int src = 0, dst = 0;
};

// The compute region on each side of an item (nullptr: that side's rows
// are at home, or the side is another worker).
struct Sides {
  const Region* src = nullptr;
  const Region* dst = nullptr;
};

// Builds one worker's exchanges piece by piece.
class Builder {
 public:
  explicit Builder(RankSchedule& s);

  // `r` travels route.src -> route.dst in (phase, m); this worker is one or
  // both ends. `add`: the receiver adds (dK/dV partial sums).
  void item(Phase p, int m, Route route, bool kv, Rect r, Sides sides, bool add = false);
  // An In item relayed src -> via -> dst: src's home rows go to via's
  // staging buffer at `stage_offset` (contiguous rows x heads) in the pass's
  // stage exchange of chunk m, and from there to dst's compute buffer in the
  // chunk's main exchange. This worker is src, via or dst.
  void relayed_item(Phase p, int m, Route route, int via, bool kv, Rect r, const Region* dst_region,
                    std::int64_t stage_offset);
  // Byte counts and displacements of every exchange; the apply order.
  void finish();

 private:
  Strided home(bool kv, const Rect& r) const;
  // Rows [t0, t1) lie in one run (tile rows, or a sample's tokens within a
  // home shard, always do).
  Strided compute(const Region& region, bool kv, const Rect& r) const;

  RankSchedule& s_;
};

// Kernel calls of one chunk: the chunk's query heads of each tile, merged
// across tiles of one region with the same heads (their query rows are
// disjoint), split per KV head where the kernel's i / (h_q / h_kv) rule
// cannot express the mapping.
class CallList {
 public:
  // Calls are keyed by where their views live as well as by heads: a call's
  // fragments share one Q view and one KV view.
  struct Where {
    std::int32_t region = 0;
    bool q_home = false, kv_home = false;
    friend bool operator==(const Where&, const Where&) = default;
  };
  // Query heads [h0, h1) reading KV heads [k0, k1).
  struct Heads {
    std::int32_t h0 = 0, h1 = 0, k0 = 0, k1 = 0;
    friend bool operator==(const Heads&, const Heads&) = default;
  };
  void add(Where w, Heads heads, const std::vector<CallFragment>& frags);
  // Query heads `ch` with `grp` query heads per KV head.
  void add_split(Where w, HeadRange ch, int grp, const std::vector<CallFragment>& frags);
  // The calls, in the order first added, as chunk m of `pass`.
  void emit(RankSchedule& s, Pass pass, int m) const;

 private:
  struct Pending {
    Where where;
    Heads heads;
    std::vector<CallFragment> frags;
  };
  std::vector<Pending> calls_;
};

}  // namespace libra::schedule_detail
