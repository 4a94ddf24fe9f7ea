// The per-rank schedule of a plan: the plan's lists turned into the
// exchanges, kernel calls and buffer layout of one worker. Pure: the same
// plan gives every worker schedules that match piece for piece, because each
// side derives a message from the same plan lists in the same order. The
// steps, in order: the header, the compute regions, the relays, the plan's
// transfers, the tiles kept on their home, the resident K/V, the dK/dV
// returns, the kernel calls (make_rank_schedule). Direct Ulysses is
// ulysses.cpp; the pieces both share are builder.hpp.
#include "libra/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <compare>
#include <map>

#include "libra/relay.hpp"
#include "schedule/builder.hpp"

namespace libra {

namespace {

using namespace schedule_detail;

constexpr Field kQOnly[] = {Field::kQ};
constexpr Field kKv[] = {Field::kK, Field::kV};
constexpr Field kOLse[] = {Field::kO, Field::kLse};
constexpr Field kBwdQ[] = {Field::kQ, Field::kDo, Field::kO, Field::kLse};
constexpr Field kDq[] = {Field::kDq};
constexpr Field kDkv[] = {Field::kDk, Field::kDv};

// What this worker reads of the plan, and what of it in place: a tile on
// its own Q home; a sample whose tokens all lie in one home run of this
// worker (its keys are then contiguous at home too).
struct Reads {
  const Plan& plan;
  const RankSchedule& s;
  bool in_place = true;  // ScheduleOptions::read_home_in_place

  const Tile& tile(std::int32_t id) const { return plan.tiles()[static_cast<std::size_t>(id)]; }
  const KvGroup& group(std::int32_t gid) const { return plan.groups()[static_cast<std::size_t>(gid)]; }
  bool q_at_home(const Tile& t) const { return in_place && t.home == s.worker; }
  // The K/V this worker reads of group g: the whole sample, or its causal
  // prefix (PlanConfig::kv_prefix); it always starts at the sample's start.
  TokenSpan span(std::int32_t gid) const { return plan.kv_span(s.worker, gid); }
  bool kv_at_home(const KvGroup& g, TokenSpan span) const {
    if (!in_place || g.slot != s.slot) return false;
    const HomeSpot h = s.home_map.locate(span.begin);
    return h.rank == s.worker % s.cp && span.end <= h.run_end;
  }
  bool kv_at_home(std::int32_t gid) const { return kv_at_home(group(gid), span(gid)); }
};

// The compute region of each slot this worker computes on.
class RegionIndex {
 public:
  explicit RegionIndex(const std::vector<Region>& regions) : regions_(regions) {}
  void add(std::int32_t slot, std::int32_t index) { index_[slot] = index; }
  std::int32_t index(std::int32_t slot) const { return index_.at(slot); }
  // nullptr when this worker computes nothing on the slot.
  const Region* find(std::int32_t slot) const {
    auto it = index_.find(slot);
    return it == index_.end() ? nullptr : &regions_[static_cast<std::size_t>(it->second)];
  }

 private:
  const std::vector<Region>& regions_;
  std::map<std::int32_t, std::int32_t> index_;
};

// `into` widened to cover `h` (empty ranges add nothing).
void widen(HeadRange& into, HeadRange h) {
  if (h.size() <= 0) return;
  into = into.size() <= 0 ? h : HeadRange{std::min(into.begin, h.begin), std::max(into.end, h.end)};
}

// A region being gathered: its heads and the row ranges it must hold.
struct Touched {
  Region r;
  RowRanges q, kv;
};

// The rows and heads tile `t` needs in its slot's region: its own rows and
// query heads (unless read at home), the tokens and KV heads of the groups
// it reads (unless those are read at home).
void touch_tile(const Reads& reads, const Tile& t, Touched& x) {
  x.r.slot = t.slot;
  if (!reads.q_at_home(t)) {
    widen(x.r.q_heads, t.heads);
    x.q.emplace_back(t.begin, t.end);
  }
  for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
    const std::int32_t gid = reads.plan.fragments()[static_cast<std::size_t>(f)].group;
    const TokenSpan span = reads.span(gid);
    const KvGroup& g = reads.group(gid);
    if (reads.kv_at_home(g, span)) continue;
    widen(x.r.kv_heads, t.kv_heads);
    widen(x.r.kv_heads, g.kv_heads);
    x.kv.emplace_back(span.begin, span.end);
  }
}

// Regions: every slot this worker computes on, with the rows and heads of
// its tiles (Q family) and the tokens and KV heads of the groups they use
// (KV family), laid out in slot order.
RegionIndex place_regions(const Reads& reads, RankSchedule& s) {
  std::map<std::int32_t, Touched> by_slot;
  for (std::int32_t id : reads.plan.worker_tiles(s.worker)) {
    const Tile& t = reads.tile(id);
    touch_tile(reads, t, by_slot[t.slot]);
  }
  RegionIndex index(s.regions);
  for (auto& [slot, x] : by_slot) {
    x.r.q_rows = pack_runs(std::move(x.q), x.r.q_row_count);
    x.r.kv_rows = pack_runs(std::move(x.kv), x.r.kv_row_count);
    index.add(slot, static_cast<std::int32_t>(s.regions.size()));
    s.regions.push_back(std::move(x.r));
  }
  assign_offsets(s);
  return index;
}

// Relays exist only when asked for and the plan has some, so every rank
// decides alike from the plan; the fingerprint carries the choice, so a
// rank that was not asked does not run a different exchange silently.
RelayTable choose_relays(const Plan& plan, const ScheduleOptions& options, RankSchedule& s) {
  RelayTable relays;
  if (options.relay) {
    relays = plan_relays(plan);
    s.relayed = relays.any();
  }
  if (s.relayed) s.fingerprint = mix64(s.fingerprint, 0x72656c6179ULL);  // "relay"
  return relays;
}

// KV head `kv_head` of slot rows [t0, t1) moving from worker `from` to
// worker `to`: a dK/dV return, or (from == to) rows resident on this
// worker. Ordered field by field, as the rectangles are emitted.
struct KvCell {
  int from = 0, to = 0;
  std::int32_t slot = 0;
  std::int64_t t0 = 0, t1 = 0;
  std::int32_t kv_head = 0;
  auto operator<=>(const KvCell&) const = default;
};
using CellChunks = std::map<KvCell, int>;  // the chunk each cell moves in

void keep_earliest(CellChunks& cells, const KvCell& c, int chunk) {
  auto [it, fresh] = cells.try_emplace(c, chunk);
  if (!fresh) it->second = std::min(it->second, chunk);
}
void keep_latest(CellChunks& cells, const KvCell& c, int chunk) {
  auto [it, fresh] = cells.try_emplace(c, chunk);
  if (!fresh) it->second = std::max(it->second, chunk);
}

// With kv_prefix two groups of one KV head (head shards sharing it, H >
// h_kv) may hold different prefixes of the same run: [t0, t1) and [t0,
// t1'). Both land in one place of the compute buffer, so the rows go in
// and their dK/dV home once, as the longer range: [t0, max t1), at the
// earliest first (`earliest`) or the latest last use.
void merge_prefixes(CellChunks& cells, bool earliest) {
  struct Start {
    int from = 0, to = 0;
    std::int32_t slot = 0;
    std::int64_t t0 = 0;
    std::int32_t kv_head = 0;
    auto operator<=>(const Start&) const = default;
  };
  struct Longest {
    std::int64_t t1 = 0;
    int chunk = 0;
  };
  std::map<Start, Longest> by_start;
  for (const auto& [c, chunk] : cells) {
    auto [it, fresh] = by_start.try_emplace(Start{c.from, c.to, c.slot, c.t0, c.kv_head}, Longest{c.t1, chunk});
    if (fresh) continue;
    it->second.t1 = std::max(it->second.t1, c.t1);
    it->second.chunk = earliest ? std::min(it->second.chunk, chunk) : std::max(it->second.chunk, chunk);
  }
  if (by_start.size() == cells.size()) return;
  cells.clear();
  for (const auto& [k, v] : by_start) cells.emplace(KvCell{k.from, k.to, k.slot, k.t0, v.t1, k.kv_head}, v.chunk);
}

// Consecutive KV heads of one (from, to, slot, rows) moving in the same
// chunk: one rectangle.
struct KvRect {
  Route route;
  Rect rect;  // heads: KV heads
  int chunk = 0;
};
std::vector<KvRect> kv_rects(const CellChunks& cells) {
  std::vector<KvRect> out;
  for (auto it = cells.begin(); it != cells.end();) {
    const KvCell& c = it->first;
    std::int32_t end = c.kv_head + 1;
    auto next = std::next(it);
    for (; next != cells.end(); ++next, ++end) {
      const KvCell& d = next->first;
      if (d.from != c.from || d.to != c.to || d.slot != c.slot || d.t0 != c.t0 || d.t1 != c.t1 || d.kv_head != end ||
          next->second != it->second) {
        break;
      }
    }
    out.push_back({{c.from, c.to}, {c.slot, c.t0, c.t1, c.kv_head, end}, it->second});
    it = next;
  }
  return out;
}

// The exchanges and kernel calls of one worker's schedule of a plan, step
// by step (make_rank_schedule calls them in order; each appends to the
// exchanges in the order every peer derives too).
class Assembly {
 public:
  Assembly(const Reads& reads, RankSchedule& s, const RegionIndex& regions, const RelayTable& relays)
      : reads_(reads), plan_(reads.plan), s_(s), regions_(regions), relays_(relays), b_(s) {}

  // The plan's transfers that this worker sends, receives or relays, chunk
  // by chunk, in the plan's order; dK/dV returns are noted for later.
  void add_transfers() {
    for (int m = 0; m < s_.chunks; ++m) {
      for (int src = 0; src < s_.workers; ++src) {
        for (int dst = 0; dst < s_.workers; ++dst) {
          const int via = s_.relayed ? relays_.via(m, src, dst) : src;
          if (src != s_.worker && dst != s_.worker && via != s_.worker) continue;
          for (const Transfer& x : plan_.chunk_transfers(m, src, dst)) add_transfer(m, {src, dst}, via, x);
        }
      }
    }
  }

  // Tiles computed on their own Q home and not read in place move through
  // the message to self.
  void add_kept_tiles() {
    const Route self{s_.worker, s_.worker};
    for (std::int32_t id : plan_.worker_tiles(s_.worker)) {
      const Tile& t = reads_.tile(id);
      if (t.home != s_.worker || reads_.q_at_home(t)) continue;
      const Region* r = regions_.find(t.slot);
      for (int m = 0; m < s_.chunks; ++m) {
        const HeadRange ch = plan_.chunk_heads(t, m);
        const Rect rows{t.slot, t.begin, t.end, ch.begin, ch.end};
        for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) b_.item(p, m, self, false, rows, {nullptr, r});
        for (Phase p : {Phase::kFwdOut, Phase::kBwdOut}) b_.item(p, m, self, false, rows, {r, nullptr});
      }
    }
  }

  // KV tokens resident on this worker: in with the first use of each head,
  // home with the last.
  void note_resident_kv() {
    for (std::int32_t gid : plan_.worker_groups(s_.worker)) {
      const KvGroup& g = reads_.group(gid);
      const TokenSpan span = reads_.span(gid);
      if (g.slot != s_.slot || reads_.kv_at_home(g, span)) continue;
      // Each home run of the tokens read on this worker is one rectangle.
      for (std::int64_t t0 = span.begin; t0 < span.end;) {
        const HomeSpot h = s_.home_map.locate(t0);
        const std::int64_t t1 = std::min(span.end, h.run_end);
        if (h.rank == s_.worker % s_.cp) note_resident_run(gid, g, t0, t1);
        t0 = t1;
      }
    }
  }

  // The resident rows' copies in and every dK/dV return, as rectangles.
  void add_kv_moves() {
    merge_prefixes(first_use_, true);
    merge_prefixes(last_use_, false);
    for (const KvRect& k : kv_rects(first_use_)) {
      for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) b_.item(p, k.chunk, k.route, true, k.rect, {nullptr, regions_.find(k.rect.slot)});
    }
    for (const KvRect& k : kv_rects(last_use_)) {
      b_.item(Phase::kBwdOut, k.chunk, k.route, true, k.rect, {regions_.find(k.rect.slot), nullptr}, /*add=*/true);
    }
  }

  // Kernel calls, fragments relative to their region's rows (or home rows
  // for what is read in place); the backward pass makes the same calls.
  void add_kernel_calls() {
    std::vector<TileCalls> tiles;
    for (std::int32_t id : plan_.worker_tiles(s_.worker)) tiles.push_back(tile_calls(reads_.tile(id)));
    const int grp = s_.heads_q / s_.heads_kv;
    for (int m = 0; m < s_.chunks; ++m) {
      CallList calls;
      for (const TileCalls& t : tiles) {
        for (int kv_home = 0; kv_home < 2; ++kv_home) {
          calls.add_split({t.region, t.q_home, kv_home == 1}, plan_.chunk_heads(*t.tile, m), grp,
                          t.fragments[static_cast<std::size_t>(kv_home)]);
        }
      }
      calls.emit(s_, Pass::kForward, m);
      s_.kernel_calls[1][static_cast<std::size_t>(m)] = s_.kernel_calls[0][static_cast<std::size_t>(m)];
    }
  }

  void finish() { b_.finish(); }

 private:
  // One transfer of chunk m on `route`; `via` relays it when it is not
  // route.src.
  void add_transfer(int m, Route route, int via, const Transfer& x) {
    const Rect rows{x.slot, x.begin, x.end, x.heads.begin, x.heads.end};
    const bool ends_here = route.src == s_.worker || route.dst == s_.worker;
    switch (x.kind) {
      case TransferKind::kQ:
        add_input(m, route, via, false, rows);
        break;
      case TransferKind::kKv:
        add_input(m, route, via, true, rows);
        if (ends_here) note_kv_return(route, x);
        break;
      case TransferKind::kO:
        if (!ends_here) break;
        for (Phase p : {Phase::kFwdOut, Phase::kBwdOut}) b_.item(p, m, route, false, rows, {regions_.find(x.slot), nullptr});
        break;
    }
  }

  // Both passes' inputs of one item; those of a relayed item share one
  // staging place on the relay.
  void add_input(int m, Route route, int via, bool kv, const Rect& rows) {
    const Region* dst_region = regions_.find(rows.slot);
    if (via == route.src) {
      for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) b_.item(p, m, route, kv, rows, {nullptr, dst_region});
      return;
    }
    std::int64_t at = 0;
    if (via == s_.worker) {
      std::int64_t& cursor = kv ? s_.stage_kv_vectors : s_.stage_q_vectors;
      at = cursor;
      cursor += (rows.t1 - rows.t0) * (rows.h1 - rows.h0);
    }
    for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) b_.relayed_item(p, m, route, via, kv, rows, dst_region, at);
  }

  // dK/dV returns, one per (from worker, to home, slot, rows, KV head): a
  // head fetched once per head shard (contract dedup, H > h_kv) lands in one
  // place of the worker's compute buffer, whose gradient sums every shard's
  // contribution, so it goes home once, with the chunk of its last use.
  void note_kv_return(Route route, const Transfer& x) {
    for (std::int32_t k = x.heads.begin; k < x.heads.end; ++k) {
      keep_latest(last_use_, KvCell{route.dst, route.src, x.slot, x.begin, x.end, k},
                  plan_.kv_use(route.dst, x.group, k).last);
    }
  }

  // Resident rows [t0, t1) of group gid: each KV head this worker uses.
  void note_resident_run(std::int32_t gid, const KvGroup& g, std::int64_t t0, std::int64_t t1) {
    for (std::int32_t k = g.kv_heads.begin; k < g.kv_heads.end; ++k) {
      const ChunkUse u = plan_.kv_use(s_.worker, gid, k);
      if (!u.used()) continue;
      const KvCell c{s_.worker, s_.worker, g.slot, t0, t1, k};
      keep_latest(last_use_, c, u.last);
      keep_earliest(first_use_, c, u.first);
    }
  }

  // A tile's fragments as call fragments, apart by whether the sample's K/V
  // is read in place.
  struct TileCalls {
    const Tile* tile = nullptr;
    std::int32_t region = 0;
    bool q_home = false;
    std::array<std::vector<CallFragment>, 2> fragments;  // [kv_home]
  };
  TileCalls tile_calls(const Tile& t) const {
    TileCalls out{&t, regions_.index(t.slot), reads_.q_at_home(t), {}};
    const Region& r = s_.regions[static_cast<std::size_t>(out.region)];
    for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
      const Fragment& x = plan_.fragments()[static_cast<std::size_t>(f)];
      const bool kv_home = reads_.kv_at_home(x.group);
      const std::int64_t q_row = out.q_home ? s_.home_row(x.sample_start + x.a) : r.q_row(x.sample_start + x.a);
      const std::int64_t kv_row = kv_home ? s_.home_row(x.sample_start) : r.kv_row(x.sample_start);
      out.fragments[kv_home ? 1 : 0].push_back({q_row, kv_row, x.sample_length, x.a, x.e});
    }
    return out;
  }

  const Reads& reads_;
  const Plan& plan_;
  RankSchedule& s_;
  const RegionIndex& regions_;
  const RelayTable& relays_;
  Builder b_;
  CellChunks first_use_;  // resident cells only: when the rows are copied in
  CellChunks last_use_;   // when the dK/dV partial sums go home
};

}  // namespace

std::int64_t Region::find(const std::vector<RowRun>& runs, std::int64_t t) {
  auto it = std::upper_bound(runs.begin(), runs.end(), t, [](std::int64_t x, const RowRun& r) { return x < r.begin; });
  if (it == runs.begin()) return -1;
  --it;
  return t < it->end ? it->at + (t - it->begin) : -1;
}

const char* field_name(Field f) {
  static const char* kNames[] = {"Q", "K", "V", "O", "LSE", "dO", "dQ", "dK", "dV"};
  return kNames[static_cast<int>(f)];
}

const char* phase_name(Phase p) {
  static const char* kNames[] = {"fwd in", "fwd out", "bwd in", "bwd out"};
  return kNames[static_cast<int>(p)];
}

std::span<const Field> phase_fields(Phase p, bool kv) {
  switch (p) {
    case Phase::kFwdIn: return kv ? std::span<const Field>(kKv) : std::span<const Field>(kQOnly);
    case Phase::kFwdOut: return kv ? std::span<const Field>() : std::span<const Field>(kOLse);
    case Phase::kBwdIn: return kv ? std::span<const Field>(kKv) : std::span<const Field>(kBwdQ);
    case Phase::kBwdOut: return kv ? std::span<const Field>(kDkv) : std::span<const Field>(kDq);
  }
  return {};
}

Result<RankSchedule> make_rank_schedule(const Plan& plan, int worker, const ScheduleOptions& options) {
  const int W = plan.num_workers();
  if (worker < 0 || worker >= W) {
    return invalid_input(fmt::format("schedule: worker {} outside the plan's {} workers", worker, W));
  }
  const PlanConfig& cfg = plan.config();
  RankSchedule s = schedule_header(cfg, W, worker);
  s.home_tokens = home_tokens(plan.pool()[static_cast<std::size_t>(s.slot)], s.home_map, worker % cfg.cp);
  s.fingerprint = plan.fingerprint();
  s.what = "plan";
  const Reads reads{plan, s, options.read_home_in_place};
  const RegionIndex regions = place_regions(reads, s);
  const RelayTable relays = choose_relays(plan, options, s);
  Assembly a(reads, s, regions, relays);
  a.add_transfers();
  a.add_kept_tiles();
  a.note_resident_kv();
  a.add_kv_moves();
  a.add_kernel_calls();
  a.finish();
  return s;
}

}  // namespace libra
